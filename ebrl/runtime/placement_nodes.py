"""The cluster as placement sees it: its alive Ray nodes (:class:`Node`, read from Ray by
:func:`cluster_nodes`, or the nodes a Slurm job of a given shape would start, :func:`fake_cluster`)
and the node groups a role may be pinned to (``placement.groups.<role>``: :class:`NodeGroups`,
:func:`in_group`).

A node group is a custom resource the group's nodes declare (``ray start --resources
'{"rtx": 1}'``; a Slurm task's ``slurm_task_<i>``) or a Ray label. The workers' asks are
:mod:`ebrl.runtime.placement_asks`'s; :mod:`ebrl.runtime.placement` places them on these nodes
and refuses a group no node is in (``check_groups``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ebrl.runtime.placement_asks import frozen_amounts

#: resources every Ray node reports of itself (not a group a user declares)
_RAY_OWN = ("node:", "memory", "object_store_memory", "accelerator_type:")


@dataclass(frozen=True)
class Node:
    """One alive Ray node.

    Attributes:
        node_id: Ray's hex node id.
        address: its IP (``NodeManagerAddress``).
        cpus: logical CPUs Ray gives it.
        gpus: GPUs Ray gives it (declared: a test cluster may declare GPUs it has not).
        resources: every other Ray resource of the node (custom ones, ``node:<ip>``, memory).
        head: the head node.
        labels: the node's Ray labels (``ray start --labels``; Ray's own ``ray.io/...`` too).
    """

    node_id: str
    address: str
    cpus: float
    gpus: float
    resources: Mapping[str, float] = field(default_factory=dict)
    head: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", frozen_amounts(self.resources))
        object.__setattr__(
            self, "labels", MappingProxyType({str(k): str(v) for k, v in self.labels.items()})
        )

    @property
    def tags(self) -> str:
        """Its custom resources and its labels, as an error shows them (``rtx=4, zone=b``)."""
        own = [
            f"{k}={v:g}" for k, v in sorted(self.resources.items()) if not k.startswith(_RAY_OWN)
        ]
        own += [f"{k}={v}" for k, v in sorted(self.labels.items()) if not k.startswith("ray.io/")]
        return ", ".join(own) or "none"

    def __hash__(self) -> int:
        return hash((self.node_id, self.address, self.cpus, self.gpus, self.head))

    @property
    def short(self) -> str:
        """``10.0.0.3/1a2b3c4d``: address and the start of the id (several nodes may share an
        address on one machine)."""
        return f"{self.address}/{self.node_id[:8]}"


# --- the cluster ------------------------------------------------------------------------------
def cluster_nodes(raw: Sequence[Mapping[str, Any]] | None = None) -> list[Node]:
    """The alive nodes of the cluster this process is connected to (head first, then by
    address and id).

    Args:
        raw: entries like ``ray.nodes()`` gives (None: ask Ray; Ray must be initialized).
    """
    if raw is None:
        import ray

        raw = ray.nodes()
    out = []
    for n in raw:
        if not n.get("Alive", False):
            continue
        res = {str(k): float(v) for k, v in (n.get("Resources") or {}).items()}
        out.append(
            Node(
                node_id=str(n["NodeID"]),
                address=str(n.get("NodeManagerAddress", "")),
                cpus=res.pop("CPU", 0.0),
                gpus=res.pop("GPU", 0.0),
                resources=res,
                head="node:__internal_head__" in res,
                labels={str(k): str(v) for k, v in (n.get("Labels") or {}).items()},
            )
        )
    out.sort(key=lambda x: (not x.head, x.address, x.node_id))
    return out


def fake_cluster(
    nodes: int,
    gpus_per_node: float,
    cpus_per_node: float,
    groups: Mapping[int, Mapping[str, float]] | None = None,
) -> list[Node]:
    """The nodes a Ray cluster of that shape reports (``ray.nodes()``'s entries, read by
    :func:`cluster_nodes`): what a Slurm job of ``nodes`` tasks starts
    (``ebrl.runtime.slurm_cluster``: node i has the resource ``slurm_task_<i>``), for the dry
    run and the tests.

    Args:
        groups: node index -> more custom resources it declares (a node group's name).
    """
    raw = []
    for i in range(nodes):
        addr = f"10.0.0.{i + 1}"
        res = {"CPU": float(cpus_per_node), f"node:{addr}": 1.0, f"slurm_task_{i}": 1.0}
        if gpus_per_node:
            res["GPU"] = float(gpus_per_node)
        if i == 0:
            res["node:__internal_head__"] = 1.0
        res.update((groups or {}).get(i, {}))
        raw.append(
            {"NodeID": f"{i + 1:02x}" * 28, "NodeManagerAddress": addr, "Alive": True,
             "Resources": res}
        )  # fmt: skip
    return cluster_nodes(raw)


# --- node groups ------------------------------------------------------------------------------
@dataclass
class NodeGroups:
    """The node group each role is pinned to (None: any node): a custom resource the group's
    nodes declare (``ray start --resources '{"rtx": 1}'``; a Slurm task's ``slurm_task_<i>``),
    or a Ray label (the key ``rtx``, or ``key=value``) where the cluster's Ray sets labels."""

    #: the env workers' node group (None: any node)
    sim: str | None = None
    #: the generator replicas' node group (None: any node)
    gen: str | None = None
    #: the learner ranks' node group (None: any node)
    learner: str | None = None
    #: the ranks of scheduler=colocated over several GPUs (None: any node)
    colocated: str | None = None


@dataclass
class PlacementConfig:
    """The ``placement`` config node: ``placement.groups.sim=rtx`` pins the env workers to the
    nodes of group ``rtx`` (:class:`NodeGroups`, :func:`in_group`); checked against the
    cluster before any worker starts (:func:`ebrl.runtime.placement.check_groups`)."""

    #: the node group of each role (placement.groups.sim=rtx)
    groups: NodeGroups = field(default_factory=NodeGroups)


def placement_groups(cfg: Mapping[str, Any]) -> dict[str, str]:
    """A run config's ``placement.groups`` (role -> node group); {} where it has none."""
    node = cfg.get("placement") or {}
    return {str(k): str(v) for k, v in (node.get("groups") or {}).items() if v}


def in_group(node: Node, group: str) -> bool:
    """Whether ``node`` is in node group ``group``: it declares a custom resource of that name
    (more than 0), or a label of that key, or, for ``key=value``, that label."""
    if node.resources.get(group, 0.0) > 0 or group in node.labels:
        return True
    key, eq, value = group.partition("=")
    return bool(eq) and node.labels.get(key) == value
