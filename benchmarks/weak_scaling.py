"""EBRL's engine scaled out on one CPU machine: weak scaling of replicas, ranks and env workers.

Each point doubles the roles and the envs together (constant work per replica):

    R generator replicas, L learner ranks (gloo), E env workers, N envs = 1+1 / 2 / 8, 2+2 / 4 / 16

and, as the strong-scaling reference, the 1+1 layout given the 2+2 point's 16 envs and 4 env
workers. Every run has EBRL's three levels pinned on (overlap k=1, two env groups, the step level;
the shape search only runs for one replica, and a searched shape would make the points differ in
more than their size), each a ``python -m ebrl.train`` process, seed-major, one at a time.

Two workloads, because two cores bound what they can show:

- ``sleep``: the synthetic simulator that waits 2 ms per step (no CPU; P99 3x the mean) with the
  MLP policy: the CPU is nearly idle, so a rate that does not double when the roles do is the
  engine's own cost (channels, slots, the weight board, the gradient all-reduce).
- ``pushcube``: the embedded default (PushCube-v1 on CPU physics, the transformer L): every stage
  computes, the machine has 2 cores whatever the layout, and weak scaling can only show what the
  extra processes cost.

Printed side by side: env steps/s per point (mean [95% CI] over seeds), the weak-scaling
efficiency ``rate(2+2, 16 envs) / (2 x rate(1+1, 8 envs))`` and the 2+2 layout against 1+1 on the
same 16 envs, both paired by seed.

Usage: python benchmarks/weak_scaling.py [--seeds 0,1,2] [--iterations 10]
    [--workloads sleep,pushcube]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.stats import bootstrap_ci, ratio_ci  # noqa: E402
from benchmarks.common import provenance  # noqa: E402


@dataclass(frozen=True)
class Point:
    """One layout: replicas, learner ranks, env workers, envs."""

    name: str
    replicas: int
    ranks: int
    env_workers: int
    envs: int

    def overrides(self) -> list[str]:
        return [
            f"num_envs={self.envs}",
            f"scheduler.gen_replicas={self.replicas}",
            f"scheduler.learner_ranks={self.ranks}",
            f"scheduler.sim_workers={self.env_workers}",
        ]


POINTS = (
    Point("1+1 x8", 1, 1, 2, 8),
    Point("2+2 x16", 2, 2, 4, 16),
    Point("1+1 x16", 1, 1, 4, 16),
)
#: EBRL with every level pinned on, the learner on 1 thread (a rank each at 2+2)
EBRL = [
    "scheduler=ebrl",
    "scheduler.staleness=1",
    "scheduler.pipeline=true",
    "scheduler.step_level=true",
    "env_groups=2",
    "threads.train=1",
]
WORKLOADS: dict[str, list[str]] = {
    "sleep": [
        "simulator=synthetic",
        "simulator.cost_mode=sleep",
        "simulator.step_cost_ms=2",
        "simulator.tail_ratio=3",
        "policy=mlp",
        "chunk_size=4",
    ],
    "pushcube": [
        "simulator=pushcube",
        "policy=transformer_l",
        "chunk_size=4",
        "algo.cfg.update_epochs=2",
        "algo.cfg.num_minibatches=2",
    ],
}


def run(
    workload: str, point: Point, seed: int, iters: int, warmup: int, out: Path, experiment: str
) -> dict:
    slug = point.name.replace("+", "p").replace(" ", "-")
    run_dir = out / "runs" / f"{workload}-{slug}-s{seed}"
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *WORKLOADS[workload],
        *EBRL,
        *point.overrides(),
        f"seed={seed}",
        f"budget.iterations={iters}",
        f"warmup_iters={warmup}",
        "budget.env_steps=100000000",
        f"run_dir={run_dir}",
        f"tracking.experiment={experiment}",
        "progress=false",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    s = json.loads((run_dir / "summary.json").read_text())
    row = {
        "workload": workload,
        "point": point.name,
        "seed": seed,
        "throughput_e2e": s["throughput_e2e"],
        "env_steps": s["env_steps"],
        "wall_s": s["wall_s"],
        "commit": s.get("commit", ""),
        "command": " ".join(cmd[1:]),
    }
    print(
        f"  {workload:8s} {point.name:8s} seed {seed}: {row['throughput_e2e']:7.1f} steps/s",
        flush=True,
    )
    return row


def table(rows: list[dict], workloads: list[str], points: list[Point]) -> str:
    """The side-by-side figures: rates per point, then the paired ratios."""

    def tp(w: str, p: str) -> np.ndarray:
        sel = sorted(
            (r for r in rows if r["workload"] == w and r["point"] == p), key=lambda r: r["seed"]
        )
        return np.array([r["throughput_e2e"] for r in sel])

    names = [p.name for p in points]
    head = "| workload | " + " | ".join(f"{n} env steps/s" for n in names)
    lines = [head + " |", "|---" * (len(names) + 1) + "|"]
    for w in workloads:
        lines.append(
            f"| {w} | " + " | ".join(bootstrap_ci(tp(w, n)).fmt(".1f") for n in names) + " |"
        )
    lines += [
        "",
        "| workload | weak-scaling efficiency: 2+2 x16 / (2 x 1+1 x8) | 2+2 x16 / 1+1 x16 |",
        "|---|---|---|",
    ]
    for w in workloads:
        small, big, same = tp(w, "1+1 x8"), tp(w, "2+2 x16"), tp(w, "1+1 x16")
        weak = ratio_ci(big, 2 * small).fmt(".3f") if len(small) and len(big) else "-"
        strong = ratio_ci(big, same).fmt(".3f") if len(same) and len(big) else "-"
        lines.append(f"| {w} | {weak} | {strong} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workloads", default="sleep,pushcube")
    ap.add_argument("--experiment", default="bench-weak-scaling", help="MLflow experiment")
    ap.add_argument(
        "--out", default=str(ROOT / "results" / "weak-scaling-cpu" / time.strftime("%Y-%m-%d"))
    )
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    total, t0 = len(seeds) * len(workloads) * len(POINTS), time.time()
    for s in seeds:
        for w in workloads:
            for p in POINTS:
                rows.append(run(w, p, s, args.iterations, args.warmup, out, args.experiment))
                left = (time.time() - t0) / len(rows) * (total - len(rows))
                print(f"  [{len(rows)}/{total} runs, ~{left / 60:.0f} min left]", flush=True)
    text = table(rows, workloads, list(POINTS))
    print("\n" + text)
    prov = provenance(
        seeds,
        workloads={w: WORKLOADS[w] for w in workloads},
        ebrl=EBRL,
        points=[p.__dict__ | {"overrides": p.overrides()} for p in POINTS],
        iterations=args.iterations,
        warmup=args.warmup,
    )
    (out / "table.md").write_text(text + "\n")
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {out}/table.md, runs.csv, provenance.json")


if __name__ == "__main__":
    main()
