"""Synchronous scheduling against EBRL, side by side, on the embedded default workload.

One invocation runs every configuration for every seed (seed-major, every other seed in reverse:
see "Seed order" below), each as its own ``python -m ebrl.train`` process, and prints:

- end-to-end throughput (env steps consumed by training per second, steady state) per
  configuration: mean and 95% bootstrap CI over seeds;
- EBRL's ratio to each synchronous configuration, with a paired bootstrap 95% CI;
- each level's contribution (cumulative ablation: levels off -> +overlap -> +pipeline -> +step);
- EBRL's efficiency against the pipeline bound from measured stage costs (below);
- the engine's own overhead: wall time in which no stage ran, and worker CPU spent outside stages;
- where the time goes (``critical_path``): the share of the steady window in which the rollout
  chain (simulation, action generation, weight loads) ran, and the share in which the learner did.
  A chain busy ~all the time is the run's critical path; the other's idle share is capacity the
  schedule left unused;
- where the cores went (``core_shares``) over that window: the stages' own CPU (the spans'
  ``cpu``), the rest of the machine's CPU (the engine's glue, the driver, Ray's processes, the OS)
  and idle cores (the run's ``utilisation.csv``, sampled every 0.2 s). On a machine the run has
  to itself, the stages' share is the efficiency below, and the other two say what is missing.

Seed order: seed-major, every other seed in reverse (``run_order``), so each configuration runs
as often before its neighbour as after it and a slow drift of a shared machine cancels in the
paired ratios instead of favouring whichever runs later.

Pipeline bound: over the steady-state window, each stage's CPU seconds are its work. No schedule on
C cores can beat ``max(total work / C, gen work, train work, sim work / sim workers)`` per window
(total work spread over every core; a single-process stage can't be split), so
``bound = steps / that`` and ``efficiency = achieved / bound``.

Usage: python benchmarks/scheduler_throughput.py [--seeds 0,1,2] [--iterations 10] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.stats import ci_label, mean_ci, ratio_ci  # noqa: E402
from benchmarks.common import LEVELS_OFF, provenance, write_results  # noqa: E402
from ebrl.timeline import covered_s  # noqa: E402

#: the embedded default: PushCube-v1 on CPU physics, the VLA-shaped transformer (size L:
#: generation ~ simulation), action chunks of 4, 16 envs in 2 groups, 2 PPO epochs per update
WORKLOAD = [
    "simulator=pushcube",
    "policy=transformer_l",
    "chunk_size=4",
    "num_envs=16",
    "env_groups=2",
    "algo.cfg.update_epochs=2",
    "algo.cfg.num_minibatches=2",
]
#: --workload name -> the simulator overrides that replace PushCube. "sleep": a synthetic
#: simulator that waits (no CPU) 2 ms per step with P99 = 3x the mean, the case where
#: pipelining and the step level should pay
WORKLOADS: dict[str, list[str]] = {
    "pushcube": [],
    "sleep": [
        "simulator=synthetic",
        "simulator.cost_mode=sleep",
        "simulator.step_cost_ms=2",
        "simulator.tail_ratio=3",
    ],
    # LIBERO-Object on CPU physics (make setup-libero): state observations, the suite's 10 tasks
    # spread over the envs, chunks of 8 as OpenVLA-OFT executes, 8 decisions per update
    "libero_object": [
        "simulator=libero",
        "simulator.task=libero_object",
        "chunk_size=8",
        "rollout_steps=64",
    ],
    # the paper's pi0, tiny (conf/policy/pi0_tiny.yaml: RLinf's own model code), on PushCube as
    # a VLA sees it (the robot's state, a 64 x 64 camera rendered on the CPU, the instruction);
    # needs .venv-openpi (make test-openpi): run this script with its python. Rendering makes a
    # step ~30x dearer than state observations, so 8 envs and 8 decisions per update
    "pushcube_pi0": [
        "simulator=pushcube_rgb",
        "policy=pi0_tiny",
        "num_envs=8",
        "rollout_steps=8",
    ],
}
#: name -> overrides. Baselines first: "sync" is the in-process synchronous scheduler,
#: "sync-workers" the same lock-step schedule on EBRL's worker processes (all levels off), and
#: colocated / hybrid / async are the RLinf replicas (baselines/). Then EBRL's levels added one
#: at a time: async is "+overlap" (k=1, one group, no step level), "+pipeline" adds env-group
#: pipelining, and "ebrl" adds step-level orchestration.
CONFIGS: dict[str, list[str]] = {
    "sync": ["scheduler=sync", "threads.gen=1", "threads.train=2"],
    "colocated": ["scheduler=colocated"],
    "sync-workers": ["scheduler=ebrl", *LEVELS_OFF, "threads.train=2"],
    "hybrid": ["scheduler=hybrid", "threads.gen=1"],
    "async": ["scheduler=async", "scheduler.staleness=1", "threads.gen=1", "threads.train=1"],
    # the ablation pins every level, on Async's 1 + 1 threads; "ebrl" is EBRL as a user types
    # it: its resource manager chooses G, the step level, M and the threads, up to the default
    # threads.gen=1 / threads.train=2 (ebrl/resources/shape.py)
    "+pipeline": [
        "scheduler=ebrl",
        "scheduler.pipeline=true",
        "scheduler.step_level=false",
        "threads.train=1",
    ],
    "+step": [
        "scheduler=ebrl",
        "scheduler.pipeline=true",
        "scheduler.step_level=true",
        "threads.train=1",
    ],
    # the step level with the cap at every env: envs that piled up share a call
    "+step-cap": [
        "scheduler=ebrl",
        "scheduler.pipeline=true",
        "scheduler.step_level=true",
        "scheduler.batch_max=16",
        "threads.train=1",
    ],
    "ebrl": ["scheduler=ebrl"],
    # EBRL scaled out as far as 2 cores allow (issue 16): 2 replicas, a 2-rank gloo learner
    "ebrl-r2l2": [
        "scheduler=ebrl",
        "threads.train=1",
        "scheduler.gen_replicas=2",
        "scheduler.learner_ranks=2",
    ],
}
BASELINES = ("sync", "colocated", "sync-workers", "hybrid", "async")
ABLATION = (
    ("levels off", "sync-workers"),
    ("+overlap (k=1)", "async"),
    ("+pipeline (G=2)", "+pipeline"),
    ("+step level (M = half a group)", "+step"),
    ("EBRL's chosen shape", "ebrl"),
)
IN_PROCESS = ("sync", "colocated")


def run(
    name: str,
    seed: int,
    iters: int,
    warmup: int,
    out: Path,
    experiment: str,
    workload: list[str],
    overrides: list[str] | None = None,
) -> dict:
    """One ``python -m ebrl.train`` run of configuration ``name`` (its ``CONFIGS`` overrides,
    or ``overrides`` when given) and its summary, bound and shape."""
    run_dir = out / "runs" / f"{name}-s{seed}"
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *workload,
        *(CONFIGS[name] if overrides is None else overrides),
        f"seed={seed}",
        f"budget.iterations={iters}",
        f"warmup_iters={warmup}",
        "budget.env_steps=100000000",
        f"run_dir={run_dir}",
        f"tracking.experiment={experiment}",
        "tracking.utilisation=true",
        "progress=false",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    s = json.loads((run_dir / "summary.json").read_text())
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    s.update(config=name, seed=seed, command=" ".join(cmd[1:]))
    s.update(bound_and_overhead(rows, warmup, sim_workers=1 if name in IN_PROCESS else 2))
    timeline = run_dir / "timeline.json"
    if timeline.exists():
        events = json.loads(timeline.read_text())["traceEvents"]
        s.update(critical_path(events, warmup))
        util = run_dir / "utilisation.csv"
        if util.exists():
            s.update(core_shares(events, list(csv.DictReader(util.open())), warmup))
    shape = run_dir / "shape.json"
    if shape.exists():  # the resource manager's choice, its prediction and its cost
        chosen = json.loads(shape.read_text())
        s["shape"] = describe_shape(chosen["shape"])
        s["shape_predicted"] = next(
            p["throughput"]
            for p in chosen["predictions"]
            if all(p[k] == v for k, v in chosen["shape"].items())
        )
        s["shape_profile_s"] = chosen["profile_s"] + chosen["search_s"]
        rec = chosen.get("recalibration")
        if rec is not None:  # measured in the run: the shortlist's rates, the shape kept
            s["shape_trials"] = ", ".join(
                f"{describe_shape(t)} {t['env_steps_per_s']:.0f}" for t in rec.get("trials", [])
            )
            s["shape_trial_s"] = rec.get("trial_s", 0.0)
            s["shape_cores_effective"] = rec["cores_effective"]
            s["shape_after"] = describe_shape(rec["after"])
            s["shape_measured"] = rec["measured"]
            s["shape_refit_predicted"] = next(
                p["throughput"]
                for p in rec["predictions"]
                if all(p.get(k) == v for k, v in rec["after"].items())
            )
    moves = run_dir / "reallocations.jsonl"
    if moves.exists():  # the shape watch's firings (a stage drifted): moved or kept
        rows_ = [json.loads(x) for x in moves.read_text().splitlines() if x.strip()]
        fired = [r for r in rows_ if r.get("kind") == "shape"]
        s["shape_watch"] = "; ".join(
            f"update {r['step']}: "
            + (f"-> {describe_shape(r['new'])}" if r["changed"] else "kept")
            + f" ({', '.join(f'{k} x{v:.2f}' for k, v in r['factors'].items())})"
            for r in fired
        )
    nan = float("nan")
    print(
        f"  {name:13s} seed {seed}: {s['throughput_e2e']:7.1f} steps/s "
        f"(bound {s['bound']:.0f}, glue cpu {s['glue_cpu_frac']:.3f}, busy: rollout "
        f"{s.get('rollout_busy', nan):.2f}, learner {s.get('learner_busy', nan):.2f}; cores: "
        f"stages {s.get('stage_share', nan):.2f}, other {s.get('other_share', nan):.2f}, idle "
        f"{s.get('idle_share', nan):.2f})"
        + (f", shape {s['shape']} in {s['shape_profile_s']:.1f} s" if "shape" in s else ""),
        flush=True,
    )
    return s


def describe_shape(shape: dict) -> str:
    threads = ""
    if shape.get("gen_threads") is not None:  # the search chose the threads too
        threads = f", threads {shape['gen_threads']}+{shape['train_threads']}"
    if shape["step_level"]:
        cap = shape.get("batch_max") or shape["batch_min"]
        up_to = f" up to {cap}" if cap > shape["batch_min"] else ""
        return f"step level M={shape['batch_min']}{up_to}{threads}"
    return f"G={shape['env_groups']} lock step{threads}"


def bound_and_overhead(rows: list[dict], warmup: int, sim_workers: int) -> dict:
    """Pipeline bound and the engine's CPU outside stages, over the steady-state window."""
    a, b = rows[max(0, warmup - 1)], rows[-1]

    def d(key: str) -> float:
        return float(b.get(key) or 0) - float(a.get(key) or 0)

    steps = d("env/steps_total")
    # "offload" (colocated) sits inside a gen span: not counted twice
    cpu = {st: d(f"time/{st}/cpu_s") for st in ("sim", "gen", "train", "sync", "load")}
    cores = os.cpu_count() or 1
    work = sum(cpu.values())
    t_bound = max(work / cores, cpu["gen"], cpu["train"], cpu["sim"] / sim_workers)
    procs = [k for k in b if k.startswith("resource/") and k.endswith("/cpu_s")]
    proc_cpu = sum(d(k) for k in procs)
    return {
        "bound": steps / t_bound if t_bound > 0 else float("nan"),
        "stage_cpu_window": cpu,
        "glue_cpu_frac": (1 - work / proc_cpu) if proc_cpu > 0 else float("nan"),
    }


