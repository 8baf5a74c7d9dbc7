"""The shape search's side of the model: the candidate shapes, their ranking, the choice, and the
machine's effective cores fitted to a measured rate."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ebrl.resources.model.engine import simulate
from ebrl.resources.model.types import (
    CostTable,
    Layout,
    Prediction,
    Shape,
    Split,
    StageCosts,
    Workload,
    costs_for,
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
        caps: list[int | None] = [batch_max] if batch_max else [None, n]
        for m in ms:
            # a cap of M (or below) is the first M of N itself
            kept = dict.fromkeys(None if cap is None or cap <= m else cap for cap in caps)
            out += [Shape(g, True, m, timeout_s, cap) for cap in kept]
    return out


def mean_prediction(runs: Sequence[Prediction]) -> Prediction:
    """The mean of one shape's predictions over seeds (every figure averaged)."""
    keys = {s for r in runs for s in r.stage_busy}
    k = max(len(r.staleness) for r in runs)
    return Prediction(
        shape=runs[0].shape,
        throughput=float(np.mean([r.throughput for r in runs])),
        gen_busy=float(np.mean([r.gen_busy for r in runs])),
        train_busy=float(np.mean([r.train_busy for r in runs])),
        mean_batch=float(np.mean([r.mean_batch for r in runs])),
        bubble=float(np.mean([r.bubble for r in runs])),
        update_s=float(np.mean([r.update_s for r in runs])),
        staleness=tuple(
            float(np.mean([r.staleness[i] if i < len(r.staleness) else 0.0 for r in runs]))
            for i in range(k)
        ),
        stage_busy={s: float(np.mean([r.stage_busy.get(s, 0.0) for r in runs])) for s in keys},
        stage_util={s: float(np.mean([r.stage_util.get(s, 0.0) for r in runs])) for s in keys},
    )


def thread_options(most: int) -> tuple[int, ...]:
    """Thread counts a stage given ``most`` may run with: powers of two below it, and it."""
    out = {most}
    t = 1
    while t < most:
        out.add(t)
        t *= 2
    return tuple(sorted(out))


def splits_of(gen_threads: Sequence[int], train_threads: Sequence[int]) -> list[Split]:
    """Every (gen, train) split of the options, fewest threads first."""
    return sorted(((g, t) for g in gen_threads for t in train_threads), key=lambda s: (sum(s), s))


def with_threads(shapes: Sequence[Shape], splits: Sequence[Split]) -> list[Shape]:
    """Each shape at each thread split, the splits in the order given (fewest threads first:
    a split that gains nothing leaves the cores to the others)."""
    return [dataclasses.replace(s, threads=(t[0], t[1])) for s in shapes for t in splits]


def rank(
    costs: StageCosts | CostTable,
    work: Workload,
    shapes: Sequence[Shape],
    seeds: Sequence[int] = (0, 1),
    layout: Layout | None = None,
    updates: int = 8,
    warmup: int = 2,
) -> list[Prediction]:
    """Every shape's prediction (mean over ``seeds`` of the replayed tail), best first; ties go
    to the simpler shape (fewer groups, lock step), the order of ``shapes``. With a table of
    costs by thread split, each shape plays its own split's (:func:`costs_for`)."""
    preds = [
        mean_prediction(
            [
                simulate(costs_for(costs, s), work, s, updates, warmup, seed=sd, layout=layout)
                for sd in seeds
            ]
        )
        for s in shapes
    ]
    order = sorted(range(len(preds)), key=lambda i: (-round(preds[i].throughput, 6), i))
    return [preds[i] for i in order]


def choose(
    costs: StageCosts | CostTable,
    work: Workload,
    shapes: Sequence[Shape],
    margin: float = 0.02,
    layout: Layout | None = None,
    seeds: Sequence[int] = (0, 1),
    updates: int = 8,
    warmup: int = 2,
) -> tuple[Shape, list[Prediction]]:
    """The shape to run: the best predicted, unless a simpler one (earlier in ``shapes``) is
    within ``margin`` of it (a gain the model cannot resolve is not worth the machinery)."""
    ranked = rank(costs, work, shapes, seeds, layout, updates, warmup)
    best = ranked[0].throughput
    for s in shapes:
        p = next(p for p in ranked if p.shape == s)
        if p.throughput >= best * (1 - margin):
            return s, ranked
    return ranked[0].shape, ranked


def fit_cores(
    costs: StageCosts | CostTable,
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

    at = costs_for(costs, shape)

    def rate(cores: float) -> float:
        w = dataclasses.replace(work, cores=cores)
        return float(np.mean([simulate(at, w, shape, seed=sd).throughput for sd in seeds]))

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
