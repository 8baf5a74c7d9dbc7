"""A model of RLinf's model registry as an ebrl :class:`~ebrl.policies.base.Policy`.

RLinf (the system EBRL extends) builds every embodied policy through one registry,
``rlinf.models.get_model(cfg)`` (``cfg.model_type``: ``mlp_policy``, ``openvla_oft``,
``openpi``, ``gr00t``, ...), and every model speaks one contract:

- rollout: ``predict_action_batch(env_obs, mode="train"|"eval")`` returns the chunk
  ``[B, K, A]`` and a dict with ``prev_logprobs``, ``prev_values`` and ``forward_inputs`` (what
  the learner must feed back to score that chunk);
- training: ``default_forward(forward_inputs=..., compute_logprobs, compute_entropy,
  compute_values)`` returns ``logprobs``, ``entropy`` and ``values`` with gradients.

:class:`RLinfPolicy` maps that contract onto ebrl's: ``act`` is the rollout call (log-prob and
entropy summed over the chunk's dimensions, as ebrl's decoupled PPO and GRPO use them), and
``evaluate(obs, actions, extras)`` rebuilds ``forward_inputs`` from the observation, the chunk
and the chunk's ``extras``: every rollout input the learner call needs that the observation and
the chunk do not give (openpi's denoising ``chains`` and ``denoise_inds``, ...). The first
rollout call (on a zero observation, at build) names them and their shapes; ``act`` returns
them with the chunk, and ebrl's stages carry them to the learner row for row
(:mod:`ebrl.types`). The weights are the model's ``state_dict`` (ebrl's weight board and
checkpoints carry it).

The critic: ebrl's PPO asks for values of observations alone (the current critic's, at the
decision and after the chunk, for GAE). A model whose learner call reads extras gets zeros of
their shapes in a value call: right for models whose value head reads the observation only
(RLinf's MLP and flow policies; openpi with ``value_after_vlm``, pi0.5's setting), wrong for
one whose value reads the chain (openpi's default value head, on the action expert's output).

ebrl's observations are flat vectors (``ebrl.types``); the paper's VLAs also read camera images
and the task's instruction as separate inputs, which ebrl's observation contract does not carry
yet (``ebrl.external``). ebrl's batch-independent sampling noise is not used: RLinf's models
draw their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ebrl.policies.base import Evaluation, Policy, PolicySpec
from ebrl.types import ActionChunk, Extras, Observation

#: what ``evaluate`` rebuilds from (obs, actions): the rest of ``forward_inputs`` are extras
REBUILT = ("states", "action")
#: rebuilt from the chunk too where the model's rollout gives it equal to ``action``
MODEL_ACTION = "model_action"

GetModel = Callable[[Any], torch.nn.Module]


def rlinf_models(registry: str | GetModel | None = None) -> GetModel:
    """RLinf's ``get_model`` (or the one ``registry`` names); a clear error without RLinf."""
    from ebrl.external import rlinf_entry

    return rlinf_entry(
        registry, "rlinf.models", "get_model", "policy", "policy=transformer_l or policy=mlp"
    )


def _flat_sum(x: torch.Tensor, b: int) -> torch.Tensor:  # -> [B]
    return x.reshape(b, -1).float().sum(dim=1)


