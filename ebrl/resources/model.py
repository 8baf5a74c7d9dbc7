"""A discrete-event model of the EBRL engine's schedule: predicted throughput of a shape.

The resource manager uses it to choose the run's shape (env groups G, step-level orchestration
and its batch M) before the workers start (``ebrl.resources.shape``); a capacity planner can use
it for machines the run is not on. It plays the engine's own rules, not an approximation of them:

- every env worker steps the units it was sent one after the other (a lock-step unit is the
  worker's share of a group; at the step level, one env);
- the generator acts on one batch at a time, picked by the engine's rule
  (:func:`pick`: whole groups in order in lock step; the first M eligible envs, or whoever is
  ready once the oldest has waited the timeout, at the step level);
- the staleness gate: an env may act for segment ``s`` once the policy version is ``>= s - k``;
- the learner trains segment ``u`` once every env has stepped ``T (u + 1)`` chunks.

Time is shared the way an operating system shares cores: every running job asks for some cores
(a physics step 1, a sleeping simulator about 0, a generator call its threads' busy cores), and
when the jobs ask for more than the machine has, each runs slower in proportion (processor
sharing). The costs come from a short profile of this run's own stages (``StageCosts``); the model
then predicts env steps per second for each candidate shape in milliseconds.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class StageCosts:
    """What one unit of each stage costs at full speed, alone on the machine.

    Attributes:
        sim_chunk_s: wall seconds of one env's action chunk (K physics steps), samples: their
            spread is the step-latency tail the model replays.
        sim_busy: cores a stepping env worker keeps busy (CPU seconds per wall second): about 1
            for CPU physics, near 0 for a simulator that waits (a remote or GPU simulator).
        gen_fixed_s: seconds of one generator call regardless of its batch.
        gen_per_env_s: seconds per env in a generator call.
        gen_busy: cores a generator call keeps busy.
        train_s: seconds of one update (a whole segment, every epoch).
        train_busy: cores the learner keeps busy while it trains.
        message_s: CPU seconds of the engine's own work per unit sent (a Ready or a Go handled
            at both ends), added to each sim unit and, per env, to each generator call.
    """

    sim_chunk_s: tuple[float, ...]
    sim_busy: float
    gen_fixed_s: float
    gen_per_env_s: float
    gen_busy: float
    train_s: float
    train_busy: float
    message_s: float = 2e-4

    def __post_init__(self) -> None:
        if not self.sim_chunk_s or min(self.sim_chunk_s) <= 0:
            raise ValueError("StageCosts.sim_chunk_s: at least one positive sample")
        for name in ("gen_fixed_s", "gen_per_env_s", "train_s", "message_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"StageCosts.{name} must be >= 0")

    def gen_s(self, batch: int) -> float:
        return self.gen_fixed_s + (self.gen_per_env_s + self.message_s) * batch

    @property
    def sim_mean_s(self) -> float:
        return float(np.mean(self.sim_chunk_s))

    @property
    def tail(self) -> float:
        """P99 / mean of a chunk's latency."""
        return float(np.percentile(self.sim_chunk_s, 99)) / self.sim_mean_s


@dataclass(frozen=True)
class Workload:
    """The run's fixed part: who holds which envs, segment length, staleness bound, cores.

    Attributes:
        workers: env ids of each env worker.
        decisions_per_env: T, chunks per env per segment.
        staleness: k (0: the rollout waits for every update).
        cores: cores the run's processes share.
        chunk_size: K, env steps per chunk (throughput is in env steps).
    """

    workers: tuple[tuple[int, ...], ...]
    decisions_per_env: int
    staleness: int
    cores: float
    chunk_size: int = 1

    @property
    def num_envs(self) -> int:
        return sum(len(w) for w in self.workers)


