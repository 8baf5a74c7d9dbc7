"""Old and new estimators side by side on a runs table: IQM and the 95% CI of the mean.

Old: this package's IQM with interpolated quartile edges (:func:`analysis.stats.iqm_interpolated`)
and the percentile bootstrap interval. New: rliable's IQM (``scipy.stats.trim_mean(x, 0.25)``)
and the BCa bootstrap interval; the Student t interval beside them. Both bootstrap intervals of a
group come from the same resamples (the same seed), so they differ only by the method.

Usage: ``python -m analysis.estimators --runs results/headline-cpu/export
[--value throughput_e2e] [--by simulator,policy,scheduler_variant] [--reps 10000] [--seed 0]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import files, names, stats
from analysis.tables import Table, label

#: default groups: a configuration and a scheduler (the policy's name carries its size)
BY = ("simulator", "policy", "scheduler_variant")


def compare(
    runs: pd.DataFrame,
    value: str,
    by: Sequence[str],
    *,
    reps: int = 10_000,
    seed: int = 0,
) -> pd.DataFrame:
    """Both estimators of each group of ``runs`` (one row per run; NaN values left out).

    Returns:
        One row per group: the ``by`` columns, ``n``, ``mean``, ``iqm_old``, ``iqm_new``,
        ``pct_low``, ``pct_high`` (percentile bootstrap), ``bca_low``, ``bca_high``,
        ``bca_method`` (the interval computed: ``percentile`` where BCa is undefined),
        ``t_low``, ``t_high``.
    """
    rows = []
    for key, g in stats.iter_groups(names.display_runs(runs), by):
        x = g[value].to_numpy(dtype=float)
        x = x[~np.isnan(x)]
        pct = stats.bootstrap_ci(x, reps=reps, rng=np.random.default_rng(seed), method="percentile")
        bca = stats.bootstrap_ci(x, reps=reps, rng=np.random.default_rng(seed), method="bca")
        t = stats.t_ci(x)
        rows.append(
            {
                **dict(zip(by, key)),
                "n": len(x),
                "mean": float(x.mean()) if len(x) else np.nan,
                "iqm_old": stats.iqm_interpolated(x),
                "iqm_new": stats.iqm(x),
                "pct_low": pct.low,
                "pct_high": pct.high,
                "bca_low": bca.low,
                "bca_high": bca.high,
                "bca_method": bca.method,
                "t_low": t.low,
                "t_high": t.high,
            }
        )
    cols = [*by, "n", "mean", "iqm_old", "iqm_new", "pct_low", "pct_high", "bca_low", "bca_high"]
    return pd.DataFrame(rows, columns=[*cols, "bca_method", "t_low", "t_high"])


def table(df: pd.DataFrame, value: str, by: Sequence[str], spec: str = ".1f") -> Table:
    """:func:`compare`'s rows as a table with both estimators printed in each row."""

    def ci(lo: float, hi: float) -> str:
        return "–" if np.isnan(lo) else f"[{lo:{spec}}, {hi:{spec}}]"

    header = [label(c) for c in by] + ["n", "IQM old (interpolated)", "IQM (trim_mean 0.25)"]
    header += ["mean", "95% percentile bootstrap CI", "95% BCa bootstrap CI", "95% Student t CI"]
    rows = []
    for _, r in df.iterrows():
        cells = [str(r[c]) for c in by] + [str(int(r["n"]))]
        cells += [f"{r['iqm_old']:{spec}}", f"{r['iqm_new']:{spec}}", f"{r['mean']:{spec}}"]
        bca = ci(r["bca_low"], r["bca_high"])
        if r["bca_method"] == "percentile":
            bca += " (BCa undefined: percentile)"
        cells += [ci(r["pct_low"], r["pct_high"]), bca, ci(r["t_low"], r["t_high"])]
        rows.append(cells)
    differ = int((~np.isclose(df["iqm_old"], df["iqm_new"])).sum())
    notes = [
        f"{label(value)} (`{value}`) per group of runs (seeds); IQM old: quartile edges "
        "interpolated (this package before scipy); IQM: rliable's 25% trimmed mean "
        f"(equal to the mean for n <= 3); the two differ in {differ} of {len(df)} rows",
        "percentile and BCa intervals of a row come from the same bootstrap resamples",
    ]
    return Table(f"Old and new estimators: {label(value)}", header, rows, notes)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="folder written by analysis.export")
    ap.add_argument("--value", default="throughput_e2e")
    ap.add_argument("--by", help=f"grouping columns (default: those of {', '.join(BY)} present)")
    ap.add_argument("--reps", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    runs = files.read_csv(args.runs / "runs.csv")
    by = args.by.split(",") if args.by else [c for c in BY if c in runs]
    df = compare(runs, args.value, by, reps=args.reps, seed=args.seed)
    print(table(df, args.value, by).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