class ScoredChunk:
    """What RLinf's ``default_forward`` gives for given chunks, in the shape ebrl's algorithms
    read from a distribution over the chunk: per-dimension log-probs and entropy ``[B, K, A]``.

    It scores the chunks it was computed for and nothing else (RLinf's contract returns
    log-probs, not a distribution): ``log_prob`` of other actions raises, and so do ``mean`` and
    ``stddev``, which GRPO's KL to a reference policy (``algo.cfg.kl_coef > 0``) would need.
    """

    def __init__(self, actions: torch.Tensor, logprob: torch.Tensor, entropy: torch.Tensor):
        shape = actions.shape
        self.actions = actions
        self._logprob = logprob.float().reshape(shape)
        self._entropy = entropy.float().reshape(shape)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:  # [B, K, A]
        if actions is not self.actions and not torch.equal(actions, self.actions):
            raise ValueError("ScoredChunk: RLinf's models score the chunks they were given only")
        return self._logprob

    def entropy(self) -> torch.Tensor:  # [B, K, A]
        return self._entropy

    def _no_gaussian(self) -> RuntimeError:
        return RuntimeError(
            "an RLinf model gives log-probs, not a Gaussian's loc and scale: GRPO's KL to a "
            "reference policy needs them; set algo.cfg.kl_coef=0 with policy=rlinf_*"
        )

    @property
    def mean(self) -> torch.Tensor:
        raise self._no_gaussian()

    @property
    def stddev(self) -> torch.Tensor:
        raise self._no_gaussian()


