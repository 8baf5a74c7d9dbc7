"""One interface for every simulator: single envs, grouped and stepped through action chunks.

A simulator adapter implements :class:`Env` (one environment instance, one action at a time).
:class:`EnvGroup` owns several of them and steps any subset through action chunks: each env runs
its own chunk until its K actions are spent or its episode ends, then resets itself. Nothing in an
env group waits for another env; schedulers decide which envs to step together.

Reset seeds are a pure function of ``(seed, reset_group, episode_id, stream)`` where
``reset_group = env_id // reset_group_size``: envs of one reset group start each of their
episodes from the same initial state, which is what GRPO's group-relative advantages need; with
``reset_group_size = 1`` every env gets its own stream of initial states. ``stream`` is the
learner version a resumed run restarts at (0 for a fresh run): a resumed attempt's episodes come
from a family of initial states of their own instead of replaying the first attempt's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from ebrl.envs.layout import ObsLayout
from ebrl.types import ActionChunk, ChunkOutcome


@dataclass(frozen=True, slots=True)
class EnvSpec:
    """What a policy needs to know about a simulator."""

    obs_dim: int
    action_dim: int
    max_episode_steps: int
    action_low: float = -1.0
    action_high: float = 1.0
    #: the parts of the observation and the tasks' instructions (None: one ``states`` field)
    layout: ObsLayout | None = None

    def obs_layout(self) -> ObsLayout:
        """The declared layout, checked against ``obs_dim``; one ``states`` field without."""
        return (self.layout or ObsLayout.flat(self.obs_dim)).check(self.obs_dim)


@dataclass(slots=True)
class StepResult:
    obs: np.ndarray  # [O] float32, observation after the step (before any reset)
    reward: float
    terminated: bool
    truncated: bool
    success: bool


@runtime_checkable
class Env(Protocol):
    """One environment instance. Adapters convert whatever the simulator returns to this."""

    spec: EnvSpec

    def reset(self, seed: int) -> np.ndarray:  # -> [O] float32
        ...

    def step(self, action: np.ndarray) -> StepResult:  # action: [A] float32
        ...

    def close(self) -> None: ...


#: env.step durations each env keeps for its latency percentiles (EnvGroup.step_latency)
LATENCY_WINDOW = 1024


def reset_seed(seed: int, reset_group: int, episode_id: int, stream: int = 0) -> int:
    """Deterministic reset seed for an episode; distinct inputs give distinct streams.

    ``stream`` 0 (a fresh run) keeps the three-part entropy the seeds have always had, so a run
    that never resumes draws exactly the initial states it drew before resuming existed."""
    entropy = [seed & 0xFFFFFFFF, reset_group, episode_id] + ([stream] if stream else [])
    ss = np.random.SeedSequence(entropy)
    return int(ss.generate_state(1, dtype=np.uint32)[0])


class EnvGroup:
    """N envs stepped through action chunks, each independently.

    Args:
        envs: the env instances, one per global id in ``env_ids``.
        env_ids: global env ids of these envs (ids are unique across all groups of a run).
        seed: run seed; reset seeds derive from it (see module docstring).
        reset_group_size: envs with the same ``env_id // reset_group_size`` share initial states.
        stream: family of initial states (see the module docstring; 0: a fresh run).
    """

    def __init__(
        self,
        envs: list[Env],
        env_ids: list[int],
        seed: int,
        reset_group_size: int = 1,
        stream: int = 0,
    ) -> None:
        if len(envs) != len(env_ids) or not envs:
            raise ValueError("EnvGroup: need one env per env id, and at least one")
        dims = {(e.spec.obs_dim, e.spec.action_dim) for e in envs}
        if len(dims) != 1:
            raise ValueError(f"EnvGroup: envs of one group must share obs/action dims, got {dims}")
        self.envs = envs
        self.env_ids = torch.as_tensor(env_ids, dtype=torch.int64)
        self._local = {int(g): i for i, g in enumerate(env_ids)}
        self.spec = envs[0].spec
        self.seed = seed
        self.reset_group_size = max(1, reset_group_size)
        self.stream = stream
        self.episode_id = np.zeros(len(envs), dtype=np.int64)
        self.episode_step = np.zeros(len(envs), dtype=np.int64)
        self._obs = np.zeros((len(envs), self.spec.obs_dim), dtype=np.float32)
        #: seconds spent inside the simulator (env.step / env.reset), for stage accounting
        self.sim_seconds = 0.0
        #: each env's last LATENCY_WINDOW env.step durations, seconds (a ring per env), and how
        #: many steps each has taken: the per-env step latency (:meth:`step_latency`)
        self._lat = np.zeros((len(envs), LATENCY_WINDOW), dtype=np.float64)
        self._lat_steps = np.zeros(len(envs), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.envs)

    def _reset_one(self, i: int) -> np.ndarray:
        gid = int(self.env_ids[i])
        s = reset_seed(
            self.seed, gid // self.reset_group_size, int(self.episode_id[i]), self.stream
        )
        return self.envs[i].reset(s)

    def reset(self) -> torch.Tensor:
        """Reset every env to episode 0; returns observations ``[N, O]`` in ``env_ids`` order.

        Calling it again replays the same initial states (episode ids restart at 0).
        """
        t0 = time.perf_counter()
        self.episode_id[:] = 0
        self.episode_step[:] = 0
        for i in range(len(self.envs)):
            self._obs[i] = self._reset_one(i)
        self.sim_seconds += time.perf_counter() - t0
        return torch.from_numpy(self._obs.copy())

    def observe(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Current observations ``[M, O]`` of the given envs (all envs when None)."""
        idx = self._indices(env_ids)
        return torch.from_numpy(self._obs[idx].copy())

    def _indices(self, env_ids: torch.Tensor | None) -> np.ndarray:
        if env_ids is None:
            return np.arange(len(self.envs))
        try:
            return np.array([self._local[int(g)] for g in env_ids], dtype=np.int64)
        except KeyError as e:
            raise KeyError(f"EnvGroup: env id {e.args[0]} is not in this group") from None

    def step_chunk(self, chunk: ActionChunk) -> ChunkOutcome:
        """Run each env in ``chunk.env_ids`` through its action chunk ``[M, K, A]``."""
        idx = self._indices(chunk.env_ids)
        actions = chunk.actions.detach().cpu().numpy()
        m, k, a = actions.shape
        if a != self.spec.action_dim:
            raise ValueError(f"EnvGroup: action dim {a} != the simulator's {self.spec.action_dim}")
        out = _Outcome.empty(m, k, self.spec.obs_dim)
        t0 = time.perf_counter()
        for row, i in enumerate(idx):
            self._run_chunk(int(i), actions[row], out, row)
        self.sim_seconds += time.perf_counter() - t0
        return out.to_outcome(chunk.env_ids)

    def step_one(self, env_id: int, actions: np.ndarray) -> ChunkOutcome:
        """Run a single env through its chunk ``[K, A]`` (the unit of step-level scheduling)."""
        i = int(self._indices(torch.tensor([env_id]))[0])
        out = _Outcome.empty(1, actions.shape[0], self.spec.obs_dim)
        t0 = time.perf_counter()
        self._run_chunk(i, actions, out, 0)
        self.sim_seconds += time.perf_counter() - t0
        return out.to_outcome(torch.tensor([env_id], dtype=torch.int64))

    def _run_chunk(self, i: int, actions: np.ndarray, out: _Outcome, row: int) -> None:
        env = self.envs[i]
        out.episode_id[row] = self.episode_id[i]
        out.episode_step[row] = self.episode_step[i]
        obs = self._obs[i]
        lat, at = self._lat[i], int(self._lat_steps[i])
        clock = time.perf_counter
        for j in range(actions.shape[0]):
            t = clock()
            r = env.step(actions[j])
            lat[(at + j) % LATENCY_WINDOW] = clock() - t
            obs = r.obs
            out.reward[row, j] = r.reward
            out.n_steps[row] = j + 1
            out.success[row] |= r.success
            if r.terminated or r.truncated:
                out.terminated[row] = r.terminated
                out.truncated[row] = r.truncated and not r.terminated
                break
        out.final_obs[row] = obs
        self._lat_steps[i] += out.n_steps[row]
        self.episode_step[i] += out.n_steps[row]
        if out.terminated[row] or out.truncated[row]:
            self.episode_id[i] += 1
            self.episode_step[i] = 0
            obs = self._reset_one(i)
        self._obs[i] = obs
        out.next_obs[row] = obs

    def step_latency(self) -> dict[int, tuple[float, float, int]]:
        """Each env's ``env.step`` latency over its last LATENCY_WINDOW steps: env id ->
        (P50 seconds, P99 seconds, steps taken in all); envs that have not stepped are left out.

        Where step costs differ between envs (contact-rich LIBERO scenes, stragglers), this is
        what the resource manager and the motivation figure read.
        """
        out = {}
        for i, n in enumerate(self._lat_steps):
            if n:
                p50, p99 = np.percentile(self._lat[i, : min(int(n), LATENCY_WINDOW)], (50, 99))
                out[int(self.env_ids[i])] = (float(p50), float(p99), int(n))
        return out

    def close(self) -> None:
        for e in self.envs:
            e.close()


