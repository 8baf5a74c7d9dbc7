"""Re-evaluate finished learning runs: their late policies, each on many episodes.

A run's final evaluation (``summary.eval_success_rate``) measures one policy, the final weights;
on PushCube the deterministic policy's success swings by 10-30 points from one update to the next,
so one policy per seed compares schedulers poorly. This evaluates the last ``--last`` snapshots
and the final weights of each run on ``--episodes`` episodes each (the same evaluation episodes
as the run's own: :func:`ebrl.evaluate.evaluate`), and reports per run the mean over those
policies, per configuration the mean over seeds, and each configuration's paired difference with
its synchronous reference (``benchmarks/learning.py``'s ``REFERENCE``).

The final weights' success is recomputed too and must equal the run's own figure (the evaluation
is deterministic): a check that the re-evaluation is the same measurement.

Needs the runs' ``snapshots/`` (kept locally, not committed). Evaluation only: no training.

Usage: python benchmarks/late_eval.py --runs results/learning/2026-11-29 \
    --configs k1,colocated-k1,hybrid-k1,async-k1 [--seeds 0,1,2] [--last 5] [--episodes 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import provenance  # noqa: E402
from benchmarks.learning import REFERENCE  # noqa: E402


def late_policies(run_dir: Path, last: int) -> list[tuple[int, dict]]:
    """(version, weights) of the run's last ``last`` snapshots and its final weights."""
    from ebrl.stages.train import load_checkpoint, snapshots

    out: dict[int, dict] = {}
    for path in snapshots(run_dir / "snapshots")[-last:]:
        snap = load_checkpoint(path)
        out[int(snap["version"])] = snap["policy"]
    final = load_checkpoint(run_dir / "checkpoint.pt")
    if final is None:
        raise SystemExit(f"{run_dir}: no checkpoint.pt (the run kept no final weights)")
    out[int(final["version"])] = final["policy"]
    return sorted(out.items())


def evaluate_run(run_dir: Path, last: int, episodes: int) -> dict:
    """Every late policy of one run on ``episodes`` episodes; the final one checked against the
    run's own evaluation. Kept in the run's ``late_eval.json`` and reused for the same settings."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    # the run's own learner threads: another thread count changes float reductions, and on
    # contact-rich physics that is enough to change a few episodes' outcomes
    threads = int(cfg.threads.train)
    cache = run_dir / "late_eval.json"
    if cache.exists():
        kept = json.loads(cache.read_text())
        if (kept["last"], kept["episodes"], kept.get("threads")) == (last, episodes, threads):
            return kept

    from ebrl.evaluate import evaluate
    from ebrl.stages.factory import StageFactory

    factory = StageFactory.from_config(cfg)
    summary = json.loads((run_dir / "summary.json").read_text())
    policies = late_policies(run_dir, last)
    per: dict[int, float] = {}
    for version, weights in policies:
        res = evaluate(
            factory,
            (version, weights),
            episodes=episodes,
            num_envs=int(cfg.eval.num_envs),
            deterministic=bool(cfg.eval.deterministic),
            threads=threads,
        )
        per[version] = res.success_rate
    final_v = policies[-1][0]
    same = episodes == int(summary.get("eval_episodes") or -1)
    if same and abs(per[final_v] - float(summary["eval_success_rate"])) > 1e-9:
        raise SystemExit(
            f"{run_dir}: final weights re-evaluated at {per[final_v]:.3f}, the run said "
            f"{summary['eval_success_rate']:.3f}: not the same measurement"
        )
    out = {
        "run": run_dir.name,
        "last": last,
        "episodes": episodes,
        "threads": threads,
        "per_policy": {str(v): x for v, x in per.items()},
        "late": float(np.mean(list(per.values()))),
        "final": per[final_v],
    }
    cache.write_text(json.dumps(out, indent=2) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="a learning benchmark's output folder")
    ap.add_argument("--configs", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--last", type=int, default=5, help="snapshots before the final weights")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--out", help="folder for late_eval.md/.json (default: --runs)")
    args = ap.parse_args()
    base, seeds = Path(args.runs), [int(s) for s in args.seeds.split(",")]
    names = args.configs.split(",")
    res: dict[str, dict[int, dict]] = {}
    t0 = time.time()
    for name in names:
        for s in seeds:
            r = evaluate_run(base / "runs" / f"{name}-s{s}", args.last, args.episodes)
            res.setdefault(name, {})[s] = r
            print(f"  {name} seed {s}: late {r['late']:.3f} final {r['final']:.2f}", flush=True)
    n_pol = args.last + 1
    lines = [
        f"Late evaluation success: the last {args.last} snapshots and the final weights "
        f"({n_pol} policies) x {args.episodes} deterministic episodes each, mean per run.",
        "",
        "| config | late success, mean ± sd over seeds | per seed | final weights, per seed |",
        "|---|---|---|---|",
    ]
    for name in names:
        lates = [res[name][s]["late"] for s in seeds]
        finals = " ".join(format(res[name][s]["final"], ".2f") for s in seeds)
        sd = f" ± {statistics.stdev(lates):.3f}" if len(lates) > 1 else ""
        lines.append(
            f"| {name} | {np.mean(lates):.3f}{sd} | {' '.join(f'{x:.3f}' for x in lates)} "
            f"| {finals} |"
        )
    lines += [
        "",
        "| config | reference | late success minus reference (points), mean | per seed |",
        "|---|---|---|---|",
    ]
    for name in names:
        ref = REFERENCE.get(name)
        if ref not in res:
            continue
        d = [100 * (res[name][s]["late"] - res[ref][s]["late"]) for s in seeds]
        lines.append(f"| {name} | {ref} | {np.mean(d):+.1f} | {' '.join(f'{x:+.1f}' for x in d)} |")
    table = "\n".join(lines)
    print("\n" + table + f"\n\n{(time.time() - t0) / 60:.1f} min")
    out = Path(args.out or base)
    prov = provenance(seeds, last=args.last, episodes=args.episodes, configs=names)
    (out / "late_eval.md").write_text(
        "# Late evaluation\n\n" + table + "\n\n```json\n" + json.dumps(prov, indent=2) + "\n```\n"
    )
    (out / "late_eval.json").write_text(json.dumps({"provenance": prov, "runs": res}, indent=2))


if __name__ == "__main__":
    main()
