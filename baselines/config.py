"""The baselines' config nodes, derived from their scheduler classes and registered with Hydra.

ebrl finds :func:`register` through the ``ebrl.schedulers`` entry-point group (``pyproject.toml``,
``[project.entry-points."ebrl.schedulers"]``): ``ebrl.config.register`` calls it with Hydra's
ConfigStore, and ``ebrl.config`` itself never imports this package. Each node is
:func:`ebrl.config.schema_of` of its class: the class's fields, defaults, docstring help and
``__post_init__`` checks are the node's (``validate`` reports them by name, before any work starts).

- ``colocated_schema``, ``hybrid_schema``, ``async_schema``: the replicas of RLinf's modes on
  ebrl's own stages and workers (``baselines/{colocated,hybrid,async_ppo}.py``);
- ``rlinf_schema``, ``rlinf_async_schema``: real RLinf (``baselines/rlinf/launch.py``); their
  check refuses, in ``validate``, a machine that cannot run it (``require_rlinf``).
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from baselines.async_ppo import AsyncScheduler
from baselines.colocated import ColocatedScheduler
from baselines.hybrid import HybridScheduler
from baselines.rlinf.launch import RLinfScheduler
from ebrl.config import BackendKind, schema_of

ColocatedSchedulerNode = schema_of(ColocatedScheduler, name="ColocatedSchedulerNode")
HybridSchedulerNode = schema_of(
    HybridScheduler, name="HybridSchedulerNode", choices={"backend": BackendKind}
)
AsyncSchedulerNode = schema_of(
    AsyncScheduler, name="AsyncSchedulerNode", choices={"backend": BackendKind}
)
#: colocated and hybrid: no staleness (only RLinf's async runner has a threshold)
RLinfLaunchNode = schema_of(RLinfScheduler, name="RLinfLaunchNode", exclude=("staleness",))
RLinfAsyncNode = schema_of(RLinfScheduler, name="RLinfAsyncNode")

#: (ConfigStore name in the scheduler group, node); conf/scheduler/<option>.yaml extend them
NODES: list[tuple[str, type]] = [
    ("colocated_schema", ColocatedSchedulerNode),
    ("hybrid_schema", HybridSchedulerNode),
    ("async_schema", AsyncSchedulerNode),
    ("rlinf_schema", RLinfLaunchNode),
    ("rlinf_async_schema", RLinfAsyncNode),
]


def register(cs: ConfigStore) -> None:
    """Store the baselines' nodes in ``cs`` (the ``ebrl.schedulers`` entry point)."""
    for name, node in NODES:
        cs.store(group="scheduler", name=name, node=node, provider="baselines")