@dataclass(frozen=True)
class Shape:
    """What the shape search chooses: G, step level, M and the batch cap (timeout: the
    engine's).

    At the step level the generator acts once ``batch_min`` (M) eligible envs are ready, on the
    first ``batch_max`` of them in arrival order: ``batch_max`` = M (None) is EnvPool's "first M
    of N"; a larger cap lets the envs that piled up while the generator was busy share one call
    (its fixed cost paid once), which is what pays when a call costs much more than an env.
    """

    groups: int
    step_level: bool
    batch_min: int
    batch_timeout_s: float = 0.005
    batch_max: int | None = None

    @property
    def cap(self) -> int:
        """The most envs one step-level call takes."""
        return max(self.batch_min, self.batch_max or self.batch_min)

    def describe(self) -> str:
        if self.step_level:
            if self.cap > self.batch_min:
                return f"step level, M={self.batch_min} up to {self.cap}"
            return f"step level, M={self.batch_min}"
        return f"G={self.groups}, lock step"

    def to_dict(self) -> dict[str, object]:
        return {
            "env_groups": self.groups,
            "step_level": self.step_level,
            "batch_min": self.batch_min if self.step_level else None,
            "batch_max": self.cap if self.step_level else None,
        }


@dataclass(frozen=True)
class Prediction:
    """The model's figures for one shape.

    Attributes:
        throughput: env steps per second, steady state.
        gen_busy: fraction of the time the generator computes.
        train_busy: fraction of the time the learner trains.
        mean_batch: envs per generator call.
        bubble: fraction of the time in which no job ran.
    """

    shape: Shape
    throughput: float
    gen_busy: float
    train_busy: float
    mean_batch: float
    bubble: float


def split_groups(workers: Sequence[Sequence[int]], groups: int) -> list[list[int]]:
    """Group g = the g-th contiguous share of every worker's envs (the engine's ``env_groups``)."""
    out: list[list[int]] = [[] for _ in range(groups)]
    for ids in workers:
        for g, part in enumerate(np.array_split(np.array(ids, dtype=np.int64), groups)):
            out[g].extend(int(e) for e in part)
    return [g for g in out if g]


def pick(
    ready: OrderedDict[int, float],
    eligible: Callable[[int], bool],
    groups: Sequence[Sequence[int]],
    step_level: bool,
    batch_min: int,
    timeout_s: float,
    now: float,
    batch_max: int | None = None,
) -> list[int]:
    """The generator's next batch: the engine's rule (``GenWorker._pick`` calls this).

    Lock step: the first group whose acting envs (those the staleness gate lets act) are all
    ready. Step level: once ``batch_min`` eligible envs are ready, the first ``batch_max``
    (default ``batch_min``: the first M of N) of them in the order they became ready; or, once
    the oldest has waited ``timeout_s``, every eligible one (up to the cap). ``ready`` maps env
    -> when it became ready, oldest first. Empty: nothing to do yet.
    """
    if not step_level:
        for g in groups:
            acting = [e for e in g if eligible(e)]
            if acting and all(e in ready for e in acting):
                return acting
        return []
    ok = [e for e in ready if eligible(e)]
    cap = max(batch_min, batch_max or batch_min)
    if len(ok) >= batch_min:
        return ok[:cap]
    if ok and now - ready[ok[0]] >= timeout_s - 1e-9:  # (a timer set for it fires exactly)
        return ok[:cap]
    return []


@dataclass
class _Job:
    remaining: float  # seconds at full speed
    demand: float  # cores it keeps busy at full speed
    done: Callable[[], None]
    kind: str


@dataclass
class _Sim:
    """The fluid processor-sharing machine: jobs, timers, the clock."""

    cores: float
    now: float = 0.0
    jobs: list[_Job] = field(default_factory=list)
    timers: list[float] = field(default_factory=list)
    busy: dict[str, float] = field(default_factory=dict)
    idle: float = 0.0

    def add(self, job: _Job) -> None:
        self.jobs.append(job)

    def advance(self) -> bool:
        """Run to the next completion or timer; False: nothing left to happen."""
        if not self.jobs and not self.timers:
            return False
        demand = sum(j.demand for j in self.jobs)
        speed = 1.0 if demand <= self.cores else self.cores / demand
        dt = math.inf
        if self.jobs:
            dt = min(j.remaining for j in self.jobs) / speed
        if self.timers:
            dt = min(dt, max(0.0, self.timers[0] - self.now))
        for j in self.jobs:
            j.remaining -= dt * speed
            self.busy[j.kind] = self.busy.get(j.kind, 0.0) + dt
        if not self.jobs:
            self.idle += dt
        self.now += dt
        while self.timers and self.timers[0] <= self.now + 1e-12:
            self.now = max(self.now, heapq.heappop(self.timers))  # exactly at the timer
        finished = [j for j in self.jobs if j.remaining <= 1e-12]
        self.jobs = [j for j in self.jobs if j.remaining > 1e-12]
        for j in finished:
            j.done()
        return True


