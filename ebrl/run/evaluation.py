"""The evaluation of a run's weights once its loop is over (``eval.*``): every kept snapshot, as a
learning curve, and the final weights, in one call (:func:`evaluate_after_training`).

Each evaluation (a snapshot's ``curve_episodes``, the final weights' ``episodes``) is one
:func:`ebrl.evaluate.evaluate` call, independent of the others and the same whichever process
runs it. With ``eval.workers`` above 1 they run in that many processes at once (a simulator
such as LIBERO steps on one core per process, and the run's workers have stopped, so the cores
are free): the final evaluation, the longest, starts first, the snapshots fill the other
processes, and the results are logged in the same order as one process logs them. Each process
loads the weights it evaluates from the run's files, so nothing large is sent to it.
"""

from __future__ import annotations

import csv
import logging
import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ebrl.config import RunConfig
from ebrl.evaluate import EvalResult, evaluate
from ebrl.run.metrics import MetricsFile
from ebrl.run.report import Summary
from ebrl.stages.factory import StageFactory
from ebrl.stages.train import snapshots
from ebrl.tracking.tracker import Tracker

log = logging.getLogger("ebrl")


@dataclass(frozen=True, slots=True)
class EvalJob:
    """One evaluation: the weights in ``path`` (a snapshot or the learner's checkpoint) on
    ``episodes`` episodes."""

    path: str
    episodes: int


def evaluate_after_training(
    run: RunConfig,
    factory: StageFactory,
    ckpt_path: Path,
    snap_dir: Path,
    metrics: MetricsFile,
    summary: Summary,
    tracker: Tracker,
) -> None:
    """The learning curve (``eval.every_iters`` > 0: every kept snapshot on ``curve_episodes``
    episodes) and the final weights (``eval.episodes`` > 0: the learner's last checkpoint),
    on ``eval.workers`` processes; logged to ``tracker``, ``summary`` and
    ``eval_curve.csv``."""
    curve: list[tuple[EvalJob, dict[str, Any]]] = []
    if run.eval.every_iters > 0:
        at = {r["iteration"] + 1: r for r in metrics.rows()}  # version after update -> report
        for path in snapshots(snap_dir):
            v = int(path.stem[1:])  # save_snapshot names it v<version, 7 digits>
            if v in at:  # else the learner ran past the last report (asynchronous schedules)
                curve.append((EvalJob(str(path), run.eval.curve_episodes), at[v]))
    final = None
    if run.eval.episodes > 0:
        if ckpt_path.exists():
            final = EvalJob(str(ckpt_path), run.eval.episodes)
        else:
            log.warning("eval: no checkpoint in %s (no update ran); nothing to evaluate", ckpt_path)
    jobs = ([final] if final else []) + [job for job, _ in curve]  # the longest first
    results = iter(run_jobs(run, factory, jobs))
    final_res = next(results) if final else None
    if run.eval.every_iters > 0:
        _log_curve(
            [(res, row) for res, (_, row) in zip(results, curve, strict=True)],
            metrics,
            summary,
            tracker,
        )
    if final_res is not None:
        _log_final(final_res, summary, tracker)


def run_jobs(run: RunConfig, factory: StageFactory, jobs: list[EvalJob]) -> list[EvalResult]:
    """Every job's result, in order: in this process with ``eval.workers`` 1 (or one job), else
    on a pool of that many spawned processes, stopped at once if anything goes wrong."""
    workers = min(run.eval.workers, len(jobs))
    kw = {
        "num_envs": run.eval.num_envs,
        "deterministic": run.eval.deterministic,
        "threads": run.threads.train,
        "init_states": str(run.eval.init_states),
    }
    if workers <= 1:
        return [_evaluate_job(factory, job, kw) for job in jobs]
    log.info("eval: %d evaluations on %d processes", len(jobs), workers)
    # spawn, not fork: the driver holds threads (Ray's, MLflow's) that a fork would copy
    pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        pending = [pool.apply_async(_evaluate_job, (factory, job, kw)) for job in jobs]
        out = [p.get() for p in pending]
        pool.close()
        return out
    finally:
        pool.terminate()  # a failure or a stop signal leaves no evaluation running
        pool.join()


def _evaluate_job(factory: StageFactory, job: EvalJob, kw: dict[str, Any]) -> EvalResult:
    """One evaluation, in whichever process runs it."""
    ckpt = torch.load(job.path, map_location="cpu", weights_only=True)
    return evaluate(factory, (int(ckpt["version"]), ckpt["policy"]), episodes=job.episodes, **kw)


def _log_curve(
    points: list[tuple[EvalResult, dict[str, Any]]],
    metrics: MetricsFile,
    summary: Summary,
    tracker: Tracker,
) -> None:
    """Log ``eval/success_rate`` at the env step of the update that made each snapshot (the
    report of update ``v`` is metrics row ``v - 1``); write ``eval_curve.csv``."""
    out = []
    for res, row in points:
        steps, wall = int(row["env/steps_total"]), float(row["time/wall_s"])
        out.append(
            {
                "version": res.policy_version,
                "env_steps": steps,
                "wall_s": wall,
                "success": res.success_rate,
            }
        )
        tracker.log_metrics({"eval/success_rate": res.success_rate}, step=steps)
        if summary.eval_time_to_80 is None and res.success_rate >= 0.8:
            summary.eval_time_to_80, summary.eval_steps_to_80 = wall, steps
    if out:
        with (metrics.path.parent / "eval_curve.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0]))
            w.writeheader()
            w.writerows(out)
    log.info("eval: learning curve of %d snapshots", len(out))


def _log_final(res: EvalResult, summary: Summary, tracker: Tracker) -> None:
    """The final weights' figures into the summary, the log and the tracker."""
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