class RLinfPolicy(Policy):
    """RLinf's model ``model_type``, built by ``get_model`` with ``model_cfg``.

    Args:
        spec: the env's dims and the chunk (ebrl fills ``obs_dim``, ``action_dim`` and
            ``num_action_chunks`` of the model's config from it).
        model_type: RLinf's model type (``mlp_policy``, ...).
        model_cfg: the rest of RLinf's ``actor.model`` node for it (``precision`` defaults to
            fp32, ``is_lora`` to false, ``add_value_head`` to true: PPO needs a critic).
        registry: another ``get_model`` (a dotted path or a callable; the tests' fake).
        **_node: the rest of the config node (name, package, install).

    Raises:
        RuntimeError: RLinf is missing, the registry builds nothing for ``model_type``, its
            chunks are not ``[B, K, A]``, or its rollout hands the learner something other than
            per-decision tensors.
    """

    def __init__(
        self,
        spec: PolicySpec,
        *,
        model_type: str,
        model_cfg: Mapping[str, Any] | None = None,
        registry: str | GetModel | None = None,
        **_node: Any,
    ) -> None:
        super().__init__(spec)
        from omegaconf import OmegaConf

        get_model = rlinf_models(registry)
        given = (
            OmegaConf.to_container(model_cfg, resolve=True)
            if OmegaConf.is_config(model_cfg)
            else dict(model_cfg or {})
        )
        cfg = OmegaConf.create(
            {
                "precision": "fp32",
                "is_lora": False,
                "add_value_head": True,
                "add_q_head": False,
                **given,
                "model_type": model_type,
                "obs_dim": spec.obs_dim,
                "action_dim": spec.action_dim,
                "num_action_chunks": spec.chunk_size,
            }
        )
        model = get_model(cfg)
        if model is None:
            raise RuntimeError(f"RLinf's model registry has no model type {model_type!r}")
        self.model_type = model_type
        self.model = model.float()
        #: the extras a chunk carries to the learner: name -> (shape after B, dtype)
        self.extra_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self.rebuilds_model_action = False
        self._check_rollout()

    def _check_rollout(self) -> None:
        """One rollout call on a zero observation: its chunk shape, and which of its
        ``forward_inputs`` the chunk must carry to the learner as extras."""
        b, k, a = 2, self.spec.chunk_size, self.spec.action_dim
        with torch.no_grad():
            chunk, result = self.model.predict_action_batch(
                env_obs={"states": torch.zeros(b, self.spec.obs_dim)}, mode="train"
            )
        if tuple(chunk.shape) != (b, k, a):
            raise RuntimeError(
                f"RLinf model {self.model_type!r} returned chunks of shape {tuple(chunk.shape)} "
                f"for a batch of {b}, ebrl expects ({b}, {k}, {a}) (chunk_size={k}): set "
                "chunk_size to the model's num_action_chunks"
            )
        inputs = dict(result.get("forward_inputs", {}))
        given = inputs.get(MODEL_ACTION)
        self.rebuilds_model_action = given is not None and torch.equal(
            given.reshape(b, -1), chunk.reshape(b, -1).to(given.dtype)
        )
        skip = {*REBUILT, *([MODEL_ACTION] if self.rebuilds_model_action else [])}
        for name, t in inputs.items():
            if name in skip:
                continue
            if not torch.is_tensor(t) or t.shape[:1] != (b,):
                raise RuntimeError(
                    f"RLinf model {self.model_type!r}: forward_inputs[{name!r}] is not a tensor "
                    f"with one row per decision ({type(t).__name__}"
                    f"{tuple(t.shape) if torch.is_tensor(t) else ''}); ebrl carries per-decision "
                    "tensors from the generator to the learner only"
                )
            self.extra_shapes[name] = (tuple(t.shape[1:]), t.dtype)

    @torch.no_grad()
    def act(
        self,
        batch: Observation,
        deterministic: bool = False,
        noise: torch.Tensor | None = None,  # RLinf's models draw their own noise
    ) -> ActionChunk:
        b = batch.obs.shape[0]
        chunk, result = self.model.predict_action_batch(
            env_obs={"states": batch.obs.float()}, mode="eval" if deterministic else "train"
        )
        inputs = result.get("forward_inputs", {})
        return ActionChunk(
            actions=chunk.float(),
            logprob=_flat_sum(result["prev_logprobs"], b),
            value=result["prev_values"].reshape(b, -1)[:, 0].float(),
            env_ids=batch.env_ids,
            policy_version=torch.full_like(batch.env_ids, self.version),
            extras={name: inputs[name].detach() for name in self.extra_shapes},
        )

    def _placeholders(self, b: int, device: torch.device) -> Extras:
        """Zeros of every extra's shape, for a call that reads values only."""
        return {
            name: torch.zeros((b, *shape), dtype=dtype, device=device)
            for name, (shape, dtype) in self.extra_shapes.items()
        }

    def _forward(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        extras: Extras | None,
        scores: bool,
        values: bool,
    ) -> dict[str, torch.Tensor]:
        extras = extras or {}
        missing = sorted(set(self.extra_shapes) - set(extras))
        if missing:
            raise ValueError(
                f"RLinf model {self.model_type!r} scores a chunk with {missing} from the rollout "
                "that sampled it: pass the chunk's extras (ActionChunk.extras, Segment.extras)"
            )
        flat = actions.reshape(obs.shape[0], -1)
        inputs = {"states": obs.float(), "action": flat, **extras}
        if self.rebuilds_model_action:
            inputs[MODEL_ACTION] = flat
        return self.model.default_forward(
            forward_inputs=inputs,
            compute_logprobs=scores,
            compute_entropy=scores,
            compute_values=values,
        )

    def dist(
        self, obs: torch.Tensor, actions: torch.Tensor | None = None, extras: Extras | None = None
    ) -> ScoredChunk:
        """The chunks ``actions [B, K, A]`` scored by the model (with gradients), with the
        extras their rollout returned."""
        if actions is None:
            raise ValueError("RLinfPolicy.dist scores given chunks: pass the actions")
        out = self._forward(obs, actions, extras, scores=True, values=False)
        return ScoredChunk(actions, out["logprobs"], out["entropy"])

    def value(self, obs: torch.Tensor) -> torch.Tensor:  # [B]
        b = obs.shape[0]
        zeros = torch.zeros(b, self.spec.chunk_size, self.spec.action_dim, device=obs.device)
        out = self._forward(
            obs, zeros, self._placeholders(b, obs.device), scores=False, values=True
        )
        return out["values"].reshape(b, -1)[:, 0].float()

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, extras: Extras | None = None
    ) -> Evaluation:
        """Log-prob, entropy and value of given chunks in one forward pass."""
        b = obs.shape[0]
        out = self._forward(obs, actions, extras, scores=True, values=True)
        return Evaluation(
            logprob=_flat_sum(out["logprobs"], b),
            entropy=_flat_sum(out["entropy"], b),
            value=out["values"].reshape(b, -1)[:, 0].float(),
        )
