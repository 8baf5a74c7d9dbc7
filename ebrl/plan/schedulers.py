"""Every scheduler as a setting of the one schedule model (``ebrl.resources.model``).

A setting is the model's input for one scheduler on one machine: the stage costs at the device
shares its roles get, the workload (env workers, T, k), the shape (G, step level, M) and the
layout (which pool each role runs on, placed by the engine's own ``ebrl.runtime.placement``).
The schedulers differ only in those, as they do in the code:

==========  ==========================================================================
sync        ``ebrl/schedulers/sync.py``: every stage in the driver, in turn: k = 0, G = 1
            in lock step, one env worker holding every env, no messages; one device
colocated   ``baselines/colocated.py``: the sync loop with every core (or every GPU: RLinf's
            placement, each GPU a replica and a learner rank in turn), the generator's
            weights offloaded after each rollout and reloaded with the next weights
hybrid      ``baselines/hybrid.py``: EBRL's workers, k = 0, G = 2 in lock step, the learner on
            every core while it trains alone
async       ``baselines/async_ppo.py``: EBRL's workers, k >= 1, G = 1 in lock step, a fixed
            split of the threads (1 + 1 by its config)
ebrl        ``ebrl/schedulers/ebrl``: EBRL's workers, k >= 1, the shape its resource manager
            chooses (the search with one replica, the levels on with several)
==========  ==========================================================================
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ebrl.plan.machine import MachineSpec
from ebrl.plan.profile import Curve, Profile, ProfileError, steps_per_chunk
from ebrl.resources.model import (
    Layout,
    Played,
    Prediction,
    Shape,
    StageCosts,
    Workload,
    candidates,
    choose,
    mean_prediction,
    pinned_batch_min,
    play,
    rank,
    replica_blocks,
    splits_of,
    thread_options,
)
from ebrl.runtime.placement import place
from ebrl.runtime.placement_asks import Ask

SCHEDULERS = ("sync", "colocated", "hybrid", "async", "ebrl")
#: the schedulers that run every stage in the driver process (no roles, no messages)
IN_DRIVER = ("sync",)


@dataclass(frozen=True)
class PlanWorkload:
    """The run to plan.

    Attributes:
        num_envs: envs in all.
        env_groups: the run's ``env_groups`` (EBRL's G when its levels are pinned on).
        decisions_per_env: T, chunks per env per update (``rollout_steps // chunk_size``).
        staleness: k of Async and EBRL.
        sim_workers, gen_replicas, learner_ranks, gen_gpus, learner_gpus: the roles of the
            schedulers on EBRL's workers (the ``scale`` node).
        gen_threads, train_threads: torch threads of the generator and the learner on a CPU
            (``threads.gen`` / ``threads.train``).
        threads: per scheduler, (gen, train) threads that its config sets instead (Async's
            config: 1 + 1; Colocated and Hybrid's learner take every core unless set here).
        batch_timeout_ms: the step level's batching timeout.
        episode_steps: env steps per episode (None: the profile's).
    """

    num_envs: int = 16
    env_groups: int = 2
    decisions_per_env: int = 12
    staleness: int = 1
    sim_workers: int = 2
    gen_replicas: int = 1
    learner_ranks: int = 1
    gen_gpus: float = 0.0
    learner_gpus: float = 0.0
    gen_threads: int = 1
    train_threads: int = 2
    threads: Mapping[str, tuple[int, int]] = field(default_factory=lambda: {"async": (1, 1)})
    batch_timeout_ms: float = 5.0
    episode_steps: int | None = None

    def __post_init__(self) -> None:
        if self.num_envs < 1 or self.decisions_per_env < 1 or self.staleness < 0:
            raise ValueError(f"workload: num_envs, T >= 1 and k >= 0: {self}")
        if not 1 <= self.gen_replicas <= self.sim_workers <= self.num_envs:
            raise ValueError(
                f"workload: 1 <= gen_replicas ({self.gen_replicas}) <= sim_workers "
                f"({self.sim_workers}) <= num_envs ({self.num_envs})"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["threads"] = {k: list(v) for k, v in self.threads.items()}
        return d

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> PlanWorkload:
        known = set(PlanWorkload.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"workload: unknown fields {sorted(unknown)} (known: {sorted(known)})")
        d = dict(raw)
        if "threads" in d:
            d["threads"] = {k: tuple(int(x) for x in v) for k, v in d["threads"].items()}
        return PlanWorkload(**d)


@dataclass(frozen=True)
class Setting:
    """One scheduler as the model plays it."""

    scheduler: str
    costs: StageCosts
    work: Workload
    shape: Shape
    layout: Layout
    roles: tuple[int, int, int]  # E, R, L
    note: str = ""
    shapes: tuple[Shape, ...] = ()  # the candidates a search weighs (ebrl, one replica)


@dataclass
class PlanRow:
    """A scheduler's predicted figures (the mean over the seeds played)."""

    scheduler: str
    shape: Shape
    prediction: Prediction
    roles: tuple[int, int, int]
    plan_s: float
    note: str = ""
    played: Played | None = None
    ranked: list[Prediction] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        p = self.prediction
        util = dict(p.stage_util)
        return {
            "scheduler": self.scheduler,
            "shape": self.shape.describe(),
            "roles": dict(zip(("env_workers", "gen_replicas", "learner_ranks"), self.roles)),
            "throughput_env_steps_per_s": p.throughput,
            "update_s": p.update_s,
            "staleness": {str(i): f for i, f in enumerate(p.staleness)},
            "stage_busy_s_per_update": dict(p.stage_busy),
            "stage_util": util,
            "stage_bubbles": {s: 1.0 - u for s, u in util.items()},
            "machine_idle_frac": p.bubble,
            "mean_gen_batch": p.mean_batch,
            "plan_s": self.plan_s,
            "note": self.note,
            "ebrl_candidates": [
                {"shape": q.shape.describe(), "throughput": q.throughput} for q in self.ranked
            ],
        }


def scheduler_threads(name: str, wl: PlanWorkload, machine: MachineSpec) -> tuple[int, int]:
    """(gen, train) torch threads a scheduler runs with on a CPU, as its config sets them."""
    if name in wl.threads:
        return wl.threads[name]
    every = int(machine.cores_per_node)
    if name == "colocated":  # every core for each stage in its turn
        return every, every
    if name == "hybrid":  # the learner trains alone, on every core
        return wl.gen_threads, every
    return wl.gen_threads, wl.train_threads


def _level(share: float, threads: int) -> float:
    return share if share > 0 else float(threads)


def allreduce_s(profile: Profile, ranks: int, nodes: int, machine: MachineSpec) -> float:
    """Seconds per update a learner of ``ranks`` ranks on ``nodes`` nodes spends all-reducing
    gradients (ring all-reduce: 2 (L-1)/L of the bytes cross the slowest link, per step)."""
    if ranks <= 1 or profile.param_bytes <= 0:
        return 0.0
    gbps = machine.intra_node_gbps if nodes <= 1 else machine.inter_node_gbps
    return profile.allreduces * 2 * (ranks - 1) / ranks * profile.param_bytes / (gbps * 1e9)


def _merge(uses: Sequence[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    out: dict[str, float] = {}
    for p, d in uses:
        out[p] = out.get(p, 0.0) + d
    return tuple(out.items())


def build(
    name: str,
    profile: Profile,
    wl: PlanWorkload,
    machine: MachineSpec,
    shape: Shape | None = None,
) -> Setting:
    """The model's input for scheduler ``name`` (one of :data:`SCHEDULERS`).

    Args:
        shape: EBRL's shape to play (None: the one its resource manager would choose).

    Raises:
        ProfileError: the profile has no cost for a device share or thread count the
            scheduler's roles get.
    """
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler {name!r}: one of {', '.join(SCHEDULERS)}")
    n, t = wl.num_envs, wl.decisions_per_env
    gpu = machine.gpus > 0
    in_driver = name in IN_DRIVER or (name == "colocated" and not gpu)
    k = wl.staleness if name in ("async", "ebrl") else 0
    gen_threads, train_threads = scheduler_threads(name, wl, machine)
    note = ""
    if in_driver:
        e, r, ranks = 1, 1, 1
        gen_share = learner_share = 1.0 if gpu else 0.0
    elif name == "colocated":  # RLinf's placement: every GPU a replica and a rank, in turn
        e, r, ranks = wl.sim_workers, machine.gpus, machine.gpus
        gen_share = learner_share = 1.0
        note = "every GPU a generator replica and a learner rank, in turn (RLinf's placement)"
    else:
        e, r, ranks = wl.sim_workers, wl.gen_replicas, wl.learner_ranks
        gen_share, learner_share = wl.gen_gpus, wl.learner_gpus
    if gpu and (gen_share <= 0 or learner_share <= 0):
        note = (note + "; " if note else "") + "a role without a GPU share runs on cores"
    gen_curve = _curve(profile, "gen", gen_share, gen_threads)
    train_curve = _curve(profile, "train", learner_share, train_threads)
    workers = tuple(tuple(int(x) for x in b) for b in np.array_split(np.arange(n), e))
    replica_of = replica_blocks(e, r)
    layout, learner_nodes, remote = _layout(
        name,
        machine,
        workers,
        replica_of,
        r,
        ranks,
        gen_share,
        learner_share,
        gen_curve,
        train_curve,
        in_driver,
    )
    sync = profile.sync
    train_s = train_curve.seconds(n * t / ranks) + allreduce_s(
        profile, ranks, learner_nodes, machine
    )
    wire = profile.sync.state_bytes / (machine.inter_node_gbps * 1e9)
    if in_driver:  # the weight load is inside the driver's sync span
        sync_s = sync.publish_s + sync.load_s + (sync.reload_s if name == "colocated" else 0.0)
        load_s = offload_s = 0.0
    else:
        sync_s = sync.publish_s
        load_s = sync.load_s + wire * remote / r + (sync.reload_s if name == "colocated" else 0.0)
        offload_s = 0.0
    if name == "colocated":
        offload_s = sync.offload_s
    costs = StageCosts(
        sim_chunk_s=profile.chunk_s,
        sim_busy=profile.sim_busy,
        gen_fixed_s=gen_curve.fixed,
        gen_per_env_s=gen_curve.per_unit,
        gen_busy=gen_curve.busy,
        train_s=train_s,
        train_busy=train_curve.busy,
        message_s=0.0 if in_driver else profile.message_s,
        sync_s=sync_s,
        load_s=load_s,
        offload_s=offload_s,
    )
    per_chunk = steps_per_chunk(wl.episode_steps or profile.episode_steps, profile.chunk_size)
    work = Workload(
        workers=workers,
        decisions_per_env=t,
        staleness=k,
        cores=machine.cores_per_node * machine.cores_effective,
        chunk_size=profile.chunk_size,
        steps_per_chunk=per_chunk,
    )
    timeout = wl.batch_timeout_ms / 1000
    most = min(len(w) for w in workers)
    shapes: tuple[Shape, ...] = ()
    if name in ("sync", "colocated", "async"):
        chosen = Shape(1, False, n, timeout)
    elif name == "hybrid":
        g = min(2, most)
        chosen = Shape(g, False, math.ceil(n / g), timeout)
    elif shape is not None:
        chosen = shape
    elif r > 1:  # the engine does not search with several replicas: its levels are on
        g = min(wl.env_groups, most)
        chosen = Shape(g, True, pinned_batch_min(n, g, r), timeout)
        note = "several replicas: the shape is not searched, every level is on"
    else:
        shapes = tuple(candidates(work, timeout_s=timeout))
        chosen = shapes[0]  # the search (in plan_one) replaces it
    return Setting(name, costs, work, chosen, layout, (e, r, ranks), note, shapes)


def _curve(profile: Profile, stage: str, share: float, threads: int) -> Curve:
    """A stage's cost where its role runs: a GPU share, or threads on cores."""
    prof = profile.gen if stage == "gen" else profile.train
    device = "gpu" if share > 0 else "cpu"
    if prof.device != device:
        where = f"a {share:g} GPU share" if share > 0 else f"{threads} CPU thread(s)"
        raise ProfileError(
            f"{stage}: the role runs on {where}, the profile's {stage} points are on a "
            f"{prof.device.upper()}: plan a {prof.device.upper()} machine, or measure this one"
        )
    try:
        return prof.curve(_level(share, threads))
    except ProfileError as e:
        raise ProfileError(f"{stage}: {e}") from e


def _layout(
    name: str,
    machine: MachineSpec,
    workers: tuple[tuple[int, ...], ...],
    replica_of: tuple[int, ...],
    replicas: int,
    ranks: int,
    gen_share: float,
    learner_share: float,
    gen_curve: Curve,
    train_curve: Curve,
    in_driver: bool,
) -> tuple[Layout, int, int]:
    """The pools each role runs on (placed as ``ebrl.runtime.placement.place`` places them),
    the nodes the learner spans, and how many replicas sit on another node than the leader."""
    e = len(workers)
    nominal = machine.nominal_pools()
    if in_driver:  # the driver on the first node: its cores, and its first GPU if any
        cpu = machine.cpu_pool(0)
        if machine.gpus:  # on the GPU, the driver's thread a load on its cores
            gpu = machine.gpu_pool(0, 0)
            layout = Layout(
                machine.pools(),
                (cpu,) * e,
                (((gpu, gen_share),),),
                ((gpu, learner_share),),
                replica_of,
                nominal,
                (((cpu, gen_curve.busy),),),
                ((cpu, train_curve.busy),),
            )
        else:
            layout = Layout(
                machine.pools(),
                (cpu,) * e,
                (((cpu, gen_curve.busy),),),
                ((cpu, train_curve.busy),),
                replica_of,
                nominal,
            )
        return layout, 1, 0
    colocated = name == "colocated"
    asks = [Ask("gen", i, gpus=gen_share) for i in range(replicas)]
    if not colocated:  # Colocated's ranks share the replicas' GPUs, in turn
        asks += [Ask("learner", i, gpus=learner_share) for i in range(ranks)]
    asks += [Ask("sim", w, feeds=replica_of[w]) for w in range(e)]
    placed = {(p.role, p.index): p for p in place(asks, machine.ray_nodes())}
    index = {n.node_id: i for i, n in enumerate(machine.ray_nodes())}
    numa = machine.numa_per_node

    def where(role: str, i: int) -> tuple[int, int]:
        p = placed[role, i]
        return index[p.node.node_id], (p.gpu_slots[0] if p.gpu_slots else 0)

    seen: dict[int, int] = {}
    sims = []
    for w in range(e):  # a node's env workers spread over its NUMA domains
        node, _ = where("sim", w)
        sims.append(machine.cpu_pool(node, seen.get(node, 0) % numa))
        seen[node] = seen.get(node, 0) + 1
    # a role on a GPU is paced by its GPU share, its host thread a load on its node's cores;
    # a role on cores is paced by them
    gens, gen_loads = [], []
    for i in range(replicas):
        node, slot = where("gen", i)
        host = (machine.cpu_pool(node, slot % numa), gen_curve.busy)
        if gen_share > 0:
            gens.append(((machine.gpu_pool(node, slot), gen_share),))
            gen_loads.append((host,))
        else:
            gens.append((host,))
            gen_loads.append(())
    uses, loads = [], []
    nodes = set()
    for i in range(ranks):
        node, slot = where("gen" if colocated else "learner", i)
        nodes.add(node)
        host = (machine.cpu_pool(node, slot % numa), train_curve.busy)
        if learner_share > 0:
            uses.append((machine.gpu_pool(node, slot), learner_share))
            loads.append(host)
        else:
            uses.append(host)
    leader = where("gen" if colocated else "learner", 0)[0]
    remote = sum(1 for i in range(replicas) if where("gen", i)[0] != leader)
    layout = Layout(
        machine.pools(),
        tuple(sims),
        tuple(gens),
        _merge(uses),
        replica_of,
        nominal,
        tuple(gen_loads),
        _merge(loads),
    )
    return layout, len(nodes), remote


def plan_one(
    name: str,
    profile: Profile,
    wl: PlanWorkload,
    machine: MachineSpec,
    shape: Shape | None = None,
    updates: int = 4,
    warmup: int = 1,
    seeds: Sequence[int] = (0,),
    keep: bool = False,
) -> PlanRow:
    """One scheduler's prediction, timed (the shape search included for EBRL).

    Args:
        keep: keep the first seed's played schedule (its spans: a Gantt).
    """
    t0 = time.perf_counter()
    s = build(name, profile, wl, machine, shape)
    ranked: list[Prediction] = []
    chosen = s.shape
    if s.shapes:  # EBRL with one replica: its resource manager's search, on this layout
        splits = ebrl_splits(wl, machine) if name == "ebrl" else []
        if len(splits) > 1:  # on cores, every thread split up to threads.* (control.py's)
            chosen, ranked, s = _search_splits(
                s, splits, profile, wl, machine, seeds, updates, warmup
            )
        else:
            chosen, ranked = choose(
                s.costs, s.work, s.shapes, layout=s.layout, seeds=seeds, updates=updates,
                warmup=warmup,
            )  # fmt: skip
    searched = next((p for p in ranked if p.shape == chosen), None)
    if searched is not None:  # the search played it already, with these seeds
        pred = searched
        plays = [play(s.costs, s.work, chosen, s.layout, updates, warmup, seeds[0])] if keep else []
    else:
        plays = [
            play(s.costs, s.work, chosen, s.layout, updates, warmup, sd, spans=keep) for sd in seeds
        ]
        pred = mean_prediction([p.prediction for p in plays])
    row = PlanRow(
        name,
        chosen,
        pred,
        s.roles,
        time.perf_counter() - t0,
        s.note,
        plays[0] if keep else None,
        ranked,
    )
    return row


def ebrl_splits(wl: PlanWorkload, machine: MachineSpec) -> list[tuple[int, int]]:
    """The (gen, train) thread splits EBRL's shape search weighs on cores: every split of the
    powers of two up to its threads and the threads themselves, fewest first (as
    ``ebrl.schedulers.ebrl.control.searched_threads`` with the static, unpinned split); none on
    GPU shares (the share, not threads, sets a stage's pace there)."""
    if machine.gpus > 0 and (wl.gen_gpus > 0 or wl.learner_gpus > 0):
        return []
    g, t = scheduler_threads("ebrl", wl, machine)
    return splits_of(thread_options(g), thread_options(t))


def _search_splits(
    base: Setting,
    splits: Sequence[tuple[int, int]],
    profile: Profile,
    wl: PlanWorkload,
    machine: MachineSpec,
    seeds: Sequence[int],
    updates: int,
    warmup: int,
    margin: float = 0.02,
) -> tuple[Shape, list[Prediction], Setting]:
    """EBRL's search over every candidate shape at every thread split, each split on its own
    costs and layout (a stage's threads change its cost and the cores it keeps busy); the best,
    unless a simpler shape (fewer groups, lock step, fewer threads: the order of
    :func:`ebrl.resources.model.with_threads`) is within ``margin`` of it. A split the profile
    has no points for is left out. Returns the choice, every prediction (best first) and the
    setting of the chosen split."""
    settings: dict[tuple[int, int], Setting] = {}
    ranked: list[Prediction] = []
    for split in splits:
        threads = {**wl.threads, "ebrl": tuple(split)}
        try:
            s = build("ebrl", profile, dataclasses.replace(wl, threads=threads), machine)
        except ProfileError:
            continue
        settings[split] = s
        shapes = [dataclasses.replace(x, threads=tuple(split)) for x in s.shapes]
        ranked += rank(s.costs, s.work, shapes, seeds, s.layout, updates, warmup)
    if not ranked:
        raise ProfileError(f"ebrl: the profile has no points at any thread split of {splits}")
    ranked.sort(key=lambda p: -round(p.throughput, 6))
    best = ranked[0].throughput
    by_shape = {p.shape: p for p in ranked}
    order = [
        dataclasses.replace(x, threads=tuple(sp)) for x in base.shapes for sp in settings
    ]  # simplest first: the shape, then its fewest threads
    chosen = next(x for x in order if by_shape[x].throughput >= best * (1 - margin))
    assert chosen.threads is not None
    return chosen, ranked, settings[chosen.threads]


def plan(
    profile: Profile,
    wl: PlanWorkload,
    machine: MachineSpec,
    schedulers: Sequence[str] = SCHEDULERS,
    **kw: Any,
) -> list[PlanRow]:
    """Every scheduler's prediction, in the order asked."""
    return [plan_one(name, profile, wl, machine, **kw) for name in schedulers]
