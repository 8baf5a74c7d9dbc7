"""Run a sweep, or preview the Slurm jobs it would submit.

A sweep is a Hydra config in ``conf/sweep/<name>.yaml`` (index: ``sweeps/README.md``): a base
(``/experiment: ...``), ``hydra.sweeper.params`` (the axes) and a launcher. This module expands the
axes exactly as Hydra's basic sweeper does (command-line overrides replace a sweep's axis of the
same key), composes and validates every job against the machine that will run it, and groups the
jobs into one job array per distinct set of sbatch parameters. A multirun submits one array, so a
sweep over GPU types (``--constraint=h100`` / ``a100``) becomes one Hydra multirun per GPU type.

Usage::

    python -m ebrl.launch --dry-run headline_full          # print the sbatch jobs, submit nothing
    python -m ebrl.launch --dry-run headline_full gpu=h100 seed=0,1 --json
    python -m ebrl.launch headline [--out DIR] [overrides]  # run it (here, or on Slurm)

The dry run prints, per array: the sbatch parameters (partition, time, nodes, GPUs, CPUs,
constraint or GRES from the gpu group, ``--array=0-N%P``, requeue), the ``#SBATCH`` header
Submitit would write, the Hydra command that submits it, and each job's equivalent command.
Checkpoints a job's VLA reads that are not there yet are listed once, as what to fetch before
submitting (the rest of each job is checked with them in place; the dry run exits 0); a real
launch refuses them.

In MLflow a launched sweep is one run with a child per job: before any job starts, a run named
after the sweep is created in the experiment the jobs log to (tagged ``run_kind=sweep``, the
sweep, the commit, the command and the output folder; the plan is its description and its
artifacts), and every job gets its id as ``tracking.parent_run_id=<id>`` on the Hydra command line
(so it is in the pickled job Submitit runs, and in a requeued or resumed job; the job's run is
tagged ``mlflow.parentRunId``). The sweep's run ends when its jobs do: FINISHED when every array
succeeded and every child run finished, FAILED otherwise, KILLED when the launcher is stopped
(SIGINT, SIGTERM: passed on to the arrays). A job run by hand has no parent.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ebrl.config import ConfigError, LauncherKind, RunConfig, register, target_machine, validate
from ebrl.hardware import MachineFacts, local_machine
from ebrl.job_gpus import gpu_refusal, roles_line
from ebrl.memory import dry_run_lines as memory_lines

log = logging.getLogger(__name__)
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
#: keys that never change what or where a job runs: jobs differing only in these share a check
_SEED_KEYS = {"seed"}


@dataclass(frozen=True)
class Job:
    """One run of a sweep.

    Attributes:
        index: Hydra's job number (position in the expanded sweep).
        overrides: this job's overrides (``key=value``), the sweep's axes first.
    """

    index: int
    overrides: tuple[str, ...]

    def command(self, sweep: str) -> str:
        """The equivalent single-run command (what Submitit runs for it on the node)."""
        args = ["-m", "ebrl.train", f"+sweep={sweep}", "hydra.mode=RUN", *self.overrides]
        return "python " + " ".join(shlex.quote(a) for a in args)


@dataclass
class JobArray:
    """Jobs that share their launcher parameters: one Slurm job array (or one local multirun).

    Attributes:
        label: the overrides that set this array apart from the others ("" if alone).
        launcher: local, submitit_local or slurm.
        params: Submitit's sbatch parameters (``time``, ``gpus_per_node``, ...); empty for local.
        jobs: the jobs, in sweep order.
    """

    label: str
    launcher: str
    params: dict[str, Any]
    jobs: list[Job] = field(default_factory=list)

    def slug(self) -> str:
        """A folder name for this array's outputs."""
        keep = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in self.label)
        return keep.replace("=", "-") or "all"

    def sbatch_flags(self, folder: str = "<folder>") -> list[str]:
        """The ``#SBATCH`` flags of the array's script (``--array=0-N%P`` included)."""
        if self.launcher != LauncherKind.slurm:
            return []
        return [
            line.removeprefix("#SBATCH ")
            for line in self.sbatch_script(folder).splitlines()
            if line.startswith("#SBATCH ")
        ]

    def sbatch_script(self, folder: str) -> str:
        """The sbatch script Submitit would write for this array (Submitit's own formatter)."""
        from submitit.slurm.slurm import _make_sbatch_string  # private, stable across 1.x

        command = f"{sys.executable} -u -m submitit.core._submit {folder}"
        return _make_sbatch_string(
            command=command, folder=folder, map_count=len(self.jobs), **self.params
        )


