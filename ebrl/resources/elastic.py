"""The elastic allocator at run time (the paper's Algorithm 1, online).

At run time :class:`ElasticAllocator` fires on either of two signals held for ``window``
consecutive steps: the stages diverge from each other by more than ``threshold`` relative to what
the allocation planned (:class:`DivergenceMonitor`), or a stage's throughput drifts more than
``threshold`` from its own level under the current allocation (:class:`DriftMonitor`: a slower
simulator slows the rollout and, on shared cores, training alike, which the first signal misses).
It then blends the measured throughputs into the profile and searches again (the levels are
set again after a new split or a drift, kept after a divergence that left the split), returning a
:class:`Reallocation` record (cause, old, new, when, and, once the caller applied it, what applying
cost).

Everything here is pure except the clock, which is injectable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ebrl.resources.monitors import DivergenceMonitor, DriftMonitor
from ebrl.resources.profiler import RateTable
from ebrl.resources.split import Allocation, Pool, allocate_with_sims, predict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reallocation:
    """One run-time reallocation decision.

    Attributes:
        cause: why (measured throughputs, divergence, window).
        old: the allocation in force.
        new: the allocation searched with the updated profile.
        decided_at: clock time of the decision (``time.time()`` by default).
        step: the caller's step counter at the decision, if given.
        measured_gen: mean gen throughput over the divergent window.
        measured_train: mean train throughput over it.
        measured_sim: mean simulator (rollout) throughput over it (nan: not measured).
        search_s: seconds the search took.
        apply_cost_s: seconds the stages spent applying it (their own work: torch threads,
            affinity, batch; a restart where a quota needs one), once reported.
        apply_latency_s: seconds from the decision until it was in force on every stage, once
            reported. A worker takes a reallocation between its calls, so this includes the
            rest of the update in flight; the stages keep working meanwhile, on the old split.
    """

    cause: str
    old: Allocation
    new: Allocation
    decided_at: float
    step: int | None = None
    measured_gen: float = 0.0
    measured_train: float = 0.0
    measured_sim: float = math.nan
    search_s: float = 0.0
    apply_cost_s: float | None = None
    apply_latency_s: float | None = None

    @property
    def changed(self) -> bool:
        """Whether there is anything to apply."""
        return not self.old.same_split(self.new)


class ElasticAllocator:
    """Algorithm 1 at run time: re-search the split when stage throughputs diverge or drift.

    Feed :meth:`observe` each step's stage *capacities* (items per busy second of each stage,
    e.g. from timeline spans), not wall-clock rates: in a pipeline the faster stage waits for
    the slower, so wall-clock rates converge whatever the split. ``sim`` is the rollout's rate
    (decisions/s of time not held back by the staleness bound), which the simulators set when
    the generator's capacity exceeds it.

    Two signals, each held ``window`` consecutive steps, fire a search: gen and train diverge by
    more than ``threshold`` relative to the throughputs the allocation predicted for them
    (``monitor``), or a stage drifts more than ``threshold`` from its own level under the current
    allocation (``drift``). On firing, each stage's curve in the profile is scaled by
    ``(1 - blend) + blend * measured / predicted`` at the current operating point: the whole
    curve shifts (episodes got shorter, a simulator slowed down), keeping its measured shape.
    A stage that drifted (its window mean away from its own level by more than ``threshold``)
    is scaled by ``measured / predicted`` in full: a window of steps away from its level is a
    new level, not noise to damp.
    The simulators' curve is scaled only when the rollout ran below the generator's capacity
    (else the rollout says nothing about them).

    Args:
        profile: the offline profile.
        pool: what gen and train split.
        monitor: the divergence trigger (default 15% for 20 steps).
        blend: weight of runtime measurements against the profile, in (0, 1].
        max_gen_batch: passed to :func:`allocate`.
        max_train_batch: passed to :func:`allocate`.
        clock: wall clock for ``decided_at``.
        sim_workers: env worker processes (with the profile's ``sim`` stage: the simulators'
            rate, :func:`sim_rate`; 0: not modelled).
        sim_batch: envs per worker (which profiled ``sim`` batch to read).
        headroom: passed to :func:`allocate`.
    """

    def __init__(
        self,
        profile: RateTable,
        pool: Pool,
        monitor: DivergenceMonitor | None = None,
        blend: float = 0.5,
        max_gen_batch: int | None = None,
        max_train_batch: int | None = None,
        clock: Callable[[], float] = time.time,
        *,
        sim_workers: int = 0,
        sim_batch: int | None = None,
        headroom: float = 0.15,
    ) -> None:
        if not 0.0 < blend <= 1.0:
            raise ValueError(f"ElasticAllocator: blend={blend} must be in (0, 1]")
        self.profile = profile
        self.pool = pool
        self.monitor = monitor or DivergenceMonitor()
        self.drift = DriftMonitor(self.monitor.threshold, self.monitor.window)
        self.blend = blend
        self.limits = (max_gen_batch, max_train_batch)
        self.clock = clock
        self.sim_workers = sim_workers
        self.sim_batch = sim_batch
        self.headroom = headroom
        self.current = self.search(profile)
        self.history: list[Reallocation] = []
        self._gen: deque[float] = deque(maxlen=self.monitor.window)
        self._train: deque[float] = deque(maxlen=self.monitor.window)
        self._sim: deque[float] = deque(maxlen=self.monitor.window)
        log.info("initial allocation: %s", self.current.describe())

    def search(self, profile: RateTable) -> Allocation:
        """:func:`allocate_with_sims` with this allocator's pool, limits and simulators."""
        return allocate_with_sims(
            profile, self.pool, self.sim_workers, self.sim_batch, *self.limits, self.headroom
        )

    def observe(
        self,
        gen_throughput: float,
        train_throughput: float,
        step: int | None = None,
        sim_throughput: float | None = None,
    ) -> Reallocation | None:
        """Feed one step's measured stage capacities; a :class:`Reallocation` when it fires.

        The record is returned (and kept in :attr:`history`) even when the new search lands on
        the same split: ``changed`` says whether to apply it.
        """
        cur = self.current
        self._gen.append(gen_throughput)
        self._train.append(train_throughput)
        sim = math.nan if sim_throughput is None else float(sim_throughput)
        self._sim.append(sim)
        pg = predict(self.profile, "gen", cur.gen_units, cur.gen_batch)
        pt = predict(self.profile, "train", cur.train_units, cur.train_batch)
        diverged = self.monitor.update(
            gen_throughput / pg if pg > 0 else gen_throughput,
            train_throughput / pt if pt > 0 else train_throughput,
        )
        rates = {"gen": gen_throughput, "train": train_throughput, "sim": sim}
        drifted = self.drift.update(rates)
        if not (diverged or drifted):
            return None
        mg = sum(self._gen) / len(self._gen)
        mt = sum(self._train) / len(self._train)
        sims = [x for x in self._sim if math.isfinite(x)]
        ms = sum(sims) / len(sims) if sims else math.nan
        w, th = self.monitor.window, self.monitor.threshold
        why = []
        if diverged:
            why.append(
                f"gen {mg:.1f}/s vs train {mt:.1f}/s: diverged more than {th:.0%} from the "
                f"planned {pg:.1f}/s vs {pt:.1f}/s for {w} consecutive steps "
                f"(last {self.monitor.last:.0%})"
            )
        if drifted:
            levels = ", ".join(f"{k} {v:.1f}/s" for k, v in sorted(self.drift.levels.items()))
            why.append(
                f"{self.drift.stage} drifted more than {th:.0%} from its level under this "
                f"allocation ({levels}) for {w} consecutive steps (last {self.drift.last:.0%}; "
                f"now gen {mg:.1f}/s, train {mt:.1f}/s"
                + (f", rollout {ms:.1f}/s)" if math.isfinite(ms) else ")")
            )
        cause = "; ".join(why)
        t0 = time.perf_counter()
        prof = self.profile
        predicted = {"gen": pg, "train": pt}  # at the current split, before any rescaling
        measured = {"gen": mg, "train": mt}
        if math.isfinite(ms) and math.isfinite(cur.sim_throughput) and ms < mg * (1 - th):
            # the rollout ran below the generator's capacity: the simulators set it
            predicted["sim"], measured["sim"] = cur.sim_throughput, ms
        # the stages whose window mean left their own level (every one of them, not only the
        # worst of the firing step)
        moved = {
            k
            for k, level in self.drift.levels.items()
            if drifted and k in measured and abs(measured[k] / level - 1.0) > th
        }
        for stage, p in predicted.items():
            if p > 0 and math.isfinite(measured[stage]):
                # a stage that drifted from its own level for a whole window has a new level:
                # taken as measured (blended, one firing would move the model only halfway, and
                # the split could stay wrong until the next window); a divergence from the plan
                # is blended with the profile
                w = 1.0 if stage in moved else self.blend
                prof = prof.scaled(stage, (1 - w) + w * measured[stage] / p)
        self.profile = prof
        new = self.search(prof)
        r = Reallocation(
            cause=cause,
            old=cur,
            new=new,
            decided_at=self.clock(),
            step=step,
            measured_gen=mg,
            measured_train=mt,
            measured_sim=ms,
            search_s=time.perf_counter() - t0,
        )
        self.current = new
        self._gen.clear()
        self._train.clear()
        self._sim.clear()
        self.monitor.reset()
        if r.changed or drifted:
            self.drift.reset()  # a new split, or a new normal accepted: levels are set again
        else:
            self.drift.streak = 0  # same split, same levels: a later slowdown still shows
        self.history.append(r)
        log.info(
            "reallocation%s at step %s: %s; %s -> %s (search %.2f ms)",
            "" if r.changed else " (split unchanged)",
            step,
            cause,
            cur.describe(),
            new.describe(),
            r.search_s * 1e3,
        )
        return r

    def applied(
        self, realloc: Reallocation, cost_s: float, latency_s: float | None = None
    ) -> Reallocation:
        """Record what applying ``realloc`` cost the stages (``cost_s``) and how long after the
        decision it was in force everywhere (``latency_s``; by default the cost: applied at
        once)."""
        latency = cost_s if latency_s is None else latency_s
        done = dataclasses.replace(realloc, apply_cost_s=cost_s, apply_latency_s=latency)
        for i, r in enumerate(self.history):
            if r is realloc:
                self.history[i] = done
        log.info(
            "reallocation applied (work %.3f s, in force %.3f s after the decision): %s",
            cost_s,
            latency,
            realloc.new.describe(),
        )
        return done

    @contextlib.contextmanager
    def applying(self, realloc: Reallocation) -> Iterator[None]:
        """Time the ``with`` block as the cost of applying ``realloc`` (recorded on success)."""
        t0 = time.perf_counter()
        yield
        self.applied(realloc, time.perf_counter() - t0)
