"""ebrl's own scheduler nodes, derived from the scheduler classes (:func:`schema_of`).

Other packages (``baselines/``) register theirs through the ``ebrl.schedulers`` entry-point group
(:mod:`ebrl.config.store`), so this package never imports them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from ebrl.config.derive import schema_of

#: the module the derived nodes live in, as pickles and messages name them (the package, which
#: resolves them by name through its ``__getattr__``)
_MODULE = "ebrl.config"


class BackendKind(StrEnum):
    ray = "ray"
    inprocess = "inprocess"


def _scheduler_schemas() -> list[tuple[str, str, type]]:
    """ebrl's own schedulers' nodes (the schedulers' modules import ebrl.resources, which imports
    this module: they are imported here, on first use, not when this module loads)."""
    from ebrl.schedulers.ebrl import EBRLScheduler
    from ebrl.schedulers.sync import SyncScheduler

    return [
        (
            "scheduler",
            "sync_schema",
            schema_of(SyncScheduler, name="SyncSchedulerNode", module=_MODULE),
        ),
        (
            "scheduler",
            "ebrl_schema",
            schema_of(
                EBRLScheduler,
                "ebrl.schedulers.ebrl.EBRLScheduler",
                name="EBRLSchedulerNode",
                module=_MODULE,
                choices={"backend": BackendKind},
            ),
        ),
    ]


def scheduler_node(name: str) -> Any:
    """``EBRLSchedulerNode``, ``SyncSchedulerNode``: derived on first use (see above); the
    package's ``__getattr__``, so ``ebrl.config.EBRLSchedulerNode`` works as before."""
    for _, _, node in _scheduler_schemas() if name.endswith("SchedulerNode") else ():
        if node.__name__ == name:
            return node
    raise AttributeError(f"module {_MODULE!r} has no attribute {name!r}")
