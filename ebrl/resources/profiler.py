"""Offline profiler: a stage's throughput as a function of its share and batch size.

A *stage function* ``stage_fn(share, batch_size) -> step`` prepares one measurement point (sets
threads, builds inputs) and returns ``step() -> items``, one unit of work that reports how many
items it processed; a step with a ``close`` attribute has it called after its point (envs).
:func:`profile` times ``repeats`` steps per point after one warm-up step into a
:class:`RateTable`, the in-memory table Algorithm 1 (``ebrl.resources.split``) reads.
The share is whatever the pool is counted in: torch threads (= cores) on CPU, SM percent on GPU.

The stage functions of ebrl's own stages (a policy acting, PPO updates, an env group stepping)
are in :mod:`ebrl.stages.profile`: this layer knows stages only through the callables it is
given. A table is stored as a stage-profile file (``ebrl-plan-profile/1``,
:class:`ebrl.plan.profile.Profile`); :func:`rate_table` reads one back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ebrl.plan.profile import Profile
from ebrl.resources.apply import affinity_guard, threads_guard

Step = Callable[[], float]
StageFn = Callable[[int, int], Step]


@dataclass(frozen=True)
class RatePoint:
    """Throughput of one stage at one (share, batch size).

    Attributes:
        stage: ``gen``, ``train``, ``sim``.
        share: threads/cores on CPU, SM percent on GPU.
        batch_size: items per step the stage was asked for (train read from a profile file:
            the decisions of an update, every minibatch; sim: 1, one worker).
        throughput: median over repeats of items per second (robust to a preempted repeat on
            a busy machine).
        samples: items per second of each repeat (their spread is the noise).
        busy_cores: CPU seconds per wall second while it ran (this process's CPU time over all
            its threads, median over repeats): the cores the stage keeps busy at this share.
            Threads that wait at a synchronisation point sleep (``OMP_WAIT_POLICY=PASSIVE``),
            so a 2-thread learner may keep 1.2 cores busy, not 2. None: not measured (a table
            made by hand), and the allocator then counts the whole share as busy.
    """

    stage: str
    share: int
    batch_size: int
    throughput: float
    samples: tuple[float, ...] = ()
    busy_cores: float | None = None


def machine_description() -> dict[str, Any]:
    """What the numbers were measured on."""
    from ebrl.resources.topology import discover

    try:
        topo = discover().describe()
    except Exception as e:  # a profile is still worth saving on an odd machine
        topo = f"unknown ({e})"
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "topology": topo,
    }


@dataclass
class RateTable:
    """Throughputs of one or more stages, by (share, batch size): what Algorithm 1 reads.

    Attributes:
        points: one per (stage, share, batch size).
        share_unit: what shares count: ``threads`` (CPU) or ``sm_percent`` (GPU).
        machine: :func:`machine_description` of where it was measured.
        created: ISO timestamp.
        workload: the config of what was measured (policy sizes, env, ...), per stage.
        duration_s: seconds profiling took, per stage.
    """

    points: list[RatePoint]
    share_unit: str = "threads"
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    workload: dict[str, Any] = field(default_factory=dict)
    duration_s: dict[str, float] = field(default_factory=dict)

    # -- queries --------------------------------------------------------------------------------
    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(sorted({p.stage for p in self.points}))

    def shares(self, stage: str) -> tuple[int, ...]:
        return tuple(sorted({p.share for p in self.points if p.stage == stage}))

    def batch_sizes(self, stage: str) -> tuple[int, ...]:
        return tuple(sorted({p.batch_size for p in self.points if p.stage == stage}))

    def point(self, stage: str, share: int, batch_size: int) -> RatePoint | None:
        """The profiled point at (stage, share, batch size), or None."""
        for p in self.points:
            if (p.stage, p.share, p.batch_size) == (stage, share, batch_size):
                return p
        return None

    def throughput(self, stage: str, share: int, batch_size: int) -> float:
        """The measured throughput at a profiled point."""
        p = self.point(stage, share, batch_size)
        if p is None:
            raise KeyError(
                f"no {stage} point at share={share}, batch={batch_size}; profiled shares "
                f"{self.shares(stage)}, batch sizes {self.batch_sizes(stage)}"
            )
        return p.throughput

    def busy(self, stage: str, share: int, batch_size: int) -> float:
        """The cores a stage keeps busy at ``share``: the profiled :attr:`RatePoint.busy_cores`
        where that point was measured with it, else the share itself (every unit busy)."""
        p = self.point(stage, share, batch_size)
        return float(share) if p is None or p.busy_cores is None else p.busy_cores

    def curve(self, stage: str, batch_size: int) -> list[tuple[int, float]]:
        """(share, throughput) of one stage at one batch size, by share."""
        pts = [p for p in self.points if p.stage == stage and p.batch_size == batch_size]
        return sorted((p.share, p.throughput) for p in pts)

    def scaled(self, stage: str, factor: float) -> RateTable:
        """A copy with one stage's throughputs multiplied by ``factor`` (runtime feedback).

        Busy cores are kept: a stage that got slower (heavier work, a slower simulator) keeps
        its threads as busy as before, each item then costing ``1 / factor`` times the CPU.
        """
        pts = [
            dataclasses.replace(
                p, throughput=p.throughput * factor, samples=tuple(s * factor for s in p.samples)
            )
            if p.stage == stage
            else p
            for p in self.points
        ]
        return dataclasses.replace(self, points=pts)

    def merge(self, other: RateTable) -> RateTable:
        """Both profiles' points (``other`` wins where both measured a point)."""
        if other.share_unit != self.share_unit:
            raise ValueError(
                f"RateTable.merge: share units differ ({self.share_unit} vs {other.share_unit})"
            )
        keep = {(p.stage, p.share, p.batch_size): p for p in self.points}
        keep.update({(p.stage, p.share, p.batch_size): p for p in other.points})
        return RateTable(
            points=sorted(keep.values(), key=lambda p: (p.stage, p.batch_size, p.share)),
            share_unit=self.share_unit,
            machine=other.machine or self.machine,
            created=max(self.created, other.created),
            workload={**self.workload, **other.workload},
            duration_s={**self.duration_s, **other.duration_s},
        )

    def compare(self, other: RateTable) -> dict[tuple[str, int, int], float]:
        """Throughput ratios ``self / other`` at every point both profiles measured.

        Keys are ``(stage, share, batch_size)``; a ratio above 1 means ``self`` is faster.
        """
        theirs = {(p.stage, p.share, p.batch_size): p.throughput for p in other.points}
        out = {}
        for p in self.points:
            key = (p.stage, p.share, p.batch_size)
            if key in theirs:
                out[key] = p.throughput / theirs[key] if theirs[key] > 0 else math.inf
        return out


