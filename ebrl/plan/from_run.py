"""A stage profile from a run's folder (``python -m ebrl.plan --profile-from-run <run_dir>``).

What a run leaves, best first:

- ``shape.json`` (EBRL's start-up profile, ``ebrl.resources.shape.measure``): each stage timed
  alone, at every thread count the search weighed (else the run's own threads): the chunk
  latency's mean and tail, the generator's cost per call and per env, one update, and how busy
  each keeps the cores. Taken as it is.
- ``timeline.json`` (every stage call of the run): generation points per batch size, chunk
  samples per env, the update's seconds. In a run whose stages took turns (sync, Colocated)
  a span's wall time is the stage alone; in one whose stages overlapped, a single-threaded
  compute-bound stage's CPU seconds are (its wall time includes the cores it waited for).
- ``summary.json``: each stage's busy and CPU seconds over the run, per update; the weight
  sync's and load's seconds.
- ``config.yaml``: the threads each stage had, envs, chunk size, T, the episode length; without
  it the caller says them (``RunFacts``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ebrl.plan.profile import (
    Point,
    Profile,
    ProfileError,
    StageProfile,
    SyncCosts,
    lognormal_samples,
)

#: schedulers whose stages take turns in one process (a span's wall time is the stage alone)
IN_TURN = ("SyncScheduler", "ColocatedScheduler")


@dataclass(frozen=True)
class RunFacts:
    """What a run was, where its folder does not say (no ``config.yaml``).

    Attributes:
        num_envs: envs.
        decisions_per_env: T.
        chunk_size: K.
        gen_threads, train_threads: torch threads of the generator and the learner.
        episode_steps: env steps per episode (None: not cut short).
    """

    num_envs: int
    decisions_per_env: int
    chunk_size: int
    gen_threads: int = 1
    train_threads: int = 1
    episode_steps: int | None = None

    @staticmethod
    def from_config(path: Path) -> RunFacts:
        cfg = yaml.safe_load(path.read_text())
        k = int(cfg["chunk_size"])
        sim = cfg.get("simulator") or {}
        episode = sim.get("max_episode_steps") or sim.get("episode_len")
        threads = cfg.get("threads") or {}
        res = cfg.get("resources") or {}
        return RunFacts(
            num_envs=int(cfg["num_envs"]),
            decisions_per_env=max(1, int(cfg["rollout_steps"]) // k),
            chunk_size=k,
            # the resource manager's split, when it set one, is what the stages ran with
            gen_threads=int(res.get("gen_threads") or threads.get("gen", 1)),
            train_threads=int(res.get("train_threads") or threads.get("train", 1)),
            episode_steps=int(episode) if isinstance(episode, int | float) else None,
        )


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def profile_from_run(run_dir: str | Path, facts: RunFacts | None = None) -> Profile:
    """The stage profile of the run in ``run_dir``.

    Args:
        facts: what the run was, if its folder has no ``config.yaml``.

    Raises:
        ProfileError: the folder has neither ``shape.json`` nor ``timeline.json``, or neither a
            ``config.yaml`` nor ``facts``.
    """
    run = Path(run_dir)
    if facts is None:
        if not (run / "config.yaml").exists():
            raise ProfileError(
                f"{run}: no config.yaml; say what the run was (--num-envs, --decisions-per-env, "
                "--chunk-size, --gen-threads, --train-threads)"
            )
        facts = RunFacts.from_config(run / "config.yaml")
    summary = _read(run / "summary.json") or {}
    shape = _read(run / "shape.json")
    if shape is not None:
        sim, gen, train = _from_shape(shape, facts)
        how = "shape.json (the start-up profile)"
    elif (run / "timeline.json").exists():
        sim, gen, train = _from_timeline(run / "timeline.json", summary, facts)
        how = "timeline.json (the run's own stage calls)"
    else:
        raise ProfileError(f"{run}: neither shape.json nor timeline.json to profile from")
    updates = max(1, int(summary.get("iterations") or 1))
    busy = summary.get("stage_busy_s") or {}
    chunk_s, sim_busy = sim
    return Profile(
        chunk_s=chunk_s,
        sim_busy=sim_busy,
        gen=gen,
        train=train,
        sync=SyncCosts(
            publish_s=float(busy.get("sync", 0.0)) / updates,
            load_s=float(busy.get("load", 0.0)) / updates,
        ),
        chunk_size=facts.chunk_size,
        episode_steps=facts.episode_steps,
        source=f"{run.name}: {how}; weight sync from summary.json",
    )


def _from_shape(
    shape: dict[str, Any], facts: RunFacts
) -> tuple[tuple[tuple[float, ...], float], StageProfile, StageProfile]:
    """The stage costs ``shape.json`` holds: at every thread split the search measured
    (``costs_by_threads``), else at the threads the run had (the chosen shape's, when the
    search chose them, else the config's)."""
    table = shape.get("costs_by_threads") or {}
    if table:
        splits = [(*map(int, key.split("+")), c) for key, c in table.items()]
    else:
        chosen = shape.get("shape") or {}
        g = int(chosen.get("gen_threads") or facts.gen_threads)
        t = int(chosen.get("train_threads") or facts.train_threads)
        splits = [(g, t, shape["costs"])]
    gens = {g: c for g, _, c in reversed(splits)}  # the generator's fields at each gen count
    trains = {t: c for _, t, c in reversed(splits)}
    c = shape["costs"]
    chunk = lognormal_samples(c["sim_chunk_mean_s"], c.get("sim_tail_p99_over_mean", 1.0))
    n = facts.num_envs
    gen = StageProfile(
        tuple(
            Point(b, gc["gen_fixed_s"] + gc["gen_per_env_s"] * b, threads=g, busy=gc["gen_busy"])
            for g, gc in sorted(gens.items())
            for b in sorted({1, max(1, n // 2), n})
        ),
        "batch",
    )
    samples = n * facts.decisions_per_env
    train = StageProfile(
        tuple(
            Point(samples, tc["train_s"], threads=t, busy=tc["train_busy"])
            for t, tc in sorted(trains.items())
        ),
        "samples",
    )
    return (chunk, min(1.0, c["sim_busy"])), gen, train


def _from_timeline(
    path: Path, summary: dict[str, Any], facts: RunFacts
) -> tuple[tuple[tuple[float, ...], float], StageProfile, StageProfile]:
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    spans = [e for e in events if e.get("ph") == "X"]
    in_turn = summary.get("scheduler") in IN_TURN
    cpu = summary.get("stage_cpu_s") or {}
    busy = summary.get("stage_busy_s") or {}

    def ratio(stage: str) -> float:  # cores the stage kept busy over the run
        return float(cpu.get(stage, 0.0)) / max(float(busy.get(stage, 0.0)), 1e-9)

    def by_cpu(stage: str, threads: int) -> bool:
        # overlapped with other stages, a one-thread stage that computes (not one that waits:
        # a sleeping simulator keeps well under a quarter of a core busy even when it waits
        # for one) spent its CPU seconds alone; its wall time includes the waits for a core
        return not in_turn and threads == 1 and ratio(stage) >= 0.25

    def alone(e: dict[str, Any], stage: str, threads: int) -> float:
        wall = e["dur"] / 1e6
        spent = float((e.get("args") or {}).get("cpu", 0.0))
        return min(wall, spent) if by_cpu(stage, threads) and spent > 0 else wall

    def busy_of(stage: str, threads: int) -> float:
        if not cpu:
            return 1.0
        if by_cpu(stage, threads):
            return 1.0  # its time is its CPU time: a core busy throughout
        return min(float(threads), max(ratio(stage), 0.01))

    sims = [e for e in spans if e["name"] == "sim" and "reset" not in (e.get("args") or {})]
    chunk = [alone(e, "sim", 1) / max(1, int(e["args"].get("batch", 1))) for e in sims]
    if not chunk:
        raise ProfileError(f"{path}: no sim spans")
    per_size: dict[int, list[float]] = defaultdict(list)
    for e in spans:
        if e["name"] == "gen":
            per_size[int(e["args"].get("batch", 1))].append(alone(e, "gen", facts.gen_threads))
    if not per_size:
        raise ProfileError(f"{path}: no gen spans")
    gen_busy = busy_of("gen", facts.gen_threads)
    gen = StageProfile(
        tuple(
            Point(b, float(np.median(v)), threads=facts.gen_threads, busy=gen_busy)
            for b, v in sorted(per_size.items())
        ),
        "batch",
    )
    trains = [alone(e, "train", facts.train_threads) for e in spans if e["name"] == "train"]
    if not trains:
        raise ProfileError(f"{path}: no train spans")
    train_busy = busy_of("train", facts.train_threads)
    train = StageProfile(
        (
            Point(
                facts.num_envs * facts.decisions_per_env,
                float(np.median(trains)),
                threads=facts.train_threads,
                busy=train_busy,
            ),
        ),
        "samples",
    )
    return (tuple(chunk), min(1.0, busy_of("sim", 1))), gen, train
