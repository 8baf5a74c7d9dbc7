"""Which Ray node each worker of a run goes to: stages ask, :func:`place` decides, Ray obeys.

The roles of a run are ``sim`` (env workers), ``gen`` (generator replicas) and ``learner``
(learner ranks). Each worker is one :class:`~ebrl.runtime.placement_asks.Ask`: a GPU count or
share, CPU cores, Ray custom resources (``scheduler.resources``), and for a sim worker the
generator replica it ``feeds``. The cluster is a list of
:class:`~ebrl.runtime.placement_nodes.Node` s.

:func:`place` is a pure function of the asks and the nodes (unit-tested without Ray):

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
have. :func:`describe` prints the table. :func:`ebrl.runtime.placement_ray.ray_options` turns a
placement into Ray actor options (a hard node affinity, the GPU share, the MPS SM quota as
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for shares below one GPU), for
``RayBackend.spawn(..., options=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ebrl.runtime.placement_asks import ROLE_NOUN, ROLES, Ask
from ebrl.runtime.placement_nodes import Node, in_group

_EPS = 1e-9


class PlacementError(ValueError):
    """An ask no node of the cluster can meet."""


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


# --- node groups, checked before placing ------------------------------------------------------
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


# --- the table --------------------------------------------------------------------------------
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