#: timeline span names of each side of the pipeline ("offload", colocated's, sits inside "gen")
ROLLOUT_SPANS = ("sim", "gen", "load")
LEARNER_SPANS = ("train", "sync")


def steady_window(events: list[dict], warmup: int) -> tuple[float, float] | None:
    """The steady window of a run's ``timeline.json`` trace events (``ph == "X"``, microseconds):
    from the end of update ``warmup`` (the ``warmup``-th ``train`` span; the metrics' steady
    window starts there too) to the end of the last update. None when the run has too few."""
    trains = sorted(
        e["ts"] + e["dur"] for e in events if e.get("ph") == "X" and e["name"] == "train"
    )
    if len(trains) <= warmup or warmup < 1:
        return None
    return trains[warmup - 1], trains[-1]


def critical_path(events: list[dict], warmup: int) -> dict:
    """Share of the steady window (:func:`steady_window`) in which each side of the pipeline ran.

    Returns ``rollout_busy`` (any sim, gen or load span running), ``learner_busy`` (train or
    sync) and ``both_busy``; NaN when the run has too few updates.
    """
    spans = [e for e in events if e.get("ph") == "X"]
    window = steady_window(spans, warmup)
    if window is None:
        nan = float("nan")
        return {"rollout_busy": nan, "learner_busy": nan, "both_busy": nan}
    lo, hi = window

    def side(names: tuple[str, ...]) -> list[tuple[float, float]]:
        return [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] in names]

    roll, learn = side(ROLLOUT_SPANS), side(LEARNER_SPANS)
    r, t, either = (covered_s(iv, lo, hi) for iv in (roll, learn, roll + learn))
    w = hi - lo
    # both ran: what either side covers, counted once (inclusion-exclusion)
    return {"rollout_busy": r / w, "learner_busy": t / w, "both_busy": (r + t - either) / w}


