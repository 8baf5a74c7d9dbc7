"""The data contract between stages.

Shapes use these letters:
  B  decisions in a batch (one decision = one env acting on one observation)
  N  envs in a segment
  T  decisions per env in a segment
  K  actions per chunk (``chunk_size``); an env executes 1..K of them per decision
  A  action dimension
  O  observation dimension (flat state observations)
  ...  an extra's own shape (see below)

Credit assignment is chunk-level: one decision is one transition. Its reward is the discounted
sum of the per-step rewards actually collected, ``sum_j gamma^j r_j`` over the ``n_steps`` actions
executed, and its discount to the next decision is ``gamma ** n_steps``. A chunk ends early when the
env's episode ends inside it; the remaining actions are dropped. See ``ebrl.algos.returns``.

Every decision carries the ``policy_version`` that produced it, so staleness (learner version
minus acting version) is measurable under every scheduler. Stage timings do not travel with the
data: see :class:`StageTimes`.

``extras`` are what a policy's learner call needs, beyond the observation and the chunk, to score
the chunk its generator call sampled: a flow-matching VLA's denoising chain and the indices of
its noise-injected steps (RLinf's ``forward_inputs``). The policy names them (``act`` fills
them, :meth:`ebrl.policies.base.Policy.evaluate` reads them); every stage carries them as it
carries the chunk, row for row, and never looks inside. Most policies have none: ``{}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Self

import torch

Tensor = torch.Tensor


Extras = dict[str, Tensor]


def _map(obj: Any, fn) -> Any:
    """Apply ``fn`` to every tensor field of a dataclass (and to every tensor of its ``extras``),
    returning a new instance."""

    def each(v: Any) -> Any:
        return {k: fn(t) for k, t in v.items()} if isinstance(v, dict) else fn(v)

    return type(obj)(**{f.name: each(getattr(obj, f.name)) for f in dataclasses.fields(obj)})


def _same_keys(parts: list[Extras], where: str) -> None:
    keys = set(parts[0])
    if any(set(p) != keys for p in parts[1:]):
        raise ValueError(
            f"{where}: the parts carry different extras ({[sorted(p) for p in parts]})"
        )


@dataclass(kw_only=True, slots=True)
class Observation:
    """Observations ready for the generator, for a subset of envs."""

    obs: Tensor  # [B, O] float32, the observation each env will act on
    env_ids: Tensor  # [B] int64, global env ids (unique within a batch)

    def __len__(self) -> int:
        return int(self.env_ids.shape[0])

    def rows(self, a: int, b: int) -> Self:
        """Rows ``a:b`` (a view, no copy)."""
        return _map(self, lambda t: t[a:b])


@dataclass(kw_only=True, slots=True)
class ActionChunk:
    """The generator's answer for a batch of observations."""

    actions: Tensor  # [B, K, A] float32, the chunk each env will execute
    logprob: Tensor  # [B] float32, log-prob of the whole chunk under the acting policy
    value: Tensor  # [B] float32, critic's value of the observation (0 for critic-free algos)
    env_ids: Tensor  # [B] int64, same order as the Observation it answers
    policy_version: Tensor  # [B] int64, version of the weights that acted
    extras: Extras = field(default_factory=dict)  # name -> [B, ...], to score the chunk

    def __len__(self) -> int:
        return int(self.env_ids.shape[0])

    def rows(self, a: int, b: int) -> Self:
        """Rows ``a:b`` (a view, no copy)."""
        return _map(self, lambda t: t[a:b])

    def select(self, index: Tensor) -> Self:
        """Rows ``index`` ([M] int64), in that order."""
        return _map(self, lambda t: t[index])

    def to(self, device: torch.device | str) -> Self:
        return _map(self, lambda t: t.to(device))


