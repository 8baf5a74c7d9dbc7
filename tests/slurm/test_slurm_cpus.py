"""A job's task runs on the CPUs it asked for, on a real Slurm (issue 46).

Slurm 22.05-23.02's ``srun`` does not take ``--cpus-per-task`` from the batch script ("not
automatically inherited by srun", srun(1)), and Submitit's srun line does not say it: where
Slurm binds tasks to their CPUs (``TaskPlugin=task/affinity`` or ``task/cgroup``; ``make
test-slurm``'s Slurm does) a step of several tasks on a node then binds each to one CPU while
``SLURM_CPUS_PER_TASK`` says what the job asked for. (A step of one task on its node still got
all of the job's CPUs on this machine's Slurm 22.05.8, with or without the flag; with 2 cores
the one-CPU binding of several tasks cannot be shown here.) ebrl's launcher puts
``--cpus-per-task`` on the srun line (Submitit's ``srun_args``), and a Ray node is told the CPUs
its task may run on (``ebrl.runtime.slurm_env.slurm_task``).

The jobs go through Submitit with the parameters ebrl's launcher gets from the shipped
``launcher=slurm`` config, converted as hydra-submitit-launcher converts them. Needs a Slurm that
answers ``sinfo`` with a node of >= 2 CPUs (``make test-slurm`` starts one); skipped otherwise.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .test_slurm_requeue import _slurm_unreachable

pytestmark = pytest.mark.slurm

CPUS = 2


def job_cpus() -> dict[str, Any]:
    """Run in the Slurm job: the CPUs the task may run on, what Slurm says it has, and the
    CPUs slurm_cluster would give the Ray node of such a task (as task 0 of two)."""
    from ebrl.runtime import slurm_env

    env = dict(os.environ)
    as_task_0_of_2 = env | {"SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": env["SLURMD_NODENAME"]}
    t = slurm_env.slurm_task(as_task_0_of_2)
    return {
        "affinity": sorted(os.sched_getaffinity(0)),
        "SLURM_CPUS_PER_TASK": env.get("SLURM_CPUS_PER_TASK"),
        "ray_cpus": t.cpus if t else None,
    }


def launcher_params(cpus: int, name: str) -> dict[str, Any]:
    """ebrl's SlurmLauncher's parameters from the shipped ``launcher=slurm`` config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from ebrl.train import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(
                "config",
                [
                    "launcher=slurm",
                    f"launcher.cpus_per_task={cpus}",
                    "launcher.time_min=10",
                    f"tracking.experiment={name}",
                ],
                return_hydra_config=True,
            )
        return dict(instantiate(cfg.hydra.launcher, submitit_folder="unused").params)
    finally:
        GlobalHydra.instance().clear()


def submit(folder: Path, params: dict[str, Any]) -> Any:
    """``job_cpus`` submitted with ``params`` converted as hydra-submitit-launcher's
    ``launch`` converts them (its own keys as they are, the rest ``slurm_<key>``)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    base = set(OmegaConf.structured(BaseQueueConf).keys())
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(
        **{
            k if k in base else f"slurm_{k}": v
            for k, v in params.items()
            if k not in ("submitit_folder", "max_num_timeout")
        }
    )
    return ex.submit(job_cpus)


def result(job: Any, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", str(job.job_id)], check=False, timeout=30)
            pytest.fail(f"Slurm job {job.job_id} did not finish within {timeout:.0f} s")
        time.sleep(2)
    return job.result()


@pytest.fixture(scope="module")
def slurm() -> str:
    reason = _slurm_unreachable()
    if reason:
        pytest.skip(f"Slurm not reachable: {reason}")
    cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout
    if int(cpus.split()[0]) < CPUS:
        pytest.skip(f"the node has {cpus.strip()} CPU(s); the job asks for {CPUS}")
    show = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    plugin = re.search(r"^TaskPlugin\s*=\s*(\S+)", show, re.M)
    version = re.search(r"^SLURM_VERSION\s*=\s*(\S+)", show, re.M)
    print(f"\nSlurm {version and version[1]}, TaskPlugin={plugin and plugin[1]}")
    return version[1] if version else ""


def test_a_jobs_task_runs_on_the_cpus_it_asked_for(slurm, tmp_path):
    params = launcher_params(CPUS, f"ebrl-cpus-{uuid.uuid4().hex[:6]}")
    assert f"--cpus-per-task={CPUS}" in params["srun_args"]
    got = result(submit(tmp_path / "fixed", params))
    print(f"srun {' '.join(params['srun_args'])}: {got}")
    assert len(got["affinity"]) == CPUS and got["SLURM_CPUS_PER_TASK"] == str(CPUS), got
    assert got["ray_cpus"] == CPUS
