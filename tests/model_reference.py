"""The schedule model as it was before it was made faster (commit 0cc8b3a's
``ebrl/resources/model/machine.py`` and ``engine.py``, verbatim but for their imports): the
reference ``tests/test_plan_speed.py`` holds the model's figures and schedules to, bit for bit.

The rules (``ebrl.resources.model.rules``) and the types are the package's own: only the
machine and the engine's loop are kept here. Nothing else imports this module. A change meant
to alter the model's answers (not only its speed) retires this reference and its test; the
planner's validation (``benchmarks/plan_validation.py``) then says what the change did.
"""

# ruff: noqa

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ebrl.resources.model.engine import Played, gen_track
from ebrl.resources.model.rules import admits, pick, replica_blocks, served_groups, split_groups
from ebrl.resources.model.types import Layout, Prediction, Shape, StageCosts, Workload

#: a pool name and the capacity a job asks of it
Use = tuple[str, float]
#: the pool of jobs that only take time (a transfer that occupies nothing the model shares)
DELAY = "delay"
_EPS = 1e-10


@dataclass(eq=False, slots=True)
class Job:
    """One stage call.

    Attributes:
        work: seconds it takes at full speed (alone, with all it asks for).
        uses: the pools it runs on and what it asks of each (empty: a pure delay).
        done: called when it finishes (the model's event handler).
        kind: the stage (``sim``, ``gen``, ``train``, ``sync``, ``load``): a timeline span's name.
        track: the worker it runs on (``sim0``, ``gen``, ``learner``): a timeline lane.
        args: what the span records (``batch``, ``version``).
        loads: pools it takes capacity from without being paced by them (a GPU call's host
            thread takes a core from its node, but the call runs at the GPU's pace).
    """

    work: float
    uses: tuple[Use, ...]
    done: Callable[[], None]
    kind: str
    track: str
    args: tuple[tuple[str, float | int | str], ...] = ()
    loads: tuple[Use, ...] = ()
    seq: int = 0
    start: float = 0.0
    remaining: float = 0.0  # several pools only: work left at full speed


@dataclass(frozen=True, slots=True)
class Span:
    """A finished job, in the shape of ``ebrl.timeline.Span`` (seconds of model time)."""

    stage: str
    track: str
    start: float
    end: float
    args: tuple[tuple[str, float | int | str], ...] = ()


