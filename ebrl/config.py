"""Typed configuration: the schema Hydra composes ``conf/`` against.

Each config group option (``conf/<group>/<name>.yaml``) extends one of the node dataclasses below,
so a misspelt key or a value of the wrong type fails at composition with Hydra naming the key; a
key added with ``+`` that the schema lacks (Hydra lets it into any node) is refused by
:func:`validate`, with the closest valid key. Value checks that types cannot express (ranges,
combinations) run in :func:`validate` too, before any work starts. Objects are built from
``_target_`` by ``hydra.utils.instantiate``: adding a simulator, policy, algorithm or scheduler is
a new dataclass + yaml file, never an if/elif. A scheduler's node is derived from its class
(:func:`schema_of`); packages outside ebrl (``baselines/``) register their nodes through the
``ebrl.schedulers`` entry-point group (:func:`register`), so this module imports none of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import inspect
import logging
import re
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from ebrl.algos.grpo import GRPOConfig
from ebrl.algos.ppo import PPOConfig
from ebrl.hardware import MachineFacts, local_machine
from ebrl.runtime.placement import PlacementConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the fix."""


# --- what a policy reads and what a simulator gives (checked by check_contract) ----------------
@dataclass
class PolicyReads:
    """What a policy reads from its simulator, as its checkpoint or its input transforms need it
    (``policy.reads``; RLinf's env-obs keys, :mod:`ebrl.envs.layout`). A field left empty or null
    is not required. :func:`check_contract` holds it against the simulator's
    :class:`SimGives` before any work starts (RLinf's models index these keys at the first
    rollout, and a checkpoint's norm stats fix the state's size)."""

    #: camera images it reads (``main_images``, ``wrist_images``, ...)
    images: list[str] = field(default_factory=list)
    #: the robot state's size its checkpoint was trained on (null: any)
    state_dim: int | None = None
    #: actions it outputs per step (null: the simulator's, whatever it is)
    action_dim: int | None = None
    #: whether it reads each env's instruction (``task_descriptions``)
    instructions: bool = False


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


def check_contract(policy: Any, sim: Any) -> None:
    """Raise ConfigError where the simulator does not give what the policy reads: a camera
    image, the state's size, the action size, the instructions; the message names the key to
    set. A policy node without ``reads`` (ebrl's own policies read the flat vector) and a
    simulator node without ``gives`` pass."""
    reads: PolicyReads | None = getattr(policy, "reads", None)
    gives = getattr(sim, "gives", None)
    if reads is None or gives is None:
        return
    have: SimGives = gives()
    p = f"policy={_option(policy, type(policy).__name__)}"
    s = f"simulator={have.name}"
    missing = [k for k in reads.images if k not in have.images]
    _check(
        not missing,
        f"{p} reads the camera images {missing}, but {s} gives "
        f"{list(have.images) or 'no camera images'} with these settings: "
        + (have.fix_images or f"it cannot give them; use {_VLA_SIMULATOR}"),
    )
    _check(
        reads.state_dim is None or have.state_dim == reads.state_dim,
        f"{p} reads a state of {reads.state_dim} values (its checkpoint's norm stats), but {s} "
        f"gives {have.state}: "
        + (have.fix_state or f"it has no such state layout; use {_VLA_SIMULATOR}"),
    )
    _check(
        reads.action_dim is None or have.action_dim is None or have.action_dim == reads.action_dim,
        f"{p} outputs {reads.action_dim} actions per step, but {s} takes {have.action_dim}: "
        f"use a simulator with {reads.action_dim}-dim actions ({_VLA_SIMULATOR}), or a "
        f"checkpoint of this policy trained on {s}'s actions (policy.reads.action_dim, "
        "policy.model_cfg)",
    )
    _check(
        not reads.instructions or have.instructions,
        f"{p} reads each env's instruction (task_descriptions), but {s} gives none: "
        + (have.fix_images or f"use {_VLA_SIMULATOR}"),
    )


# --- simulators -------------------------------------------------------------------------------
@dataclass
class ManiSkillSim:
    """ManiSkill3 task on CPU physics (needs the ``sim`` extra), state observations or, with
    ``camera_size``, the robot's state and a camera (:class:`ebrl.envs.maniskill.ManiSkillEnv`)."""

    _target_: str = "ebrl.envs.maniskill.ManiSkillEnv"
    task: str = "PushCube-v1"
    control_mode: str = "pd_joint_delta_pos"
    max_episode_steps: int = 50
    reward_mode: str = "normalized_dense"
    #: 0: ManiSkill's full state; s: the robot's state and the task's camera at s x s pixels
    camera_size: int = 0
    #: the task's instruction with a camera ("": ebrl's for the known tasks)
    instruction: str = ""

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


#: how to get RLinf, for the nodes that build through its registries
RLINF_INSTALL = (
    "RLinf runs in its own venv: `make test-rlinf` builds .venv-rlinf (pip install -e "
    "'.[rlinf]'); run ebrl from that interpreter"
)


@dataclass
class RLinfSim:
    """An env of RLinf's env registry, built by RLinf's own class (``ebrl.envs.rlinf_env``).

    ``conf/simulator/rlinf_maniskill.yaml`` is RLinf's ManiSkill env on CPU physics. Needs RLinf
    in the interpreter that runs the env workers (``make test-rlinf`` builds ``.venv-rlinf``).
    """

    _target_: str = "ebrl.envs.rlinf_env.RLinfEnv"
    name: str = "rlinf"
    #: RLinf's env type (env.train.env_type): maniskill, libero, robocasa, ...
    env_type: str = MISSING
    #: RLinf's env config for it (env.train of an RLinf run), as RLinf's class reads it
    env_cfg: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int = 50
    #: the observation entry that is the flat state
    obs_key: str = "states"
    #: the action size, where RLinf's class exposes no action space
    action_dim: int | None = None
    #: the flat state's size, where RLinf's config fixes it (null: known once built)
    state_dim: int | None = None
    action_low: float = -1.0
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
    install: str = RLINF_INSTALL
    #: the simulator RLinf's class wraps (import name; None: none beyond RLinf's own), and how
    #: to install it in the interpreter that runs RLinf
    sim_package: str | None = None
    sim_install: str = ""
    description: str = ""
    task: str = ""
    #: environment variables it needs, and the assets it reads ("{package}": sim_package's
    #: folder), with how to get them
    env_vars: list[str] = field(default_factory=list)
    assets: str | None = None
    assets_install: str = ""
    #: needs a GPU (renderer or GPU physics), and one with RT cores (Isaac Sim)
    requires_gpu: bool = False
    requires_rt_cores: bool = False

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


def check_vectorized(run: Any) -> None:
    """A vectorised simulator steps a worker's envs together: the schedule must hand it
    whole-worker chunks (sync, Colocated, Async; EBRL with one group in lock step)."""
    from ebrl.schedulers.ebrl import EBRLScheduler

    sch = run.scheduler
    name = getattr(class_of(sch), "__name__", "")
    fix = "scheduler.pipeline=false scheduler.step_level=false"
    if class_of(sch) is EBRLScheduler:
        _check(
            sch.pipeline is False and sch.step_level is False,
            f"simulator.vectorized=true steps all of an env worker's envs in one call, so EBRL "
            f"cannot pipeline env groups or step one env at a time: set {fix}",
        )
    _check(
        name != "HybridScheduler",
        "simulator.vectorized=true steps all of an env worker's envs in one call; Hybrid "
        "pipelines two env groups inside each worker: use scheduler=async, colocated or sync, "
        f"or scheduler=ebrl {fix}",
    )


