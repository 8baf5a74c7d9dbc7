"""The fluid machine the schedule model runs jobs on: pools shared by processor sharing.

A pool is something jobs share: the cores of a node (or of one NUMA domain of it), or one GPU.
Every running job asks each pool it uses for some capacity (its *demand*: the cores a physics
step keeps busy, a generator's busy threads, a GPU share). When a pool's jobs ask for more than
it has, each of them runs slower in proportion, as an operating system shares cores or a GPU
time-slices kernels (processor sharing); a job that uses several pools (a learner spread over
several GPUs, a GPU job with its host thread) runs at the pace of its slowest pool.

Effective capacity: a profile times each stage alone, so a job alone gets the speed it was
measured at. Compute-bound processes sharing a pool slow each other down beyond what sharing
the cores explains (caches, memory bandwidth, hardware threads of one core): a pool may have a
``nominal`` capacity (its cores) above its effective one, and it offers the nominal one to a job
that runs alone, the effective one once others run beside it in earnest (the interference
grows with the share of the demand that is not the largest job's, so a sleeping simulator
beside a learner costs it nothing).

Jobs in one pool all progress at the pool's speed, so the pool keeps a virtual clock (the work
each of its jobs has done since it started) and a heap of the virtual times its jobs finish at:
an event costs O(log jobs + pools) (a 16-GPU, 512-env schedule at EBRL's step level, about
200,000 events, plays in about 1.5 s on a shared 2-core VM).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: a pool name and the capacity a job asks of it
Use = tuple[str, float]
#: (pool, demand) pairs
_Asks = tuple[tuple["_Pool", float], ...]
#: what a span records (``batch``, ``version``)
SpanArgs = tuple[tuple[str, float | int | str], ...]
#: the pool of jobs that only take time (a transfer that occupies nothing the model shares)
DELAY = "delay"
_EPS = 1e-10


class _Pool:
    """One pool's state: its jobs' demand, its speed, its virtual clock and its jobs' ends."""

    __slots__ = (
        "asks",
        "capacity",
        "count",
        "demand",
        "heap",
        "index",
        "multi",
        "name",
        "nominal",
        "speed",
        "version",
        "vt",
        "vt_at",
    )

    def __init__(self, name: str, index: int, capacity: float, nominal: float | None) -> None:
        self.name, self.index, self.capacity, self.nominal = name, index, capacity, nominal
        self.demand, self.count, self.speed = 0.0, 0, 1.0
        # the virtual clock (work each of its jobs has done) as of vt_at
        self.vt, self.vt_at = 0.0, 0.0
        self.heap: list[tuple[float, int, StageCall]] = []  # (virtual end, seq, job)
        self.version = 0  # bumped whenever its next end in real time changes
        self.multi: set[int] = set()  # several-pool jobs on it
        # a pool with a nominal capacity: how many of its jobs ask each demand (the largest
        # sets how much the others interfere)
        self.asks: dict[float, int] | None = {} if nominal is not None else None


