"""What each worker of a run asks of the cluster: its role, GPUs, CPU cores, Ray custom
resources, node group, and for an env worker the generator replica it feeds.

The roles of a run are ``sim`` (env workers), ``gen`` (generator replicas) and ``learner``
(learner ranks), plus ``colocated`` (a rank of RLinf's Colocated mode). Each worker is one
:class:`Ask`; :func:`role_asks` makes a run's asks from its ``scheduler`` config node (what
``GpuFabric.place`` places and the dry run checks), :func:`colocated_asks` those of
``baselines/colocated_ranks.py``. The nodes they may go to are
:mod:`ebrl.runtime.placement_nodes`'s; :func:`ebrl.runtime.placement.place` decides where each
goes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: roles in the order they are placed: learners and generators take GPUs first, sim workers
#: follow the replica they feed
ROLES = ("learner", "gen", "sim", "colocated")
#: how a worker is named in messages and tables; a ``colocated`` rank is one process of RLinf's
#: Colocated mode holding its share of the envs, a generator and a learner rank
#: (``baselines/colocated_ranks.py``)
ROLE_NOUN = {
    "sim": "sim worker",
    "gen": "gen replica",
    "learner": "learner rank",
    "colocated": "Colocated rank",
}
#: Ray resources that are options of their own (``num_cpus``, ``num_gpus``), not ``resources``
BUILTIN = ("CPU", "GPU")


def frozen_amounts(m: Mapping[str, float] | None) -> Mapping[str, float]:
    """A read-only copy of resource amounts (name -> float), for a frozen ask or node."""
    return MappingProxyType({str(k): float(v) for k, v in (m or {}).items()})


@dataclass(frozen=True)
class Ask:
    """What one worker asks for.

    Attributes:
        role: ``sim``, ``gen``, ``learner`` or ``colocated``.
        index: the worker's index within its role (sim worker w, replica r, rank l).
        gpus: whole GPUs (1, 2, ...) or a share of one (0 < gpus < 1); 0: none.
        cpus: cores it needs (Ray counts them only with ``place(..., count_cpus=True)``).
        resources: Ray custom resources (``{"sim_node": 0.1}``); never ``CPU``/``GPU``.
        feeds: for a sim worker, the gen replica it sends to (placed on that replica's node).
        group: the node group it must run on (``placement.groups.<role>``;
            :func:`ebrl.runtime.placement_nodes.in_group`), None: any node.
    """

    role: str
    index: int
    gpus: float = 0.0
    cpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    feeds: int | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", frozen_amounts(self.resources))
        who = self.name
        if self.role not in ROLE_NOUN:
            raise ValueError(f"{who}: role {self.role!r} is not one of {sorted(ROLE_NOUN)}")
        if self.index < 0:
            raise ValueError(f"{who}: index must be >= 0")
        if not (self.gpus >= 0 and math.isfinite(self.gpus)):
            raise ValueError(f"{who} asks {self.gpus} GPUs: must be >= 0")
        if self.gpus > 1 and not float(self.gpus).is_integer():
            raise ValueError(
                f"{who} asks {self.gpus} GPUs: more than one GPU must be a whole number "
                "(a share is below 1)"
            )
        if not (self.cpus >= 0 and math.isfinite(self.cpus)):
            raise ValueError(f"{who} asks {self.cpus} CPUs: must be >= 0")
        for k, v in self.resources.items():
            if k in BUILTIN:
                raise ValueError(
                    f"{who}: resource {k!r} is not a custom resource: ask "
                    f"{'gpus' if k == 'GPU' else 'cpus'}={v} instead"
                )
            if v < 0:
                raise ValueError(f"{who} asks {v} of resource {k!r}: must be >= 0")
        if self.feeds is not None and self.role != "sim":
            raise ValueError(f"{who}: only a sim worker feeds a gen replica")

    def __hash__(self) -> int:
        items = tuple(sorted(self.resources.items()))
        return hash((self.role, self.index, self.gpus, self.cpus, items, self.feeds, self.group))

    @property
    def name(self) -> str:
        """``learner rank 1``, ``gen replica 0``, ``sim worker 3``."""
        return f"{ROLE_NOUN.get(self.role, self.role)} {self.index}"

    @property
    def mps_percent(self) -> int | None:
        """The MPS SM quota of a share below one GPU (``round(100 * gpus)``); None otherwise."""
        if 0 < self.gpus < 1:
            return max(1, min(99, round(100 * self.gpus)))
        return None


def role_asks(
    sched: Mapping[str, Any],
    groups: Mapping[str, str | None] | None = None,
) -> list[Ask]:
    """Every worker's ask for a scheduler on EBRL's workers, from its config node (the run's
    ``scheduler``: ``sim_workers``, ``gen_replicas``, ``learner_ranks``, ``gen_gpus``,
    ``learner_gpus``, ``resources``) and ``placement.groups``: what ``GpuFabric.place``
    places and the dry run checks. Env worker w feeds replica ``replica_of[w]`` (contiguous
    blocks, ``Roles.replica_of``)."""
    from ebrl.resources.model.rules import replica_blocks

    res = sched.get("resources") or {}
    groups = groups or {}
    workers, replicas = int(sched["sim_workers"]), int(sched["gen_replicas"])
    replica_of = replica_blocks(workers, replicas)
    asks = [
        Ask("sim", w, resources=res.get("sim") or {}, feeds=replica_of[w], group=groups.get("sim"))
        for w in range(workers)
    ]
    asks += [
        Ask("gen", r, gpus=float(sched["gen_gpus"] or 0), resources=res.get("gen") or {},
            group=groups.get("gen"))
        for r in range(replicas)
    ]  # fmt: skip
    asks += [
        Ask("learner", i, gpus=float(sched["learner_gpus"] or 0),
            resources=res.get("learner") or {}, group=groups.get("learner"))
        for i in range(int(sched["learner_ranks"]))
    ]  # fmt: skip
    return asks


def colocated_asks(ranks: int, gpus: float, group: str | None = None) -> list[Ask]:
    """The asks of RLinf's Colocated mode over ``ranks`` processes: one per rank, each with
    ``gpus`` (a whole GPU on a GPU run, 0 on the cores), on node group ``group``
    (``placement.groups.colocated``). What ``baselines/colocated_ranks.py`` places and the dry
    run checks; placed in rank order, one node filled before the next (rank i on GPU i)."""
    return [Ask("colocated", i, gpus=float(gpus), group=group) for i in range(int(ranks))]
