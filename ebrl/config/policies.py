"""The policy group's nodes (``conf/policy/``), and what a policy reads from its simulator."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from ebrl.config.base import RLINF_INSTALL, _check


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


@dataclass
class RLinfPolicyNode:
    """A model of RLinf's model registry (``ebrl.policies.rlinf_policy``).

    ``conf/policy/rlinf_mlp.yaml`` is RLinf's ``mlp_policy``. Needs RLinf in the interpreter
    (``make test-rlinf`` builds ``.venv-rlinf``).
    """

    _target_: str = "ebrl.policies.rlinf_policy.RLinfPolicy"
    #: the option's name, as messages name it
    name: str = "rlinf"
    #: RLinf's model type (actor.model.model_type)
    model_type: str = MISSING
    #: the rest of RLinf's actor.model node for it (obs/action dims and the chunk come from ebrl)
    model_cfg: dict[str, Any] = field(default_factory=dict)
    #: another get_model (a dotted path; the tests' CPU fake); None: RLinf's
    registry: str | None = None
    #: the package it needs (import name)
    package: str = "rlinf"
    #: how to get ``package`` (in the message that asks for it)
    install: str = RLINF_INSTALL
    #: what it reads from the simulator (check_contract); empty: the flat state
    reads: PolicyReads = field(default_factory=PolicyReads)


@dataclass
class MLPPolicyNode:
    _target_: str = "ebrl.policies.mlp.MLPPolicy"
    #: width of each hidden layer
    hidden: int = 256
    #: hidden layers per network (actor and critic)
    layers: int = 3
    #: initial log standard deviation of every action dimension
    log_std_init: float = -0.5


class ModelSize(StrEnum):
    S = "S"
    M = "M"
    L = "L"


@dataclass
class TransformerPolicyNode:
    _target_: str = "ebrl.policies.transformer.TransformerPolicy"
    #: S, M or L (width, depth, heads: ebrl.policies.transformer.SIZES)
    size: ModelSize = ModelSize.S
    #: initial log standard deviation of every action dimension
    log_std_init: float = -0.5
    #: width of the trunk over the size's (None: the size's)
    d_model: int | None = None
    #: layers of the trunk over the size's (None: the size's)
    layers: int | None = None
    #: attention heads over the size's (None: the size's)
    heads: int | None = None
    #: fp32 or bf16: the dtype of the actor trunk's parameters (the critic stays fp32)
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        _check(self.dtype in ("fp32", "bf16"), f"policy.dtype={self.dtype}: use fp32 or bf16")


@dataclass
class VLAPolicyNode(RLinfPolicyNode):
    """One of the paper's VLAs (``conf/policy/{pi0,pi05,openvla_oft,gr00t,dreamzero}.yaml``),
    built by RLinf's own model code through :class:`~ebrl.policies.rlinf_policy.RLinfPolicy`
    (``model_type`` and ``model_cfg`` as RLinf's configs name them), full size, on GPUs only.

    validate() and the build (``ebrl.external.vla_preflight``) refuse it, naming the fix, without
    a GPU, without its package, or without its checkpoint in a local directory.
    """

    #: the option's name, as messages name it
    name: str = MISSING
    #: what it is, in a line
    description: str = ""
    #: parameters, billions
    params_b: float = MISSING
    #: actions the env executes per policy call (RLinf's num_action_chunks); set chunk_size to it
    action_chunk: int = MISSING
    #: actions per step it outputs
    action_dim: int = 7
    #: camera images' side, pixels (what its checkpoint was trained on)
    image_size: int = 224
    #: runs only on an NVIDIA GPU
    requires_gpu: bool = True
    #: device memory one GPU needs to train it (8-way FSDP, bf16), GiB; an estimate
    min_gpu_memory_gib: float = 24.0
    #: the package its model code needs (import name)
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
