"""Run a sweep, or preview the Slurm jobs it would submit.

The command line of ``python -m ebrl.launch`` (the package's overview: :mod:`ebrl.launch`).
``--dry-run`` prints the plan (:mod:`ebrl.launch.preview`) and submits nothing; without it the
plan is printed, refused if a job fails validation or a checkpoint is still to fetch, and each
array is run as one Hydra multirun (here, or submitted to Slurm), under the sweep's own MLflow run
(:mod:`ebrl.launch.runs`). SIGINT and SIGTERM are passed on to the arrays.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from typing import Any

from ebrl.config import LauncherKind
from ebrl.launch.check import Store
from ebrl.launch.preview import as_json, describe
from ebrl.launch.runs import array_parent, end_sweep_runs, prepare_stores, start_sweep_runs
from ebrl.launch.sweep import SweepPlan, hydra_command, plan, sweep_names


def _run_arrays(p: SweepPlan, parents: dict[Store, str]) -> list[int]:
    """Start every array's Hydra multirun and wait for them all; SIGTERM, like Ctrl-C, is
    passed on to them and ends the wait with KeyboardInterrupt."""
    procs = [subprocess.Popen(hydra_command(p, a, array_parent(p, a, parents))) for a in p.arrays]

    def on_term(signum: int, frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return [proc.wait() for proc in procs]
    finally:
        signal.signal(signal.SIGTERM, previous)


#: ``--help``'s examples: a small sweep on each launcher (docs/launchers.md)
EXAMPLES = """\
examples (smoke: sync and EBRL on a counting env, 3 updates; seed=0 keeps 2 of its 6 runs):
  python -m ebrl.launch smoke seed=0                          # local: one run after another, here
  python -m ebrl.launch smoke seed=0 launcher=submitit_local  # Submitit processes, here
  python -m ebrl.launch --dry-run smoke launcher=slurm        # the Slurm job array, not submitted
  python -m ebrl.launch smoke launcher=slurm launcher.partition=debug launcher.time_min=10
                                                              # on a login node: submit it
  python -m ebrl.launch --dry-run headline_full               # a full-size sweep's jobs
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the examples keep their lines
        epilog=EXAMPLES + f"\nsweeps: {', '.join(sweep_names())}",
    )
    ap.add_argument("sweep", help="a sweep in conf/sweep/ (e.g. smoke, headline, headline_full)")
    ap.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides; an axis given here replaces the sweep's (seed=0); "
        "launcher=local|submitit_local|slurm picks where the jobs run",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the jobs, run/submit nothing")
    ap.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    ap.add_argument("--out", help="sweep output folder (default: the sweep's hydra.sweep.dir)")
    # intermixed: the make targets put --out between the sweep and the overrides
    args = ap.parse_intermixed_args(argv)
    p = plan(args.sweep, args.overrides, args.out)
    if args.dry_run:
        try:
            print(as_json(p) if args.json else describe(p, dry_run=True), flush=True)
        except BrokenPipeError:  # piped into `head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1 if p.errors else 0
    print(describe(p, dry_run=False), flush=True)
    if p.errors:
        print("not launched: fix the jobs above first", file=sys.stderr)
        return 1
    if p.fetch:
        print("not launched: fetch the checkpoints above first", file=sys.stderr)
        return 1
    if any(a.launcher != LauncherKind.local for a in p.arrays):
        prepare_stores(p)  # jobs run side by side
    command = "python -m ebrl.launch " + shlex.join(argv if argv is not None else sys.argv[1:])
    parents = start_sweep_runs(p, command)
    for store, run_id in parents.items():
        print(f"MLflow: sweep run {run_id} in experiment {store[2]!r}", flush=True)
    codes: list[int] = []
    killed = True  # until the arrays' wait returns
    try:
        codes = _run_arrays(p, parents)
        killed = False
    finally:
        end_sweep_runs(p, parents, codes, killed)
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