@dataclass(frozen=True)
class Fetch:
    """A checkpoint a job's VLA reads that is not there yet (not given, a hub id, or absent
    where the paths are known): fetched before submitting, since jobs never download.

    Attributes:
        hub: the hub id it is downloaded from.
        policy: the policy option that reads it.
        key: its ``policy.model_cfg`` key.
    """

    hub: str
    policy: str
    key: str

    def command(self) -> str:
        """What fetches it (where there is internet)."""
        if "/" not in self.hub:  # not a hub id (LoRA adapters of the user's own)
            return f"policy.model_cfg.{self.key}=<a local directory>"
        tail = self.hub.rstrip("/").rsplit("/", 1)[-1]
        return f"huggingface-cli download {self.hub} --local-dir $EBRL_CHECKPOINTS/{tail}"


@dataclass
class SweepPlan:
    """What a sweep would run: its arrays and the jobs that fail validation."""

    sweep: str
    overrides: list[str]
    out: str
    arrays: list[JobArray]
    #: (job, message) for every job validate() refuses
    errors: list[tuple[Job, str]] = field(default_factory=list)
    #: the MLflow stores the jobs log to: (tracking uri or None, local store folder, experiment)
    stores: set[tuple[str | None, str, str]] = field(default_factory=set)
    #: job index -> what its scheduler places per role (:func:`roles_line`)
    roles: dict[int, str] = field(default_factory=dict)
    #: job index -> the MLflow store it logs to (one of ``stores``)
    job_stores: dict[int, tuple[str | None, str, str]] = field(default_factory=dict)
    #: checkpoint -> the jobs that read it, for the checkpoints to fetch before submitting
    fetch: dict[Fetch, list[int]] = field(default_factory=dict)

    @property
    def n_jobs(self) -> int:
        return sum(len(a.jobs) for a in self.arrays)


# --- composing --------------------------------------------------------------------------------
def _compose(overrides: list[str]) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def sweep_names() -> list[str]:
    """Every sweep in ``conf/sweep/``."""
    return sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))


def expand(sweep: str, overrides: list[str]) -> tuple[DictConfig, list[list[str]]]:
    """The sweep's base config and every job's overrides, as Hydra's basic sweeper makes them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if sweep not in sweep_names():
        raise SystemExit(f"no sweep {sweep!r}; one of: {', '.join(sweep_names())}")
    base = _compose([f"+sweep={sweep}", *(o for o in overrides if not _is_sweep(o))])
    params = base.hydra.sweeper.get("params") or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(overrides)
    parsed = OverridesParser.create().parse_overrides(lines)
    (jobs,) = BasicSweeper.split_arguments(parsed, None)
    return base, jobs


def _is_sweep(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (o,) = OverridesParser.create().parse_overrides([override])
    return o.is_sweep_override()


def _key(override: str) -> str:
    return override.split("=", 1)[0]


def submitit_params(launcher: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(launcher kind, Submitit sbatch parameters) from a resolved ``hydra.launcher`` node.

    Follows hydra-submitit-launcher's mapping (its BaseQueueConf keys are Submitit's generic
    parameters, renamed as SlurmExecutor does; the rest are Slurm parameters as they are).
    """
    target = str(launcher.get("_target_", ""))
    if target.endswith("SlurmLauncher"):
        kind = LauncherKind.slurm.value
    elif target.endswith("submitit_launcher.LocalLauncher"):
        kind = LauncherKind.submitit_local.value
    else:
        return LauncherKind.local.value, {}
    if kind != LauncherKind.slurm:
        return kind, {}
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from submitit.slurm.slurm import SlurmExecutor, _convert_mem

    generic = set(OmegaConf.structured(BaseQueueConf).keys())
    rename = SlurmExecutor._equivalence_dict()
    out: dict[str, Any] = {}
    for k, v in launcher.items():
        if k in ("_target_", "submitit_folder", "max_num_timeout") or v is None:
            continue
        if k in generic:
            v = _convert_mem(v) if k == "mem_gb" else v
            k = rename.get(k, k)
        out[k] = v
    return kind, out


