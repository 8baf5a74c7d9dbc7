"""The run's shape (env groups G, step level, M), chosen from a short profile of its own stages.

``measure`` times this run's simulator env by env, its generator at a few batch sizes and one
learner update, on the threads the run will use (about two seconds on the embedded default);
``search`` plays every candidate shape through the schedule model (``ebrl.resources.model``) on
those costs and keeps the fastest, unless a simpler shape is within 2% of it. Where the step
costs are uniform and the simulators keep every core busy, that is one group in lock step (the
Async schedule); where the simulators wait or their step latency has a tail, pipelining and the
step level pay, and the search takes them.

The layer knows stages only through the callables it is given: it does not import the policies,
the algorithms or the env groups.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ebrl.resources.apply import affinity_guard, threads_guard
from ebrl.resources.model import (
    Prediction,
    Shape,
    StageCosts,
    Workload,
    candidates,
    choose,
    fit_cores,
)

log = logging.getLogger(__name__)

#: step one env's chunk: env index -> None (the sampler times it)
StepOne = Callable[[int], None]
#: one generator call on a batch of this many envs
GenCall = Callable[[int], None]


@dataclass(frozen=True)
class Probes:
    """The run's stages as the shape search times them.

    Attributes:
        sim_envs: envs of one env worker, ready to step.
        step_one: steps env ``i`` (0 <= i < sim_envs) through one chunk.
        gen_call: one generator call on a batch of ``b`` envs.
        train_update: one whole learner update (every epoch of one segment).
        close: releases what the probes built.
        train_warm: the learner's warm-up before it is timed (None: a whole update; one
            minibatch step is enough to allocate and fill the caches).
    """

    sim_envs: int
    step_one: StepOne
    gen_call: GenCall
    train_update: Callable[[], None]
    close: Callable[[], None] = lambda: None
    train_warm: Callable[[], None] | None = None


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall, CPU) seconds of one call (CPU: this process, all threads)."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def measure(
    probes: Probes,
    gen_batches: Sequence[int],
    sim_rounds: int = 3,
    gen_repeats: int = 3,
    sim_budget_s: float = 0.25,
    sim_samples: int = 256,
) -> tuple[StageCosts, float]:
    """The stage costs of ``probes`` and the seconds it took to measure them.

    Each stage gets one untimed warm-up call. The simulator steps every env ``sim_rounds``
    times, and more rounds while it stays under ``sim_budget_s`` and ``sim_samples`` chunks (a
    cheap simulator's tail needs many samples to show). The generator's cost per call is fitted
    as ``fixed + per_env * batch`` over ``gen_batches`` (least squares on the median of
    ``gen_repeats`` calls each).
    """
    t0 = time.perf_counter()
    with threads_guard(), affinity_guard():
        try:
            probes.step_one(0)
            walls: list[float] = []
            cpus: list[float] = []
            rounds = 0
            while rounds < sim_rounds or (
                sum(walls) < sim_budget_s and len(walls) + probes.sim_envs <= sim_samples
            ):
                for i in range(probes.sim_envs):
                    w, c = _timed(lambda i=i: probes.step_one(i))
                    walls.append(w)
                    cpus.append(c)
                rounds += 1
            batches = sorted({max(1, int(b)) for b in gen_batches})
            per_call, gen_wall, gen_cpu = [], 0.0, 0.0
            for b in batches:
                probes.gen_call(b)
                runs = [_timed(lambda b=b: probes.gen_call(b)) for _ in range(gen_repeats)]
                per_call.append(float(np.median([w for w, _ in runs])))
                gen_wall += sum(w for w, _ in runs)
                gen_cpu += sum(c for _, c in runs)
            if len(batches) > 1:
                slope, fixed = np.polyfit(np.array(batches, float), np.array(per_call), 1)
                slope, fixed = max(0.0, float(slope)), max(0.0, float(fixed))
            else:
                slope, fixed = per_call[0] / batches[0], 0.0
            (probes.train_warm or probes.train_update)()
            train_wall, train_cpu = _timed(probes.train_update)
        finally:
            probes.close()
    costs = StageCosts(
        sim_chunk_s=tuple(walls),
        sim_busy=min(1.0, sum(cpus) / sum(walls)),
        gen_fixed_s=fixed,
        gen_per_env_s=slope,
        gen_busy=gen_cpu / gen_wall if gen_wall > 0 else 1.0,
        train_s=train_wall,
        train_busy=train_cpu / train_wall if train_wall > 0 else 1.0,
    )
    return costs, time.perf_counter() - t0


@dataclass(frozen=True)
class ShapeChoice:
    """What the search chose, from what, and what it cost.

    Attributes:
        shape: the choice.
        ranked: every candidate's prediction, best first.
        costs: the stage costs measured at start.
        measure_s: seconds the profile took; search_s: the search.
        work: the workload the search played (its ``cores``: the cores the run was given).
        shapes: the candidates, simplest first (what :func:`recalibrate` weighs again).
        recalibration: what the run itself measured later (:func:`recalibrate`), if it has.
    """

    shape: Shape
    ranked: tuple[Prediction, ...]
    costs: StageCosts
    measure_s: float
    search_s: float
    work: Workload | None = None
    shapes: tuple[Shape, ...] = ()
    recalibration: Recalibration | None = None

    def describe(self) -> str:
        best, ours = self.ranked[0].throughput, self.predicted()
        return (
            f"{self.shape.describe()} (predicted {ours:.0f} env steps/s, best {best:.0f}; "
            f"profile {self.measure_s:.1f} s, search {self.search_s:.2f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        c = self.costs
        return {
            "shape": self.shape.to_dict(),
            "profile_s": self.measure_s,
            "search_s": self.search_s,
            "costs": {
                "sim_chunk_mean_s": c.sim_mean_s,
                "sim_tail_p99_over_mean": c.tail,
                "sim_busy": c.sim_busy,
                "gen_fixed_s": c.gen_fixed_s,
                "gen_per_env_s": c.gen_per_env_s,
                "gen_busy": c.gen_busy,
                "train_s": c.train_s,
                "train_busy": c.train_busy,
                "message_s": c.message_s,
            },
            "predictions": [
                {
                    **p.shape.to_dict(),
                    "throughput": p.throughput,
                    "gen_busy": p.gen_busy,
                    "train_busy": p.train_busy,
                    "mean_batch": p.mean_batch,
                    "bubble": p.bubble,
                }
                for p in self.ranked
            ],
            **({"recalibration": self.recalibration.to_dict()} if self.recalibration else {}),
        }

    def predicted(self) -> float:
        """The chosen shape's predicted env steps per second."""
        return next(p.throughput for p in self.ranked if p.shape == self.shape)

    def metrics(self) -> dict[str, float]:
        """MLflow metrics of the search: its cost and its prediction."""
        return {
            "shape/profile_s": self.measure_s,
            "shape/search_s": self.search_s,
            "shape/predicted_env_steps_per_s": self.predicted(),
        }

    def params(self) -> dict[str, Any]:
        """MLflow params of the choice."""
        return {
            "shape/env_groups": self.shape.groups,
            "shape/step_level": self.shape.step_level,
            "shape/batch_min": self.shape.batch_min if self.shape.step_level else "none",
            "shape/batch_max": self.shape.cap if self.shape.step_level else "none",
        }

    def save(self, run_dir: Path) -> Path:
        path = Path(run_dir) / "shape.json"
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def search(
    costs: StageCosts,
    work: Workload,
    groups: Sequence[int] | None,
    step_level: bool | None,
    batch_min: int | None,
    timeout_s: float,
    measure_s: float = 0.0,
    batch_max: int | None = None,
) -> ShapeChoice:
    """Choose among the candidate shapes; a pinned knob (not None) is not searched."""
    t0 = time.perf_counter()
    shapes = candidates(
        work,
        groups=groups,
        step_level=(False, True) if step_level is None else (step_level,),
        batch_min=batch_min,
        timeout_s=timeout_s,
        batch_max=batch_max,
    )
    shape, ranked = choose(costs, work, shapes)
    took = time.perf_counter() - t0
    choice = ShapeChoice(shape, tuple(ranked), costs, measure_s, took, work, tuple(shapes))
    log.info("shape: %s", choice.describe())
    return choice


def gen_batches_for(work: Workload) -> list[int]:
    """Generator batch sizes to time: every M and group size a candidate could call with."""
    sizes = {1, work.num_envs}
    for s in candidates(work):
        sizes.add(s.batch_min)
        sizes.add(math.ceil(work.num_envs / s.groups))
    return sorted(sizes)


@dataclass(frozen=True)
class Recalibration:
    """The model held against the run itself, once it has run its first shape for a while.

    Attributes:
        measured: env steps per second the run made with ``before`` (its steady updates).
        predicted: what the start-up model predicted for ``before``.
        cores: the machine's effective cores that make the model predict ``measured``
            (:func:`ebrl.resources.model.fit_cores`), below the cores it was given where the
            solo profile misses contention.
        ranked: every candidate's prediction at those cores, best first.
        before: the shape the run started with; after: the one it runs from now on.
        seconds: what refitting and re-ranking cost (the driver's CPU, once).
    """

    measured: float
    predicted: float
    cores: float
    ranked: tuple[Prediction, ...]
    before: Shape
    after: Shape
    seconds: float

    @property
    def changed(self) -> bool:
        return self.after != self.before

    def describe(self) -> str:
        move = f"-> {self.after.describe()}" if self.changed else "kept"
        return (
            f"measured {self.measured:.0f} env steps/s with {self.before.describe()} (predicted "
            f"{self.predicted:.0f}): {self.cores:.2f} effective cores; {move} "
            f"({self.seconds:.2f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured": self.measured,
            "predicted": self.predicted,
            "cores_effective": self.cores,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "seconds": self.seconds,
            "predictions": [{**p.shape.to_dict(), "throughput": p.throughput} for p in self.ranked],
        }

    def metrics(self) -> dict[str, float]:
        return {
            "shape/cores_effective": self.cores,
            "shape/measured_env_steps_per_s": self.measured,
            "shape/reshaped": float(self.changed),
            "shape/recalibrate_s": self.seconds,
        }


def recalibrate(choice: ShapeChoice, measured: float, margin: float = 0.03) -> Recalibration:
    """Refit the model to the rate the run measured with its shape (one number: the machine's
    effective cores), rank the candidates again at that capacity, and keep the shape unless
    another is predicted faster by more than ``margin`` (a simpler one within 2% still wins,
    as at start)."""
    t0 = time.perf_counter()
    assert choice.work is not None, "a ShapeChoice made by search() carries its workload"
    cores = fit_cores(choice.costs, choice.work, choice.shape, measured)
    work = dataclasses.replace(choice.work, cores=cores)
    best, ranked = choose(choice.costs, work, choice.shapes or (choice.shape,))
    ours = next((p.throughput for p in ranked if p.shape == choice.shape), 0.0)
    gain = next(p.throughput for p in ranked if p.shape == best) / max(ours, 1e-9) - 1
    after = best if gain > margin else choice.shape
    rec = Recalibration(
        measured, choice.predicted(), cores, tuple(ranked), choice.shape, after,
        time.perf_counter() - t0,
    )  # fmt: skip
    log.info("shape: %s", rec.describe())
    return rec


class SteadyRate:
    """The env steps per second of ``window`` updates after ``warmup`` of them, from the times
    the updates' reports arrive (what :func:`recalibrate` is given).

    Args:
        warmup: updates skipped (start-up is not steady).
        window: updates measured.
    """

    def __init__(self, warmup: int, window: int) -> None:
        self.warmup, self.window = max(1, warmup), max(1, window)
        self.seen = 0
        self.start: tuple[float, int] | None = None
        self.steps = 0
        self.done = False

    def add(self, at: float, env_steps: int) -> float | None:
        """One update's report arrived at ``at`` (seconds) with ``env_steps``; the rate once
        the window is complete (once), else None."""
        self.seen += 1
        if self.done:
            return None
        if self.seen == self.warmup:
            self.start = (at, 0)
            return None
        if self.start is None:
            return None
        self.steps += env_steps
        if self.seen < self.warmup + self.window:
            return None
        self.done = True
        return self.steps / max(at - self.start[0], 1e-9)
