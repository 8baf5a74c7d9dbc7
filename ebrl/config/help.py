"""``python -m ebrl.train --help``: each group's keys, their values and their one-line docs.

A key's doc is read where the node declares it, in whichever of the three ways Python
dataclasses document a field: a derived node's ``metadata["help"]`` (:func:`schema_of`, from
the class's ``Args:``), a ``#:`` comment above the field, or a string right below it
(:class:`ebrl.algos.ppo.PPOConfig`). The help template (``conf/config.yaml``,
``hydra.help.template``) calls :func:`help_text` through the ``ebrl.help`` resolver, on the
config as the command composes it, so ``scheduler=ebrl --help`` shows the EBRL scheduler's keys.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

#: the config groups, in the order the help shows them (then the run-level sections)
GROUPS = ("simulator", "policy", "algo", "scheduler", "gpu", "resources", "launcher")
#: where a key's doc starts, and the help's width
_DOC_COL, _WIDTH = 36, 100


@functools.cache
def _own_docs(cls: type) -> dict[str, str]:
    """The docs of the fields ``cls`` itself declares: ``#:`` comments above, strings below."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):  # no source: a class made at run time (make_dataclass)
        return {}
    body = ast.parse(textwrap.dedent("".join(lines))).body
    if not body or not isinstance(body[0], ast.ClassDef):
        return {}
    out: dict[str, str] = {}
    stmts = body[0].body
    for i, st in enumerate(stmts):
        if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
            continue
        above, n = [], st.lineno - 2  # the line above the field, 0-based
        while n >= 0 and lines[n].strip().startswith("#:"):
            above.insert(0, lines[n].strip()[2:].strip())
            n -= 1
        nxt = stmts[i + 1] if i + 1 < len(stmts) else None
        if above:
            out[st.target.id] = " ".join(above)
        elif (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[st.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return out


def field_docs(cls: type) -> dict[str, str]:
    """The one-line doc of each field of the dataclass ``cls`` ("" where it has none); a
    subclass's doc of a field wins over its bases'."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update({k: v for k, v in _own_docs(klass).items() if v})
    for f in dataclasses.fields(cls):
        docs[f.name] = f.metadata.get("help") or docs.get(f.name, "")
    return {f.name: docs[f.name] for f in dataclasses.fields(cls)}


def _schema(node: Any) -> type | None:
    schema = getattr(getattr(node, "_metadata", None), "object_type", None)
    return schema if isinstance(schema, type) and dataclasses.is_dataclass(schema) else None


def _value(node: DictConfig, key: str) -> str:
    """The value as the yaml has it: an interpolation as written, not resolved."""
    child = node._get_node(key)
    if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
        return str(child._value())  # type: ignore[union-attr]
    value = (
        OmegaConf.to_container(child, resolve=False)
        if isinstance(child, DictConfig | ListConfig)
        else child._value()
    )  # type: ignore[union-attr]
    return str(getattr(value, "value", value))  # an enum: its name


def _line(key: str, value: str, doc: str, indent: int) -> str:
    head = f"{' ' * indent}{key}={value}"
    if not doc:
        return head
    pad = " " * _DOC_COL
    first = head.ljust(_DOC_COL - 1) + " " if len(head) < _DOC_COL - 1 else head + "\n" + pad
    wrapped = textwrap.wrap(doc, _WIDTH - _DOC_COL) or [""]
    return first + f"\n{pad}".join(wrapped)


def describe(node: DictConfig, path: str, indent: int = 2) -> list[str]:
    """One line per key of ``node`` (dotted from ``path``), nested dataclass nodes expanded."""
    schema = _schema(node)
    docs = field_docs(schema) if schema else {}
    out: list[str] = []
    for key in node:
        key = str(key)
        if key == "_target_":
            continue
        child = node._get_node(key)
        dotted = f"{path}.{key}" if path else key
        expand = isinstance(child, DictConfig) and _schema(child) is not None
        if expand and not (child._is_none() or child._is_interpolation() or child._is_missing()):
            out.append(f"{' ' * indent}{dotted}: {docs.get(key, '')}".rstrip(": "))
            out += describe(child, dotted, indent + 2)  # type: ignore[arg-type]
            continue
        out.append(_line(dotted, _value(node, key), docs.get(key, ""), indent))
    return out


def _title(name: str, node: Any, doc: str = "") -> list[str]:
    """``name (Schema): its summary's first sentence``, wrapped."""
    schema = _schema(node)
    summary = doc or " ".join(inspect.cleandoc(getattr(schema, "__doc__", "") or "").split())
    if schema is not None and summary.startswith(f"{schema.__name__}("):  # no docstring
        summary = ""
    summary = summary.split(". ", 1)[0].rstrip(".")
    head = f"{name} ({schema.__name__})" if schema is not None else name
    return textwrap.wrap(f"{head}: {summary}" if summary else head, _WIDTH)


def help_text(root: DictConfig) -> str:
    """Every key of the composed config ``root``, by group, then the run-level ones."""
    out: list[str] = []
    for group in GROUPS:
        node = root._get_node(group) if group in root else None
        if not isinstance(node, DictConfig):
            continue
        keys = describe(node, group) or ["  (no keys)"]
        out += ["", *_title(group, node), *keys]
    run_schema = _schema(root)
    docs = field_docs(run_schema) if run_schema else {}
    plain = [k for k in root if k not in (*GROUPS, "hydra")]
    sections = [k for k in plain if isinstance(root._get_node(k), DictConfig)]
    out += ["", *_title("run", root, "the run's own keys")]
    out += [
        _line(str(k), _value(root, str(k)), docs.get(str(k), ""), 2)
        for k in plain
        if k not in sections
    ]
    for key in sections:
        node = root._get_node(key)
        out += ["", *_title(str(key), node, docs.get(str(key), "")), *describe(node, str(key))]
    return "\n".join(out).strip("\n")


def help_resolver(*, _root_: DictConfig) -> str:
    """``${ebrl.help:}``: :func:`help_text` of the config being composed, with ``$`` escaped
    (Hydra fills the help template with :class:`string.Template`)."""
    try:
        return help_text(_root_).replace("$", "$$")
    except Exception as e:  # the help must not fail on a config the run would refuse later
        return f"(keys not shown: {type(e).__name__}: {e})"
