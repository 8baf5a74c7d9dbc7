"""``python -m ebrl.plan``: every scheduler's predicted throughput, staleness, busy time and
bubbles on a machine, from a stage profile (README.md, "Planning capacity").

Examples::

    # the paper's headline and scaling configurations from the example GPU profile
    python -m ebrl.plan --paper --out results/plan/example
    # one configuration: a scale point of conf/axis/scale/, a Gantt of each schedule
    python -m ebrl.plan --profile conf/plan/example_gpu_profile.json --machine scale/g4 \\
        --gantt outputs/plan/g4
    # a CPU profile of a run, then its machine
    python -m ebrl.plan --profile-from-run outputs/runs/<date>/<time> --out profile.json
    python -m ebrl.plan --profile profile.json --machine cpu --set num_envs=32
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebrl.plan.from_run import RunFacts, profile_from_run
from ebrl.plan.machine import CONF, MachineSpec, from_conf
from ebrl.plan.profile import Profile, ProfileError
from ebrl.plan.schedulers import (
    SCHEDULERS,
    PlanRow,
    PlanWorkload,
    plan_one,
    scheduler_threads,
)
from ebrl.resources.model import Played

#: the example GPU profile (illustrative, not measured)
EXAMPLE = CONF / "plan" / "example_gpu_profile.json"
#: the paper's configurations: name -> (machine, workload overrides). pi0 on LIBERO-Spatial:
#: chunks of 5 (policy.action_chunk), an iteration one episode (220 steps: T = 44), 2 groups
PAPER_WORKLOAD: dict[str, Any] = {
    "env_groups": 2,
    "decisions_per_env": 44,
    "staleness": 1,
    "episode_steps": 220,
}
PAPER = {
    # headline_full: conf/experiment/cluster.yaml, one 8-GPU node, 256 envs; it sets no roles
    # (ScaleConfig's defaults would put the policy on cores): the 8-GPU scale point's roles
    "headline (cluster.yaml, 8 GPUs)": ("scale/g8", {"num_envs": 256}),
    **{f"scaling {g}": (f"scale/{g}", {}) for g in ("g1", "g2", "g4", "g8", "g16")},
}


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs; values read as JSON where they parse (numbers, true, lists)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def workload_for(machine_roles: dict[str, Any], base: dict[str, Any]) -> PlanWorkload:
    """A workload: the config's roles (``scale`` node: sim_workers, gen_replicas, ...), then
    ``base`` (a file and ``--set``) over them."""
    raw = {k: v for k, v in machine_roles.items() if k in PlanWorkload.__dataclass_fields__}
    raw.update(base)
    return PlanWorkload.from_dict(raw)


def at_profile_threads(
    wl: PlanWorkload, profile: Profile, machine: MachineSpec, asked: dict[str, Any]
) -> PlanWorkload:
    """``wl`` at threads a CPU profile measured. A profile from a run has the run's threads
    only: where a scheduler would take a thread count by default (not in ``asked``) that the
    profile neither measured nor lies between, it plans at the nearest measured count below
    (or the lowest) and says so; threads asked for are left to fail by name."""
    if "threads" in asked:
        return wl

    def fit(stage: Any, n: int) -> int:
        levels = stage.levels()
        if stage.device != "cpu" or levels[0] <= n <= levels[-1]:
            return n
        return int(max((lv for lv in levels if lv <= n), default=levels[0]))

    pinned = {f for f in ("gen_threads", "train_threads") if f in asked}
    threads = dict(wl.threads)
    for name in SCHEDULERS:
        g, t = scheduler_threads(name, wl, machine)
        fitted = (
            g if "gen_threads" in pinned else fit(profile.gen, g),
            t if "train_threads" in pinned else fit(profile.train, t),
        )
        if fitted != (g, t):
            threads[name] = fitted
    if threads == dict(wl.threads):
        return wl
    have = sorted({*profile.gen.levels(), *profile.train.levels()})
    moved = ", ".join(f"{n} {g}+{t}" for n, (g, t) in threads.items() if n not in wl.threads)
    print(
        f"note: the profile has threads [{', '.join(f'{lv:g}' for lv in have)}]: planning "
        f"gen+train threads {moved} (--set gen_threads=... train_threads=... asks for others)"
    )
    return dataclasses.replace(wl, threads=threads)


def write_gantt(played: Played, path: Path) -> Path:
    """The played schedule as a Chrome trace in a run's ``timeline.json`` format (a lane per
    worker; ``analysis.figures.gantt`` draws it)."""
    from ebrl.timeline import Span, Timeline

    tl = Timeline()
    tl.t0 = 0.0  # model seconds from the schedule's start
    for s in played.spans:
        tl.add(Span(s.stage, s.track, s.start, s.end, s.args))
    path.parent.mkdir(parents=True, exist_ok=True)
    return tl.write_chrome_trace(path)


def fmt_row(r: PlanRow) -> str:
    p = r.prediction
    busy = " ".join(f"{s} {p.stage_busy.get(s, 0.0):.2f}" for s in ("sim", "gen", "train"))
    bubbles = " ".join(f"{s} {1 - p.stage_util.get(s, 0.0):.0%}" for s in ("sim", "gen", "train"))
    stale = "/".join(f"{f:.2f}" for f in p.staleness)
    e, rr, ll = r.roles
    return (
        f"| {r.scheduler} | {r.shape.describe()} | {e}/{rr}/{ll} | {p.throughput:,.0f} | "
        f"{p.update_s:.2f} | {stale} | {busy} | {bubbles} | {r.plan_s * 1000:.0f} |"
    )


HEADER = (
    "| scheduler | shape | env workers / replicas / ranks | env steps/s | s per update | "
    "staleness 0/1/.. | busy s per update | bubbles | plan ms |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def run_plan(
    profile: Profile,
    wl: PlanWorkload,
    machine: MachineSpec,
    schedulers: Sequence[str],
    seeds: Sequence[int],
    updates: int,
    gantt: Path | None,
) -> list[PlanRow]:
    rows = []
    for name in schedulers:
        row = plan_one(
            name,
            profile,
            wl,
            machine,
            seeds=seeds,
            updates=updates,
            warmup=1,
            keep=gantt is not None,
        )
        if gantt is not None and row.played is not None:
            write_gantt(row.played, gantt / f"{name}.json")
            row.played = None
        rows.append(row)
    return rows


def report(
    title: str,
    profile: Profile,
    wl: PlanWorkload,
    machine: MachineSpec,
    rows: Sequence[PlanRow],
    source: bool = True,
) -> str:
    mark = " (ILLUSTRATIVE profile: not measured)" if profile.illustrative else ""
    lines = [
        f"## {title}{mark}",
        "",
        f"Machine: {machine.describe()}. Workload: {wl.num_envs} envs, {wl.env_groups} groups, "
        f"T={wl.decisions_per_env}, k={wl.staleness}; EBRL/Hybrid/Async roles: "
        f"{wl.sim_workers} env worker(s), {wl.gen_replicas} generator replica(s) at "
        f"{wl.gen_gpus or 'no'} GPU, {wl.learner_ranks} learner rank(s) at "
        f"{wl.learner_gpus or 'no'} GPU.",
        f"Profile: {(profile.source or 'no source given').rstrip('.')}." if source else "",
        "",
        HEADER,
        *(fmt_row(r) for r in rows),
        "",
    ]
    notes = [f"- {r.scheduler}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + notes + ([""] if notes else []))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ebrl.plan",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 2)[2],
    )
    ap.add_argument("--profile", type=Path, help="a stage profile (ebrl-plan-profile/1 JSON)")
    ap.add_argument(
        "--machine",
        default="cpu",
        help="cpu, cluster, scale/g<N> (conf/axis/scale), or a JSON MachineSpec",
    )
    ap.add_argument("--workload", type=Path, help="a JSON file of PlanWorkload's fields")
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="workload fields (num_envs=256 staleness=2 ...)",
    )
    ap.add_argument(
        "--machine-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="machine fields over --machine's (nodes=2 gpus_per_node=8 cores_per_node=96 "
        "numa_per_node=2 gpu=h200 inter_node_gbps=50 ...)",
    )
    ap.add_argument(
        "--cores-effective",
        type=float,
        help="the fraction of a node's cores processes get together (default 1)",
    )
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    ap.add_argument("--seeds", default="0", help="model seeds averaged (the replayed tail)")
    ap.add_argument(
        "--updates",
        type=int,
        default=4,
        help="updates played (the first is warm-up; the steady state is reached "
        "within one at every configuration tried)",
    )
    ap.add_argument("--gantt", type=Path, help="write each schedule's Chrome trace here")
    ap.add_argument("--json", type=Path, help="write every figure as JSON here")
    ap.add_argument(
        "--paper",
        action="store_true",
        help="the paper's headline and scaling configurations (default profile: "
        "the illustrative example)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="--paper: the folder for plan.md and plan.json; --profile-from-run: the profile file",
    )
    ap.add_argument(
        "--profile-from-run",
        type=Path,
        metavar="RUN_DIR",
        help="write a profile from a run folder's shape.json/timeline.json/summary.json",
    )
    for f in (
        "num_envs",
        "decisions_per_env",
        "chunk_size",
        "gen_threads",
        "train_threads",
        "episode_steps",
    ):
        ap.add_argument(
            f"--{f.replace('_', '-')}",
            type=int,
            help="--profile-from-run, a folder without config.yaml: what it ran",
        )
    args = ap.parse_args(argv)
    try:
        if args.profile_from_run is not None:
            return _from_run(args)
        return _plan(args)
    except (ProfileError, ValueError) as e:
        print(f"ebrl.plan: {e}", file=sys.stderr)
        return 2


def _from_run(args: argparse.Namespace) -> int:
    facts = None
    if args.num_envs is not None:
        if args.decisions_per_env is None or args.chunk_size is None:
            raise ProfileError("give --num-envs with --decisions-per-env and --chunk-size")
        facts = RunFacts(
            args.num_envs,
            args.decisions_per_env,
            args.chunk_size,
            args.gen_threads or 1,
            args.train_threads or 1,
            args.episode_steps,
        )
    prof = profile_from_run(args.profile_from_run, facts)
    out = args.out or args.profile_from_run / "plan_profile.json"
    prof.save(out)
    print(f"wrote {out} ({prof.source})")
    return 0


def _plan(args: argparse.Namespace) -> int:
    seeds = [int(x) for x in args.seeds.split(",")]
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    base = json.loads(args.workload.read_text()) if args.workload else {}
    base.update(parse_sets(args.set))
    over = parse_sets(args.machine_set)
    if args.cores_effective is not None:
        over["cores_effective"] = args.cores_effective
    if "gpu" in over and not (CONF / "gpu" / f"{over['gpu']}.yaml").exists():
        names = sorted(p.stem for p in (CONF / "gpu").glob("*.yaml"))
        raise ValueError(f"gpu={over['gpu']}: not in conf/gpu ({', '.join(names)})")
    if args.paper:
        profile = Profile.load(args.profile or EXAMPLE)
        texts, figures = [], []
        for title, (mname, wl_over) in PAPER.items():
            machine, roles = from_conf(mname, **over)
            wl = workload_for(roles, {**PAPER_WORKLOAD, **wl_over, **base})
            t0 = time.perf_counter()
            rows = run_plan(
                profile,
                wl,
                machine,
                schedulers,
                seeds,
                args.updates,
                args.gantt / mname.replace("/", "-") if args.gantt else None,
            )
            texts.append(report(title, profile, wl, machine, rows, source=False))
            figures.append(_figures(title, profile, wl, machine, rows, time.perf_counter() - t0))
            print(texts[-1], flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            head = _paper_head(profile, args)
            (args.out / "plan.md").write_text(head + "\n".join(texts))
            (args.out / "plan.json").write_text(json.dumps(figures, indent=1) + "\n")
            print(f"wrote {args.out / 'plan.md'} and plan.json")
        return 0
    if args.profile is None:
        raise ProfileError("give --profile FILE (or --paper, or --profile-from-run RUN_DIR)")
    profile = Profile.load(args.profile)
    machine, roles = from_conf(args.machine, **over)
    wl = workload_for(roles, base)
    wl = at_profile_threads(wl, profile, machine, asked=base)
    t0 = time.perf_counter()
    rows = run_plan(profile, wl, machine, schedulers, seeds, args.updates, args.gantt)
    print(report(f"{args.machine}", profile, wl, machine, rows))
    if args.json:
        fig = _figures(args.machine, profile, wl, machine, rows, time.perf_counter() - t0)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(fig, indent=1) + "\n")
    return 0


def _figures(
    title: str,
    profile: Profile,
    wl: PlanWorkload,
    machine: MachineSpec,
    rows: Sequence[PlanRow],
    took: float,
) -> dict[str, Any]:
    return {
        "configuration": title,
        "illustrative_profile": profile.illustrative,
        "profile_source": profile.source,
        "machine": machine.to_dict(),
        "workload": wl.to_dict(),
        "plan_s": took,
        "schedulers": [r.to_dict() for r in rows],
    }


def _paper_head(profile: Profile, args: argparse.Namespace) -> str:
    """What the answers are and where they come from."""
    from ebrl.tracking.provenance import git_commit, machine, portable

    warn = (
        "**These answers come from an ILLUSTRATIVE profile, not a measured one**: every GPU "
        "cost in it is an assumption written down by hand (its `source` field says which). "
        "They show what the planner does with a profile; they are not predictions of any real "
        "cluster. `scripts/gpu_check.sh` writes a measured profile on a GPU machine; plan from "
        "that one.\n\n"
        if profile.illustrative
        else ""
    )
    return (
        "# The planner's answer for the paper's headline and scaling configurations\n\n"
        + warn
        + f"- command: `{portable(' '.join(['python -m ebrl.plan', *sys.argv[1:]]))}`\n"
        + f"- commit: {git_commit()}; planned on: {machine()}; "
        + f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
        + f"- profile: {profile.source}\n\n"
    )