class CostMode(StrEnum):
    burn = "burn"
    sleep = "sleep"


@dataclass
class SyntheticSim:
    """Synthetic point-mass task whose only purpose is a controllable per-step cost."""

    _target_: str = "ebrl.envs.synthetic.SyntheticCostEnv"
    step_cost_ms: float = 1.2
    tail_ratio: float = 1.5
    cost_mode: CostMode = CostMode.burn
    dim: int = 4
    episode_steps_start: int = 50
    episode_steps_end: int = 50
    shrink_episodes: int = 0
    #: injected slowdown: each env's step cost is multiplied by slowdown_factor once it has
    #: taken this many steps (None: never)
    slowdown_after_steps: int | None = None
    slowdown_factor: float = 1.0

    def gives(self) -> SimGives:
        """A point mass's state (3 x dim values), no camera, no instruction."""
        return SimGives(
            name="synthetic", state_dim=3 * self.dim, state=f"a point mass's {3 * self.dim} values"
        )


@dataclass
class CountingSim:
    """Deterministic fake env for tests (``ebrl.envs.fake.CountingEnv``)."""

    _target_: str = "ebrl.envs.fake.CountingEnv"
    episode_len: int | None = None
    max_steps: int | None = None
    obs_dim: int = 4
    action_dim: int = 2
    delay_s: float = 0.0
    delay_jitter_s: float = 0.0
    fail_after_steps: int | None = None
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


# --- policies ---------------------------------------------------------------------------------
@dataclass
class RLinfPolicyNode:
    """A model of RLinf's model registry (``ebrl.policies.rlinf_policy``).

    ``conf/policy/rlinf_mlp.yaml`` is RLinf's ``mlp_policy``. Needs RLinf in the interpreter
    (``make test-rlinf`` builds ``.venv-rlinf``).
    """

    _target_: str = "ebrl.policies.rlinf_policy.RLinfPolicy"
    name: str = "rlinf"
    #: RLinf's model type (actor.model.model_type)
    model_type: str = MISSING
    #: the rest of RLinf's actor.model node for it (obs/action dims and the chunk come from ebrl)
    model_cfg: dict[str, Any] = field(default_factory=dict)
    #: another get_model (a dotted path; the tests' CPU fake); None: RLinf's
    registry: str | None = None
    package: str = "rlinf"
    install: str = RLINF_INSTALL
    #: what it reads from the simulator (check_contract); empty: the flat state
    reads: PolicyReads = field(default_factory=PolicyReads)


@dataclass
class MLPPolicyNode:
    _target_: str = "ebrl.policies.mlp.MLPPolicy"
    hidden: int = 256
    layers: int = 3
    log_std_init: float = -0.5


class ModelSize(StrEnum):
    S = "S"
    M = "M"
    L = "L"


@dataclass
class TransformerPolicyNode:
    _target_: str = "ebrl.policies.transformer.TransformerPolicy"
    size: ModelSize = ModelSize.S
    log_std_init: float = -0.5
    d_model: int | None = None  # width, depth, heads over the size's (TransformerPolicy)
    layers: int | None = None
    heads: int | None = None
    dtype: str = "fp32"  # fp32 | bf16: the actor trunk's parameters


# --- algorithms -------------------------------------------------------------------------------
@dataclass
class PPONode:
    _target_: str = "ebrl.algos.ppo.PPO"
    cfg: PPOConfig = field(default_factory=PPOConfig)


@dataclass
class GRPONode:
    _target_: str = "ebrl.algos.grpo.GRPO"
    cfg: GRPOConfig = field(default_factory=GRPOConfig)


# --- schedulers -------------------------------------------------------------------------------
# A scheduler is a dataclass, and its config node is derived from it (schema_of): its keys, their
# types, defaults and help (the class docstring's ``Args:``) and its value checks (its
# ``__post_init__``) are declared once, in the class; a field added there is a key here. ebrl's
# own schedulers are registered by register(); other packages (baselines/) register theirs through
# the ENTRY_POINTS group, so this module never imports them.
class BackendKind(StrEnum):
    ray = "ray"
    inprocess = "inprocess"


#: entry-point group of packages that add config nodes: each entry point names a function
#: ``register(cs: ConfigStore)`` that stores them (e.g. ``baselines.config:register``)
ENTRY_POINTS = "ebrl.schedulers"
#: types OmegaConf can give a node as they are
_NODE_TYPES: tuple[type, ...] = (int, float, bool, str, bytes, Path, dict, list)
#: schema_of's nodes, so that deriving one twice gives the same class (isinstance, pickling)
_DERIVED: dict[tuple, type] = {}


def _node_type(tp: Any) -> Any:
    """``tp`` as far as OmegaConf can type a node with it: a union other than ``X | None``, a
    tuple, a class it does not know become ``Any`` (the class's own checks still see the value)."""
    if tp is Any or tp in _NODE_TYPES:
        return tp
    if isinstance(tp, type) and (issubclass(tp, Enum) or dataclasses.is_dataclass(tp)):
        return tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _node_type(rest[0]) if len(rest) == 1 else Any
        return Any if inner is Any else typing.Optional[inner]  # noqa: UP045 (a runtime value)
    if origin is dict and len(args) == 2 and args[0] in (str, int):
        return dict[args[0], _node_type(args[1])]  # type: ignore[index]
    if origin is list and len(args) == 1:
        return list[_node_type(args[0])]  # type: ignore[index]
    if origin is typing.Literal and len({type(a) for a in args}) == 1:
        return _node_type(type(args[0]))
    return Any


def _type_hints(cls: type) -> dict[str, Any]:
    """``cls``'s field annotations, resolved; one that cannot be resolved is ``Any``."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # e.g. a name imported only under TYPE_CHECKING: field by field
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            owner = next(
                (k for k in cls.__mro__ if f.name in vars(k).get("__annotations__", {})), cls
            )
            try:
                ns = vars(sys.modules[owner.__module__])
                out[f.name] = eval(f.type, dict(ns)) if isinstance(f.type, str) else f.type
            except Exception:
                out[f.name] = Any
        return out


def docstring_args(cls: type) -> dict[str, str]:
    """Help of each argument, from the ``Args:`` sections of ``cls``'s docstring and its bases'
    (Google style: ``name: text``, continued on deeper-indented lines)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's text wins
        lines = inspect.cleandoc(klass.__dict__.get("__doc__") or "").splitlines()
        at = entry = key = None  # indentation of "Args:", of its entries; the current entry
        for line in lines:
            text, indent = line.strip(), len(line) - len(line.lstrip())
            if at is None:
                at = indent if text == "Args:" else None
                continue
            if not text:
                continue
            if indent <= at:  # the next section
                break
            entry = indent if entry is None else entry
            m = re.match(r"(\w+)(?: \(.*?\))?: ?(.*)", text)
            if indent == entry and m:
                key = m[1]
                out[key] = m[2]
            elif key is not None:
                out[key] = f"{out[key]} {text}".strip()
    return out


