"""The evaluation after training on one process and on several (``eval.workers``), side by side.

Takes a finished run's folder (its ``config.yaml``, ``snapshots/`` and ``checkpoint.pt``: a run
with ``eval.every_iters`` > 0) and runs the evaluations the run itself ran after training (each
kept snapshot on ``--curve-episodes``, the final weights on ``--episodes``) with
``eval.workers`` 1 and ``--workers``, alternating, ``--repeats`` times each. Prints the seconds
of each and their ratio, and checks that every result agrees (the evaluation is deterministic
and each job the same whichever process runs it).

Usage: python benchmarks/eval_workers.py --run outputs/pilot --workers 2 \
    [--last 4] [--curve-episodes 10] [--episodes 20] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import provenance  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished run's folder")
    ap.add_argument("--workers", type=int, default=2, help="processes to compare with one")
    ap.add_argument("--last", type=int, default=4, help="the run's last snapshots evaluated")
    ap.add_argument("--curve-episodes", type=int, default=10, help="episodes per snapshot")
    ap.add_argument("--episodes", type=int, default=20, help="episodes of the final weights")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs of each, alternating")
    ap.add_argument("--out", type=Path, default=None, help="write table.json here")
    args = ap.parse_args(argv)

    from omegaconf import OmegaConf

    from ebrl.config import RunConfig
    from ebrl.run.evaluation import EvalJob, run_jobs
    from ebrl.stages.factory import StageFactory
    from ebrl.stages.train import snapshots

    cfg = OmegaConf.load(args.run / "config.yaml")
    run = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), cfg))
    factory = StageFactory.from_config(cfg)
    ckpt = args.run / "checkpoint.pt"
    if not ckpt.exists():
        raise SystemExit(f"{args.run}: no checkpoint.pt (the run kept no final weights)")
    kept = snapshots(args.run / "snapshots")  # oldest first
    jobs = [EvalJob(str(ckpt), args.episodes)]  # the longest first, as a run orders them
    jobs += [
        EvalJob(str(p), args.curve_episodes) for p in (kept[-args.last :] if args.last else kept)
    ]
    seconds: dict[int, list[float]] = {1: [], args.workers: []}
    figures: dict[int, list[tuple[int, int, int]]] = {}
    for _ in range(args.repeats):
        for w in (1, args.workers):
            run.eval.workers = w
            t0 = time.perf_counter()
            res = run_jobs(run, factory, jobs)
            seconds[w].append(time.perf_counter() - t0)
            figures[w] = [(r.policy_version, r.episodes, r.successes) for r in res]
    same = figures[1] == figures[args.workers]
    one, many = statistics.median(seconds[1]), statistics.median(seconds[args.workers])
    episodes = sum(j.episodes for j in jobs)
    print(f"{len(jobs)} evaluations, {episodes} episodes ({args.run})")
    print(f"{'workers':>8} {'seconds':>9} {'x one':>7}")
    print(f"{1:>8} {one:>9.1f} {1.0:>7.2f}")
    print(f"{args.workers:>8} {many:>9.1f} {one / many:>7.2f}")
    print(f"results equal: {same}; successes {[s for _, _, s in figures[1]]}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table = {
            "evaluations": len(jobs),
            "episodes": episodes,
            "seconds": {str(k): v for k, v in seconds.items()},
            "speedup": one / many,
            "results_equal": same,
            "provenance": provenance([int(cfg.seed)], run=str(args.run)),
        }
        (args.out / "table.json").write_text(json.dumps(table, indent=2) + "\n")
    if not same:
        raise SystemExit("the results differ between one process and several: a bug")


if __name__ == "__main__":
    main()
