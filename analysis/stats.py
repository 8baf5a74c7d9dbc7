"""Statistics over seeds, after rliable (Agarwal et al. 2021), on scipy: bootstrap CIs, IQM, ratios.

Everything is a pure function, with an explicit random generator, so results are reproducible and
testable on known inputs: first of arrays of per-seed values (:func:`bootstrap_ci`,
:func:`ratio_ci`, :func:`iqm`, :func:`prob_improvement`, :func:`stratified_ci` for a runs x tasks
score matrix), then of the tidy tables ``analysis.export`` writes (one row per run, or one row per
curve point): summaries per group, speedup over the strongest baseline, probabilities of
improvement, time to a threshold.

Definitions (rliable's, ``rliable.metrics`` and ``rliable.library``):

- IQM: the 25% trimmed mean, ``scipy.stats.trim_mean(x, 0.25)``; of a (runs x tasks) matrix, of
  all its scores at once (``aggregate_iqm``).
- Stratified bootstrap: the runs of each task are resampled on their own, tasks are never mixed.
- Probability of improvement: P(X > Y) for one run of each, ties counted half, averaged over tasks.

Intervals (``python -m analysis.coverage`` measures each at 3, 5 and 10 seeds; :data:`COVERAGE`
records the defaults' rows): the default of each statistic is the one that covers at its nominal
rate with few seeds, :data:`DEFAULT_METHOD`:

- a mean over seeds (:func:`mean_ci`): Student t (``t``);
- a ratio of two schedulers (:func:`ratio_ci`): Student t on the paired log ratios (``t-log``),
  whose point is the geometric mean of the per-seed ratios; unpaired, Welch's t on the logs (the
  ratio of geometric means);
- a success rate over seeds (:func:`rate_ci`): Wilson's score interval on the effective number of
  episodes, with the t quantile of the seeds (``wilson``): inside [0, 1], and not of zero width
  when every seed succeeds every time.

The bootstrap intervals stay selectable (``method="bca"`` or ``"percentile"``, rliable's
default), from ``scipy.stats.bootstrap``; with 3 and 5 seeds they cover 70-85% of the time, not
95%. BCa is undefined when every resample gives the same statistic or the jackknife is degenerate
(scipy then warns and returns NaN; both happen with 3 seeds: identical values, a ratio that is the
same for every seed); the bootstrap functions then give the percentile interval of the same
resamples and say so in :attr:`Estimate.method`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as st

#: interval methods: name -> what a label calls it (with :data:`CI_ON`, :func:`ci_label`)
CI_NAMES = {
    "t": "Student t",
    "t-log": "Student t",
    "wilson": "Wilson",
    "bca": "BCa bootstrap",
    "percentile": "percentile bootstrap",
}
#: interval methods: name -> what the interval is taken on
CI_ON = {
    "t": "mean over seeds",
    "t-log": "paired log ratio",
    "wilson": "success rate, effective episodes, t quantile",
    "bca": "over seeds",
    "percentile": "over seeds",
}
#: the statistics a table shows -> the methods each can take, default first
METHODS: dict[str, tuple[str, ...]] = {
    "mean": ("t", "bca", "percentile"),
    "ratio": ("t-log", "bca", "percentile"),
    "rate": ("wilson", "t", "bca", "percentile"),
}
#: the default interval of each statistic: chosen by ``python -m analysis.coverage``, the one
#: covering >= 93% of a nominal 95% at 3, 5 and 10 seeds on every realistic scenario (t on rates
#: falls to 84-92% next to the bounds, where Wilson's holds 96-100%; the bootstrap: 70-91%)
DEFAULT_METHOD = {stat: methods[0] for stat, methods in METHODS.items()}
#: bootstrap interval methods (``scipy.stats.bootstrap``'s spelling)
_SCIPY_METHOD = {"bca": "BCa", "percentile": "percentile"}
#: measured coverage of nominal 95% CIs over n seeds, statistic -> method -> n -> coverage:
#: ``python -m analysis.coverage --trials 2000 --reps 1000`` (tests/test_analysis_coverage.py
#: rechecks the defaults). Each statistic's row is its scenario in :data:`COVERAGE_SCENARIO`,
#: the one closest to the committed results' spread (their median per-cell sd of log throughput
#: is 0.045, of a paired log ratio 0.053). Every bootstrap interval under-covers with few seeds:
#: it resamples only the n values seen.
COVERAGE: dict[str, dict[str, dict[int, float]]] = {
    "mean": {
        "t": {3: 0.955, 5: 0.954, 10: 0.958},
        "bca": {3: 0.710, 5: 0.840, 10: 0.898},
        "percentile": {3: 0.750, 5: 0.834, 10: 0.910},
    },
    "ratio": {
        "t-log": {3: 0.950, 5: 0.957, 10: 0.950},
        "bca": {3: 0.734, 5: 0.837, 10: 0.906},
        "percentile": {3: 0.753, 5: 0.817, 10: 0.888},
    },
    "rate": {
        "wilson": {3: 0.974, 5: 0.956, 10: 0.958},
        "t": {3: 0.935, 5: 0.933, 10: 0.942},
        "bca": {3: 0.708, 5: 0.832, 10: 0.892},
        "percentile": {3: 0.730, 5: 0.834, 10: 0.894},
    },
}
#: statistic -> the scenario (``analysis.coverage.SCENARIOS``) its COVERAGE row was measured on
COVERAGE_SCENARIO: dict[str, str] = {
    "mean": "throughput, sd(log) 0.045",
    "ratio": "x1.1, sd(log ratio) 0.053",
    "rate": "0.80, sd 0.10 between seeds, 100 episodes",
}

NAN = float("nan")


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval.

    Attributes:
        method: the interval actually computed: ``t``, ``t-log``, ``wilson``, ``bca``,
            ``percentile`` (asked for, or BCa was undefined on these values); empty when there is
            no interval (n < 2).
    """

    value: float
    low: float
    high: float
    n: int
    method: str = ""

    def fmt(self, spec: str = ".0f") -> str:
        if self.n < 2:
            return f"{self.value:{spec}} (n={self.n})"
        return f"{self.value:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def ci_label(method: str, conf: float = 0.95, n: int | None = None, paired: bool = True) -> str:
    """What a label, header or footnote calls an interval, naming its method and what it is
    taken on: ``95% Student t CI (paired log ratio, n=5)``, ``95% BCa bootstrap CI (over seeds)``.

    Args:
        n: the seeds behind it, where one number holds for every interval labelled.
        paired: for ``t-log``: False names the unpaired form (Welch's t on the logs).
    """
    on = CI_ON[method]
    if method == "t-log" and not paired:
        on = "log ratio, unpaired (Welch)"
    return f"{conf:.0%} {CI_NAMES[method]} CI ({on}" + ("" if n is None else f", n={n}") + ")"


