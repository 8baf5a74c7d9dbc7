"""Hydra's Submitit Slurm launcher, with a failed job failing its Slurm job.

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

It lives in the ``hydra_plugins`` namespace package because Hydra instantiates launchers only
from there (ebrl ships ``hydra_plugins/ebrl_launcher``; pyproject.toml installs it).
"""

from __future__ import annotations

from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher import submitit_launcher


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """hydra-submitit-launcher's Slurm launcher; a FAILED job raises its exception in the job."""

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        ret = super().__call__(*args, **kwargs)
        return raise_failed(ret)


def raise_failed(ret: JobReturn) -> JobReturn:
    """``ret`` itself, unless its job failed: then the job's own exception is raised."""
    if ret.status == JobStatus.FAILED:
        ret.return_value  # noqa: B018 (a FAILED result raises its exception when read)
    return ret
