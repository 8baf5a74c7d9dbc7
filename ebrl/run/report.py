"""What a run reports: its :class:`Summary`, its MLflow run (:func:`open_tracker`), the step ledger
held against the learner's checkpoint (:func:`account`), and the files it leaves in its run
folder and uploads (:func:`write_outputs`)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ebrl import ledger
from ebrl.config import RunConfig
from ebrl.run.metrics import MetricsFile
from ebrl.run.resume import Progress
from ebrl.stages.train import load_checkpoint
from ebrl.timeline import Timeline
from ebrl.tracking.tracker import MLflowTracker, NullTracker, Tracker, system_metrics_wanted

log = logging.getLogger("ebrl")


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


def open_tracker(
    run: RunConfig,
    summary: Summary,
    cfg: DictConfig,
    resume_id: str | None = None,
    spool: Path | None = None,
) -> Tracker:
    """The run's MLflow run (a resumed attempt's: the same one). Metrics go through ``spool``
    first (``<run_dir>/mlflow_spool.jsonl``), so a tracking server that goes away mid-run costs
    no metric and does not stop training; see :class:`ebrl.tracking.tracker.MLflowTracker`."""
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


def account(
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


def write_outputs(
    run_dir: Path, metrics: MetricsFile, summary: Summary, timeline: Timeline, tracker: Tracker
) -> None:
    """Everything the run produced, to disk and to the tracker; survives a failed run."""
    curve_path = run_dir / "metrics.csv"
    metrics.write_csv(curve_path)
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