def simulate(
    costs: StageCosts,
    work: Workload,
    shape: Shape,
    updates: int = 8,
    warmup: int = 2,
    seed: int = 0,
) -> Prediction:
    """Play ``updates`` updates of the schedule; the figures are over those after ``warmup``."""
    rng = np.random.default_rng(seed)
    samples = np.asarray(costs.sim_chunk_s, dtype=float)
    n, t, k = work.num_envs, work.decisions_per_env, work.staleness
    owner = {e: w for w, ids in enumerate(work.workers) for e in ids}
    groups = split_groups(work.workers, shape.groups)
    m = max(1, min(shape.batch_min, n))
    machine = _Sim(cores=float(work.cores))
    decided = dict.fromkeys(owner, 0)  # chunks acted for
    stepped = dict.fromkeys(owner, 0)  # chunks simulated
    ready: OrderedDict[int, float] = OrderedDict((e, 0.0) for g in groups for e in g)
    queues: list[deque[list[int]]] = [deque() for _ in work.workers]
    working = [False] * len(work.workers)
    state = {"version": 0, "gen": False, "learner": False, "batches": 0, "envs": 0}
    done_at: list[float] = []

    def eligible(e: int) -> bool:
        return decided[e] // t - k <= state["version"]

    def start_workers() -> None:
        for w, q in enumerate(queues):
            if working[w] or not q:
                continue
            unit = q.popleft()
            secs = float(rng.choice(samples, size=len(unit)).sum()) + costs.message_s
            working[w] = True
            machine.add(_Job(secs, costs.sim_busy, _stepped(w, unit), "sim"))

    def _stepped(w: int, unit: list[int]) -> Callable[[], None]:
        def fn() -> None:
            working[w] = False
            for e in unit:
                stepped[e] += 1
                ready[e] = machine.now

        return fn

    def _acted(batch: list[int]) -> Callable[[], None]:
        def fn() -> None:
            state["gen"] = False
            per_worker: dict[int, list[int]] = {}
            for e in batch:
                decided[e] += 1
                per_worker.setdefault(owner[e], []).append(e)
            for w, ids in per_worker.items():
                if shape.step_level:
                    queues[w].extend([e] for e in ids)
                else:
                    queues[w].append(ids)

        return fn

    def _trained() -> None:
        state["learner"] = False
        state["version"] += 1
        done_at.append(machine.now)

    def schedule() -> None:
        start_workers()
        if not state["gen"] and ready:
            batch = pick(
                ready,
                eligible,
                groups,
                shape.step_level,
                m,
                shape.batch_timeout_s,
                machine.now,
                shape.batch_max,
            )
            if batch:
                for e in batch:
                    del ready[e]
                state["gen"] = True
                state["batches"] += 1
                state["envs"] += len(batch)
                machine.add(_Job(costs.gen_s(len(batch)), costs.gen_busy, _acted(batch), "gen"))
            elif shape.step_level:
                ok = [e for e in ready if eligible(e)]
                when = ready[ok[0]] + shape.batch_timeout_s if ok else None
                if when is not None and when not in machine.timers:
                    heapq.heappush(machine.timers, when)  # the oldest env's timeout
        u = state["version"]
        if not state["learner"] and min(stepped.values()) >= t * (u + 1):
            state["learner"] = True
            machine.add(_Job(costs.train_s, costs.train_busy, _trained, "train"))

    schedule()
    while len(done_at) < updates:
        if not machine.advance():
            raise RuntimeError(f"the modelled schedule stalled at {shape.describe()}")
        schedule()  # a timer may have fired
    t0 = done_at[warmup - 1] if warmup > 0 else 0.0
    span = done_at[-1] - t0
    steps = (updates - warmup) * n * t * work.chunk_size
    return Prediction(
        shape=shape,
        throughput=steps / span if span > 0 else math.inf,
        gen_busy=machine.busy.get("gen", 0.0) / machine.now,
        train_busy=machine.busy.get("train", 0.0) / machine.now,
        mean_batch=state["envs"] / max(1, state["batches"]),
        bubble=machine.idle / machine.now,
    )