#: (launcher kind, sbatch params, validation error or None, MLflow store or None)
_Checked = tuple[
    str,
    dict[str, Any],
    str | None,
    tuple[str | None, str, str] | None,
    str | None,
    tuple[Fetch, ...],
]


def plan(sweep: str, overrides: list[str], out: str | None = None) -> SweepPlan:
    """Expand, compose and validate every job of ``sweep``; group the jobs into arrays."""
    register()
    base, job_lists = expand(sweep, overrides)
    default_out = str(base.hydra.sweep.dir)
    arrays: dict[tuple[str, str], JobArray] = {}
    errors: list[tuple[Job, str]] = []
    checked: dict[tuple[str, ...], _Checked] = {}
    role_lines: dict[int, str] = {}
    stores: set[tuple[str | None, str, str]] = set()
    job_stores: dict[int, tuple[str | None, str, str]] = {}
    fetch: dict[Fetch, list[int]] = {}
    once = _Once()  # validate() warns per job; a sweep checks hundreds
    logging.getLogger("ebrl.config").addFilter(once)
    try:
        for ovs in job_lists:
            key = tuple(o for o in ovs if _key(o) not in _SEED_KEYS)
            if key not in checked:
                checked[key] = _check_job(sweep, list(ovs))
    finally:
        logging.getLogger("ebrl.config").removeFilter(once)
    for i, ovs in enumerate(job_lists):
        job = Job(index=i, overrides=tuple(ovs))
        key = tuple(o for o in ovs if _key(o) not in _SEED_KEYS)
        kind, params, error, store, roles, missing = checked[key]
        for f in missing if error is None else ():
            fetch.setdefault(f, []).append(i)
        if store is not None:
            stores.add(store)
            job_stores[i] = store
        if error is not None:
            errors.append((job, error))
            continue
        group = (kind, json.dumps(params, sort_keys=True, default=str))
        arrays.setdefault(group, JobArray(label="", launcher=kind, params=params)).jobs.append(job)
        if roles is not None:
            role_lines[i] = roles
    out_dir = str(Path(out or default_out).resolve())
    result = SweepPlan(
        sweep,
        list(overrides),
        out_dir,
        list(arrays.values()),
        errors,
        stores,
        role_lines,
        job_stores,
        fetch,
    )
    _label(result)
    return result


def _check_job(sweep: str, overrides: list[str]) -> _Checked:
    """Compose and validate one job against the machine that will run it."""
    try:
        cfg = _compose([f"+sweep={sweep}", *overrides])
    except Exception as e:  # a group option that does not exist, a wrong key
        return LauncherKind.local.value, {}, f"does not compose: {e}", None, None, ()
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    kind, params = submitit_params(launcher)  # type: ignore[arg-type]
    tr = cfg.tracking
    store = (tr.uri, str(tr.store), str(tr.experiment)) if tr.enabled else None
    job = copy.deepcopy(cfg)  # the job's own config: without the hydra node, as @hydra.main has it
    with read_write(job), open_dict(job):
        del job["hydra"]
    from ebrl.config import class_of

    # a scheduler class may check its jobs itself (real RLinf: for the node, and translated)
    hook = getattr(class_of(OmegaConf.get_type(job, "scheduler")), "dry_run_check", None)
    own = hook(job, on_slurm=kind == LauncherKind.slurm) if hook else contextlib.nullcontext()
    try:
        with own:
            run: RunConfig = OmegaConf.to_object(job)  # type: ignore[assignment]
            machine = local_machine() if kind != LauncherKind.slurm else target_machine(run)
            missing, machine = _stand_in_checkpoints(job, machine)
            validate(job, machine=machine)
    except ConfigError as e:
        return kind, params, str(e), store, None, ()
    except Exception as e:  # a node's own check (e.g. in __post_init__)
        return kind, params, f"{type(e).__name__}: {e}", store, None, ()
    plain: dict = OmegaConf.to_container(job, resolve=True)  # type: ignore[assignment]
    # an RLinf job's own line (its translation); else the roles and each role's memory
    roles = getattr(own, "line", None)
    if roles is None:
        if (refusal := gpu_refusal(plain)) is not None:
            return kind, params, refusal, store, None, ()
        roles = roles_line(plain) + memory_lines(plain)
    return kind, params, None, store, roles, missing


