"""The dry run's account of a sweep plan: what ``python -m ebrl.launch --dry-run`` prints.

Per array: the sbatch parameters (partition, time, nodes, GPUs, CPUs, constraint or GRES from the
gpu group, ``--array=0-N%P``, requeue), the ``#SBATCH`` header Submitit would write, the Hydra
command that submits it, and each job's equivalent command with what its scheduler places per
role. Then the sweep's MLflow run, the checkpoints to fetch before submitting, and the jobs that
fail validation. :func:`describe` is the text (also printed before a real launch, and the sweep
run's description in MLflow: :mod:`ebrl.launch.runs`); :func:`as_json` is the same plan as JSON.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict

from ebrl.config import LauncherKind
from ebrl.launch.sweep import PARENT_KEY, SweepPlan, array_out, hydra_command


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
            flags = a.sbatch_flags(f"{array_out(p, a)}/.submitit/%j")
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
