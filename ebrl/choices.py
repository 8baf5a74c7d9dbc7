"""The config options a run was composed from, as users type them (``scheduler=ebrl``).

MLflow tags, run names and summaries name a run's scheduler, policy, simulator and GPU by their
config group options (``conf/<group>/<option>.yaml``), so a filter like ``tags.scheduler =
'ebrl'`` finds what ``scheduler=ebrl`` ran. Under Hydra (``python -m ebrl.train``, every sweep
job) the options are Hydra's runtime choices. A config composed outside a Hydra app (tests,
notebooks: ``hydra.compose``) has no record of them, so each group's option is recovered from
its node: the options whose schema is the node's type, narrowed to those whose own literal
values the node holds (``policy.size: L`` tells ``transformer_l`` from ``transformer_m``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ebrl.config import _CONF_DIR, _group_options, _option_schema

#: the groups a run is named by
GROUPS = ("scheduler", "policy", "simulator", "gpu", "algo")
#: the first line of an option that writes into the root (``conf/scheduler/async.yaml``)
_GLOBAL = "# @package _global_"


def hydra_choices() -> dict[str, str]:
    """Hydra's runtime choices (group -> option) of the running app; empty outside one."""
    try:
        from hydra.core.hydra_config import HydraConfig

        choices = HydraConfig.get().runtime.choices
    except ValueError:  # not under a Hydra app
        return {}
    return {str(k): str(v) for k, v in choices.items() if v is not None}


def _own_values(group: str, option: str) -> dict[str, Any] | None:
    """The scalar values ``conf/<group>/<option>.yaml`` sets itself (no interpolations, no
    nested nodes, not its defaults list); None when the file cannot be read."""
    path = _CONF_DIR / group / f"{option}.yaml"
    try:
        text = Path(path).read_text()
        node = OmegaConf.load(path)
    except Exception:  # unreadable: the option cannot be matched by value
        return None
    if text.lstrip().startswith(_GLOBAL):  # its group's keys sit under the group's name
        node = node.get(group) or OmegaConf.create({})
    out: dict[str, Any] = {}
    for key in node:
        if key == "defaults" or OmegaConf.is_interpolation(node, key):
            continue
        value = node[key]
        if not OmegaConf.is_config(value):
            out[str(key)] = value
    return out


def option_of(group: str, node: Any) -> str | None:
    """The option of ``group`` a composed node came from, or None when no single one fits.

    Args:
        group: a config group (``scheduler``, ``policy``...).
        node: the composed node (``cfg.policy``).
    """
    if not isinstance(node, DictConfig):
        return None
    schema = OmegaConf.get_type(node)
    candidates = [o for o in _group_options(group) if _option_schema(group, o) is schema]
    scored: list[tuple[int, str]] = []
    for option in candidates:
        own = _own_values(group, option)
        if own is None:
            continue
        if all(str(node.get(k)) == str(v) for k, v in own.items()):
            scored.append((len(own), option))
    if not scored:
        return None
    scored.sort(reverse=True)
    # the option that explains most of the node; two that explain it equally: no answer
    if len(scored) > 1 and scored[0][0] == scored[1][0]:
        return None
    return scored[0][1]


def class_name(node: Any) -> str:
    """A component's class name (``EBRLScheduler``): its ``_target_``'s last part."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    return str(target or type(node).__name__).rsplit(".", 1)[-1]


def run_choices(cfg: DictConfig) -> dict[str, str]:
    """group -> option for each of :data:`GROUPS`: Hydra's choices under Hydra, else recovered
    from the nodes; a group whose option cannot be told is named by its class (or, for the GPU,
    its ``name``)."""
    hydra = hydra_choices()
    out: dict[str, str] = {}
    for group in GROUPS:
        node = cfg.get(group)
        chosen = hydra.get(group) or option_of(group, node)
        if chosen is None and group == "gpu" and isinstance(node, DictConfig):
            chosen = str(node.get("name") or "")
        out[group] = chosen or class_name(node)
    return out