def _check_method(method: str, allowed: Sequence[str] = ("bca", "percentile")) -> None:
    if method not in allowed:
        raise ValueError(f"interval method must be one of {list(allowed)}, not {method!r}")


def method_for(statistic: str, ci: str | None = None) -> str:
    """The interval method of ``statistic`` (``mean``, ``ratio``, ``rate``) when a table or a
    command asks for ``ci``: None or ``default``: the statistic's :data:`DEFAULT_METHOD`; a
    bootstrap method: that one for every statistic; ``t``: the statistic's t interval (a ratio's
    is ``t-log``, a rate's ``t`` on the rates); a method of that statistic: itself.

    Raises:
        ValueError: ``ci`` is no method of any statistic.
    """
    if ci is None or ci == "default":
        return DEFAULT_METHOD[statistic]
    known = sorted({m for ms in METHODS.values() for m in ms})
    _check_method(ci, ["default", *known])
    if ci in METHODS[statistic]:
        return ci
    return "t-log" if statistic == "ratio" and ci == "t" else DEFAULT_METHOD[statistic]


def iqm(x: np.ndarray | Sequence[float], axis: int | None = None) -> float | np.ndarray:
    """Interquartile mean, rliable's: ``scipy.stats.trim_mean(x, 0.25)``.

    ``int(0.25 * n)`` values are cut from each end and the rest averaged: the plain mean for
    n <= 3, the middle 3 of 5, the middle 6 of 10 (the quartile edges are not interpolated).

    Args:
        x: values; a (runs x tasks) matrix is taken whole, as rliable's ``aggregate_iqm``.
        axis: None: over all values; an int: along that axis (vectorised resamples).

    Returns:
        A float for ``axis=None`` (NaN when ``x`` is empty), else an array.
    """
    a = np.asarray(x, dtype=float)
    if axis is None:
        return float(st.trim_mean(a, 0.25, axis=None)) if a.size else NAN
    return st.trim_mean(a, 0.25, axis=axis)


