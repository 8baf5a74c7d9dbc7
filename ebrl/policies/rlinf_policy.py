"""A model of RLinf's model registry as an ebrl :class:`~ebrl.policies.base.Policy`.

RLinf (the system EBRL extends) builds every embodied policy through one registry,
``rlinf.models.get_model(cfg)`` (``cfg.model_type``: ``mlp_policy``, ``openvla_oft``,
``openpi``, ``gr00t``, ...), and every model speaks one contract:

- rollout: ``predict_action_batch(env_obs, mode="train"|"eval")`` returns the chunk
  ``[B, K, A]`` and a dict with ``prev_logprobs``, ``prev_values`` and ``forward_inputs`` (what
  the learner must feed back to score that chunk);
- training: ``default_forward(forward_inputs=..., compute_logprobs, compute_entropy,
  compute_values)`` returns ``logprobs``, ``entropy`` and ``values`` with gradients.

:class:`RLinfPolicy` maps that contract onto ebrl's:

- **Observations.** RLinf's ``env_obs`` is built from ebrl's flat observation by the simulator's
  layout (:mod:`ebrl.envs.layout`): ``states``, the cameras as ``uint8 [B, H, W, C]``
  (``main_images``, ``wrist_images``, ...), and ``task_descriptions``, each row's instruction
  (from the task one-hot the vector carries, or the run's one instruction). The model is built
  with ``obs_dim`` the state's size.
- **Rollout.** ``act`` is ``predict_action_batch``: the chunk, its log-prob summed over the
  chunk's dimensions (as ebrl's decoupled PPO and GRPO use it) and the value head's estimate.
- **Learner.** ``evaluate(obs, actions, extras)`` / ``dist`` rebuild ``forward_inputs``: what
  equals a field of the observation (under its name or another: openpi's ``observation/image``
  is ``main_images``) comes from it, what equals the chunk from the chunk, and the rest
  (openpi's denoising ``chains`` and ``denoise_inds``, its tokenised prompt, ...) are the
  chunk's ``extras``, which ``act`` returns and ebrl's stages carry to the learner row for row
  (:mod:`ebrl.types`). One rollout call on a random observation, at build, sorts the inputs
  into these three and records each extra's shape.
- **Values.** With the extras of the chunk decided on an observation (the value loss, the
  values at decisions) through ``default_forward``; of an observation alone (after a chunk, for
  GAE's bootstrap) through the rollout call, which a model whose value reads its inputs to the
  learner (a chain) needs: a full rollout call, so slower than a value head alone.
- **Weights.** The model's ``state_dict`` (ebrl's weight board and checkpoints carry it).
- **Device.** RLinf's ``get_model`` moves the model it built to the accelerator whenever one is
  visible, unless the config says ``load_to_device: False``; a Ray actor with no GPU share (the
  driver, an env worker, a CPU role) still sees every GPU of its node, so that would put the
  model on GPU 0 of a role never given it. The model is built on the CPU (``load_to_device``
  is always False) and the role moves it to the device it was given (``GenStage``,
  ``StageFactory.train``).

ebrl's batch-independent sampling noise is not used: RLinf's models draw their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ebrl.envs.layout import STATES, TASK
from ebrl.policies.base import Evaluation, Policy, PolicySpec
from ebrl.types import ActionChunk, Extras, Observation

#: RLinf's names of full precision (``actor.model.precision``)
FP32 = ("fp32", "32", "32-true")
#: RLinf's camera keys (its envs give each, ``None`` where they have no such camera)
CAMERA_KEYS = ("main_images", "wrist_images", "extra_view_images")
#: RLinf's env-obs key of the rows' instructions
INSTRUCTIONS = "task_descriptions"

GetModel = Callable[[Any], torch.nn.Module]


def rlinf_models(registry: str | GetModel | None = None) -> GetModel:
    """RLinf's ``get_model`` (or the one ``registry`` names); a clear error without RLinf."""
    from ebrl.external import rlinf_entry

    return rlinf_entry(
        registry, "rlinf.models", "get_model", "policy", "policy=transformer_l or policy=mlp"
    )


def _flat_sum(x: torch.Tensor, b: int) -> torch.Tensor:  # -> [B]
    return x.reshape(b, -1).float().sum(dim=1)