@dataclass
class Machine:
    """Pools, running jobs, timers and the clock.

    Args:
        capacity: each pool's capacity (cores, or 1.0 for a GPU).
        nominal: a pool's nominal capacity where it exceeds ``capacity`` (what a job alone
            gets; module docstring).
    """

    capacity: Mapping[str, float]
    nominal: Mapping[str, float] | None = None
    now: float = 0.0
    idle: float = 0.0
    spans: list[Span] = field(default_factory=list)
    timers: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.capacity = {**self.capacity, DELAY: math.inf}
        # pools whose nominal capacity exceeds the effective one: their jobs' demands are kept
        nominal = {p: c for p, c in (self.nominal or {}).items() if c > self.capacity.get(p, c)}
        self._nominal = nominal
        self._jobs: dict[str, dict[int, float]] = {p: {} for p in nominal}
        self._demand = dict.fromkeys(self.capacity, 0.0)
        self._count = dict.fromkeys(self.capacity, 0)
        self._speed = dict.fromkeys(self.capacity, 1.0)
        # a pool's virtual clock (work each of its jobs has done) as of _vt_at
        self._vt = dict.fromkeys(self.capacity, 0.0)
        self._vt_at = dict.fromkeys(self.capacity, 0.0)
        self._heap: dict[str, list[tuple[float, int, Job]]] = {p: [] for p in self.capacity}
        # when each pool's next job ends (real time), kept current by version numbers: an
        # event touches a few pools, not all of them
        self._next: list[tuple[float, int, str]] = []
        self._pool_version = dict.fromkeys(self.capacity, 0)
        # jobs on several pools: each runs at its slowest pool's speed; its finish time is
        # kept in a heap and recomputed (a new entry, the old one stale) when a speed changes
        self._multi: dict[int, Job] = {}
        self._on_pool: dict[str, set[int]] = {p: set() for p in self.capacity}
        self._finish: list[tuple[float, int, int]] = []  # (time, seq, its version)
        self._version: dict[int, int] = {}
        self._rate: dict[int, float] = {}
        self._since: dict[int, float] = {}
        self._seq = itertools.count()
        self._running: dict[int, Job] = {}

    @property
    def running(self) -> list[Job]:
        return list(self._running.values())

    def _clock(self, p: str) -> float:
        return self._vt[p] + self._speed[p] * (self.now - self._vt_at[p])

    def _settle(self, p: str) -> None:
        self._vt[p], self._vt_at[p] = self._clock(p), self.now

    def _renext(self, p: str) -> None:
        """Pool ``p``'s next end in real time, after its speed or its first job changed."""
        self._pool_version[p] += 1
        h = self._heap[p]
        if h:
            left = max(0.0, h[0][0] - self._clock(p))
            heapq.heappush(self._next, (self.now + left / self._speed[p], self._pool_version[p], p))

    def add(self, job: Job) -> None:
        """Start ``job`` now."""
        uses = job.uses or ((DELAY, 0.0),)
        for p, _ in (*uses, *job.loads):
            if p not in self.capacity:
                raise KeyError(f"job {job.kind}@{job.track} uses pool {p!r}, which is not defined")
        job.seq, job.start = next(self._seq), self.now
        self._running[job.seq] = job
        multi = len(uses) > 1
        if multi:
            job.remaining = job.work
            self._multi[job.seq] = job
            self._version[job.seq] = 0
            self._rate[job.seq] = 0.0
            self._since[job.seq] = self.now
        for p, d in uses:
            self._count[p] += 1
            self._demand[p] += d
            if p in self._jobs:
                self._jobs[p][job.seq] = d
            if multi:
                self._on_pool[p].add(job.seq)
            self._respeed(p)
        for p, d in job.loads:
            self._count[p] += 1
            self._demand[p] += d
            if p in self._jobs:
                self._jobs[p][-job.seq - 1] = d
            self._respeed(p)
        if multi:
            self._reschedule(job)
        else:
            p = uses[0][0]
            h = self._heap[p]
            heapq.heappush(h, (self._clock(p) + job.work, job.seq, job))
            if h[0][2] is job:
                self._renext(p)

    def _respeed(self, p: str) -> None:
        if self._count[p] == 0:
            self._demand[p] = 0.0  # no float residue once the pool is empty
        d, cap = self._demand[p], self.capacity[p]
        if p in self._nominal and d > 0:
            # alone: the nominal cores; beside jobs asking as much: the effective ones
            beside = min(1.0, 2.0 * (d - max(self._jobs[p].values())) / d)
            cap = self._nominal[p] - (self._nominal[p] - cap) * beside
        speed = 1.0 if d <= cap + 1e-9 else cap / d
        if speed != self._speed[p]:
            self._settle(p)
            self._speed[p] = speed
            self._renext(p)
            for seq in self._on_pool[p]:
                self._reschedule(self._multi[seq])

    def _reschedule(self, job: Job) -> None:
        """Settle a several-pool job's work at its old rate, take the new one."""
        seq = job.seq
        job.remaining -= self._rate[seq] * (self.now - self._since[seq])
        rate = min(self._speed[p] for p, _ in job.uses)
        self._rate[seq], self._since[seq] = rate, self.now
        self._version[seq] += 1
        heapq.heappush(
            self._finish, (self.now + max(0.0, job.remaining) / rate, seq, self._version[seq])
        )

    def _next_pool(self) -> float:
        """When the next single-pool job ends (stale entries dropped)."""
        n = self._next
        while n and n[0][1] != self._pool_version[n[0][2]]:
            heapq.heappop(n)
        return n[0][0] if n else math.inf

    def _next_multi(self) -> float:
        """When the next several-pool job ends (stale entries dropped)."""
        f = self._finish
        while f and (f[0][1] not in self._multi or f[0][2] != self._version[f[0][1]]):
            heapq.heappop(f)
        return f[0][0] if f else math.inf

    def timer(self, at: float) -> None:
        """Wake the model at ``at`` (once per distinct time)."""
        if at not in self.timers:
            heapq.heappush(self.timers, at)

    def advance(self) -> bool:
        """Run to the next completion or timer; False: nothing left to happen."""
        if not self._running and not self.timers:
            return False
        at = min(
            self._next_pool(),
            self._next_multi() if self._multi else math.inf,
            self.timers[0] if self.timers else math.inf,
        )
        at = max(self.now, at)
        if not self._running:
            self.idle += at - self.now
        self.now = at
        while self.timers and self.timers[0] <= self.now + _EPS:
            heapq.heappop(self.timers)
        finished: list[Job] = []
        while self._next and self._next_pool() <= self.now + _EPS:
            _, _, p = heapq.heappop(self._next)
            h, clock = self._heap[p], self._clock(p)
            while h and h[0][0] - clock <= _EPS:
                finished.append(heapq.heappop(h)[2])
            self._renext(p)
        while self._multi and self._next_multi() <= self.now + _EPS:
            _, seq, _ = heapq.heappop(self._finish)
            finished.append(self._multi.pop(seq))
        if len(finished) > 1:
            finished.sort(key=lambda j: j.seq)  # jobs that end together: in the order they began
        for j in finished:
            del self._running[j.seq]
            for p, _ in j.uses:
                self._on_pool[p].discard(j.seq)
        for j in finished:
            for p, d in j.uses or ((DELAY, 0.0),):
                self._count[p] -= 1
                self._demand[p] -= d
                if p in self._jobs:
                    del self._jobs[p][j.seq]
                self._respeed(p)
            for p, d in j.loads:
                self._count[p] -= 1
                self._demand[p] -= d
                if p in self._jobs:
                    del self._jobs[p][-j.seq - 1]
                self._respeed(p)
            self.spans.append(Span(j.kind, j.track, j.start, self.now, j.args))
        for j in finished:
            j.done()
        return True

    def busy(self, kind: str) -> float:
        """Seconds jobs of ``kind`` have run so far (finished and running, summed)."""
        done = sum(s.end - s.start for s in self.spans if s.stage == kind)
        return done + sum(self.now - j.start for j in self._running.values() if j.kind == kind)