def core_shares(events: list[dict], util: list[dict], warmup: int) -> dict:
    """Where the machine's cores went over the steady window (:func:`steady_window`).

    ``util``: the run's ``utilisation.csv`` rows (``t_s`` on the timeline's clock, at the end of
    each sample; ``device``, ``util_pct`` per core). Returns, as shares of cores x window:
    ``stage_share``, the CPU seconds of the stage spans (each span's ``cpu`` pro rata to the part
    of it inside the window); ``idle_share``, the cores' idle time in the samples that fall in
    the window; ``other_share``, the rest: CPU outside every stage (the engine's glue, the
    driver, Ray's processes, the OS). NaN without a window or a sample in it.
    """
    nan = float("nan")
    out = {"stage_share": nan, "other_share": nan, "idle_share": nan}
    window = steady_window(events, warmup)
    cpu = [r for r in util if r.get("device") == "cpu"]
    if window is None or not cpu:
        return out
    lo, hi = window[0] / 1e6, window[1] / 1e6
    busy: dict[float, list[float]] = {}
    for r in cpu:
        t = float(r["t_s"])
        if lo < t <= hi:
            busy.setdefault(t, []).append(float(r["util_pct"]) / 100)
    if not busy:
        return out
    cores = len(next(iter(busy.values())))
    idle = 1 - float(np.mean([np.mean(v) for v in busy.values()]))
    stage_cpu = 0.0
    for e in events:
        if e.get("ph") != "X" or "cpu" not in e.get("args", {}) or e["dur"] <= 0:
            continue
        a, b = max(e["ts"] / 1e6, lo), min((e["ts"] + e["dur"]) / 1e6, hi)
        if b > a:
            stage_cpu += float(e["args"]["cpu"]) * (b - a) / (e["dur"] / 1e6)
    stage = stage_cpu / (cores * (hi - lo))
    return {"stage_share": stage, "other_share": 1 - stage - idle, "idle_share": idle}


