"""How often a nominal 95% CI over n seeds holds the true value: the measure of each interval.

A simulation on known generating processes, through the same functions the tables use
(:func:`analysis.stats.mean_ci`, :func:`analysis.stats.ratio_ci`, :func:`analysis.stats.rate_ci`):
draw n seeds' values, build each interval, count the trials whose interval holds the truth. One
table per statistic a report shows, on scenarios shaped like the committed results:

- ``mean`` (a throughput, a time): normal data, log-normal throughputs with the spread between
  seeds seen in ``results/`` (sd of log throughput per cell: median 0.045, 90th percentile 0.12),
  and two harder shapes (log-normal(0, 1), Student t with 3 dof). Truth: the mean.
- ``ratio`` (EBRL over a baseline, paired by seed): both sides log-normal around their medians,
  sharing a per-seed factor (the machine, the seed's episodes), with the spread of paired log
  ratios seen in ``results/`` (median 0.053, 90th percentile 0.13, largest 0.47), and one where
  the two sides spread unequally. Truth: the ratio of the true means (equal to the ratio of
  geometric means where both sides spread alike; 1.1% above it in the unequal scenario).
- ``rate`` (a success rate per seed): each seed's policy succeeds with its own probability, drawn
  from a Beta of the given mean and sd between seeds, then evaluated on m episodes (binomial),
  from mid-range to next to the bounds (0.98, as LIBERO's targets). Truth: the Beta's mean.

With few seeds every bootstrap interval is too narrow (it resamples only the n values seen);
the t intervals are exact for normal data (of values, or of log ratios). :data:`analysis.stats.
COVERAGE` records the defaults' rows, and :data:`analysis.stats.DEFAULT_METHOD` the choice.

Usage: ``python -m analysis.coverage [--trials 2000] [--reps 1000] [--n 3,5,10] [--seed 0]
[--statistic mean,ratio,rate]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import stats

#: draws the data of n seeds: (values,) for a mean, (num, den) for a ratio, (rates, episodes)
Sampler = Callable[[np.random.Generator, int], tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Scenario:
    """A generating process: how n seeds' data are drawn, and the true value."""

    sample: Sampler
    truth: float


def _lognormal(median: float, sd_log: float) -> Scenario:
    def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        return (median * np.exp(rng.normal(0.0, sd_log, n)),)

    return Scenario(sample, median * float(np.exp(sd_log**2 / 2)))


def _paired(ratio: float, sd_log_ratio: float, sd_num: float | None = None) -> Scenario:
    """num = 100 ratio exp(s + a), den = 100 exp(s + b): s shared by a seed's two runs (sd
    0.05), a and b each run's own (sd ``sd_num`` and the rest of ``sd_log_ratio``, or half of
    its variance each)."""
    own = sd_log_ratio / np.sqrt(2)
    sa, sb = (own, own) if sd_num is None else (sd_num, np.sqrt(sd_log_ratio**2 - sd_num**2))

    def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        s = rng.normal(0.0, 0.05, n)
        return 100.0 * ratio * np.exp(s + rng.normal(0, sa, n)), 100.0 * np.exp(
            s + rng.normal(0, sb, n)
        )

    return Scenario(sample, ratio * float(np.exp((sa**2 - sb**2) / 2)))


def _beta_binomial(mean: float, sd: float, episodes: int) -> Scenario:
    k = mean * (1 - mean) / sd**2 - 1  # Beta(a, b) with a + b = k has this mean and sd
    a, b = mean * k, (1 - mean) * k

    def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        p = rng.beta(a, b, n)
        return rng.binomial(episodes, p) / episodes, np.full(n, float(episodes))

    return Scenario(sample, mean)


#: statistic -> scenario name -> scenario
SCENARIOS: dict[str, dict[str, Scenario]] = {
    "mean": {
        "normal(3, 2)": Scenario(lambda rng, n: (rng.normal(3.0, 2.0, n),), 3.0),
        "throughput, sd(log) 0.045": _lognormal(100.0, 0.045),
        "throughput, sd(log) 0.12": _lognormal(100.0, 0.12),
        "lognormal(0, 1)": _lognormal(1.0, 1.0),
        "student t, 3 dof": Scenario(lambda rng, n: (rng.standard_t(3, n),), 0.0),
    },
    "ratio": {
        "x1.1, sd(log ratio) 0.053": _paired(1.1, 0.053),
        "x1.1, sd(log ratio) 0.13": _paired(1.1, 0.13),
        "x1.1, sd(log ratio) 0.47": _paired(1.1, 0.47),
        "x1.1, sd(log) 0.15 vs 0.03": _paired(1.1, float(np.hypot(0.15, 0.03)), sd_num=0.15),
    },
    "rate": {
        "0.80, sd 0.10 between seeds, 100 episodes": _beta_binomial(0.8, 0.1, 100),
        "0.50, sd 0.20, 50 episodes": _beta_binomial(0.5, 0.2, 50),
        "0.95, sd 0.03, 50 episodes": _beta_binomial(0.95, 0.03, 50),
        "0.98, sd 0.015, 50 episodes": _beta_binomial(0.98, 0.015, 50),
        "0.05, sd 0.03, 16 episodes": _beta_binomial(0.05, 0.03, 16),
    },
}


