"""A tiny deterministic fake env for tests: everything it returns says where it came from."""

from __future__ import annotations

import os
import time

import numpy as np

from ebrl.envs.base import EnvSpec, StepResult
from ebrl.envs.layout import STATES, TASK, ObsField, ObsLayout

#: reset seeds are folded into obs[4] modulo this, which float32 represents exactly
SEED_MOD = 1 << 20


def counting_reward(env_id: int, t: int, a0: float) -> float:
    """The reward of :class:`CountingEnv`: ``1000 * env_id + 10 * t + a0``.

    ``t`` is the step index after the step (1 for the first step of an episode). With small
    integer actions every term is recoverable, so a reward credited to the wrong env, step or
    action is detectable.
    """
    return 1000.0 * env_id + 10.0 * t + float(a0)


class CountingEnv:
    """Deterministic fake env whose observations and rewards encode their origin.

    Observation ``[O]`` float32 (``O = obs_dim >= 4``):
      ``[0]`` env id, ``[1]`` resets so far (1 in the first episode), ``[2]`` step ``t`` within
      the episode, ``[3]`` running sum of ``action[0]`` within the episode,
      ``[4]`` (when ``O >= 5``) the last reset seed modulo :data:`SEED_MOD`; the rest are zero.

    With ``tasks`` > 0, a one-hot of the env's task ``env_id % tasks`` follows (instruction
    ``"count task <i>"``), and with ``camera_size`` = s > 0 an ``s x s x 3`` image whose every
    pixel is ``(16 * env_id + t) % 256``, in ``[0, 1]`` (``/ 255``): the spec's
    :class:`~ebrl.envs.layout.ObsLayout` names the three parts (``states``, ``task``,
    ``main_images``), a VLA-shaped observation whose parts say where they came from.

    Reward :func:`counting_reward` of ``(env_id, t, action[0])``. Actions are not clipped, so any
    value passes through. The episode ends after ``episode_len`` steps as terminated with success;
    with ``max_steps`` below that, it ends after ``max_steps`` steps as truncated without success.

    Args:
        env_id: id encoded in observations and rewards (usually the global env id).
        episode_len: steps per episode; default ``3 + env_id % 4`` so that envs of a group end
            their chunks and episodes at different times.
        obs_dim: observation size (>= 4).
        action_dim: action size (>= 1).
        max_steps: time limit; truncates episodes longer than it (None: no limit).
        delay_s: seconds slept per step, to give schedulers something to overlap.
        delay_jitter_s: plus a uniform random ``[0, delay_jitter_s)`` per step (seeded by the env
            id), for randomized stage timings in scheduler tests.
        fail_after_steps: fail on this step (counted over the env's life), to test failures:
        fail_mode: ``"raise"`` a RuntimeError, or ``"exit"`` the whole process (a dead worker).
        tasks: tasks whose one-hot follows the state (0: none).
        camera_size: side of the image after that (0: none).
    """

    def __init__(
        self,
        env_id: int,
        episode_len: int | None = None,
        obs_dim: int = 4,
        action_dim: int = 2,
        *,
        max_steps: int | None = None,
        delay_s: float = 0.0,
        delay_jitter_s: float = 0.0,
        fail_after_steps: int | None = None,
        fail_mode: str = "raise",
        tasks: int = 0,
        camera_size: int = 0,
    ) -> None:
        if obs_dim < 4 or action_dim < 1:
            raise ValueError("CountingEnv needs obs_dim >= 4 and action_dim >= 1")
        self.env_id = env_id
        self.episode_len = 3 + env_id % 4 if episode_len is None else episode_len
        self.max_steps = max_steps
        self.delay_s = delay_s
        self.delay_jitter_s = delay_jitter_s
        self._jitter = np.random.default_rng(env_id)
        self.fail_after_steps = fail_after_steps
        if fail_mode not in ("raise", "exit"):
            raise ValueError(f"fail_mode={fail_mode!r}: choose 'raise' or 'exit'")
        self.fail_mode = fail_mode
        limit = self.episode_len if max_steps is None else min(self.episode_len, max_steps)
        if tasks < 0 or camera_size < 0:
            raise ValueError("CountingEnv needs tasks >= 0 and camera_size >= 0")
        self.state_dim, self.tasks, self.camera_size = obs_dim, tasks, camera_size
        self.spec = EnvSpec(
            obs_dim=obs_dim + tasks + 3 * camera_size**2,
            action_dim=action_dim,
            max_episode_steps=limit,
            layout=self._layout() if tasks or camera_size else None,
        )
        #: every seed passed to reset, in order (tests check reset-seed streams with it)
        self.seeds: list[int] = []
        self.steps_total = 0
        self._t = 0
        self._sum = 0.0

    def _layout(self) -> ObsLayout:
        at = self.state_dim
        fields = [ObsField(STATES, 0, (at,))]
        if self.tasks:
            fields.append(ObsField(TASK, at, (self.tasks,), "onehot"))
            at += self.tasks
        if self.camera_size:
            fields.append(ObsField("main_images", at, (self.camera_size,) * 2 + (3,), "image"))
        instructions = tuple(f"count task {i}" for i in range(self.tasks))
        return ObsLayout(tuple(fields), instructions)

    def _obs(self) -> np.ndarray:  # -> [O] float32
        o = np.zeros(self.spec.obs_dim, np.float32)
        o[:4] = (self.env_id, len(self.seeds), self._t, self._sum)
        if self.state_dim >= 5 and self.seeds:
            o[4] = self.seeds[-1] % SEED_MOD
        at = self.state_dim
        if self.tasks:
            o[at + self.env_id % self.tasks] = 1.0
            at += self.tasks
        if self.camera_size:
            o[at:] = ((16 * self.env_id + self._t) % 256) / 255.0
        return o

    def reset(self, seed: int) -> np.ndarray:  # -> [O] float32
        """Start a new episode; the seed is recorded and shown in the observation."""
        self.seeds.append(int(seed))
        self._t = 0
        self._sum = 0.0
        return self._obs()

    def step(self, action: np.ndarray) -> StepResult:  # action: [A]
        """Advance one step; stepping past the episode's end is an error (the caller must reset)."""
        if self._t >= self.spec.max_episode_steps:
            raise RuntimeError(f"CountingEnv {self.env_id}: step after the episode ended")
        if self.fail_after_steps is not None and self.steps_total >= self.fail_after_steps:
            if self.fail_mode == "exit":
                os._exit(17)  # a crash: no exception, no cleanup, the process is gone
            raise RuntimeError(f"CountingEnv {self.env_id}: injected failure")
        delay = self.delay_s
        if self.delay_jitter_s > 0:
            delay += float(self._jitter.uniform(0.0, self.delay_jitter_s))
        if delay > 0:
            time.sleep(delay)
        a0 = float(action[0])
        self._t += 1
        self._sum += a0
        self.steps_total += 1
        end = self._t >= self.episode_len
        truncated = not end and self.max_steps is not None and self._t >= self.max_steps
        return StepResult(
            obs=self._obs(),
            reward=counting_reward(self.env_id, self._t, a0),
            terminated=end,
            truncated=truncated,
            success=end,
        )

    def close(self) -> None:
        """Nothing to release."""
