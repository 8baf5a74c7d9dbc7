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
an event costs O(log jobs + pools), which keeps a 16-GPU, 512-env schedule within a second.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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