def interval(
    statistic: str,
    data: tuple[np.ndarray, ...],
    method: str,
    *,
    reps: int,
    rng: np.random.Generator,
) -> stats.Estimate:
    """The 95% CI of ``statistic`` on one draw of ``data``, as the tables compute it."""
    if statistic == "mean":
        return stats.mean_ci(data[0], method=method, reps=reps, rng=rng)
    if statistic == "ratio":
        return stats.ratio_ci(data[0], data[1], paired=True, method=method, reps=reps, rng=rng)
    if statistic == "rate":
        return stats.rate_ci(data[0], data[1], method=method, reps=reps, rng=rng)
    raise ValueError(f"statistic must be one of {list(SCENARIOS)}, not {statistic!r}")


def coverage(
    statistic: str,
    scenario: str,
    n: int,
    method: str,
    *,
    trials: int,
    reps: int,
    rng: np.random.Generator,
) -> float:
    """Fraction of ``trials`` draws of n seeds whose 95% CI holds the scenario's true value."""
    sc = SCENARIOS[statistic][scenario]
    hits = 0
    for _ in range(trials):
        e = interval(statistic, sc.sample(rng, n), method, reps=reps, rng=rng)
        hits += e.low <= sc.truth <= e.high
    return hits / trials


def table(
    statistic: str,
    ns: Sequence[int] = (3, 5, 10),
    scenarios: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    *,
    trials: int = 2000,
    reps: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Coverage per scenario, n and method of one statistic; each (scenario, n, method) cell has
    its own stream (seeded by the names and n), so a cell reruns alone with the same numbers."""
    scenarios = list(SCENARIOS[statistic] if scenarios is None else scenarios)
    methods = list(stats.METHODS[statistic] if methods is None else methods)
    rows = []
    for d in scenarios:
        for n in ns:
            row: dict[str, object] = {"scenario": d, "n": n}
            for m in methods:
                key = [seed, n, *f"{statistic}/{d}/{m}".encode()]
                rng = np.random.default_rng(key)
                row[m] = coverage(statistic, d, n, m, trials=trials, reps=reps, rng=rng)
            rows.append(row)
    return pd.DataFrame(rows, columns=["scenario", "n", *methods])


def markdown(statistic: str, df: pd.DataFrame, trials: int, reps: int) -> str:
    """The table with its caption: what was measured, how often, with which resamples."""
    methods = [c for c in df.columns if c not in ("scenario", "n")]
    head = ["scenario", "n", *(stats.ci_label(m) for m in methods)]
    lines = [f"### {statistic}", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for _, r in df.iterrows():
        cells = [str(r["scenario"]), str(r["n"]), *(f"{r[m]:.1%}" for m in methods)]
        lines.append("| " + " | ".join(cells) + " |")
    se = 0.5 / np.sqrt(trials)
    lines += [
        "",
        f"Coverage of nominal 95% CIs ({statistic}): {trials} draws per cell, {reps} bootstrap "
        f"resamples per bootstrap interval; binomial standard error at most {se:.1%}. "
        f"Default: {stats.DEFAULT_METHOD[statistic]}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--n", default="3,5,10", help="comma-separated seed counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--statistic", default=",".join(SCENARIOS), help="mean, ratio, rate")
    ap.add_argument("--methods", help="comma-separated methods (default: every one of each)")
    args = ap.parse_args(argv)
    ns = [int(v) for v in args.n.split(",") if v.strip()]
    for s in args.statistic.split(","):
        if s not in SCENARIOS:
            ap.error(f"--statistic {s!r}: one of {list(SCENARIOS)}")
        methods = None
        if args.methods:
            methods = [m for m in args.methods.split(",") if m in stats.METHODS[s]]
        df = table(s, ns, methods=methods, trials=args.trials, reps=args.reps, seed=args.seed)
        print(markdown(s, df, args.trials, args.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