def profile(
    stage_fn: StageFn,
    shares: Sequence[int],
    batch_sizes: Sequence[int],
    repeats: int = 3,
    *,
    stage: str = "stage",
    share_unit: str = "threads",
    workload: dict[str, Any] | None = None,
    min_step_s: float = 0.0,
) -> RateTable:
    """Measure ``stage_fn`` at every (share, batch size).

    Each point: ``step = stage_fn(share, batch)``, one untimed warm-up step, then ``repeats``
    timed repeats of at least one step (and at least ``min_step_s``); the point's throughput is
    the median repeat's, and its busy cores the median of the repeats' CPU time over wall time
    (this process's, all threads). torch's thread count and this process's affinity are
    restored afterwards, whatever the stage function set.

    Args:
        stage_fn: ``(share, batch_size) -> step``; ``step() -> items processed``.
        shares: shares to try (threads on CPU, SM percent on GPU).
        batch_sizes: batch sizes to try.
        repeats: timed steps per point.
        stage: the stage's name in the profile.
        share_unit: what ``shares`` count.
        workload: config of what is measured, stored with the profile.
        min_step_s: each repeat runs steps until it lasted at least this long (steadier timing
            of steps shorter than the scheduler's time slice).
    """
    if repeats < 1:
        raise ValueError("profile: repeats must be >= 1")
    t0 = time.perf_counter()
    points = []
    with threads_guard(), affinity_guard():
        for share in shares:
            for batch in batch_sizes:
                step = stage_fn(int(share), int(batch))
                try:
                    step()  # warm-up: allocations, lazy init, caches
                    samples, busy = [], []
                    for _ in range(repeats):
                        items, start, cpu = 0.0, time.perf_counter(), time.process_time()
                        while True:
                            items += step()
                            secs = time.perf_counter() - start
                            if secs >= min_step_s:
                                break
                        samples.append(items / secs if secs > 0 else math.inf)
                        busy.append((time.process_time() - cpu) / secs if secs > 0 else 0.0)
                finally:
                    close = getattr(step, "close", None)
                    if close is not None:
                        close()
                tput = float(np.median(samples))
                cores = float(np.median(busy))
                points.append(RatePoint(stage, int(share), int(batch), tput, tuple(samples), cores))
    return RateTable(
        points=points,
        share_unit=share_unit,
        machine=machine_description(),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        workload={stage: dict(workload or {})},
        duration_s={stage: time.perf_counter() - t0},
    )


def rate_table(profile: Profile, sizes: Mapping[str, int] | None = None) -> RateTable:
    """A stage-profile file (:class:`~ebrl.plan.profile.Profile`, ``ebrl-plan-profile/1``) as
    Algorithm 1's table, on CPU threads and GPU SM shares alike: each of gen's and train's
    measured levels (threads, or a GPU share in SM percent) with the stage's items per second,
    and the simulators' ``sim`` rate (one worker, one core: 1 / its mean chunk seconds).

    Without ``sizes`` a stage's entries are its measured points, each ``size / seconds`` (a
    point written from a measured rate ``x`` as ``b / x`` seconds reads back as ``x``); a
    stage given a size in ``sizes`` gets one entry per level, at that size, from the level's
    fitted cost (:meth:`~ebrl.plan.profile.StageProfile.curve`): the GPU split asks the run's
    generator batch and learner samples, which need not have been measured.

    Raises:
        ValueError: gen measured on a CPU and train on a GPU, or the other way round.
    """
    devices = {profile.gen.device, profile.train.device}
    if len(devices) > 1:
        raise ValueError(f"a profile's gen and train are on one device, not {sorted(devices)}")
    gpu = devices == {"gpu"}

    def share(level: float) -> int:
        return round(100 * level) if gpu else int(level)

    points = []
    for stage, prof in (("gen", profile.gen), ("train", profile.train)):
        if sizes is not None and stage in sizes:
            n = sizes[stage]
            for level in prof.levels():
                c = prof.curve(level)
                points.append(RatePoint(stage, share(level), n, n / c.seconds(n), (), c.busy))
            continue
        for p in prof.points:
            reps = tuple(p.size / s for s in p.repeats_s)
            rate = p.size / p.seconds
            points.append(RatePoint(stage, share(p.level), p.size, rate, reps, p.busy))
    per_env = float(np.mean(profile.chunk_s))
    points.append(RatePoint("sim", 1, 1, 1.0 / per_env, (), profile.sim_busy))
    return RateTable(points, share_unit="sm_percent" if gpu else "threads")
