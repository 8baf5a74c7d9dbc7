"""Brute-force references for the elastic allocator's searches (``ebrl.resources.split``): every
split tried, what the binary searches must agree with."""

from __future__ import annotations

import dataclasses

from ebrl.resources.profiler import RateTable
from ebrl.resources.split import (
    Allocation,
    AllocationError,
    Curve,
    Pool,
    Split,
    _better,
    allocate,
)


def balance_brute_force(gen: Curve, train: Curve, units: int, min_units: int = 1) -> Split:
    """Reference for tests: try every split."""
    best: Split | None = None
    for g in range(min_units, units - min_units + 1):
        fg, ft = gen(g), train(units - g)
        cand = Split(g, min(fg, ft), fg, ft, 0)
        best = cand if best is None else _better(cand, best)
    if best is None:
        raise AllocationError(f"balance: {units} units cannot give each side {min_units}")
    return dataclasses.replace(best, evaluations=2 * (units - 2 * min_units + 1))


def first_at_least_brute_force(
    curve: Curve, target: float, lo: int, hi: int
) -> tuple[int | None, int]:
    """Reference for tests: :func:`first_at_least` by a linear scan."""
    for u in range(lo, hi + 1):
        if curve(u) >= target:
            return u, u - lo + 1
    return None, max(0, hi - lo + 1)


def allocate_brute_force(
    profile: RateTable,
    pool: Pool,
    max_gen_batch: int | None = None,
    max_train_batch: int | None = None,
    *,
    sim_rate: float | None = None,
    headroom: float = 0.15,
    sim_workers: int | None = None,
) -> Allocation:
    """Reference for tests: :func:`allocate` trying every split."""
    return allocate(
        profile,
        pool,
        max_gen_batch,
        max_train_batch,
        search=balance_brute_force,
        sim_rate=sim_rate,
        headroom=headroom,
        sufficient=first_at_least_brute_force,
        sim_workers=sim_workers,
    )
