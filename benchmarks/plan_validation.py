"""The capacity planner against committed runs it was not fitted on (issue 21).

Nothing here runs a training or timing run: every number comes from ``results/``.

What is fitted, and on what:

- **Stage costs, per workload, from one configuration's runs of it**: the synchronous loop's
  runs (``sync``; the ablation's ``lockstep``: EBRL's workers with every level off), whose
  stages take turns, so each stage's busy time per update is its cost alone (generation per
  call at 1 thread, simulation per env and chunk, the update at the learner's 2 threads, the
  weight sync). Those runs are the profile, not predictions.
- **How each stage scales with threads and batch** (what a sync run cannot show: generation
  at 2 or 3 threads and at other batch sizes, the update at 1 or 3 threads): the project's
  offline profiler's measurement of the same policy on this machine
  (``results/allocator/2026-11-30/profile.json``: the transformer L timed alone at 1-3 threads
  and batches 2-8), as ratios applied to each workload's own sync costs; and how many cores a
  2-thread call keeps busy, from the CPU seconds of ``results/scheduler/2026-11-29``'s turn-taking
  runs.
- **The machine's effective cores** (one number: the fraction of the 2 cores that compute-bound
  processes get together), fitted once per day on a small set of that day's runs, by least
  squares on log rates (:data:`FITS`): 2026-12-01 on the headline sweep's PushCube-v1 x
  transformer L runs of the four non-sync schedulers (20 runs); 2026-11-30 on the allocator's
  even split (3 runs); 2026-11-29 and 2026-12-02 on their Async runs (3 each); 2026-12-06 on
  the later headline sweep's PushCube-v1 x transformer L runs of Colocated, Hybrid and Async (15
  runs: EBRL, whose shape its resource manager chose in the run, held out). The VM's neighbours
  and the engine's commit change between days; within a day one number serves every campaign.

Everything else is held out: the other three headline workloads, the scaling sweep (8, 16, 32
envs), the ablation's variants, GRPO, the 2026-11-29 scheduler benchmark, the allocator's thread
splits and batch sizes (with that campaign's own offline profile: no sync run there), the
shape-search runs of 2026-12-02 (with each run's own start-up profile, ``shape.json``, read by
``ebrl.plan.from_run`` as ``python -m ebrl.plan --profile-from-run`` does), and the 2026-12-06
headline sweep (EBRL as shipped: predicted at the shape each run kept, :data:`RUNTIME_SHAPES`).

Writes ``runs.csv`` (one row per run: measured, predicted, error, its role), ``table.md``
(per configuration, the error's median and 90th percentile over held-out runs, the ranking of
schedulers per workload, the planning time) and ``provenance.json`` into ``--out``.

Usage: python benchmarks/plan_validation.py [--out results/plan/validation] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import files  # noqa: E402
from benchmarks.common import provenance  # noqa: E402
from ebrl.plan.from_run import RunFacts, profile_from_run  # noqa: E402
from ebrl.plan.machine import MachineSpec  # noqa: E402
from ebrl.plan.profile import Point, Profile, StageProfile, SyncCosts  # noqa: E402
from ebrl.plan.schedulers import PlanWorkload, plan_one  # noqa: E402
from ebrl.resources.model import Shape  # noqa: E402

RESULTS = ROOT / "results"
#: the offline profiler's measurement of each policy at 1-3 threads (thread and batch scaling),
#: by the policy's token in a workload's label: the transformer L in the allocator campaign,
#: the M and the MLP profiled alone (``benchmarks/allocator.py --profile-only``)
THREAD_REFS = {
    "L": "allocator/2026-11-30",
    "M": "plan/profiles/transformer_m",
    "MLP": "plan/profiles/mlp",
}
THREAD_REF = THREAD_REFS["L"]
#: scheduler class -> the planner's name
CLASSES = {
    "SyncScheduler": "sync",
    "ColocatedScheduler": "colocated",
    "HybridScheduler": "hybrid",
    "AsyncScheduler": "async",
    "EBRLScheduler": "ebrl",
}
#: PushCube-v1 / PickCube-v1 episodes (ManiSkill's max_episode_steps in every campaign)
EPISODE = 50
#: campaign -> the day its runs were made: the machine's effective cores are fitted once a day
#: (a VM's neighbours and the commit's engine change between days, not within one)
DAYS = {
    "scheduler/2026-11-29": "2026-11-29",
    "allocator/2026-11-30": "2026-11-30",
    "allocator/2026-11-30-heldout": "2026-11-30",
    "archive/headline-cpu-2026-12-01": "2026-12-01",
    "scaling-cpu": "2026-12-01",
    "ablation-cpu": "2026-12-01",
    "grpo-cpu": "2026-12-01",
    "shape-search/2026-12-02-shape": "2026-12-02",
    "shape-search/2026-12-02-shape-sleep": "2026-12-02",
    "headline-cpu": "2026-12-06",
}
#: the day whose fit the one-fit variant applies to every day
ONE_FIT = "2026-12-01"
#: day -> its fitting set: (campaign, workload or None for any, configurations)
FITS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "2026-11-29": ("scheduler/2026-11-29", None, ("async",)),
    "2026-11-30": ("allocator/2026-11-30", None, ("even",)),
    "2026-12-01": (
        "archive/headline-cpu-2026-12-01",
        "PushCube-v1 L N16",
        ("colocated", "hybrid", "async", "ebrl"),
    ),
    "2026-12-02": ("shape-search/2026-12-02-shape", None, ("async",)),
    # EBRL held out: its shape was the resource manager's at run time
    "2026-12-06": (
        "headline-cpu",
        "PushCube-v1 L N16",
        ("colocated", "hybrid", "async"),
    ),
}
#: campaigns whose EBRL runs chose their shape at run time (no ``scheduler.pipeline`` /
#: ``step_level`` param): the shape and the (gen, train) threads the run kept, as the campaign's
#: README reports them from each run's ``shape.json`` (not exported); the export's generator
#: batches confirm the shape (:func:`export_runs` checks them)
RUNTIME_SHAPES: dict[str, tuple[Shape, tuple[int, int]]] = {
    # results/headline-cpu/README.md (2026-12-06): Async's shape in all 20 EBRL runs
    "headline-cpu": (Shape(1, False, 16, 0.005), (1, 1)),
}


@dataclass
class Run:
    """One committed run, as the validation sees it.

    Attributes:
        campaign: its ``results/`` folder.
        workload: what it ran (simulator, policy, algorithm, envs), within the campaign.
        config: its scheduler configuration's label (one per prediction).
        seed: its seed.
        measured: its steady-state env steps per second (``throughput_e2e``).
        scheduler: the planner's scheduler it is.
        wl: the planner's workload (threads, k, envs).
        shape: EBRL's shape as the run pinned it (None: the scheduler's own).
        busy: its measured busy seconds per update by stage (steady state where the curves
            say; the whole run otherwise).
        profile_source: its stage costs feed its workload's profile (not a prediction).
        staleness1: its fraction of decisions one version stale, when logged.
    """

    campaign: str
    workload: str
    config: str
    seed: int
    measured: float
    scheduler: str
    wl: PlanWorkload
    shape: Shape | None
    busy: dict[str, float]
    profile_source: bool = False
    staleness1: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in ("true", "1", "1.0")


def old_step_shape(n: int, groups: int, batch_min: int | None = None) -> Shape:
    """EBRL's step level before commit c5b80ca (every campaign here but 2026-12-02's): once M
    eligible envs were ready (or the oldest had waited 5 ms), the generator took every eligible
    one: a cap at every env. M: the run's, or half a group."""
    m = batch_min or max(1, math.ceil(n / groups / 2))
    return Shape(groups, True, m, 0.005, n)


