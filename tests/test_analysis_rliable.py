"""analysis.stats against rliable's own functions on random score matrices (runs x tasks).

rliable is not a dependency: install it for this test only (``pip install -c constraints.txt
rliable``; its stratified bootstrap needs ``arch``, whose 7.x releases, the last rliable allows,
do not import under pandas 3: run this test where pandas < 3). Without it the test is skipped.

Compared: the point estimates exactly (``aggregate_iqm``, ``aggregate_mean``,
``probability_of_improvement``), and our stratified percentile interval with rliable's
``get_interval_estimates`` (its default method) up to Monte Carlo error. rliable's BCa goes
through ``arch``, whose jackknife differs from scipy's: not compared.
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis import stats

pytest.importorskip("rliable")
library = pytest.importorskip("rliable.library")
metrics = pytest.importorskip("rliable.metrics")

REPS = 10_000


def _scores(rng: np.random.Generator, runs: int, tasks: int) -> np.ndarray:
    """Gamma scores on task-specific scales (skewed, so the IQM is not the mean)."""
    return rng.gamma(2.0, 1.0, size=(runs, tasks)) * rng.uniform(0.5, 3.0, size=tasks)


@pytest.mark.parametrize("seed", range(8))
def test_point_estimates_equal_rliables(seed):
    rng = np.random.default_rng(seed)
    runs, tasks = int(rng.integers(3, 11)), int(rng.integers(1, 6))
    x = _scores(rng, runs, tasks)
    y = _scores(rng, int(rng.integers(3, 11)), tasks)
    assert stats.iqm(x) == pytest.approx(metrics.aggregate_iqm(x), rel=1e-12)
    assert stats.aggregate(x, "iqm") == pytest.approx(metrics.aggregate_iqm(x), rel=1e-12)
    assert stats.aggregate(x, "mean") == pytest.approx(metrics.aggregate_mean(x), rel=1e-12)
    p = metrics.probability_of_improvement(x, y)
    assert stats.prob_improvement(x, y) == pytest.approx(p, rel=1e-12)
    # integer scores: ties, which rliable counts half through the Mann-Whitney U statistic
    xi, yi = np.floor(x), np.floor(y)
    pi = metrics.probability_of_improvement(xi, yi)
    assert stats.prob_improvement(xi, yi) == pytest.approx(pi, rel=1e-12)


@pytest.mark.parametrize("seed", range(2))
def test_stratified_interval_matches_rliables(seed):
    """A run effect shared by a run's tasks and far-apart task levels: a bootstrap that kept runs
    whole or mixed the tasks would give another interval; rliable's stratified one is ours."""
    rng = np.random.default_rng(seed)
    runs, tasks = 5, 3
    run_effect = 3.0 * rng.normal(size=(runs, 1))
    scores = run_effect + rng.normal(size=(runs, tasks)) + np.array([0.0, 5.0, 10.0])
    np.random.seed(seed)  # rliable draws its stratified indices from numpy's global generator

    def iqm_of(s: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(s)])

    points, intervals = library.get_interval_estimates({"x": scores}, iqm_of, reps=REPS)
    (r_lo,), (r_hi,) = intervals["x"]
    ours = stats.stratified_ci(
        scores, "iqm", reps=REPS, rng=np.random.default_rng(seed), method="percentile"
    )
    width = r_hi - r_lo
    assert ours.value == pytest.approx(points["x"][0], rel=1e-12)
    # Monte Carlo error of 10,000 resamples: about 1.5% of the width each; whole runs: ~20%
    assert abs(ours.low - r_lo) < 0.08 * width and abs(ours.high - r_hi) < 0.08 * width
    # the check can tell: whole runs resampled together give a clearly different interval
    idx = np.random.default_rng(seed).integers(0, runs, size=(REPS, runs))
    whole = stats.iqm(scores[idx].reshape(REPS, -1), axis=-1)
    w_lo, w_hi = np.percentile(whole, [2.5, 97.5])
    assert max(abs(w_lo - r_lo), abs(w_hi - r_hi)) > 0.15 * width
