"""Statistics over seeds, after rliable (Agarwal et al. 2021): bootstrap CIs, IQM, ratios.

Everything is a pure function, with an explicit random generator, so results are reproducible and
testable on known inputs: first of arrays of per-seed values (:func:`bootstrap_ci`,
:func:`ratio_ci`, :func:`iqm`, :func:`prob_improvement`), then of the tidy tables
``analysis.export`` writes (one row per run, or one row per curve point): summaries per group,
speedup over the strongest baseline, probabilities of improvement, time to a threshold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd


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


# --- tables of runs: pure functions on DataFrames ------------------------------------------------
#: measured coverage of the nominal 95% percentile bootstrap CI of a mean, normal data, 1000 trials
#: per n (tests/test_analysis_stats.py): it under-covers with few seeds. ``ci="t"`` is exact there.
PERCENTILE_COVERAGE = {3: 0.76, 5: 0.83, 10: 0.89, 50: 0.95}


def t_ci(x: np.ndarray, conf: float = 0.95) -> Estimate:
    """Student-t CI of the mean: exact for normal data at any n (the bootstrap is not, n < 10)."""
    from scipy import stats as st

    x = np.asarray(x, dtype=float).ravel()
    n = len(x)
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    m = float(x.mean())
    if n == 1:
        return Estimate(m, m, m, 1)
    half = float(st.t.ppf(0.5 + conf / 2, n - 1) * x.std(ddof=1) / np.sqrt(n))
    return Estimate(m, m - half, m + half, n)


def iter_groups(df: pd.DataFrame, by: Sequence[str]) -> Iterator[tuple[tuple, pd.DataFrame]]:
    """``groupby`` that keeps NaN keys and yields tuple keys for any number of columns."""
    if not by:
        yield (), df
        return
    for key, g in df.groupby(list(by), dropna=False, sort=True):
        yield (key if isinstance(key, tuple) else (key,)), g


def summarize(
    df: pd.DataFrame,
    value: str,
    by: Sequence[str] = (),
    *,
    conf: float = 0.95,
    ci: str = "bootstrap",
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """Mean, std, CI and IQM of ``value`` over the rows (seeds) of each group.

    Args:
        df: one row per run.
        value: the column to summarise.
        by: grouping columns (a configuration and a scheduler, say).
        ci: ``"bootstrap"`` (percentile, as rliable; see :data:`PERCENTILE_COVERAGE`) or ``"t"``.

    Returns:
        One row per group: the ``by`` columns, ``n`` (non-missing values), ``n_missing``, ``mean``,
        ``std`` (ddof=1; NaN for n < 2), ``ci_low``, ``ci_high``, ``iqm``.
    """
    if ci not in ("bootstrap", "t"):
        raise ValueError(f"ci must be 'bootstrap' or 't', not {ci!r}")
    rng = rng or np.random.default_rng(0)
    rows = []
    for key, g in iter_groups(df, by):
        x = g[value].to_numpy(dtype=float)
        ok = x[~np.isnan(x)]
        if ci == "bootstrap":
            est = bootstrap_ci(ok, conf=conf, reps=reps, rng=rng)
        else:
            est = t_ci(ok, conf)
        rows.append(
            {
                **dict(zip(by, key)),
                "n": len(ok),
                "n_missing": len(x) - len(ok),
                "mean": est.value,
                "std": float(ok.std(ddof=1)) if len(ok) > 1 else float("nan"),
                "ci_low": est.low,
                "ci_high": est.high,
                "iqm": iqm(ok),
            }
        )
    cols = [*by, "n", "n_missing", "mean", "std", "ci_low", "ci_high", "iqm"]
    return pd.DataFrame(rows, columns=cols)


def _aligned(
    t: pd.DataFrame, b: pd.DataFrame, value: str, seed_col: str | None, paired: bool | None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Values of two groups, aligned by seed when pairing applies (same seeds, once each)."""
    can_pair = (
        seed_col is not None
        and seed_col in t
        and seed_col in b
        and t[seed_col].is_unique
        and b[seed_col].is_unique
        and set(t[seed_col]) == set(b[seed_col])
    )
    if paired and not can_pair:
        raise ValueError("paired=True needs both groups to have the same seeds, each once")
    if paired is None:
        paired = can_pair and len(t) > 1
    if paired:
        t, b = t.sort_values(seed_col), b.sort_values(seed_col)
    return t[value].to_numpy(dtype=float), b[value].to_numpy(dtype=float), bool(paired)