class _Once(logging.Filter):
    """Lets each distinct message through once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        new = msg not in self.seen
        self.seen.add(msg)
        return new


class SubmititRepeats(logging.Filter):
    """Says Submitit's "Bypassing sacct error" once per process, in one line, and counts the rest.

    Where Slurm keeps no accounting (``sacct`` exits 1, as on a single-node Slurm without
    slurmdbd) Submitit warns on every poll of every job, and each warning goes out three times:
    through Submitit's stdout and stderr handlers and through the root logger's. The first is
    logged once, by this module's logger, saying that later ones are not shown; Submitit's own
    records of it are dropped and counted (``dropped``). Submitit still finishes: it reads the
    jobs' result files.
    """

    MARK = "Bypassing sacct error"

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self._said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.MARK not in record.getMessage():
            return True
        if self._said:
            self.dropped += 1
            return False
        self._said = True
        log.warning(
            "Submitit: %s (it says so on every poll where Slurm keeps no accounting; later "
            "repeats are not shown)",
            record.getMessage(),
        )
        return False


def quiet_submitit_repeats() -> SubmititRepeats:
    """Install :class:`SubmititRepeats` on Submitit's logger (once per process); returns it."""
    logger = logging.getLogger("submitit")
    for f in logger.filters:
        if isinstance(f, SubmititRepeats):
            return f
    f = SubmititRepeats()
    logger.addFilter(f)
    return f


def _stand_in_checkpoints(
    job: DictConfig, machine: MachineFacts
) -> tuple[tuple[Fetch, ...], MachineFacts]:
    """The checkpoints ``job``'s VLA reads that are not there, each replaced in ``job`` by a
    stand-in path, and the machine that takes those paths as present: validate() then checks
    everything else about the job, and a preview lists what to fetch once, not as an error
    per job."""
    from ebrl.external import checkpoint_problem, local_dirs

    pol = job.get("policy")
    if not isinstance(pol, DictConfig) or "checkpoint" not in pol:
        return (), machine
    real = machine.path_exists
    stand_ins: set[str] = set()

    def exists(path: str) -> bool:
        return path in stand_ins or (real is not None and real(path))

    dirs = local_dirs(pol)
    missing: list[Fetch] = []
    with open_dict(pol):
        for _ in dirs:
            problem = checkpoint_problem(pol, exists if real is not None else None)
            if problem is None:
                break
            key = next(
                (k for k in dirs if any(f"policy.model_cfg.{k}{c}" in problem for c in " =")),
                None,
            )
            if key is None:  # not a checkpoint's absence: validate() reports it
                break
            stand_in = f"<{dirs[key]}, to fetch>"
            stand_ins.add(stand_in)
            pol.model_cfg[key] = stand_in
            missing.append(Fetch(dirs[key], str(pol.get("name", "?")), key))
    if real is not None and missing:
        machine = dataclasses.replace(machine, path_exists=exists)
    return tuple(missing), machine