# --- loading ---------------------------------------------------------------------------------
def export_runs(folder: str) -> list[Run]:
    """The runs of an MLflow export (``results/<folder>/export``), busy time per update over
    each run's steady state (after its warm-up)."""
    runs = files.read_csv(RESULTS / folder / "export" / "runs.csv")
    curves = files.read_csv(RESULTS / folder / "export" / "curves.csv")
    out = []
    for _, r in runs.iterrows():
        x = (
            curves[curves.run_id == r.run_id]
            .pivot_table(index="step", columns="key", values="value")
            .sort_index()
        )
        a, b = int(r["param.warmup_iters"]) - 1, len(x) - 1
        busy = {
            k.split("/")[1]: (x[k].iloc[b] - x[k].iloc[a]) / (b - a)
            for k in x.columns
            if k.startswith("time/") and k.endswith("/busy_s")
        }
        name = CLASSES[r.get("scheduler_class", r.scheduler)]
        variant = r.get("param.variant")
        variant = variant if isinstance(variant, str) else ""
        if str(r.get("param.resources.allocator")) == "elastic":
            continue  # the allocator chose the threads at run time; the export does not say
        n, k = int(r["param.num_envs"]), int(r["param.chunk_size"])
        groups = int(r["param.env_groups"])
        tg, tt = int(r["param.threads.gen"]), int(r["param.threads.train"])
        wl = dict(
            num_envs=n,
            env_groups=groups,
            decisions_per_env=int(r["param.rollout_steps"]) // k,
            staleness=1,
            sim_workers=2,
            gen_threads=tg,
            train_threads=tt,
            threads={"async": (tg, tt)},
        )
        shape = None
        config = name
        if name == "ebrl" and pd.isna(r.get("param.scheduler.pipeline")):
            shape, threads = RUNTIME_SHAPES[folder]  # the resource manager's choice
            batch = x["pipeline/gen_batch_mean"]
            if not shape.step_level and not np.allclose(batch, n / shape.groups):
                raise ValueError(f"{folder} {r.run_id}: generator batches {set(batch)} are not "
                                 f"{shape.describe()}'s")  # fmt: skip
            wl["threads"] = {"async": (tg, tt), "ebrl": threads}
            wl["staleness"] = int(float(r["param.scheduler.staleness"]))
        elif name == "ebrl":
            overlap = _truthy(r.get("param.scheduler.overlap"))
            pipeline = _truthy(r.get("param.scheduler.pipeline"))
            step = _truthy(r.get("param.scheduler.step_level"))
            wl["staleness"] = int(float(r["param.scheduler.staleness"])) if overlap else 0
            g = groups if pipeline else 1
            shape = old_step_shape(n, g) if step else Shape(g, False, math.ceil(n / g), 0.005)
            if variant.startswith("ablation/"):
                config = variant.removeprefix("ablation/")
        size = r.get("param.policy.size")
        algo = r.get("param.algo.cfg.group_size")
        label = " ".join(
            str(p)
            for p in (
                r["param.simulator.task"],  # the task: newer exports name the simulator itself
                size if isinstance(size, str) else "MLP",
                f"GRPO-g{int(algo)}" if isinstance(algo, float) and not math.isnan(algo) else "",
                f"N{n}",
            )
            if p
        )
        st1 = x["pipeline/staleness_frac_1"].iloc[b] if "pipeline/staleness_frac_1" in x else None
        out.append(
            Run(
                folder,
                label,
                config,
                int(r.seed),
                float(r.throughput_e2e),
                name,
                PlanWorkload(**wl),
                shape,
                busy,
                name == "sync" or config == "lockstep",
                None if st1 is None or math.isnan(st1) else float(st1),
            )
        )
    return out


