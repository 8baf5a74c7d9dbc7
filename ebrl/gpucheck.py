"""The GPU check's own steps (``scripts/gpu_check.sh``): provenance, the MPS daemon's clients
seen while a run goes, the miniature regime's report and the planner's error against it, and
what travels to a GPU machine.

::

    python -m ebrl.gpucheck provenance --out provenance.json --mode gpu --command "..."
    python -m ebrl.gpucheck watch-mps RUNS_DIR --out mps_clients.txt --while-pid PID
    python -m ebrl.gpucheck plan-args RUN_DIR            # `python -m ebrl.plan` arguments
    python -m ebrl.gpucheck report RUNS_DIR --plan plan.json --out report.md
    python -m ebrl.gpucheck carry [--prepare] [--dir outputs/gpu-carry]

The report reads each run's ``summary.json`` (no MLflow: the GPU machine has none) and prints
EBRL / the strongest baseline with analysis's default ratio interval
(:func:`analysis.stats.speedup_over_baseline`, ``DEFAULT_METHOD["ratio"]``), then each
scheduler's measured env steps/s beside the planner's for the same configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: what the GPU machine may receive beside nothing else: the tree and the carried paths together
CARRY_LIMIT = 64 * 2**20
#: where ``carry --prepare`` puts the wheels the GPU machine's image lacks (ignored by git)
CARRY_DIR = Path("outputs/gpu-carry")
#: the packages ebrl imports that the GPU machine's image lacks (its image has torch, numpy,
#: scipy, pandas, psutil, pytest, pyyaml, msgpack, protobuf ...), pinned to the versions tested
CARRY_WHEELS = (
    "hydra-core==1.3.8",
    "omegaconf==2.3.1",
    "submitit==1.5.4",
    "hydra-submitit-launcher==1.2.0",
    "ray==2.60.0",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
)
#: pure-Python packages published as source only: built into a wheel here
CARRY_SDISTS = ("antlr4-python3-runtime==4.9.3",)
#: parts of Ray's wheel that ebrl never imports (its libraries, the Java jars, the dashboard's
#: front end): left out so that the wheels fit beside the tree
RAY_DROP = (
    "ray/jars/",
    "ray/rllib/",
    "ray/serve/",
    "ray/data/",
    "ray/train/",
    "ray/tune/",
    "ray/llm/",
    "ray/dashboard/client/",
)
#: scheduler name in a run's summary -> the planner's name
PLANNER = {"sync": "sync", "colocated": "colocated", "hybrid": "hybrid", "async": "async"}


# --- provenance -------------------------------------------------------------------------------
def _out(cmd: Sequence[str], env: dict[str, str] | None = None, timeout: float = 20) -> str:
    """A command's stdout (and stderr), or why it gave none."""
    try:
        p = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({cmd[0]}: {e})"


