"""One job of a sweep, composed and checked against the machine that will run it.

:func:`check_job` is what the sweep's plan (:mod:`ebrl.launch.sweep`) asks of each distinct job:
the Hydra config it composes to, the Submitit parameters of its launcher (:func:`submitit_params`),
the MLflow store it logs to, and whether ``validate()`` accepts it on its machine (the Slurm
node's for a Slurm job, this one's otherwise). Checkpoints its VLA reads that are not there yet do
not fail it: each is replaced by a stand-in path and returned as a :class:`Fetch`, so a preview
lists what to fetch once rather than an error per job.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ebrl.config import ConfigError, LauncherKind, RunConfig, target_machine, validate
from ebrl.hardware import MachineFacts, local_machine
from ebrl.job_gpus import gpu_refusal, roles_line
from ebrl.memory import dry_run_lines as memory_lines

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: the MLflow store a job logs to: (tracking uri or None, local store folder, experiment)
Store = tuple[str | None, str, str]


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


def compose_config(overrides: list[str]) -> DictConfig:
    """The project's config (``conf/config.yaml``) composed with ``overrides``, the ``hydra``
    node included (the launcher, the sweeper's params, the sweep folder)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


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


#: what :func:`check_job` finds: (launcher kind, sbatch params, validation error or None, MLflow
#: store or None, the roles line or None, the checkpoints to fetch)
Checked = tuple[
    str,
    dict[str, Any],
    str | None,
    Store | None,
    str | None,
    tuple[Fetch, ...],
]


def check_job(sweep: str, overrides: list[str]) -> Checked:
    """Compose and validate one job against the machine that will run it."""
    try:
        cfg = compose_config([f"+sweep={sweep}", *overrides])
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