def candidates(
    work: Workload,
    groups: Sequence[int] | None = None,
    step_level: Sequence[bool] = (False, True),
    batch_min: int | None = None,
    timeout_s: float = 0.005,
    batch_max: int | None = None,
) -> list[Shape]:
    """The shapes the search weighs, simplest first: lock step over G groups (G from 1 up to
    the smallest worker's envs, powers of two, unless ``groups`` pins it), then the step level
    with M at a half, a quarter and an eighth of the envs (unless ``batch_min`` pins it), each
    first as EnvPool's first M of N, then capped at every env (``batch_max``: the envs that
    piled up while the generator worked go in one call; unless ``batch_max`` pins the cap). At
    the step level the groups only order the first observations, so G is not searched there (a
    pinned G is kept)."""
    most = min(len(w) for w in work.workers)
    n = work.num_envs
    out: list[Shape] = []
    if False in step_level:
        gs = list(groups) if groups else [g for g in (1, 2, 4, 8) if g <= most]
        out += [Shape(g, False, math.ceil(n / g), timeout_s) for g in gs]
    if True in step_level:
        g = groups[0] if groups else 1
        ms = [batch_min] if batch_min else sorted({max(1, n // d) for d in (2, 4, 8)}, reverse=True)
        caps = [batch_max] if batch_max else [None, n]
        for m in ms:
            # a cap of M (or below) is the first M of N itself
            kept = dict.fromkeys(None if cap is None or cap <= m else cap for cap in caps)
            out += [Shape(g, True, m, timeout_s, cap) for cap in kept]
    return out


def rank(
    costs: StageCosts, work: Workload, shapes: Sequence[Shape], seeds: Sequence[int] = (0, 1)
) -> list[Prediction]:
    """Every shape's prediction (mean over ``seeds`` of the replayed tail), best first; ties go
    to the simpler shape (fewer groups, lock step), the order of ``shapes``."""
    preds = []
    for s in shapes:
        runs = [simulate(costs, work, s, seed=sd) for sd in seeds]
        mean = float(np.mean([r.throughput for r in runs]))
        preds.append(
            Prediction(
                shape=s,
                throughput=mean,
                gen_busy=float(np.mean([r.gen_busy for r in runs])),
                train_busy=float(np.mean([r.train_busy for r in runs])),
                mean_batch=float(np.mean([r.mean_batch for r in runs])),
                bubble=float(np.mean([r.bubble for r in runs])),
            )
        )
    order = sorted(range(len(preds)), key=lambda i: (-round(preds[i].throughput, 6), i))
    return [preds[i] for i in order]


def choose(
    costs: StageCosts, work: Workload, shapes: Sequence[Shape], margin: float = 0.02
) -> tuple[Shape, list[Prediction]]:
    """The shape to run: the best predicted, unless a simpler one (earlier in ``shapes``) is
    within ``margin`` of it (a gain the model cannot resolve is not worth the machinery)."""
    ranked = rank(costs, work, shapes)
    best = ranked[0].throughput
    for s in shapes:
        p = next(p for p in ranked if p.shape == s)
        if p.throughput >= best * (1 - margin):
            return s, ranked
    return ranked[0].shape, ranked


def fit_cores(
    costs: StageCosts,
    work: Workload,
    shape: Shape,
    measured: float,
    lo: float = 0.25,
    tol: float = 0.01,
    seeds: Sequence[int] = (0, 1),
) -> float:
    """The machine's effective cores: those at which the model's rate for ``shape`` equals
    ``measured`` (env steps/s of a real run of it), by bisection between ``lo`` and the
    workload's own cores (the model's rate never falls as cores are added).

    What the solo profile cannot see lowers it below the cores the run was given: two
    compute-bound processes slowing each other down (shared caches, memory bandwidth, hardware
    threads of one core), the engine's and Ray's own processes, the driver. Returns ``lo`` or
    ``work.cores`` when the measurement lies outside what the model can reach.
    """

    def rate(cores: float) -> float:
        w = dataclasses.replace(work, cores=cores)
        return float(np.mean([simulate(costs, w, shape, seed=sd).throughput for sd in seeds]))

    hi = float(work.cores)
    if rate(hi) <= measured:
        return hi
    if rate(lo) >= measured:
        return lo
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if rate(mid) >= measured:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2