@dataclass(eq=False, slots=True)
class StageCall:
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
    # the machine's: what it asks of each pool, its uses then its loads
    asked: tuple[tuple[_Pool, float], ...] = field(default=(), repr=False)
    # the machine's: (uses, loads, pacing pools, asked) as last resolved (a job object the
    # engine starts again and again resolves once)
    resolved: tuple[object, object, _Asks, _Asks] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ModelSpan:
    """A finished stage call, in the shape of ``ebrl.timeline.Span`` (seconds of model time)."""

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
    timers: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.capacity = {**self.capacity, DELAY: math.inf}
        # pools whose nominal capacity exceeds the effective one: their jobs' demands are kept
        nominal = {p: c for p, c in (self.nominal or {}).items() if c > self.capacity.get(p, c)}
        self._pools = {
            p: _Pool(p, i, c, nominal.get(p)) for i, (p, c) in enumerate(self.capacity.items())
        }
        self._by_index = list(self._pools.values())
        # a job's (uses, loads) resolved to pools: its pacing pools, and every pool it asks of
        self._resolved: dict[tuple[tuple[Use, ...], tuple[Use, ...]], tuple[_Asks, _Asks]] = {}
        # when each pool's next job ends (real time), kept current by version numbers: an
        # event touches a few pools, not all of them. A pool whose speed or first job changed
        # is recomputed once, before the clock moves on (every change at one instant gives
        # the end its last change gives)
        self._next: list[tuple[float, int, int]] = []  # (time, version, pool index)
        self._moved: set[_Pool] = set()
        # jobs on several pools: each runs at its slowest pool's speed; its finish time is
        # kept in a heap and recomputed (a new entry, the old one stale) when a speed changes
        self._multi: dict[int, StageCall] = {}
        self._finish: list[tuple[float, int, int]] = []  # (time, seq, its version)
        self._version: dict[int, int] = {}
        self._rate: dict[int, float] = {}
        self._since: dict[int, float] = {}
        self._seq = 0
        self._running: dict[int, StageCall] = {}
        self._timer_set: set[float] = set(self.timers)
        # finished jobs as (kind, track, start, end, args): ModelSpan objects only when asked for
        self.records: list[tuple[str, str, float, float, SpanArgs]] = []
        self._spans: list[ModelSpan] = []

    @property
    def spans(self) -> list[ModelSpan]:
        """Every finished job, in the order they ended."""
        for r in self.records[len(self._spans) :]:
            self._spans.append(ModelSpan(*r))
        return self._spans

    @property
    def running(self) -> list[StageCall]:
        return list(self._running.values())

    def _resolve(self, job: StageCall) -> tuple[_Asks, _Asks]:
        """A job's pacing pools and every pool it asks of, as (pool, demand) pairs (an unknown
        pool: KeyError)."""
        uses = job.uses or ((DELAY, 0.0),)
        for p, _ in (*uses, *job.loads):
            if p not in self._pools:
                raise KeyError(f"job {job.kind}@{job.track} uses pool {p!r}, which is not defined")
        paced = tuple((self._pools[p], d) for p, d in uses)
        out = paced, paced + tuple((self._pools[p], d) for p, d in job.loads)
        self._resolved[job.uses, job.loads] = out
        return out

    def add(self, job: StageCall) -> None:
        """Start ``job`` now."""
        r = job.resolved
        if r is not None and r[0] is job.uses and r[1] is job.loads:
            paced, asked = r[2], r[3]
        else:
            paced, asked = self._resolved.get((job.uses, job.loads)) or self._resolve(job)
            job.resolved = (job.uses, job.loads, paced, asked)
        job.asked = asked
        seq = job.seq = self._seq
        self._seq += 1
        now = job.start = self.now
        self._running[seq] = job
        for pool, d in asked:
            pool.count += 1
            pool.demand += d
            if pool.asks is not None:
                pool.asks[d] = pool.asks.get(d, 0) + 1
                self._respeed(pool)
            else:  # _respeed's plain case, inline (a pool is not empty after an add)
                d = pool.demand
                speed = 1.0 if d <= pool.capacity + 1e-9 else pool.capacity / d
                if speed != pool.speed:
                    self._set_speed(pool, speed)
        if len(paced) == 1:
            pool = paced[0][0]
            h = pool.heap
            end = pool.vt + pool.speed * (now - pool.vt_at) + job.work
            heapq.heappush(h, (end, seq, job))
            if h[0][2] is job:
                self._moved.add(pool)
        else:
            job.remaining = job.work
            self._multi[seq] = job
            self._version[seq] = 0
            self._rate[seq] = 0.0
            self._since[seq] = now
            for pool, _ in paced:
                pool.multi.add(seq)
            self._reschedule(job)

    def _respeed(self, pool: _Pool) -> None:
        if pool.count == 0:
            pool.demand = 0.0  # no float residue once the pool is empty
        d, cap = pool.demand, pool.capacity
        if pool.asks is not None and d > 0:
            # alone: the nominal cores; beside jobs asking as much: the effective ones
            nom = pool.nominal
            assert nom is not None
            beside = min(1.0, 2.0 * (d - max(pool.asks)) / d)
            cap = nom - (nom - cap) * beside
        speed = 1.0 if d <= cap + 1e-9 else cap / d
        if speed != pool.speed:
            self._set_speed(pool, speed)

    def _set_speed(self, pool: _Pool, speed: float) -> None:
        now = self.now
        pool.vt += pool.speed * (now - pool.vt_at)
        pool.vt_at = now
        pool.speed = speed
        self._moved.add(pool)
        for seq in pool.multi:
            self._reschedule(self._multi[seq])

    def _reschedule(self, job: StageCall) -> None:
        """Settle a several-pool job's work at its old rate, take the new one."""
        seq, now = job.seq, self.now
        job.remaining -= self._rate[seq] * (now - self._since[seq])
        rate = min(self._pools[p].speed for p, _ in job.uses)
        self._rate[seq], self._since[seq] = rate, now
        self._version[seq] += 1
        end = now + max(0.0, job.remaining) / rate
        heapq.heappush(self._finish, (end, seq, self._version[seq]))

    def _next_multi(self) -> float:
        """When the next several-pool job ends (stale entries dropped)."""
        f = self._finish
        while f and (f[0][1] not in self._multi or f[0][2] != self._version[f[0][1]]):
            heapq.heappop(f)
        return f[0][0] if f else math.inf

    def timer(self, at: float) -> None:
        """Wake the model at ``at`` (once per distinct time)."""
        if at not in self._timer_set:
            self._timer_set.add(at)
            heapq.heappush(self.timers, at)

    def advance(self) -> bool:
        """Run to the next completion or timer; False: nothing left to happen."""
        timers = self.timers
        if not self._running and not timers:
            return False
        n, pools, moved = self._next, self._by_index, self._moved
        if moved:  # the next end in real time of every pool whose speed or first job changed
            now = self.now
            for pool in moved:
                pool.version += 1
                h = pool.heap
                if h:
                    left = h[0][0] - (pool.vt + pool.speed * (now - pool.vt_at))
                    if left < 0.0:
                        left = 0.0
                    heapq.heappush(n, (now + left / pool.speed, pool.version, pool.index))
            moved.clear()
        while n and n[0][1] != pools[n[0][2]].version:  # stale
            heapq.heappop(n)
        at = n[0][0] if n else math.inf
        if self._multi:
            multi = self._next_multi()
            if multi < at:
                at = multi
        if timers and timers[0] < at:
            at = timers[0]
        now = self.now
        if at < now:
            at = now
        if not self._running:
            self.idle += at - now
        self.now = now = at
        due = now + _EPS
        while timers and timers[0] <= due:
            self._timer_set.discard(heapq.heappop(timers))
        finished: list[StageCall] = []
        while n and n[0][0] <= due:
            _, version, index = heapq.heappop(n)
            pool = pools[index]
            if version != pool.version:  # stale
                continue
            h = pool.heap
            clock = pool.vt + pool.speed * (now - pool.vt_at)
            while h and h[0][0] - clock <= _EPS:
                finished.append(heapq.heappop(h)[2])
            moved.add(pool)
        while self._multi and self._next_multi() <= due:
            _, seq, _ = heapq.heappop(self._finish)
            finished.append(self._multi.pop(seq))
        if len(finished) > 1:
            finished.sort(key=lambda j: j.seq)  # jobs that end together: in the order they began
            for j in finished:
                del self._running[j.seq]
                if j.seq in self._version:  # several pools
                    for pool, _ in j.asked:
                        pool.multi.discard(j.seq)
        elif finished:
            j = finished[0]
            del self._running[j.seq]
            if j.seq in self._version:
                for pool, _ in j.asked:
                    pool.multi.discard(j.seq)
        records = self.records
        for j in finished:
            for pool, d in j.asked:
                pool.count -= 1
                pool.demand -= d
                asks = pool.asks
                if asks is not None:
                    if asks[d] == 1:
                        del asks[d]
                    else:
                        asks[d] -= 1
                    self._respeed(pool)
                else:  # _respeed's plain case, inline
                    if pool.count == 0:
                        pool.demand = 0.0  # no float residue once the pool is empty
                    d = pool.demand
                    speed = 1.0 if d <= pool.capacity + 1e-9 else pool.capacity / d
                    if speed != pool.speed:
                        self._set_speed(pool, speed)
            records.append((j.kind, j.track, j.start, now, j.args))
        for j in finished:
            j.done()
        return True

    def busy(self, kind: str) -> float:
        """Seconds jobs of ``kind`` have run so far (finished and running, summed)."""
        done = sum(r[3] - r[2] for r in self.records if r[0] == kind)
        return done + sum(self.now - j.start for j in self._running.values() if j.kind == kind)
