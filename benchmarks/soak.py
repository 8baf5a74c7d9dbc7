"""Soak: one long EBRL run, its memory, file descriptors and shared memory watched throughout.

Runs ``python -m ebrl.train`` (EBRL on Ray, the embedded default unless ``--workload`` says
otherwise) for ``--minutes`` of training and samples every ``--every`` seconds, over the driver
and every process it started: resident memory (RSS, summed), open file descriptors, processes,
and the shared-memory segments the driver created (``/dev/shm/ebrl_<pid>_*``). What it checks:

- RSS flat: the late samples within ``--rss-tolerance`` (10%) of the first sample taken after
  the warm-up (the first ``--warmup`` seconds: imports, Ray start, first updates);
- the driver's open file descriptors at the end equal to those after the warm-up;
- after the run: no process it started left, and no segment of it left in ``/dev/shm``.

    python benchmarks/soak.py --minutes 30 --out results/soak/<date>

Writes ``soak.json`` (samples and provenance) and ``soak.md`` (the table) into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import provenance  # noqa: E402
from ebrl.tracking.provenance import portable  # noqa: E402

WORKLOAD = ["+experiment=embedded", "scheduler=ebrl", "progress=false"]


def sample(driver: psutil.Process, t0: float) -> dict[str, float]:
    procs = [driver]
    with contextlib.suppress(psutil.Error):
        procs += driver.children(recursive=True)
    rss = fds = 0
    n = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
            fds += p.num_fds()
            n += 1
    own = 0
    with contextlib.suppress(psutil.Error):
        own = driver.num_fds()
    shm = len(list(Path("/dev/shm").glob(f"ebrl_{driver.pid}_*")))
    return {
        "t_s": round(time.time() - t0, 1),
        "rss_mib": round(rss / 2**20, 1),
        "fds_all": fds,
        "fds_driver": own,
        "processes": n,
        "shm_segments": shm,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=120.0, help="seconds before the baseline")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workload", nargs="*", default=WORKLOAD, help="ebrl.train overrides")
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *args.workload,
        f"budget.minutes={args.minutes}",
        "budget.env_steps=1000000000",
        f"run_dir={run_dir}",
        "tracking.enabled=false",
    ]
    shm_before = len(list(Path("/dev/shm").glob("ebrl_*")))
    t0 = time.time()
    log = (out / "train.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    driver = psutil.Process(proc.pid)
    samples, started = [], {}
    next_at = t0 + args.warmup
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            started.update({c.pid: c.create_time() for c in driver.children(recursive=True)})
        if time.time() >= next_at:
            s = sample(driver, t0)
            samples.append(s)
            print(json.dumps(s), flush=True)
            next_at += args.every
        time.sleep(1.0)
    code = proc.wait()
    time.sleep(5.0)  # a few seconds for the last children to go
    left = []
    for pid, created in started.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
    shm_after = len(list(Path("/dev/shm").glob("ebrl_*")))
    summary = json.loads((run_dir / "summary.json").read_text()) if code == 0 else {}
    if not samples:  # the run ended inside the warm-up: nothing to compare, say why
        tail = (out / "train.log").read_text().splitlines()[-15:]
        print(
            f"the training run exited with code {code} after {time.time() - t0:.0f} s, before "
            f"the first sample (warm-up {args.warmup:g} s); its log ({out / 'train.log'}) ends:",
            *tail,
            sep="\n",
            file=sys.stderr,
        )
        return 2
    base, late = samples[0], samples[1:]
    rss_dev = max((abs(s["rss_mib"] / base["rss_mib"] - 1) for s in late), default=0.0)
    checks = {
        "exit code 0": code == 0,
        f"RSS within {args.rss_tolerance:.0%} of the first sample": rss_dev <= args.rss_tolerance,
        "driver fds at the end = after the warm-up": samples[-1]["fds_driver"]
        == base["fds_driver"],
        "no process left": not left,
        "no shared-memory segment left": shm_after == shm_before,
    }
    report = {
        "provenance": provenance(
            [0], minutes=args.minutes, train_command=portable(" ".join(cmd[1:]))
        ),
        "samples": samples,
        "max_rss_deviation": rss_dev,
        "shm_before": shm_before,
        "shm_after": shm_after,
        "processes_left": left,
        "iterations": summary.get("iterations"),
        "env_steps": summary.get("env_steps"),
        "checks": checks,
    }
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"# Soak: {args.minutes:g} min of EBRL ({' '.join(args.workload)})",
        "",
        f"commit {report['provenance']['commit']}, {report['provenance']['machine']}, "
        f"{report['provenance']['date']}; command `{report['provenance']['command']}`",
        "",
        f"{summary.get('iterations')} updates, {summary.get('env_steps')} env steps; "
        f"RSS of the driver and its processes, max deviation from the first sample "
        f"{rss_dev:.1%}",
        "",
        "| t (s) | RSS (MiB) | fds (all) | fds (driver) | processes | shm segments |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {s['t_s']:.0f} | {s['rss_mib']:.0f} | {s['fds_all']} | {s['fds_driver']} | "
            f"{s['processes']} | {s['shm_segments']} |"
            for s in samples
        ),
        "",
        *(f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in checks.items()),
    ]
    (out / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