@dataclass(kw_only=True, slots=True)
class ChunkOutcome:
    """What a simulator returns after each env in a batch executed its chunk."""

    reward: Tensor  # [B, K] float32, per-step rewards; zero after the chunk ended early
    n_steps: Tensor  # [B] int64, actions actually executed, 1..K
    terminated: Tensor  # [B] bool, the episode ended in a terminal state inside this chunk
    truncated: Tensor  # [B] bool, the episode hit its time limit inside this chunk
    success: Tensor  # [B] bool, the task was solved at some step of this chunk
    final_obs: Tensor  # [B, O] float32, observation after the chunk, before any reset
    next_obs: Tensor  # [B, O] float32, observation to act on next (after reset if done)
    episode_id: Tensor  # [B] int64, per-env episode counter of the episode this chunk was in
    episode_step: Tensor  # [B] int64, env steps of that episode before this chunk (0: it began it)
    env_ids: Tensor  # [B] int64, global env ids, same order as the chunk that was executed

    def __len__(self) -> int:
        return int(self.env_ids.shape[0])

    @property
    def done(self) -> Tensor:  # [B] bool
        return self.terminated | self.truncated


@dataclass(kw_only=True, slots=True)
class Transition:
    """One decision of one env, complete: an ActionChunk joined with its ChunkOutcome."""

    obs: Tensor  # [B, O] float32
    actions: Tensor  # [B, K, A] float32
    logprob: Tensor  # [B] float32, behaviour log-prob of the chunk
    value: Tensor  # [B] float32, behaviour value
    reward: Tensor  # [B, K] float32
    n_steps: Tensor  # [B] int64
    terminated: Tensor  # [B] bool
    truncated: Tensor  # [B] bool
    success: Tensor  # [B] bool
    final_obs: Tensor  # [B, O] float32
    episode_id: Tensor  # [B] int64
    episode_step: Tensor  # [B] int64
    env_ids: Tensor  # [B] int64
    policy_version: Tensor  # [B] int64
    extras: Extras = field(default_factory=dict)  # name -> [B, ...], the chunk's

    def rows(self, a: int, b: int) -> Self:
        """Rows ``a:b`` (a view, no copy)."""
        return _map(self, lambda t: t[a:b])

    @classmethod
    def cat(cls, parts: list[Self]) -> Self:
        """Concatenate batches of decisions along B."""
        _same_keys([p.extras for p in parts], "Transition.cat")
        out: dict[str, Any] = {
            f.name: torch.cat([getattr(p, f.name) for p in parts])
            for f in dataclasses.fields(cls)
            if f.name != "extras"
        }
        out["extras"] = {k: torch.cat([p.extras[k] for p in parts]) for k in parts[0].extras}
        return cls(**out)

    @classmethod
    def join(cls, obs: Observation, chunk: ActionChunk, out: ChunkOutcome) -> Self:
        """Join the three messages of one decision; refuses to mix different envs' data."""
        if not (
            torch.equal(obs.env_ids, chunk.env_ids) and torch.equal(chunk.env_ids, out.env_ids)
        ):
            raise ValueError(
                "Transition.join: env_ids differ between observation, action chunk and outcome; "
                "a scheduler paired messages of different envs"
            )
        return cls(
            obs=obs.obs,
            actions=chunk.actions,
            logprob=chunk.logprob,
            value=chunk.value,
            reward=out.reward,
            n_steps=out.n_steps,
            terminated=out.terminated,
            truncated=out.truncated,
            success=out.success,
            final_obs=out.final_obs,
            episode_id=out.episode_id,
            episode_step=out.episode_step,
            env_ids=out.env_ids,
            policy_version=chunk.policy_version,
            extras=chunk.extras,
        )


