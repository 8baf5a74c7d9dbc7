"""Device memory per role: weights, gradients, optimiser state and activations per micro-batch,
and the micro-batch that makes a learner rank fit.

A learner rank holds its policy's weights, the gradients and Adam's two moments of the parameters
that train (torch's Adam keeps them in the parameter's dtype), and, while it trains, the
activations its forward passes save for backward: those grow with the decisions per pass, the
micro-batch (``algo.cfg.micro_batch``, :func:`ebrl.algos.loss.sgd_update`). The micro-batch
chosen is the largest that fits the rest of the GPU's memory, at most the rank's share of a
minibatch.

Two ways to get the activations of one decision:

* :func:`measure_saved_bytes`: the bytes of the tensors autograd saves for backward in one
  training pass (``torch.autograd.graph.saved_tensors_hooks``, parameters left out), on any
  device. A learner on a GPU with no ``micro_batch`` set measures its own policy this way on its
  first segment (:meth:`ebrl.stages.train.TrainStage.train`) and sizes the micro-batch from the
  GPU's free memory.
* :class:`Block`: a model of a stack of transformer layers, for the dry run, which builds no
  model. Per layer and token a pre-LN block saves (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", section 4.1, without dropout): both norms' inputs
  and outputs (4 d), Q, K, V and the attention output (2 heads x head_dim + 2 kv_heads x
  head_dim), the MLP's hidden activations (2 ffn: the up projection's output and the
  activation's; 4 ffn for a gated MLP: gate, up, the activation and the product), and the
  attention's softmax: the probabilities (heads x keys, fp32 and the cast copy) with eager
  attention, only a log-sum-exp per head with a fused kernel. Calibrated on the CPU against
  :func:`measure_saved_bytes` for ebrl's transformer policy (``tests/test_memory.py``: the model
  within 10% of the measure at sizes S, M and L).

The paper's VLAs are described by :data:`ARCHITECTURES` (their public configurations); a policy
without one gets weights and optimiser only, and a learner on a GPU measures it at run time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

GiB = 1024**3
#: the share of a GPU's memory a role may plan to use: the rest is the CUDA context, the caching
#: allocator's fragmentation and the transient buffers of kernels
USABLE = 0.9
#: Adam's state per trainable parameter, in parameters' bytes: exp_avg and exp_avg_sq
ADAM_MOMENTS = 2


@dataclass(frozen=True)
class Block:
    """A stack of transformer layers that a training pass runs with gradients (module doc).

    Attributes:
        layers, width, ffn, heads, kv_heads, head_dim: the layers' shape.
        tokens: tokens a pass runs through the stack per decision (the queries).
        keys: tokens each query attends to (its own and a frozen prefix's).
        gated: a gated MLP (GeGLU / SwiGLU: gate and up projections).
        eager: attention probabilities materialised (else a fused kernel: a log-sum-exp).
    """

    layers: int
    width: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    tokens: int
    keys: int
    gated: bool = True
    eager: bool = True

    def params(self) -> int:
        """Parameters of the stack (projections and MLP; norms' scales)."""
        attn = self.width * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = (3 if self.gated else 2) * self.width * self.ffn
        return self.layers * (attn + mlp + 2 * self.width)

    def saved_bytes(self, act_bytes: int) -> int:
        """Bytes saved for backward per decision (one pass)."""
        per_token = (
            4 * self.width
            + 2 * self.heads * self.head_dim
            + 2 * self.kv_heads * self.head_dim
            + (4 if self.gated else 2) * self.ffn
        ) * act_bytes
        # eager: fp32 softmax output and its cast copy; fused: an fp32 log-sum-exp per head
        per_token += self.heads * (self.keys * (4 + act_bytes) if self.eager else 4)
        return self.layers * self.tokens * per_token


@dataclass(frozen=True)
class Architecture:
    """What the dry run knows of a policy's model, per decision.

    Attributes:
        trained: the blocks a training pass runs with gradients.
        trainable: parameters that train (None: all of the policy's).
        passes: training passes per decision through ``trained`` (a flow-matching VLA scores
            each denoising step of its chain).
        weight_bytes, act_bytes: bytes per weight and per activation element.
        frozen_kv: elements per decision of a frozen prefix's keys and values that the trained
            passes attend to (saved once for all passes).
        transient: elements per decision of the largest buffer of the frozen prefix's forward
            (no gradient: freed layer by layer), e.g. its MLP's gate and up outputs.
        source: where the numbers come from.
    """

    trained: tuple[Block, ...]
    trainable: int | None
    passes: int = 1
    weight_bytes: int = 2
    act_bytes: int = 2
    frozen_kv: int = 0
    transient: int = 0
    source: str = ""

    def activation_bytes(self) -> int:
        """Bytes per decision of a training micro-batch."""
        saved = self.passes * sum(b.saved_bytes(self.act_bytes) for b in self.trained)
        return saved + (self.frozen_kv + self.transient) * self.act_bytes


def _openpi(
    node: Mapping[str, Any], horizon: int, state_token: bool, text: int, steps: int
) -> Architecture:
    """openpi's π0 / π0.5 as RLinf 0.3 trains it with ``train_expert_only``, the images in
    input and denoising steps read from the policy node's ``model_cfg.openpi`` (``steps`` the
    model's default where the node does not say): PaliGemma
    (gemma_2b: 18 layers, width 2048, gated MLP 16384, 8 heads, 1 KV head of 256; SigLIP
    So400m/14: 256 tokens per 224-pixel image) frozen, the action expert (gemma_300m: 18 layers,
    width 1024, MLP 4096, 8 heads, 1 KV head of 256) trained on the action tokens (and π0's state
    token), attending to the prefix's keys, once per denoising step; eager attention."""
    openpi = node["model_cfg"]["openpi"]
    images = int(openpi.get("num_images_in_input", 2))
    steps = int(openpi.get("num_steps", steps))
    prefix = images * 256 + text
    suffix = horizon + int(state_token)
    expert = Block(18, 1024, 4096, 8, 1, 256, tokens=suffix, keys=prefix + suffix)
    return Architecture(
        trained=(expert,),
        trainable=expert.params(),
        passes=steps,
        frozen_kv=18 * prefix * 2 * 256,  # the prefix's K and V in every layer (1 KV head)
        transient=prefix * 2 * 16384,  # gemma_2b's gate and up outputs of one layer
        source="openpi gemma_2b + gemma_300m (train_expert_only)",
    )


#: the paper's VLAs by ``policy.name``: builders from the policy node's values
ARCHITECTURES: dict[str, Any] = {
    "pi0": lambda node: _openpi(node, horizon=50, state_token=True, text=48, steps=4),
    "pi05": lambda node: _openpi(node, horizon=10, state_token=False, text=200, steps=3),
    # Llama 2 7B (32 layers, 4096, SwiGLU 11008, 32 heads) on one image's 256 patch tokens, the
    # prompt and 8 x 7 action tokens, FlashAttention 2; SigLIP So400m and DINOv2-L (Prismatic's
    # fused backbone, 256 patches) trained too: RLinf trains OpenVLA-OFT whole (is_lora false)
    "openvla_oft": lambda node: Architecture(
        trained=(
            Block(32, 4096, 11008, 32, 32, 128, tokens=440, keys=440, eager=False),
            Block(27, 1152, 4304, 16, 16, 72, tokens=256, keys=256, gated=False, eager=False),
            Block(24, 1024, 4096, 16, 16, 64, tokens=257, keys=257, gated=False, eager=False),
        ),
        trainable=None,
        source="Llama 2 7B + SigLIP So400m + DINOv2-L, trained whole",
    ),
}


@dataclass(frozen=True)
class RoleMemory:
    """One role's device memory (bytes) and the micro-batch chosen for a learner."""

    role: str
    budget: int  # what the role may use of its GPU (USABLE of its share)
    weights: int
    grads: int = 0
    optimizer: int = 0
    per_decision: int | None = None  # activations per decision (None: no model)
    decisions: int = 0  # the decisions of a minibatch on this rank
    micro_batch: int | None = None
    where: str = ""

    @property
    def fixed(self) -> int:
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.fixed + (self.per_decision or 0) * (self.micro_batch or 0)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def line(self) -> str:
        def g(b: float) -> str:
            return f"{b / GiB:.1f}"

        text = f"{self.role}: weights {g(self.weights)} GiB"
        if self.grads or self.optimizer:
            text += f", grads {g(self.grads)}, Adam {g(self.optimizer)}"
        if self.per_decision is not None:
            text += f", activations {self.per_decision / 2**20:.0f} MiB/decision"
            if self.micro_batch is not None:
                text += (
                    f" x micro-batch {self.micro_batch} (of {self.decisions} per minibatch)"
                    f" = {g(self.per_decision * self.micro_batch)}"
                )
        text += f"; total {g(self.total)} of {g(self.budget)} GiB usable {self.where}"
        if not self.fits:
            text += (
                " -- DOES NOT FIT: more learner ranks with scheduler.learner_strategy=fsdp, "
                "or a larger GPU"
            )
        return text


def fit_micro_batch(free: int, per_decision: int, decisions: int) -> int:
    """The most decisions per pass that ``free`` bytes hold (at least 1; at most ``decisions``,
    a rank's share of a minibatch)."""
    if per_decision <= 0:
        return max(1, decisions)
    return max(1, min(decisions, free // per_decision))


def _decisions_per_rank(job: Mapping[str, Any], ranks: int) -> int:
    """The decisions of one minibatch on one learner rank: envs x decisions per env (T) /
    minibatches, split over the ranks (the largest shard)."""
    t = max(1, int(job["rollout_steps"]) // int(job["chunk_size"]))
    minibatch = math.ceil(int(job["num_envs"]) * t / int(job["algo"]["cfg"]["num_minibatches"]))
    return math.ceil(minibatch / max(1, ranks))


def estimate(job: Mapping[str, Any]) -> list[RoleMemory] | None:
    """The memory of each GPU role of a run (its resolved config as plain containers), None
    when the run computes on the CPU or its policy has no size (``params_b``).

    A role with a GPU share below one plans with that share of the GPU's memory (roles packed
    onto one GPU share its memory as they share its SMs); sync and Colocated hold the learner
    and the generator's copy of the policy in one process on one GPU (Colocated over N GPUs:
    one such process per GPU, a data-parallel learner rank each). An FSDP learner's
    weights, gradients and moments are split over its ranks. The learner's micro-batch is
    ``algo.cfg.micro_batch`` where set, else the largest that fits (:func:`fit_micro_batch`).
    """
    gpu, policy = job.get("gpu") or {}, job.get("policy") or {}
    if gpu.get("device_name") is None or "params_b" not in policy:
        return None
    build = ARCHITECTURES.get(str(policy.get("name")))
    arch: Architecture | None = build(policy) if build is not None else None
    sched = job.get("scheduler") or {}
    memory = float(gpu["memory_gib"]) * GiB
    params = int(float(policy["params_b"]) * 1e9)
    wb = arch.weight_bytes if arch is not None else 2
    trainable = params if arch is None or arch.trainable is None else arch.trainable
    per = arch.activation_bytes() if arch is not None else None
    if "gen_replicas" in sched:  # roles on EBRL's workers, each its GPU share
        ranks = int(sched["learner_ranks"])
        share = {r: float(sched[f"{r}_gpus"]) for r in ("gen", "learner")}
        shard = ranks if sched.get("learner_strategy") == "fsdp" else 1
        learner_budget = int(USABLE * memory * min(1.0, share["learner"]))
        gen = RoleMemory(
            "gen replica",
            budget=int(USABLE * memory * min(1.0, share["gen"])),
            weights=params * wb,
            where=f"({share['gen']:g} of one {gpu['name']})",
        )
        roles = [gen] if share["gen"] > 0 else []
        if share["learner"] <= 0:
            return roles or None
        where = f"({share['learner']:g} of one {gpu['name']})"
    else:  # sync / Colocated: every stage in one process per GPU, two copies of the policy
        ranks, shard = int(sched.get("ranks", 1) or 1), 1  # Colocated: a process per GPU
        learner_budget = int(USABLE * memory) - params * wb
        roles, where = [], f"(one {gpu['name']}, beside the generator's copy)"
    fixed = (params * wb + trainable * wb * (1 + ADAM_MOMENTS)) // shard
    decisions = _decisions_per_rank(job, ranks)
    micro = job["algo"]["cfg"].get("micro_batch")
    if micro is None and per is not None:
        micro = fit_micro_batch(learner_budget - fixed, per, decisions)
    roles.append(
        RoleMemory(
            f"learner rank (x{ranks})",
            budget=learner_budget,
            weights=params * wb // shard,
            grads=trainable * wb // shard,
            optimizer=ADAM_MOMENTS * trainable * wb // shard,
            per_decision=per,
            decisions=decisions,
            micro_batch=micro,
            where=where,
        )
    )
    return roles


def dry_run_lines(job: Mapping[str, Any]) -> str:
    """The dry run's memory lines of a job (``""`` when :func:`estimate` has none), each on a
    line of its own under the job's roles line."""
    roles = estimate(job)
    if not roles:
        return ""
    return "".join(f"\n      memory, {r.line()}" for r in roles)


def micro_batch_for(
    policy: nn.Module,
    obs: torch.Tensor,
    actions: torch.Tensor,
    extras: Mapping[str, torch.Tensor],
    *,
    free: int,
    total: int,
    decisions: int,
    optimizer_ready: bool,
) -> int:
    """A learner's micro-batch on its device at run time: the activations of a pass over
    ``obs`` (a few decisions: :func:`measure_saved_bytes` per decision) against the device's
    ``free`` bytes, less what the first step still allocates (the trainable parameters'
    gradients, and Adam's moments unless ``optimizer_ready``) and ``1 - USABLE`` of its
    ``total``; at most ``decisions`` (a rank's share of a minibatch)."""
    n = max(1, int(obs.shape[0]))
    per = -(-measure_saved_bytes(policy, obs, actions, extras) // n)
    trainable = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
    pending = trainable * (1 if optimizer_ready else 1 + ADAM_MOMENTS)
    return fit_micro_batch(int(free - pending - (1 - USABLE) * total), per, decisions)


def measure_saved_bytes(
    policy: nn.Module,
    obs: torch.Tensor,
    actions: torch.Tensor,
    extras: Mapping[str, torch.Tensor] | None = None,
    *,
    value: bool = True,
) -> int:
    """Bytes of the tensors autograd saves for backward in one training pass of ``policy`` over
    a batch (its ``dist`` and, with ``value``, its ``value``), its parameters left out; each
    storage counted once. The gradients are computed and cleared."""
    params = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        d = policy.dist(obs, actions, dict(extras or {}))  # type: ignore[operator]
        loss = d.log_prob(actions).sum() + d.entropy().sum()
        if value:
            loss = loss + policy.value(obs, dict(extras or {})).sum()  # type: ignore[operator]
    if loss.requires_grad:
        loss.backward()
    policy.zero_grad(set_to_none=True)
    return sum(saved.values())


def transformer_policy_architecture(policy: nn.Module, act_bytes: int = 4) -> int:
    """The activation model's bytes per decision for ebrl's :class:`TransformerPolicy` (its
    encoder as a :class:`Block`, fused attention; the token embeddings, the head's input and the
    critic MLP's inputs and Tanh outputs): what ``tests/test_memory.py`` calibrates."""
    k = policy.spec.chunk_size  # type: ignore[attr-defined]
    d, heads = policy.d_model, policy.num_heads  # type: ignore[attr-defined]
    tokens = policy.obs_tokens + k  # type: ignore[attr-defined]
    block = Block(
        policy.num_layers,  # type: ignore[attr-defined]
        d,
        4 * d,
        heads,
        heads,
        d // heads,
        tokens=tokens,
        keys=tokens,
        gated=False,
        eager=False,
    )
    critic = [m for m in policy.critic if isinstance(m, nn.Linear)]  # type: ignore[attr-defined]
    critic_elems = sum(m.in_features + m.out_features for m in critic[:-1]) + critic[-1].in_features
    outer = tokens * d * 3  # embeddings' sum, the final norm's input and output
    return block.saved_bytes(act_bytes) + (outer + critic_elems) * act_bytes