def schema_of(
    cls: type,
    target: str | None = None,
    *,
    name: str | None = None,
    module: str | None = None,
    choices: Mapping[str, type[Enum]] | None = None,
    exclude: Collection[str] = (),
) -> type:
    """The config node of the dataclass ``cls``: ``_target_`` and ``cls``'s init fields.

    Each field keeps its type (as far as OmegaConf can check it), default and help (``cls``'s
    docstring, ``Args:``; in the field's ``metadata["help"]``), so a field added to ``cls`` is a
    key of the node without further edits. Built from a config (``validate``), the node builds a
    throwaway ``cls`` from its values, so the class's own checks (``__post_init__``) refuse a bad
    value before any work starts, in the class's words (which name the key).

    Args:
        cls: a dataclass whose init fields are its settings (a scheduler).
        target: the ``_target_`` Hydra instantiates (default: ``cls``'s module and name).
        name: the node's class name (default: ``<cls name>Node``); error messages name it.
        module: the module that holds the node as ``name`` (a pickled config refers to it;
            default: the caller's).
        choices: ``str`` fields with a fixed set of values -> the StrEnum of them: Hydra then
            refuses any other value at composition, listing the choices.
        exclude: fields of ``cls`` that are not keys of this node (they keep ``cls``'s default).
    """
    choices = dict(choices or {})
    name = name or f"{cls.__name__}Node"
    module = module or sys._getframe(1).f_globals.get("__name__", __name__)
    key = (cls, target, name, module, tuple(sorted(choices.items())), tuple(sorted(exclude)))
    if key in _DERIVED:
        return _DERIVED[key]
    hints, helps = _type_hints(cls), docstring_args(cls)
    target = target or f"{cls.__module__}.{cls.__qualname__}"
    spec: list[tuple[str, Any, Any]] = [
        ("_target_", str, field(default=target, metadata={"help": "the class Hydra builds"}))
    ]
    for f in dataclasses.fields(cls):
        if not f.init or f.name in exclude:
            continue
        tp, meta = _node_type(hints.get(f.name, Any)), {"help": helps.get(f.name, "")}
        if f.default is not dataclasses.MISSING:
            default = field(default=f.default, metadata=meta)
        elif f.default_factory is not dataclasses.MISSING:
            default = field(default_factory=f.default_factory, metadata=meta)
        else:  # a required argument: the yaml option must set it
            default = field(default=MISSING, metadata=meta)
        if f.name in choices:
            enum = choices[f.name]
            tp = enum if tp is str else typing.Optional[enum]  # noqa: UP045
            if isinstance(default.default, str) and default.default != MISSING:
                default.default = enum(default.default)
        spec.append((f.name, tp, default))
    unknown = set(choices) - {s[0] for s in spec}
    if unknown:
        raise TypeError(f"schema_of({cls.__name__}): choices for no field: {sorted(unknown)}")
    fields_ = [s[0] for s in spec[1:]]

    def __post_init__(self: Any) -> None:
        cls(**{k: getattr(self, k) for k in fields_})  # the class's checks; the object is dropped

    summary = inspect.cleandoc(cls.__doc__ or cls.__name__).split("\n\n", 1)[0]
    node = dataclasses.make_dataclass(
        name,
        spec,
        namespace={
            "__post_init__": __post_init__,
            "__doc__": f"{summary}\n\nConfig node of :class:`{cls.__module__}.{cls.__qualname__}`"
            " (derived by :func:`ebrl.config.schema_of`).",
            "__ebrl_class__": cls,
        },
    )
    node.__module__, node.__qualname__ = module, name
    _DERIVED[key] = node
    return node


def class_of(node: Any) -> type | None:
    """The class a node from :func:`schema_of` (or an instance of one) describes, else None."""
    return getattr(node if isinstance(node, type) else type(node), "__ebrl_class__", None)


def _scheduler_schemas() -> list[tuple[str, str, type]]:
    """ebrl's own schedulers' nodes (the schedulers' modules import ebrl.resources, which imports
    this module: they are imported here, on first use, not when this module loads)."""
    from ebrl.schedulers.ebrl import EBRLScheduler
    from ebrl.schedulers.sync import SyncScheduler

    return [
        ("scheduler", "sync_schema", schema_of(SyncScheduler, name="SyncSchedulerNode")),
        (
            "scheduler",
            "ebrl_schema",
            schema_of(
                EBRLScheduler,
                "ebrl.schedulers.ebrl.EBRLScheduler",
                name="EBRLSchedulerNode",
                choices={"backend": BackendKind},
            ),
        ),
    ]


def __getattr__(name: str) -> Any:
    """``EBRLSchedulerNode``, ``SyncSchedulerNode``: derived on first use (see above)."""
    for _, _, node in _scheduler_schemas() if name.endswith("SchedulerNode") else ():
        if node.__name__ == name:
            return node
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# === issue 6: hardware, resources, launcher; GPU-cluster policies and simulators ==============
# Nodes of the gpu/, resources/ and launcher/ groups and of the GPU-only policies (pi0, gr00t,
# openvla_oft, dreamzero). check_machine() (called by validate()) refuses, before any work
# starts, a config this machine cannot run (a GPU policy or simulator on CPU, a simulator
# package or its assets missing), and names what to install or change; the machine comes in as data
# (ebrl.hardware.MachineFacts), so the check is pure and tested on made-up machines.
@dataclass
class GPUNode:
    """One accelerator type (``conf/gpu/``): what the resource manager splits, what Slurm gives."""

    #: the group option's name: cpu, h100, a100, h20, rtx4090, h200
    name: str = "cpu"
    #: substring of the CUDA device name that identifies it (None: no GPU)
    device_name: str | None = None
    #: streaming multiprocessors per device: the SM pool that MPS quotas divide
    sm_count: int = 0
    #: device memory, GiB, as the driver reports it (rounded)
    memory_gib: float = 0.0
    #: NVIDIA MPS SM quotas (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) work on it
    mps: bool = False
    #: MIG partitions work on it
    mig: bool = False
    #: RT cores (ray tracing): Isaac Sim based simulators (BEHAVIOR) need them
    rt_cores: bool = False
    #: Slurm node feature that selects it (sbatch --constraint); site-specific
    slurm_constraint: str | None = None
    #: Slurm GRES type (sbatch --gres=gpu:<type>:N); site-specific
    slurm_gres: str | None = None


class AllocatorKind(StrEnum):
    static = "static"
    elastic = "elastic"


@dataclass
class ResourcesNode:
    """How cores, threads and SMs are split between stages (``conf/resources/``). Data only:
    the resource manager (``ebrl/resources/``) reads it."""

    #: pin each stage process to its cores (os.sched_setaffinity), NUMA-local to its GPU
    pin: bool = False
    #: CPU cores of simulation, generation, training (None: the resource manager decides)
    sim_cores: int | None = None
    gen_cores: int | None = None
    train_cores: int | None = None
    #: torch intra-op threads of the generator and the learner (unpinned elastic: their sum is
    #: the thread budget Algorithm 1 splits)
    gen_threads: int = 1
    train_threads: int = 2
    #: generator batch size, M of "first M of N" (None: scheduler.batch_min; elastic: chosen)
    gen_batch: int | None = None
    #: GPU SM quota, percent, of generation and training (an MPS cap; None: the role's GPU
    #: share, scheduler.gen_gpus / learner_gpus; ebrl/resources/sharing.py)
    gen_sm_pct: int | None = None
    train_sm_pct: int | None = None
    #: a GPU stage profile (ebrl.plan.measure --device cuda) from which Algorithm 1 splits the
    #: SMs of a GPU the generator and the learner share, where the quotas are unpinned
    gpu_profile: str | None = None
    #: static: keep the split; elastic: Algorithm 1 re-balances it at run time
    allocator: AllocatorKind = AllocatorKind.static
    #: elastic: re-balance when stage throughputs diverge by more than this fraction ...
    rebalance_threshold: float = 0.15
    #: ... for this many consecutive steps (updates); None: scaled to the run, a tenth of its
    #: updates between 2 and 20 (a 10-update CPU sweep: 2, a run of 200 updates or more: 20)
    rebalance_patience: int | None = None
    #: elastic: a stored profile (ebrl.resources.profiler.Profile JSON, threads) to allocate
    #: from (None: profile the run's policy at start and save it in the run folder)
    profile: str | None = None


