"""The simulator group's nodes (``conf/simulator/``), each with what it gives a policy
(``gives()``, held against the policy's ``reads`` by :func:`ebrl.config.checks.check_contract`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from ebrl.config.base import RLINF_INSTALL, ConfigError, _check


@dataclass(frozen=True)
class SimGives:
    """What a simulator node gives a policy, per its settings (each simulator node's ``gives``).

    Attributes:
        name: the simulator, as messages name it (``simulator=<name>``).
        images: the camera images it gives, by RLinf's keys.
        state_dim: the state's size; None where it depends on the task (known once built).
        state: what the state is, for messages.
        action_dim: the actions it takes per step; None where its build decides.
        instructions: whether it gives each env's instruction.
        fix_images, fix_state: what to set to give the images a policy reads, or the state
            layout a checkpoint reads ("" where no setting of this simulator does).
    """

    name: str = "?"
    images: tuple[str, ...] = ()
    state_dim: int | None = None
    state: str = "its flat state"
    action_dim: int | None = None
    instructions: bool = False
    fix_images: str = ""
    fix_state: str = ""


#: what to use where a simulator cannot give a VLA what it reads
_VLA_SIMULATOR = "simulator=libero simulator.obs_mode=state_rgb simulator.obs_layout=rlinf"


@dataclass
class ManiSkillSim:
    """ManiSkill3 task on CPU physics (needs the ``sim`` extra), state observations or, with
    ``camera_size``, the robot's state and a camera (:class:`ebrl.envs.maniskill.ManiSkillEnv`)."""

    _target_: str = "ebrl.envs.maniskill.ManiSkillEnv"
    #: the ManiSkill3 task id (PushCube-v1, PickCube-v1, ...)
    task: str = "PushCube-v1"
    #: ManiSkill's controller (pd_joint_delta_pos, pd_ee_delta_pose, ...)
    control_mode: str = "pd_joint_delta_pos"
    #: time limit; the step reaching it truncates the episode
    max_episode_steps: int = 50
    #: ManiSkill's reward: normalized_dense, dense or sparse
    reward_mode: str = "normalized_dense"
    #: 0: ManiSkill's full state; s: the robot's state and the task's camera at s x s pixels
    camera_size: int = 0
    #: the task's instruction with a camera ("": ebrl's for the known tasks)
    instruction: str = ""

    def __post_init__(self) -> None:
        check_maniskill(self)

    def gives(self) -> SimGives:
        """With a camera, the robot's state (its size by robot) and ``main_images``, with the
        instruction; else ManiSkill's full state."""
        if self.camera_size:
            return SimGives(
                name=self.task,
                images=("main_images",),
                state="the robot's state (its size by robot)",
                instructions=True,
            )
        return SimGives(
            name=self.task,
            state="ManiSkill's full state (its size by task)",
            fix_images="set simulator.camera_size (e.g. 64) for its camera",
        )


class LiberoSuite(StrEnum):
    libero_spatial = "libero_spatial"
    libero_object = "libero_object"
    libero_goal = "libero_goal"
    libero_10 = "libero_10"
    libero_90 = "libero_90"


class LiberoObsMode(StrEnum):
    state = "state"
    state_rgb = "state_rgb"


class LiberoObsLayout(StrEnum):
    ebrl = "ebrl"
    rlinf = "rlinf"


class LiberoInitStates(StrEnum):
    suite = "suite"
    sampled = "sampled"


class RenderBackend(StrEnum):
    egl = "egl"
    osmesa = "osmesa"


@dataclass
class LiberoSim:
    """A LIBERO task on CPU physics (robosuite 1.4 + MuJoCo; ``make setup-libero``).

    ``conf/simulator/libero.yaml``; the adapter is :class:`ebrl.envs.libero.LiberoEnv`.
    """

    _target_: str = "ebrl.envs.libero.LiberoEnv"
    #: the suite (LIBERO's name for it)
    task: LiberoSuite = LiberoSuite.libero_spatial
    #: a task's index in the suite, or "all": env i runs task i mod n_tasks
    task_id: str = "all"
    #: state, or state_rgb: the state then the agentview and wrist cameras, flattened
    obs_mode: LiberoObsMode = LiberoObsMode.state
    #: height and width of each camera image (state_rgb), pixels
    camera_size: int = 128
    #: ebrl: the state is the proprioception and every object's pose, the cameras upright;
    #: rlinf: RLinf's LIBERO observation, what its LIBERO checkpoints were trained on: the
    #: 8-value state (end effector position, axis-angle, gripper) and the cameras rotated 180
    #: degrees (ebrl.envs.libero)
    obs_layout: LiberoObsLayout = LiberoObsLayout.ebrl
    #: time limit; the yaml sets the suite's (ebrl.libero_max_steps)
    max_episode_steps: int = 220
    #: suite: the suite's fixed initial states, picked by the reset seed; sampled: LIBERO's
    #: placement sampler, seeded by the reset seed
    init_states: LiberoInitStates = LiberoInitStates.suite
    #: offscreen renderer of the cameras: egl (Mesa llvmpipe on CPU) or osmesa
    render_backend: RenderBackend = RenderBackend.egl

    def __post_init__(self) -> None:
        check_libero(self)

    def gives(self) -> SimGives:
        """Per ``obs_mode`` and ``obs_layout`` (the adapter's own declaration, ebrl.envs.libero)."""
        from ebrl.envs import libero

        rlinf = self.obs_layout == LiberoObsLayout.rlinf
        return SimGives(
            name="libero",
            images=libero.CAMERA_FIELDS if self.obs_mode == LiberoObsMode.state_rgb else (),
            state_dim=libero.RLINF_STATE_DIM if rlinf else None,
            state=libero.STATE_TEXT[self.obs_layout.value],
            action_dim=libero.ACTION_DIM,
            instructions=True,
            fix_images="set simulator.obs_mode=state_rgb (its agentview and wrist cameras)",
            fix_state=f"set simulator.obs_layout=rlinf ({libero.STATE_TEXT['rlinf']})",
        )


def check_libero(sim: LiberoSim) -> None:
    """Value checks of ``simulator=libero`` that types cannot express (task id range, sizes)."""
    from ebrl.envs.libero import suite_info, task_index

    n = suite_info(sim.task).n_tasks
    try:
        task_index(sim.task_id, 0, n)
    except ValueError as e:
        raise ConfigError(f"{e} (simulator.task={sim.task.value} has {n} tasks)") from None
    _check(
        sim.max_episode_steps >= 1,
        f"simulator.max_episode_steps={sim.max_episode_steps}: must be >= 1",
    )
    _check(
        sim.obs_mode != LiberoObsMode.state_rgb or 8 <= sim.camera_size <= 1024,
        f"simulator.camera_size={sim.camera_size}: cameras need 8..1024 pixels a side",
    )


def check_maniskill(sim: ManiSkillSim) -> None:
    """Value checks of a ManiSkill simulator node (camera size, the instruction a camera needs)."""
    from ebrl.envs.maniskill import INSTRUCTIONS

    _check(
        sim.camera_size == 0 or 8 <= sim.camera_size <= 1024,
        f"simulator.camera_size={sim.camera_size}: 0 (state observations) or 8..1024 pixels a side",
    )
    _check(
        sim.camera_size == 0 or bool(sim.instruction) or sim.task in INSTRUCTIONS,
        f"simulator.task={sim.task} with a camera needs an instruction for its VLA, and ebrl "
        f"knows instructions only for {', '.join(INSTRUCTIONS)}: set simulator.instruction",
    )


@dataclass
class RLinfSim:
    """An env of RLinf's env registry, built by RLinf's own class (``ebrl.envs.rlinf_env``).

    ``conf/simulator/rlinf_maniskill.yaml`` is RLinf's ManiSkill env on CPU physics. Needs RLinf
    in the interpreter that runs the env workers (``make test-rlinf`` builds ``.venv-rlinf``).
    """

    _target_: str = "ebrl.envs.rlinf_env.RLinfEnv"
    #: the option's name, as messages name it
    name: str = "rlinf"
    #: RLinf's env type (env.train.env_type): maniskill, libero, robocasa, ...
    env_type: str = MISSING
    #: RLinf's env config for it (env.train of an RLinf run), as RLinf's class reads it
    env_cfg: dict[str, Any] = field(default_factory=dict)
    #: time limit of an episode, env steps
    max_episode_steps: int = 50
    #: the observation entry that is the flat state
    obs_key: str = "states"
    #: the action size, where RLinf's class exposes no action space
    action_dim: int | None = None
    #: the flat state's size, where RLinf's config fixes it (null: known once built)
    state_dim: int | None = None
    #: the action box's lower bound (actions are clipped to it)
    action_low: float = -1.0
    #: the action box's upper bound
    action_high: float = 1.0
    #: another get_env_cls (a dotted path; the tests' CPU fake); None: RLinf's
    registry: str | None = None
    #: one RLinf instance steps all of an env worker's envs together (RLinf's GPU ManiSkill,
    #: BEHAVIOR): whole-worker chunks only, so no env-group pipelining and no step level
    vectorized: bool = False
    #: how a vectorised instance steps: ``step`` (one action at a time) or ``chunk`` (RLinf's
    #: chunk_step: episodes end at chunk boundaries; BEHAVIOR has nothing else)
    step_mode: str = "step"
    #: the package it needs (import name), and how to get it
    package: str = "rlinf"
    #: how to get ``package`` (in the message that asks for it)
    install: str = RLINF_INSTALL
    #: the simulator RLinf's class wraps (import name; None: none beyond RLinf's own), and how
    #: to install it in the interpreter that runs RLinf
    sim_package: str | None = None
    #: how to install ``sim_package``
    sim_install: str = ""
    #: what it is, in a line
    description: str = ""
    #: its task, as the run's summary names it
    task: str = ""
    #: environment variables it needs, and the assets it reads ("{package}": sim_package's
    #: folder), with how to get them
    env_vars: list[str] = field(default_factory=list)
    #: a path its assets must be at (None: none)
    assets: str | None = None
    #: how to get the environment variables and the assets
    assets_install: str = ""
    #: needs a GPU (renderer or GPU physics), and one with RT cores (Isaac Sim)
    requires_gpu: bool = False
    #: needs a GPU with RT cores (Isaac Sim)
    requires_rt_cores: bool = False

    def __post_init__(self) -> None:
        _check(
            self.max_episode_steps >= 1,
            f"simulator.max_episode_steps={self.max_episode_steps}: must be >= 1",
        )
        _check(
            self.step_mode in ("step", "chunk"),
            f"simulator.step_mode={self.step_mode!r}: choose step or chunk",
        )
        _check(
            self.step_mode == "step" or self.vectorized,
            "simulator.step_mode=chunk steps a whole instance with RLinf's chunk_step: set "
            "simulator.vectorized=true too (or step_mode=step)",
        )

    def gives(self) -> SimGives:
        """The flat state (``obs_key``) only: ebrl's adapter of RLinf's envs
        (ebrl.envs.rlinf_env) drops the cameras and the instructions RLinf's class returns."""
        size = f"{self.state_dim} values" if self.state_dim else "its size by task"
        return SimGives(
            name=self.name,
            state_dim=self.state_dim,
            state=f"RLinf's {self.obs_key!r} ({size})",
            action_dim=self.action_dim,
            fix_images=(
                "ebrl's adapter of RLinf's envs (ebrl.envs.rlinf_env) passes the flat state "
                f"only; use {_VLA_SIMULATOR}"
            ),
        )


class CostMode(StrEnum):
    burn = "burn"
    sleep = "sleep"


@dataclass
class SyntheticSim:
    """Synthetic point-mass task whose only purpose is a controllable per-step cost."""

    _target_: str = "ebrl.envs.synthetic.SyntheticCostEnv"
    #: mean wall-clock milliseconds per step
    step_cost_ms: float = 1.2
    #: P99 / mean of the step cost (1.5 was measured for ManiSkill on CPU)
    tail_ratio: float = 1.5
    #: burn: busy-wait on a CPU core; sleep: sleep
    cost_mode: CostMode = CostMode.burn
    #: dimensions of the point mass (the state is 3 x dim values)
    dim: int = 4
    #: episode length at episode 0
    episode_steps_start: int = 50
    #: episode length after shrink_episodes episodes
    episode_steps_end: int = 50
    #: episodes over which the length moves from start to end (0: no shrink)
    shrink_episodes: int = 0
    #: injected slowdown: each env's step cost is multiplied by slowdown_factor once it has
    #: taken this many steps (None: never)
    slowdown_after_steps: int | None = None
    #: multiplier on the step cost once slowdown_after_steps is reached
    slowdown_factor: float = 1.0

    def __post_init__(self) -> None:
        _check(self.step_cost_ms >= 0, "simulator.step_cost_ms must be >= 0")
        _check(self.tail_ratio >= 1.0, "simulator.tail_ratio (P99/mean) must be >= 1")

    def gives(self) -> SimGives:
        """A point mass's state (3 x dim values), no camera, no instruction."""
        return SimGives(
            name="synthetic", state_dim=3 * self.dim, state=f"a point mass's {3 * self.dim} values"
        )


@dataclass
class CountingSim:
    """Deterministic fake env for tests (``ebrl.envs.fake.CountingEnv``)."""

    _target_: str = "ebrl.envs.fake.CountingEnv"
    #: steps per episode (None: 3 + env id % 4, so envs end at different times)
    episode_len: int | None = None
    #: time limit; truncates longer episodes (None: no limit)
    max_steps: int | None = None
    #: observation size (>= 4)
    obs_dim: int = 4
    #: action size (>= 1)
    action_dim: int = 2
    #: seconds slept per step, to give schedulers something to overlap
    delay_s: float = 0.0
    #: plus a seeded uniform [0, delay_jitter_s) per step
    delay_jitter_s: float = 0.0
    #: fail on this step of the env's life, to test failures (None: never)
    fail_after_steps: int | None = None
    #: raise: a RuntimeError; exit: the whole process (a dead worker)
    fail_mode: str = "raise"
    #: a task one-hot over this many tasks after the state (0: none)
    tasks: int = 0
    #: a camera_size x camera_size x 3 image after that (0: none)
    camera_size: int = 0

    def gives(self) -> SimGives:
        """Its state (obs_dim values), ``main_images`` with a camera, instructions with tasks."""
        return SimGives(
            name="counting",
            images=("main_images",) if self.camera_size else (),
            state_dim=self.obs_dim,
            state=f"{self.obs_dim} values",
            action_dim=self.action_dim,
            instructions=self.tasks > 0,
            fix_images="set simulator.camera_size (and simulator.tasks for instructions)",
            fix_state="set simulator.obs_dim",
        )
