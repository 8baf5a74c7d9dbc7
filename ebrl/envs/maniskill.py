"""ManiSkill3 adapter: one CPU-physics ManiSkill env with flat state observations, as an Env.

Each instance is one ManiSkill env (``num_envs=1``, ``sim_backend="physx_cpu"``,
``obs_mode="state"``, no rendering); parallelism comes from running many instances (in an
:class:`~ebrl.envs.base.EnvGroup`, or in several processes), not from ManiSkill's GPU batching.
ManiSkill is imported inside the constructor so that ``import ebrl.envs`` never needs it.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from ebrl.envs.base import EnvSpec, StepResult
from ebrl.envs.vulkan import ensure_vulkan

#: tasks known to run on CPU without downloading assets (mani-skill 3.0.1), shown in errors
KNOWN_TASKS = ("PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1", "PullCube-v1")


@contextlib.contextmanager
def _no_stdin() -> Iterator[None]:
    """Replace stdin with an empty stream, so ManiSkill's asset prompt (``input()``) fails at once.

    ManiSkill asks ``(y|n)`` on stdin before downloading missing assets; under a scheduler, a test
    runner or a Ray worker nobody answers and the run would hang. With an empty stream ``input()``
    raises EOFError immediately, which the caller turns into a clear error.
    """
    saved = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = saved


def _assets_error(task: str) -> RuntimeError:
    return RuntimeError(
        f"ManiSkill task {task!r} needs assets that are not downloaded (ManiSkill asked on stdin "
        "whether to download them; ebrl never downloads during a run). Download them once, e.g. "
        f"`python -m mani_skill.utils.download_asset {task} -y` (or the asset id printed above; "
        "MS_ASSET_DIR chooses where they go), then retry; or pick a task that needs no download, "
        f"e.g. {', '.join(KNOWN_TASKS[:3])}."
    )


class ManiSkillEnv:
    """One ManiSkill3 task on CPU physics with flat float32 state observations.

    Args:
        task: ManiSkill env id, e.g. ``"PushCube-v1"`` or ``"PickCube-v1"``.
        control_mode: ManiSkill controller, e.g. ``"pd_joint_delta_pos"`` or ``"pd_ee_delta_pose"``.
        max_episode_steps: time limit; the step reaching it returns ``truncated=True``.
        reward_mode: one of ManiSkill's ``"normalized_dense"``, ``"dense"``, ``"sparse"``,
            ``"none"``.

    Attributes:
        spec: dims and action bounds. ``action_low``/``action_high`` are the min/max over the
            action box; when the box is not the same in every dimension
            (``action_box_uniform`` is False) actions are still clipped per dimension to the real
            box (``action_box_low``/``action_box_high``, shape ``[A]``).

    Raises:
        ValueError: unknown task id (the message lists close matches and known tasks).
        RuntimeError: no Vulkan driver, or the task needs assets that are not downloaded.
    """

    def __init__(
        self,
        *,
        task: str = "PushCube-v1",
        control_mode: str = "pd_joint_delta_pos",
        max_episode_steps: int = 50,
        reward_mode: str = "normalized_dense",
    ) -> None:
        ensure_vulkan()  # must precede the first gym.make: SAPIEN creates a Vulkan device there
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the tasks with gymnasium)
        from mani_skill.utils.registration import REGISTERED_ENVS

        if task not in REGISTERED_ENVS:
            close = difflib.get_close_matches(task, list(REGISTERED_ENVS), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"Unknown ManiSkill task {task!r}.{hint} Known CPU tasks without asset downloads: "
                f"{', '.join(KNOWN_TASKS)} ({len(REGISTERED_ENVS)} tasks registered in all)."
            )
        self.task = task
        self.max_episode_steps = int(max_episode_steps)
        try:
            with _no_stdin():
                self._env = gym.make(
                    task,
                    num_envs=1,
                    obs_mode="state",
                    control_mode=control_mode,
                    reward_mode=reward_mode,
                    sim_backend="physx_cpu",
                    # "cpu" rather than the default "gpu": same behaviour without a GPU, minus a
                    # warning at every make; nothing is rendered with render_mode=None anyway.
                    render_backend="cpu",
                    render_mode=None,
                    max_episode_steps=self.max_episode_steps,
                )
                obs, _ = self._env.reset(seed=0)
        except (EOFError, SystemExit) as e:
            raise _assets_error(task) from e

        box = self._env.unwrapped.single_action_space
        self.action_box_low = np.asarray(box.low, dtype=np.float32)  # [A]
        self.action_box_high = np.asarray(box.high, dtype=np.float32)  # [A]
        self.action_box_uniform = bool(
            np.all(self.action_box_low == self.action_box_low[0])
            and np.all(self.action_box_high == self.action_box_high[0])
        )
        self.spec = EnvSpec(
            obs_dim=int(self._to_obs(obs).shape[0]),
            action_dim=int(self.action_box_low.shape[0]),
            max_episode_steps=self.max_episode_steps,
            action_low=float(self.action_box_low.min()),
            action_high=float(self.action_box_high.max()),
        )
        self._t = 0

    @staticmethod
    def _to_obs(obs: Any) -> np.ndarray:  # -> [O] float32
        # ManiSkill returns a batched torch tensor [1, O] even for one env; copy so later
        # in-place updates inside the simulator can never alias what we handed out.
        arr = obs.cpu().numpy() if hasattr(obs, "cpu") else np.asarray(obs)
        return np.array(arr.reshape(-1), dtype=np.float32, copy=True)

    def reset(self, seed: int) -> np.ndarray:  # -> [O] float32
        """Start a new episode; the same seed gives the same initial state."""
        self._t = 0
        try:
            with _no_stdin():
                obs, _ = self._env.reset(seed=int(seed))
        except (EOFError, SystemExit) as e:
            raise _assets_error(self.task) from e
        return self._to_obs(obs)

    def step(self, action: np.ndarray) -> StepResult:  # action: [A]
        """Apply one action, clipped to the action box."""
        a = np.clip(np.asarray(action, dtype=np.float32), self.action_box_low, self.action_box_high)
        obs, reward, terminated, truncated, info = self._env.step(a)
        self._t += 1
        success = info.get("success", False)
        # ManiSkill's own time limit fires at the same step; ours is the guarantee.
        truncated = bool(np.asarray(truncated).reshape(-1)[0]) or self._t >= self.max_episode_steps
        return StepResult(
            obs=self._to_obs(obs),
            reward=float(np.asarray(reward).reshape(-1)[0]),
            terminated=bool(np.asarray(terminated).reshape(-1)[0]),
            truncated=truncated,
            success=bool(np.asarray(success).reshape(-1)[0]),
        )

    def close(self) -> None:
        """Release the simulator."""
        self._env.close()
