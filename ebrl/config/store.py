"""Registration of the nodes in Hydra's ConfigStore, and the ``ebrl.*`` resolvers the yaml uses."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from ebrl.config.algos import GRPONode, PPONode
from ebrl.config.base import ConfigError
from ebrl.config.help import help_resolver
from ebrl.config.policies import (
    MLPPolicyNode,
    RLinfPolicyNode,
    TransformerPolicyNode,
    VLAPolicyNode,
)
from ebrl.config.resources import GPUNode, LauncherNode, ResourcesNode
from ebrl.config.run import RunConfig
from ebrl.config.schedulers import _scheduler_schemas
from ebrl.config.simulators import CountingSim, LiberoSim, ManiSkillSim, RLinfSim, SyntheticSim

#: the package's logger (ebrl.launch filters its repeated warnings by this name)
log = logging.getLogger("ebrl.config")


#: entry-point group of packages that add config nodes: each entry point names a function
#: ``register(cs: ConfigStore)`` that stores them (e.g. ``baselines.config:register``)
ENTRY_POINTS = "ebrl.schedulers"


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
    ("gpu", "gpu_schema", GPUNode),
    ("resources", "resources_schema", ResourcesNode),
    ("launcher", "launcher_schema", LauncherNode),
    ("policy", "vla_policy_schema", VLAPolicyNode),
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
    OmegaConf.register_new_resolver("ebrl.help", help_resolver, replace=True)


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
