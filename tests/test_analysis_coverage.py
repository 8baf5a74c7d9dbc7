"""analysis.coverage: the coverage recorded in analysis.stats.COVERAGE (quoted in every table's
notes) is what the simulation measures, on fresh random streams."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import coverage, stats

NORMAL = "normal(3, 2)"


def _measure(method: str, n: int, trials: int, seed: int) -> float:
    sample, mean = coverage.DISTRIBUTIONS[NORMAL]
    rng = np.random.default_rng(seed)
    return coverage.coverage(sample, mean, n, method, trials=trials, reps=2000, rng=rng)


@pytest.mark.parametrize("method", ["bca", "percentile"])
def test_recorded_few_seed_coverage_of_the_bootstrap(method):
    """1500 trials: binomial s.e. about 0.011 at 75%; the record used 4000 on other streams."""
    measured = _measure(method, 3, 1500, seed=101)
    assert abs(measured - stats.COVERAGE[method][3]) < 0.04
    assert measured < 0.85  # and it is far below the nominal 95%


def test_t_interval_is_exact_on_normal_data_and_the_bootstrap_is_with_many_seeds():
    assert 0.93 <= _measure("t", 3, 1500, seed=102) <= 0.97
    assert abs(stats.COVERAGE["t"][3] - 0.95) < 0.01
    assert 0.92 <= _measure("bca", 50, 500, seed=103) <= 0.98


def test_table_and_markdown():
    df = coverage.table([3], [NORMAL], trials=50, reps=200, seed=0)
    assert list(df.columns) == ["distribution", "n", "percentile", "bca", "t"]
    cov = df[["percentile", "bca", "t"]].to_numpy()
    assert len(df) == 1 and ((cov >= 0) & (cov <= 1)).all()
    again = coverage.table([3], [NORMAL], trials=50, reps=200, seed=0)
    assert df.equals(again)  # each cell has its own seeded stream
    md = coverage.markdown(df, trials=50, reps=200)
    assert "| BCa bootstrap 95% CI |" in md and "percentile bootstrap 95% CI" in md
    assert "Student t 95% CI" in md and "50 samples per cell, 200 bootstrap resamples" in md