class LauncherKind(StrEnum):
    local = "local"
    submitit_local = "submitit_local"
    slurm = "slurm"


@dataclass
class ScaleConfig:
    """The roles a run asks for at scale (issue 16), for the schedulers on EBRL's workers: the
    ``ebrl``, ``hybrid`` and ``async`` scheduler nodes take their role settings from here
    (``conf/scheduler/*.yaml`` interpolate them), so one scale point (``conf/axis/scale/``) sizes
    every scheduler of a sweep alike. ``sync`` and ``colocated`` run every stage in the driver
    process and have no roles (the dry run says so)."""

    #: env worker processes (scheduler.sim_workers)
    sim_workers: int = 2
    #: generator replicas (scheduler.gen_replicas)
    gen_replicas: int = 1
    #: data-parallel learner ranks (scheduler.learner_ranks)
    learner_ranks: int = 1
    #: GPU share per replica (scheduler.gen_gpus; < 1: an MPS quota)
    gen_gpus: float = 0.0
    #: GPU share per learner rank (scheduler.learner_gpus)
    learner_gpus: float = 0.0


@dataclass
class LauncherNode:
    """Where a sweep's jobs run (``conf/launcher/``); its values reach ``hydra.launcher`` (the
    hydra-submitit-launcher keys) by interpolation, so one place holds them."""

    kind: LauncherKind = LauncherKind.local
    #: Slurm partition, account and QoS (site-specific)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    #: wall-clock limit of one job, minutes
    time_min: int = 60
    nodes: int = 1
    tasks_per_node: int = 1
    #: GPUs per node (0: a CPU job)
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem_gb: int | None = None
    #: node feature (sbatch --constraint); launcher=slurm takes it from the gpu group
    constraint: str | None = None
    #: generic resources (sbatch --gres); launcher=slurm_gres builds gpu:<type>:<n> from gpu
    gres: str | None = None
    #: jobs of one array that run at once (sbatch --array=0-N%this)
    array_parallelism: int = 256
    #: a preempted job goes back to the queue (sbatch --requeue) and resumes from its run folder
    requeue: bool = True
    #: resubmissions after a timeout (submitit's max_num_timeout)
    max_requeues: int = 0
    #: seconds between Slurm's warning signal and the kill (time to checkpoint)
    signal_delay_s: int = 120
    #: whole nodes (sbatch --exclusive): throughput is not measured next to other jobs
    exclusive: bool = False
    #: shell lines the sbatch script runs first (module load, source .venv/bin/activate)
    setup: list[str] = field(default_factory=list)
    #: issue 43: let a GPU job through the dry run that leaves GPUs idle or computes on the CPU
    allow_idle_gpus: bool = False


@dataclass
class VLAPolicyNode(RLinfPolicyNode):
    """One of the paper's VLAs (``conf/policy/{pi0,pi05,openvla_oft,gr00t,dreamzero}.yaml``),
    built by RLinf's own model code through :class:`~ebrl.policies.rlinf_policy.RLinfPolicy`
    (``model_type`` and ``model_cfg`` as RLinf's configs name them), full size, on GPUs only.

    validate() and the build (``ebrl.external.vla_preflight``) refuse it, naming the fix, without
    a GPU, without its package, or without its checkpoint in a local directory.
    """

    name: str = MISSING
    description: str = ""
    #: parameters, billions
    params_b: float = MISSING
    #: actions the env executes per policy call (RLinf's num_action_chunks); set chunk_size to it
    action_chunk: int = MISSING
    action_dim: int = 7
    #: camera images' side, pixels (what its checkpoint was trained on)
    image_size: int = 224
    requires_gpu: bool = True
    #: device memory one GPU needs to train it (8-way FSDP, bf16), GiB; an estimate
    min_gpu_memory_gib: float = 24.0
    package: str = MISSING
    #: RLinf's model config file for it (examples/embodiment/config/model/<this>.yaml), which
    #: baselines/rlinf/translate.py names
    rlinf_model: str = ""
    #: the public checkpoint ``model_cfg.model_path`` is downloaded from (a hub id)
    checkpoint: str = MISSING
    #: more ``model_cfg`` directories it reads: key -> hub id (DreamZero's tokenizer)
    more_checkpoints: dict[str, str] = field(default_factory=dict)
    #: why ebrl's learner cannot train it with the RLinf it targets ("" where it can):
    #: validate() refuses the run before any work starts
    untrainable: str = ""


#: packages the CPU simulators need: node type -> (import name, how to install)
_SIM_PACKAGES: dict[type, tuple[str, str]] = {
    ManiSkillSim: ("mani_skill", "pip install -e '.[sim]' (make setup)"),
}


def _option(node: Any, fallback: str) -> str:
    return str(getattr(node, "name", None) or fallback)


def _need_package(
    machine: MachineFacts, group: str, name: str, package: str | None, install: str
) -> str | None:
    """The folder of ``package`` on ``machine`` (None when not checked: no package, or a
    machine whose packages are unknown); ConfigError naming the install when it is missing."""
    if not package or machine.find_package is None:
        return None
    folder = machine.find_package(package)
    _check(
        folder is not None,
        f"{group}={name} needs the Python package '{package}', which {machine.where} cannot "
        f"import: {install or 'install it'}",
    )
    return folder


