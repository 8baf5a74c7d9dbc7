"""EBRL's shape search against a grid of pinned shapes, on seeds it was not tuned on.

``scheduler=ebrl`` as a user types it chooses the run's shape: env groups G, the step level
with its M and batch cap, and the generator's and the learner's torch threads
(``ebrl/resources/shape.py``: a start-up profile, the schedule model, then its shortlist measured
in the run). This benchmark runs that choice beside every shape of a grid pinned by hand, on the
same workload and seeds, each its own ``python -m ebrl.train`` process, seed-major, and prints:

- each configuration's end-to-end env steps/s (mean, 95% bootstrap CI over seeds);
- the best of the grid (the grid configuration of the highest mean, picked on these very runs,
  which favours the grid: its best is the maximum of noisy means) and the chosen shape's ratio
  to it, paired over seeds (the issue's goal: >= 0.95 with the CI's low end >= 0.90);
- what the search chose per seed, and what it cost.

The grid spans the search's own axes: one group, two and four in lock step, the step level at
M = half the envs (EnvPool's first M of N) and at a quarter with the cap at every env, at
1 + 1 threads (gen + learner), and the lock-step shapes of one and two groups at 1 + 2 too (the
default ``threads.*`` is the search's bound; the learner's second thread is the one that may
pay). ``--grid`` names another set (``<shape>-<threads>``, e.g. ``m8-t12``). The default seeds
(3, 4, 5) are not those the search's margins were set on (0, 1, 2).

Usage: python benchmarks/shape_grid.py [--seeds 3,4,5] [--iterations 10] [--workload pushcube]
       [--grid g1-t11,g1-t12,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.stats import bootstrap_ci, ratio_ci  # noqa: E402
from benchmarks.common import provenance, write_results  # noqa: E402
from benchmarks.scheduler_throughput import WORKLOAD, WORKLOADS, run  # noqa: E402

#: the grid's shapes, each with every knob the search would choose pinned
SHAPES: dict[str, list[str]] = {
    "g1": ["scheduler.pipeline=false", "scheduler.step_level=false"],
    "g2": ["scheduler.pipeline=true", "scheduler.step_level=false", "env_groups=2"],
    "g4": ["scheduler.pipeline=true", "scheduler.step_level=false", "env_groups=4"],
    "m8": ["scheduler.pipeline=false", "scheduler.step_level=true", "scheduler.batch_min=8"],
    "m4c16": [
        "scheduler.pipeline=false",
        "scheduler.step_level=true",
        "scheduler.batch_min=4",
        "scheduler.batch_max=16",
    ],
}
#: thread splits of the grid: name suffix -> overrides
THREADS: dict[str, list[str]] = {
    "t11": ["threads.gen=1", "threads.train=1"],
    "t12": ["threads.gen=1", "threads.train=2"],
}
CHOSEN = "ebrl"
#: the default grid (see the module's docstring)
GRID = ("g1-t11", "g1-t12", "g2-t11", "g2-t12", "g4-t11", "m8-t11", "m4c16-t11")


def grid(names: list[str]) -> dict[str, list[str]]:
    """Config name -> overrides: each ``<shape>-<threads>`` pinned, then EBRL as typed."""
    out: dict[str, list[str]] = {}
    for n in names:
        shape, _, threads = n.rpartition("-")
        if shape not in SHAPES or threads not in THREADS:
            raise ValueError(
                f"grid configuration {n!r}: <shape>-<threads> with a shape of "
                f"{', '.join(SHAPES)} and threads of {', '.join(THREADS)}"
            )
        out[n] = ["scheduler=ebrl", *SHAPES[shape], *THREADS[threads]]
    out[CHOSEN] = ["scheduler=ebrl"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="3,4,5")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workload", default="pushcube", choices=sorted(WORKLOADS))
    ap.add_argument("--grid", default=",".join(GRID), help="<shape>-<threads>, comma-separated")
    ap.add_argument("--experiment", default="bench-shape-grid", help="MLflow experiment")
    ap.add_argument(
        "--out", default=str(ROOT / "results" / "allocator" / f"{time.strftime('%Y-%m-%d')}-shape")
    )
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        configs = grid(args.grid.split(","))
    except ValueError as e:
        ap.error(f"--grid: {e}")
    workload = WORKLOAD + WORKLOADS[args.workload]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    total, t0 = len(seeds) * len(configs), time.time()
    for s in seeds:
        for name, overrides in configs.items():
            rows.append(
                run(
                    name, s, args.iterations, args.warmup, out, args.experiment, workload,
                    overrides=overrides,
                )
            )  # fmt: skip
            left = (time.time() - t0) / len(rows) * (total - len(rows))
            print(f"  [{len(rows)}/{total} runs, ~{left / 60:.0f} min left]", flush=True)

    def tp(name: str) -> np.ndarray:
        ordered = sorted(rows, key=lambda r: r["seed"])
        return np.array([r["throughput_e2e"] for r in ordered if r["config"] == name])

    names = [n for n in configs if n != CHOSEN]
    best = max(names, key=lambda n: tp(n).mean())
    lines = ["| configuration | end-to-end env steps/s, mean [95% CI] | x best of the grid |"]
    lines.append("|---|---|---|")
    for n in [*sorted(names, key=lambda n: -tp(n).mean()), CHOSEN]:
        rel = ratio_ci(tp(n), tp(best)).fmt(".3f") if n != best else "1"
        lines.append(f"| {n} | {bootstrap_ci(tp(n)).fmt('.1f')} | {rel} |")
    r = ratio_ci(tp(CHOSEN), tp(best))
    chosen = [x for x in rows if x["config"] == CHOSEN]
    cost = np.array([x.get("shape_profile_s", np.nan) for x in chosen])
    lines += [
        "",
        f"best of the grid: {best}; EBRL's chosen shape / it: {r.fmt('.3f')} (paired over seeds)",
        "EBRL's shape per seed (start / kept after its trials): "
        + ", ".join(
            f"s{x['seed']} {x.get('shape', '?')} / {x.get('shape_after', x.get('shape', '?'))}"
            for x in chosen
        ),
        f"its start-up profile and search, seconds: {bootstrap_ci(cost).fmt('.1f')}",
        "the shape watch's firings: "
        + (
            "; ".join(f"s{x['seed']} {x['shape_watch']}" for x in chosen if x.get("shape_watch"))
            or "none"
        ),
    ]
    table = "\n".join(lines)
    print("\n" + table)
    prov = provenance(
        seeds,
        workload=workload,
        configs=configs,
        iterations=args.iterations,
        warmup=args.warmup,
    )
    keep = (
        "config",
        "seed",
        "throughput_e2e",
        "bound",
        "wall_s",
        "commit",
        "shape",
        "shape_after",
        "shape_watch",
    )
    write_results(out, rows, keep, "EBRL's shape against a grid of pinned shapes", table, prov)


if __name__ == "__main__":
    main()
