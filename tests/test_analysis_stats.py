"""analysis.stats on known inputs: IQM, the default intervals (Student t of a mean, t on paired
log ratios, Wilson's of a success rate) and the bootstrap ones (BCa, percentile), paired ratios,
the stratified bootstrap, strongest baseline, time to threshold."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.special import ndtr, ndtri

from analysis import stats


def test_iqm_is_rliables_trimmed_mean():
    """rliable's IQM is scipy.stats.trim_mean(x, 0.25): int(n / 4) values off each end."""
    assert stats.iqm([1, 2, 3, 7, 100]) == 4.0  # mean of 2, 3, 7 (issue 20)
    assert stats.iqm_interpolated([1, 2, 3, 7, 100]) == pytest.approx(3.9)  # the old estimator
    assert stats.iqm(np.arange(1, 9)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert stats.iqm([100, 1, 2, 3, 4]) == pytest.approx(3.0)  # mean of 2, 3, 4
    assert stats.iqm([1, 2, 30]) == pytest.approx(11.0)  # n = 3: nothing trimmed, the mean
    assert np.isnan(stats.iqm([]))
    # a runs x tasks matrix: all its scores at once (rliable's aggregate_iqm)
    m = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    assert stats.iqm(m) == pytest.approx(np.mean([3.0, 4.0, 10.0, 20.0]))
    assert stats.aggregate(m, "mean") == pytest.approx((2.5 + 25.0) / 2)


def _ideal_bca(x: np.ndarray, conf: float = 0.95) -> tuple[float, float]:
    """BCa interval of the mean from every one of the n^n equally likely resamples (the ideal
    bootstrap; Efron and Tibshirani 1993, 14.3): no Monte Carlo error, no scipy."""
    n = len(x)
    boot = x[np.array(list(itertools.product(range(n), repeat=n)))].mean(1)
    theta = x.mean()
    z0 = ndtri(((boot < theta).mean() + (boot <= theta).mean()) / 2)  # ties count half
    jack = np.array([np.delete(x, i).mean() for i in range(n)])
    d = jack.mean() - jack
    acc = (d**3).sum() / (6 * (d**2).sum() ** 1.5)
    z = ndtri((1 - conf) / 2)
    a1 = ndtr(z0 + (z0 + z) / (1 - acc * (z0 + z)))
    a2 = ndtr(z0 + (z0 - z) / (1 - acc * (z0 - z)))
    lo, hi = np.percentile(boot, [100 * a1, 100 * a2])
    return float(lo), float(hi)


def test_bca_interval_on_a_known_case():
    """A right-skewed sample: BCa moves the interval right of the percentile one, to where the
    ideal bootstrap's BCa puts it ([2.0, 16.4] here; resample means are multiples of 0.2)."""
    x = np.array([1.0, 2.0, 3.0, 4.0, 20.0])
    lo, hi = _ideal_bca(x)
    assert (lo, hi) == pytest.approx((2.0, 16.4))
    e = stats.bootstrap_ci(x, reps=200_000, rng=np.random.default_rng(0))
    assert e.method == "bca" and e.value == 6.0 and e.n == 5
    assert e.low == pytest.approx(lo, abs=0.21) and e.high == pytest.approx(hi, abs=0.21)
    p = stats.bootstrap_ci(x, reps=200_000, rng=np.random.default_rng(0), method="percentile")
    assert p.method == "percentile" and p.high < 14.0 < e.high


def test_bca_undefined_cases_fall_back_to_percentile_explicitly():
    """BCa is undefined (scipy warns and returns NaN) when every resample gives the same value or
    the jackknife is degenerate; the interval is then the percentile one, and says so."""
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing leaks to the caller
        same = stats.bootstrap_ci([5.0, 5.0, 5.0], rng=rng)
        assert (same.value, same.low, same.high, same.method) == (5.0, 5.0, 5.0, "percentile")
        # the median of [1, 1, 1, 5] left one out is 1 every time: the jackknife is degenerate
        med = stats.bootstrap_ci([1.0, 1.0, 1.0, 5.0], stat=np.median, rng=rng)
        assert med.method == "percentile" and np.isfinite([med.low, med.high]).all()
        assert med.low == 1.0 and med.high > 1.0
        three = stats.bootstrap_ci([1.0, 2.0, 4.0], rng=rng)  # n = 3 and distinct: BCa exists
        assert three.method == "bca" and 1.0 <= three.low < three.value < three.high <= 4.0
    assert stats.bootstrap_ci([3.0], rng=rng) == stats.Estimate(3.0, 3.0, 3.0, 1)
    assert stats.bootstrap_ci([], rng=rng).n == 0
    with pytest.raises(ValueError, match="interval method"):
        stats.bootstrap_ci([1.0, 2.0], method="bootstrap")


@pytest.mark.parametrize("method", ["t-log", "bca"])
def test_ratio_ci_pairs_by_seed(method):
    rng = np.random.default_rng(0)
    # each seed's machine state scales both runs of that seed: pairing cancels it
    seed_effect = rng.uniform(50, 150, size=6)
    den = seed_effect * rng.normal(1, 0.01, 6)
    num = 2 * seed_effect * rng.normal(1, 0.01, 6)
    kw = {"method": method} if method != "t-log" else {}  # t-log is the default
    paired = stats.ratio_ci(num, den, rng=np.random.default_rng(1), **kw)
    unpaired = stats.ratio_ci(num, den, paired=False, rng=np.random.default_rng(1), **kw)
    assert paired.method == unpaired.method == method
    assert paired.low < paired.value < paired.high and paired.value == pytest.approx(2, abs=0.03)
    # the 1% per-run noise, not the seeds' 3x spread (t's interval is the wider: it covers)
    assert paired.high - paired.low < 0.08
    assert unpaired.high - unpaired.low > 10 * (paired.high - paired.low)
    # the same ratio on every seed: a zero-width interval (for BCa, undefined: the percentile)
    exact = stats.ratio_ci(2 * den, den, rng=rng, **kw)
    assert (exact.value, exact.low, exact.high) == pytest.approx((2, 2, 2))
    assert exact.method == ("percentile" if method == "bca" else method)
    # unpaired groups may differ in size; more runs, a narrower interval
    big = stats.ratio_ci(rng.normal(200, 10, 64), rng.normal(100, 5, 40), paired=False, rng=rng)
    small = stats.ratio_ci(rng.normal(200, 10, 4), rng.normal(100, 5, 4), paired=False, rng=rng)
    assert big.high - big.low < small.high - small.low
    assert stats.ratio_ci([1.0], [2.0]).n == 1
    with pytest.raises(ValueError):
        stats.ratio_ci([1, 2, 3], [1, 2])


def test_stratified_ci_resamples_runs_within_each_task():
    """Task 0 scores 0 on every run, task 1 scores 1: a stratified resample always holds n of
    each, so the IQM never moves; resampling all scores together would mix the tasks."""
    scores = np.column_stack([np.zeros(4), np.ones(4)])
    e = stats.stratified_ci(scores, rng=np.random.default_rng(0))
    assert (e.value, e.low, e.high, e.n) == (0.5, 0.5, 0.5, 4)
    m = np.random.default_rng(1).normal(size=(6, 3)) + np.array([0.0, 3.0, 6.0])
    for how in ("iqm", "mean"):
        for method in ("bca", "percentile"):
            est = stats.stratified_ci(m, how, rng=np.random.default_rng(2), method=method)
            assert est.low < stats.aggregate(m, how) < est.high and est.method == method
    # one task: the stratified bootstrap is the plain one
    v = m[:, 0]
    one = stats.stratified_ci(v, "mean", rng=np.random.default_rng(3))
    assert one == stats.bootstrap_ci(v, rng=np.random.default_rng(3))


def test_prob_improvement_over_tasks():
    x = np.array([[2.0, 0.0], [3.0, 0.0]])
    y = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    assert stats.prob_improvement(x, y) == pytest.approx((1.0 + 0.0) / 2)
    assert stats.prob_improvement([1.0, 2.0], [2.0, 2.0]) == pytest.approx(0.25)  # ties: half
    with pytest.raises(ValueError, match="tasks"):
        stats.prob_improvement(x, y[:, :1])


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
    t = s.loc[("x", "A")]
    assert t["n"] == 3 and t["n_missing"] == 1
    assert t["mean"] == 300 and t["std"] == pytest.approx(1.0) and t["iqm"] == pytest.approx(300)
    # the default: Student t, 300 +- t(0.975, 2 dof) * 1 / sqrt(3)
    assert t["ci_method"] == "t" and t["ci_high"] - 300 == pytest.approx(4.303 / np.sqrt(3), 1e-3)
    a = stats.summarize(df, "tp", ["cfg", "scheduler_variant"], ci="bca").set_index(
        ["cfg", "scheduler_variant"]
    )
    assert a.loc[("x", "A"), "ci_low"] >= 299 and a.loc[("x", "A"), "ci_high"] <= 301
    assert a.loc[("x", "A"), "ci_method"] == "bca"  # the bootstrap's, narrower at n=3
    with pytest.raises(ValueError, match="interval method"):
        stats.summarize(df, "tp", ["cfg"], ci="bootstrap")


def test_speedup_over_strongest_baseline():
    sp = stats.speedup_over_baseline(_runs(), "tp", target="A", config_cols=["cfg"])
    sp = sp.set_index(["cfg", "scheduler_variant"])
    assert sp.loc[("x", "A"), "baseline"] == "B" and sp.loc[("y", "A"), "baseline"] == "C"
    # the default (t on paired log ratios): the geometric mean of 299/149, 300/150, 301/151
    assert sp.loc[("x", "A"), "ratio"] == pytest.approx(2.0, rel=1e-4)
    assert sp.loc[("y", "A"), "ratio"] == pytest.approx(2.0, rel=1e-4)
    assert sp.loc[("x", "B"), "ratio"] == pytest.approx(1.0)  # the strongest itself
    assert sp.loc[("x", "C"), "ratio"] == pytest.approx(100 / 150, rel=1e-4)
    assert (sp["ci_method"] == "t-log").all()
    assert sp["paired"].all()
    lo, hi = sp.loc[("x", "A"), ["ci_low", "ci_high"]]
    assert lo <= 2.0 <= hi and hi - lo < 0.05
    # lower is better: the strongest baseline has the lowest mean, ratio = baseline / target
    lb = stats.speedup_over_baseline(
        _runs(), "tp", target="A", config_cols=["cfg"], higher_is_better=False
    ).set_index(["cfg", "scheduler_variant"])
    assert lb.loc[("x", "A"), "baseline"] == "C"
    assert lb.loc[("x", "A"), "ratio"] == pytest.approx(100 / 300, rel=1e-4)


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
    # one stuck run against three: no interval; the ratio of geometric means (t-log's point)
    assert b.loc["stuck", "ratio"] == pytest.approx(100 / stats_gmean([30, 30.3, 30.6]))
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


def stats_gmean(x: list[float]) -> float:
    return float(np.exp(np.mean(np.log(x))))


def test_t_log_ratio_on_known_values():
    """Paired: a t interval on log(num / den) with n - 1 dof, back on the ratio scale; its
    point the geometric mean of the per-seed ratios. Unpaired: Welch's t on the logs."""
    num, den = np.array([110.0, 99.0, 121.0]), np.array([100.0, 100.0, 100.0])
    e = stats.ratio_ci(num, den)
    d = np.log(num / den)
    half = 4.302653 * d.std(ddof=1) / np.sqrt(3)
    assert e.method == "t-log" and e.n == 3
    assert e.value == pytest.approx(np.exp(d.mean()))
    assert (e.low, e.high) == pytest.approx((np.exp(d.mean() - half), np.exp(d.mean() + half)))
    # symmetric in direction: the interval of den / num is the reciprocal one
    r = stats.ratio_ci(den, num)
    assert (r.value, r.low, r.high) == pytest.approx((1 / e.value, 1 / e.high, 1 / e.low))
    u = stats.ratio_ci([200.0, 220.0, 210.0, 190.0], [100.0, 105.0], paired=False)
    assert u.method == "t-log" and u.low < u.value < u.high and u.n == 2
    with pytest.raises(ValueError, match=r"positive values.*method='bca'"):
        stats.ratio_ci([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="interval method"):
        stats.ratio_ci([1.0, 2.0], [1.0, 1.0], method="t")


def test_rate_ci_wilson_with_effective_episodes():
    """Wilson's interval on the effective episodes: inside [0, 1], not zero-width when every
    seed succeeded every time (the episodes' binomial variance), wider with spread seeds."""
    ones = stats.rate_ci([1.0, 1.0, 1.0], trials=50)
    # p = 1, N = 150 episodes, q = t(0.975, 2 dof): Wilson's lower end 1 / (1 + q^2 / N)
    q = 4.302653
    assert ones.method == "wilson" and ones.high == 1.0
    assert ones.low == pytest.approx(1 / (1 + q * q / 150), rel=1e-6)
    assert 0.85 < ones.low < 0.95
    # the t interval of the same rates: zero width, the failure at the bound
    t = stats.rate_ci([1.0, 1.0, 1.0], trials=50, method="t")
    assert (t.low, t.high, t.method) == (1.0, 1.0, "t")
    spread = stats.rate_ci([0.6, 0.9, 0.95], trials=50)
    assert (
        0.0 <= spread.low < 0.6
        and spread.high <= 1.0
        and spread.value == pytest.approx(0.8167, 1e-3)
    )
    # the variance is the one between seeds when it is larger than the binomial one
    x = np.array([0.6, 0.9, 0.95])
    n_eff = x.mean() * (1 - x.mean()) / (x.var(ddof=1) / 3)
    centre = (x.mean() + q * q / (2 * n_eff)) / (1 + q * q / n_eff)
    assert (spread.low + spread.high) / 2 == pytest.approx(centre, rel=1e-6)
    # unknown episodes: no binomial floor, so seeds that agree give no width
    assert stats.rate_ci([1.0, 1.0, 1.0]).low == 1.0
    b = stats.rate_ci([0.6, 0.9, 0.95], method="bca", rng=np.random.default_rng(0))
    assert b.method == "bca"
    with pytest.raises(ValueError, match=r"success rates must lie in \[0, 1\]"):
        stats.rate_ci([0.5, 1.5])
    with pytest.raises(ValueError, match="trials"):
        stats.rate_ci([0.5, 0.6], trials=0)


def test_summarize_a_success_rate_with_its_episodes():
    df = pd.DataFrame({"g": ["a"] * 3, "s": [1.0, 1.0, 1.0], "eps": [50, 50, 50]})
    r = stats.summarize(df, "s", ["g"], statistic="rate", trials_col="eps").iloc[0]
    assert r["ci_method"] == "wilson" and 0.85 < r["ci_low"] < 0.95 and r["ci_high"] == 1.0
    with pytest.raises(ValueError, match="statistic must be"):
        stats.summarize(df, "s", ["g"], statistic="ratio")


def test_method_for_and_labels_name_the_method():
    assert stats.DEFAULT_METHOD == {"mean": "t", "ratio": "t-log", "rate": "wilson"}
    assert [stats.method_for(s) for s in ("mean", "ratio", "rate")] == ["t", "t-log", "wilson"]
    assert [stats.method_for(s, "t") for s in ("mean", "ratio", "rate")] == ["t", "t-log", "t"]
    assert {stats.method_for(s, "bca") for s in ("mean", "ratio", "rate")} == {"bca"}
    assert stats.method_for("mean", "wilson") == "t"  # a rate's method, not a mean's: default
    with pytest.raises(ValueError, match="interval method"):
        stats.method_for("mean", "bootstrap")
    assert stats.ci_label("t-log", n=5) == "95% Student t CI (paired log ratio, n=5)"
    assert stats.ci_label("t-log", paired=False) == "95% Student t CI (log ratio, unpaired (Welch))"
    assert stats.ci_label("t") == "95% Student t CI (mean over seeds)"
    assert stats.ci_label("bca", n=3) == "95% BCa bootstrap CI (over seeds, n=3)"
    assert stats.ci_label("wilson").startswith("95% Wilson CI (success rate")
    assert stats.mean_ci([1.0, 2.0, 3.0]).method == "t"
    assert stats.mean_ci([1.0, 2.0, 4.0], method="percentile").method == "percentile"