def prepare_stores(p: SweepPlan) -> None:
    """Create each MLflow store and experiment before jobs start side by side: the first writers
    of an empty sqlite store race on its schema migration, and two creators of one experiment
    collide."""
    from mlflow.tracking import MlflowClient

    from ebrl.tracking import local_store_uri

    for uri, store, experiment in sorted(p.stores, key=str):
        artifact_root = None
        if uri is None:
            uri, artifact_root = local_store_uri(store)
        client = MlflowClient(tracking_uri=uri)
        if client.get_experiment_by_name(experiment) is None:
            client.create_experiment(experiment, artifact_location=artifact_root)


def _label(p: SweepPlan) -> None:
    """Name each array by what sets it apart; refuse arrays that are not a grid of the axes
    (:func:`axes_of` gives Hydra each array as a grid)."""
    values: dict[str, list[str]] = {}
    for a in p.arrays:
        for j in a.jobs:
            for o in j.overrides:
                vals = values.setdefault(_key(o), [])
                if o.split("=", 1)[1] not in vals:
                    vals.append(o.split("=", 1)[1])
    varying = [k for k, v in values.items() if len(v) > 1]
    for a in p.arrays:
        mine: dict[str, list[str]] = {k: [] for k in varying}
        for j in a.jobs:
            for o in j.overrides:
                k, v = o.split("=", 1)
                if k in mine and v not in mine[k]:
                    mine[k].append(v)
        if len(p.arrays) > 1:
            a.label = " ".join(f"{k}={v[0]}" for k, v in mine.items() if len(v) == 1)
            combos = 1
            for v in mine.values():
                combos *= len(v)
            if combos != len(a.jobs):  # not a rectangle: Hydra could not select exactly these
                raise SystemExit(
                    f"sweep {p.sweep}: the jobs of array {a.label or '?'} are not a grid of the "
                    "sweep's axes; split the sweep (narrow it with overrides) and launch each part"
                )


# --- output -----------------------------------------------------------------------------------
def _array_out(p: SweepPlan, a: JobArray) -> str:
    return p.out if len(p.arrays) == 1 else f"{p.out}/{a.slug()}"


def axes_of(a: JobArray) -> list[str]:
    """Array ``a``'s jobs as one override per key (``key=v1,v2,...``), keys and values in sweep
    order: the grid that expands to exactly these jobs, in this order."""
    values: dict[str, list[str]] = {}
    for j in a.jobs:
        for o in j.overrides:
            k, v = o.split("=", 1)
            vals = values.setdefault(k, [])
            if v not in vals:
                vals.append(v)
    return [f"{k}={','.join(v)}" for k, v in values.items()]


def hydra_command(p: SweepPlan, a: JobArray, parent: str | None = None) -> list[str]:
    """The Hydra multirun that runs (or submits) array ``a``; with ``parent``, every job's MLflow
    run is a child of that run (the sweep's: :func:`start_sweep_runs`).

    Every axis goes on the command line after ``+sweep=``, and the sweep's own
    ``hydra.sweeper.params`` are cleared: Hydra's basic sweeper puts those params *before* the
    command line, so an axis that appends a config (``+axis/algo=grpo_g4``) would be merged
    before the sweep and lose to the sweep's experiment wherever both set a key (the
    experiment's ``override /algo: ppo``, the cluster's ``num_envs``). After ``+sweep=`` each job
    composes exactly as :func:`plan` checked it and as :meth:`Job.command` runs it.
    """
    out = _array_out(p, a)
    return [
        sys.executable,
        "-m",
        "ebrl.train",
        f"+sweep={p.sweep}",
        "hydra.sweeper.params=null",
        *axes_of(a),
        f"hydra.sweep.dir={out}",
        *([f"{PARENT_KEY}={parent}"] if parent else []),
    ]