def check_machine(run: RunConfig, machine: MachineFacts) -> None:
    """Raise ConfigError if ``machine`` cannot run ``run``; the message names the fix.

    Checks the gpu group against the machine's GPUs, GPU-only policies and simulators against the
    gpu group, and simulator packages, environment variables and assets where ``machine`` knows
    them (a field left None is not checked: a cluster node seen from a laptop).
    """
    gpu = run.gpu
    if gpu.device_name is not None:
        _check(
            bool(machine.gpus),
            f"gpu={gpu.name} asks for an NVIDIA {gpu.device_name}, but {machine.where} has no "
            "NVIDIA GPU: use gpu=cpu here, or run it on a GPU node (launcher=slurm; preview the "
            "jobs with `python -m ebrl.launch --dry-run <sweep>`)",
        )
        _check(
            any(gpu.device_name.lower() in g.lower() for g in machine.gpus),
            f"gpu={gpu.name} asks for an NVIDIA {gpu.device_name}, but {machine.where} has "
            f"{machine.gpus[0] if machine.gpus else 'none'}: choose the gpu option that matches "
            "it (conf/gpu/)",
        )
        # scheduler.device=cpu: a dry run of the GPU configuration, the stages on the cores
        _check(
            machine.cuda or getattr(run.scheduler, "device", None) == "cpu",
            f"gpu={gpu.name}: {machine.where} has {machine.gpus[0] if machine.gpus else 'a GPU'} "
            "but torch cannot use it (a CPU build of torch?): install a CUDA build of torch (or "
            "dry-run the GPU configuration on the cores: scheduler.device=cpu, scheduler=ebrl)",
        )
        # sync and Colocated put the policy on the GPU themselves (StageFactory.local_device);
        # the schedulers on EBRL's workers place it by their roles' GPU shares
        shares = [getattr(run.scheduler, f"{role}_gpus", None) for role in ("gen", "learner")]
        if all(share == 0 for share in shares):
            log.warning(
                "gpu=%s, but the scheduler's generator and learner ask for no GPU share "
                "(scale.gen_gpus = scale.learner_gpus = 0): the policy computes on the CPU "
                "cores. Set them (scale.gen_gpus=0.5 scale.learner_gpus=0.5: each half the "
                "SMs), or pick a scale point (+axis/scale=g1)",
                gpu.name,
            )
    asked = {r: getattr(run.scheduler, f"{r}_gpus", 0) or 0 for r in ("gen", "learner")}
    if any(v > 0 for v in asked.values()) and getattr(run.scheduler, "ray_address", "") == "local":
        # the run's own Ray instance has the GPUs NVML shows here: none, so nothing can place
        _check(
            bool(machine.gpus),
            f"scheduler.gen_gpus={asked['gen']:g}, learner_gpus={asked['learner']:g} ask for "
            f"GPU shares, but {machine.where} has no NVIDIA GPU: set scale.gen_gpus=0 "
            "scale.learner_gpus=0 (the roles on the cores), or run on a GPU node",
        )
    for group, node in (("policy", run.policy), ("simulator", run.simulator)):
        name = _option(node, type(node).__name__)
        if getattr(node, "requires_gpu", False):
            _check(
                gpu.device_name is not None,
                f"{group}={name} runs only on an NVIDIA GPU, but gpu=cpu: set gpu=h100 (or a100, "
                "h20, h200) and run it on a GPU node (launcher=slurm); on a CPU machine use "
                "policy=transformer_l (the VLA-shaped stand-in) and simulator=pushcube",
            )
        need_mem = getattr(node, "min_gpu_memory_gib", 0.0)
        _check(
            gpu.device_name is None or need_mem <= gpu.memory_gib,
            f"{group}={name} needs about {need_mem:g} GiB per GPU, gpu={gpu.name} has "
            f"{gpu.memory_gib:g}: choose a larger gpu (h100, a100, h20, h200)",
        )
        if getattr(node, "requires_rt_cores", False) and gpu.device_name is not None:
            _check(
                gpu.rt_cores,
                f"{group}={name} renders with Isaac Sim, which needs a GPU with RT cores; "
                f"gpu={gpu.name} has none: use an RTX-class GPU (gpu=rtx4090, or an L40S/RTX 6000 "
                "node added to conf/gpu/)",
            )
    pol = run.policy
    if isinstance(pol, RLinfPolicyNode):
        _need_package(machine, "policy", pol.name, pol.package, pol.install)
    if isinstance(pol, VLAPolicyNode):
        from ebrl.external import checkpoint_problem

        problem = checkpoint_problem(pol, machine.path_exists, machine.where)
        _check(problem is None, str(problem))
    sim = run.simulator
    package, install = _SIM_PACKAGES.get(type(sim), (getattr(sim, "package", None), ""))
    install = getattr(sim, "install", "") or install
    sim_name = _option(sim, type(sim).__name__)
    folder = _need_package(machine, "simulator", sim_name, package, install)
    if isinstance(sim, RLinfSim) and sim.sim_package:  # RLinf, then the simulator it wraps
        folder = _need_package(machine, "simulator", sim_name, sim.sim_package, sim.sim_install)
    if machine.env is not None:
        for var in getattr(sim, "env_vars", []):
            _check(
                var in machine.env,
                f"simulator={sim_name} needs the environment variable {var}: "
                f"{getattr(sim, 'assets_install', '') or 'set it'}",
            )
    if isinstance(sim, LiberoSim):
        from ebrl.envs.libero import setup_problem

        found = setup_problem(machine.find_package, machine.path_exists, machine.env, machine.where)
        _check(found is None, str(found))
    assets = getattr(sim, "assets", None)
    if assets and machine.path_exists is not None and (folder or "{package}" not in assets):
        path = assets.replace("{package}", folder or "")
        _check(
            machine.path_exists(path),
            f"simulator={sim_name}: its assets are missing ({path} does not exist): "
            f"{getattr(sim, 'assets_install', '') or 'download them'}",
        )
    res = run.resources
    pinned = [c for c in (res.sim_cores, res.gen_cores, res.train_cores) if c is not None]
    _check(
        not res.pin or sum(pinned) <= machine.cpus,
        f"resources: pinning {sum(pinned)} cores (sim/gen/train), but {machine.where} has "
        f"{machine.cpus}: lower resources.sim_cores/gen_cores/train_cores or set "
        "resources.pin=false",
    )


def check_issue6_values(run: RunConfig) -> None:
    """Value checks of the gpu/resources/launcher groups and GPU policies (no machine needed)."""
    res, lau, gpu = run.resources, run.launcher, run.gpu
    if isinstance(run.policy, VLAPolicyNode):
        _check(
            not run.policy.untrainable,
            f"policy={run.policy.name} cannot be trained by ebrl: {run.policy.untrainable}",
        )
        _check(
            run.chunk_size == run.policy.action_chunk,
            f"chunk_size={run.chunk_size}, but policy={run.policy.name} executes "
            f"{run.policy.action_chunk} actions per call: set chunk_size=${{policy.action_chunk}}",
        )
    for key in ("sim_cores", "gen_cores", "train_cores"):
        v = getattr(res, key)
        _check(v is None or v >= 1, f"resources.{key}={v}: must be >= 1 (or null)")
    _check(res.gen_threads >= 1 and res.train_threads >= 1, "resources.*_threads must be >= 1")
    for key in ("gen_sm_pct", "train_sm_pct"):
        v = getattr(res, key)
        _check(v is None or 1 <= v <= 100, f"resources.{key}={v}: must be 1..100 (or null)")
        _check(
            v is None or gpu.device_name is not None,
            f"resources.{key}={v}: an SM share needs a GPU, but gpu=cpu: leave it null",
        )
    _check(0 < res.rebalance_threshold < 1, "resources.rebalance_threshold must be in (0, 1)")
    _check(
        res.rebalance_patience is None or res.rebalance_patience >= 1,
        "resources.rebalance_patience must be >= 1 (or null: scaled to the run)",
    )
    _check(lau.time_min >= 1, f"launcher.time_min={lau.time_min}: must be >= 1 minute")
    _check(lau.nodes >= 1 and lau.tasks_per_node >= 1, "launcher.nodes/tasks_per_node must be >= 1")
    _check(lau.array_parallelism >= 1, "launcher.array_parallelism must be >= 1")
    _check(lau.max_requeues >= 0, "launcher.max_requeues must be >= 0")
    if lau.kind == LauncherKind.slurm:
        if gpu.device_name is None:
            _check(
                lau.gpus_per_node == 0 and not lau.gres,
                f"launcher asks for GPUs (gpus_per_node={lau.gpus_per_node}, gres={lau.gres}) "
                "but gpu=cpu: set a gpu (gpu=h100 ...) or launcher.gpus_per_node=0",
            )
        else:
            _check(
                lau.gpus_per_node >= 1,
                f"gpu={gpu.name} but launcher.gpus_per_node=0: a GPU job needs >= 1 GPU per node",
            )


def target_machine(run: RunConfig) -> MachineFacts:
    """The machine a launcher would give ``run`` (for dry runs): its gpu group's GPUs and CPUs;
    packages, paths and environment unknown (not checked)."""
    gpu, lau = run.gpu, run.launcher
    n = max(1, lau.gpus_per_node) if gpu.device_name else 0
    return MachineFacts(
        where=f"a {lau.kind.value} node with gpu={gpu.name}",
        gpus=(f"NVIDIA {gpu.device_name}",) * n,
        cuda=n > 0,
        cpus=lau.cpus_per_task or 10**6,
    )


