"""The elastic allocator (Algorithm 1) on the embedded default, in one invocation.

On ManiSkill PushCube-v1 with the VLA-shaped transformer (``policy=transformer_l``, the workload of
``benchmarks/scheduler_throughput.py``), EBRL on Ray:

(a) the offline profiler: gen and train throughput of the run's policy at every thread share and
    generator batch size, and one env worker's simulators; how long profiling took;
(b) the allocator's chosen split (threads of gen and train, generator batch) from that profile,
    against an exhaustive grid of EBRL runs over every split (every gen and train thread count
    that fits in the pool: unpinned, threads gen and train do not use are the simulators') and
    batch, each run's end-to-end throughput measured; the ratio chosen / best (the issue's goal:
    >= 0.95);
(c) EBRL with the elastic allocator (its choice, and run-time rebalancing) against EBRL with a
    naive even split (half the pool each, the scheduler's default batch), paired over seeds;
(d) a slowdown injected mid-run into one stage (``--slow-stage``, both by default), on the
    synthetic simulator at about one PushCube step's cost (``step_cost_ms``):
    - ``sim``: each env's step cost multiplied (``--slow-factor``) after a set number of steps;
    - ``train``: from a set update on, every update also runs ``--slow-epochs`` forward-backward
      passes over its segment (``inject.train_*``: a heavier learner, the algorithm unchanged);
    when the reallocation fired against the configured window, and per-update throughput before
    and after, for the elastic allocator and the static even split. ``--only-slowdown`` runs (d)
    alone.

The pool gen and train split is torch threads (``resources.gen_threads + train_threads``), the
CPU analogue of the SM split. ``--pool`` sets it; the default is two threads per core (4 on 2
cores): while env workers, gen and train all run, the kernel shares the cores per runnable thread,
so a stage's threads are its share of the CPU, and with 4 there are three splits (1/3, 2/2, 3/1)
and an even one. ``--pool 2`` on 2 cores leaves one split (1/1) and only the batch to choose.

Every configuration is its own ``python -m ebrl.train`` process, seed-major (slow drifts of a
shared machine hit all configurations alike). Results go to ``results/allocator/<date>/`` (not with
``--quick``, a small smoke version: in-process workers, the synthetic simulator, the MLP policy,
one seed, 3 updates per run, the grid over splits at the chosen batch only).

Usage: python benchmarks/allocator.py [--seeds 0,1,2] [--iterations 8] [--pool N] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import files  # noqa: E402
from analysis.stats import bootstrap_ci, ratio_ci  # noqa: E402
from benchmarks.common import provenance  # noqa: E402
from benchmarks.scheduler_throughput import WORKLOAD  # noqa: E402

#: (d): the synthetic simulator at about one PushCube step's cost, same policy and shape
SLOW_WORKLOAD = ["simulator=synthetic", *[w for w in WORKLOAD if not w.startswith("simulator=")]]
#: --quick: in-process workers (no Ray start-up), a sleeping synthetic simulator, the MLP policy
QUICK_WORKLOAD = [
    "simulator=synthetic",
    "simulator.cost_mode=sleep",
    "policy=mlp",
    "chunk_size=4",
    "num_envs=8",
    "env_groups=2",
    "algo.cfg.update_epochs=2",
    "algo.cfg.num_minibatches=2",
]
EBRL = ["scheduler=ebrl"]


def compose(overrides: list[str]) -> Any:
    """The run config these overrides give (Hydra, outside any app)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ebrl.config import register
    from ebrl.train import CONF_DIR

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def profile_workload(workload: list[str], pool: int, repeats: int, path: Path) -> dict[str, Any]:
    """(a) and (b)'s choice: profile the workload's policy here; Algorithm 1 on the profile."""
    from ebrl.config import validate
    from ebrl.resources.allotment import (
        gen_batch_candidates,
        restrict_train_batch,
        train_minibatch,
    )
    from ebrl.resources.profiler import rate_table
    from ebrl.resources.split import Pool, allocate_with_sims, sim_rate
    from ebrl.stages.factory import StageFactory
    from ebrl.stages.profile import ppo_config, profile_for_run

    cfg = compose([*workload, *EBRL])
    run = validate(cfg)
    factory = StageFactory.from_config(cfg)
    env = factory.make_env(0)
    spec = env.spec
    env.close()
    factory = factory.with_spec(spec)
    group = math.ceil(run.num_envs / run.env_groups)
    minibatch = train_minibatch(factory.cfg, run.decisions_per_env)
    t0 = time.perf_counter()
    stored = profile_for_run(
        factory,
        range(1, pool),
        gen_batch_candidates(group),
        minibatch,
        repeats=repeats,
        sim_group=group,
    )
    took = time.perf_counter() - t0
    stored.save(path)
    prof = rate_table(stored)  # what the run reads from it
    usable = restrict_train_batch(prof, minibatch * max(1, ppo_config(cfg).num_minibatches))
    workers = int(cfg.scheduler.sim_workers)
    rate = sim_rate(usable, workers, group)
    # what the run does: unpinned, the thread pool is the simulators' CPUs too
    alloc = allocate_with_sims(
        usable,
        Pool(pool, shared_with_sim=True, cores=len(os.sched_getaffinity(0))),
        workers,
        group,
        max_gen_batch=group,
        headroom=float(cfg.resources.rebalance_threshold),
    )
    return {
        "profile": prof,
        "seconds": took,
        "allocation": alloc,
        "sim_rate": rate,
        "sim_workers": workers,
        "group": group,
        "minibatch": minibatch,
        "gen_batches": [b for b in prof.batch_sizes("gen") if b <= group],
    }


