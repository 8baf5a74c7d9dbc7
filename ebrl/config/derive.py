"""Config nodes derived from a component's own dataclass (:func:`schema_of`).

A scheduler is a dataclass, and its config node is derived from it: its keys, their types,
defaults and help (the class docstring's ``Args:``) and its value checks (its ``__post_init__``)
are declared once, in the class; a field added there is a key of the node.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import MISSING

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