def describe(p: SweepPlan, *, dry_run: bool) -> str:
    """A human-readable account of the plan."""
    n_slurm = sum(a.launcher == LauncherKind.slurm for a in p.arrays)
    lines = [
        f"sweep {p.sweep}: {p.n_jobs} jobs in {len(p.arrays)} "
        + (
            "Slurm job array(s)"
            if n_slurm or not p.arrays
            else f"local multirun(s) ({p.arrays[0].launcher})"
        )
        + (" -- dry run, nothing submitted" if dry_run else "")
        + f"; outputs under {p.out}"
    ]
    for n, a in enumerate(p.arrays, 1):
        title = f"{a.label or 'all jobs'} ({len(a.jobs)} jobs)"
        lines += ["", f"== array {n}/{len(p.arrays)}: {title}"]
        if a.launcher == LauncherKind.slurm:
            flags = a.sbatch_flags(f"{_array_out(p, a)}/.submitit/%j")
            lines += ["sbatch parameters:"] + [f"  #SBATCH {f}" for f in flags]
            lines += ["  (then srun runs each job: python -u -m submitit.core._submit <folder>)"]
            tasks = int(a.params.get("nodes") or 1) * int(a.params.get("ntasks_per_node") or 1)
            if tasks > 1:  # ebrl's SlurmLauncher: a Ray node per task (ebrl.runtime.slurm_cluster)
                lines += [
                    f"  ({tasks} tasks per job: for a scheduler on Ray, a Ray cluster of one node "
                    "per task, task 0 its head and driver; see each job's line)"
                ]
        else:
            lines += [f"runs on this machine ({a.launcher} launcher): no Slurm job"]
        verb = "submit" if a.launcher == LauncherKind.slurm else "run"
        lines += [f"{verb} with: python " + shlex.join(hydra_command(p, a)[1:])]
        lines += ["jobs:"]
        for j in a.jobs:
            lines += [f"  [{j.index}] {j.command(p.sweep)}"]
            if j.index in p.roles:
                lines += [f"      {p.roles[j.index]}"]
    for uri, store, experiment in sorted(p.stores, key=str):
        where = uri or f"the local store {store}"
        lines += [
            "",
            f"MLflow: the sweep's own run {p.sweep!r} in experiment {experiment!r} at {where} "
            + ("will be" if dry_run else "is")
            + f" the parent of its jobs' runs ({PARENT_KEY}=<its id> on each array's command)",
        ]
    if n_slurm and any(uri is None for uri, _, _ in p.stores):
        lines += [
            "",
            "note: the jobs log to a local sqlite MLflow store; from several nodes prefer an "
            "MLflow server on the shared network: tracking.uri=http://<host>:5000",
        ]
    if p.fetch:
        lines += [
            "",
            f"{len(p.fetch)} checkpoint(s) to fetch before submitting (jobs never download; "
            "each job was checked with them in place):",
        ]
        for f, jobs in p.fetch.items():
            lines += [f"  {f.hub} (policy={f.policy}, {len(jobs)} jobs): {f.command()}"]
        lines += [
            "  then set EBRL_CHECKPOINTS to the folder that holds them (where the jobs can read "
            "it), or give policy.model_cfg.model_path=<directory>"
        ]
    if p.errors:
        lines += ["", f"{len(p.errors)} job(s) fail validation (fix before launching):"]
        lines += [f"  [{j.index}] {' '.join(j.overrides)}: {msg}" for j, msg in p.errors]
    return "\n".join(lines)


def as_json(p: SweepPlan) -> str:
    """The plan as JSON (arrays with their sbatch flags and jobs; errors)."""
    return json.dumps(
        {
            "sweep": p.sweep,
            "out": p.out,
            "n_jobs": p.n_jobs,
            "arrays": [
                {
                    **{k: v for k, v in asdict(a).items() if k != "jobs"},
                    "sbatch": a.sbatch_flags(),
                    "command": hydra_command(p, a)[1:],
                    "jobs": [{"index": j.index, "overrides": list(j.overrides)} for j in a.jobs],
                }
                for a in p.arrays
            ],
            "errors": [
                {"index": j.index, "overrides": list(j.overrides), "error": m} for j, m in p.errors
            ],
            "checkpoints_to_fetch": [
                {**asdict(f), "command": f.command(), "jobs": jobs} for f, jobs in p.fetch.items()
            ],
        },
        indent=2,
        default=str,
    )