#: a fixed split runs a fixed shape (both levels on, as before the shape search): with a level
#: unset, the shape search would choose the threads and the batch too, and move them on a drift
FIXED_SHAPE = ["scheduler.pipeline=true", "scheduler.step_level=true"]


def split(g: int, t: int, batch: int | None = None) -> list[str]:
    """EBRL at ``g`` generator and ``t`` learner threads (and a generator batch), nothing
    searched or moved."""
    out = [*FIXED_SHAPE, f"resources.gen_threads={g}", f"resources.train_threads={t}"]
    return out + ([f"resources.gen_batch={batch}"] if batch is not None else [])


def train_run(
    name: str, workload: list[str], overrides: list[str], seed: int, args: Any, out: Path
) -> dict[str, Any]:
    """One ``python -m ebrl.train``; its summary, per-update metrics and reallocations."""
    run_dir = out / "runs" / f"{name}-s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *workload,
        *EBRL,
        *args.extra,
        *overrides,
        f"seed={seed}",
        f"budget.iterations={iterations_for(overrides, args)}",
        f"warmup_iters={args.warmup}",
        "budget.env_steps=100000000",
        f"run_dir={run_dir}",
        "progress=false",
    ]
    cmd += ["tracking.enabled=false"] if args.quick else [f"tracking.experiment={args.experiment}"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    s = read_run(run_dir, name, seed)
    s["command"] = " ".join(cmd[1:])
    print(f"  {name:14s} seed {seed}: {s['throughput_e2e']:7.1f} steps/s", flush=True)
    return s


def read_run(run_dir: Path, name: str, seed: int) -> dict[str, Any]:
    """A finished run's summary, per-update throughput and reallocations."""
    s = json.loads((run_dir / "summary.json").read_text())
    with files.open_text(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    re_path = run_dir / "reallocations.jsonl"
    reallocs = (
        [json.loads(x) for x in files.read_text(re_path).splitlines()]
        if files.exists(re_path)
        else []
    )
    s.update(
        config=name,
        seed=seed,
        reallocations=reallocs,
        per_update=per_update(rows),
        splits=[split_of(r) for r in rows],
    )
    res_path = run_dir / "resources.json"
    if res_path.exists():
        res = json.loads(res_path.read_text())
        s["start_split"] = split_in(res)
    return s


def split_in(rec: dict[str, Any]) -> tuple[int, int, int]:
    """(gen threads, train threads, gen batch) of a ``resources.json`` or a reallocation record
    (both carry ``gen: {threads, batch}`` and ``train: {threads}``)."""
    return rec["gen"]["threads"], rec["train"]["threads"], rec["gen"]["batch"]


def split_of(row: dict[str, str]) -> tuple[int, int, int] | None:
    """The (gen threads, train threads, gen batch) an update reported, if it did."""
    keys = ("resource/gen_threads", "resource/train_threads", "resource/gen_batch")
    try:
        g, t, b = (int(float(row[k])) for k in keys)
    except (KeyError, TypeError, ValueError):
        return None
    return g, t, b


#: (d): the config name prefix of each stage's slowdown runs (``<prefix>-even``, ``-elastic``,
#: ``-frozen``)
SLOW_PREFIX = {"sim": "slow", "train": "slowtrain"}
#: (d)'s configurations: the elastic allocator; its own run-start split with run-time
#: reallocation off (what the run would have done had the trigger never fired: the slowdown's
#: counterfactual); the naive even split
SLOW_KINDS = ("elastic", "frozen", "even")


def slow_label(args: Any, stage: str) -> str:
    """(d)'s slowdown of ``stage`` in words, for the table and the log."""
    if stage == "sim":
        return f"x{args.slow_factor} of the simulator"
    return f"of the learner (+{args.slow_epochs} forward-backward passes per update)"


def iterations_for(overrides: list[str], args: Any) -> int:
    """(d)'s runs are longer: they need room before and after the slowdown."""
    starts = ("simulator.slowdown_after_steps=", "inject.train_after_updates=")
    if any(o.startswith(starts) for o in overrides):
        return args.slow_at + args.patience + args.after
    return args.iterations


def per_update(rows: list[dict[str, str]]) -> list[float]:
    """Env steps per second of each update (from the previous report to this one)."""
    out = [math.nan]
    for a, b in itertools.pairwise(rows):
        dt = float(b["time/wall_s"]) - float(a["time/wall_s"])
        ds = float(b["env/steps_total"]) - float(a["env/steps_total"])
        out.append(ds / dt if dt > 0 else math.nan)
    return out


def mean_over(x: list[float], lo: int, hi: int) -> float:
    vals = [v for v in x[lo:hi] if not math.isnan(v)]
    return float(np.mean(vals)) if vals else math.nan


def by_config(rows: list[dict], name: str) -> np.ndarray:
    return np.array(
        [r["throughput_e2e"] for r in sorted(rows, key=lambda r: r["seed"]) if r["config"] == name]
    )


def grid_noise(rows: list[dict], grid: list[str], chosen: str) -> list[str]:
    """How far run-to-run noise goes in (b): the split's effect against the seeds' scatter.

    - noise: the pooled standard deviation of a configuration's runs over seeds, against the
      spread of the configurations' means;
    - the best configuration of each seed (if it changes from seed to seed, the grid's "best"
      is partly the luckiest);
    - held out: for each seed, the configuration best on the *other* seeds, measured on this
      seed, against the chosen one on this seed. The grid's own best is picked and scored on the
      same runs, so its mean is biased upward (the winner's curse); the held-out figure is not.
    """
    seeds = sorted({r["seed"] for r in rows if r["config"] in grid})
    val = {(r["config"], r["seed"]): r["throughput_e2e"] for r in rows}
    full = [n for n in grid if all((n, s) in val for s in seeds)]
    if len(seeds) < 2 or chosen not in full:
        return []
    per = {n: np.array([val[(n, s)] for s in seeds]) for n in full}
    within = float(np.sqrt(np.mean([x.var(ddof=1) for x in per.values()])))
    means = {n: float(x.mean()) for n, x in per.items()}
    mid = float(np.mean(list(means.values())))
    spread = max(means.values()) - min(means.values())
    best_of = {s: max(full, key=lambda n, s=s: val[(n, s)]) for s in seeds}
    held = []
    for s in seeds:
        rest = [q for q in seeds if q != s]
        pick = max(full, key=lambda n: np.mean([val[(n, q)] for q in rest]))
        held.append((s, pick, val[(chosen, s)] / val[(pick, s)]))
    return [
        "",
        f"Noise: a configuration's runs scatter by {within:.1f} steps/s (pooled sd over seeds, "
        f"{100 * within / mid:.1f}% of the grid's mean {mid:.1f}); the configurations' means span "
        f"{spread:.1f} ({100 * spread / mid:.1f}%).",
        "Best configuration of each seed: "
        + ", ".join(f"seed {s} {n} ({val[(n, s)]:.1f})" for s, n in best_of.items())
        + ".",
        "Held out (the configuration best on the other seeds, scored on this seed): "
        + ", ".join(f"seed {s}: {chosen} / {n} = {r:.3f}" for s, n, r in held)
        + f"; mean {np.mean([r for *_, r in held]):.3f}.",
    ]


def reanalyse(folder: Path, args: Any) -> None:
    """(b)'s noise analysis from a result folder (its runs.csv, and table.md for the choice),
    and (d)'s tables from its slowdown runs (``runs/<prefix>-{elastic,frozen,even}-s<seed>``; the
    slowdown's parameters are this invocation's ``--slow-*``, ``--patience``, ``--warmup``)."""
    import re

    for stage, prefix in SLOW_PREFIX.items():
        found = sorted((folder / "runs").glob(f"{prefix}-*-s*"))
        drows = []
        for d in found:
            m = re.fullmatch(rf"({prefix}-(?:{'|'.join(SLOW_KINDS)}))-s(\d+)", d.name)
            if m and (d / "summary.json").exists():
                drows.append(read_run(d, m.group(1), int(m.group(2))))
        if drows:
            order = {f"{prefix}-{k}": i for i, k in enumerate(SLOW_KINDS)}
            drows.sort(key=lambda x: (x["seed"], order[x["config"]]))
            print("\n".join(slowdown_table(drows, args, stage)))
    if not any(re.fullmatch(r"g\d+t\d+b\d+-s\d+", d.name) for d in (folder / "runs").iterdir()):
        return
    with files.open_text(folder / "runs.csv", newline="") as f:
        rows = [
            {**r, "seed": int(r["seed"]), "throughput_e2e": float(r["throughput_e2e"])}
            for r in csv.DictReader(f)
        ]
    m = re.search(r"^chosen (\S+) / best", (folder / "table.md").read_text(), re.M)
    if m is None:
        raise SystemExit(f"{folder / 'table.md'}: no 'chosen ... / best' line")
    grid = sorted({r["config"] for r in rows if re.fullmatch(r"g\d+t\d+b\d+", r["config"])})
    print(f"{folder}: chosen {m.group(1)}, {len(grid)} grid configurations")
    print("\n".join(grid_noise(rows, grid, m.group(1))))


def slow_windows(twin: dict, slow_at: int) -> tuple[int, int]:
    """(d)'s window edges from the elastic run of a seed: ``(cut, settled)``.

    Updates [slow_at, cut) are slowed under the run-start split: up to the first firing from the
    slowdown on that moved the split (the update it was decided at included), or the first
    firing if none moved. [cut, settled) is the move's transition: a stage takes a new split
    between its calls, so updates until the first one that reports the new split, that one
    included, ran partly under the old one. [settled, end) is the new split in force. Without a
    move there is no transition (settled = cut); without any firing, no after window (cut =
    settled = the run's length).
    """
    n = len(twin["per_update"])
    late = [m for m in twin["reallocations"] if m["step"] >= slow_at]
    if not late:
        return n, n
    moved = next((m for m in late if m["changed"]), None)
    cut = max(slow_at + 1, (moved or late[0])["step"] + 1)
    if moved is None:
        return cut, cut
    new = split_in(moved)
    splits = twin.get("splits") or []
    shown = next((i for i in range(cut, len(splits)) if splits[i] == new), None)
    settled = n if shown is None else min(n, shown + 1)
    return cut, settled


def _fired(x: dict) -> str:
    def one(m: dict) -> str:
        if not m["changed"]:
            return f"{m['step']}: kept"
        lat = m.get("apply_latency_s")
        cost = m["apply_cost_s"]
        if lat is None and cost is not None:  # a record from before the two were told apart
            lat, cost = cost, None
        when = "-" if lat is None else f"{lat:.1f} s"
        work = "" if cost is None else f", {1e3 * cost:.2g} ms applying"
        g, t, b = split_in(m)
        return f"{m['step']}: {g}/{t} b{b}, {when}{work}"

    return ", ".join(one(m) for m in x["reallocations"]) or "never"


def slowdown_table(drows: list[dict], args: Any, stage: str = "sim") -> list[str]:
    """(d): when the trigger fired against the window, and per-update throughput around it.

    Windows (updates, :func:`slow_windows`): before = [warmup, slowdown - 1), clear of the
    slowdown (with overlap the rollout runs a segment ahead of training); slowed = [slowdown,
    first move]; the move's transition; after = the new split in force. The static runs of a
    seed take the elastic run's windows. With ``frozen`` runs (the elastic run's start split,
    no reallocation) a summary over seeds follows: the elastic run's after-window throughput
    against the frozen one's (what the move won back) and the even split's.
    """
    what = slow_label(args, stage)
    prefix = SLOW_PREFIX[stage]
    lines = [
        "",
        f"## (d) slowdown {what} from update {args.slow_at} "
        f"(patience {args.patience}, threshold {args.threshold:.0%})",
        "",
        "The elastic runs profile their policy at start (no stored profile for this workload). "
        "Frozen: the elastic run's own start split, reallocation off.",
        "",
        "| run | seed | trigger fired (update: new gen/train threads, batch, in force after "
        "the decision, work applying) | first firing from the slowdown on | steps/s before | "
        "slowed, to the firing | transition | after (new split in force) | after / before | "
        "after / slowed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    after_of: dict[tuple[str, int], float] = {}
    for x in drows:
        tp = x["per_update"]
        twin = next(
            (y for y in drows if y["seed"] == x["seed"] and y["config"] == f"{prefix}-elastic"), x
        )
        cut, settled = slow_windows(twin, args.slow_at)
        mine = [m for m in x["reallocations"] if m["step"] >= args.slow_at]
        first = "-"
        if mine:
            n = mine[0]["step"] - args.slow_at + 1
            where = "within" if n <= args.patience + 1 else "outside"
            first = f"update {mine[0]['step']} ({n} updates in: {where} the window)"
        before = mean_over(tp, args.warmup, args.slow_at - 1)
        slowed = mean_over(tp, args.slow_at, cut)
        moving = mean_over(tp, cut, settled)
        after = mean_over(tp, settled, len(tp))
        after_of[(x["config"].removeprefix(f"{prefix}-"), x["seed"])] = after
        moving_s = "-" if math.isnan(moving) else f"{moving:.1f}"
        lines.append(
            f"| {x['config']} | {x['seed']} | {_fired(x)} | {first} | {before:.1f} | "
            f"{slowed:.1f} | {moving_s} | {after:.1f} | {after / before:.3f} | "
            f"{after / slowed:.3f} |"
        )
    lines += [
        "",
        "Windows: before = updates [warmup, slowdown - 1) (with overlap the rollout runs a "
        "segment ahead of training); slowed = from the slowdown to the elastic run's first move "
        "after it (or first firing, if none moved); transition = the updates until the first "
        "that reports the new split (a stage takes it between calls), that one included; "
        "after = the rest, the new split in force. "
        "The static runs of a seed use the elastic run's windows. Within the window: the first "
        "firing came at most patience + 1 updates into the slowdown (the update whose interval "
        "straddles it counts).",
    ]
    seeds = sorted({s for (_, s) in after_of})
    have = [k for k in SLOW_KINDS if all((k, s) in after_of for s in seeds)]
    if "elastic" in have and len(have) > 1 and len(seeds) > 1:
        lines += ["", "After the move, elastic against the static runs (paired over seeds):", ""]
        ela = np.array([after_of[("elastic", s)] for s in seeds])
        for k in have[1:]:
            ref = np.array([after_of[(k, s)] for s in seeds])
            per = ", ".join(f"{a / b:.3f}" for a, b in zip(ela, ref, strict=True))
            lines.append(f"- elastic / {k}: {ratio_ci(ela, ref).fmt('.3f')} (per seed {per})")
    return lines


def profile_table(points: Any) -> list[str]:
    """The offline profile's points as a markdown table, by stage, batch and threads."""
    return [
        "| stage | threads | batch | decisions/s |",
        "|---|---|---|---|",
        *(
            f"| {q.stage} | {q.share} | {q.batch_size} | {q.throughput:.1f} |"
            for q in sorted(points, key=lambda q: (q.stage, q.batch_size, q.share))
        ),
    ]


def profile_and_grid(
    args: Any,
    seeds: list[int],
    pool: int,
    workload: list[str],
    elastic_base: list[str],
    out: Path,
) -> tuple[list[str], list[dict], dict[str, list[str]]]:
    """(a) the profile and the allocator's choice, (b) the grid of splits, (c) elastic against
    even: the report's lines, every run and the configurations they ran."""
    # (a) + the allocator's choice ------------------------------------------------------------
    print(f"(a) profiling gen and train on threads 1..{pool - 1} ...", flush=True)
    prof_path = out / "profile.json"
    p = profile_workload(workload, pool, args.repeats, prof_path)
    alloc = p["allocation"]
    lines = [
        f"## (a) offline profile ({prof_path.name})",
        "",
        f"profiling gen, train and sim took {p['seconds']:.1f} s",
        "",
        *profile_table(p["profile"].points),
    ]
    lines += [
        "",
        f"simulators: {p['sim_workers']} workers x one worker's rate = {p['sim_rate']:.1f} "
        "decisions/s (gen and train items are decisions too; an env step is 1/K of one)",
        f"allocator's choice (pool {pool} threads, shared with the simulators): {alloc.describe()}",
    ]
    print("\n".join(lines), flush=True)

    # (b) grid, (c) elastic vs even: one loop, seed-major ------------------------------------
    even = pool // 2
    elastic = [*elastic_base, f"resources.profile={prof_path}"]
    # --quick: every split at the chosen batch only (a smoke test of the machinery)
    batches = [alloc.gen_batch] if args.quick else p["gen_batches"]
    splits = [(g, t) for g in range(1, pool) for t in range(1, pool - g + 1)]
    grid = {f"g{g}t{t}b{b}": split(g, t, b) for g, t in splits for b in batches}
    chosen = f"g{alloc.gen_units}t{alloc.train_units}b{alloc.gen_batch}"
    configs = {**grid, "even": split(even, pool - even), "elastic": elastic}
    rows: list[dict] = []
    total = len(seeds) * len(configs)
    print(f"\n(b)+(c): {total} runs", flush=True)
    t0 = time.time()
    for s in seeds:
        for name, ov in configs.items():
            rows.append(train_run(name, workload, ov, s, args, out))
            left = (time.time() - t0) / len(rows) * (total - len(rows))
            print(f"  [{len(rows)}/{total} runs, ~{left / 60:.0f} min left]", flush=True)

    b_start = len(lines)
    lines += [
        "",
        "## (b) chosen split against every split (end-to-end env steps/s)",
        "",
        "| gen threads | train threads | gen batch | steps/s, mean [95% CI] | |",
        "|---|---|---|---|---|",
    ]
    means = {n: by_config(rows, n).mean() for n in grid}
    best = max(means, key=means.get)
    for n in grid:
        g, rest = n[1:].split("t")
        t, b = rest.split("b")
        mark = " ".join(m for m, ok in (("chosen", n == chosen), ("best", n == best)) if ok)
        lines.append(
            f"| {g} | {t} | {b} | {bootstrap_ci(by_config(rows, n)).fmt('.1f')} | {mark} |"
        )
    r = ratio_ci(by_config(rows, chosen), by_config(rows, best))
    lines += [
        "",
        f"chosen {chosen} / best {best}: {r.fmt('.3f')} (goal >= 0.95; paired over seeds)",
        *grid_noise(rows, list(grid), chosen),
        "",
        "## (c) EBRL with the elastic allocator against a naive even split",
        "",
        "| configuration | steps/s, mean [95% CI] | reallocations (mean) |",
        "|---|---|---|",
    ]
    for n, label in (("even", f"even split {even}/{pool - even}"), ("elastic", "elastic")):
        runs = [x for x in rows if x["config"] == n]
        moves = np.mean([sum(m["changed"] for m in x["reallocations"]) for x in runs])
        lines.append(f"| {label} | {bootstrap_ci(by_config(rows, n)).fmt('.1f')} | {moves:.1f} |")
    rc = ratio_ci(by_config(rows, "elastic"), by_config(rows, "even"))
    lines += ["", f"elastic / even: {rc.fmt('.3f')} (paired over seeds)"]
    print("\n".join(lines[b_start:]), flush=True)
    return lines, rows, configs


def profile_only(args: Any, pool: int, workload: list[str], out: Path) -> None:
    """(a) alone: ``profile.json`` and ``profile.md`` (the table, the command, provenance)."""
    print(f"(a) profiling gen and train on threads 1..{pool - 1} ...", flush=True)
    p = profile_workload(workload, pool, args.repeats, out / "profile.json")
    prov = provenance([], workload=" ".join(workload))
    lines = [
        f"# Offline profile: {' '.join(args.set) or 'the allocator workload'}",
        "",
        f"`{prov['command']}`; commit {prov['commit']}, {prov['machine']}, {prov['date']}",
        "",
        f"workload: `{' '.join(workload)}`; profiling took {p['seconds']:.1f} s",
        "",
        *profile_table(p["profile"].points),
    ]
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=8, help="updates per run of (b) and (c)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--pool", type=int, default=None, help="threads gen and train split (default: 2 per core)"
    )
    ap.add_argument("--patience", type=int, default=3, help="resources.rebalance_patience")
    ap.add_argument("--threshold", type=float, default=0.15, help="resources.rebalance_threshold")
    ap.add_argument(
        "--slow-at",
        type=int,
        default=10,
        help="(d): update the slowdown starts in (room after the warm-up for a first firing "
        "that recalibrates the profile, then a window that sets the stages' drift levels)",
    )
    ap.add_argument(
        "--slow-stage",
        default="sim,train",
        help="(d): the stages to slow down, one pair of runs per seed each (sim, train)",
    )
    ap.add_argument("--slow-factor", type=float, default=3.0, help="(d) sim: step cost multiplier")
    ap.add_argument(
        "--slow-epochs",
        type=int,
        default=4,
        help="(d) train: extra forward-backward passes per update (the workload's update runs 2 "
        "epochs, so 4 about triples the learner's work)",
    )
    ap.add_argument("--only-slowdown", action="store_true", help="(d) only, no (a)-(c)")
    ap.add_argument(
        "--after",
        type=int,
        default=14,
        help="(d): updates after the window (room for the move's transition and a steady "
        "after window)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="profiler repeats per point")
    ap.add_argument("--experiment", default="bench-alloc", help="MLflow experiment")
    ap.add_argument("--quick", action="store_true", help="smoke version, nothing written")
    ap.add_argument("--no-slowdown", action="store_true", help="(a)-(c) only, no (d)")
    ap.add_argument(
        "--profile-only",
        action="store_true",
        help="(a) only: the offline profile (profile.json, profile.md) of the workload with "
        "--set's overrides, nothing trained (the planner's thread scaling of another policy)",
    )
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides over the workload's (policy=transformer_m simulator.env_id=PickCube-v1)",
    )
    ap.add_argument(
        "--reanalyse",
        metavar="DIR",
        help="run nothing: print (b)'s noise analysis and (d)'s tables from an earlier result "
        "folder (its runs.csv and runs/)",
    )
    ap.add_argument(
        "--out", default=str(ROOT / "results" / "allocator" / time.strftime("%Y-%m-%d"))
    )
    args = ap.parse_args()
    stages = [] if args.no_slowdown else [x for x in args.slow_stage.split(",") if x]
    bad = [x for x in stages if x not in SLOW_PREFIX]
    if bad:  # before (a)-(c)'s 40 minutes, not after
        raise SystemExit(f"--slow-stage {','.join(bad)}: must be among {', '.join(SLOW_PREFIX)}")
    if args.reanalyse:
        reanalyse(Path(args.reanalyse), args)
        return
    vk = ROOT / ".cache" / "vulkan" / "lvp_icd.json"
    if vk.exists():  # SAPIEN's CPU Vulkan driver, as the Makefile sets it
        os.environ.setdefault("VK_ICD_FILENAMES", str(vk))
    if args.quick:
        args.seeds, args.iterations, args.warmup, args.repeats = "0", 3, 1, 1
        args.patience, args.slow_at, args.after = 2, 3, 2
    seeds = [int(s) for s in args.seeds.split(",")]
    pool = args.pool or 2 * len(os.sched_getaffinity(0))
    if pool < 2:
        raise SystemExit(f"--pool {pool}: gen and train need at least one thread each")
    workload = [*(QUICK_WORKLOAD if args.quick else WORKLOAD), *args.set]
    slow_workload = QUICK_WORKLOAD if args.quick else SLOW_WORKLOAD
    args.extra = ["scheduler.backend=inprocess"] if args.quick else []
    out = Path(tempfile.mkdtemp(prefix="bench-alloc-")) if args.quick else Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    if args.profile_only:
        profile_only(args, pool, workload, out)
        return

    even = pool // 2
    static = split(even, pool - even)
    elastic_base = [
        *static,
        "resources.allocator=elastic",
        f"resources.rebalance_patience={args.patience}",
        f"resources.rebalance_threshold={args.threshold}",
    ]
    lines: list[str] = []
    rows: list[dict] = []
    configs: dict[str, list[str]] = {}
    if not args.only_slowdown:
        lines, rows, configs = profile_and_grid(args, seeds, pool, workload, elastic_base, out)

    # (d) slowdown mid-run --------------------------------------------------------------------
    drows: list[dict] = []
    slow_elastic = elastic_base  # no stored profile: each run profiles itself at start
    slow: dict[str, list[str]] = {}
    for stage in stages:
        slow[stage], d = slowdown_runs(args, seeds, static, slow_elastic, slow_workload, out, stage)
        drows += d
        lines += slowdown_table(d, args, stage)
    table = "\n".join(lines)
    print(f"\ntotal {(time.time() - t_all) / 60:.1f} min")
    if args.quick:
        shutil.rmtree(out, ignore_errors=True)
        return
    slow_configs = {
        f"{SLOW_PREFIX[st]}-{kind}": ov
        for st in slow
        for kind, ov in (
            ("even", static),
            ("elastic", slow_elastic),
            ("frozen", ["the elastic run's start split of the seed (its resources.json)"]),
        )
    }
    prov = provenance(
        seeds,
        workload=None if args.only_slowdown else workload,
        slow_workload=slow_workload if slow else None,
        pool=pool,
        configs={**configs, **slow_configs},
        slowdown=slow,
        iterations=args.iterations,
        warmup=args.warmup,
        patience=args.patience,
        threshold=args.threshold,
    )
    keep = ("config", "seed", "throughput_e2e", "throughput_overall", "env_steps", "wall_s")
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=(*keep, "reallocations"), extrasaction="ignore")
        w.writeheader()
        for x in rows + drows:
            w.writerow({**x, "reallocations": sum(m["changed"] for m in x["reallocations"])})
    (out / "table.md").write_text(
        f"# Elastic allocator\n\n{table}\n\n```json\n{json.dumps(prov, indent=2)}\n```\n"
    )
    print(f"\nwritten to {out}")


def slowdown_runs(
    args: Any,
    seeds: list[int],
    static: list[str],
    slow_elastic: list[str],
    slow_workload: list[str],
    out: Path,
    stage: str = "sim",
) -> tuple[list[str], list[dict]]:
    """(d)'s runs for one slowed stage: the static even split and the elastic allocator."""
    if stage == "sim":
        cfg = compose([*slow_workload, *EBRL])
        steps_per_update = (int(cfg.rollout_steps) // int(cfg.chunk_size)) * int(cfg.chunk_size)
        slow = [
            f"simulator.slowdown_after_steps={args.slow_at * steps_per_update}",
            f"simulator.slowdown_factor={args.slow_factor}",
        ]
    else:  # the learner: the update that starts at version slow_at is the first slowed one
        slow = [
            f"inject.train_after_updates={args.slow_at}",
            f"inject.train_extra_epochs={args.slow_epochs}",
        ]
    print(
        f"\n(d) slowdown {slow_label(args, stage)} from update {args.slow_at} "
        f"(patience {args.patience}) ...",
        flush=True,
    )
    prefix = SLOW_PREFIX[stage]
    drows = []
    for s in seeds:
        ela = train_run(f"{prefix}-elastic", slow_workload, [*slow_elastic, *slow], s, args, out)
        if "start_split" not in ela:
            raise SystemExit(f"{prefix}-elastic seed {s}: no resources.json, no start split")
        frozen = split(*ela["start_split"])
        drows.append(ela)
        drows.append(train_run(f"{prefix}-frozen", slow_workload, [*frozen, *slow], s, args, out))
        drows.append(train_run(f"{prefix}-even", slow_workload, [*static, *slow], s, args, out))
    print("\n".join(slowdown_table(drows, args, stage)))
    return slow, drows


if __name__ == "__main__":
    main()
