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
from ebrl.resources.model import Prediction, Shape, StageCosts, Workload, candidates, choose

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
    """What the search chose, from what, and what it cost."""

    shape: Shape
    ranked: tuple[Prediction, ...]
    costs: StageCosts
    measure_s: float
    search_s: float

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
) -> ShapeChoice:
    """Choose among the candidate shapes; a pinned knob (not None) is not searched."""
    t0 = time.perf_counter()
    shapes = candidates(
        work,
        groups=groups,
        step_level=(False, True) if step_level is None else (step_level,),
        batch_min=batch_min,
        timeout_s=timeout_s,
    )
    shape, ranked = choose(costs, work, shapes)
    choice = ShapeChoice(shape, tuple(ranked), costs, measure_s, time.perf_counter() - t0)
    log.info("shape: %s", choice.describe())
    return choice


def gen_batches_for(work: Workload) -> list[int]:
    """Generator batch sizes to time: every M and group size a candidate could call with."""
    sizes = {1, work.num_envs}
    for s in candidates(work):
        sizes.add(s.batch_min)
        sizes.add(math.ceil(work.num_envs / s.groups))
    return sorted(sizes)