class _Sampler:
    """Chunk latencies replayed from the profile's samples: the sum of ``size`` random draws
    (indices drawn from a seeded generator in blocks: a numpy call per unit would cost more
    than the rest of the event)."""

    def __init__(self, samples: tuple[float, ...], seed: int, block: int = 4096) -> None:
        self.samples = [float(x) for x in samples]
        self.same = max(self.samples) == min(self.samples)
        self.rng = np.random.default_rng(seed)
        self.block = block
        self.idx: list[int] = []
        self.at = 0

    def __call__(self, size: int) -> float:
        if self.same:
            return self.samples[0] * size
        total = 0.0
        for _ in range(size):
            if self.at == len(self.idx):
                self.idx = self.rng.integers(0, len(self.samples), self.block).tolist()
                self.at = 0
            total += self.samples[self.idx[self.at]]
            self.at += 1
        return total


@dataclass
class _Replica:
    """What one generator replica knows (the engine's ``GenWorker``)."""

    served: set[int]
    groups: list[list[int]]
    ready: OrderedDict[int, float] = field(default_factory=OrderedDict)
    inbox: deque[tuple[str, int]] = field(default_factory=deque)
    carry: list[tuple[str, int]] = field(default_factory=list)  # read, not yet handled
    version: int = 0
    busy: bool = False


