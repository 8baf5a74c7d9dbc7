"""How often a nominal 95% CI of a mean over n seeds covers the true mean: percentile, BCa, t.

A simulation on known distributions, through the same functions the tables use
(:func:`analysis.stats.bootstrap_ci`, :func:`analysis.stats.t_ci`): draw n values, build each
interval, count the trials whose interval holds the distribution's mean. With few seeds every
bootstrap interval is too narrow (it resamples only the n values seen); the t interval is exact
for normal data and not for skewed data. :data:`analysis.stats.COVERAGE` records the normal rows.

Usage: ``python -m analysis.coverage [--trials 4000] [--reps 2000] [--n 3,5,10] [--seed 0]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from analysis import stats

Sampler = Callable[[np.random.Generator, int], np.ndarray]

#: name -> (draw n values, the true mean): symmetric, skewed like a throughput with a slow
#: outlier machine, and heavy-tailed
DISTRIBUTIONS: dict[str, tuple[Sampler, float]] = {
    "normal(3, 2)": (lambda rng, n: rng.normal(3.0, 2.0, n), 3.0),
    "lognormal(0, 1)": (lambda rng, n: rng.lognormal(0.0, 1.0, n), float(np.exp(0.5))),
    "student t, 3 dof": (lambda rng, n: rng.standard_t(3, n), 0.0),
}
METHODS = ("percentile", "bca", "t")


def coverage(
    sample: Sampler,
    mean: float,
    n: int,
    method: str,
    *,
    trials: int,
    reps: int,
    rng: np.random.Generator,
) -> float:
    """Fraction of ``trials`` samples of size ``n`` whose 95% CI of the mean holds ``mean``."""
    hits = 0
    for _ in range(trials):
        x = sample(rng, n)
        if method == "t":
            e = stats.t_ci(x)
        else:
            e = stats.bootstrap_ci(x, reps=reps, rng=rng, method=method)
        hits += e.low <= mean <= e.high
    return hits / trials


def table(
    ns: Sequence[int] = (3, 5, 10),
    dists: Sequence[str] = tuple(DISTRIBUTIONS),
    methods: Sequence[str] = METHODS,
    *,
    trials: int = 4000,
    reps: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Coverage per distribution, n and method; each (distribution, n) cell has its own stream
    (seeded by its position), so a cell reruns alone with the same numbers."""
    rows = []
    for i, d in enumerate(dists):
        sample, mean = DISTRIBUTIONS[d]
        for j, n in enumerate(ns):
            row: dict[str, object] = {"distribution": d, "n": n}
            for k, m in enumerate(methods):
                rng = np.random.default_rng([seed, i, j, k])
                row[m] = coverage(sample, mean, n, m, trials=trials, reps=reps, rng=rng)
            rows.append(row)
    return pd.DataFrame(rows, columns=["distribution", "n", *methods])


def markdown(df: pd.DataFrame, trials: int, reps: int) -> str:
    """The table with its caption: what was measured, how often, with which resamples."""
    methods = [m for m in METHODS if m in df]
    head = ["distribution", "n", *(f"{stats.CI_NAMES[m]} 95% CI" for m in methods)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, r in df.iterrows():
        cells = [str(r["distribution"]), str(r["n"]), *(f"{r[m]:.1%}" for m in methods)]
        lines.append("| " + " | ".join(cells) + " |")
    se = 0.5 / np.sqrt(trials)
    lines += [
        "",
        f"Coverage of nominal 95% CIs of the mean: {trials} samples per cell, {reps} bootstrap "
        f"resamples per interval; binomial standard error at most {se:.1%}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--n", default="3,5,10", help="comma-separated seed counts")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ns = [int(v) for v in args.n.split(",") if v.strip()]
    df = table(ns, trials=args.trials, reps=args.reps, seed=args.seed)
    print(markdown(df, args.trials, args.reps), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
