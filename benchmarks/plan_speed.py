"""How long the capacity planner takes to plan one configuration, per scheduler row.

The configurations are the paper's (``python -m ebrl.plan --paper``: the headline node and the
g1-g16 scale points, from the illustrative example profile) and the g1/g4/g16 scale points from
the measured H200 profile (``results/gpu-check/2026-12-04``, as ``scripts/gpu_check.sh`` plans
them). Each row is ``plan_one`` as the CLI calls it (one seed, 4 updates, EBRL's search
included), the best of ``--repeat`` calls, in CPU seconds of the process (less sensitive than
the wall clock to other work on a shared machine).

With ``--against DIR`` (another checkout of the project, e.g. ``git worktree add /tmp/old
<commit>``) the same rows are timed there too, in alternating subprocesses of this script, so a
shared machine's load falls on both alike; the table then gives both times and their ratio. The
last line says which schedule model answered in each: ``compiled`` (mypyc, ``make setup``) or
``python`` (not built, stale, or ``EBRL_MODEL_PURE=1``).

Usage: python benchmarks/plan_speed.py [--repeat 3] [--against /tmp/old] [--only g16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
H200 = "results/gpu-check/2026-12-04/profile.json"


def configurations(root: Path) -> Iterator[tuple[str, Any, Any, Any]]:
    """(name, profile, machine, workload) of every configuration timed."""
    from ebrl.plan.cli import EXAMPLE, PAPER, PAPER_WORKLOAD, workload_for
    from ebrl.plan.machine import from_conf
    from ebrl.plan.profile import Profile

    example = Profile.load(EXAMPLE)
    for title, (mname, over) in PAPER.items():
        machine, roles = from_conf(mname)
        name = "headline" if title.startswith("headline") else title.split()[-1]
        yield f"example {name}", example, machine, workload_for(roles, {**PAPER_WORKLOAD, **over})
    h200 = Profile.load(root / H200)
    for g in ("g1", "g4", "g16"):
        machine, roles = from_conf(f"scale/{g}")
        wl = workload_for(roles, {"decisions_per_env": 12, "episode_steps": 50})
        yield f"h200 {g}", h200, machine, wl


def measure(repeat: int, only: str | None) -> dict[str, float]:
    """``"configuration|scheduler"`` -> the best of ``repeat`` planning times (seconds)."""
    from ebrl.plan.schedulers import SCHEDULERS, plan_one

    out: dict[str, float] = {}
    for name, profile, machine, wl in configurations(Path.cwd()):
        if only and only not in name:
            continue
        for sched in SCHEDULERS:
            best = float("inf")
            for _ in range(repeat):
                t0 = time.process_time()
                plan_one(sched, profile, wl, machine, seeds=(0,), updates=4, warmup=1)
                best = min(best, time.process_time() - t0)
            out[f"{name}|{sched}"] = best
    return out


def model_kind() -> str:
    """Which schedule model answers in this process: ``compiled`` (mypyc) or ``python``."""
    import ebrl.resources.model as model

    return "compiled" if getattr(model, "COMPILED", False) else "python"


def run_in(root: Path, repeat: int, only: str | None) -> tuple[dict[str, float], str]:
    """:func:`measure` in a subprocess on the checkout at ``root``, and its :func:`model_kind`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--repeat", str(repeat)]
    if only:
        cmd += ["--only", only]
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout)
    return out["times"], out["model"]


def table(new: dict[str, float], ref: dict[str, float] | None) -> str:
    head = "| configuration | scheduler | CPU ms |" + (" reference ms | ratio |" if ref else "")
    rule = "|---|---|---|" + ("---|---|" if ref else "")
    lines = [head, rule]
    for key, s in new.items():
        conf, sched = key.split("|")
        line = f"| {conf} | {sched} | {s * 1000:.0f} |"
        if ref:
            line += f" {ref[key] * 1000:.0f} | {ref[key] / s:.1f}x |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="calls per row (the best is kept)")
    ap.add_argument("--against", type=Path, help="a reference checkout timed alternately")
    ap.add_argument("--rounds", type=int, default=2, help="--against: alternations")
    ap.add_argument("--only", help="configurations whose name contains this")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps({"times": measure(args.repeat, args.only), "model": model_kind()}))
        return 0
    if args.against is None:
        sys.path.insert(0, str(ROOT))
        print(table(measure(args.repeat, args.only), None))
        print(f"\nschedule model: {model_kind()}")
        return 0
    new: dict[str, float] = {}
    ref: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for _ in range(args.rounds):  # alternate, so the machine's load falls on both alike
        for root, into, who in ((args.against.resolve(), ref, "reference"), (ROOT, new, "this")):
            times, kinds[who] = run_in(root, args.repeat, args.only)
            for key, s in times.items():
                into[key] = min(into.get(key, float("inf")), s)
    print(table(new, ref))
    this, reference = kinds["this"], kinds["reference"]
    print(f"\nschedule model: this checkout's {this}, the reference's {reference}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
