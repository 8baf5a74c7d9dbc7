"""Unknown keys: a ``+key=value`` the schema lacks, refused with the closest valid key."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from ebrl.config.base import ConfigError
from ebrl.config.store import schemas

#: conf/: each folder is a config group (``scheduler=ebrl``), each yaml file in it an option
_CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


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
