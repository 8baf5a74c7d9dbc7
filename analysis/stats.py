"""Statistics over seeds, after rliable (Agarwal et al. 2021): bootstrap CIs, IQM, ratios.

Everything is a pure function of arrays of per-seed values, with an explicit random generator,
so results are reproducible and testable on known inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval."""

    value: float
    low: float
    high: float
    n: int

    def fmt(self, spec: str = ".0f") -> str:
        if self.n < 2:
            return f"{self.value:{spec}} (n={self.n})"
        return f"{self.value:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def iqm(x: np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% (linear weights at the quartile edges)."""
    x = np.sort(np.asarray(x, dtype=float).ravel())
    n = len(x)
    if n == 0:
        return float("nan")
    # each sample covers [i/n, (i+1)/n) of the quantile axis; weight = its overlap with [.25, .75)
    lo, hi = np.arange(n) / n, (np.arange(n) + 1) / n
    w = np.clip(np.minimum(hi, 0.75) - np.maximum(lo, 0.25), 0, None)
    return float(np.sum(w * x) / np.sum(w))


def bootstrap_ci(
    x: np.ndarray,
    stat=np.mean,
    conf: float = 0.95,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> Estimate:
    """Percentile bootstrap CI of ``stat`` over the samples ``x`` (e.g. one value per seed)."""
    x = np.asarray(x, dtype=float).ravel()
    n = len(x)
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    point = float(stat(x))
    if n == 1:
        return Estimate(point, point, point, 1)
    rng = rng or np.random.default_rng(0)
    idx = rng.integers(0, n, size=(reps, n))
    boots = np.array([stat(row) for row in x[idx]]) if stat is not np.mean else x[idx].mean(1)
    a = (1 - conf) / 2
    return Estimate(point, float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a)), n)


def ratio_ci(
    num: np.ndarray,
    den: np.ndarray,
    paired: bool = True,
    conf: float = 0.95,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> Estimate:
    """Bootstrap CI of mean(num) / mean(den).

    Args:
        paired: resample seeds jointly (num[i] and den[i] share seed i); else independently.
    """
    num, den = np.asarray(num, float).ravel(), np.asarray(den, float).ravel()
    if len(num) == 0 or len(den) == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    point = float(num.mean() / den.mean())
    n = min(len(num), len(den))
    if n < 2:
        return Estimate(point, point, point, n)
    rng = rng or np.random.default_rng(0)
    if paired:
        if len(num) != len(den):
            raise ValueError("paired ratio needs equally many samples")
        idx = rng.integers(0, n, size=(reps, n))
        boots = num[idx].mean(1) / den[idx].mean(1)
    else:
        bn = num[rng.integers(0, len(num), size=(reps, len(num)))].mean(1)
        bd = den[rng.integers(0, len(den), size=(reps, len(den)))].mean(1)
        boots = bn / bd
    a = (1 - conf) / 2
    return Estimate(point, float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a)), n)


def prob_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) for one draw of each (ties count half): rliable's probability of improvement."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    gt = (x[:, None] > y[None, :]).mean()
    eq = (x[:, None] == y[None, :]).mean()
    return float(gt + 0.5 * eq)
