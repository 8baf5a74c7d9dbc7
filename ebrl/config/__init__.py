"""Typed configuration: the schema Hydra composes ``conf/`` against.

Each config group option (``conf/<group>/<name>.yaml``) extends one of the node dataclasses, so a
misspelt key or a value of the wrong type fails at composition with Hydra naming the key; a key
added with ``+`` that the schema lacks (Hydra lets it into any node) is refused by
:func:`validate`, with the closest valid key. Value checks that types cannot express (ranges,
combinations) run in :func:`validate` too, before any work starts. Objects are built from
``_target_`` by ``hydra.utils.instantiate``: adding a simulator, policy, algorithm or scheduler is
a new dataclass + yaml file, never an if/elif. A scheduler's node is derived from its class
(:func:`schema_of`); packages outside ebrl (``baselines/``) register their nodes through the
``ebrl.schedulers`` entry-point group (:func:`register`), so this package imports none of them.

Where each node lives:

- :mod:`~ebrl.config.simulators`, :mod:`~ebrl.config.policies`, :mod:`~ebrl.config.algos`: the
  simulator, policy and algo groups' nodes (with what a simulator gives and a policy reads);
- :mod:`~ebrl.config.schedulers` and :mod:`~ebrl.config.derive`: the scheduler nodes, derived
  from the scheduler classes;
- :mod:`~ebrl.config.resources`: the gpu, resources and launcher groups' nodes and the scale;
- :mod:`~ebrl.config.run`: the run-level nodes (:class:`RunConfig`, budget, tracking, eval, ...);
- :mod:`~ebrl.config.store`: registration in Hydra's ConfigStore and the ``ebrl.*`` resolvers;
- :mod:`~ebrl.config.keys`: unknown keys and their hints;
- :mod:`~ebrl.config.checks`: the checks that span components, and :func:`validate`.
"""

from __future__ import annotations

from typing import Any

from ebrl.config.algos import GRPONode, PPONode
from ebrl.config.base import RLINF_INSTALL, ConfigError, _check, _option
from ebrl.config.checks import (
    _SIM_PACKAGES,
    _need_package,
    check_contract,
    check_hardware_values,
    check_machine,
    check_vectorized,
    validate,
)
from ebrl.config.derive import _DERIVED, _NODE_TYPES, class_of, docstring_args, schema_of
from ebrl.config.keys import (
    _CONF_DIR,
    _FOREIGN_ROOT_KEYS,
    _PLUS_FIX,
    _fields,
    _group_options,
    _option_schema,
    _options_with,
    _unknown_key_hint,
    _unknown_keys,
    check_unknown_keys,
)
from ebrl.config.policies import (
    MLPPolicyNode,
    ModelSize,
    PolicyReads,
    RLinfPolicyNode,
    TransformerPolicyNode,
    VLAPolicyNode,
)
from ebrl.config.resources import (
    AllocatorKind,
    GPUNode,
    GpuSharing,
    LauncherKind,
    LauncherNode,
    ResourcesNode,
    ScaleConfig,
    target_machine,
)
from ebrl.config.run import (
    BudgetConfig,
    CheckpointConfig,
    EvalConfig,
    EvalInitStates,
    InjectConfig,
    RunConfig,
    ThreadsConfig,
    TrackingConfig,
)
from ebrl.config.schedulers import BackendKind, _scheduler_schemas, scheduler_node
from ebrl.config.simulators import (
    _VLA_SIMULATOR,
    CostMode,
    CountingSim,
    LiberoInitStates,
    LiberoObsLayout,
    LiberoObsMode,
    LiberoSim,
    LiberoSuite,
    ManiSkillSim,
    RenderBackend,
    RLinfSim,
    SimGives,
    SyntheticSim,
    check_libero,
    check_maniskill,
)
from ebrl.config.store import (
    _NODES,
    ENTRY_POINTS,
    _checkpoint_dir,
    _entry_points,
    _libero_max_steps,
    _none_if_zero,
    _sbatch_extra,
    register,
    schemas,
)

__all__ = [
    "ENTRY_POINTS",
    "RLINF_INSTALL",
    "_CONF_DIR",
    "_DERIVED",
    "_FOREIGN_ROOT_KEYS",
    "_NODES",
    "_NODE_TYPES",
    "_PLUS_FIX",
    "_SIM_PACKAGES",
    "_VLA_SIMULATOR",
    "AllocatorKind",
    "BackendKind",
    "BudgetConfig",
    "CheckpointConfig",
    "ConfigError",
    "CostMode",
    "CountingSim",
    "EvalConfig",
    "EvalInitStates",
    "GPUNode",
    "GRPONode",
    "GpuSharing",
    "InjectConfig",
    "LauncherKind",
    "LauncherNode",
    "LiberoInitStates",
    "LiberoObsLayout",
    "LiberoObsMode",
    "LiberoSim",
    "LiberoSuite",
    "MLPPolicyNode",
    "ManiSkillSim",
    "ModelSize",
    "PPONode",
    "PolicyReads",
    "RLinfPolicyNode",
    "RLinfSim",
    "RenderBackend",
    "ResourcesNode",
    "RunConfig",
    "ScaleConfig",
    "SimGives",
    "SyntheticSim",
    "ThreadsConfig",
    "TrackingConfig",
    "TransformerPolicyNode",
    "VLAPolicyNode",
    "_check",
    "_checkpoint_dir",
    "_entry_points",
    "_fields",
    "_group_options",
    "_libero_max_steps",
    "_need_package",
    "_none_if_zero",
    "_option",
    "_option_schema",
    "_options_with",
    "_sbatch_extra",
    "_scheduler_schemas",
    "_unknown_key_hint",
    "_unknown_keys",
    "check_contract",
    "check_hardware_values",
    "check_libero",
    "check_machine",
    "check_maniskill",
    "check_unknown_keys",
    "check_vectorized",
    "class_of",
    "docstring_args",
    "register",
    "schema_of",
    "schemas",
    "target_machine",
    "validate",
]


def __getattr__(name: str) -> Any:
    """``EBRLSchedulerNode``, ``SyncSchedulerNode``: derived on first use (the scheduler classes
    import ebrl.resources, which imports this package)."""
    return scheduler_node(name)
