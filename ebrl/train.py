"""``train(cfg)``: build the stages from a config, let the scheduler drive them, log everything.

Entry points: ``python -m ebrl.train [overrides]`` and the ``ebrl-train`` console script (Hydra).
Each run writes into its run folder: ``config.yaml`` (resolved), ``metrics.csv`` (one row per
update), ``timeline.json`` (Chrome trace) and ``summary.json``; the same go to MLflow.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ebrl import ledger
from ebrl.choices import class_name, run_choices
from ebrl.config import ConfigError, ResourcesNode, RunConfig, class_of, register, validate
from ebrl.evaluate import evaluate
from ebrl.schedulers.base import RunContext, UpdateBudget
from ebrl.signals import Preempted, StopSignals
from ebrl.stages.factory import StageFactory
from ebrl.stages.train import load_checkpoint, snapshots
from ebrl.timeline import Timeline
from ebrl.tracking import (
    MLflowTracker,
    NullTracker,
    Tracker,
    git_commit,
    machine,
    portable,
    system_metrics_wanted,
)
from ebrl.utilisation import UtilisationSampler

log = logging.getLogger("ebrl")
#: the run's log file only (Hydra's job log, ``train.log``): the run's start, a line per update
#: and its end; the console shows the progress bar instead
run_log = logging.getLogger("ebrl.run")
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


# --- results ----------------------------------------------------------------------------------
@dataclass
class Summary:
    """What a run reports; written to ``summary.json`` and logged as MLflow metrics/tags."""

    seed: int
    commit: str
    machine: str
    #: the config options the run was composed from, as users type them (``scheduler=ebrl``,
    #: ``policy=transformer_l``, ``simulator=pushcube``; :func:`ebrl.choices.run_choices`)
    scheduler: str
    policy: str
    simulator: str
    algo: str
    #: the GPU option (``gpu=h100``; ``cpu`` without one)
    gpu: str = ""
    #: the classes behind those options (``EBRLScheduler``, ``TransformerPolicy``) and the
    #: simulator's task (``PushCube-v1``), as runs before the options were recorded named them
    scheduler_class: str = ""
    policy_class: str = ""
    simulator_task: str = ""
    #: which code ran the schedule: "ebrl" (our engine, replicas included) or "rlinf"
    implementation: str = "ebrl"
    iterations: int = 0
    env_steps: int = 0
    wall_s: float = 0.0
    #: env steps consumed by training per second, after the warm-up iterations
    throughput_e2e: float = 0.0
    #: env steps per second over the whole run
    throughput_overall: float = 0.0
    #: training success rate over the last iterations' episodes
    success_rate: float = float("nan")
    #: evaluation of the final weights (ebrl.evaluate; eval.episodes > 0): success rate over
    #: that many episodes, and the learner version evaluated
    eval_success_rate: float | None = None
    eval_episodes: int = 0
    eval_policy_version: int | None = None
    #: learning curve of evaluated snapshots (eval.every_iters > 0): the first wall-clock second
    #: / env step whose snapshot reached 0.8 evaluation success (None: never)
    eval_time_to_80: float | None = None
    eval_steps_to_80: int | None = None
    #: first wall-clock second / env step at which the success rate reached 0.8 (None: never)
    time_to_80: float | None = None
    steps_to_80: int | None = None
    #: seconds each stage was busy (wall) and the CPU seconds its process used meanwhile
    stage_busy_s: dict[str, float] = field(default_factory=dict)
    stage_cpu_s: dict[str, float] = field(default_factory=dict)
    #: steady state: fraction of wall time in which no stage (sim, gen, train, sync) ran
    overhead_frac: float = 0.0
    #: the step ledger (``ebrl.ledger``), every attempt so far: env steps collected, and those
    #: never trained on (rollouts in flight at a stop, dead env workers' redone parts);
    #: ``env_steps`` = collected - discarded
    collected_env_steps: int = 0
    discarded_env_steps: int = 0
    status: str = "FINISHED"
    #: where the run wrote its files
    run_dir: str = ""


def _name(node: DictConfig) -> str:
    """A component's display name: its ``name`` field if it has one, else its class name."""
    return str(node.get("name") or str(node._target_).rsplit(".", 1)[-1])


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _sweep_choice() -> str:
    """The ``+sweep=<name>`` Hydra recorded for this job ("" outside a sweep)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.choices.get("sweep") or "")
    except ValueError:  # not under Hydra
        return ""


def _run_dir(run: RunConfig) -> Path:
    if run.run_dir:
        d = Path(run.run_dir)
    else:
        try:
            from hydra.core.hydra_config import HydraConfig

            d = Path(HydraConfig.get().runtime.output_dir)
        except ValueError:  # called without Hydra (tests, notebooks)
            d = Path("outputs/runs") / time.strftime("%Y-%m-%d/%H-%M-%S")
    d.mkdir(parents=True, exist_ok=True)
    return d.resolve()


def _tracker(
    run: RunConfig,
    summary: Summary,
    cfg: DictConfig,
    resume_id: str | None = None,
    spool: Path | None = None,
) -> Tracker:
    """The run's MLflow run (a resumed attempt's: the same one). Metrics go through ``spool``
    first (``<run_dir>/mlflow_spool.jsonl``), so a tracking server that goes away mid-run costs
    no metric and does not stop training; see :class:`ebrl.tracking.MLflowTracker`."""
    if not run.tracking.enabled:
        return NullTracker()
    tags = {
        "scheduler": summary.scheduler,
        "scheduler_class": summary.scheduler_class,
        "policy": summary.policy,
        "policy_class": summary.policy_class,
        "simulator": summary.simulator,
        "simulator_task": summary.simulator_task,
        "gpu": summary.gpu,
        "algo": summary.algo,
        "variant": str(cfg.get("variant", "") or ""),
        "sweep": _sweep_choice(),
        "seed": str(run.seed),
        "git_commit": summary.commit,
        "machine": summary.machine,
        "implementation": summary.implementation,
    }
    if run.tracking.parent_run_id:  # a sweep's job: a child of the sweep's run (ebrl.launch)
        tags["mlflow.parentRunId"] = run.tracking.parent_run_id
    name = run.tracking.run_name or (
        f"{summary.scheduler}-{summary.policy}-{summary.simulator}-s{run.seed}"
    )
    tr = MLflowTracker(
        uri=run.tracking.uri,
        store=run.tracking.store,
        experiment=run.tracking.experiment,
        run_name=name,
        tags=tags,
        resume_id=resume_id,
        spool=spool,
        system_metrics=system_metrics_wanted(run.tracking.system_metrics),
        system_metrics_interval_s=run.tracking.system_metrics_interval_s,
    )
    if resume_id is None:  # params are immutable in MLflow: logged once, by the first attempt
        tr.log_params(_flat(OmegaConf.to_container(cfg, resolve=True)))  # type: ignore[arg-type]
    return tr


# --- the loop ---------------------------------------------------------------------------------
@dataclass
class Progress:
    """What the driver needs to continue a run: written after every logged update."""

    mlflow_run_id: str | None = None
    #: fingerprint of the config that made this progress (a run folder resumes only its own run)
    config_hash: str = ""
    iterations: int = 0
    env_steps: int = 0
    wall_s: float = 0.0
    time_to_80: float | None = None
    steps_to_80: int | None = None
    success_hist: list[float] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Progress | None:
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    def spent(self) -> tuple[int, float, int]:
        """(env steps, seconds, updates) so far, as :func:`_budget_spent` takes them."""
        return self.env_steps, self.wall_s, self.iterations


def _resume(run: RunConfig, run_dir: Path, fingerprint: str) -> tuple[Progress, int, int]:
    """Where this attempt starts: (progress, the learner's version, updates never logged).

    The learner's checkpoint is the truth: it holds the weights, the version (one per update)
    and the env steps trained on. ``progress.json`` (written by the driver after logging each
    update) adds what only the driver knows (the MLflow run, wall-clock, success history). The
    two differ when the driver stopped between the learner's save and its own log of an update
    (a signal, a dead driver): that update's env steps count, its metrics were never logged
    (returned as the third value, logged as ``fault/unlogged_updates``). A fresh run (no
    progress, no checkpoint, or ``checkpoint.resume=false``) starts from nothing and removes
    what an earlier run left in the folder.
    """
    ckpt_path, prog_path = run_dir / "checkpoint.pt", run_dir / "progress.json"
    prog = Progress.load(prog_path) if run.checkpoint.resume else None
    if prog is not None and prog.config_hash != fingerprint:
        raise ConfigError(
            f"run folder {run_dir} holds progress of a run with a different config; "
            "resuming it would mix two runs: choose another run_dir, delete that folder, or "
            "set checkpoint.resume=false to start over in it"
        )
    ckpt = load_checkpoint(ckpt_path) if prog is not None else None
    if prog is None or ckpt is None:
        for p in (ckpt_path, prog_path, run_dir / "metrics.jsonl"):
            p.unlink(missing_ok=True)
        shutil.rmtree(run_dir / ledger.LEDGER, ignore_errors=True)
        return Progress(config_hash=fingerprint), 0, 0
    version = int(ckpt["version"])
    unlogged = 0
    if "trained_env_steps" in ckpt:  # checkpoints from before it: the progress file counts
        unlogged = version - prog.iterations
        if unlogged < 0:
            log.warning(
                "the checkpoint (update %d) is %d update(s) behind the last logged one "
                "(checkpoint.every_iters=%d): those updates are trained again, and MLflow "
                "holds their first metrics at the env steps they were logged at",
                version,
                -unlogged,
                run.checkpoint.every_iters,
            )
            unlogged = 0
        elif unlogged > 0:
            log.warning(
                "%d update(s) were trained and checkpointed but never logged (the driver "
                "stopped first): their env steps count, their metrics are lost",
                unlogged,
            )
        prog.iterations, prog.env_steps = version, int(ckpt["trained_env_steps"])
    log.info(
        "resuming from %s at update %d (%d env steps)", run_dir, prog.iterations, prog.env_steps
    )
    return prog, version, unlogged


def train(cfg: DictConfig) -> Summary:
    """Run one training job described by a composed config; returns its summary.

    Resumes by itself when its run folder holds a checkpoint and ``progress.json`` from an
    earlier, interrupted attempt (``checkpoint.resume``): the learner and generator start from the
    saved weights, and metrics continue in the same MLflow run, from the saved step on.
    """
    run = validate(cfg)
    if run.init_checkpoint:  # every worker loads it, wherever it runs: an absolute path
        cfg.init_checkpoint = str(Path(run.init_checkpoint).resolve())
    _refuse_unwired_resources(run)
    run_dir = _run_dir(run)
    (run_dir / "config.yaml").write_text(portable(OmegaConf.to_yaml(cfg, resolve=True)))
    chosen = run_choices(cfg)
    summary = Summary(
        seed=run.seed,
        commit=git_commit(),
        machine=machine(),
        scheduler=chosen["scheduler"],
        policy=chosen["policy"],
        simulator=chosen["simulator"],
        algo=_name(cfg.algo),
        gpu=chosen["gpu"],
        scheduler_class=class_name(cfg.scheduler),
        policy_class=class_name(cfg.policy),
        simulator_task=str(cfg.simulator.get("task") or ""),
        run_dir=portable(str(run_dir)),
    )
    ckpt_path, prog_path, jsonl = (
        run_dir / "checkpoint.pt",
        run_dir / "progress.json",
        run_dir / "metrics.jsonl",
    )
    _to_log_file(run_log)
    run_log.info(
        "run folder %s: %s on %s, policy %s, budget %d env steps",
        run_dir,
        summary.scheduler,
        summary.simulator,
        summary.policy,
        run.budget.env_steps,
    )
    prog, start_version, unlogged = _resume(run, run_dir, config_hash(cfg))
    np.random.seed(run.seed + prog.iterations)
    torch.manual_seed(run.seed + prog.iterations)
    timeline = Timeline()
    factory = replace(StageFactory.from_config(cfg), start_version=start_version)
    if run.checkpoint.every_iters > 0:
        factory = replace(
            factory, checkpoint=str(ckpt_path), checkpoint_every=run.checkpoint.every_iters
        )
    snap_dir = run_dir / "snapshots"
    if run.eval.every_iters > 0:
        factory = replace(factory, snapshots=str(snap_dir), snapshot_every=run.eval.every_iters)
    ctx = RunContext(
        factory=factory,
        decisions_per_env=run.decisions_per_env,
        env_groups=run.env_groups,
        timeline=timeline,
        budget=UpdateBudget(updates=run.budget.iterations, env_steps=run.budget.env_steps),
        run_dir=run_dir,
        manage_resources=manages_resources(run.scheduler),
        ledger=ledger.attempt_dir(run_dir, start_version),
    )
    # the scheduler first: one that refuses its settings (in its constructor, or in check(ctx)
    # against the run: a baseline's fixed split, its loss) leaves no MLflow run behind
    scheduler = instantiate(cfg.scheduler)
    if callable(check := getattr(scheduler, "check", None)):
        try:
            check(ctx)
        except ValueError as e:
            raise ConfigError(str(e)) from e
    if prog.iterations == 0 and snap_dir.exists():  # a fresh start: no earlier run's weights
        shutil.rmtree(snap_dir)
    summary.implementation = getattr(scheduler, "implementation", "ebrl")
    tracker = _tracker(
        run, summary, cfg, resume_id=prog.mlflow_run_id, spool=run_dir / "mlflow_spool.jsonl"
    )
    prog.mlflow_run_id = tracker.run_id
    if unlogged:
        tracker.log_metrics({"fault/unlogged_updates": float(unlogged)}, step=prog.env_steps)
    summary.iterations, summary.env_steps = prog.iterations, prog.env_steps
    summary.time_to_80, summary.steps_to_80 = prog.time_to_80, prog.steps_to_80
    success_hist = prog.success_hist
    bar = _progress(run, prog.env_steps)
    wall0 = prog.wall_s  # wall-clock of earlier attempts: the curves continue, not restart
    t_start = time.perf_counter()
    t_steady, steps_steady = t_start, summary.env_steps
    t_last = t_start  # when the last report arrived: shutdown time is not throughput time
    gen = scheduler.run(ctx)
    sampler = _sampler(run, run_dir, timeline)
    stop = StopSignals()
    with stop:
        try:
            # a requeued job whose budget was already spent (a late USR2, a second requeue)
            # starts no workers: it only finishes
            for rep in () if _budget_spent(run, *prog.spent()) else gen:
                # when the update arrived, not when the scheduler was done with its report
                t_last = max(t_last, time.perf_counter() if rep.at is None else rep.at)
                now = wall0 + t_last - t_start
                it = summary.iterations
                summary.iterations += 1
                summary.env_steps += rep.env_steps
                if summary.iterations == prog.iterations + run.warmup_iters:
                    t_steady, steps_steady = t_last, summary.env_steps
                m = dict(rep.metrics)
                if rep.params and prog.iterations == 0:  # params are immutable: first attempt
                    tracker.log_params({k: str(v) for k, v in rep.params.items()})
                m["time/wall_s"] = now
                m["env/steps_total"] = summary.env_steps
                m["throughput/env_steps_per_s"] = (summary.env_steps - prog.env_steps) / max(
                    t_last - t_start, 1e-9
                )
                for stage, busy in timeline.busy.items():
                    m[f"time/{stage}/busy_s"] = busy
                    # utilisation of the stage's lanes since the start; 1 - this is its bubbles
                    lanes = len(timeline.tracks.get(stage, ())) or 1
                    m[f"pipeline/{stage}_busy_frac"] = busy / max(lanes * (t_last - t_start), 1e-9)
                for stage, cpu in timeline.cpu.items():
                    m[f"time/{stage}/cpu_s"] = cpu
                if "env/success_rate" in m:
                    success_hist.append(m["env/success_rate"])
                    if summary.time_to_80 is None and m["env/success_rate"] >= 0.8:
                        summary.time_to_80, summary.steps_to_80 = now, summary.env_steps
                tracker.log_metrics(m, step=summary.env_steps)
                with jsonl.open("a") as f:
                    f.write(json.dumps({"iteration": it, **m}) + "\n")
                _save_progress(prog, prog_path, summary, now, success_hist)
                run_log.info(
                    "update %d: %d env steps, %.0f env steps/s, success %s, %.1f s",
                    it,
                    summary.env_steps,
                    m["throughput/env_steps_per_s"],
                    f"{success_hist[-1]:.2f}" if success_hist else "-",
                    now,
                )
                if bar is not None:
                    bar.update(rep.env_steps)
                    bar.set_postfix(
                        sps=f"{m['throughput/env_steps_per_s']:.0f}",
                        success=f"{success_hist[-1]:.2f}" if success_hist else "-",
                    )
                if _budget_spent(run, summary.env_steps, now, summary.iterations):
                    break
            gen.close()  # stop the stages (and their CPU use) before evaluating
            if run.eval.every_iters > 0:
                _evaluate_curve(run, factory, snap_dir, jsonl, summary, tracker)
            if run.eval.episodes > 0:
                _evaluate_final(run, factory, ckpt_path, summary, tracker)
            stop.disarm()  # done: a signal from here on cannot make it less than FINISHED
        except BaseException as e:
            stop.disarm()  # a second signal must not cut this clean-up short
            signalled = stop.preempted()
            stopped = isinstance(e, KeyboardInterrupt) or signalled is not None
            summary.status = "KILLED" if stopped else "FAILED"
            (log.info if stopped else log.error)(  # a stop signal is planned, not an error
                "run stopped (%s: %s); results so far are in %s", type(e).__name__, e, run_dir
            )
            if signalled is not None and not isinstance(e, Preempted):
                # the signal interrupted something that reported it as its own error (raised
                # inside Ray's Cython wait: "SystemError: ... returned a result with an
                # exception set"), or killed a worker first: the signal ends the run
                raise signalled from e
            raise
        finally:
            gen.close()
            if bar is not None:
                bar.close()
            wall = t_last - t_start
            summary.wall_s = wall0 + wall
            summary.throughput_overall = (summary.env_steps - prog.env_steps) / max(wall, 1e-9)
            steady_s = t_last - t_steady
            summary.throughput_e2e = (summary.env_steps - steps_steady) / max(steady_s, 1e-9)
            if t_steady == t_start or steady_s <= 0:  # no update after the warm-up
                summary.throughput_e2e = summary.throughput_overall
            if sampler is not None:
                sampler.stop()
            tail = success_hist[-max(1, math.ceil(len(success_hist) * 0.1)) :]
            summary.success_rate = float(np.mean(tail)) if tail else float("nan")
            summary.stage_busy_s = dict(timeline.busy)
            summary.stage_cpu_s = dict(timeline.cpu)
            covered = timeline.covered(t_steady, until=t_last)
            summary.overhead_frac = max(0.0, 1.0 - covered / max(steady_s, 1e-9))
            _account(run_dir, ckpt_path, start_version, summary, prog, tracker)
            _write_outputs(run_dir, jsonl, summary, timeline, tracker)
    return summary


def _to_log_file(logger: logging.Logger) -> None:
    """Point ``logger`` at the log files the root logger writes (Hydra's job log; none outside
    Hydra) and not at the console."""
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers = [
        h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)
    ]
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def _sampler(run: RunConfig, run_dir: Path, timeline: Timeline) -> UtilisationSampler | None:
    """The run's CPU-core and GPU sampler (``tracking.utilisation``), started on the timeline's
    clock so its samples line up with the stage spans; None when off. Each attempt writes its
    own ``utilisation.csv``, as it writes its own ``timeline.json``."""
    if not run.tracking.utilisation:
        return None
    return UtilisationSampler(
        run_dir / "utilisation.csv", run.tracking.utilisation_interval_s, t0=timeline.t0
    ).start()


def _account(
    run_dir: Path,
    ckpt_path: Path,
    start_version: int,
    summary: Summary,
    prog: Progress,
    tracker: Tracker,
) -> None:
    """The step ledger against the learner's checkpoint, into the summary and MLflow
    (``env/collected_steps_total``, ``fault/discarded_env_steps``); a disagreement (a transition
    trained twice, or one counted and never trained) is logged as an error. Never raises: it runs
    in the clean-up of a failed run too."""
    try:
        ckpt = load_checkpoint(ckpt_path)
        if ckpt is not None:
            version, trained = int(ckpt["version"]), int(ckpt.get("trained_env_steps", -1))
        else:  # no checkpoints: the updates this attempt logged
            version = start_version + summary.iterations - prog.iterations
            trained = summary.env_steps
        acc = ledger.account(run_dir, version)
    except Exception as e:  # a torn checkpoint, an unreadable folder: say so, keep the run
        log.warning("step ledger: not read (%s: %s)", type(e).__name__, e)
        return
    summary.collected_env_steps, summary.discarded_env_steps = acc.collected, acc.discarded
    if trained >= 0 and acc.trained != trained:
        log.error(
            "step ledger: the env workers collected %d env steps in segments the learner "
            "trained, the learner counted %d: a transition was trained twice or lost",
            acc.trained,
            trained,
        )
    tracker.log_metrics(
        {
            "env/collected_steps_total": float(acc.collected),
            "fault/discarded_env_steps": float(acc.discarded),
            "fault/superseded_env_steps": float(acc.superseded),
        },
        step=summary.env_steps,
    )


def _evaluate_final(
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


def _evaluate_curve(
    run: RunConfig,
    factory: StageFactory,
    snap_dir: Path,
    jsonl: Path,
    summary: Summary,
    tracker: Tracker,
) -> None:
    """Evaluate every kept snapshot; log ``eval/success_rate`` at the env step of the update that
    made it (the report of update ``v`` is metrics row ``v - 1``), write ``eval_curve.csv``."""
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    at = {r["iteration"] + 1: r for r in rows}  # version after the update -> its report
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
        with (jsonl.parent / "eval_curve.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0]))
            w.writeheader()
            w.writerows(out)
    log.info("eval: learning curve of %d snapshots in %s", len(out), snap_dir)


def manages_resources(scheduler: Any) -> bool:
    """Whether the resource manager applies to a run of ``scheduler`` (its config node): to EBRL's
    scheduler only. The baselines on its workers (hybrid, async) hold an EBRLScheduler but keep
    their own fixed split; :func:`_refuse_unwired_resources` refuses a ``resources`` group they
    would not honour."""
    from ebrl.schedulers.ebrl import EBRLScheduler

    cls = class_of(scheduler) or type(scheduler)
    return issubclass(cls, EBRLScheduler)


def _refuse_unwired_resources(run: RunConfig) -> None:
    """The ``resources`` group is read by the EBRL scheduler's resource manager only
    (``ebrl/schedulers/ebrl/manage.py``), its SM quotas by every scheduler on EBRL's workers
    (their roles' processes get them: ``ebrl/resources/sharing.py``). Refuse a non-default value
    that the run would not honour: any, under another scheduler; SM quotas the roles' GPU
    shares cannot take; under ``scheduler=ebrl``, cores without pinning, and settings of a part
    that is off."""
    from ebrl.resources.sharing import check_gpu_profile, check_quotas

    res = run.resources
    expected = {f.name: getattr(ResourcesNode(), f.name) for f in dataclasses.fields(ResourcesNode)}
    # conf/resources/default.yaml mirrors threads.* into these two
    expected.update(gen_threads=run.threads.gen, train_threads=run.threads.train)
    gen_gpus = getattr(run.scheduler, "gen_gpus", None)
    learner_gpus = getattr(run.scheduler, "learner_gpus", None)
    on_ebrl_workers = gen_gpus is not None and learner_gpus is not None
    if on_ebrl_workers:  # the roles' processes take their quotas under every such scheduler
        try:
            check_quotas(gen_gpus, learner_gpus, res.gen_sm_pct, res.train_sm_pct)
            check_gpu_profile(res.gpu_profile, gen_gpus, learner_gpus)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        expected.update(
            gen_sm_pct=res.gen_sm_pct, train_sm_pct=res.train_sm_pct, gpu_profile=res.gpu_profile
        )
    changed = [
        f"resources.{k}={getattr(res, k)}" for k, v in expected.items() if getattr(res, k) != v
    ]
    if not changed:
        return
    if not manages_resources(run.scheduler):
        cls = class_of(run.scheduler) or type(run.scheduler)
        raise ConfigError(
            f"{', '.join(changed)}: the resource manager (ebrl/resources/, including the elastic "
            f"allocator) is not wired into scheduler {cls.__name__}, only into "
            "scheduler=ebrl; use scheduler=ebrl, or set the split with threads.gen / threads.train "
            "and leave resources at its defaults"
            + (
                " (resources.gen_sm_pct / train_sm_pct: only the schedulers on EBRL's workers, "
                "ebrl, hybrid and async, give their roles SM quotas)"
                if not on_ebrl_workers
                else ""
            )
        )
    cores = [
        f"resources.{k}={getattr(res, k)}"
        for k in ("sim_cores", "gen_cores", "train_cores")
        if getattr(res, k) is not None
    ]
    if cores and not res.pin:
        raise ConfigError(
            f"{', '.join(cores)}: cores are only given out with pinning; set resources.pin=true, "
            "or split threads with resources.gen_threads / train_threads"
        )
    if res.gen_batch is not None and (res.gen_batch < 1 or run.scheduler.step_level is False):
        raise ConfigError(
            f"resources.gen_batch={res.gen_batch}: the generator's batch size must be >= 1 and "
            "only applies with scheduler.step_level=true (otherwise it acts on whole env groups)"
        )
    if res.allocator != "elastic":
        # the drift trigger's settings are the shape watch's too (scheduler.reshape_on_drift)
        watched = bool(getattr(run.scheduler, "reshape_on_drift", False))
        keys = ("profile",) if watched else ("rebalance_threshold", "rebalance_patience", "profile")
        unused = [
            f"resources.{k}={getattr(res, k)}" for k in keys if getattr(res, k) != expected[k]
        ]
        if unused:
            raise ConfigError(
                f"{', '.join(unused)}: only read by the elastic allocator"
                + ("" if watched else " and the shape watch (scheduler.reshape_on_drift=true)")
                + "; set resources.allocator=elastic or leave them at their defaults"
            )
    elif res.profile is not None and not Path(res.profile).is_file():
        raise ConfigError(
            f"resources.profile={res.profile}: no such file; give a profile saved by "
            "ebrl.resources.profiler (a run's profile.json), or null to profile at start"
        )


def config_hash(cfg: DictConfig) -> str:
    """Fingerprint of what a run computes: the resolved config without where it writes, its
    budget (a resumed run may be given more) and display settings."""
    c = OmegaConf.to_container(cfg, resolve=True)
    for k in ("run_dir", "budget", "progress", "tracking"):
        c.pop(k, None)  # type: ignore[union-attr]
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _save_progress(
    prog: Progress, path: Path, summary: Summary, now: float, success_hist: list[float]
) -> None:
    state = replace(
        prog,
        iterations=summary.iterations,
        env_steps=summary.env_steps,
        wall_s=now,
        time_to_80=summary.time_to_80,
        steps_to_80=summary.steps_to_80,
        success_hist=list(success_hist),
    )
    state.save(path)


def _budget_spent(run: RunConfig, steps: int, seconds: float, iters: int) -> bool:
    b = run.budget
    return (
        steps >= b.env_steps
        or (b.minutes is not None and seconds >= 60 * b.minutes)
        or (b.iterations is not None and iters >= b.iterations)
    )


def _progress(run: RunConfig, initial: int = 0):
    if not run.progress:
        return None
    from tqdm import tqdm

    return tqdm(
        total=run.budget.env_steps,
        initial=initial,
        unit="step",
        unit_scale=True,
        dynamic_ncols=True,
    )


def _write_outputs(
    run_dir: Path, jsonl: Path, summary: Summary, timeline: Timeline, tracker: Tracker
) -> None:
    """Everything the run produced, to disk and to the tracker; survives a failed run."""
    curve_path = run_dir / "metrics.csv"
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    if rows:
        keys = sorted({k for r in rows for k in r})
        with curve_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
    trace = timeline.write_chrome_trace(run_dir / "timeline.json")
    spath = run_dir / "summary.json"
    spath.write_text(json.dumps(asdict(summary), indent=2))
    try:
        final = {
            "summary/throughput_e2e": summary.throughput_e2e,
            "summary/throughput_overall": summary.throughput_overall,
            "summary/overhead_frac": summary.overhead_frac,
            "summary/wall_s": summary.wall_s,
        }
        if not math.isnan(summary.success_rate):
            final["summary/success_rate"] = summary.success_rate
        if summary.eval_success_rate is not None:
            final["summary/eval_success_rate"] = summary.eval_success_rate
            # the Wilson interval of the rate counts them (analysis.tables.TRIALS)
            final["summary/eval_episodes"] = summary.eval_episodes
        tracker.log_metrics(final, step=summary.env_steps)
        # the run's own files, and the resource manager's (its shape search, profile, split and
        # reallocations)
        own = ("shape.json", "resources.json", "profile.json", "reallocations.jsonl")
        own += ("placement.txt", "utilisation.csv")
        for p in (
            run_dir / "config.yaml",
            spath,
            trace,
            curve_path,
            run_dir / "eval_curve.csv",
            *(run_dir / f for f in own),
        ):
            if p.exists():
                tracker.log_artifact(p)
        for p, folder in _artifact_folders(run_dir):
            tracker.log_artifact(p, folder)
    finally:
        tracker.finish(summary.status)


#: folders of a run folder uploaded as they are: the step ledger (every attempt's counts) and
#: Hydra's record of the job (its config, overrides and log)
ARTIFACT_FOLDERS = (ledger.LEDGER, ".hydra")


def _artifact_folders(run_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, its folder relative to the run folder) of every file in :data:`ARTIFACT_FOLDERS`,
    and Hydra's job log (``<run_dir>/*.log``, at the top)."""
    out: list[tuple[Path, str | None]] = []
    for name in ARTIFACT_FOLDERS:
        root = run_dir / name
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.is_file())
            out += [(p, p.parent.relative_to(run_dir).as_posix()) for p in files]
    return out + [(p, None) for p in sorted(run_dir.glob("*.log")) if p.is_file()]


# --- entry point ------------------------------------------------------------------------------
register()


def check_override_order(overrides: list[str]) -> None:
    """Refuse a job whose ``+axis/...`` config comes before its ``+sweep=...``.

    Appended configs merge in command-line order, so such an axis is merged before the sweep,
    and the sweep's experiment silently wins wherever both set a key (GRPO's algorithm, a scale
    point's envs). Hydra's basic sweeper puts a sweep file's own ``hydra.sweeper.params`` first,
    so ``python -m ebrl.train +sweep=<name>`` over an ``+axis`` sweep lands here;
    ``python -m ebrl.launch`` puts the axes after the sweep.
    """
    sweep = next((i for i, o in enumerate(overrides) if o.startswith("+sweep=")), None)
    early = [o for o in overrides[:sweep] if o.startswith("+axis/")] if sweep else []
    if early:
        raise ConfigError(
            f"{', '.join(early)} comes before +sweep={overrides[sweep].split('=', 1)[1]}: the "
            "sweep's experiment would override the axis's settings. Launch sweeps with "
            "`python -m ebrl.launch <sweep> [overrides]` (or `make sweep SWEEP=<sweep>`), which "
            "puts the axes after the sweep; for one job put +sweep=... first."
        )


def _task_overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not under Hydra
        return []


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    # Ray (2.60) turns token authentication on for a private instance when RAY_AUTH_MODE is
    # unset, and warns that it did at every start; saying so here (as the Slurm cluster's
    # nodes do, ebrl.runtime.slurm_cluster) keeps that mode without the warning. Only where the
    # run starts Ray itself: a driver joining a cluster takes its mode (the user's RAY_AUTH_*,
    # or Ray's default), and a cluster without tokens refuses one. Ray reads it at import.
    if OmegaConf.select(cfg, "scheduler.ray_address", default="local") == "local":
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    try:
        check_override_order(_task_overrides())
        s = train(cfg)
    except ConfigError as e:  # the user's to fix, and it says how: the message, no traceback
        print(f"ebrl.train: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Preempted as p:
        # everything is saved and the MLflow run is KILLED: let the signal do what it would
        # have done (Submitit requeues on USR2; Slurm sees a job ended by SIGTERM)
        log.warning("%s: stopped; the same command in the same run folder resumes it", p)
        p.redeliver()
    done = (
        f"{s.scheduler} on {s.simulator}: {s.env_steps} env steps in {s.wall_s:.0f} s, "
        f"throughput {s.throughput_e2e:.0f} env steps/s (steady state), "
        f"success rate {s.success_rate:.2f} (training episodes)"
        + (
            f", {s.eval_success_rate:.2f} in {s.eval_episodes} evaluation episodes"
            if s.eval_success_rate is not None
            else ""
        )
        + f"\nrun folder: {s.run_dir}"
    )
    run_log.info("%s", done)
    print(f"\n{done}")


if __name__ == "__main__":
    main()
