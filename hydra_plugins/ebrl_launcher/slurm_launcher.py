"""Hydra's Submitit Slurm launcher, with a failed job failing its Slurm job, and a job of
several tasks running on a Ray cluster over its nodes.

Hydra's ``run_job`` catches a task's exception and returns it inside a FAILED ``JobReturn``.
hydra-submitit-launcher returns that object from the job, and Submitit pickles it as a
*successful* result: Slurm records the job COMPLETED 0:0, and only the launcher, unpickling the
result, sees the error. A Hydra callback cannot fix this: Hydra turns an exception raised in a
callback into a warning (``hydra._internal.callbacks``), which is how an earlier fix here, a
callback re-raising in ``on_job_end``, let a failed EBRL job end COMPLETED 0:0 on a real Slurm.

:class:`SlurmLauncher` (``hydra.launcher._target_`` in ``conf/launcher/slurm.yaml``) re-raises
the job's own exception after Hydra's ``run_job`` returns. Submitit then pickles it as an error
result (the launcher's ``FailedJobError`` shows the real traceback, a ``StageError`` included:
it pickles as itself) and exits non-zero, so Slurm records the job FAILED.

A job of several Slurm tasks (``launcher.nodes > 1``, one task per node) runs this launcher's
``__call__`` in every task (Submitit runs the pickled job once per task). When the job's
scheduler runs on Ray, task 0 starts a Ray head, waits for the others and trains with
``scheduler.ray_address=auto``; every other task joins the head as a Ray worker node and leaves
when the head's cluster ends, without training (:mod:`ebrl.runtime.slurm_cluster`). A job of
one task runs exactly as before.

Each task gets the CPUs the job asked for: the ``srun`` line that starts the tasks says
``--cpus-per-task`` (:meth:`SlurmLauncher.__init__`). Slurm 22.05-23.02's srun does not read
``SLURM_CPUS_PER_TASK`` from the batch script's environment, and Submitit's srun line does not
say it, so there each task was bound to one CPU while the job held more.

It lives in the ``hydra_plugins`` namespace package because Hydra instantiates launchers only
from there (ebrl ships ``hydra_plugins/ebrl_launcher``; pyproject.toml installs it).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, setup_globals
from hydra_plugins.hydra_submitit_launcher import submitit_launcher

from ebrl.launch.submitit_log import quiet_submitit_repeats
from ebrl.runtime import slurm_cluster, slurm_env, slurm_plan
from ebrl.signals import Preempted

quiet_submitit_repeats()  # the launcher's log: Submitit's sacct warning once, not every poll


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """hydra-submitit-launcher's Slurm launcher; a FAILED job raises its exception in the job,
    and a job of several tasks runs on a Ray cluster over them."""

    def __init__(self, **params: Any) -> None:
        """hydra-submitit-launcher's keys (``hydra.launcher``); the srun line gets
        ``--cpus-per-task=<cpus_per_task>`` (Submitit's ``srun_args``, which that launcher's
        schema has no key for), unless the job asks for no CPUs per task."""
        super().__init__(**params)
        self.params["srun_args"] = srun_args(
            self.params.get("cpus_per_task"), self.params.get("srun_args")
        )

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        args = (job_dir_key, job_num, job_id, singleton_state)
        task = slurm_env.slurm_task(os.environ)
        if task is not None and not self.wants_cluster(sweep_overrides, singleton_state):
            if not task.head:  # the scheduler runs in task 0's process: nothing to do here
                slurm_env.say(
                    f"task {task.procid}: the job's scheduler does not run on a Ray cluster of "
                    "the job's nodes; task 0 trains alone"
                )
                return JobReturn(overrides=sweep_overrides, status=JobStatus.COMPLETED)
            task = None
        if task is None:
            return raise_failed(super().__call__(sweep_overrides, *args))
        plan = slurm_plan.plan_node(task, shared_dir=submitit_folder())
        if not task.head:
            report = slurm_cluster.serve_worker(plan)
            if report.signum is not None:  # end as a signalled task does, like task 0
                Preempted(report.signum).redeliver()
            return JobReturn(
                overrides=sweep_overrides,
                status=JobStatus.COMPLETED,
                _return_value=dataclasses.asdict(report),
            )
        try:
            with slurm_cluster.head_cluster(plan):
                ret = super().__call__([*sweep_overrides, slurm_cluster.ADDRESS_OVERRIDE], *args)
        except Preempted as p:  # a stop signal while the cluster started: the head is stopped
            p.redeliver()
        return raise_failed(ret)

    def wants_cluster(self, sweep_overrides: list[str], singleton_state: dict[type, Any]) -> bool:
        """Whether this job's scheduler runs on Ray with the address left to the job
        (:func:`ebrl.runtime.slurm_cluster.wants_cluster`), from the job's composed config."""
        assert self.hydra_context is not None and self.config is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(sweep_overrides))
        return slurm_cluster.wants_cluster(cfg.get("scheduler"))


def srun_args(cpus_per_task: Any, given: list[str] | None = None) -> list[str]:
    """Submitit's ``srun_args``: ``given`` and ``--cpus-per-task=<cpus_per_task>`` (unless
    ``given`` says it or no CPU count is set): srun binds each task to that many CPUs."""
    out = list(given or [])
    if cpus_per_task and not any(a.startswith(("--cpus-per-task", "-c")) for a in out):
        out.append(f"--cpus-per-task={int(cpus_per_task)}")
    return out


def submitit_folder() -> str | None:
    """This job's Submitit folder (its pickled job and logs: a folder every task of the job
    reads), or None outside a Submitit job."""
    import submitit

    if not os.environ.get("SUBMITIT_FOLDER"):
        return None
    return str(submitit.JobEnvironment().paths.folder)


def raise_failed(ret: JobReturn) -> JobReturn:
    """``ret`` itself, unless its job failed: then the job's own exception is raised."""
    if ret.status == JobStatus.FAILED:
        ret.return_value  # noqa: B018 (a FAILED result raises its exception when read)
    return ret