@dataclass(slots=True)
class _Outcome:
    """Preallocated numpy buffers filled env by env, turned into a ChunkOutcome at the end."""

    reward: np.ndarray
    n_steps: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    final_obs: np.ndarray
    next_obs: np.ndarray
    episode_id: np.ndarray
    episode_step: np.ndarray

    @classmethod
    def empty(cls, m: int, k: int, o: int) -> _Outcome:
        return cls(
            reward=np.zeros((m, k), np.float32),
            n_steps=np.zeros(m, np.int64),
            terminated=np.zeros(m, bool),
            truncated=np.zeros(m, bool),
            success=np.zeros(m, bool),
            final_obs=np.zeros((m, o), np.float32),
            next_obs=np.zeros((m, o), np.float32),
            episode_id=np.zeros(m, np.int64),
            episode_step=np.zeros(m, np.int64),
        )

    def to_outcome(self, env_ids: torch.Tensor) -> ChunkOutcome:
        return ChunkOutcome(
            reward=torch.from_numpy(self.reward),
            n_steps=torch.from_numpy(self.n_steps),
            terminated=torch.from_numpy(self.terminated),
            truncated=torch.from_numpy(self.truncated),
            success=torch.from_numpy(self.success),
            final_obs=torch.from_numpy(self.final_obs),
            next_obs=torch.from_numpy(self.next_obs),
            episode_id=torch.from_numpy(self.episode_id),
            episode_step=torch.from_numpy(self.episode_step),
            env_ids=env_ids.clone(),
        )
