"""analysis.stats on known inputs: CIs, IQM, ratios, strongest baseline, time to threshold."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import stats


def _coverage(n: int, trials: int, method: str, rng: np.random.Generator) -> float:
    hits = 0
    for _ in range(trials):
        x = rng.normal(3.0, 2.0, size=n)
        e = stats.bootstrap_ci(x, reps=1000, rng=rng) if method == "boot" else stats.t_ci(x)
        hits += e.low <= 3.0 <= e.high
    return hits / trials


def test_bootstrap_ci_covers_95_percent_with_enough_seeds():
    cov = _coverage(50, 1000, "boot", np.random.default_rng(1))
    assert 0.93 <= cov <= 0.97  # binomial s.e. of the estimate ~0.007


def test_few_seeds_percentile_bootstrap_under_covers_t_does_not():
    """The numbers quoted in PERCENTILE_COVERAGE and in every table's notes."""
    rng = np.random.default_rng(2)
    boot, t = _coverage(3, 1000, "boot", rng), _coverage(3, 1000, "t", rng)
    assert abs(boot - stats.PERCENTILE_COVERAGE[3]) < 0.04
    assert 0.93 <= t <= 0.97


def test_iqm_hand_values():
    assert stats.iqm(np.arange(1, 9)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    # n=5: weights .15/.2/.15 on the 2nd..4th values; the outlier has none
    assert stats.iqm([100, 1, 2, 3, 4]) == pytest.approx(3.0)
    assert np.isnan(stats.iqm([]))


def test_ratio_ci_sanity():
    rng = np.random.default_rng(0)
    den = rng.uniform(90, 110, size=8)
    exact = stats.ratio_ci(2 * den, den, rng=rng)  # paired, ratio 2 in every resample
    assert exact.value == pytest.approx(2) and exact.low == pytest.approx(2)
    assert exact.high == pytest.approx(2)
    noisy = stats.ratio_ci(2 * den * rng.normal(1, 0.05, 8), den, rng=rng)
    assert noisy.low < 2 < noisy.high and noisy.high - noisy.low < 0.2
    big = stats.ratio_ci(rng.normal(200, 10, 64), rng.normal(100, 5, 40), paired=False, rng=rng)
    small = stats.ratio_ci(rng.normal(200, 10, 4), rng.normal(100, 5, 4), paired=False, rng=rng)
    assert big.high - big.low < small.high - small.low
    assert stats.ratio_ci([1.0], [2.0]).n == 1
    with pytest.raises(ValueError):
        stats.ratio_ci([1, 2, 3], [1, 2])


def test_prob_improvement_ci():
    assert stats.prob_improvement_ci([5, 6, 7], [1, 2, 3]).value == 1.0
    e = stats.prob_improvement_ci([1, 2, 3], [1, 2, 3])
    assert e.value == 0.5 and e.low < 0.5 < e.high


def _runs() -> pd.DataFrame:
    """Two configs; per config schedulers A (target), B, C over seeds 0..2; B strongest on x,
    C strongest on y."""
    rows = []
    means = {("x", "A"): 300, ("x", "B"): 150, ("x", "C"): 100}
    means |= {("y", "A"): 200, ("y", "B"): 50, ("y", "C"): 100}
    for (cfg, s), m in means.items():
        for seed, d in enumerate((-1.0, 0.0, 1.0)):
            rows.append({"cfg": cfg, "scheduler_variant": s, "seed": seed, "tp": m + d})
    return pd.DataFrame(rows)


def test_summarize_groups_and_missing():
    df = pd.concat(
        [_runs(), pd.DataFrame([{"cfg": "x", "scheduler_variant": "A", "seed": 3, "tp": np.nan}])]
    )
    s = stats.summarize(df, "tp", ["cfg", "scheduler_variant"]).set_index(
        ["cfg", "scheduler_variant"]
    )
    a = s.loc[("x", "A")]
    assert a["n"] == 3 and a["n_missing"] == 1
    assert a["mean"] == 300 and a["std"] == pytest.approx(1.0) and a["iqm"] == pytest.approx(300)
    assert a["ci_low"] >= 299 and a["ci_high"] <= 301
    t = stats.summarize(df, "tp", ["cfg", "scheduler_variant"], ci="t").set_index(
        ["cfg", "scheduler_variant"]
    )
    assert t.loc[("x", "A"), "ci_low"] < a["ci_low"]  # the t interval is wider at n=3


def test_speedup_over_strongest_baseline():
    sp = stats.speedup_over_baseline(_runs(), "tp", target="A", config_cols=["cfg"])
    sp = sp.set_index(["cfg", "scheduler_variant"])
    assert sp.loc[("x", "A"), "baseline"] == "B" and sp.loc[("y", "A"), "baseline"] == "C"
    assert sp.loc[("x", "A"), "ratio"] == pytest.approx(2.0)
    assert sp.loc[("y", "A"), "ratio"] == pytest.approx(2.0)
    assert sp.loc[("x", "B"), "ratio"] == pytest.approx(1.0)  # the strongest itself
    assert sp.loc[("x", "C"), "ratio"] == pytest.approx(100 / 150)
    assert sp["paired"].all()
    lo, hi = sp.loc[("x", "A"), ["ci_low", "ci_high"]]
    assert lo <= 2.0 <= hi and hi - lo < 0.05
    # lower is better: the strongest baseline has the lowest mean, ratio = baseline / target
    lb = stats.speedup_over_baseline(
        _runs(), "tp", target="A", config_cols=["cfg"], higher_is_better=False
    ).set_index(["cfg", "scheduler_variant"])
    assert lb.loc[("x", "A"), "baseline"] == "C"
    assert lb.loc[("x", "A"), "ratio"] == pytest.approx(100 / 300)


def test_speedup_pairs_only_matching_seeds_and_flags_missing():
    df = _runs()
    df = df[~((df["scheduler_variant"] == "B") & (df["seed"] == 2))]  # B has seeds 0, 1 only
    sp = stats.speedup_over_baseline(df, "tp", target="A", config_cols=["cfg"])
    row = sp[(sp["cfg"] == "x") & (sp["scheduler_variant"] == "A")].iloc[0]
    assert not row["paired"] and row["n"] == 3 and row["n_baseline"] == 2
    with pytest.raises(ValueError, match="same seeds"):
        stats.speedup_over_baseline(df, "tp", target="A", config_cols=["cfg"], paired=True)
    df.loc[df.index[0], "tp"] = np.nan  # x/A seed 0
    row = stats.pairwise_ratios(df, "tp", target="A", baselines=["C"], config_cols=["cfg"])
    x = row[row["cfg"] == "x"].iloc[0]
    assert np.isnan(x["ratio"]) and x["n_missing"] == 1


def test_improvement_probabilities():
    p = stats.improvement_probabilities(_runs(), "tp", target="A", config_cols=["cfg"])
    assert len(p) == 4 and (p["p"] == 1.0).all()
    q = stats.improvement_probabilities(_runs(), "tp", target="C", baselines=["A", "B"])
    assert set(q["baseline"]) == {"A", "B"}
    assert q.set_index("baseline").loc["A", "p"] == 0.0


def test_smooth_is_trailing():
    y = stats.smooth(np.array([0.0, 3.0, 6.0, 9.0]), 3)
    assert np.isnan(y[:2]).all() and y[2:].tolist() == [3.0, 6.0]
    assert stats.smooth(np.array([1.0, 2.0]), 1).tolist() == [1.0, 2.0]


def _curve(run_id: str, values: list[float], dt: float) -> pd.DataFrame:
    t = dt * np.arange(1, len(values) + 1)
    return pd.DataFrame({"run_id": run_id, "key": "env/success_rate", "wall_s": t, "value": values})


def test_time_to_threshold():
    c = pd.concat(
        [
            _curve("spiky", [0.1, 0.9, 0.1, 0.9, 0.9, 0.9], 10.0),
            _curve("never", [0.1, 0.2, 0.3], 10.0),
        ]
    )
    one = stats.time_to_threshold(c, threshold=0.8, window=1).set_index("run_id")
    assert one.loc["spiky", "time_to_threshold"] == 20.0
    three = stats.time_to_threshold(c, threshold=0.8, window=3).set_index("run_id")
    assert three.loc["spiky", "time_to_threshold"] == 60.0  # the spike alone does not count
    assert not three.loc["never", "reached"] and np.isnan(three.loc["never", "time_to_threshold"])
    assert three.loc["never", "t_end"] == 30.0


def test_time_to_threshold_ratios_and_censoring():
    ramp = [0.2, 0.5, 0.85, 0.9]  # reaches 0.8 at the 3rd point
    curves, runs = [], []
    for seed in range(3):
        for sched, dt in (("fast", 10.0), ("slow", 20.0)):
            rid = f"{sched}{seed}"
            curves.append(_curve(rid, ramp, dt * (1 + 0.01 * seed)))
            runs.append({"run_id": rid, "scheduler_variant": sched, "seed": seed})
    curves.append(_curve("stuck0", [0.1] * 4, 25.0))
    runs.append({"run_id": "stuck0", "scheduler_variant": "stuck", "seed": 0})
    ttt = stats.time_to_threshold(pd.concat(curves), window=1).merge(pd.DataFrame(runs))
    r = stats.time_to_threshold_ratios(ttt, target="fast").set_index("baseline")
    assert r.loc["slow", "ratio"] == pytest.approx(2.0) and r.loc["slow", "reached"] == "3/3"
    assert np.isnan(r.loc["stuck", "ratio"]) and r.loc["stuck", "reached_baseline"] == "0/1"
    b = stats.time_to_threshold_ratios(ttt, target="fast", censored="budget").set_index("baseline")
    assert b.loc["stuck", "ratio"] == pytest.approx(100 / np.mean([30, 30.3, 30.6]))
    assert b.loc["stuck", "censored_baseline"] == 1 and b.loc["stuck", "censored_target"] == 0


def test_curve_bands_mean_and_common_end():
    curves = pd.concat([_curve("a", [0.0] * 5, 1.0), _curve("b", [1.0] * 3, 1.0)])
    runs = pd.DataFrame({"run_id": ["a", "b"], "scheduler_variant": ["s", "s"]})
    b = stats.curve_bands(curves, runs, ["scheduler_variant"], window=1, points=7)
    assert b["t"].max() == 3.0  # the shorter run's end
    after = b[b["t"] >= 1.0]
    assert (after["mean"] == 0.5).all() and (after["n"] == 2).all()
    assert (after["ci_low"] <= 0.5).all() and (after["ci_high"] >= 0.5).all()
    assert b[b["t"] < 1.0]["mean"].isna().all()  # before any point: no value, not zero
