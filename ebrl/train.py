"""``train(cfg)``: build the stages from a config, let the scheduler drive them, log everything.

Entry points: ``python -m ebrl.train [overrides]`` and the ``ebrl-train`` console script (Hydra).
Each run writes into its run folder: ``config.yaml`` (resolved), ``metrics.csv`` (one row per
update), ``timeline.json`` (Chrome trace) and ``summary.json``; the same go to MLflow.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import time
from dataclasses import replace
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
from ebrl.run.evaluation import evaluate_after_training
from ebrl.run.metrics import MetricsFile, RunMeter, budget_spent
from ebrl.run.report import Summary, account, open_tracker, write_outputs
from ebrl.run.resume import config_hash, resume
from ebrl.schedulers.base import RunContext, UpdateBudget
from ebrl.signals import Preempted, StopSignals
from ebrl.stages.factory import StageFactory
from ebrl.timeline import Timeline
from ebrl.tracking.provenance import git_commit, machine, portable
from ebrl.utilisation import UtilisationSampler

log = logging.getLogger("ebrl")
#: the run's log file only (Hydra's job log, ``train.log``): the run's start, a line per update
#: and its end; the console shows the progress bar instead
run_log = logging.getLogger("ebrl.run")
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


# --- the run ----------------------------------------------------------------------------------
def train(cfg: DictConfig) -> Summary:
    """Run one training job described by a composed config; returns its summary.

    Resumes by itself when its run folder holds a checkpoint and ``progress.json`` from an
    earlier, interrupted attempt (``checkpoint.resume``): the learner and generator start from the
    saved weights, and metrics continue in the same MLflow run, from the saved step on.
    """
    # the run: its config, its folder, its summary
    run = validate(cfg)
    if run.init_checkpoint:  # every worker loads it, wherever it runs: an absolute path
        cfg.init_checkpoint = str(Path(run.init_checkpoint).resolve())
    _refuse_unwired_resources(run)
    run_dir = _run_dir(run)
    (run_dir / "config.yaml").write_text(portable(OmegaConf.to_yaml(cfg, resolve=True)))
    summary = _summary(cfg, run, run_dir)
    ckpt_path, prog_path = run_dir / "checkpoint.pt", run_dir / "progress.json"
    snap_dir, metrics_file = run_dir / "snapshots", MetricsFile(run_dir / "metrics.jsonl")
    _to_log_file(run_log)
    run_log.info(
        "run folder %s: %s on %s, policy %s, budget %d env steps",
        run_dir,
        summary.scheduler,
        summary.simulator,
        summary.policy,
        run.budget.env_steps,
    )

    # where this attempt starts
    prog, start_version, unlogged = resume(run, run_dir, config_hash(cfg))
    np.random.seed(run.seed + prog.iterations)
    torch.manual_seed(run.seed + prog.iterations)

    # the stages, the scheduler that drives them, the MLflow run
    timeline = Timeline()
    ctx = _context(cfg, run, run_dir, start_version, timeline)
    scheduler = _scheduler(cfg, ctx)
    if prog.iterations == 0 and snap_dir.exists():  # a fresh start: no earlier run's weights
        shutil.rmtree(snap_dir)
    summary.implementation = getattr(scheduler, "implementation", "ebrl")
    spool = run_dir / "mlflow_spool.jsonl"
    tracker = open_tracker(run, summary, cfg, resume_id=prog.mlflow_run_id, spool=spool)
    prog.mlflow_run_id = tracker.run_id
    if unlogged:
        tracker.log_metrics({"fault/unlogged_updates": float(unlogged)}, step=prog.env_steps)

    # the loop: one report per update, logged, saved and shown as it arrives
    meter = RunMeter(summary, prog, run.warmup_iters, timeline)
    bar = _progress(run, prog.env_steps)
    reports = scheduler.run(ctx)
    sampler = _sampler(run, run_dir, timeline)
    stop = StopSignals()
    with stop:
        try:
            # a requeued job whose budget was already spent (a late USR2, a second requeue)
            # starts no workers: it only finishes
            for rep in () if budget_spent(run, *prog.spent()) else reports:
                metrics = meter.update(rep)
                it = summary.iterations - 1  # this update's index in the run
                with stop.deferred():  # the update is recorded everywhere, or nowhere new
                    if rep.params and prog.iterations == 0:  # params are immutable: 1st attempt
                        tracker.log_params({k: str(v) for k, v in rep.params.items()})
                    tracker.log_metrics(metrics, step=summary.env_steps)
                    metrics_file.append(it, metrics)
                    meter.progress(prog).save(prog_path)
                _show_update(bar, it, rep.env_steps, metrics, meter.success)
                if meter.spent(run):
                    break
            reports.close()  # stop the stages (and their CPU use) before evaluating
            evaluate_after_training(
                run, ctx.factory, ckpt_path, snap_dir, metrics_file, summary, tracker
            )
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
            reports.close()
            if bar is not None:
                bar.close()
            meter.finish()
            if sampler is not None:
                sampler.stop()
            account(run_dir, ckpt_path, start_version, summary, prog, tracker)
            write_outputs(run_dir, metrics_file, summary, timeline, tracker)
    return summary


def _summary(cfg: DictConfig, run: RunConfig, run_dir: Path) -> Summary:
    """The run's summary before its first update: what it runs, where, from which commit."""
    chosen = run_choices(cfg)
    return Summary(
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


def _context(
    cfg: DictConfig, run: RunConfig, run_dir: Path, start_version: int, timeline: Timeline
) -> RunContext:
    """What the scheduler gets: the stage factory (the learner at ``start_version``, saving
    its checkpoint and snapshots as ``checkpoint.*`` and ``eval.*`` ask), T, G, the timeline,
    the budget and the run folder."""
    factory = replace(StageFactory.from_config(cfg), start_version=start_version)
    if run.checkpoint.every_iters > 0:
        factory = replace(
            factory,
            checkpoint=str(run_dir / "checkpoint.pt"),
            checkpoint_every=run.checkpoint.every_iters,
        )
    if run.eval.every_iters > 0:
        factory = replace(
            factory, snapshots=str(run_dir / "snapshots"), snapshot_every=run.eval.every_iters
        )
    return RunContext(
        factory=factory,
        decisions_per_env=run.decisions_per_env,
        env_groups=run.env_groups,
        timeline=timeline,
        budget=UpdateBudget(updates=run.budget.iterations, env_steps=run.budget.env_steps),
        run_dir=run_dir,
        manage_resources=manages_resources(run.scheduler),
        ledger=ledger.attempt_dir(run_dir, start_version),
    )


def _scheduler(cfg: DictConfig, ctx: RunContext) -> Any:
    """The configured scheduler, checked before anything reports: one that refuses its settings
    (in its constructor, or in ``check(ctx)`` against the run: a baseline's fixed split, its
    loss) leaves no MLflow run behind."""
    scheduler = instantiate(cfg.scheduler)
    if callable(check := getattr(scheduler, "check", None)):
        try:
            check(ctx)
        except ValueError as e:
            raise ConfigError(str(e)) from e
    return scheduler


def _show_update(
    bar: Any, it: int, env_steps: int, metrics: dict[str, Any], success: float | None
) -> None:
    """One update in the run's log (a line) and on the console (the progress bar)."""
    sps = metrics["throughput/env_steps_per_s"]
    shown = "-" if success is None else f"{success:.2f}"
    run_log.info(
        "update %d: %d env steps, %.0f env steps/s, success %s, %.1f s",
        it,
        metrics["env/steps_total"],
        sps,
        shown,
        metrics["time/wall_s"],
    )
    if bar is not None:
        bar.update(env_steps)
        bar.set_postfix(sps=f"{sps:.0f}", success=shown)


def _name(node: DictConfig) -> str:
    """A component's display name: its ``name`` field if it has one, else its class name."""
    return str(node.get("name") or str(node._target_).rsplit(".", 1)[-1])


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
    (``ebrl/schedulers/ebrl/control.py``), its SM quotas by every scheduler on EBRL's workers
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
            check_quotas(gen_gpus, learner_gpus, res.gen_sm_pct, res.train_sm_pct, res.gpu_sharing)
            check_gpu_profile(res.gpu_profile, gen_gpus, learner_gpus)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        expected.update(
            gen_sm_pct=res.gen_sm_pct,
            train_sm_pct=res.train_sm_pct,
            gpu_profile=res.gpu_profile,
            gpu_sharing=res.gpu_sharing,
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
                " (resources.gen_sm_pct / train_sm_pct / gpu_sharing: only the schedulers on "
                "EBRL's workers, "
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
    elif res.profile is not None:
        from ebrl.plan.profile import Profile, ProfileError

        if not Path(res.profile).is_file():
            raise ConfigError(
                f"resources.profile={res.profile}: no such file; give a stage profile (a run's "
                "profile.json, or python -m ebrl.plan.measure --device cpu), or null to profile "
                "at start"
            )
        try:
            prof = Profile.load(res.profile)
        except ProfileError as e:
            raise ConfigError(f"resources.profile={res.profile}: {e}") from e
        if prof.gen.device != "cpu" or prof.train.device != "cpu":
            raise ConfigError(
                f"resources.profile={res.profile}: measured at GPU shares, but it sizes the "
                "CPU thread split; give it as resources.gpu_profile, or measure on the CPU "
                "(python -m ebrl.plan.measure --device cpu)"
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
