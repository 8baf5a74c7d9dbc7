"""Which Ray node each worker of a run goes to: stages ask, :func:`place` decides, Ray obeys.

The roles of a run are ``sim`` (env workers), ``gen`` (generator replicas) and ``learner``
(learner ranks). Each worker is one :class:`Ask`: a GPU count or share, CPU cores, Ray custom
resources (``scheduler.resources``), and for a sim worker the generator replica it ``feeds``.

:func:`place` is a pure function of the asks and the cluster's :class:`Node` s (unit-tested
without Ray):

* GPU asks go to nodes with GPUs; a whole ask (1, 2, ...) takes whole free GPUs. A share goes
  first to a GPU that holds no worker of its role, so each learner rank owns its GPU (NCCL
  needs one device per rank) and each GPU gets one replica; only when every GPU holds one are
  shares packed, never past a node's GPU count. Learner ranks fill a node's GPUs before the
  next node's (a data-parallel group prefers one node), generator replicas are spread (round
  robin weighted by capacity).
* A role pinned to a node group (``placement.groups.<role>``: a custom resource or label the
  group's nodes declare) goes only to those nodes; a group no node is in is refused before
  anything is placed (:func:`check_groups`).
* A sim worker that ``feeds`` a replica goes to that replica's node (its actions and
  observations stay node-local) when that node can take its ask; otherwise (its custom
  resources are elsewhere, the node is full), and for sims that feed none, it is spread round
  robin (weighted by CPUs) and the placement says why (``local=False``, ``note``).
* Custom resources are respected like Ray does: a node must have what the worker asks, less
  what earlier workers took.
* CPU cores are Ray's to count only when asked (``count_cpus=True``): by default the engine's
  resource manager pins cores itself and Ray gets ``num_cpus=0``.

When an ask cannot be met, :class:`PlacementError` names the worker, its ask and what the nodes
have. :func:`ray_options` turns a placement into Ray actor options (a hard node affinity, the GPU
share, the MPS SM quota as ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for shares below one GPU), for
``RayBackend.spawn(..., options=...)``; :func:`describe` prints the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
#: resources every Ray node reports of itself (not a group a user declares)
_RAY_OWN = ("node:", "memory", "object_store_memory", "accelerator_type:")
_EPS = 1e-9


class PlacementError(ValueError):
    """An ask no node of the cluster can meet."""


def _frozen(m: Mapping[str, float] | None) -> Mapping[str, float]:
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
        group: the node group it must run on (``placement.groups.<role>``; :func:`in_group`),
            None: any node.
    """

    role: str
    index: int
    gpus: float = 0.0
    cpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    feeds: int | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", _frozen(self.resources))
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
        object.__setattr__(self, "resources", _frozen(self.resources))
        object.__setattr__(
            self, "labels", MappingProxyType({str(k): str(v) for k, v in self.labels.items()})
        )

    @property
    def tags(self) -> str:
        """Its custom resources and its labels, as an error shows them (``rtx=4, zone=b``)."""
        own = [
            f"{k}={_fmt_num(v)}"
            for k, v in sorted(self.resources.items())
            if not k.startswith(_RAY_OWN)
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


@dataclass(frozen=True)
class Placement:
    """Where one worker runs.

    Attributes:
        ask: the worker's ask.
        node: the node it runs on.
        gpu_slots: the node-local GPU indices the plan counted it on (a hint for reading the
            plan: Ray assigns the GPU ids itself, ``ray.get_gpu_ids()`` in the actor, packing
            shares onto a GPU in the order the actors are created).
        num_cpus: the CPUs Ray accounts for it (0 unless placed with ``count_cpus=True``).
        local: for a sim worker that feeds a replica, whether it is on the replica's node
            (False: that node could not take its ask); None otherwise.
        note: why it is not where it was preferred ("" when it is).
    """

    ask: Ask
    node: Node
    gpu_slots: tuple[int, ...] = ()
    num_cpus: float = 0.0
    local: bool | None = None
    note: str = ""

    @property
    def role(self) -> str:
        return self.ask.role

    @property
    def index(self) -> int:
        return self.ask.index


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
    cluster before any worker starts (:func:`check_groups`)."""

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


def check_groups(groups: Mapping[str, str | None], nodes: Sequence[Node]) -> None:
    """Refuse, before any worker starts, a role pinned to a node group no node is in.

    Raises:
        PlacementError: naming the role's key, the group, and every node seen with its custom
            resources and labels.
    """
    for role, group in groups.items():
        if role not in ROLE_NOUN:
            raise PlacementError(
                f"placement.groups.{role}: {role!r} is not a role; one of {sorted(ROLE_NOUN)}"
            )
        if group is None or any(in_group(n, group) for n in nodes):
            continue
        seen = "; ".join(f"{n.short}{' (head)' if n.head else ''}: {n.tags}" for n in nodes)
        raise PlacementError(
            f"placement.groups.{role}={group}: no node of the cluster is in node group "
            f"{group!r} (a custom resource or a label of that name); nodes seen ({len(nodes)}): "
            f"{seen or 'none'}. Start the group's nodes with `ray start --resources "
            f"'{{\"{group}\": 1}}'` (or --labels {group}=1), or unset placement.groups.{role}"
        )


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


# --- placing ----------------------------------------------------------------------------------
class _Free:
    """What is left of one node while placing."""

    def __init__(self, node: Node) -> None:
        self.node = node
        whole = int(node.gpus + _EPS)
        self.gpu = [1.0] * whole
        if node.gpus - whole > _EPS:  # a declared fraction of a GPU
            self.gpu.append(node.gpus - whole)
        #: per GPU slot, how many workers of each role it holds
        self.on_gpu: list[dict[str, int]] = [{} for _ in self.gpu]
        self.cpus = node.cpus
        self.res = dict(node.resources)
        self.count: dict[str, int] = {}

    def gpu_fit(self, gpus: float, role: str = "") -> tuple[int, ...] | None:
        """The GPU slots an ask of ``gpus`` would take, or None. A share goes to the first GPU
        that holds no worker of its role yet (so each learner rank owns its GPU, and each GPU
        gets one replica), else to the first GPU it fits (packed)."""
        if gpus <= 0:
            return ()
        if gpus < 1:
            fit = [i for i, f in enumerate(self.gpu) if f + _EPS >= gpus]
            alone = [i for i in fit if not self.on_gpu[i].get(role)]
            return ((alone or fit)[0],) if fit else None
        free = [i for i, f in enumerate(self.gpu) if f >= 1 - _EPS]
        n = int(gpus)
        return tuple(free[:n]) if len(free) >= n else None

    def alone(self, ask: Ask) -> bool:
        """Whether a GPU with no worker of ``ask``'s role can take its share."""
        return any(
            f + _EPS >= ask.gpus and not self.on_gpu[i].get(ask.role)
            for i, f in enumerate(self.gpu)
        )

    def fits(self, ask: Ask, count_cpus: bool) -> tuple[int, ...] | None:
        if ask.group is not None and not in_group(self.node, ask.group):
            return None
        if count_cpus and self.cpus + _EPS < ask.cpus:
            return None
        for k, v in ask.resources.items():
            if self.res.get(k, 0.0) + _EPS < v:
                return None
        return self.gpu_fit(ask.gpus, ask.role)

    def take(self, ask: Ask, slots: tuple[int, ...], count_cpus: bool) -> None:
        share = ask.gpus if ask.gpus < 1 else 1.0
        for i in slots:
            self.gpu[i] = max(0.0, self.gpu[i] - share)
            self.on_gpu[i][ask.role] = self.on_gpu[i].get(ask.role, 0) + 1
        if count_cpus:
            self.cpus -= ask.cpus
        for k, v in ask.resources.items():
            self.res[k] = self.res.get(k, 0.0) - v
        self.count[ask.role] = self.count.get(ask.role, 0) + 1

    def free_gpus(self) -> float:
        return sum(self.gpu)


def place(
    asks: Sequence[Ask],
    nodes: Sequence[Node],
    *,
    count_cpus: bool = False,
    gpu_setting: Mapping[str, str] | None = None,
) -> list[Placement]:
    """Decide the node of every ask; returns the placements in the order of ``asks``.

    Args:
        asks: one per worker; (role, index) unique; a sim's ``feeds`` names a gen replica
            among the asks.
        nodes: the cluster (:func:`cluster_nodes`); their order breaks ties.
        count_cpus: Ray accounts for the asks' CPUs (``num_cpus``) and a node's CPUs bound
            what it takes; default: Ray gets ``num_cpus=0`` (the resource manager pins cores).
        gpu_setting: per role, the setting that sets its GPU ask, for the refusal message
            (default ``<role>.gpus``).

    Raises:
        PlacementError: an ask that no node can meet (naming the worker, its ask and what
            the nodes have), a duplicate worker, or a ``feeds`` without its replica.
    """
    if not nodes:
        raise PlacementError("no alive Ray node to place workers on")
    check_groups({a.role: a.group for a in asks if a.group is not None}, nodes)
    seen: set[tuple[str, int]] = set()
    for a in asks:
        if (a.role, a.index) in seen:
            raise PlacementError(f"{a.name} is asked for twice")
        seen.add((a.role, a.index))
    gens = {a.index for a in asks if a.role == "gen"}
    for a in asks:
        if a.feeds is not None and a.feeds not in gens:
            raise PlacementError(
                f"{a.name} feeds gen replica {a.feeds}, but the replicas are {sorted(gens)}"
            )

    free = [_Free(n) for n in nodes]
    where: dict[tuple[str, int], Placement] = {}
    order = sorted(asks, key=lambda a: (ROLES.index(a.role), a.index))
    for a in order:
        home = local = None
        note = ""
        if a.feeds is not None:
            home = next(f for f in free if f.node is where["gen", a.feeds].node)
            slots = home.fits(a, count_cpus)
            local = slots is not None
        if local:
            chosen = home
        else:
            fit = [(f, s) for f in free if (s := f.fits(a, count_cpus)) is not None]
            if not fit:
                raise PlacementError(_refusal(a, free, count_cpus, gpu_setting))
            chosen, slots = min(fit, key=lambda fs: _load(a, fs[0], free))
            if home is not None:  # an explicit ask (custom resources, GPUs) beats locality
                why = (
                    f"which is not in its node group {a.group}"
                    if a.group is not None and not in_group(home.node, a.group)
                    else f"which cannot also take {_fmt_ask(a, count_cpus)} (it has "
                    f"{_fmt_free(home, a, count_cpus)})"
                )
                note = (
                    f"{a.name} feeds gen replica {a.feeds} on node {home.node.short}, {why}: "
                    f"placed on {chosen.node.short}, its traffic crosses nodes"
                )
        chosen.take(a, slots, count_cpus)
        where[a.role, a.index] = Placement(
            a, chosen.node, slots, float(a.cpus) if count_cpus else 0.0, local, note
        )
    return [where[a.role, a.index] for a in asks]


def _load(a: Ask, f: _Free, free: list[_Free]) -> tuple[float, ...]:
    """Sort key among the nodes that fit ``a``: smallest first. A GPU share first goes to a
    node with a GPU that holds none of its role (one learner rank, one replica per GPU)."""
    rank = free.index(f)
    shared = float(0 < a.gpus < 1 and not f.alone(a))
    if a.role in ("learner", "colocated"):  # fill one node before the next, one rank per GPU
        return (shared, rank)
    weight = f.node.gpus if a.gpus > 0 else f.node.cpus
    # round robin weighted by capacity: the node with the fewest of this role per unit
    # (a node with twice the GPUs gets twice the replicas); ties: more free GPUs, node order
    return (shared, (f.count.get(a.role, 0) + 1) / max(weight, 1e-6), -f.free_gpus(), rank)


def _fmt_num(x: float) -> str:
    return f"{x:g}"


def _fmt_ask(a: Ask, count_cpus: bool) -> str:
    parts = []
    if a.gpus > 0:
        parts.append(f"{_fmt_num(a.gpus)} GPU" + ("" if a.gpus <= 1 else "s"))
    if count_cpus and a.cpus > 0:
        parts.append(f"{_fmt_num(a.cpus)} CPUs")
    parts += [f"{_fmt_num(v)} {k}" for k, v in sorted(a.resources.items())]
    if a.group is not None:
        parts.append(f"a node of group {a.group}")
    return ", ".join(parts) or "nothing"


def _fmt_free(f: _Free, a: Ask, count_cpus: bool) -> str:
    parts = []
    if a.gpus > 0:
        best = max(f.gpu, default=0.0)
        parts.append(
            f"{_fmt_num(f.free_gpus())} of {_fmt_num(f.node.gpus)} GPUs free"
            + (f" (at most {_fmt_num(best)} on one GPU)" if 0 < a.gpus < 1 and f.gpu else "")
        )
    if count_cpus and a.cpus > 0:
        parts.append(f"{_fmt_num(f.cpus)} of {_fmt_num(f.node.cpus)} CPUs free")
    for k in sorted(a.resources):
        parts.append(f"{_fmt_num(f.res.get(k, 0.0))} {k} free")
    return ", ".join(parts) or "nothing free"


def _refusal(
    a: Ask, free: list[_Free], count_cpus: bool, gpu_setting: Mapping[str, str] | None
) -> str:
    ask = _fmt_ask(a, count_cpus)
    if a.group is not None:
        free = [f for f in free if in_group(f.node, a.group)]
        if not free:  # check_groups refuses this before any worker is placed
            return f"{a.name} is pinned to node group {a.group!r}, which no node is in"
    total = sum(f.node.gpus for f in free)
    if a.gpus > 0 and total == 0:
        key = (gpu_setting or {}).get(a.role, f"{a.role}.gpus")
        return (
            f"{a.name} asks {ask}; nodes have 0 GPUs ({len(free)} node(s): "
            f"{', '.join(f.node.short for f in free)}): run on a GPU node or set {key}=0"
        )
    if a.gpus > 1 and all(f.node.gpus < a.gpus for f in free):
        key = (gpu_setting or {}).get(a.role, f"{a.role}.gpus")
        most = max(f.node.gpus for f in free)
        return (
            f"{a.name} asks {ask}; the largest node has {_fmt_num(most)} GPUs (a worker's "
            f"GPUs are on one node): set {key} to at most {_fmt_num(most)}"
        )
    have = "; ".join(f"{f.node.short}: {_fmt_free(f, a, count_cpus)}" for f in free)
    return (
        f"{a.name} asks {ask}; no node has that left after the workers placed before it "
        f"(learners, then gen replicas, then sim workers): {have}. Ask less per worker, fewer "
        "workers, or add nodes"
    )


# --- Ray --------------------------------------------------------------------------------------
#: Ray's switch that leaves ``CUDA_VISIBLE_DEVICES`` of an actor's process to the process
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
#: the node-local GPU slots a GPU role was planned on (:func:`ray_options`)
SLOTS_VAR = "EBRL_GPU_SLOTS"


def pin_planned_gpus(environ: Any = None) -> str | None:
    """In a GPU role's process, before CUDA starts: make its planned GPU slots (``EBRL_GPU_SLOTS``,
    set by :func:`ray_options`) its ``CUDA_VISIBLE_DEVICES``. Slot ``i`` is the ``i``-th device
    the node was started with (the ``CUDA_VISIBLE_DEVICES`` the process inherits from its Ray
    node, e.g. a Slurm job's GPUs), or device ``i`` where the node names none.

    Returns:
        the devices it set; None where no slots were planned (a worker without a GPU, a run
        without Ray).

    Raises:
        RuntimeError: a planned slot the node has no device for.
    """
    import os

    env = os.environ if environ is None else environ
    slots = env.get(SLOTS_VAR)
    if not slots:
        return None
    node = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    chosen = []
    for s in slots.split(","):
        i = int(s)
        if node and i >= len(node):
            raise RuntimeError(
                f"this worker was planned on GPU slot {i}, but its Ray node was started with "
                f"CUDA_VISIBLE_DEVICES={','.join(node)} ({len(node)} GPU(s)): start the node "
                "with --num-gpus matching the devices it sees"
            )
        chosen.append(node[i] if node else str(i))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    return env["CUDA_VISIBLE_DEVICES"]


def ray_options(
    p: Placement,
    *,
    mps: bool = True,
    mps_pipe: str | Path | None = None,
    sm_pct: int | None = None,
) -> dict[str, Any]:
    """Ray actor options for ``p``: merge them over ``RayBackend.spawn``'s defaults
    (``spawn(..., options=ray_options(p))``).

    * ``scheduling_strategy``: a hard affinity to the placement's node.
    * ``num_gpus``: the ask (Ray counts the share); ``num_cpus``: the placement's (0 by
      default).
    * for a GPU role: its planned slots (``EBRL_GPU_SLOTS``) and Ray told not to set
      ``CUDA_VISIBLE_DEVICES``: the process takes its planned GPUs (:func:`pin_planned_gpus`),
      since Ray would pack shares in the order actors are created.
    * ``resources``: the ask's custom resources.
    * ``runtime_env.env_vars``: the MPS SM quota ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
      (``sm_pct``, else the share in percent for a share below one GPU; it takes effect
      where an MPS daemon serves the GPU, without one CUDA ignores it), plus
      ``CUDA_MPS_PIPE_DIRECTORY`` when ``mps_pipe`` is given. Ray merges an actor's
      ``env_vars`` with the job's (``RayBackend``'s ``VK_ICD_FILENAMES`` ... stay).

    Args:
        mps: set the MPS quota.
        mps_pipe: the pipe directory of the MPS daemon serving the node
            (``ebrl.resources.mps.ClusterMPS.pipes``).
        sm_pct: the role's SM quota in percent (``ebrl.resources.sharing.quotas``; None: the
            share's own, :attr:`Ask.mps_percent`).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    a = p.ask
    opts: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=p.node.node_id, soft=False),
        "num_gpus": float(a.gpus),
        "num_cpus": float(p.num_cpus),
    }
    if a.resources:
        opts["resources"] = dict(a.resources)
    env: dict[str, str] = {}
    if a.gpus > 0 and p.gpu_slots:
        # Ray hands out fractional shares in the order actors are created (two replicas made
        # before the ranks share GPU 0), not as planned: the role's process takes its planned
        # GPUs itself (pin_planned_gpus) and Ray leaves CUDA_VISIBLE_DEVICES alone
        env[SLOTS_VAR] = ",".join(str(s) for s in p.gpu_slots)
        env[NOSET_CUDA] = "1"
    quota = sm_pct if sm_pct is not None and a.gpus > 0 else a.mps_percent
    if mps and quota is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(quota)
        if mps_pipe is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps_pipe)
    if env:
        opts["runtime_env"] = {"env_vars": env}
    return opts


#: the variables a GPU role's process reports (:func:`record_role_env`)
GPU_ENV = (
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_VISIBLE_DEVICES",
)


def _role_env(_instance: Any) -> dict[str, Any]:
    """Run inside a role's actor process: its pid, node and sharing variables."""
    import os
    import socket

    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        **{k: os.environ.get(k) for k in GPU_ENV},
    }


