"""Learning benchmark on ManiSkill PushCube-v1: PPO with single actions and K=4 chunks under the
synchronous schedule, EBRL at staleness k = 0, 1, 2, 4, 8, the three baselines, and GRPO.

Runs each configuration for each seed as a separate ``python -m ebrl.train`` process (one at a time:
this is a 2-core machine), seed-major, logging to the MLflow experiment ``bench-learn-<out folder
name>``. Every run evaluates its final weights on 100 deterministic episodes and, after training,
the snapshots it kept every 10 updates (its learning curve against wall-clock,
``eval/success_rate``). Prints per configuration: evaluation success (mean ± sd and per seed), the
training episodes' success, env steps and wall-clock to 80% evaluation success, throughput; then
every K=4 schedule against the synchronous one, seed by seed. Writes ``results/learning/<date>/``
with one row per run (runs.csv), the table (table.md) and provenance. ``make bench-learn`` then
exports the MLflow runs and draws the convergence and staleness studies with ``analysis.report``.

Usage: python benchmarks/learning.py --seeds 0,1,2 [--configs k4,k4-ebrl,k1,...] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.stats import Estimate, ratio_ci  # noqa: E402
from benchmarks.common import LEVELS_OFF, provenance  # noqa: E402

#: the synchronous schedule: EBRL's worker processes with every level off (lock-step rollout,
#: then training); algorithmically the same as scheduler=sync, on two simulator processes
SYNC = ["scheduler=ebrl", *LEVELS_OFF]
#: every run: the final weights on 100 deterministic episodes, and a learning curve of snapshots
#: every 10 updates on 16 episodes each (evaluated after the run: no CPU taken from training)
EVAL = ["eval.episodes=100", "eval.every_iters=10", "eval.curve_episodes=16"]
#: K=4 runs 32 envs (400 decisions per update) at lr 1e-4. Tuning runs, one seed each, so hints:
#: with 16 envs seed 2 reached 44% evaluation success at 175k steps, with 32 envs 86% at 181k; at
#: lr 3e-4 on seed 0 the deterministic policy peaked at 94% (74k steps) and fell to 45% by 200k
#: while clipping ~40% of actions, with a linear decay it stayed under 20%, at 1e-4 it ended at 71%
K4 = ["policy=mlp", "chunk_size=4", "num_envs=32", "algo.cfg.lr=1e-4"]


#: the async baseline's static split of the 2 cores (threads.gen + threads.train <= cores)
ASYNC_SPLIT = ["threads.gen=1", "threads.train=1"]


def _ebrl(k: int) -> list[str]:
    """EBRL, all three levels, staleness bound k; the learner on 1 thread (the other core is
    the simulators' and the generator's while they overlap)."""
    return [*K4, "scheduler=ebrl", f"scheduler.staleness={k}", "threads.train=1"]


#: EBRL (k=1, its levels pinned on) with single actions: ebrl-k1, and its scaled-out twin
EBRL_K1 = [
    "policy=mlp",
    "chunk_size=1",
    "scheduler=ebrl",
    "scheduler.staleness=1",
    "scheduler.pipeline=true",
    "scheduler.step_level=true",
    "threads.train=1",
]
#: name -> (overrides, env-step budget). MLP policy (the transformer is for throughput studies:
#: it learns too slowly on 2 cores).
CONFIGS: dict[str, tuple[list[str], int]] = {
    "k1": (["policy=mlp", "chunk_size=1", *SYNC], 150_000),
    "k4": ([*K4, *SYNC], 200_000),
    "k4-ebrl": (_ebrl(1), 200_000),
    # the staleness study (k = 1 is k4-ebrl)
    **{f"k4-ebrl-k{k}": (_ebrl(k), 200_000) for k in (0, 2, 4, 8)},
    # the baselines (issue 5: each learns as the synchronous schedule does)
    "colocated": ([*K4, "scheduler=colocated"], 200_000),
    "hybrid": ([*K4, "scheduler=hybrid"], 200_000),
    # RLinf's async mode runs rollout and training on a fixed split: one core each here
    "async": ([*K4, "scheduler=async", *ASYNC_SPLIT], 200_000),
    "grpo": ([*K4, "algo=grpo", "rollout_steps=200", *SYNC], 150_000),
    # the baselines with single actions, against k1: seeds agree there (0.92-0.94 evaluation
    # success), so "within 5 points" can be told apart from the noise; K=4's seeds spread 0.67-0.81
    **{
        f"{b}-k1": (["policy=mlp", "chunk_size=1", f"scheduler={b}", *extra], 150_000)
        for b, extra in (("colocated", []), ("hybrid", []), ("async", ASYNC_SPLIT))
    },
    # K=4 under the synchronous schedule with twice the budget (its curves still rise at 200k)
    "k4-400k": ([*K4, *SYNC], 400_000),
    # EBRL (all three levels, k=1) with single actions, against k1: four times the generator
    # calls of K=4, so generation is worth overlapping with the MLP policy too, and k1's seeds
    # agree closely enough to tell "within 5 points" from noise
    # (the levels pinned on, as every EBRL run was before the resource manager chose its shape,
    # 2026-12-02; the shape search only runs for one replica, so ebrl-k1-r2l2 would otherwise
    # run another shape than its reference)
    "ebrl-k1": (EBRL_K1, 150_000),
    # ebrl-k1 scaled out (issue 16): 2 generator replicas and a 2-rank gloo learner, each rank
    # on 1 thread; it must learn as ebrl-k1 does (the same updates, computed by two processes)
    "ebrl-k1-r2l2": (
        [*EBRL_K1, "scheduler.gen_replicas=2", "scheduler.learner_ranks=2"],
        150_000,
    ),
}
#: the synchronous configuration each other one is compared with (same actions, same budget)
REFERENCE: dict[str, str] = {
    **{n: "k4" for n in CONFIGS if n.startswith("k4-ebrl")},
    **{n: "k4" for n in ("colocated", "hybrid", "async")},
    **{n: "k1" for n in CONFIGS if n.endswith("-k1")},
    "ebrl-k1-r2l2": "ebrl-k1",
}


#: snapshots averaged into the late evaluation success
LATE = 5


def late_success(run_dir: Path, n: int = LATE) -> float | None:
    """Mean evaluation success of the run's last ``n`` snapshots (``eval_curve.csv``): ``n``
    policies x 16 episodes, steadier than the final weights alone, which swing by 10-30 points
    from one update to the next on this task."""
    path = run_dir / "eval_curve.csv"
    if not path.exists():
        return None
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return float(np.mean([float(r["success"]) for r in rows[-n:]])) if rows else None


def run_one(
    name: str, seed: int, scale: float, out: Path, experiment: str, reuse: bool = False
) -> dict:
    overrides, budget = CONFIGS[name]
    run_dir = out / "runs" / f"{name}-s{seed}"
    done = run_dir / "summary.json"
    if reuse and done.exists() and json.loads(done.read_text()).get("status") == "FINISHED":
        s = json.loads(done.read_text())
        s.update(config=name, command="(reused) " + str(run_dir), elapsed_s=s["wall_s"])
        s["late_eval_success"] = late_success(run_dir)
        print(f"  {name} seed {seed}: reused {run_dir}", flush=True)
        return s
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *overrides,
        f"seed={seed}",
        *EVAL,
        f"budget.env_steps={int(budget * scale)}",
        f"run_dir={run_dir}",
        f"tracking.experiment={experiment}",
        "progress=false",
    ]
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    s = json.loads((run_dir / "summary.json").read_text())
    s.update(config=name, command=" ".join(cmd[1:]), elapsed_s=time.time() - t0)
    s["late_eval_success"] = late_success(run_dir)
    print(
        f"  {name} seed {seed}: eval success {s['eval_success_rate']:.2f} "
        f"(training episodes {s['success_rate']:.2f}), eval 80% at {s['eval_steps_to_80']} "
        f"steps / {s['eval_time_to_80']} s, {s['throughput_e2e']:.0f} steps/s",
        flush=True,
    )
    return s


def _with_n(e: Estimate, spec: str) -> str:
    """An estimate with its number of pairs, said once (Estimate.fmt names n when n < 2)."""
    return e.fmt(spec) if e.n < 2 else f"{e.fmt(spec)} (n={e.n})"


def fmt(xs: list[float | None], spec: str) -> str:
    vals = [x for x in xs if x is not None]
    if not vals:
        return "never"
    m = statistics.mean(vals)
    miss = f" ({len(xs) - len(vals)} never)" if len(vals) < len(xs) else ""
    return f"{m:{spec}}" + (f" ± {statistics.stdev(vals):{spec}}" if len(vals) > 1 else "") + miss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--grpo-seeds", type=int, default=3, help="GRPO on the first n seeds only")
    ap.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every budget")
    ap.add_argument("--out", default=str(ROOT / "results" / "learning" / time.strftime("%Y-%m-%d")))
    ap.add_argument("--experiment", help="MLflow experiment (default: bench-learn-<out name>)")
    args = ap.parse_args()
    args.experiment = args.experiment or f"bench-learn-{Path(args.out).name}"
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.configs.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:  # seed-major: drifts of a shared machine hit every configuration alike
        for name in names:
            if name == "grpo" and seed not in seeds[: args.grpo_seeds]:
                continue
            rows.append(run_one(name, seed, args.scale, out, args.experiment, args.reuse))
    lines = [
        "| config | seeds | eval success (mean ± sd) | per seed "
        f"| late eval success (last {LATE} snapshots) | training success "
        "| env steps to 80% (eval) | seconds to 80% (eval) | env steps/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        rs = [r for r in rows if r["config"] == name]
        lines.append(
            f"| {name} ({' '.join(CONFIGS[name][0])}) | {len(rs)} "
            f"| {fmt([r['eval_success_rate'] for r in rs], '.3f')} "
            f"| {' '.join(format(r['eval_success_rate'], '.2f') for r in rs)} "
            f"| {fmt([r['late_eval_success'] for r in rs], '.3f')} "
            f"| {fmt([r['success_rate'] for r in rs], '.3f')} "
            f"| {fmt([r['eval_steps_to_80'] for r in rs], '.0f')} "
            f"| {fmt([r['eval_time_to_80'] for r in rs], '.0f')} "
            f"| {fmt([r['throughput_e2e'] for r in rs], '.0f')} |"
        )
    by = {n: sorted((r for r in rows if r["config"] == n), key=lambda r: r["seed"]) for n in names}
    compared = [n for n in names if REFERENCE.get(n) in by]
    if compared:  # every other schedule against its synchronous reference, seed by seed
        lines += [
            "",
            "Against the synchronous schedule (k4 for K=4, k1 for single actions), same seeds: "
            "final evaluation success difference; throughput, config / sync (the same env-step "
            "budget, so > 1 means it finished sooner); wall-clock to 80% evaluation success as "
            "sync / config (> 1: sooner; seeds where both reached it).",
            "",
            "| config | reference | eval success minus reference (points) "
            f"| late eval success (last {LATE} snapshots) minus reference "
            "| throughput, config / reference | wall-clock to 80%, reference / config |",
            "|---|---|---|---|---|---|",
        ]
        for name in compared:
            ref = REFERENCE[name]
            pairs = [
                (a, b) for a, b in zip(by[ref], by[name], strict=False) if a["seed"] == b["seed"]
            ]
            if not pairs:
                continue
            diff = np.mean([b["eval_success_rate"] - a["eval_success_rate"] for a, b in pairs])
            late = [
                b["late_eval_success"] - a["late_eval_success"]
                for a, b in pairs
                if a["late_eval_success"] is not None and b["late_eval_success"] is not None
            ]
            late_s = f"{100 * np.mean(late):+.1f} (n={len(late)})" if late else "none"
            speed = ratio_ci(
                [b["throughput_e2e"] for _, b in pairs], [a["throughput_e2e"] for a, _ in pairs]
            )
            both = [
                (a["eval_time_to_80"], b["eval_time_to_80"])
                for a, b in pairs
                if a["eval_time_to_80"] is not None and b["eval_time_to_80"] is not None
            ]
            ratio = "not both reached it"
            if both:
                ratio = _with_n(ratio_ci([a for a, _ in both], [b for _, b in both]), ".2f")
            lines.append(
                f"| {name} | {ref} | {100 * diff:+.1f} (n={len(pairs)}) | {late_s} "
                f"| {_with_n(speed, '.3f')} | {ratio} |"
            )
    table = "\n".join(lines)
    print("\n" + table)
    keys = sorted({k for r in rows for k in r if not isinstance(r[k], dict)})
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    prov = provenance(
        seeds,
        eval_success="final weights, 100 episodes, deterministic (the chunk's mean), initial "
        "states no training episode used (ebrl.evaluate)",
        seconds_to_80="wall-clock of the first snapshot (every 10 updates, 16 deterministic "
        "episodes) with >= 80% evaluation success",
        training_success="training episodes' success, last 10% of updates (stochastic policy)",
    )
    (out / "table.md").write_text(
        f"# Learning on PushCube-v1\n\n{table}\n\n```json\n{json.dumps(prov, indent=2)}\n```\n"
    )
    (out / "provenance.json").write_text(json.dumps(prov, indent=2))
    print(f"\nwritten to {out}; MLflow experiment {args.experiment}")


if __name__ == "__main__":
    main()
