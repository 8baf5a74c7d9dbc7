"""What Slurm tells one task of a multi-task job, read from its environment.

A job of several Slurm tasks runs the same Submitit job in every task; each task learns who it
is (rank, node, the job's nodes, its CPUs and GPUs) from the variables Slurm and srun set. This
module turns them into a :class:`SlurmTask` (:func:`slurm_task`), a pure function of the
environment. :mod:`ebrl.runtime.slurm_plan` makes the task's Ray node plan from it, and
:mod:`ebrl.runtime.slurm_cluster` runs that plan (its ``ray start`` a
:class:`~ebrl.runtime.ray_node.RayNode`). :class:`ClusterError` and :func:`say` (a line in the
task's log) live here, below all of those modules, for each of them to use.

* **CPUs.** A Ray node gets the CPUs its task may run on (``os.sched_getaffinity``), at most
  the ``SLURM_CPUS_PER_TASK`` Slurm granted: on Slurm 22.05-23.02 an ``srun`` without
  ``--cpus-per-task`` may bind a task to fewer (one, where a node runs several tasks) while the
  variable still says what the job asked for.
* **GPUs.** The entries of ``CUDA_VISIBLE_DEVICES`` (:func:`gpu_count`).
* **Nodes.** The step's node list expanded by ``scontrol show hostnames``
  (:func:`scontrol_hostnames`); task 0 runs on the first.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class ClusterError(RuntimeError):
    """The job's Ray cluster could not be started or joined."""


def say(message: str) -> None:
    """One line in the task's log (Submitit's ``<job>_<task>_log.out``): before Hydra sets up
    logging, and in worker tasks that never run Hydra's job, print is what reaches the file."""
    print(f"ebrl slurm_cluster: {message}", flush=True)


# --- the Slurm environment (pure) -------------------------------------------------------------
@dataclass(frozen=True)
class SlurmTask:
    """What Slurm tells one task of a multi-task job, parsed from its environment.

    Attributes:
        job_id: ``SLURM_JOB_ID`` (unique per array element; unchanged by a requeue).
        procid: ``SLURM_PROCID``, the task's rank; 0 starts the head.
        ntasks: ``SLURM_NTASKS``, the Ray nodes the cluster will have.
        node: ``SLURMD_NODENAME``, the node this task runs on.
        hosts: the step's nodes in order (``scontrol show hostnames``); task 0 runs on the
            first (Slurm's default block distribution).
        cpus: CPUs for this task's Ray node: those it may run on (its CPU affinity), at most
            ``slurm_cpus``.
        gpus: GPUs for this task's Ray node (the entries of ``CUDA_VISIBLE_DEVICES``).
        tmp: the node's temporary folder (``TMPDIR``, else /tmp), for Ray's session files.
        slurm_cpus: the CPUs Slurm says the task has (``SLURM_CPUS_PER_TASK``, else
            ``SLURM_CPUS_ON_NODE``; 0: not given).
    """

    job_id: int
    procid: int
    ntasks: int
    node: str
    hosts: tuple[str, ...]
    cpus: int
    gpus: int
    tmp: str = "/tmp"
    slurm_cpus: int = 0

    @property
    def head(self) -> bool:
        return self.procid == 0


def gpu_count(cuda_visible_devices: str | None) -> int:
    """GPUs a ``CUDA_VISIBLE_DEVICES`` value names (unset, empty or Slurm's ``NoDevFiles``: 0)."""
    if not cuda_visible_devices or cuda_visible_devices.strip() == "NoDevFiles":
        return 0
    return len([d for d in cuda_visible_devices.split(",") if d.strip()])


def scontrol_hostnames(nodelist: str) -> list[str]:
    """A Slurm node list (``gpu[01-02],cpu07``) expanded by ``scontrol show hostnames``; a plain
    comma-separated list needs no scontrol."""
    if not any(c in nodelist for c in "[]"):
        return [h for h in nodelist.split(",") if h]
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise ClusterError(f"cannot expand the node list {nodelist!r} with scontrol: {e}") from e
    return out.stdout.split()


def affinity_cpus() -> int | None:
    """How many CPUs this process may run on (None where the system does not say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def slurm_task(
    env: Mapping[str, str],
    hostnames: Callable[[str], list[str]] = scontrol_hostnames,
    usable_cpus: Callable[[], int | None] = affinity_cpus,
) -> SlurmTask | None:
    """This task of a multi-task Slurm job (None outside Slurm, or in a job of one task).

    Args:
        env: the task's environment (``os.environ``).
        hostnames: expands a Slurm node list (default: :func:`scontrol_hostnames`).
        usable_cpus: how many CPUs the task may run on (default: its CPU affinity).

    Raises:
        ClusterError: a multi-task job whose environment lacks what a cluster needs.
    """
    ntasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    if not ntasks or int(ntasks) <= 1:
        return None
    nodelist = (
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    )
    cpus = env.get("SLURM_CPUS_PER_TASK") or env.get("SLURM_CPUS_ON_NODE")
    need = {
        "SLURM_PROCID": env.get("SLURM_PROCID"),
        "SLURM_JOB_ID": env.get("SLURM_JOB_ID"),
        "SLURMD_NODENAME": env.get("SLURMD_NODENAME"),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_CPUS_ON_NODE": cpus,
    }
    missing = [k for k, v in need.items() if not v]
    if missing:
        raise ClusterError(
            f"a job of {ntasks} Slurm tasks, but its environment has no {', '.join(missing)}: "
            "cannot start a Ray cluster over its nodes (run it through sbatch/srun)"
        )
    hosts = tuple(hostnames(str(nodelist)))
    if not hosts:
        raise ClusterError(f"the node list {nodelist!r} names no node")
    granted = int(str(cpus))
    usable = usable_cpus()
    return SlurmTask(
        job_id=int(str(need["SLURM_JOB_ID"])),
        procid=int(str(need["SLURM_PROCID"])),
        ntasks=int(ntasks),
        node=str(need["SLURMD_NODENAME"]),
        hosts=hosts,
        # a task bound to fewer CPUs than Slurm says would run Ray's workers on those alone
        cpus=min(granted, usable) if usable else granted,
        gpus=gpu_count(env.get("CUDA_VISIBLE_DEVICES")),
        tmp=env.get("TMPDIR") or "/tmp",
        slurm_cpus=granted,
    )


def describe_cpus(task: SlurmTask) -> str:
    """``96 CPUs``, or ``1 CPUs (bound to 1 of the 96 Slurm granted)`` for a log line."""
    if task.slurm_cpus and task.cpus < task.slurm_cpus:
        return (
            f"{task.cpus} CPUs (the task is bound to {task.cpus} of the {task.slurm_cpus} "
            "Slurm granted: see srun's --cpus-per-task)"
        )
    return f"{task.cpus} CPUs"