_SCHEMAS_ISSUE6: list[tuple[str, str, type]] = [
    ("gpu", "gpu_schema", GPUNode),
    ("resources", "resources_schema", ResourcesNode),
    ("launcher", "launcher_schema", LauncherNode),
    ("policy", "vla_policy_schema", VLAPolicyNode),
]


def _sbatch_extra(requeue: bool, exclusive: bool) -> dict[str, Any]:
    """sbatch flags the hydra-submitit-launcher has no key for (its ``additional_parameters``).

    A flag that is off is left out or negated: sbatch has no ``--requeue=false``.
    """
    extra: dict[str, Any] = {"requeue": True} if requeue else {"no-requeue": True}
    if exclusive:
        extra["exclusive"] = True
    return extra


def _libero_max_steps(suite: Any) -> int:
    """``${ebrl.libero_max_steps:${.task}}``: the LIBERO suite's episode length."""
    from ebrl.envs.libero import max_steps_of

    return max_steps_of(suite)


def _checkpoint_dir(hub_id: str) -> str | None:
    """``${ebrl.checkpoint:<hub id>}``: ``$EBRL_CHECKPOINTS/<the id's last part>``, or None."""
    from ebrl.external import checkpoint_dir

    return checkpoint_dir(hub_id)


def _none_if_zero(value: Any) -> Any:
    """``${ebrl.none_if_zero:${launcher.gpus_per_node}}``: 0 GPUs means no GPU request at all."""
    return None if value == 0 else value


# === end of issue 6 block ======================================================================


# --- run --------------------------------------------------------------------------------------
@dataclass
class BudgetConfig:
    #: stop after training on this many environment steps
    env_steps: int = 200_000
    #: and/or after this many minutes of wall-clock time (None: no limit)
    minutes: float | None = None
    #: and/or after this many updates (None: no limit)
    iterations: int | None = None


@dataclass
class ThreadsConfig:
    #: torch intra-op threads of the generator (1 is best on 2 cores: see notes)
    gen: int = 1
    #: torch intra-op threads of the learner (scheduler=ebrl's shape search: the most each
    #: stage may get, with the static unpinned split)
    train: int = 2


