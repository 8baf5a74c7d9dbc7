"""A sweep expanded into its jobs, and the jobs grouped into arrays: the plan a launch runs.

:func:`plan` expands a sweep's axes exactly as Hydra's basic sweeper does (command-line overrides
replace a sweep's axis of the same key), checks every distinct job once
(:func:`ebrl.launch.check.check_job`) and groups the jobs that pass into one :class:`JobArray` per
distinct set of sbatch parameters. A multirun submits one array, so a sweep over GPU types
(``--constraint=h100`` / ``a100``) becomes one Hydra multirun per GPU type: :func:`hydra_command`
is that multirun's command line. What the plan looks like printed is :mod:`ebrl.launch.preview`;
running it is :mod:`ebrl.launch.cli`.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ebrl.config import LauncherKind, register
from ebrl.launch.check import CONF_DIR, Checked, Fetch, Store, check_job, compose_config

#: keys that never change what or where a job runs: jobs differing only in these share a check
_SEED_KEYS = {"seed"}
#: the override that makes a job's run a child of the sweep's (``TrackingConfig.parent_run_id``)
PARENT_KEY = "tracking.parent_run_id"


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
    stores: set[Store] = field(default_factory=set)
    #: job index -> what its scheduler places per role (:func:`ebrl.job_gpus.roles_line`)
    roles: dict[int, str] = field(default_factory=dict)
    #: job index -> the MLflow store it logs to (one of ``stores``)
    job_stores: dict[int, Store] = field(default_factory=dict)
    #: checkpoint -> the jobs that read it, for the checkpoints to fetch before submitting
    fetch: dict[Fetch, list[int]] = field(default_factory=dict)

    @property
    def n_jobs(self) -> int:
        return sum(len(a.jobs) for a in self.arrays)


def sweep_names() -> list[str]:
    """Every sweep in ``conf/sweep/``."""
    return sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))


def expand(sweep: str, overrides: list[str]) -> tuple[DictConfig, list[list[str]]]:
    """The sweep's base config and every job's overrides, as Hydra's basic sweeper makes them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if sweep not in sweep_names():
        raise SystemExit(f"no sweep {sweep!r}; one of: {', '.join(sweep_names())}")
    base = compose_config([f"+sweep={sweep}", *(o for o in overrides if not _is_sweep(o))])
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


def plan(sweep: str, overrides: list[str], out: str | None = None) -> SweepPlan:
    """Expand, compose and validate every job of ``sweep``; group the jobs into arrays."""
    register()
    base, job_lists = expand(sweep, overrides)
    default_out = str(base.hydra.sweep.dir)
    arrays: dict[tuple[str, str], JobArray] = {}
    errors: list[tuple[Job, str]] = []
    checked: dict[tuple[str, ...], Checked] = {}
    role_lines: dict[int, str] = {}
    stores: set[Store] = set()
    job_stores: dict[int, Store] = {}
    fetch: dict[Fetch, list[int]] = {}
    once = _Once()  # validate() warns per job; a sweep checks hundreds
    logging.getLogger("ebrl.config").addFilter(once)
    try:
        for ovs in job_lists:
            key = tuple(o for o in ovs if _key(o) not in _SEED_KEYS)
            if key not in checked:
                checked[key] = check_job(sweep, list(ovs))
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


# --- the command that runs an array ------------------------------------------------------------
def array_out(p: SweepPlan, a: JobArray) -> str:
    """Array ``a``'s output folder: the sweep's, or a folder in it per array when there are
    several."""
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
    run is a child of that run (the sweep's: :func:`ebrl.launch.runs.start_sweep_runs`).

    Every axis goes on the command line after ``+sweep=``, and the sweep's own
    ``hydra.sweeper.params`` are cleared: Hydra's basic sweeper puts those params *before* the
    command line, so an axis that appends a config (``+axis/algo=grpo_g4``) would be merged
    before the sweep and lose to the sweep's experiment wherever both set a key (the
    experiment's ``override /algo: ppo``, the cluster's ``num_envs``). After ``+sweep=`` each job
    composes exactly as :func:`plan` checked it and as :meth:`Job.command` runs it.
    """
    out = array_out(p, a)
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