def iqm_interpolated(x: np.ndarray | Sequence[float]) -> float:
    """This package's IQM before scipy (kept only to print old and new side by side).

    The mean of the middle 50% with linear weights at the quartile edges: each of n sorted values
    covers [i/n, (i+1)/n) of the quantile axis and is weighted by its overlap with [.25, .75).
    It is not rliable's IQM: [1, 2, 3, 7, 100] gives 3.9 here, 4.0 there.
    """
    v = np.sort(np.asarray(x, dtype=float).ravel())
    n = len(v)
    if n == 0:
        return NAN
    lo, hi = np.arange(n) / n, (np.arange(n) + 1) / n
    w = np.clip(np.minimum(hi, 0.75) - np.maximum(lo, 0.25), 0, None)
    return float(np.sum(w * v) / np.sum(w))


def _mean_ratio(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(num, axis=axis) / np.mean(den, axis=axis)


def _bootstrap(
    samples: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    paired: bool,
    method: str,
    conf: float,
    reps: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``scipy.stats.bootstrap`` along the last axis, with BCa's undefined cases made explicit.

    Args:
        samples: arrays whose last axis is resampled (leading axes: independent problems, e.g.
            the points of a curve); several samples are resampled with the same indices when
            ``paired``, each on its own otherwise.
        statistic: ``statistic(*samples, axis=-1)``, vectorised.

    Returns:
        (low, high, fell_back): the interval, and where BCa was asked for but undefined (all
        resamples equal, or a degenerate jackknife) and the percentile interval of the same
        resamples stands in. Where every resample is equal that interval has zero width.
    """
    with warnings.catch_warnings():
        # the undefined cases are detected below, from the NaNs scipy returns with its warning
        warnings.simplefilter("ignore", st.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        res = st.bootstrap(
            tuple(samples),
            statistic,
            n_resamples=reps,
            vectorized=True,
            paired=paired,
            axis=-1,
            confidence_level=conf,
            method=_SCIPY_METHOD[method],
            rng=rng,
        )
    low = np.asarray(res.confidence_interval.low, dtype=float)
    high = np.asarray(res.confidence_interval.high, dtype=float)
    bad = ~(np.isfinite(low) & np.isfinite(high))
    if bad.any():
        a = (1 - conf) / 2
        boot = np.asarray(res.bootstrap_distribution, dtype=float)
        with np.errstate(invalid="ignore"):
            plo, phi = np.quantile(boot, [a, 1 - a], axis=-1)
        low, high = np.where(bad, plo, low), np.where(bad, phi, high)
    fell_back = bad & np.isfinite(low) if method == "bca" else np.zeros_like(bad)
    return low, high, fell_back


def _estimate(
    point: float, low: np.ndarray, high: np.ndarray, fell_back: np.ndarray, n: int, method: str
) -> Estimate:
    used = "percentile" if bool(fell_back) else method
    return Estimate(point, float(low), float(high), n, used)


def mean_ci(
    x: np.ndarray | Sequence[float],
    conf: float = 0.95,
    method: str = DEFAULT_METHOD["mean"],
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> Estimate:
    """The mean of ``x`` (one value per seed) with a CI: Student t by default (:func:`t_ci`),
    ``bca`` or ``percentile`` by :func:`bootstrap_ci`."""
    _check_method(method, METHODS["mean"])
    if method == "t":
        return t_ci(x, conf)
    return bootstrap_ci(x, conf=conf, reps=reps, rng=rng, method=method)


def rate_ci(
    rates: np.ndarray | Sequence[float],
    trials: float | np.ndarray | Sequence[float] | None = None,
    conf: float = 0.95,
    method: str = DEFAULT_METHOD["rate"],
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> Estimate:
    """The mean of success rates in [0, 1] (one per seed) with a CI that stays in [0, 1].

    ``wilson`` (default): Wilson's score interval for a proportion on an effective number of
    episodes (its design-effect form for clustered samples, with a t quantile): the seeds are
    clusters of episodes, so the variance of the mean is the larger of the one seen
    between seeds and the binomial one of all the episodes; ``N = p (1 - p) / variance`` is the
    number of independent episodes that variance is worth, and the quantile is Student t's with
    n - 1 degrees of freedom, since the variance is estimated from n seeds. Where every seed
    scored the same (all 1.0, say) the binomial variance of the episodes still gives a width.

    Args:
        rates: per-seed success rates.
        trials: episodes behind each rate (a number for all, or one per seed): the binomial
            floor of the variance. None: unknown, no floor (seeds that all agree then give a
            zero-width interval).
        method: ``wilson``, or ``t``, ``bca``, ``percentile`` on the rates as plain numbers.

    Raises:
        ValueError: a rate outside [0, 1], or trials that are not positive.
    """
    _check_method(method, METHODS["rate"])
    x = np.asarray(rates, dtype=float).ravel()
    if ((x < 0) | (x > 1)).any():
        raise ValueError(f"success rates must lie in [0, 1], got {x[(x < 0) | (x > 1)][:3]}")
    if method != "wilson":
        return mean_ci(x, conf, method, reps, rng)
    n = len(x)
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0)
    p = float(x.mean())
    if n == 1:
        return Estimate(p, p, p, 1)
    episodes = np.inf
    if trials is not None:
        tr = np.broadcast_to(np.asarray(trials, dtype=float), x.shape)
        if not (tr > 0).all():
            raise ValueError(f"trials (episodes per seed) must be positive, got {tr}")
        episodes = float(tr.sum())
    var = max(float(x.var(ddof=1)) / n, p * (1 - p) / episodes)
    n_eff = p * (1 - p) / var if var > 0 else episodes
    if not np.isfinite(n_eff):
        return Estimate(p, p, p, n, "wilson")
    q = float(st.t.ppf(0.5 + conf / 2, n - 1))
    denom = 1 + q * q / n_eff
    centre = (p + q * q / (2 * n_eff)) / denom
    half = q * np.sqrt(p * (1 - p) / n_eff + q * q / (4 * n_eff * n_eff)) / denom
    return Estimate(p, float(max(0.0, centre - half)), float(min(1.0, centre + half)), n, "wilson")


def bootstrap_ci(
    x: np.ndarray | Sequence[float],
    stat: Callable[..., np.ndarray] = np.mean,
    conf: float = 0.95,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
    method: str = "bca",
) -> Estimate:
    """Bootstrap CI of ``stat`` over the samples ``x`` (e.g. one value per seed).

    Args:
        stat: a statistic that takes ``axis`` (``np.mean``, :func:`iqm`, ``np.median``).
        method: ``bca`` (default) or ``percentile``; see the module docstring for BCa's
            undefined cases.

    Returns:
        The statistic of ``x`` with its interval; n < 2: no interval (low = high = value).
    """
    _check_method(method)
    x = np.asarray(x, dtype=float).ravel()
    n = len(x)
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0)
    point = float(stat(x))
    if n == 1:
        return Estimate(point, point, point, 1)
    rng = rng or np.random.default_rng(0)
    lo, hi, fb = _bootstrap([x], stat, paired=False, method=method, conf=conf, reps=reps, rng=rng)
    return _estimate(point, lo, hi, fb, n, method)


def _t_log_ratio(num: np.ndarray, den: np.ndarray, paired: bool, conf: float) -> Estimate:
    """Student t on log ratios: paired, the mean of log(num_i / den_i) with n - 1 degrees of
    freedom; unpaired, the difference of the mean logs with Welch's degrees of freedom. Back on the
    ratio scale: the geometric mean of the per-seed ratios (paired), or the ratio of geometric
    means, with its interval."""
    if (num <= 0).any() or (den <= 0).any():
        raise ValueError(
            "a t interval on log ratios needs positive values (throughputs, times), got "
            f"{num.tolist()} / {den.tolist()}; for values that can be 0 pass method='bca' or "
            "'percentile'"
        )
    if paired:
        d = np.log(num) - np.log(den)
        m, n = float(d.mean()), len(d)
        se, df = float(d.std(ddof=1) / np.sqrt(n)), n - 1.0
    else:
        la, lb = np.log(num), np.log(den)
        m, n = float(la.mean() - lb.mean()), min(len(la), len(lb))
        va, vb = la.var(ddof=1) / len(la), lb.var(ddof=1) / len(lb)
        se = float(np.sqrt(va + vb))
        df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1)) if se > 0 else 1.0
    half = float(st.t.ppf(0.5 + conf / 2, df)) * se
    return Estimate(float(np.exp(m)), float(np.exp(m - half)), float(np.exp(m + half)), n, "t-log")


def ratio_ci(
    num: np.ndarray | Sequence[float],
    den: np.ndarray | Sequence[float],
    paired: bool = True,
    conf: float = 0.95,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
    method: str = DEFAULT_METHOD["ratio"],
) -> Estimate:
    """How many times ``num`` is ``den`` over seeds, with a CI.

    ``t-log`` (default): Student t on the log ratios; the point is the geometric mean of the
    per-seed ratios num[i] / den[i] (paired) or the ratio of the geometric means (unpaired), which
    equals the ratio of means when both sides spread alike. ``bca``, ``percentile``: a bootstrap
    CI of mean(num) / mean(den), the ratio of means.

    Args:
        paired: num[i] and den[i] come from the same seed i: each resample draws seed indices
            once and takes both values of each drawn seed, so what the two share (the machine's
            state, the seed's episodes) cancels in the ratio. False: the two groups are resampled
            independently (their sizes may differ); the interval then also carries the spread
            between seeds that pairing would cancel, so it is wider: right when the runs share
            nothing, conservative when they do.
        method: ``t-log`` (default), ``bca`` or ``percentile``. When every seed has the same
            ratio the interval is that value, zero width (BCa undefined).

    Raises:
        ValueError: ``paired`` with groups of different sizes; ``t-log`` with a value <= 0.
    """
    _check_method(method, METHODS["ratio"])
    num, den = np.asarray(num, float).ravel(), np.asarray(den, float).ravel()
    if len(num) == 0 or len(den) == 0:
        return Estimate(NAN, NAN, NAN, 0)
    point = float(num.mean() / den.mean())
    if paired and len(num) != len(den):
        raise ValueError("paired ratio needs equally many samples")
    n = min(len(num), len(den))
    if method == "t-log" and n >= 2:
        return _t_log_ratio(num, den, paired, conf)
    if n < 2:
        if method == "t-log" and (num > 0).all() and (den > 0).all():
            point = float(np.exp(np.log(num).mean() - np.log(den).mean()))
        return Estimate(point, point, point, n)
    rng = rng or np.random.default_rng(0)
    lo, hi, fb = _bootstrap(
        [num, den], _mean_ratio, paired=paired, method=method, conf=conf, reps=reps, rng=rng
    )
    return _estimate(point, lo, hi, fb, n, method)


def _task_columns(scores: np.ndarray | Sequence[float]) -> list[np.ndarray]:
    """A score matrix (runs x tasks) as one array of runs per task; a vector is one task."""
    s = np.asarray(scores, dtype=float)
    if s.ndim == 1:
        s = s[:, None]
    if s.ndim != 2:
        raise ValueError(f"scores must be runs x tasks, not of shape {s.shape}")
    return [s[:, j] for j in range(s.shape[1])]


def _pooled(cols: Sequence[np.ndarray]) -> np.ndarray:
    """The tasks' runs side by side along the last axis (leading axes broadcast: resamples)."""
    lead = np.broadcast_shapes(*(c.shape[:-1] for c in cols))
    return np.concatenate([np.broadcast_to(c, lead + c.shape[-1:]) for c in cols], axis=-1)


def _iqm_of_tasks(*cols: np.ndarray, axis: int = -1) -> np.ndarray:
    """rliable's aggregate IQM: the trimmed mean of every task's runs together."""
    return st.trim_mean(_pooled([np.moveaxis(c, axis, -1) for c in cols]), 0.25, axis=-1)


def _mean_of_tasks(*cols: np.ndarray, axis: int = -1) -> np.ndarray:
    """rliable's aggregate mean: the mean over tasks of each task's mean over runs."""
    lead = np.broadcast_shapes(*(c.shape[:-1] for c in cols))
    means = [np.broadcast_to(np.mean(np.moveaxis(c, axis, -1), axis=-1), lead) for c in cols]
    return np.mean(np.stack(means, axis=-1), axis=-1)


#: aggregate scores of a (runs x tasks) matrix, as functions of the task columns
AGGREGATES: dict[str, Callable[..., np.ndarray]] = {"iqm": _iqm_of_tasks, "mean": _mean_of_tasks}


def aggregate(scores: np.ndarray | Sequence[float], how: str = "iqm") -> float:
    """rliable's ``aggregate_iqm`` (``how="iqm"``) or ``aggregate_mean`` of runs x tasks."""
    cols = _task_columns(scores)
    if not len(cols[0]):
        return NAN
    return float(AGGREGATES[how](*cols))


def stratified_ci(
    scores: np.ndarray | Sequence[float],
    how: str = "iqm",
    conf: float = 0.95,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
    method: str = "bca",
) -> Estimate:
    """:func:`aggregate` of a runs x tasks matrix with a stratified bootstrap CI.

    Each task's runs are resampled on their own (rliable's ``StratifiedBootstrap``): every
    resample keeps every task with as many runs as it had. scipy does this when each task is a
    separate sample (``paired=False``); its BCa then takes the jackknife over each task's runs.

    Args:
        scores: (runs x tasks); a vector is one task.
        how: ``iqm`` or ``mean``.
        method: ``bca`` (default) or ``percentile`` (rliable's default).
    """
    _check_method(method)
    cols = _task_columns(scores)
    n = len(cols[0])
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0)
    point = aggregate(scores, how)
    if n == 1:
        return Estimate(point, point, point, 1)
    rng = rng or np.random.default_rng(0)
    stat = AGGREGATES[how]
    lo, hi, fb = _bootstrap(cols, stat, paired=False, method=method, conf=conf, reps=reps, rng=rng)
    return _estimate(point, lo, hi, fb, n, method)


def _p_improve(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(X > Y) + P(X = Y) / 2 between all pairs along ``axis`` (leading axes broadcast)."""
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    gt = (x[..., :, None] > y[..., None, :]).mean((-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean((-2, -1))
    return gt + 0.5 * eq


def prob_improvement(x: np.ndarray | Sequence[float], y: np.ndarray | Sequence[float]) -> float:
    """rliable's probability of improvement: P(X > Y) for one run of each, ties count half.

    Args:
        x, y: runs of each (vectors), or runs x tasks matrices with the same tasks: then the
            probability per task, averaged over tasks.
    """
    xc, yc = _task_columns(x), _task_columns(y)
    if len(xc) != len(yc):
        raise ValueError(f"x has {len(xc)} tasks, y {len(yc)}")
    if len(xc[0]) == 0 or len(yc[0]) == 0:
        return NAN
    return float(np.mean([_p_improve(a, b) for a, b in zip(xc, yc)]))


def t_ci(x: np.ndarray | Sequence[float], conf: float = 0.95) -> Estimate:
    """Student-t CI of the mean: exact for normal data at any n (the bootstrap is not, n < 10)."""
    x = np.asarray(x, dtype=float).ravel()
    n = len(x)
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0)
    m = float(x.mean())
    if n == 1:
        return Estimate(m, m, m, 1)
    half = float(st.t.ppf(0.5 + conf / 2, n - 1) * x.std(ddof=1) / np.sqrt(n))
    return Estimate(m, m - half, m + half, n, "t")


# --- tables of runs: pure functions on DataFrames ------------------------------------------------
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
    ci: str | None = None,
    statistic: str = "mean",
    trials_col: str | None = None,
    reps: int = 10_000,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """Mean, std, CI and IQM of ``value`` over the rows (seeds) of each group.

    Args:
        df: one row per run.
        value: the column to summarise.
        by: grouping columns (a configuration and a scheduler, say).
        ci: the interval, resolved by :func:`method_for`: None (the statistic's default),
            ``t``, ``bca``, ``percentile`` (rliable's), ``wilson`` (rates); see :data:`COVERAGE`.
        statistic: ``mean`` (:func:`mean_ci`) or ``rate``, a success rate in [0, 1]
            (:func:`rate_ci`).
        trials_col: for a rate, the column with each run's episodes behind it (e.g.
            ``eval_episodes``), where the runs recorded it.

    Returns:
        One row per group: the ``by`` columns, ``n`` (non-missing values), ``n_missing``, ``mean``,
        ``std`` (ddof=1; NaN for n < 2), ``ci_low``, ``ci_high``, ``ci_method`` (the interval
        computed: ``percentile`` where BCa was undefined; empty for n < 2), ``iqm``.
    """
    if statistic not in ("mean", "rate"):
        raise ValueError(f"statistic must be 'mean' or 'rate', not {statistic!r}")
    method = method_for(statistic, ci)
    rng = rng or np.random.default_rng(0)
    rows = []
    for key, g in iter_groups(df, by):
        x = g[value].to_numpy(dtype=float)
        keep = ~np.isnan(x)
        ok = x[keep]
        if statistic == "rate":
            trials = None
            if trials_col is not None and trials_col in g:
                tr = g[trials_col].to_numpy(dtype=float)[keep]
                trials = tr if np.isfinite(tr).all() else None
            est = rate_ci(ok, trials, conf=conf, method=method, reps=reps, rng=rng)
        else:
            est = mean_ci(ok, conf=conf, method=method, reps=reps, rng=rng)
        rows.append(
            {
                **dict(zip(by, key)),
                "n": len(ok),
                "n_missing": len(x) - len(ok),
                "mean": est.value,
                "std": float(ok.std(ddof=1)) if len(ok) > 1 else float("nan"),
                "ci_low": est.low,
                "ci_high": est.high,
                "ci_method": est.method,
                "iqm": iqm(ok),
            }
        )
    cols = [*by, "n", "n_missing", "mean", "std", "ci_low", "ci_high", "ci_method", "iqm"]
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
    method: str = DEFAULT_METHOD["ratio"]


def _ratio_row(t: pd.DataFrame, b: pd.DataFrame, value: str, opts: _RatioOpts) -> dict:
    """Improvement of group ``t`` over group ``b`` as a ratio, with a CI (paired by seed where
    :func:`_aligned` pairs them; see :func:`ratio_ci` for the point of each method).

    The ratio is ``mean(t) / mean(b)`` when higher is better (a speedup in throughput) and
    ``mean(b) / mean(t)`` when lower is (a speedup in time to a threshold): > 1 means ``t`` wins
    (the geometric means, or per-seed ratios, for ``t-log``).
    Any missing value makes the ratio NaN (``n_missing`` says how many): no silent dropping.
    """
    x, y, was_paired = _aligned(t, b, value, opts.seed_col, opts.paired)
    missing = int(np.isnan(x).sum() + np.isnan(y).sum())
    out = {"n": len(x), "n_baseline": len(y), "n_missing": missing, "paired": was_paired}
    if missing or len(x) == 0 or len(y) == 0:
        return {**out, "ratio": NAN, "ci_low": NAN, "ci_high": NAN, "ci_method": ""}
    num, den = (x, y) if opts.higher_is_better else (y, x)
    est = ratio_ci(
        num,
        den,
        paired=was_paired,
        conf=opts.conf,
        reps=opts.reps,
        rng=opts.rng,
        method=opts.method,
    )
    return {**out, "ratio": est.value, "ci_low": est.low, "ci_high": est.high, **_m(est)}


def _m(est: Estimate) -> dict[str, str]:
    return {"ci_method": est.method}


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
    method: str = DEFAULT_METHOD["ratio"],
) -> pd.DataFrame:
    """Each scheduler's ratio to the strongest baseline of its configuration, with a CI over seeds.

    The strongest baseline of a configuration is the baseline with the best mean ``value``
    (highest, or lowest when ``higher_is_better`` is False), chosen among the schedulers that ran
    in that configuration. Every scheduler of the configuration gets a row (the strongest baseline
    itself has ratio 1), so a table can show them all.

    Args:
        df: one row per run.
        value: the measured column (e.g. ``throughput_e2e``).
        target: the scheduler under study (e.g. ``EBRL``), as ``scheduler_col`` spells it; never
            a baseline.
        baselines: the baseline schedulers; None means every scheduler but ``target`` (then
            ``target`` is required).
        config_cols: columns that define a configuration (simulator, policy, machine...).
        scheduler_col: the column naming the scheduler (variant) of a run.
        seed_col: pairs runs of two schedulers by seed when both have the same seeds.
        paired: True forces pairing (error if seeds differ), False never pairs, None decides
            (pairs when both have the same seeds, each once).
        method: the ratio's interval, ``t-log`` (default), ``bca`` or ``percentile``
            (:func:`ratio_ci`).

    Returns:
        One row per configuration and scheduler: the config columns, ``scheduler_col``,
        ``baseline`` (the strongest one), ``baseline_mean``, ``mean``, ``ratio``, ``ci_low``,
        ``ci_high``, ``ci_method``, ``n``, ``n_baseline``, ``n_missing``, ``paired``. A
        configuration with no baseline gets NaN ratios and ``baseline`` None.
    """
    rng = rng or np.random.default_rng(0)
    opts = _RatioOpts(higher_is_better, seed_col, paired, conf, reps, rng, method)
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
                row.update(baseline_mean=NAN, ratio=NAN, ci_low=NAN, ci_high=NAN, ci_method="")
                row.update(n=len(sub), n_baseline=0, n_missing=0, paired=False)
            else:
                b = g[g[scheduler_col] == best]
                row["baseline_mean"] = float(means[best])
                row.update(_ratio_row(sub, b, value, opts))
            rows.append(row)
    cols = [*config_cols, scheduler_col, "baseline", "baseline_mean", "mean", "ratio"]
    cols += ["ci_low", "ci_high", "ci_method", "n", "n_baseline", "n_missing", "paired"]
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
    method: str = DEFAULT_METHOD["ratio"],
) -> pd.DataFrame:
    """``target``'s ratio to each baseline of each configuration (see :func:`_ratio_row`).

    Returns:
        One row per configuration and baseline: the config columns, ``baseline``, ``ratio``,
        ``ci_low``, ``ci_high``, ``ci_method``, ``n``, ``n_baseline``, ``n_missing``, ``paired``.
    """
    rng = rng or np.random.default_rng(0)
    opts = _RatioOpts(higher_is_better, seed_col, paired, conf, reps, rng, method)
    pairs = _target_vs_baselines(df, target, baselines, config_cols, scheduler_col)
    rows = [{**cfg, "baseline": base, **_ratio_row(t, b, value, opts)} for cfg, base, t, b in pairs]
    cols = [*config_cols, "baseline", "ratio", "ci_low", "ci_high", "ci_method", "n"]
    return pd.DataFrame(rows, columns=[*cols, "n_baseline", "n_missing", "paired"])


def prob_improvement_ci(
    x: np.ndarray | Sequence[float],
    y: np.ndarray | Sequence[float],
    conf: float = 0.95,
    reps: int = 2_000,
    rng: np.random.Generator | None = None,
    method: str = "bca",
) -> Estimate:
    """:func:`prob_improvement` of two vectors with a bootstrap CI (x and y resampled
    independently, as rliable's ``StratifiedIndependentBootstrap``). When every run of x beats
    every run of y, each resample gives 1 too: the interval is [1, 1] (BCa undefined)."""
    _check_method(method)
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    point = prob_improvement(x, y)
    n = min(len(x), len(y))
    if n < 2:
        return Estimate(point, point, point, n)
    rng = rng or np.random.default_rng(0)
    lo, hi, fb = _bootstrap(
        [x, y], _p_improve, paired=False, method=method, conf=conf, reps=reps, rng=rng
    )
    return _estimate(point, lo, hi, fb, n, method)


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
    method: str = "bca",
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
            est = Estimate(NAN, NAN, NAN, 0)
        else:
            est = prob_improvement_ci(x, y, conf=conf, reps=reps, rng=rng, method=method)
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
    method: str = DEFAULT_METHOD["mean"],
) -> pd.DataFrame:
    """Mean smoothed curve per group on a common time grid, with a pointwise bootstrap CI band.

    Each run's smoothed curve is held constant between its logged points (its value at t is the
    last one logged at or before t). A group's grid ends at the shortest of its runs, so every
    point averages the same runs. The band is :func:`mean_ci`'s interval of the mean at each
    point: Student t by default, or a bootstrap one (the same resampled runs at every point);
    where all runs agree it has zero width.

    Returns:
        Rows ``by`` columns, ``t``, ``mean``, ``ci_low``, ``ci_high``, ``n`` (runs).
    """
    _check_method(method, METHODS["mean"])
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
        lo, hi = np.full(points, NAN), np.full(points, NAN)
        if n == 1:  # one run: its own curve, no interval (as an Estimate with n = 1)
            lo, hi = ys[0].copy(), ys[0].copy()
        ok = np.isfinite(ys).all(0)  # points before a run's first value have no mean
        if n > 1 and ok.any() and method == "t":
            half = st.t.ppf(0.5 + conf / 2, n - 1) * ys[:, ok].std(0, ddof=1) / np.sqrt(n)
            lo[ok], hi[ok] = ys[:, ok].mean(0) - half, ys[:, ok].mean(0) + half
        elif n > 1 and ok.any():
            lo[ok], hi[ok], _ = _bootstrap(
                [ys[:, ok].T], np.mean, paired=False, method=method, conf=conf, reps=reps, rng=rng
            )
        frame = pd.DataFrame({"t": grid, "mean": ys.mean(0), "ci_low": lo, "ci_high": hi, "n": n})
        for col, v in zip(by, gkey):
            frame.insert(0, col, v)
        frames.append(frame)
    cols = [*by, "t", "mean", "ci_low", "ci_high", "n"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