# --- the sweep's own MLflow run ------------------------------------------------------------------
#: the override that makes a job's run a child of the sweep's (``TrackingConfig.parent_run_id``)
PARENT_KEY = "tracking.parent_run_id"
#: the tag that marks a sweep's own run (``analysis.export`` leaves such runs out)
SWEEP_RUN_TAG = ("run_kind", "sweep")
Store = tuple[str | None, str, str]


def _client(store: Store) -> tuple[Any, str]:
    """(MlflowClient, experiment id) of a plan's store, the experiment created if missing."""
    from mlflow.tracking import MlflowClient

    from ebrl.tracking import _experiment_id, local_store_uri

    uri, folder, experiment = store
    artifact_root = None
    if uri is None:
        uri, artifact_root = local_store_uri(folder)
    client = MlflowClient(tracking_uri=uri)
    return client, _experiment_id(client, experiment, artifact_root)


def start_sweep_runs(p: SweepPlan, command: str) -> dict[Store, str]:
    """Create the sweep's run in every store and experiment its jobs log to (one, unless the
    experiment is itself an axis); returns store -> run id.

    The run is named after the sweep and tagged with it, ``run_kind=sweep``, the commit, the
    command, the machine it was launched from and the output folder; the plan (what
    ``--dry-run`` prints) is its description in the UI and, with its JSON, its artifacts.
    """
    import tempfile

    from mlflow.entities import Param

    from ebrl.tracking import git_commit, machine, portable

    text = portable(describe(p, dry_run=False))
    out: dict[Store, str] = {}
    for store in sorted(p.stores, key=str):
        client, exp_id = _client(store)
        jobs = sum(1 for s in p.job_stores.values() if s == store)
        note = f"Sweep `{p.sweep}`: `{portable(command)}`\n\n```\n{text}\n```"
        tags = {
            SWEEP_RUN_TAG[0]: SWEEP_RUN_TAG[1],
            "sweep": p.sweep,
            "git_commit": git_commit(),
            "command": portable(command),
            "machine": machine(),
            "sweep_dir": portable(p.out),
            "mlflow.note.content": note,
        }
        run_id = client.create_run(exp_id, run_name=p.sweep, tags=tags).info.run_id
        params = {"sweep": p.sweep, "jobs": jobs, "arrays": len(p.arrays)}
        params["overrides"] = " ".join(p.overrides) or "-"
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        with tempfile.TemporaryDirectory() as tmp:
            for name, body in (("sweep_plan.txt", text), ("sweep_plan.json", as_json(p))):
                path = Path(tmp) / name
                path.write_text(portable(body) + "\n")
                client.log_artifact(run_id, str(path))
        out[store] = run_id
    return out


def array_parent(p: SweepPlan, a: JobArray, parents: dict[Store, str]) -> str | None:
    """The sweep run array ``a``'s jobs are children of: the run of the store they all log to
    (None when they log to several, or tracking is off)."""
    stores = {p.job_stores.get(j.index) for j in a.jobs}
    if len(stores) != 1:
        print(
            f"note: the jobs of array {a.label or 'all jobs'} log to {len(stores)} MLflow "
            "experiments: their runs get no parent run",
            file=sys.stderr,
        )
        return None
    (store,) = stores
    return parents.get(store) if store is not None else None