#: benchmarks/scheduler_throughput.py's configurations at commit 512cff6 (2026-11-29)
SCHED_1129: dict[str, tuple[str, dict[str, Any], Shape | None]] = {
    "sync": ("sync", {"gen_threads": 1, "train_threads": 2}, None),
    "colocated": ("colocated", {}, None),
    "sync-workers": ("ebrl", {"staleness": 0, "train_threads": 2}, Shape(1, False, 16, 0.005)),
    "hybrid": ("hybrid", {"gen_threads": 1}, None),
    "async": ("async", {"threads": {"async": (1, 1)}}, None),
    "+pipeline": ("ebrl", {"train_threads": 1}, Shape(2, False, 8, 0.005)),
    "ebrl": ("ebrl", {"train_threads": 1}, old_step_shape(16, 2)),
}


def summary_runs(folder: str) -> list[Run]:
    """``results/scheduler/2026-11-29``: summaries only (busy per update over the whole run)."""
    out = []
    for path in sorted((RESULTS / folder / "runs").glob("*/summary.json")):
        s = json.loads(path.read_text())
        config, seed = path.parent.name.rsplit("-s", 1)
        name, over, shape = SCHED_1129[config]
        wl = PlanWorkload(num_envs=16, env_groups=2, decisions_per_env=12, **over)
        busy = {k: v / s["iterations"] for k, v in s["stage_busy_s"].items()}
        out.append(
            Run(
                folder,
                "PushCube-v1 L N16",
                config,
                int(seed),
                s["throughput_e2e"],
                name,
                wl,
                shape,
                busy,
                config == "sync",
                extra={"cpu": s["stage_cpu_s"], "busy_total": s["stage_busy_s"]},
            )
        )
    return out


def allocator_runs(folder: str) -> list[Run]:
    """The allocator's grid (gen threads x train threads x M) and its elastic and even runs:
    EBRL, k=1, G=2, the step level with M = the run's generator batch; threads and M as each
    run's ``resources.json`` applied them. Runs with an injected slowdown are left out."""
    out = []
    for path in sorted((RESULTS / folder / "runs").glob("*/summary.json")):
        config, seed = path.parent.name.rsplit("-s", 1)
        if config.startswith("slow"):
            continue
        s = json.loads(path.read_text())
        res = json.loads((path.parent / "resources.json").read_text())
        tg, tt, m = int(res["gen"]["threads"]), int(res["train"]["threads"]), res["gen"]["batch"]
        wl = PlanWorkload(
            num_envs=16, env_groups=2, decisions_per_env=12, gen_threads=tg, train_threads=tt
        )
        metrics = files.read_csv(path.parent / "metrics.csv")
        a, b = 2, len(metrics) - 1  # warm-up 3 of 8 updates
        busy = {
            k.split("/")[1]: (metrics[k].iloc[b] - metrics[k].iloc[a]) / (b - a)
            for k in metrics.columns
            if k.startswith("time/") and k.endswith("/busy_s")
        }
        label = config if config in ("elastic", "even") else f"g{tg}t{tt}b{m}"
        out.append(
            Run(
                folder,
                "PushCube-v1 L N16",
                label,
                int(seed),
                s["throughput_e2e"],
                "ebrl",
                wl,
                old_step_shape(16, 2, int(m) if m else None),
                busy,
            )
        )
    return out