def record_role_env(actor: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """What a role's process runs with (:data:`GPU_ENV`, its pid and host), read inside it."""
    import ray

    return ray.get(actor.__ray_call__.remote(_role_env), timeout=timeout_s)


def describe(
    placements: Sequence[Placement], sm_pct: Mapping[Ask, int | None] | None = None
) -> str:
    """A table a person can read in a log: one row per worker, then per GPU the roles it holds
    with their SM quotas, then per node its workers (the env workers by index) and GPUs.

    Args:
        sm_pct: each GPU role's SM quota where it is not its share's (pinned quotas).
    """

    def quota(a: Ask) -> int | None:
        return (sm_pct or {}).get(a, a.mps_percent)

    head = (
        "role", "index", "node", "gpu", "gpu slot", "mps %", "cpus", "resources", "group",
        "feeds",
    )  # fmt: skip
    rows = [head]
    for p in placements:
        a = p.ask
        rows.append(
            (
                a.role,
                str(a.index),
                p.node.short,
                _fmt_num(a.gpus) if a.gpus else "-",
                ",".join(map(str, p.gpu_slots)) or "-",
                str(q) if (q := quota(a)) is not None else "-",
                _fmt_num(a.cpus) + ("" if p.num_cpus or not a.cpus else " (pinned)"),
                ",".join(f"{k}={_fmt_num(v)}" for k, v in sorted(a.resources.items())) or "-",
                a.group or "-",
                "-" if a.feeds is None else f"gen {a.feeds}" + ("" if p.local else " (off-node)"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    nodes: dict[str, tuple[Node, list[Placement]]] = {}
    for p in placements:
        nodes.setdefault(p.node.node_id, (p.node, []))[1].append(p)
    for node, ps in nodes.values():
        slots: dict[int, list[str]] = {}
        for p in ps:
            for slot in p.gpu_slots:
                q = quota(p.ask)
                slots.setdefault(slot, []).append(
                    f"{p.role} {p.index}" + (f" ({q}%)" if q is not None else " (whole)")
                )
        for slot in sorted(slots):
            lines.append(f"gpu {node.short}#{slot}: {', '.join(slots[slot])}")
    for node, ps in nodes.values():
        roles = {r: sum(1 for p in ps if p.role == r) for r in ROLES}
        gpus = sum(p.ask.gpus for p in ps)
        cpus = sum(p.ask.cpus for p in ps)
        sims = _ranges(sorted(p.index for p in ps if p.role == "sim"))
        idle = int(node.gpus + _EPS) - len({s for p in ps for s in p.gpu_slots})
        lines.append(
            f"node {node.short}{' (head)' if node.head else ''}: "
            + ", ".join(f"{n} {r}" for r, n in roles.items() if n)
            + (f" (env workers {sims})" if sims else "")
            + f"; GPUs {_fmt_num(gpus)}/{_fmt_num(node.gpus)}"
            + (f", {idle} idle" if idle > 0 else "")
            + f"; cpus asked {_fmt_num(cpus)}/{_fmt_num(node.cpus)}"
            + (f"; tags {node.tags}" if node.tags != "none" else "")
        )
    lines += [f"note: {p.note}" for p in placements if p.note]
    return "\n".join(lines)


def _ranges(xs: Sequence[int]) -> str:
    """``0-7,16-23``: sorted integers as runs."""
    out: list[str] = []
    for x in xs:
        if out and int(out[-1].split("-")[-1]) == x - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ",".join(out)


def gpus_used(placements: Sequence[Placement]) -> int:
    """How many distinct GPUs the placements compute on."""
    return len({(p.node.node_id, s) for p in placements for s in p.gpu_slots})