def provenance(mode: str, command: str, seeds: str, carried: Sequence[str]) -> dict[str, Any]:
    """What produced the check's figures: commit, machine, command, seeds, GPU, software."""
    from ebrl.tracking.provenance import git_commit, machine

    smi = shutil.which("nvidia-smi")
    torch_v = _out(
        [sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"]
    )
    return {
        "mode": mode,
        "commit": git_commit(),
        "machine": machine(),
        "command": command,
        "seeds": seeds,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "python": platform.python_version(),
        "torch (version, CUDA)": torch_v,
        "nvidia-smi": _out([smi]) if smi else "nvidia-smi not found",
        "nvidia-smi -L": _out([smi, "-L"]) if smi else "",
        "mps control": shutil.which("nvidia-cuda-mps-control") or "not found",
        "carried": list(carried),
    }


# --- the MPS daemon's clients, while a run goes -------------------------------------------------
def mps_control(pipe: str | None, command: str) -> tuple[bool, str]:
    """One ``nvidia-cuda-mps-control`` command to the daemon at ``pipe``: (answered, its
    answer or why there was none)."""
    env = dict(os.environ)
    if pipe:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    try:
        p = subprocess.run(
            ["nvidia-cuda-mps-control"],
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=15,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"nvidia-cuda-mps-control: {e}"
    return True, p.stdout.strip()


def mps_lines(run: Path) -> list[str]:
    """The daemon's servers and clients for a run folder's GPU roles, and each role's quota,
    pipe, GPUs and pid as the role's process recorded them (``gpu_env.jsonl``)."""
    rows = [json.loads(ln) for ln in (run / "gpu_env.jsonl").read_text().splitlines() if ln]
    sched = _summary_field(run, "scheduler") or _config_scheduler(run)
    lines = [f"run {run.name} ({sched}): {len(rows)} GPU role(s)"]
    for r in rows:
        lines.append(
            f"  role {r.get('worker')}: pid {r.get('pid')} "
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={r.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')} "
            f"CUDA_MPS_PIPE_DIRECTORY={r.get('CUDA_MPS_PIPE_DIRECTORY')} "
            f"CUDA_VISIBLE_DEVICES={r.get('CUDA_VISIBLE_DEVICES')}"
        )
    pipes = sorted(
        {str(r["CUDA_MPS_PIPE_DIRECTORY"]) for r in rows if r.get("CUDA_MPS_PIPE_DIRECTORY")}
    )
    if not pipes:
        lines.append("  no MPS pipe: the roles time-slice the GPU")
    for pipe in pipes:
        ok, answer = mps_control(pipe, "get_server_list")
        if not ok:
            lines.append(f"  daemon at {pipe}: not asked ({answer})")
            continue
        servers = answer.split()
        lines.append(f"  daemon at {pipe}: servers {' '.join(servers) or 'none'}")
        for s in servers:
            ok, answer = mps_control(pipe, f"get_client_list {s}")
            clients = answer.split() if ok else [f"({answer})"]
            lines.append(f"    server {s}: clients {' '.join(clients) or 'none'}")
    return lines


def _summary_field(run: Path, key: str) -> Any:
    try:
        return json.loads((run / "summary.json").read_text()).get(key)
    except (OSError, ValueError):
        return None


def _config_scheduler(run: Path) -> str:
    try:
        text = (run / "config.yaml").read_text()
    except OSError:
        return "?"
    for ln in text.splitlines():
        if ln.strip().startswith("_target_: ") and "Scheduler" in ln:
            return ln.split(".")[-1].strip()
    return "?"


def watch_mps(runs: Path, out: Path, while_pid: int, settle_s: float = 0.5) -> int:
    """Until ``while_pid`` ends: for every run folder under ``runs`` whose GPU roles have written
    ``gpu_env.jsonl``, wait ``settle_s``, then list the daemon's servers and clients (once per
    run). The roles record their environment once their stages are built on the device (their
    CUDA contexts, so their MPS clients, exist); the daemon goes with the run, so the wait is
    short. Returns the runs listed."""
    seen: set[Path] = set()
    out.parent.mkdir(parents=True, exist_ok=True)

    def alive() -> bool:
        try:
            os.kill(while_pid, 0)
            return True
        except OSError:
            return False

    while alive():
        for env in sorted(runs.glob("*/gpu_env.jsonl")):
            run = env.parent
            if run in seen or env.stat().st_size == 0:
                continue
            seen.add(run)
            time.sleep(settle_s)
            text = "\n".join(mps_lines(run)) + "\n"
            with open(out, "a") as f:
                f.write(text)
            print(text, end="", flush=True)
        time.sleep(0.5)
    return len(seen)


# --- the regime's runs, the ratio and the planner's error ---------------------------------------
def load_runs(runs: Path) -> Any:
    """One row per finished run folder under ``runs``: scheduler, seed, throughput, wall."""
    import pandas as pd

    rows = []
    for path in sorted(runs.glob("*/summary.json")):
        s = json.loads(path.read_text())
        rows.append(
            {
                "run": path.parent.name,
                "scheduler": s["scheduler"],
                "seed": int(s["seed"]),
                "status": s.get("status"),
                "throughput_e2e": s.get("throughput_e2e"),
                "iterations": s.get("iterations"),
                "wall_s": s.get("wall_s"),
                "gpu": s.get("gpu"),
                "policy": s.get("policy"),
            }
        )
    return pd.DataFrame(rows)


def ratio_lines(df: Any) -> list[str]:
    """EBRL / the strongest baseline over seeds, analysis's default ratio interval."""
    from analysis.stats import DEFAULT_METHOD, speedup_over_baseline

    ok = df[(df["status"] == "FINISHED") & df["throughput_e2e"].notna()]
    if "ebrl" not in set(ok["scheduler"]) or len(set(ok["scheduler"])) < 2:
        return ["EBRL / strongest baseline: not computed (no finished EBRL run or no baseline)"]
    method = DEFAULT_METHOD["ratio"]
    t = speedup_over_baseline(
        ok, "throughput_e2e", target="ebrl", scheduler_col="scheduler", method=method
    )
    row = t[t["scheduler"] == "ebrl"].iloc[0]
    return [
        f"EBRL / strongest baseline ({row['baseline']}): {row['ratio']:.3f} "
        f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}] (95% {row['ci_method'] or method} interval, "
        f"n={int(row['n'])} seeds, paired={bool(row['paired'])}); EBRL {row['mean']:,.0f} vs "
        f"{row['baseline']} {row['baseline_mean']:,.0f} env steps/s"
    ]


def plan_args(run: Path) -> list[str]:
    """``python -m ebrl.plan`` arguments for the configuration a run folder's ``config.yaml``
    ran: the g1 machine with this machine's cores and GPU (``gpu`` not cpu), else the CPU
    machine; the run's envs, groups, decisions per env, staleness and roles."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    sched = {**(cfg.get("scheduler") or {}), **(cfg.get("scale") or {})}
    gpu = str((cfg.get("gpu") or {}).get("name", "cpu"))
    cores = os.cpu_count() or 1
    sets = {
        "num_envs": cfg["num_envs"],
        "env_groups": cfg["env_groups"],
        "decisions_per_env": max(1, int(cfg["rollout_steps"]) // int(cfg["chunk_size"])),
        "staleness": sched.get("staleness", 1),
        **{k: sched[k] for k in ("sim_workers", "gen_replicas", "learner_ranks") if k in sched},
        **{k: sched[k] for k in ("gen_gpus", "learner_gpus") if k in sched},
    }
    if gpu == "cpu":
        args = ["--machine", "cpu", "--machine-set", f"cores_per_node={cores}"]
    else:
        args = ["--machine", "scale/g1", "--machine-set", f"cores_per_node={cores}", f"gpu={gpu}"]
    return [*args, "--set", *(f"{k}={v}" for k, v in sets.items())]


def error_lines(df: Any, plan: dict[str, Any]) -> tuple[list[str], list[float]]:
    """Each scheduler's mean measured env steps/s beside the planner's, and planned / measured
    - 1; returns the lines and the errors."""
    ok = df[(df["status"] == "FINISHED") & df["throughput_e2e"].notna()]
    planned = {r["scheduler"]: r["throughput_env_steps_per_s"] for r in plan["schedulers"]}
    lines = [
        "| scheduler | seeds | measured env steps/s | planned | planned / measured - 1 |",
        "|---|---|---|---|---|",
    ]
    errors = []
    for name, g in ok.groupby("scheduler", sort=False):
        m = float(g["throughput_e2e"].mean())
        p = planned.get(PLANNER.get(name, name))
        if p is None or m <= 0:
            lines.append(f"| {name} | {len(g)} | {m:,.0f} | - | - |")
            continue
        err = p / m - 1
        errors.append(err)
        lines.append(f"| {name} | {len(g)} | {m:,.0f} | {p:,.0f} | {err:+.0%} |")
    if errors:
        import numpy as np

        a = np.abs(errors)
        lines.append(
            f"planner's |error|: median {np.median(a):.0%}, max {a.max():.0%} over "
            f"{len(a)} schedulers"
        )
    return lines, errors


def report(runs: Path, plan: Path | None, out: Path) -> int:
    """Writes ``out`` (Markdown) and ``runs.csv`` beside it; prints both tables."""
    df = load_runs(runs)
    lines = [f"# The miniature regime: {len(df)} run(s) in {runs.name}", ""]
    if df.empty:
        lines.append("no finished run (see the sweep's log)")
    else:
        df.to_csv(out.with_name("runs.csv"), index=False)
        lines += ["| run | scheduler | seed | status | env steps/s (e2e) | updates | wall s |"]
        lines += ["|---|---|---|---|---|---|---|"]
        for r in df.itertuples():
            tp = "-" if r.throughput_e2e is None else f"{r.throughput_e2e:,.0f}"
            lines.append(
                f"| {r.run} | {r.scheduler} | {r.seed} | {r.status} | {tp} | {r.iterations} | "
                f"{r.wall_s:.1f} |"
            )
        lines += ["", *ratio_lines(df), ""]
        if plan is not None and plan.exists():
            err, _ = error_lines(df, json.loads(plan.read_text()))
            lines += ["## The planner against these runs", "", *err, ""]
        else:
            lines += ["the planner's error: no plan (the profile step did not finish)", ""]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    print(text, end="")
    return 0


# --- what travels to the GPU machine -----------------------------------------------------------
def tree_files(root: Path) -> list[Path]:
    """The files a device call sends: tracked, and untracked but not ignored."""
    p = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    )
    return [root / f for f in p.stdout.decode().split("\0") if f and (root / f).is_file()]


def carry_lines(root: Path, carried: Sequence[Path]) -> tuple[list[str], int]:
    """What travels (the tree, then each carried path with its files) and the total bytes."""
    tree = sum(f.stat().st_size for f in tree_files(root))
    lines = [f"tree (tracked + untracked not ignored): {tree / 2**20:.1f} MiB"]
    total = tree
    for c in carried:
        files = [c] if c.is_file() else sorted(p for p in c.rglob("*") if p.is_file())
        size = sum(f.stat().st_size for f in files)
        total += size
        lines.append(f"carried {c}: {size / 2**20:.1f} MiB")
        lines += [f"  {f.name}: {f.stat().st_size / 2**20:.2f} MiB" for f in files]
    verdict = "fits" if total <= CARRY_LIMIT else "OVER the limit"
    lines.append(f"total {total / 2**20:.1f} MiB of {CARRY_LIMIT / 2**20:.0f} MiB: {verdict}")
    return lines, total


def strip_wheel(wheel: Path, drop: Sequence[str]) -> None:
    """Rewrites ``wheel`` without the members under ``drop`` (RECORD keeps their lines: pip
    does not check a wheel's RECORD against its members)."""
    tmp = wheel.with_suffix(".tmp")
    with (
        zipfile.ZipFile(wheel) as src,
        zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst,
    ):
        for item in src.infolist():
            if not item.filename.startswith(tuple(drop)):
                dst.writestr(item, src.read(item))
    tmp.replace(wheel)


def carry_prepare(dest: Path) -> None:
    """Downloads the wheels the GPU machine lacks (CPython 3.12, manylinux x86-64) into
    ``dest`` and strips Ray's of what ebrl never imports."""
    dest.mkdir(parents=True, exist_ok=True)
    plats = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in plats:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *CARRY_WHEELS], check=True)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dest)]
    subprocess.run([*build, *CARRY_SDISTS], check=True)
    for wheel in dest.glob("ray-*.whl"):
        strip_wheel(wheel, RAY_DROP)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ebrl.gpucheck", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pv = sub.add_parser("provenance", help="commit, machine, command, seeds, nvidia-smi")
    pv.add_argument("--out", type=Path, required=True)
    pv.add_argument("--mode", default="gpu")
    pv.add_argument("--command", default="scripts/gpu_check.sh")
    pv.add_argument("--seeds", default="")
    pv.add_argument("--carried", nargs="*", default=[])
    w = sub.add_parser("watch-mps", help="the MPS daemon's clients of each run, while they go")
    w.add_argument("runs", type=Path)
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--while-pid", type=int, required=True)
    w.add_argument("--settle-s", type=float, default=0.5)
    pa = sub.add_parser("plan-args", help="python -m ebrl.plan arguments for a run folder")
    pa.add_argument("run", type=Path)
    r = sub.add_parser("report", help="the regime's table, EBRL / best baseline, planner error")
    r.add_argument("runs", type=Path)
    r.add_argument("--plan", type=Path)
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("carry", help="what a device call carries, against its 64 MiB")
    c.add_argument("--dir", type=Path, default=CARRY_DIR)
    c.add_argument("--prepare", action="store_true", help="download the wheels first")
    args = ap.parse_args(argv)
    if args.cmd == "provenance":
        data = provenance(args.mode, args.command, args.seeds, args.carried)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        for k, v in data.items():
            print(f"{k}: {v}")
        return 0
    if args.cmd == "watch-mps":
        n = watch_mps(args.runs, args.out, args.while_pid, args.settle_s)
        print(f"MPS clients listed for {n} run(s)")
        return 0
    if args.cmd == "plan-args":
        print(" ".join(plan_args(args.run)))
        return 0
    if args.cmd == "report":
        return report(args.runs, args.plan, args.out)
    if args.prepare:
        carry_prepare(args.dir)
    lines, total = carry_lines(ROOT, [args.dir] if args.dir.exists() else [])
    print("\n".join(lines))
    return 0 if total <= CARRY_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