def shape_runs(folder: str) -> list[Run]:
    """2026-12-02: Async, EBRL pinned to G=2 (``+pipeline``) and EBRL with the shape its search
    chose, one learner thread each (commit c5b80ca: the first M of N)."""
    out = []
    for path in sorted((RESULTS / folder / "runs").glob("*/summary.json")):
        config, seed = path.parent.name.rsplit("-s", 1)
        s = json.loads(path.read_text())
        wl = PlanWorkload(
            num_envs=16, env_groups=2, decisions_per_env=12, gen_threads=1, train_threads=1
        )
        if config == "async":
            name, shape = "async", None
        elif config == "+pipeline":
            name, shape = "ebrl", Shape(2, False, 8, 0.005)
        else:
            chosen = json.loads((path.parent / "shape.json").read_text())["shape"]
            g, step = int(chosen["env_groups"]), bool(chosen["step_level"])
            m = chosen.get("batch_min") or math.ceil(16 / g)
            name, shape = "ebrl", Shape(g, step, int(m), 0.005, chosen.get("batch_max"))
        busy = {k: v / s["iterations"] for k, v in s["stage_busy_s"].items()}
        out.append(
            Run(
                folder,
                f"seed {seed}",
                config,
                int(seed),
                s["throughput_e2e"],
                name,
                wl,
                shape,
                busy,
            )
        )
    return out


# --- profiles --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ThreadRef:
    """How the policy's stages scale with threads and batch on this machine (the offline
    profiler's measurement), and how many cores a multi-thread call keeps busy."""

    gen: dict[int, tuple[float, float]]  # threads -> (fixed s, per env s)
    train: dict[int, float]  # threads -> seconds per decision
    sim_s: float  # one env's chunk
    gen_busy: float  # cores a 2+ thread generator call keeps busy
    train_busy: float  # cores a 2+ thread update keeps busy

    def gen_points(self, scale: float, batches: Sequence[int]) -> tuple[Point, ...]:
        return tuple(
            Point(b, scale * (f + p * b), threads=t, busy=1.0 if t == 1 else self.gen_busy)
            for t, (f, p) in sorted(self.gen.items())
            for b in batches
        )

    def train_points(self, update_s: float, at: int, samples: int) -> tuple[Point, ...]:
        return tuple(
            Point(
                samples,
                update_s * s / self.train[at],
                threads=t,
                busy=1.0 if t == 1 else self.train_busy,
            )
            for t, s in sorted(self.train.items())
        )


def policy_of(workload: str) -> str:
    """The policy's token in a workload's label (``PickCube-v1 M N16`` -> ``M``)."""
    return workload.split()[1]


def thread_ref(folder: str = THREAD_REF) -> ThreadRef:
    """A policy's offline profile (``results/<folder>/profile.json``: the L's is
    ``allocator/2026-11-30``) and the cores multi-thread calls kept busy in
    ``results/scheduler/2026-11-29``'s turn-taking runs (sync: the update on 2 threads;
    Colocated: generation on 2)."""
    raw = json.loads((RESULTS / folder / "profile.json").read_text())
    gen: dict[int, tuple[float, float]] = {}
    for t in sorted({int(p["share"]) for p in raw["points"] if p["stage"] == "gen"}):
        pts = [p for p in raw["points"] if p["stage"] == "gen" and int(p["share"]) == t]
        b = np.array([p["batch_size"] for p in pts], float)
        sec = b / np.array([p["throughput"] for p in pts])
        slope, fixed = np.polyfit(b, sec, 1)
        gen[t] = (max(0.0, float(fixed)), max(0.0, float(slope)))
    train = {int(p["share"]): 1.0 / p["throughput"] for p in raw["points"] if p["stage"] == "train"}
    sim = next(p for p in raw["points"] if p["stage"] == "sim")
    busy: dict[str, list[float]] = {"gen": [], "train": []}
    for path in (RESULTS / "scheduler" / "2026-11-29" / "runs").glob("*/summary.json"):
        s = json.loads(path.read_text())
        cfg = path.parent.name.rsplit("-s", 1)[0]
        stage = {"sync": "train", "colocated": "gen"}.get(cfg)
        if stage:
            busy[stage].append(s["stage_cpu_s"][stage] / s["stage_busy_s"][stage])
    return ThreadRef(
        gen,
        train,
        1.0 / sim["throughput"],
        float(np.mean(busy["gen"])),
        float(np.mean(busy["train"])),
    )


