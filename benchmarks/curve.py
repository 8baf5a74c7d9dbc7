"""One run's learning curve from its run folder: return and success rate against env steps.

Reads ``<run>/metrics.csv`` (one row per update: ``env/return``, ``env/success_rate`` over the
update's finished training episodes, ``env/steps_total``) and ``<run>/summary.json``; writes
``curve.png`` (both curves, with a rolling mean over ``--window`` updates) and ``curve.md`` (the
run's provenance, a table of every ``--every``-th update that finished an episode, and the first
and last fifths' means) into ``--out``. Nothing is run.

    python benchmarks/curve.py <run folder> --out <folder> [--title "..."]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import files  # noqa: E402

COLUMNS = ("env/steps_total", "env/return", "env/success_rate", "env/episode_len")


def load(run: Path) -> pd.DataFrame:
    df = files.read_csv(run / "metrics.csv")  # committed runs: metrics.csv.gz
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise SystemExit(f"{run / 'metrics.csv'} has no {', '.join(missing)} column")
    return df[["iteration", *COLUMNS]].dropna(subset=["env/steps_total"])


def fifths(df: pd.DataFrame, col: str) -> tuple[float, float]:
    x = df[col].dropna()
    n = max(1, len(x) // 5)
    return float(x.iloc[:n].mean()), float(x.iloc[-n:].mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--window", type=int, default=10, help="updates in the rolling mean")
    ap.add_argument("--every", type=int, default=10, help="a table row every this many updates")
    args = ap.parse_args(argv)
    df = load(args.run)
    summary = json.loads((args.run / "summary.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    for ax, col, label in zip(
        axes, ("env/return", "env/success_rate"), ("episode return", "success rate"), strict=True
    ):
        x, y = df["env/steps_total"], df[col]
        ax.plot(x, y, lw=0.8, alpha=0.4, color="tab:blue", label="per update")
        ax.plot(
            x,
            y.rolling(args.window, min_periods=1).mean(),
            color="tab:blue",
            label=f"rolling mean, {args.window} updates",
        )
        ax.set_xlabel("env steps")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_ylim(-0.02, 1.02)
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle(args.title or f"{summary.get('scheduler')} on {summary.get('simulator')}")
    fig.savefig(args.out / "curve.png", dpi=130)

    r0, r1 = fifths(df, "env/return")
    s0, s1 = fifths(df, "env/success_rate")
    done = df.dropna(subset=["env/return"])  # updates in which some episode finished
    rows = done.iloc[:: max(1, args.every)]
    lines = [
        f"# {args.title or 'Learning curve'}",
        "",
        f"commit {summary.get('commit')}, {summary.get('machine')}; seed {summary.get('seed')}; "
        f"{summary.get('scheduler')} / {summary.get('policy')} / {summary.get('simulator')}"
        + (f" ({summary['task']})" if summary.get("task") else "")
        + f"; {summary.get('iterations')} updates, "
        f"{summary.get('env_steps')} env steps in {summary.get('wall_s', 0):.0f} s; "
        f"status {summary.get('status')}",
        "",
        f"First fifth of the updates against the last: return {r0:.3f} -> {r1:.3f}, "
        f"success rate {s0:.3f} -> {s1:.3f} (training episodes, stochastic policy); "
        f"{len(done)} of {len(df)} updates finished an episode.",
        "",
        "| update | env steps | return | success rate | episode length |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {int(r.iteration)} | {int(r['env/steps_total'])} | {r['env/return']:.3f} | "
            f"{r['env/success_rate']:.3f} | {r['env/episode_len']:.1f} |"
            for _, r in rows.iterrows()
        ),
        "",
    ]
    (args.out / "curve.md").write_text("\n".join(lines))
    print("\n".join(lines[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