def end_sweep_runs(p: SweepPlan, parents: dict[Store, str], codes: list[int], killed: bool) -> None:
    """End each sweep run with its jobs: KILLED when the launcher was stopped; FAILED when an
    array failed or a child run did not finish; else FINISHED. Its metrics count the child runs
    by status (``sweep/runs_finished``...) against the jobs planned (``sweep/jobs``)."""
    from mlflow.entities import Metric

    from ebrl.tracking import _bounded_http

    for store, run_id in parents.items():
        try:
            with _bounded_http(10.0, retries=2):
                client, exp_id = _client(store)
                children = client.search_runs(
                    [exp_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
                )
                counts: dict[str, int] = {}
                for r in children:
                    counts[r.info.status] = counts.get(r.info.status, 0) + 1
                jobs = sum(1 for s in p.job_stores.values() if s == store)
                finished = counts.get("FINISHED", 0)
                if killed:
                    status = "KILLED"
                elif any(codes) or finished < len(children):
                    status = "FAILED"
                else:
                    status = "FINISHED"
                values = {"sweep/jobs": jobs, "sweep/runs": len(children)}
                values |= {f"sweep/runs_{k.lower()}": v for k, v in counts.items()}
                ts = int(time.time() * 1000)
                metrics = [Metric(k, float(v), ts, 0) for k, v in values.items()]
                client.log_batch(run_id, metrics=metrics)
                client.set_terminated(run_id, status=status)
        except Exception as e:  # the store is gone: the run stays RUNNING there; say so
            print(
                f"MLflow: the sweep's run {run_id} was not ended ({type(e).__name__}: {e}); it "
                "stays RUNNING in the UI",
                file=sys.stderr,
            )
            continue
        print(
            f"MLflow: sweep run {run_id} {status}: {finished} of {jobs} job runs finished",
            flush=True,
        )


def _run_arrays(p: SweepPlan, parents: dict[Store, str]) -> list[int]:
    """Start every array's Hydra multirun and wait for them all; SIGTERM, like Ctrl-C, is
    passed on to them and ends the wait with KeyboardInterrupt."""
    procs = [subprocess.Popen(hydra_command(p, a, array_parent(p, a, parents))) for a in p.arrays]

    def on_term(signum: int, frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return [proc.wait() for proc in procs]
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- entry point ------------------------------------------------------------------------------
#: ``--help``'s examples: a small sweep on each launcher (docs/launchers.md)
EXAMPLES = """\
examples (smoke: sync and EBRL on a counting env, 3 updates; seed=0 keeps 2 of its 6 runs):
  python -m ebrl.launch smoke seed=0                          # local: one run after another, here
  python -m ebrl.launch smoke seed=0 launcher=submitit_local  # Submitit processes, here
  python -m ebrl.launch --dry-run smoke launcher=slurm        # the Slurm job array, not submitted
  python -m ebrl.launch smoke launcher=slurm launcher.partition=debug launcher.time_min=10
                                                              # on a login node: submit it
  python -m ebrl.launch --dry-run headline_full               # a full-size sweep's jobs
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the examples keep their lines
        epilog=EXAMPLES + f"\nsweeps: {', '.join(sweep_names())}",
    )
    ap.add_argument("sweep", help="a sweep in conf/sweep/ (e.g. smoke, headline, headline_full)")
    ap.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides; an axis given here replaces the sweep's (seed=0); "
        "launcher=local|submitit_local|slurm picks where the jobs run",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the jobs, run/submit nothing")
    ap.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    ap.add_argument("--out", help="sweep output folder (default: the sweep's hydra.sweep.dir)")
    # intermixed: the make targets put --out between the sweep and the overrides
    args = ap.parse_intermixed_args(argv)
    p = plan(args.sweep, args.overrides, args.out)
    if args.dry_run:
        try:
            print(as_json(p) if args.json else describe(p, dry_run=True), flush=True)
        except BrokenPipeError:  # piped into `head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1 if p.errors else 0
    print(describe(p, dry_run=False), flush=True)
    if p.errors:
        print("not launched: fix the jobs above first", file=sys.stderr)
        return 1
    if p.fetch:
        print("not launched: fetch the checkpoints above first", file=sys.stderr)
        return 1
    if any(a.launcher != LauncherKind.local for a in p.arrays):
        prepare_stores(p)  # jobs run side by side
    command = "python -m ebrl.launch " + shlex.join(argv if argv is not None else sys.argv[1:])
    parents = start_sweep_runs(p, command)
    for store, run_id in parents.items():
        print(f"MLflow: sweep run {run_id} in experiment {store[2]!r}", flush=True)
    codes: list[int] = []
    killed = True  # until the arrays' wait returns
    try:
        codes = _run_arrays(p, parents)
        killed = False
    finally:
        end_sweep_runs(p, parents, codes, killed)
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