def _per_dim(x: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:  # -> [B, K, A]
    """A model's per-dimension scores of ``actions [B, K, A]``, or its one score per decision
    spread over the chunk's dimensions: openpi's entropy is ``[B, 1]``, the mean over the
    chunk's dimensions (and denoising steps), so each dimension gets that mean."""
    if x.numel() == actions.numel():
        return x.float().reshape(actions.shape)
    if x.numel() == actions.shape[0]:
        return x.float().reshape(-1, 1, 1).expand(actions.shape)
    raise RuntimeError(
        f"an RLinf model scored chunks of shape {tuple(actions.shape)} with a tensor of shape "
        f"{tuple(x.shape)}: ebrl reads one score per action dimension or one per decision"
    )


class ScoredChunk:
    """What RLinf's ``default_forward`` gives for given chunks, in the shape ebrl's algorithms
    read from a distribution over the chunk: per-dimension log-probs and entropy ``[B, K, A]``.

    It scores the chunks it was computed for and nothing else (RLinf's contract returns
    log-probs, not a distribution): ``log_prob`` of other actions raises, and so do ``mean`` and
    ``stddev``, which GRPO's KL to a reference policy (``algo.cfg.kl_coef > 0``) would need.
    """

    def __init__(self, actions: torch.Tensor, logprob: torch.Tensor, entropy: torch.Tensor):
        self.actions = actions
        self._logprob = logprob.float().reshape(actions.shape)
        self._entropy = _per_dim(entropy, actions)

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
            fp32, ``is_lora`` to false, ``add_value_head`` to true: PPO needs a critic). A
            ``prompts: null`` entry is given the simulator's instructions (a test-size openpi
            trains its tokenizer on them: ``ebrl.policies.openpi``).
        registry: another ``get_model`` (a dotted path or a callable; the tests' fake).
        **_node: the rest of the config node (name, package, install; a VLA's
            ``requires_gpu``, checkpoint and the rest of ``vla_policy_schema``).

    Raises:
        UnavailableHere: a VLA node (``requires_gpu``) on a machine without a usable GPU, its
            package or its checkpoint directories (``ebrl.external.vla_preflight``).
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

        if _node.get("requires_gpu"):  # one of the paper's VLAs (conf/policy/pi0.yaml ...)
            from ebrl.external import vla_preflight

            vla_preflight({**_node, "model_type": model_type, "model_cfg": model_cfg or {}})
        get_model = rlinf_models(registry)
        self.layout = spec.obs_layout()
        given = (
            OmegaConf.to_container(model_cfg, resolve=True)
            if OmegaConf.is_config(model_cfg)
            else dict(model_cfg or {})
        )
        if "prompts" in given and given["prompts"] is None:
            given["prompts"] = list(self.layout.instructions) or None
        cfg = OmegaConf.create(
            {
                "precision": "fp32",
                "is_lora": False,
                "add_value_head": True,
                "add_q_head": False,
                **given,
                # built on the CPU; the role moves it to its own device (module docstring)
                "load_to_device": False,
                "model_type": model_type,
                "obs_dim": self.layout.size(STATES) or spec.obs_dim,
                "action_dim": spec.action_dim,
                "num_action_chunks": spec.chunk_size,
            }
        )
        model = get_model(cfg)
        if model is None:
            raise RuntimeError(f"RLinf's model registry has no model type {model_type!r}")
        self.model_type = model_type
        # fp32 (ebrl's default) in full; another precision as RLinf's builder left the model
        # (openpi keeps selected parameters in bf16 under precision null)
        self.model = model.float() if str(cfg.precision) in FP32 else model
        #: forward_inputs rebuilt from the observation: input name -> RLinf's env-obs key
        self.from_obs: dict[str, str] = {}
        #: forward_inputs rebuilt from the chunk (flattened)
        self.from_chunk: tuple[str, ...] = ()
        #: the extras a chunk carries to the learner: name -> (shape after B, dtype)
        self.extra_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self._check_rollout()

    def env_obs(self, obs: torch.Tensor) -> dict[str, Any]:
        """RLinf's env observation of ``obs [B, O]`` by the simulator's layout: each field
        (``states`` float, images ``uint8 [B, H, W, C]``), the rows' ``task_descriptions`` where
        the simulator declares instructions, and ``None`` for the cameras it lacks where it has
        one (RLinf's envs give every camera key)."""
        out: dict[str, Any] = {
            f.name: self.layout.view(obs, f.name) for f in self.layout.fields if f.name != TASK
        }
        if any(f.kind == "image" for f in self.layout.fields):
            out.update({k: None for k in CAMERA_KEYS if k not in out})
        if self.layout.instructions:
            out[INSTRUCTIONS] = self.layout.instructions_of(obs)
        return out

    def _check_rollout(self) -> None:
        """One rollout call on a random observation: its chunk shape, and for each of its
        ``forward_inputs`` where the learner gets it: rebuilt from the observation (equal to a
        field of it), from the chunk (equal to it), or carried as an extra."""
        b, k, a = 2, self.spec.chunk_size, self.spec.action_dim
        obs = torch.rand(b, self.spec.obs_dim, generator=torch.Generator().manual_seed(0))
        env_obs = self.env_obs(obs)
        with torch.no_grad():
            chunk, result = self.model.predict_action_batch(env_obs=env_obs, mode="train")
        if tuple(chunk.shape) != (b, k, a):
            raise RuntimeError(
                f"RLinf model {self.model_type!r} returned chunks of shape {tuple(chunk.shape)} "
                f"for a batch of {b}, ebrl expects ({b}, {k}, {a}) (chunk_size={k}): set "
                "chunk_size to the model's num_action_chunks"
            )
        flat = chunk.reshape(b, -1)
        fields = {k: v for k, v in env_obs.items() if torch.is_tensor(v)}
        from_chunk = []
        for name, t in dict(result.get("forward_inputs", {})).items():
            if not torch.is_tensor(t) or t.shape[:1] != (b,):
                raise RuntimeError(
                    f"RLinf model {self.model_type!r}: forward_inputs[{name!r}] is not a tensor "
                    f"with one row per decision ({type(t).__name__}"
                    f"{tuple(t.shape) if torch.is_tensor(t) else ''}); ebrl carries per-decision "
                    "tensors from the generator to the learner only"
                )
            # under its own name or another (openpi's "observation/image" is main_images)
            same = [key for key, v in fields.items() if _same(t, v)]
            if same:
                self.from_obs[name] = name if name in same else same[0]
            elif _same(t.reshape(b, -1), flat):
                from_chunk.append(name)
            else:
                self.extra_shapes[name] = (tuple(t.shape[1:]), t.dtype)
        self.from_chunk = tuple(from_chunk)

    @torch.no_grad()
    def act(
        self,
        batch: Observation,
        deterministic: bool = False,
        noise: torch.Tensor | None = None,  # RLinf's models draw their own noise
    ) -> ActionChunk:
        b = batch.obs.shape[0]
        chunk, result = self.model.predict_action_batch(
            env_obs=self.env_obs(batch.obs), mode="eval" if deterministic else "train"
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
        env_obs = self.env_obs(obs) if self.from_obs else {}
        flat = actions.reshape(obs.shape[0], -1)
        inputs = {
            **{name: env_obs[key] for name, key in self.from_obs.items()},
            **{name: flat for name in self.from_chunk},
            **extras,
        }
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

    def value(self, obs: torch.Tensor, extras: Extras | None = None) -> torch.Tensor:  # [B]
        """The value head's estimate of ``obs``: through the learner's call (with gradients)
        given the extras of the chunk decided on ``obs``, or where the model needs none; else
        (an observation alone, after a chunk) through the rollout call, without gradients."""
        b = obs.shape[0]
        if extras is None and self.extra_shapes:
            if torch.is_grad_enabled():
                raise ValueError(
                    f"RLinf model {self.model_type!r}: a value with gradients needs the extras "
                    f"{sorted(self.extra_shapes)} of the chunk decided on the observation"
                )
            _, result = self.model.predict_action_batch(env_obs=self.env_obs(obs), mode="eval")
            return result["prev_values"].reshape(b, -1)[:, 0].float()
        zeros = torch.zeros(b, self.spec.chunk_size, self.spec.action_dim, device=obs.device)
        out = self._forward(obs, zeros, extras, scores=False, values=True)
        return out["values"].reshape(b, -1)[:, 0].float()

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, extras: Extras | None = None
    ) -> Evaluation:
        """Log-prob, entropy and value of given chunks in one forward pass."""
        b = obs.shape[0]
        out = self._forward(obs, actions, extras, scores=True, values=True)
        return Evaluation(
            logprob=_flat_sum(out["logprobs"], b),
            entropy=_flat_sum(_per_dim(out["entropy"], actions), b),
            value=out["values"].reshape(b, -1)[:, 0].float(),
        )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and values (dtypes may differ)."""
    return a.shape == b.shape and torch.equal(a, b.to(a.dtype))