@dataclass(kw_only=True, slots=True)
class Segment:
    """A rectangular trajectory segment: T consecutive decisions of each of N envs.

    Time-major like CleanRL's storage. Decision ``[t, i]`` is env ``env_ids[i]``'s t-th decision
    in this segment; ``[t + 1, i]`` follows it in that env's history (``obs[t+1, i]`` equals
    ``final_obs[t, i]`` unless the episode ended at t). Schedulers that let envs run at their own
    pace still hand the learner this shape: each env contributes exactly T decisions.
    """

    obs: Tensor  # [T, N, O] float32
    actions: Tensor  # [T, N, K, A] float32
    logprob: Tensor  # [T, N] float32, behaviour log-prob
    value: Tensor  # [T, N] float32, behaviour value
    reward: Tensor  # [T, N, K] float32
    n_steps: Tensor  # [T, N] int64
    terminated: Tensor  # [T, N] bool
    truncated: Tensor  # [T, N] bool
    success: Tensor  # [T, N] bool
    final_obs: Tensor  # [T, N, O] float32
    episode_id: Tensor  # [T, N] int64
    episode_step: Tensor  # [T, N] int64, env steps of the episode before this decision
    env_ids: Tensor  # [N] int64
    policy_version: Tensor  # [T, N] int64
    extras: Extras = field(default_factory=dict)  # name -> [T, N, ...], each decision's chunk's

    @property
    def num_steps(self) -> int:
        """Environment steps (single actions) in the segment."""
        return int(self.n_steps.sum())

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.obs.shape[0]), int(self.obs.shape[1]))

    @classmethod
    def stack(cls, rows: list[Transition]) -> Self:
        """Stack T transitions, each over the same N envs in the same order, into a segment."""
        if not rows:
            raise ValueError("Segment.stack: no transitions")
        ids = rows[0].env_ids
        for r in rows[1:]:
            if not torch.equal(r.env_ids, ids):
                raise ValueError("Segment.stack: rows cover different envs or a different order")
        fields = {
            f.name: torch.stack([getattr(r, f.name) for r in rows])
            for f in dataclasses.fields(Transition)
            if f.name not in ("env_ids", "extras")
        }
        _same_keys([r.extras for r in rows], "Segment.stack")
        extras = {k: torch.stack([r.extras[k] for r in rows]) for k in rows[0].extras}
        return cls(env_ids=ids.clone(), extras=extras, **fields)

    @classmethod
    def cat_envs(cls, parts: list[Self]) -> Self:
        """Concatenate segments of equal T over disjoint env sets (e.g. env groups)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "extras":
                _same_keys([p.extras for p in parts], "Segment.cat_envs")
                out["extras"] = {
                    k: torch.cat([p.extras[k] for p in parts], dim=1) for k in parts[0].extras
                }
                continue
            dim = 0 if f.name == "env_ids" else 1
            out[f.name] = torch.cat([getattr(p, f.name) for p in parts], dim=dim)
        seg = cls(**out)
        if seg.env_ids.unique().numel() != seg.env_ids.numel():
            raise ValueError("Segment.cat_envs: env ids overlap between parts")
        return seg

    def staleness(self, learner_version: int) -> Tensor:  # [T, N] int64
        """Learner version minus the version that acted, per decision."""
        return learner_version - self.policy_version

    def flat_extras(self) -> Extras:
        """``extras`` with the decisions on one axis: name -> ``[T*N, ...]``, in the order of
        ``obs.flatten(0, 1)``."""
        return {k: v.flatten(0, 1) for k, v in self.extras.items()}

    def to(self, device: torch.device | str) -> Self:
        return _map(self, lambda t: t.to(device))


@dataclass(kw_only=True, slots=True)
class StageTimes:
    """Wall-clock seconds a stage spent working, waiting, and how much it did.

    Travels beside the data (never inside it), so schedulers can account for busy time,
    bubbles and throughput without touching the batches.
    """

    busy: dict[str, float] = field(default_factory=dict)  # stage name -> seconds working
    count: dict[str, int] = field(default_factory=dict)  # stage name -> calls

    def add(self, stage: str, seconds: float, n: int = 1) -> None:
        self.busy[stage] = self.busy.get(stage, 0.0) + seconds
        self.count[stage] = self.count.get(stage, 0) + n

    def merge(self, other: StageTimes) -> None:
        for k, v in other.busy.items():
            self.add(k, v, other.count.get(k, 0))
