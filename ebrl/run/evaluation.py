"""The evaluation of a run's weights once its loop is over (``eval.*``): the final weights
(:func:`evaluate_final`) and every kept snapshot, as a learning curve (:func:`evaluate_curve`)."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import torch

from ebrl.config import RunConfig
from ebrl.evaluate import evaluate
from ebrl.run.metrics import MetricsFile
from ebrl.run.report import Summary
from ebrl.stages.factory import StageFactory
from ebrl.stages.train import load_checkpoint, snapshots
from ebrl.tracking.tracker import Tracker

log = logging.getLogger("ebrl")


def evaluate_final(
    run: RunConfig, factory: StageFactory, ckpt_path: Path, summary: Summary, tracker: Tracker
) -> None:
    """Evaluate the learner's last checkpoint (the final weights: ``every_iters`` is 1)."""
    ckpt = load_checkpoint(ckpt_path)
    if ckpt is None:
        log.warning("eval: no checkpoint in %s (no update ran); nothing to evaluate", ckpt_path)
        return
    res = evaluate(
        factory,
        (int(ckpt["version"]), ckpt["policy"]),
        episodes=run.eval.episodes,
        num_envs=run.eval.num_envs,
        deterministic=run.eval.deterministic,
        threads=run.threads.train,
        init_states=run.eval.init_states,
    )
    summary.eval_success_rate = res.success_rate
    summary.eval_episodes = res.episodes
    summary.eval_policy_version = res.policy_version
    log.info(
        "eval: %d/%d episodes succeeded (%s policy, version %d, %s, %.1f s)%s",
        res.successes,
        res.episodes,
        "deterministic" if res.deterministic else "stochastic",
        res.policy_version,
        "fixed initial states" if res.fixed_states else "the run's initial states",
        res.seconds,
        f"; per task {dict(res.per_task)}" if res.per_task else "",
    )
    tracker.log_metrics(
        {
            "eval/success_rate": res.success_rate,
            "eval/return": res.mean_return,
            "eval/episode_length": res.mean_length,
            "eval/seconds": res.seconds,
        },
        step=summary.env_steps,
    )


def evaluate_curve(
    run: RunConfig,
    factory: StageFactory,
    snap_dir: Path,
    metrics: MetricsFile,
    summary: Summary,
    tracker: Tracker,
) -> None:
    """Evaluate every kept snapshot; log ``eval/success_rate`` at the env step of the update that
    made it (the report of update ``v`` is metrics row ``v - 1``), write ``eval_curve.csv``."""
    at = {r["iteration"] + 1: r for r in metrics.rows()}  # version after the update -> its report
    out = []
    for path in snapshots(snap_dir):
        snap = torch.load(path, map_location="cpu", weights_only=True)
        v = int(snap["version"])
        row = at.get(v)
        if row is None:  # the learner ran past the last report (asynchronous schedules)
            continue
        res = evaluate(
            factory,
            (v, snap["policy"]),
            episodes=run.eval.curve_episodes,
            num_envs=run.eval.num_envs,
            deterministic=run.eval.deterministic,
            threads=run.threads.train,
            init_states=run.eval.init_states,
        )
        steps, wall = int(row["env/steps_total"]), float(row["time/wall_s"])
        out.append({"version": v, "env_steps": steps, "wall_s": wall, "success": res.success_rate})
        tracker.log_metrics({"eval/success_rate": res.success_rate}, step=steps)
        if summary.eval_time_to_80 is None and res.success_rate >= 0.8:
            summary.eval_time_to_80, summary.eval_steps_to_80 = wall, steps
    if out:
        with (metrics.path.parent / "eval_curve.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0]))
            w.writeheader()
            w.writerows(out)
    log.info("eval: learning curve of %d snapshots in %s", len(out), snap_dir)