def play(
    costs: StageCosts,
    work: Workload,
    shape: Shape,
    layout: Layout | None = None,
    updates: int = 8,
    warmup: int = 2,
    seed: int = 0,
) -> Played:
    """Play ``updates`` updates of the schedule; the figures are over those after ``warmup``.

    Raises:
        RuntimeError: the schedule stalls (nothing left to happen before ``updates`` updates).
    """
    lay = layout or Layout.single(costs, work)
    if len(lay.sims) != len(work.workers):
        raise ValueError(
            f"layout places {len(lay.sims)} env workers, the workload has {len(work.workers)}"
        )
    draw = _Sampler(costs.sim_chunk_s, seed)
    n, t, k = work.num_envs, work.decisions_per_env, work.staleness
    owner = {e: w for w, ids in enumerate(work.workers) for e in ids}
    replica_of = lay.replica_of or replica_blocks(len(work.workers), lay.replicas)
    groups = split_groups(work.workers, shape.groups)
    m = max(1, min(shape.batch_min, n))
    reps = []
    for r in range(lay.replicas):
        served = {e for e, w in owner.items() if replica_of[w] == r}
        rep = _Replica(served, served_groups(groups, served))
        for g in rep.groups:  # the first observations, group by group
            rep.ready.update((e, 0.0) for e in g)
        reps.append(rep)
    machine = Machine(lay.pools, lay.nominal)
    decided = dict.fromkeys(owner, 0)  # chunks acted for
    stepped = dict.fromkeys(owner, 0)  # chunks simulated
    queues: list[deque[tuple[list[int], bool]]] = [deque() for _ in work.workers]
    startable: set[int] = set()  # idle env workers with a unit queued
    working = [False] * len(work.workers)
    parts = [0] * len(work.workers)  # segments each env worker has handed to the learner
    learner = {"version": 0, "busy": False, "parts": 0}
    counts = {"batches": 0, "envs": 0}
    hist: dict[int, list[int]] = {}  # segment -> its decisions by staleness 0..k
    events: list[tuple] = []
    done_at: list[float] = []
    # replicas with something new to look at (a message, a finished call, a batching timeout):
    # the others would pick nothing, so only these are served at an event
    dirty: set[int] = set(range(len(reps)))
    waits: list[tuple[float, int]] = []  # (when, replica): batching timeouts set

    def gen_loads(r: int) -> tuple[tuple[str, float], ...]:
        return lay.gen_loads[r] if lay.gen_loads else ()

    def start_workers() -> None:
        for w in sorted(startable):
            unit, last = queues[w].popleft()
            secs = draw(len(unit)) + costs.message_s
            working[w] = True
            uses = ((lay.sims[w], costs.sim_busy),)
            machine.add(
                Job(secs, uses, _stepped(w, unit, last), "sim", f"sim{w}", (("batch", len(unit)),))
            )
        startable.clear()

    def _stepped(w: int, unit: list[int], last: bool) -> Callable[[], None]:
        def fn() -> None:
            working[w] = False
            if queues[w]:
                startable.add(w)
            rep = reps[replica_of[w]]
            dirty.add(replica_of[w])
            for e in unit:
                stepped[e] += 1
                rep.inbox.append(("ready", e))
            if last:  # the Go is done: hand over every segment it completed
                parts[w] = min(stepped[e] for e in work.workers[w]) // t
                learner["parts"] = min(parts)

        return fn

    def _acted(r: int, batch: list[int]) -> Callable[[], None]:
        def fn() -> None:
            reps[r].busy = False
            dirty.add(r)
            per_worker: dict[int, list[int]] = {}
            for e in batch:
                decided[e] += 1
                per_worker.setdefault(owner[e], []).append(e)
            for w, ids in per_worker.items():  # one Go per env worker
                units = [[e] for e in ids] if shape.step_level else [ids]
                queues[w].extend((u, i == len(units) - 1) for i, u in enumerate(units))
                if not working[w]:
                    startable.add(w)

        return fn

    def _loaded(r: int, version: int) -> Callable[[], None]:
        def fn() -> None:
            reps[r].busy = False
            dirty.add(r)
            reps[r].version = max(reps[r].version, version)

        return fn

    def _trained() -> None:
        if costs.sync_s > 0:
            version = learner["version"] + 1
            machine.add(
                Job(
                    costs.sync_s,
                    lay.learner,
                    _published,
                    "sync",
                    "learner",
                    (("version", version),),
                    lay.learner_loads,
                )
            )
        else:
            _published()

    def _published() -> None:
        learner["busy"] = False
        learner["version"] += 1
        done_at.append(machine.now)
        for r, rep in enumerate(reps):
            rep.inbox.append(("weights", learner["version"]))
            dirty.add(r)

    def read(r: int, msgs: list[tuple[str, int]]) -> None:
        """Handle the messages a recv returned, in order; a load pauses the rest."""
        rep = reps[r]
        for i, (what, x) in enumerate(msgs):
            if what == "ready":
                rep.ready[x] = machine.now
            elif x > rep.version:  # new weights (a version it holds is skipped)
                if costs.load_s > 0:
                    rep.busy, rep.carry = True, msgs[i + 1 :]
                    machine.add(
                        Job(
                            costs.load_s,
                            lay.gens[r],
                            _loaded(r, learner["version"]),
                            "load",
                            gen_track(r),
                            (("version", x),),
                            gen_loads(r),
                        )
                    )
                    return
                rep.version = learner["version"]  # the board holds the newest

    def serve(r: int) -> None:
        """Replica ``r``'s loop (``GenWorker._loop``) from where it stands, at this instant."""
        rep = reps[r]
        if rep.carry:
            msgs, rep.carry = rep.carry, []
            read(r, msgs)
        while not rep.busy:
            batch = pick(
                rep.ready,
                lambda e: admits(decided[e], t, k, rep.version),
                rep.groups,
                shape.step_level,
                m,
                shape.batch_timeout_s,
                machine.now,
                shape.batch_max,
            )
            if batch:
                for e in batch:
                    del rep.ready[e]
                    seg = decided[e] // t
                    hist.setdefault(seg, [0] * (k + 1))[seg - rep.version] += 1
                rep.busy = True
                counts["batches"] += 1
                counts["envs"] += len(batch)
                events.append(
                    ("gen", r, tuple(batch), rep.version, tuple(decided[e] // t for e in batch))
                )
                # the engine's own work: a Ready read per unit the batch came in (one per env
                # at the step level, one per env worker's share in lock step), a Go sent per
                # env worker it acted for
                workers = len({owner[e] for e in batch})
                units = len(batch) if shape.step_level else workers
                secs = costs.gen_s(len(batch), messages=units + workers)
                if costs.offload_s > 0 and _ends_rollout(rep.served, batch, decided, t):
                    secs += costs.offload_s  # the rollout's last call drops the weights
                machine.add(
                    Job(
                        secs,
                        lay.gens[r],
                        _acted(r, batch),
                        "gen",
                        gen_track(r),
                        (("batch", len(batch)),),
                        gen_loads(r),
                    )
                )
                return
            if rep.inbox:
                msgs = list(rep.inbox)
                rep.inbox.clear()
                read(r, msgs)
                continue
            if shape.step_level:  # wait out the oldest eligible env's batching timeout
                ok = [e for e in rep.ready if admits(decided[e], t, k, rep.version)]
                if ok:
                    at = rep.ready[ok[0]] + shape.batch_timeout_s
                    machine.timer(at)
                    heapq.heappush(waits, (at, r))
            return

    def schedule() -> None:
        if startable:
            start_workers()
        while waits and waits[0][0] <= machine.now + 1e-12:
            dirty.add(heapq.heappop(waits)[1])
        for r in sorted(dirty):
            if not reps[r].busy:
                serve(r)
        dirty.clear()
        u = learner["version"]
        if not learner["busy"] and learner["parts"] >= u + 1:
            learner["busy"] = True
            events.append(("train", u))
            machine.add(
                Job(
                    costs.train_s,
                    lay.learner,
                    _trained,
                    "train",
                    "learner",
                    (("steps", n * t),),
                    lay.learner_loads,
                )
            )

    schedule()
    while len(done_at) < updates:
        if not machine.advance():
            raise RuntimeError(f"the modelled schedule stalled at {shape.describe()}")
        schedule()  # a timer may have fired
    return _result(machine, costs, work, shape, lay, warmup, done_at, hist, events, counts)


def _ends_rollout(served: set[int], batch: list[int], decided: dict[int, int], t: int) -> bool:
    """Whether acting for ``batch`` completes the segment of every env the replica serves."""
    acting = set(batch)
    return all((decided[e] + (e in acting)) % t == 0 for e in served)


def _result(
    machine: Machine,
    costs: StageCosts,
    work: Workload,
    shape: Shape,
    lay: Layout,
    warmup: int,
    done_at: list[float],
    hist: dict[int, list[int]],
    events: list[tuple],
    counts: dict[str, int],
) -> Played:
    updates = len(done_at)
    t0 = done_at[warmup - 1] if warmup > 0 else 0.0
    t1 = done_at[-1]
    span = t1 - t0
    steps = (updates - warmup) * work.env_steps_per_update
    lanes = {"sim": len(work.workers), "gen": lay.replicas, "load": lay.replicas}
    busy: dict[str, float] = {}
    for s in machine.spans:
        lo, hi = max(s.start, t0), min(s.end, t1)
        if hi > lo:
            busy[s.stage] = busy.get(s.stage, 0.0) + hi - lo
    for j in machine.running:  # a job still running at the last update
        lo = max(j.start, t0)
        if t1 > lo:
            busy[j.kind] = busy.get(j.kind, 0.0) + t1 - lo
    per_update = max(1, updates - warmup)
    # the segments trained in the steady state (segment u is trained by update u + 1)
    steady = [0] * (len(next(iter(hist.values()))) if hist else 1)
    for seg, counts_ in hist.items():
        if warmup <= seg < updates:
            steady = [a + b for a, b in zip(steady, counts_, strict=True)]
    total = max(1, sum(steady))
    now = machine.now
    pred = Prediction(
        shape=shape,
        throughput=steps / span if span > 0 else float("inf"),
        gen_busy=machine.busy("gen") / now / lay.replicas,
        train_busy=machine.busy("train") / now,
        mean_batch=counts["envs"] / max(1, counts["batches"]),
        bubble=machine.idle / now,
        update_s=span / per_update,
        staleness=tuple(c / total for c in steady),
        stage_busy={s: b / per_update for s, b in busy.items()},
        stage_util={s: b / (lanes.get(s, 1) * span) for s, b in busy.items()} if span > 0 else {},
    )
    return Played(pred, machine.spans, events, steady, done_at, (t0, t1))