def profile_from_turns(runs: Sequence[Run], ref: ThreadRef) -> Profile:
    """A workload's profile from its turn-taking runs (each stage's busy time per update is
    its cost alone), with the thread and batch scaling of ``ref``."""
    wl = runs[0].wl
    n, t = wl.num_envs, wl.decisions_per_env

    def per_update(stage: str) -> float:
        return float(np.mean([r.busy.get(stage, 0.0) for r in runs]))

    f1, p1 = ref.gen[1]
    scale = per_update("gen") / t / (f1 + p1 * n)  # generation: one call of n envs a decision
    batches = sorted({1, 2, 4, 8, n // 2, n})
    return Profile(
        chunk_s=(per_update("sim") / (n * t),),
        sim_busy=1.0,
        gen=StageProfile(ref.gen_points(scale, batches), "batch"),
        train=StageProfile(
            ref.train_points(per_update("train"), wl.train_threads, n * t), "samples"
        ),
        sync=SyncCosts(publish_s=per_update("sync")),
        chunk_size=4,
        episode_steps=EPISODE,
        source=f"{runs[0].campaign} {runs[0].workload}: {len(runs)} {runs[0].config} runs",
    )


def profile_from_profiler(folder: str, ref: ThreadRef) -> Profile:
    """The allocator campaign's own offline profile (every stage timed alone at start), in the
    untagged format runs wrote before ``ebrl-plan-profile/1`` (read here as committed data)."""
    raw = json.loads((RESULTS / folder / "profile.json").read_text())
    gen = tuple(
        Point(
            p["batch_size"],
            p["batch_size"] / p["throughput"],
            threads=int(p["share"]),
            busy=1.0 if int(p["share"]) == 1 else ref.gen_busy,
        )
        for p in raw["points"]
        if p["stage"] == "gen"
    )
    train = tuple(
        Point(
            192,
            192 / p["throughput"],
            threads=int(p["share"]),
            busy=1.0 if int(p["share"]) == 1 else ref.train_busy,
        )
        for p in raw["points"]
        if p["stage"] == "train"
    )
    sim = next(p for p in raw["points"] if p["stage"] == "sim")
    return Profile(
        chunk_s=(1.0 / sim["throughput"],),
        sim_busy=1.0,
        gen=StageProfile(gen, "batch"),
        train=StageProfile(train, "samples"),
        chunk_size=4,
        episode_steps=EPISODE,
        source=f"{folder}/profile.json (the offline profiler)",
    )


def profile_from_shape(folder: str, seed: int) -> Profile:
    """A 2026-12-02 run's start-up profile, as ``python -m ebrl.plan --profile-from-run``
    reads it (its folder has no config.yaml: the benchmark's workload says what it ran)."""
    facts = RunFacts(
        num_envs=16,
        decisions_per_env=12,
        chunk_size=4,
        gen_threads=1,
        train_threads=1,
        episode_steps=EPISODE,
    )
    return profile_from_run(RESULTS / folder / "runs" / f"ebrl-s{seed}", facts)


# --- predicting ------------------------------------------------------------------------------
@dataclass
class Group:
    """The runs one prediction is for (a configuration of a workload) and their profile."""

    campaign: str
    workload: str
    config: str
    runs: list[Run]
    profile: Profile
    role: str  # "profile", "fit" or "held-out"
    rank_key: str = ""  # the workload whose configurations are ranked together
    predicted: float = 0.0
    plan_s: float = 0.0
    staleness1: float | None = None
    busy: dict[str, float] = field(default_factory=dict)


def rank_key(r: Run) -> str:
    """2026-12-02's runs are predicted from each seed's own start-up profile, but ranked over
    the campaign; elsewhere a workload is ranked on its own."""
    return "PushCube-v1 L N16" if r.campaign.startswith("shape-search/2026-12-02") else r.workload


def groups(ref: ThreadRef, refs: dict[str, ThreadRef] | None = None) -> list[Group]:
    """Every configuration of every campaign, with the profile it is predicted from (a
    workload's thread scaling from its own policy's profile in ``refs``, else ``ref``'s)."""
    out: list[Group] = []
    refs = refs or {}

    def add(runs: list[Run], profile_of: Callable[[list[Run]], Profile]) -> None:
        by: dict[tuple[str, str], list[Run]] = {}
        for r in runs:
            by.setdefault((r.workload, r.config), []).append(r)
        for (work, config), rs in by.items():
            same = [r for r in runs if r.workload == work]
            prof = profile_of(same)
            role = "profile" if rs[0].profile_source else "held-out"
            camp, wk, configs = FITS[DAYS[rs[0].campaign]]
            if rs[0].campaign == camp and wk in (None, work) and config in configs:
                role = "fit" if role != "profile" else role
            out.append(
                Group(rs[0].campaign, work, config, rs, prof, role, rank_key=rank_key(rs[0]))
            )

    def turns(runs: list[Run]) -> Profile:
        own = refs.get(policy_of(runs[0].workload), ref)
        return profile_from_turns([r for r in runs if r.profile_source], own)

    for folder in (
        "archive/headline-cpu-2026-12-01",
        "scaling-cpu",
        "ablation-cpu",
        "grpo-cpu",
        "headline-cpu",
    ):
        add(export_runs(folder), turns)
    add(summary_runs("scheduler/2026-11-29"), turns)
    for folder in ("allocator/2026-11-30", "allocator/2026-11-30-heldout"):
        prof = profile_from_profiler(folder, ref)
        add(allocator_runs(folder), lambda _r, p=prof: p)
    for folder in ("shape-search/2026-12-02-shape", "shape-search/2026-12-02-shape-sleep"):
        add(shape_runs(folder), lambda rs, f=folder: profile_from_shape(f, rs[0].seed))
    return out


def predict(g: Group, cores_effective: float, seeds: Sequence[int]) -> None:
    r = g.runs[0]
    machine = MachineSpec(cores_per_node=2.0, cores_effective=cores_effective)
    t0 = time.perf_counter()
    row = plan_one(r.scheduler, g.profile, r.wl, machine, shape=r.shape, seeds=seeds)
    g.plan_s = time.perf_counter() - t0
    g.predicted = row.prediction.throughput
    g.busy = dict(row.prediction.stage_busy)
    st = row.prediction.staleness
    g.staleness1 = st[1] if len(st) > 1 else None


def fit_effective(gs: Sequence[Group], seeds: Sequence[int]) -> float:
    """The fraction of the cores that minimises the squared log error over the fitting set
    (a grid, then a finer grid around its best)."""

    def loss(c: float) -> float:
        err = []
        for g in gs:
            predict(g, c, seeds)
            err += [math.log(g.predicted / r.measured) ** 2 for r in g.runs]
        return float(np.mean(err))

    grid = np.round(np.arange(0.60, 1.001, 0.05), 3)
    best = min(grid, key=loss)
    fine = np.round(np.arange(max(0.5, best - 0.04), min(1.0, best + 0.04) + 1e-9, 0.01), 3)
    return float(min(fine, key=loss))


# --- the report ------------------------------------------------------------------------------
def ranking(gs: Sequence[Group]) -> list[dict[str, Any]]:
    """Per workload, the schedulers in measured and in predicted order, and each pair's verdict
    (a pair whose seeds' ranges overlap is a tie the measurement cannot order)."""
    out = []
    by: dict[tuple[str, str], list[Group]] = {}
    for g in gs:
        by.setdefault((g.campaign, g.rank_key or g.workload), []).append(g)
    for (camp, work), members in sorted(by.items()):
        runs: dict[str, list[float]] = {}
        preds: dict[str, list[float]] = {}
        for g in members:  # a configuration may be predicted per seed (its own profile)
            runs.setdefault(g.config, []).extend(r.measured for r in g.runs)
            preds.setdefault(g.config, []).extend(g.predicted for _ in g.runs)
        if len(runs) < 2:
            continue
        meas = {c: float(np.mean(v)) for c, v in runs.items()}
        rng = {c: (min(v), max(v)) for c, v in runs.items()}
        pred = {c: float(np.mean(v)) for c, v in preds.items()}
        m_order = sorted(meas, key=lambda c: -meas[c])
        p_order = sorted(pred, key=lambda c: -pred[c])
        pairs = wrong = resolved = resolved_wrong = 0
        for i, a in enumerate(m_order):
            for b in m_order[i + 1 :]:
                pairs += 1
                bad = pred[a] < pred[b]
                wrong += bad
                if rng[a][0] > rng[b][1]:  # every seed of a above every seed of b
                    resolved += 1
                    resolved_wrong += bad
        out.append(
            {
                "campaign": camp,
                "workload": work,
                # the allocator's campaigns rank one scheduler's thread splits and batch sizes
                "kind": "thread splits" if camp.startswith("allocator/") else "schedulers",
                "measured_order": m_order,
                "predicted_order": p_order,
                "right": m_order == p_order,
                "pairs": pairs,
                "pairs_wrong": wrong,
                "resolved_pairs": resolved,
                "resolved_pairs_wrong": resolved_wrong,
            }
        )
    return out


def _spread(errors: pd.Series) -> str:
    ab = errors.abs()
    return f"{len(ab)} | {ab.median():.1%} | {ab.quantile(0.9):.1%} | {errors.mean():+.1%}"


def write(
    gs: Sequence[Group],
    cores: dict[str, float],
    out: Path,
    seeds: Sequence[int],
    took: float,
    single: dict[int, float],
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for g in gs:
        for r in g.runs:
            rows.append(
                {
                    "campaign": g.campaign,
                    "workload": g.workload,
                    "config": g.config,
                    "scheduler": r.scheduler,
                    "seed": r.seed,
                    "role": g.role,
                    "measured": round(r.measured, 2),
                    "predicted": round(g.predicted, 2),
                    "error": round(g.predicted / r.measured - 1, 4),
                    "error_one_fit": round(single[id(g)] / r.measured - 1, 4),
                    "day": DAYS[g.campaign],
                    "measured_staleness1": r.staleness1,
                    "predicted_staleness1": g.staleness1,
                }
            )
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    df = pd.DataFrame(rows)
    held = df[df.role == "held-out"]
    fit = df[df.role == "fit"]
    ab = held.error.abs()
    # one fit for every day: every run but the profile's and 2026-12-01's fitting set is held out
    alone = df[(df.role != "profile") & ~((df.role == "fit") & (df.day == ONE_FIT))]
    ranks = ranking(gs)
    sched = [r for r in ranks if r["kind"] == "schedulers"]
    summary = {
        "cores_effective_fraction": cores,
        "held_out_runs": len(held),
        "held_out_configs": int(held.groupby(["campaign", "workload", "config"]).ngroups),
        "median_abs_error": float(ab.median()),
        "p90_abs_error": float(ab.quantile(0.9)),
        "mean_error": float(held.error.mean()),
        "fit_runs": len(fit),
        "fit_median_abs_error": float(fit.error.abs().median()),
        "profile_runs": int((df.role == "profile").sum()),
        "profile_median_abs_error": float(df[df.role == "profile"].error.abs().median()),
        "rankings_right": sum(r["right"] for r in ranks),
        "rankings": len(ranks),
        "resolved_pairs": sum(r["resolved_pairs"] for r in ranks),
        "resolved_pairs_wrong": sum(r["resolved_pairs_wrong"] for r in ranks),
        # the issue's goal: the schedulers' order per workload (not one scheduler's splits)
        "scheduler_rankings": len(sched),
        "scheduler_rankings_right": sum(r["right"] for r in sched),
        "scheduler_rankings_resolved_right": sum(r["resolved_pairs_wrong"] == 0 for r in sched),
        "scheduler_resolved_pairs": sum(r["resolved_pairs"] for r in sched),
        "scheduler_resolved_pairs_wrong": sum(r["resolved_pairs_wrong"] for r in sched),
        "one_fit": {
            "cores_effective_fraction": cores[ONE_FIT],
            "held_out_runs": len(alone),
            "median_abs_error": float(alone.error_one_fit.abs().median()),
            "p90_abs_error": float(alone.error_one_fit.abs().quantile(0.9)),
        },
        "plan_s_median": float(np.median([g.plan_s for g in gs])),
        "plan_s_max": float(max(g.plan_s for g in gs)),
        "seconds": took,
    }
    prov = provenance(list(seeds), **summary)
    (out / "provenance.json").write_text(json.dumps({**prov, "rankings": ranks}, indent=1) + "\n")
    (out / "table.md").write_text(_table(gs, df, summary, ranks, prov))
    return summary


def _table(gs, df: pd.DataFrame, s: dict, ranks: list[dict], prov: dict) -> str:
    held = df[df.role == "held-out"]
    lines = [
        "# The capacity planner against committed runs (issue 21)",
        "",
        "The machine's effective cores, fitted once a day on a small set of that day's runs "
        f"({s['fit_runs']} runs in all), as a fraction of its 2 cores: "
        + ", ".join(
            f"{d} {c:.2f} (on {FITS[d][0]} {FITS[d][1] or ''} {'/'.join(FITS[d][2])})"
            for d, c in s["cores_effective_fraction"].items()
        )
        + ".",
        "",
        f"**Held out: {s['held_out_runs']} runs ({s['held_out_configs']} configurations); "
        f"|error| median {s['median_abs_error']:.1%}, 90th percentile {s['p90_abs_error']:.1%}; "
        f"mean signed error {s['mean_error']:+.1%}.** Fitting set: median |error| "
        f"{s['fit_median_abs_error']:.1%}; the profile's own runs ({s['profile_runs']}): "
        f"{s['profile_median_abs_error']:.1%}.",
        "",
        f"Ranking of the configurations per workload: right in {s['rankings_right']} of "
        f"{s['rankings']}; of the {s['resolved_pairs']} pairs the measurement resolves (every "
        f"seed of one above every seed of the other), {s['resolved_pairs_wrong']} predicted the "
        "wrong way round.",
        "",
        f"**Schedulers per workload** ({s['scheduler_rankings']} workloads; the allocator's "
        "thread-split grids are not schedulers): the full order right in "
        f"{s['scheduler_rankings_right']}; every pair the measurement resolves right in "
        f"{s['scheduler_rankings_resolved_right']} ({s['scheduler_resolved_pairs_wrong']} of "
        f"{s['scheduler_resolved_pairs']} resolved pairs the wrong way round). The other pairs "
        "lie within the seeds' spread: their measured order is itself a coin toss.",
        "",
        f"Fitted once for every day instead (2026-12-01's "
        f"{s['one_fit']['cores_effective_fraction']:.2f}), the "
        f"{s['one_fit']['held_out_runs']} runs outside that day's fitting set: |error| median "
        f"{s['one_fit']['median_abs_error']:.1%}, 90th percentile "
        f"{s['one_fit']['p90_abs_error']:.1%}.",
        "",
        f"Planning one configuration (2 seeds of the model, EBRL's shape given): median "
        f"{s['plan_s_median'] * 1000:.0f} ms, at most {s['plan_s_max'] * 1000:.0f} ms.",
        "",
        "## Held-out error by campaign and by scheduler",
        "",
        "| campaign | runs | median abs | P90 abs | mean |",
        "|---|---|---|---|---|",
        *(f"| {c} | {_spread(h.error)} |" for c, h in held.groupby("campaign", sort=False)),
        "",
        "| scheduler | runs | median abs | P90 abs | mean |",
        "|---|---|---|---|---|",
        *(f"| {c} | {_spread(h.error)} |" for c, h in held.groupby("scheduler", sort=False)),
        "",
        "## Every configuration",
        "",
        "| campaign | workload | config | role | runs | measured | predicted | error (mean) | "
        "stale 1 measured / predicted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g in gs:
        errs = [g.predicted / r.measured - 1 for r in g.runs]
        meas = float(np.mean([r.measured for r in g.runs]))
        st = [r.staleness1 for r in g.runs if r.staleness1 is not None]
        stale = f"{np.mean(st):.2f} / {g.staleness1:.2f}" if st and g.staleness1 is not None else ""
        lines.append(
            f"| {g.campaign} | {g.workload} | {g.config} | {g.role} | {len(g.runs)} | "
            f"{meas:.0f} | {g.predicted:.0f} | {np.mean(errs):+.1%} | {stale} |"
        )
    lines += [
        "",
        "## Rankings",
        "",
        "| campaign | workload | ranks | measured order | predicted order | "
        "pairs wrong (resolved pairs wrong) |",
        "|---|---|---|---|---|---|",
    ]
    for r in ranks:
        lines.append(
            f"| {r['campaign']} | {r['workload']} | {r['kind']} | "
            f"{' > '.join(r['measured_order'])} | "
            f"{' > '.join(r['predicted_order'])}{'' if r['right'] else ' (differs)'} | "
            f"{r['pairs_wrong']}/{r['pairs']} ({r['resolved_pairs_wrong']}/"
            f"{r['resolved_pairs']}) |"
        )
    lines += [
        "",
        "Provenance:",
        "",
        f"- command: `{prov['command']}`",
        f"- commit: {prov['commit']}; machine: {prov['machine']}; date: {prov['date']}",
        f"- the whole validation took {s['seconds']:.0f} s",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "plan" / "validation")
    ap.add_argument("--seeds", default="0,1", help="model seeds averaged per prediction")
    args = ap.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]
    t0 = time.perf_counter()
    refs = {k: thread_ref(f) for k, f in THREAD_REFS.items()}
    ref = refs["L"]  # THREAD_REF's: the allocator campaign's own policy
    gs = groups(ref, refs)
    cores: dict[str, float] = {}
    for day in FITS:
        cores[day] = fit_effective(
            [g for g in gs if g.role == "fit" and DAYS[g.campaign] == day], seeds
        )
    # the same with one fit for every day (2026-12-01's): what the per-day fit buys
    one = cores[ONE_FIT]
    single = {}
    for g in gs:
        predict(g, one, seeds)
        single[id(g)] = g.predicted
    for g in gs:
        predict(g, cores[DAYS[g.campaign]], seeds)
    summary = write(gs, cores, args.out, seeds, time.perf_counter() - t0, single)
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