@dataclass(frozen=True)
class _RatioOpts:
    """How :func:`_ratio_row` compares two groups: direction, pairing by seed, CI settings."""

    higher_is_better: bool
    seed_col: str | None
    paired: bool | None
    conf: float
    reps: int
    rng: np.random.Generator


def _ratio_row(t: pd.DataFrame, b: pd.DataFrame, value: str, opts: _RatioOpts) -> dict:
    """Improvement of group ``t`` over group ``b`` as a ratio of means, with a bootstrap CI.

    The ratio is ``mean(t) / mean(b)`` when higher is better (a speedup in throughput) and
    ``mean(b) / mean(t)`` when lower is (a speedup in time to a threshold): > 1 means ``t`` wins.
    Any missing value makes the ratio NaN (``n_missing`` says how many): no silent dropping.
    """
    x, y, was_paired = _aligned(t, b, value, opts.seed_col, opts.paired)
    missing = int(np.isnan(x).sum() + np.isnan(y).sum())
    out = {"n": len(x), "n_baseline": len(y), "n_missing": missing, "paired": was_paired}
    if missing or len(x) == 0 or len(y) == 0:
        return {**out, "ratio": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    num, den = (x, y) if opts.higher_is_better else (y, x)
    est = ratio_ci(num, den, paired=was_paired, conf=opts.conf, reps=opts.reps, rng=opts.rng)
    return {**out, "ratio": est.value, "ci_low": est.low, "ci_high": est.high}


def _baselines_of(
    names: Sequence[str], target: str | None, baselines: Sequence[str] | None
) -> list[str]:
    if baselines is None:
        if target is None:
            raise ValueError("name the target or the baselines")
        return [s for s in names if s != target]
    return [s for s in names if s in set(baselines) and s != target]


def _target_vs_baselines(
    df: pd.DataFrame,
    target: str,
    baselines: Sequence[str] | None,
    config_cols: Sequence[str],
    scheduler_col: str,
) -> Iterator[tuple[dict, str, pd.DataFrame, pd.DataFrame]]:
    """(config columns, baseline, target's runs, baseline's runs) per configuration and baseline.

    Configurations where ``target`` did not run are skipped; baselines follow :func:`_baselines_of`.
    """
    for key, g in iter_groups(df, config_cols):
        names = sorted(g[scheduler_col].dropna().unique())
        if target not in names:
            continue
        t = g[g[scheduler_col] == target]
        for base in _baselines_of(names, target, baselines):
            yield dict(zip(config_cols, key)), base, t, g[g[scheduler_col] == base]


def speedup_over_baseline(
    df: pd.DataFrame,
    value: str,
    *,
    target: str | None,
    baselines: Sequence[str] | None = None,
    config_cols: Sequence[str] = (),
    scheduler_col: str = "scheduler_variant",
    seed_col: str | None = "seed",
    higher_is_better: bool = True,
    paired: bool | None = None,
    conf: float = 0.95,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """Each scheduler's ratio to the strongest baseline of its configuration, with a CI over seeds.

    The strongest baseline of a configuration is the baseline with the best mean ``value``
    (highest, or lowest when ``higher_is_better`` is False), chosen among the schedulers that ran
    in that configuration. Every scheduler of the configuration gets a row (the strongest baseline
    itself has ratio 1), so a table can show them all.

    Args:
        df: one row per run.
        value: the measured column (e.g. ``throughput_e2e``).
        target: the scheduler under study (e.g. ``EBRLScheduler``); never a baseline.
        baselines: the baseline schedulers; None means every scheduler but ``target`` (then
            ``target`` is required).
        config_cols: columns that define a configuration (simulator, policy, machine...).
        scheduler_col: the column naming the scheduler (variant) of a run.
        seed_col: pairs runs of two schedulers by seed when both have the same seeds.
        paired: True forces pairing (error if seeds differ), False never pairs, None decides.

    Returns:
        One row per configuration and scheduler: the config columns, ``scheduler_col``,
        ``baseline`` (the strongest one), ``baseline_mean``, ``mean``, ``ratio``, ``ci_low``,
        ``ci_high``, ``n``, ``n_baseline``, ``n_missing``, ``paired``. A configuration with no
        baseline gets NaN ratios and ``baseline`` None.
    """
    rng = rng or np.random.default_rng(0)
    opts = _RatioOpts(higher_is_better, seed_col, paired, conf, reps, rng)
    rows = []
    for key, g in iter_groups(df, config_cols):
        names = sorted(g[scheduler_col].dropna().unique())
        means = g.groupby(scheduler_col)[value].mean()
        bases = [s for s in _baselines_of(names, target, baselines) if not np.isnan(means[s])]
        best = None
        if bases:
            best = max(bases, key=lambda s: means[s] if higher_is_better else -means[s])
        for s in names:
            sub = g[g[scheduler_col] == s]
            row = {**dict(zip(config_cols, key)), scheduler_col: s, "baseline": best}
            row["mean"] = float(sub[value].mean())
            if best is None:
                nan = float("nan")
                row.update(baseline_mean=nan, ratio=nan, ci_low=nan, ci_high=nan)
                row.update(n=len(sub), n_baseline=0, n_missing=0, paired=False)
            else:
                b = g[g[scheduler_col] == best]
                row["baseline_mean"] = float(means[best])
                row.update(_ratio_row(sub, b, value, opts))
            rows.append(row)
    cols = [*config_cols, scheduler_col, "baseline", "baseline_mean", "mean", "ratio"]
    cols += ["ci_low", "ci_high", "n", "n_baseline", "n_missing", "paired"]
    return pd.DataFrame(rows, columns=cols)


def pairwise_ratios(
    df: pd.DataFrame,
    value: str,
    *,
    target: str,
    baselines: Sequence[str] | None = None,
    config_cols: Sequence[str] = (),
    scheduler_col: str = "scheduler_variant",
    seed_col: str | None = "seed",
    higher_is_better: bool = True,
    paired: bool | None = None,
    conf: float = 0.95,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """``target``'s ratio to each baseline of each configuration (see :func:`_ratio_row`).

    Returns:
        One row per configuration and baseline: the config columns, ``baseline``, ``ratio``,
        ``ci_low``, ``ci_high``, ``n``, ``n_baseline``, ``n_missing``, ``paired``.
    """
    rng = rng or np.random.default_rng(0)
    opts = _RatioOpts(higher_is_better, seed_col, paired, conf, reps, rng)
    pairs = _target_vs_baselines(df, target, baselines, config_cols, scheduler_col)
    rows = [{**cfg, "baseline": base, **_ratio_row(t, b, value, opts)} for cfg, base, t, b in pairs]
    cols = [*config_cols, "baseline", "ratio", "ci_low", "ci_high", "n", "n_baseline"]
    return pd.DataFrame(rows, columns=[*cols, "n_missing", "paired"])


def prob_improvement_ci(
    x: np.ndarray,
    y: np.ndarray,
    conf: float = 0.95,
    reps: int = 2_000,
    rng: np.random.Generator | None = None,
) -> Estimate:
    """:func:`prob_improvement` with a percentile bootstrap CI (x and y resampled independently)."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    point = prob_improvement(x, y)
    n = min(len(x), len(y))
    if n < 2:
        return Estimate(point, point, point, n)
    rng = rng or np.random.default_rng(0)
    bx = x[rng.integers(0, len(x), size=(reps, len(x)))]  # (reps, nx)
    by = y[rng.integers(0, len(y), size=(reps, len(y)))]  # (reps, ny)
    gt = (bx[:, :, None] > by[:, None, :]).mean((1, 2))
    eq = (bx[:, :, None] == by[:, None, :]).mean((1, 2))
    boots = gt + 0.5 * eq
    a = (1 - conf) / 2
    return Estimate(point, float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a)), n)


def improvement_probabilities(
    df: pd.DataFrame,
    value: str,
    *,
    target: str,
    baselines: Sequence[str] | None = None,
    config_cols: Sequence[str] = (),
    scheduler_col: str = "scheduler_variant",
    higher_is_better: bool = True,
    conf: float = 0.95,
    reps: int = 2_000,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """P(a run of ``target`` beats a run of each baseline), per configuration, with a CI.

    Returns:
        One row per configuration and baseline: the config columns, ``baseline``, ``p``,
        ``ci_low``, ``ci_high``, ``n``, ``n_baseline``. Missing values are an error (NaN p).
    """
    rng = rng or np.random.default_rng(0)
    sign = 1.0 if higher_is_better else -1.0
    rows = []
    for cfg, base, t, b in _target_vs_baselines(df, target, baselines, config_cols, scheduler_col):
        x = sign * t[value].to_numpy(dtype=float)
        y = sign * b[value].to_numpy(dtype=float)
        if np.isnan(x).any() or np.isnan(y).any():
            est = Estimate(float("nan"), float("nan"), float("nan"), 0)
        else:
            est = prob_improvement_ci(x, y, conf=conf, reps=reps, rng=rng)
        rows.append(
            {
                **cfg,
                "baseline": base,
                "p": est.value,
                "ci_low": est.low,
                "ci_high": est.high,
                "n": len(x),
                "n_baseline": len(y),
            }
        )
    cols = [*config_cols, "baseline", "p", "ci_low", "ci_high", "n", "n_baseline"]
    return pd.DataFrame(rows, columns=cols)


# --- curves: time to a threshold, mean curves with bands -----------------------------------------
def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` points; NaN until ``window`` points exist.

    Trailing (causal), so the smoothed curve at time t uses no data from after t, and a single
    lucky early batch of episodes cannot reach a threshold on its own.
    """
    v = np.asarray(values, dtype=float).ravel()
    if window <= 1:
        return v.copy()
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.full(len(v), np.nan)
    out[window - 1 :] = (c[window:] - c[:-window]) / window
    return out


def _run_curve(g: pd.DataFrame, time_col: str, window: int) -> tuple[np.ndarray, np.ndarray]:
    g = g.sort_values(time_col)
    return g[time_col].to_numpy(dtype=float), smooth(g["value"].to_numpy(dtype=float), window)


def time_to_threshold(
    curves: pd.DataFrame,
    *,
    key: str = "env/success_rate",
    threshold: float = 0.8,
    window: int = 5,
    time_col: str = "wall_s",
) -> pd.DataFrame:
    """First logged time at which each run's smoothed ``key`` curve reaches ``threshold``.

    Args:
        curves: tidy curve rows with ``run_id``, ``key``, ``value`` and ``time_col``.
        window: points of the trailing moving average (see :func:`smooth`).

    Returns:
        One row per run that logged ``key``: ``run_id``, ``time_to_threshold`` (NaN when never
        reached: the run is censored), ``reached``, ``t_end`` (the run's last logged time) and
        ``points``.
    """
    c = curves[curves["key"] == key]
    rows = []
    for run_id, g in c.groupby("run_id", sort=True):
        t, y = _run_curve(g, time_col, window)
        hit = np.nonzero(y >= threshold)[0]
        rows.append(
            {
                "run_id": run_id,
                "time_to_threshold": float(t[hit[0]]) if len(hit) else float("nan"),
                "reached": bool(len(hit)),
                "t_end": float(t[-1]) if len(t) else float("nan"),
                "points": len(t),
            }
        )
    cols = ["run_id", "time_to_threshold", "reached", "t_end", "points"]
    return pd.DataFrame(rows, columns=cols)


def time_to_threshold_ratios(
    ttt: pd.DataFrame,
    *,
    target: str,
    baselines: Sequence[str] | None = None,
    config_cols: Sequence[str] = (),
    scheduler_col: str = "scheduler_variant",
    censored: str = "nan",
    **kw,
) -> pd.DataFrame:
    """How many times sooner ``target`` reaches the threshold than each baseline (ratio CI).

    Args:
        ttt: :func:`time_to_threshold` rows merged with the runs' config and scheduler columns.
        censored: what a run that never reached the threshold counts as. ``"nan"``: the ratio
            of a pair with such a run is NaN (reported, not guessed). ``"budget"``: its last
            logged time, a lower bound on its true time (ratios then carry ``censored`` > 0).
        **kw: passed to :func:`pairwise_ratios` (seed_col, paired, conf, reps, rng).

    Returns:
        :func:`pairwise_ratios` rows (ratio = baseline time / target time; > 1: target sooner)
        plus ``reached`` and ``reached_baseline`` ("2/3"), and ``censored_target`` and
        ``censored_baseline``: runs whose budget stood in for a time (always 0 with ``"nan"``).
    """
    if censored not in ("nan", "budget"):
        raise ValueError(f"censored must be 'nan' or 'budget', not {censored!r}")
    df = ttt.copy()
    df["_t"] = df["time_to_threshold"]
    if censored == "budget":
        df["_t"] = df["_t"].fillna(df["t_end"])
    out = pairwise_ratios(
        df,
        "_t",
        target=target,
        baselines=baselines,
        config_cols=config_cols,
        scheduler_col=scheduler_col,
        higher_is_better=False,
        **kw,
    )
    reach = df.groupby([*config_cols, scheduler_col], dropna=False)["reached"].agg(["sum", "size"])

    def counts(key: tuple, s: str) -> tuple[int, int]:
        r = reach.loc[(*key, s)] if config_cols else reach.loc[s]
        return int(r["sum"]), int(r["size"])

    keys = [tuple(r[c] for c in config_cols) for _, r in out.iterrows()]
    ct = [counts(k, target) for k in keys]
    cb = [counts(k, b) for k, b in zip(keys, out["baseline"])]
    out["reached"] = [f"{a}/{n}" for a, n in ct]
    out["reached_baseline"] = [f"{a}/{n}" for a, n in cb]
    budget = censored == "budget"
    out["censored_target"] = [n - a if budget else 0 for a, n in ct]
    out["censored_baseline"] = [n - a if budget else 0 for a, n in cb]
    return out


def curve_bands(
    curves: pd.DataFrame,
    runs: pd.DataFrame,
    by: Sequence[str],
    *,
    key: str = "env/success_rate",
    window: int = 5,
    time_col: str = "wall_s",
    points: int = 100,
    conf: float = 0.95,
    reps: int = 1_000,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """Mean smoothed curve per group on a common time grid, with a pointwise bootstrap CI band.

    Each run's smoothed curve is held constant between its logged points (its value at t is the
    last one logged at or before t). A group's grid ends at the shortest of its runs, so every
    point averages the same runs.

    Returns:
        Rows ``by`` columns, ``t``, ``mean``, ``ci_low``, ``ci_high``, ``n`` (runs).
    """
    rng = rng or np.random.default_rng(0)
    c = curves[curves["key"] == key].merge(runs[["run_id", *by]], on="run_id", how="inner")
    frames = []
    for gkey, g in iter_groups(c, by):
        per_run = [_run_curve(r, time_col, window) for _, r in g.groupby("run_id", sort=True)]
        per_run = [(t, y) for t, y in per_run if len(t)]
        if not per_run:
            continue
        t_end = min(t[-1] for t, _ in per_run)
        grid = np.linspace(0.0, t_end, points)
        ys = np.full((len(per_run), points), np.nan)  # (runs, points)
        for i, (t, y) in enumerate(per_run):
            idx = np.searchsorted(t, grid, side="right") - 1
            ys[i] = np.where(idx >= 0, y[np.clip(idx, 0, None)], np.nan)
        n = len(per_run)
        boot = ys[rng.integers(0, n, size=(reps, n))].mean(1)  # (reps, points)
        a = (1 - conf) / 2
        with np.errstate(all="ignore"):
            lo, hi = np.quantile(boot, [a, 1 - a], axis=0)
        frame = pd.DataFrame({"t": grid, "mean": ys.mean(0), "ci_low": lo, "ci_high": hi, "n": n})
        for col, v in zip(by, gkey):
            frame.insert(0, col, v)
        frames.append(frame)
    cols = [*by, "t", "mean", "ci_low", "ci_high", "n"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
