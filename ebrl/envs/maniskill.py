"""ManiSkill3 adapter: one CPU-physics ManiSkill env with flat observations, as an Env.

Each instance is one ManiSkill env (``num_envs=1``, ``sim_backend="physx_cpu"``);
parallelism comes from running many instances (in an :class:`~ebrl.envs.base.EnvGroup`, or in
several processes), not from ManiSkill's GPU batching. ManiSkill is imported inside the
constructor so that ``import ebrl.envs`` never needs it.

Two observations:

- ``camera_size=0`` (the default): ManiSkill's ``obs_mode="state"``, the full flat state
  (privileged object and goal poses included), nothing rendered;
- ``camera_size=s``: what a VLA sees, ManiSkill's ``obs_mode="rgb"``: the robot's state (the
  task's ``agent`` and ``extra`` entries of that mode, flattened in ManiSkill's order: joint
  positions and velocities, the gripper's pose, no object pose) then the task's
  ``base_camera`` rendered at ``s x s`` (``uint8`` RGB, stored as ``v / 255``), declared as
  ``states`` and ``main_images`` (:mod:`ebrl.envs.layout`) with the task's instruction
  (:data:`INSTRUCTIONS`, or the one given). Rendering runs on the CPU's Vulkan (lavapipe): about
  30 steps/s against 800 without a camera.
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
from ebrl.envs.layout import STATES, ObsField, ObsLayout
from ebrl.envs.vulkan import ensure_vulkan

#: tasks known to run on CPU without downloading assets (mani-skill 3.0.1), shown in errors
KNOWN_TASKS = ("PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1", "PullCube-v1")

#: a language instruction for each known task (ManiSkill's tasks have none; a VLA needs one),
#: from each task's success condition
INSTRUCTIONS = {
    "PushCube-v1": "push the cube to the goal region",
    "PickCube-v1": "pick up the cube and move it to the goal position",
    "StackCube-v1": "stack the red cube on the green cube",
    "PegInsertionSide-v1": "insert the peg into the hole in the box",
    "PullCube-v1": "pull the cube to the goal region",
}
#: the task's camera that ``camera_size > 0`` renders (every ManiSkill table-top task has it)
CAMERA = "base_camera"


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
        camera_size: 0 for state observations; else the side of the rendered camera image
            (the robot's state and one camera, see the module).
        instruction: the task's instruction with a camera (default :data:`INSTRUCTIONS`'s).

    Attributes:
        spec: dims and action bounds. ``action_low``/``action_high`` are the min/max over the
            action box; when the box is not the same in every dimension
            (``action_box_uniform`` is False) actions are still clipped per dimension to the real
            box (``action_box_low``/``action_box_high``, shape ``[A]``).

    Raises:
        ValueError: unknown task id (the message lists close matches and known tasks), a
            negative ``camera_size``, or a camera on a task with no instruction known or given.
        RuntimeError: no Vulkan driver, or the task needs assets that are not downloaded.
    """

    def __init__(
        self,
        *,
        task: str = "PushCube-v1",
        control_mode: str = "pd_joint_delta_pos",
        max_episode_steps: int = 50,
        reward_mode: str = "normalized_dense",
        camera_size: int = 0,
        instruction: str = "",
    ) -> None:
        if camera_size < 0:
            raise ValueError(f"simulator.camera_size={camera_size}: must be >= 0 (0: no camera)")
        self.camera_size = int(camera_size)
        self.instruction = instruction or INSTRUCTIONS.get(task, "")
        if self.camera_size and not self.instruction:
            raise ValueError(
                f"ManiSkill task {task!r} has no instruction ebrl knows, and a camera run gives "
                "its VLA one: set simulator.instruction (e.g. simulator.instruction='open the "
                "drawer')"
            )
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
                camera = {"sensor_configs": {"width": camera_size, "height": camera_size}}
                self._env = gym.make(
                    task,
                    num_envs=1,
                    obs_mode="rgb" if camera_size else "state",
                    **(camera if camera_size else {}),
                    control_mode=control_mode,
                    reward_mode=reward_mode,
                    sim_backend="physx_cpu",
                    # "cpu" rather than the default "gpu": same behaviour without a GPU, minus a
                    # warning at every make; render_mode=None: only the sensors are rendered.
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
        if self.camera_size:
            self._state_dim = int(self._state(obs).shape[0])
        first = self._to_obs(obs)
        self.spec = EnvSpec(
            obs_dim=int(first.shape[0]),
            action_dim=int(self.action_box_low.shape[0]),
            max_episode_steps=self.max_episode_steps,
            action_low=float(self.action_box_low.min()),
            action_high=float(self.action_box_high.max()),
            layout=self._layout() if self.camera_size else None,
        )
        self._t = 0

    def _layout(self) -> ObsLayout:
        side = (self.camera_size, self.camera_size, 3)
        fields = (
            ObsField(STATES, 0, (self._state_dim,)),
            ObsField("main_images", self._state_dim, side, "image"),
        )
        return ObsLayout(fields, (self.instruction,))

    @staticmethod
    def _flat(x: Any) -> np.ndarray:  # ManiSkill's batched [1, ...] tensor -> [n] float32
        arr = x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)
        return np.asarray(arr, dtype=np.float32).reshape(-1)

    def _state(self, obs: dict[str, Any]) -> np.ndarray:  # -> [S]: agent, then extra
        parts = [self._flat(v) for key in ("agent", "extra") for v in obs[key].values()]
        return np.concatenate(parts)

    def _to_obs(self, obs: Any) -> np.ndarray:  # -> [O] float32
        # ManiSkill returns batched torch tensors [1, ...] even for one env; copy so later
        # in-place updates inside the simulator can never alias what we handed out.
        if not self.camera_size:
            return np.array(self._flat(obs), dtype=np.float32, copy=True)
        image = self._flat(obs["sensor_data"][CAMERA]["rgb"]) / np.float32(255.0)
        return np.concatenate([self._state(obs), image])

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