def run_order(seeds: list[int], names: list[str]) -> list[tuple[int, str]]:
    """(seed, configuration) in the order they run: seed-major, every other seed reversed."""
    return [(s, n) for i, s in enumerate(seeds) for n in (names if i % 2 == 0 else names[::-1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    # every configuration but the scale-out one (run it by name: it measures the engine, not
    # a schedule)
    ap.add_argument("--configs", default=",".join(n for n in CONFIGS if n != "ebrl-r2l2"))
    ap.add_argument("--experiment", default="bench-scheduler", help="MLflow experiment")
    ap.add_argument("--workload", default="pushcube", choices=sorted(WORKLOADS))
    ap.add_argument(
        "--out", default=str(ROOT / "results" / "scheduler" / time.strftime("%Y-%m-%d"))
    )
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.configs.split(",")
    workload = WORKLOAD + WORKLOADS[args.workload]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    total, t0 = len(seeds) * len(names), time.time()
    for s, n in run_order(seeds, names):
        rows.append(run(n, s, args.iterations, args.warmup, out, args.experiment, workload))
        left = (time.time() - t0) / len(rows) * (total - len(rows))
        print(f"  [{len(rows)}/{total} runs, ~{left / 60:.0f} min left]", flush=True)

    def tp(name: str) -> np.ndarray:
        return np.array(
            [
                r["throughput_e2e"]
                for r in sorted(rows, key=lambda r: r["seed"])
                if r["config"] == name
            ]
        )

    # every interval is the measured default of its statistic (analysis.stats.DEFAULT_METHOD),
    # named where it is printed
    lines = [
        f"| configuration | end-to-end env steps/s, mean [{ci_label('t', n=len(seeds))}] | seeds |",
        "|---|---|---|",
    ]
    for n in names:
        lines.append(f"| {n} | {mean_ci(tp(n)).fmt('.1f')} | {len(tp(n))} |")
    ratio_label = ci_label("t-log", n=len(seeds))
    lines += ["", f"| ratio | geometric mean of per-seed ratios [{ratio_label}] |", "|---|---|"]
    if "ebrl" in names:
        for base in [n for n in names if n != "ebrl"]:
            lines.append(f"| ebrl / {base} | {ratio_ci(tp('ebrl'), tp(base)).fmt('.3f')} |")
        bases = [n for n in names if n in BASELINES]
        if bases:
            best = max(bases, key=lambda n: tp(n).mean())
            r = ratio_ci(tp("ebrl"), tp(best))
            lines += [
                "",
                f"strongest baseline: {best}; EBRL speedup over it: {r.fmt('.3f')} "
                f"({ci_label(r.method, n=r.n) if r.method else 'one seed: no interval'})",
            ]
        steps = [(label, n) for label, n in ABLATION if n in names]
        if len(steps) > 1:
            lines += [
                "",
                f"ratios (x previous, x levels off): geometric mean of per-seed ratios "
                f"[{ratio_label}]",
                "",
                f"| ablation (cumulative) | steps/s, mean [{ci_label('t')}] | x previous "
                "| x levels off |",
                "|---|---|---|---|",
            ]
            for i, (label, n) in enumerate(steps):
                prev = ratio_ci(tp(n), tp(steps[i - 1][1])).fmt(".3f") if i else "-"
                first = ratio_ci(tp(n), tp(steps[0][1])).fmt(".3f") if i else "-"
                lines.append(f"| {label} ({n}) | {mean_ci(tp(n)).fmt('.1f')} | {prev} | {first} |")
    lines += [
        "",
        "| configuration | rollout chain busy | learner busy | both at once "
        "| cores: stages | cores: other CPU | cores: idle |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        got = [r for r in rows if r["config"] == n]

        def mean(key: str, got: list[dict] = got) -> str:
            v = np.array([r.get(key, np.nan) for r in got], dtype=float)
            return f"{np.nanmean(v):.2f}" if np.isfinite(v).any() else "-"

        lines.append(
            f"| {n} | {mean('rollout_busy')} | {mean('learner_busy')} | {mean('both_busy')} "
            f"| {mean('stage_share')} | {mean('other_share')} | {mean('idle_share')} |"
        )
    ebrl_rows = [r for r in rows if r["config"] == "ebrl"]
    if ebrl_rows:
        eff = np.array([r["throughput_e2e"] / r["bound"] for r in ebrl_rows])
        ovh = np.array([r["overhead_frac"] for r in ebrl_rows])
        glue = np.array([r["glue_cpu_frac"] for r in ebrl_rows])
        lines += [
            "",
            f"EBRL's per-run figures, mean [{ci_label('t', n=len(ebrl_rows))}]:",
            f"EBRL efficiency vs pipeline bound: {mean_ci(eff).fmt('.3f')}",
            f"EBRL wall time with no stage running: {mean_ci(ovh).fmt('.3f')}",
            f"EBRL worker CPU outside stage calls: {mean_ci(glue).fmt('.3f')}",
        ]
        shaped = [r for r in ebrl_rows if "shape" in r]
        if shaped:
            err = np.array([r["shape_predicted"] / r["throughput_e2e"] for r in shaped])
            cost = np.array([r["shape_profile_s"] for r in shaped])
            lines += [
                "EBRL's chosen shape per seed: "
                + ", ".join(f"s{r['seed']} {r['shape']}" for r in shaped),
                f"its start-up profile and search, seconds: {mean_ci(cost).fmt('.1f')}",
                f"the model's predicted / measured throughput: {mean_ci(err).fmt('.2f')}",
            ]
        watched = [r for r in shaped if r.get("shape_watch")]
        lines.append(
            "the shape watch's firings (a stage's drift; cost factors): "
            + ("; ".join(f"s{r['seed']} {r['shape_watch']}" for r in watched) or "none")
        )
        refit = [r for r in shaped if "shape_cores_effective" in r]
        if refit:  # the shortlist measured in the run, the shape kept, the model refit to it
            cores = np.array([r["shape_cores_effective"] for r in refit])
            after = np.array([r["shape_refit_predicted"] / r["throughput_e2e"] for r in refit])
            trial_s = np.array([r["shape_trial_s"] for r in refit])
            lines += [
                "measured in the run (env steps/s per shape, one after the other): "
                + "; ".join(f"s{r['seed']} {r['shape_trials']}" for r in refit),
                f"the trials' seconds: {mean_ci(trial_s).fmt('.1f')}; the shape kept per "
                "seed: " + ", ".join(f"s{r['seed']} {r['shape_after']}" for r in refit),
                "effective cores of the model refit to the kept shape: "
                + mean_ci(cores).fmt(".2f"),
                "the refit model's predicted / measured throughput: " + mean_ci(after).fmt(".2f"),
            ]
    table = "\n".join(lines)
    print("\n" + table)
    prov = provenance(
        seeds,
        workload=workload,
        configs={n: CONFIGS[n] for n in names},
        iterations=args.iterations,
        warmup=args.warmup,
    )
    keep = (
        "config",
        "seed",
        "throughput_e2e",
        "throughput_overall",
        "bound",
        "overhead_frac",
        "glue_cpu_frac",
        "rollout_busy",
        "learner_busy",
        "both_busy",
        "stage_share",
        "other_share",
        "idle_share",
        "env_steps",
        "wall_s",
        "success_rate",
        "commit",
        "shape",
        "shape_predicted",
        "shape_profile_s",
        "shape_cores_effective",
        "shape_trials",
        "shape_trial_s",
        "shape_after",
        "shape_measured",
        "shape_refit_predicted",
        "shape_watch",
    )
    write_results(out, rows, keep, "Scheduler throughput", table, prov)


if __name__ == "__main__":
    main()