@dataclass
class TrackingConfig:
    #: log to MLflow (params, metrics, artifacts)
    enabled: bool = True
    #: tracking URI; None means the local sqlite store in ``store``
    uri: str | None = None
    #: folder of the local store (``mlflow.db`` + ``mlartifacts/``), relative to the cwd
    store: str = "outputs/mlflow"
    #: MLflow experiment name
    experiment: str = "ebrl"
    #: MLflow run name (None: scheduler-policy-simulator-seed)
    run_name: str | None = None
    #: the sweep's parent run: this run is its child (``mlflow.parentRunId``). ``ebrl.launch``
    #: sets it for every job of a sweep; a run started by hand has none
    parent_run_id: str | None = None
    #: MLflow's system metrics (CPU, memory, disk, network; GPUs through NVML) every
    #: ``system_metrics_interval_s``: ``auto`` logs them where a GPU is visible and not on a
    #: CPU-only machine, where the sampler would take time from a timing run's few cores;
    #: ``true`` / ``false`` force it
    system_metrics: str = "auto"
    system_metrics_interval_s: float = 10.0
    #: sample every CPU core this job may use and every visible GPU (utilisation, SM occupancy
    #: where the driver exposes it, memory) every ``utilisation_interval_s`` into the run
    #: folder's ``utilisation.csv`` (``ebrl.utilisation``; the motivation figure reads it)
    utilisation: bool = False
    utilisation_interval_s: float = 0.2

    def __post_init__(self) -> None:
        # Hydra parses `tracking.system_metrics=true` as a bool, which the str field keeps as
        # "True": every spelling is normalised here, and anything else is refused by name
        mode = str(self.system_metrics).strip().lower()
        if mode not in ("auto", "true", "false"):
            raise ConfigError(
                f"tracking.system_metrics={self.system_metrics!r}: one of auto, true, false"
            )
        self.system_metrics = mode
        for key in ("system_metrics_interval_s", "utilisation_interval_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"tracking.{key}={getattr(self, key)}: must be > 0 seconds")


@dataclass
class CheckpointConfig:
    #: save the learner (weights, optimiser, version) every this many updates (0: never)
    every_iters: int = 1
    #: continue from ``<run_dir>/checkpoint.pt`` and ``progress.json`` when they exist
    #: (a requeued Slurm job re-runs the same command in the same run folder)
    resume: bool = True


@dataclass
class InjectConfig:
    """Synthetic extra load on a stage, for the allocator's slowdown study (off by default).

    The simulator's own slowdown lives in ``simulator=synthetic`` (``slowdown_*``); this one is
    the learner's: a heavier update (as a larger model or longer trajectories would make it), with
    the algorithm and its results unchanged.
    """

    #: from the update that starts at this learner version on, every update also runs
    #: ``train_extra_epochs`` forward-backward passes over its segment (None: never)
    train_after_updates: int | None = None
    #: extra forward-backward passes per update, gradients discarded; they run on the learner's
    #: torch threads, so more threads make them faster, as they do the real update
    train_extra_epochs: int = 0


@dataclass
class EvalConfig:
    #: episodes of the final weights to run after training (0: no evaluation); see ebrl.evaluate
    episodes: int = 0
    #: envs stepped together during evaluation
    num_envs: int = 8
    #: act with the chunk's mean (False: sample, as in training)
    deterministic: bool = True
    #: learning curve: keep the learner's weights every this many updates and, after the run,
    #: evaluate each on ``curve_episodes`` episodes (logged as eval/success_rate at the env step
    #: and wall-clock of that update); 0: no curve
    every_iters: int = 0
    curve_episodes: int = 24
    #: auto: the simulator's fixed initial states where it has them (LIBERO), whatever the run
    #: trained from; fixed: those (an error where there are none); train: the run's own
    init_states: str = "auto"


@dataclass
class RunConfig:
    simulator: Any = MISSING
    policy: Any = MISSING
    algo: Any = MISSING
    scheduler: Any = MISSING
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    inject: InjectConfig = field(default_factory=InjectConfig)
    #: issue 6: accelerator type, stage resource split, where jobs run
    gpu: GPUNode = field(default_factory=GPUNode)
    resources: ResourcesNode = field(default_factory=ResourcesNode)
    launcher: LauncherNode = field(default_factory=LauncherNode)
    #: the roles at scale (replicas, learner ranks, GPU shares) for ebrl / hybrid / async
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    #: issue 43: the node group each role is pinned to (placement.groups.sim: rtx)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    #: which variant of a sweep axis this run is (e.g. ablation/full); a param in MLflow
    variant: str = ""
    #: run seed: policy init, sampling, env reset seeds
    seed: int = 0
    #: environments in total
    num_envs: int = 16
    #: env groups (one simulator worker each); the EBRL scheduler pipelines them
    env_groups: int = 2
    #: K: actions per policy decision (1 = single actions)
    chunk_size: int = 4
    #: env steps per env per iteration; T = rollout_steps // chunk_size decisions
    rollout_steps: int = 50
    #: iterations excluded from steady-state throughput
    warmup_iters: int = 2
    #: show a progress bar
    progress: bool = True
    #: run folder (None: Hydra's output dir, or a fresh folder under outputs/runs)
    run_dir: str | None = None
    #: start the policy from these weights (a behaviour-cloned policy, ``python -m
    #: ebrl.sft.libero clone``, or a run's checkpoint.pt): a fresh run, its version, optimiser
    #: and counters new (``checkpoint.resume`` continues a run instead). None: a fresh policy
    init_checkpoint: str | None = None

    @property
    def decisions_per_env(self) -> int:
        return max(1, self.rollout_steps // self.chunk_size)


#: (group, ConfigStore name, node) of ebrl's own schema nodes but the schedulers' (those are
#: derived from the scheduler classes: _scheduler_schemas)
_NODES: list[tuple[str, str, type]] = [
    ("simulator", "maniskill_schema", ManiSkillSim),
    ("simulator", "synthetic_schema", SyntheticSim),
    ("simulator", "counting_schema", CountingSim),
    ("simulator", "libero_schema", LiberoSim),
    ("simulator", "rlinf_schema", RLinfSim),
    ("policy", "mlp_schema", MLPPolicyNode),
    ("policy", "rlinf_policy_schema", RLinfPolicyNode),
    ("policy", "transformer_schema", TransformerPolicyNode),
    ("algo", "ppo_schema", PPONode),
    ("algo", "grpo_schema", GRPONode),
    *_SCHEMAS_ISSUE6,  # issue 6
]
_warned_no_entry_points = False


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    eps = importlib.metadata.entry_points(group=ENTRY_POINTS)
    return sorted({(ep.name, ep.value): ep for ep in eps}.values(), key=lambda ep: ep.name)


def register() -> None:
    """Register the schema nodes with Hydra's ConfigStore (idempotent): ebrl's own, then those
    of every package with an entry point in the ``ebrl.schedulers`` group (ENTRY_POINTS), which
    is called with the ConfigStore and stores its nodes."""
    global _warned_no_entry_points
    cs = ConfigStore.instance()
    cs.store(name="ebrl_schema", node=RunConfig)
    for group, name, node in [*_NODES, *_scheduler_schemas()]:
        cs.store(group=group, name=name, node=node, provider="ebrl")
    eps = _entry_points()
    for ep in eps:
        try:
            hook = ep.load()
        except Exception as e:  # a broken plugin must not just make its options vanish
            raise ConfigError(
                f"the {ENTRY_POINTS} entry point {ep.name} = {ep.value} cannot be loaded: "
                f"{type(e).__name__}: {e}"
            ) from e
        hook(cs)
    if not eps and not _warned_no_entry_points:
        _warned_no_entry_points = True
        log.warning(
            "no package registers config nodes in the %s entry-point group: the baselines' "
            "scheduler options are missing; reinstall the project (pip install -e .)",
            ENTRY_POINTS,
        )
    OmegaConf.register_new_resolver("ebrl.sbatch_extra", _sbatch_extra, replace=True)
    OmegaConf.register_new_resolver("ebrl.none_if_zero", _none_if_zero, replace=True)
    OmegaConf.register_new_resolver("ebrl.libero_max_steps", _libero_max_steps, replace=True)
    OmegaConf.register_new_resolver("ebrl.checkpoint", _checkpoint_dir, replace=True)


def schemas() -> list[tuple[str, str, type]]:
    """(group, ConfigStore name, node) of every schema node a group option may extend: the
    dataclass nodes in Hydra's ConfigStore (after :func:`register`: ebrl's and the plugins')."""
    out = []
    for group, entries in ConfigStore.instance().repo.items():  # read, not copied (cs.load)
        if group == "hydra" or not isinstance(entries, dict):
            continue
        for entry, item in sorted(entries.items()):
            schema = getattr(getattr(item, "node", None), "_metadata", None)
            schema = getattr(schema, "object_type", None)
            if isinstance(schema, type) and dataclasses.is_dataclass(schema):
                out.append((group, entry.removesuffix(".yaml"), schema))
    return out


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


#: conf/: each folder is a config group (``scheduler=ebrl``), each yaml file in it an option
_CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
#: top-level keys not in RunConfig that are still allowed: Hydra's own node (validated by Hydra)
_FOREIGN_ROOT_KEYS = frozenset({"hydra"})
#: the fix, for every unknown key: a '+key=value' override is the only way one gets in
_PLUS_FIX = "(drop the '+': it adds keys that the schema does not have)"


def _fields(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def _group_options(group: str) -> list[str]:
    """The options of config group ``group`` (its conf/ yaml files), or [] if it is not one."""
    folder = _CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _option_schema(group: str, option: str, depth: int = 0) -> type | None:
    """The schema node ``conf/<group>/<option>.yaml`` extends (through its defaults list)."""
    names = {name: node for g, name, node in schemas() if g == group}
    try:
        defaults = OmegaConf.load(_CONF_DIR / group / f"{option}.yaml").get("defaults", [])
    except Exception:  # not a file, not yaml: no answer, only a shorter message
        return None
    for entry in (e.split("@", 1)[0] for e in defaults if isinstance(e, str)):
        if entry in names:
            return names[entry]
        if depth < 4 and entry in _group_options(group):  # an option extending another
            return _option_schema(group, entry, depth + 1)
    return None


def _options_with(group: str, pick: Callable[[type], bool]) -> list[str]:
    """``group=option`` for each option of ``group`` whose schema node satisfies ``pick``."""
    return [
        f"{group}={o}"
        for o in _group_options(group)
        if (schema := _option_schema(group, o)) is not None and pick(schema)
    ]


def _unknown_keys(node: Any, path: str = "") -> list[tuple[str, str, type]]:
    """(dotted key, parent path, parent's schema) of every key in ``node`` that the dataclass it
    is validated against does not have, recursively.

    A ``+key=value`` override (Hydra's force_add) adds a key to a structured node even where the
    schema has no such field, and ``OmegaConf.to_object`` then sets it as a stray attribute of the
    dataclass instead of refusing it; so the composed tree is compared with the schema here. Only
    nodes typed by a dataclass are checked: free-form nodes (``dict``/``Any`` fields, e.g.
    ``scheduler.resources``, ``scheduler.overrides``) may hold any key, but dataclass-typed nodes
    inside them are checked too. Nothing is resolved (interpolations are left alone).
    """
    if not isinstance(node, DictConfig | ListConfig):
        return []
    if node._is_none() or node._is_missing() or node._is_interpolation():
        return []
    found: list[tuple[str, str, type]] = []
    if isinstance(node, ListConfig):
        for i in range(len(node)):
            found += _unknown_keys(node._get_node(i), f"{path}[{i}]")
        return found
    schema = node._metadata.object_type
    typed = isinstance(schema, type) and dataclasses.is_dataclass(schema)
    fields = _fields(schema) if typed else []
    for key in node:
        dotted = f"{path}.{key}" if path else str(key)
        if not path and key in _FOREIGN_ROOT_KEYS:
            continue
        if typed and key not in fields:
            found.append((dotted, path, schema))
        else:
            found += _unknown_keys(node._get_node(key), dotted)
    return found


def _unknown_key_hint(cfg: DictConfig, dotted: str, parent: str, schema: type) -> str:
    """What to write instead of the unknown key ``dotted``: the closest valid key at its level;
    else, in a group node, the closest key of the group's other options; else the valid keys."""
    key = dotted.rsplit(".", 1)[-1]
    fields = _fields(schema)
    close = difflib.get_close_matches(key, fields, n=1)
    if close and not parent and _group_options(close[0]):  # +schedular=ebrl
        group = close[0]
        value = OmegaConf.select(cfg, dotted, throw_on_resolution_failure=False)
        meant = f"{group}={value}" if isinstance(value, str) else group  # not +schedular.x=1
        return (
            f"did you mean {meant}? ({group} is a config group; its options: "
            f"{', '.join(_group_options(group))})"
        )
    if close:
        return f"did you mean {parent}.{close[0]}?" if parent else f"did you mean {close[0]}?"
    valid = ", ".join(f for f in fields if f != "_target_") or "no keys to set"
    known = schemas()
    if parent not in {group for group, _, _ in known}:  # not a config group typed by schemas
        return f"{parent or 'the top level'} has {valid}"
    # a group node (scheduler=sync): the key may be another option's (scheduler.staleness)
    here = ", ".join(_options_with(parent, lambda s: s is schema)) or parent
    where = f"{schema.__name__} ({here})"
    others = {f for g, _, node in known if g == parent for f in _fields(node)}
    match = difflib.get_close_matches(key, sorted(others - set(fields)), n=1)
    with_it = _options_with(parent, lambda s: bool(match) and match[0] in _fields(s))
    if with_it:
        return (
            f"{where} has no such key; {parent}.{match[0]} is a key of {', '.join(with_it)}: "
            "choose one of those"
        )
    return f"{where} has {valid}"


def check_unknown_keys(cfg: DictConfig) -> None:
    """Raise ConfigError naming every key of ``cfg`` that its schema does not have, with the
    closest valid key at that level and the fix."""
    problems = [
        f"unknown key {dotted}: {_unknown_key_hint(cfg, dotted, parent, schema)}"
        for dotted, parent, schema in _unknown_keys(cfg)
    ]
    if problems:
        raise ConfigError("; ".join(problems) + " " + _PLUS_FIX)


def validate(cfg: DictConfig, machine: MachineFacts | None = None) -> RunConfig:
    """Resolve and check a composed config; returns it as typed objects or raises ConfigError.

    Args:
        cfg: the composed config.
        machine: what the machine that will run it has (default: probe this one); a config
            it cannot run (a GPU policy without a GPU, a missing simulator package) fails here.
    """
    check_unknown_keys(cfg)  # before to_object, which would keep them as stray attributes
    try:
        run: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except Exception as e:  # omegaconf's errors name the key; keep its message
        raise ConfigError(f"invalid configuration: {e}") from e
    _check(run.num_envs >= 1, f"num_envs={run.num_envs}: need at least 1 env")
    _check(
        1 <= run.env_groups <= run.num_envs,
        f"env_groups={run.env_groups}: must be between 1 and num_envs={run.num_envs}",
    )
    _check(run.chunk_size >= 1, f"chunk_size={run.chunk_size}: must be >= 1")
    _check(
        run.rollout_steps >= run.chunk_size,
        f"rollout_steps={run.rollout_steps} < chunk_size={run.chunk_size}: "
        "an iteration needs at least one decision per env",
    )
    _check(run.budget.env_steps > 0, "budget.env_steps must be > 0")
    _check(run.threads.gen >= 1 and run.threads.train >= 1, "threads.gen/train must be >= 1")
    inj = run.inject
    _check(
        inj.train_extra_epochs >= 0
        and (inj.train_after_updates is None or inj.train_after_updates >= 0),
        f"inject.train_extra_epochs={inj.train_extra_epochs} and inject.train_after_updates="
        f"{inj.train_after_updates}: must be >= 0",
    )
    _check(run.warmup_iters >= 0, "warmup_iters must be >= 0")
    _check(
        not run.init_checkpoint or Path(run.init_checkpoint).is_file(),
        f"init_checkpoint={run.init_checkpoint}: no such file; give the path of a behaviour-"
        "cloned policy (python -m ebrl.sft.libero clone) or of a run's checkpoint.pt, or set "
        "init_checkpoint=null to start from a fresh policy",
    )
    _check(
        run.eval.episodes >= 0 and run.eval.num_envs >= 1 and run.eval.every_iters >= 0,
        f"eval.episodes={run.eval.episodes}, eval.num_envs={run.eval.num_envs}, "
        f"eval.every_iters={run.eval.every_iters}: need episodes >= 0, num_envs >= 1 and "
        "every_iters >= 0",
    )
    _check(
        run.eval.every_iters == 0 or run.eval.curve_episodes >= 1,
        f"eval.curve_episodes={run.eval.curve_episodes}: a curve needs at least 1 episode per "
        "point (or set eval.every_iters=0)",
    )
    _check(
        run.eval.episodes == 0 or run.checkpoint.every_iters == 1,
        f"eval.episodes={run.eval.episodes} evaluates the learner's last checkpoint, but "
        f"checkpoint.every_iters={run.checkpoint.every_iters} would leave it behind the final "
        "weights: set checkpoint.every_iters=1 or eval.episodes=0",
    )
    if isinstance(run.algo, GRPONode) and isinstance(run.policy, RLinfPolicyNode):
        _check(
            run.algo.cfg.kl_coef == 0,
            f"algo.cfg.kl_coef={run.algo.cfg.kl_coef} with policy={run.policy.name}: GRPO's KL to "
            "a reference policy needs a Gaussian's loc and scale, and RLinf's models give "
            "log-probs only; set algo.cfg.kl_coef=0",
        )
    if isinstance(run.algo, GRPONode):
        _check(
            run.algo.cfg.group_size >= 2 and run.num_envs % run.algo.cfg.group_size == 0,
            f"algo.cfg.group_size={run.algo.cfg.group_size}: GRPO needs groups of >= 2 envs "
            "that divide "
            f"num_envs={run.num_envs}",
        )
    from ebrl.schedulers.ebrl import EBRLScheduler  # (on first use: see _scheduler_schemas)

    if class_of(run.scheduler) is EBRLScheduler:  # its own checks ran when the node was built
        sch = run.scheduler
        _check(
            1 <= sch.sim_workers <= run.num_envs,
            f"scheduler.sim_workers={sch.sim_workers}: must be between 1 and num_envs",
        )
        _check(sch.batch_timeout_ms >= 0, "scheduler.batch_timeout_ms must be >= 0")
    if isinstance(run.simulator, SyntheticSim):
        _check(run.simulator.step_cost_ms >= 0, "simulator.step_cost_ms must be >= 0")
        _check(run.simulator.tail_ratio >= 1.0, "simulator.tail_ratio (P99/mean) must be >= 1")
    if isinstance(run.simulator, LiberoSim):
        check_libero(run.simulator)
    if isinstance(run.simulator, ManiSkillSim):
        check_maniskill(run.simulator)
    if isinstance(run.simulator, RLinfSim):
        _check(
            run.simulator.max_episode_steps >= 1,
            f"simulator.max_episode_steps={run.simulator.max_episode_steps}: must be >= 1",
        )
        _check(
            run.simulator.step_mode in ("step", "chunk"),
            f"simulator.step_mode={run.simulator.step_mode!r}: choose step or chunk",
        )
        _check(
            run.simulator.step_mode == "step" or run.simulator.vectorized,
            "simulator.step_mode=chunk steps a whole instance with RLinf's chunk_step: set "
            "simulator.vectorized=true too (or step_mode=step)",
        )
        if run.simulator.vectorized:
            check_vectorized(run)
    check_machine(run, machine if machine is not None else local_machine())
    check_issue6_values(run)
    check_contract(run.policy, run.simulator)
    return run
