"""Checks that span components, and :func:`validate`, which runs every check before any work.

A node's own value checks live with the node; here are those that need two groups (the
policy against the simulator, the scheduler against the simulator, the launcher against the
gpu) or the machine: :func:`check_machine` refuses a config this machine cannot run (a GPU
policy or simulator on CPU, a simulator package or its assets missing) and names what to install
or change; the machine comes in as data (:class:`ebrl.hardware.MachineFacts`), so the check is
pure and tested on made-up machines.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ebrl.config.algos import GRPONode
from ebrl.config.base import ConfigError, _check, _option
from ebrl.config.derive import class_of
from ebrl.config.keys import check_unknown_keys
from ebrl.config.policies import PolicyReads, RLinfPolicyNode, VLAPolicyNode
from ebrl.config.resources import LauncherKind
from ebrl.config.run import RunConfig
from ebrl.config.simulators import (
    _VLA_SIMULATOR,
    LiberoSim,
    ManiSkillSim,
    RLinfSim,
    SimGives,
)
from ebrl.hardware import MachineFacts, local_machine

#: the package's logger (ebrl.launch filters its repeated warnings by this name)
log = logging.getLogger("ebrl.config")


def check_contract(policy: Any, sim: Any) -> None:
    """Raise ConfigError where the simulator does not give what the policy reads: a camera
    image, the state's size, the action size, the instructions; the message names the key to
    set. A policy node without ``reads`` (ebrl's own policies read the flat vector) and a
    simulator node without ``gives`` pass."""
    reads: PolicyReads | None = getattr(policy, "reads", None)
    gives = getattr(sim, "gives", None)
    if reads is None or gives is None:
        return
    have: SimGives = gives()
    p = f"policy={_option(policy, type(policy).__name__)}"
    s = f"simulator={have.name}"
    missing = [k for k in reads.images if k not in have.images]
    _check(
        not missing,
        f"{p} reads the camera images {missing}, but {s} gives "
        f"{list(have.images) or 'no camera images'} with these settings: "
        + (have.fix_images or f"it cannot give them; use {_VLA_SIMULATOR}"),
    )
    _check(
        reads.state_dim is None or have.state_dim == reads.state_dim,
        f"{p} reads a state of {reads.state_dim} values (its checkpoint's norm stats), but {s} "
        f"gives {have.state}: "
        + (have.fix_state or f"it has no such state layout; use {_VLA_SIMULATOR}"),
    )
    _check(
        reads.action_dim is None or have.action_dim is None or have.action_dim == reads.action_dim,
        f"{p} outputs {reads.action_dim} actions per step, but {s} takes {have.action_dim}: "
        f"use a simulator with {reads.action_dim}-dim actions ({_VLA_SIMULATOR}), or a "
        f"checkpoint of this policy trained on {s}'s actions (policy.reads.action_dim, "
        "policy.model_cfg)",
    )
    _check(
        not reads.instructions or have.instructions,
        f"{p} reads each env's instruction (task_descriptions), but {s} gives none: "
        + (have.fix_images or f"use {_VLA_SIMULATOR}"),
    )


def check_vectorized(run: Any) -> None:
    """A vectorised simulator steps a worker's envs together: the schedule must hand it
    whole-worker chunks (sync, Colocated, Async; EBRL with one group in lock step)."""
    from ebrl.schedulers.ebrl import EBRLScheduler

    sch = run.scheduler
    name = getattr(class_of(sch), "__name__", "")
    fix = "scheduler.pipeline=false scheduler.step_level=false"
    if class_of(sch) is EBRLScheduler:
        _check(
            sch.pipeline is False and sch.step_level is False,
            f"simulator.vectorized=true steps all of an env worker's envs in one call, so EBRL "
            f"cannot pipeline env groups or step one env at a time: set {fix}",
        )
    _check(
        name != "HybridScheduler",
        "simulator.vectorized=true steps all of an env worker's envs in one call; Hybrid "
        "pipelines two env groups inside each worker: use scheduler=async, colocated or sync, "
        f"or scheduler=ebrl {fix}",
    )


#: packages the CPU simulators need: node type -> (import name, how to install)
_SIM_PACKAGES: dict[type, tuple[str, str]] = {
    ManiSkillSim: ("mani_skill", "pip install -e '.[sim]' (make setup)"),
}


def _need_package(
    machine: MachineFacts, group: str, name: str, package: str | None, install: str
) -> str | None:
    """The folder of ``package`` on ``machine`` (None when not checked: no package, or a
    machine whose packages are unknown); ConfigError naming the install when it is missing."""
    if not package or machine.find_package is None:
        return None
    folder = machine.find_package(package)
    _check(
        folder is not None,
        f"{group}={name} needs the Python package '{package}', which {machine.where} cannot "
        f"import: {install or 'install it'}",
    )
    return folder


def check_machine(run: RunConfig, machine: MachineFacts) -> None:
    """Raise ConfigError if ``machine`` cannot run ``run``; the message names the fix.

    Checks the gpu group against the machine's GPUs, GPU-only policies and simulators against the
    gpu group, and simulator packages, environment variables and assets where ``machine`` knows
    them (a field left None is not checked: a cluster node seen from a laptop).
    """
    gpu = run.gpu
    if gpu.device_name is not None:
        _check(
            bool(machine.gpus),
            f"gpu={gpu.name} asks for an NVIDIA {gpu.device_name}, but {machine.where} has no "
            "NVIDIA GPU: use gpu=cpu here, or run it on a GPU node (launcher=slurm; preview the "
            "jobs with `python -m ebrl.launch --dry-run <sweep>`)",
        )
        _check(
            any(gpu.device_name.lower() in g.lower() for g in machine.gpus),
            f"gpu={gpu.name} asks for an NVIDIA {gpu.device_name}, but {machine.where} has "
            f"{machine.gpus[0] if machine.gpus else 'none'}: choose the gpu option that matches "
            "it (conf/gpu/)",
        )
        # scheduler.device=cpu: a dry run of the GPU configuration, the stages on the cores
        _check(
            machine.cuda or getattr(run.scheduler, "device", None) == "cpu",
            f"gpu={gpu.name}: {machine.where} has {machine.gpus[0] if machine.gpus else 'a GPU'} "
            "but torch cannot use it (a CPU build of torch?): install a CUDA build of torch (or "
            "dry-run the GPU configuration on the cores: scheduler.device=cpu, scheduler=ebrl)",
        )
        # sync and Colocated put the policy on the GPU themselves (StageFactory.local_device);
        # the schedulers on EBRL's workers place it by their roles' GPU shares
        shares = [getattr(run.scheduler, f"{role}_gpus", None) for role in ("gen", "learner")]
        if all(share == 0 for share in shares):
            log.warning(
                "gpu=%s, but the scheduler's generator and learner ask for no GPU share "
                "(scale.gen_gpus = scale.learner_gpus = 0): the policy computes on the CPU "
                "cores. Set them (scale.gen_gpus=0.5 scale.learner_gpus=0.5: each half the "
                "SMs), or pick a scale point (+axis/scale=g1)",
                gpu.name,
            )
    asked = {r: getattr(run.scheduler, f"{r}_gpus", 0) or 0 for r in ("gen", "learner")}
    if any(v > 0 for v in asked.values()) and getattr(run.scheduler, "ray_address", "") == "local":
        # the run's own Ray instance has the GPUs NVML shows here: none, so nothing can place
        _check(
            bool(machine.gpus),
            f"scheduler.gen_gpus={asked['gen']:g}, learner_gpus={asked['learner']:g} ask for "
            f"GPU shares, but {machine.where} has no NVIDIA GPU: set scale.gen_gpus=0 "
            "scale.learner_gpus=0 (the roles on the cores), or run on a GPU node",
        )
    for group, node in (("policy", run.policy), ("simulator", run.simulator)):
        name = _option(node, type(node).__name__)
        if getattr(node, "requires_gpu", False):
            _check(
                gpu.device_name is not None,
                f"{group}={name} runs only on an NVIDIA GPU, but gpu=cpu: set gpu=h100 (or a100, "
                "h20, h200) and run it on a GPU node (launcher=slurm); on a CPU machine use "
                "policy=transformer_l (the VLA-shaped stand-in) and simulator=pushcube",
            )
        need_mem = getattr(node, "min_gpu_memory_gib", 0.0)
        _check(
            gpu.device_name is None or need_mem <= gpu.memory_gib,
            f"{group}={name} needs about {need_mem:g} GiB per GPU, gpu={gpu.name} has "
            f"{gpu.memory_gib:g}: choose a larger gpu (h100, a100, h20, h200)",
        )
        if getattr(node, "requires_rt_cores", False) and gpu.device_name is not None:
            _check(
                gpu.rt_cores,
                f"{group}={name} renders with Isaac Sim, which needs a GPU with RT cores; "
                f"gpu={gpu.name} has none: use an RTX-class GPU (gpu=rtx4090, or an L40S/RTX 6000 "
                "node added to conf/gpu/)",
            )
    pol = run.policy
    if isinstance(pol, RLinfPolicyNode):
        _need_package(machine, "policy", pol.name, pol.package, pol.install)
    if isinstance(pol, VLAPolicyNode):
        from ebrl.external import checkpoint_problem

        problem = checkpoint_problem(pol, machine.path_exists, machine.where)
        _check(problem is None, str(problem))
    sim = run.simulator
    package, install = _SIM_PACKAGES.get(type(sim), (getattr(sim, "package", None), ""))
    install = getattr(sim, "install", "") or install
    sim_name = _option(sim, type(sim).__name__)
    folder = _need_package(machine, "simulator", sim_name, package, install)
    if isinstance(sim, RLinfSim) and sim.sim_package:  # RLinf, then the simulator it wraps
        folder = _need_package(machine, "simulator", sim_name, sim.sim_package, sim.sim_install)
    if machine.env is not None:
        for var in getattr(sim, "env_vars", []):
            _check(
                var in machine.env,
                f"simulator={sim_name} needs the environment variable {var}: "
                f"{getattr(sim, 'assets_install', '') or 'set it'}",
            )
    if isinstance(sim, LiberoSim):
        from ebrl.envs.libero import setup_problem

        found = setup_problem(machine.find_package, machine.path_exists, machine.env, machine.where)
        _check(found is None, str(found))
    assets = getattr(sim, "assets", None)
    if assets and machine.path_exists is not None and (folder or "{package}" not in assets):
        path = assets.replace("{package}", folder or "")
        _check(
            machine.path_exists(path),
            f"simulator={sim_name}: its assets are missing ({path} does not exist): "
            f"{getattr(sim, 'assets_install', '') or 'download them'}",
        )
    res = run.resources
    pinned = [c for c in (res.sim_cores, res.gen_cores, res.train_cores) if c is not None]
    _check(
        not res.pin or sum(pinned) <= machine.cpus,
        f"resources: pinning {sum(pinned)} cores (sim/gen/train), but {machine.where} has "
        f"{machine.cpus}: lower resources.sim_cores/gen_cores/train_cores or set "
        "resources.pin=false",
    )


def check_hardware_values(run: RunConfig) -> None:
    """The checks between the gpu group and the resources and launcher groups, and a VLA's
    action chunk against the run's (each node's own values are checked by the node)."""
    res, lau, gpu = run.resources, run.launcher, run.gpu
    if isinstance(run.policy, VLAPolicyNode):
        # after check_machine: a node that cannot hold the model is named first
        _check(
            not run.policy.untrainable,
            f"policy={run.policy.name} cannot be trained by ebrl: {run.policy.untrainable}",
        )
        _check(
            run.chunk_size == run.policy.action_chunk,
            f"chunk_size={run.chunk_size}, but policy={run.policy.name} executes "
            f"{run.policy.action_chunk} actions per call: set chunk_size=${{policy.action_chunk}}",
        )
    for key in ("gen_sm_pct", "train_sm_pct"):
        v = getattr(res, key)
        _check(
            v is None or gpu.device_name is not None,
            f"resources.{key}={v}: an SM share needs a GPU, but gpu=cpu: leave it null",
        )
    asked = res.gpu_sharing
    _check(
        asked == "auto" or gpu.device_name is not None,
        f"resources.gpu_sharing={asked}: how roles share a GPU, but gpu=cpu: leave it auto",
    )
    for way in ("mps", "mig"):
        _check(
            asked != way or getattr(gpu, way),
            f"resources.gpu_sharing={way}, but gpu={gpu.name} has no {way.upper()}: choose "
            f"resources.gpu_sharing=auto ({'MPS' if way == 'mig' else 'MIG'} or time-sliced) or "
            "another GPU type",
        )
    if lau.kind == LauncherKind.slurm:
        if gpu.device_name is None:
            _check(
                lau.gpus_per_node == 0 and not lau.gres,
                f"launcher asks for GPUs (gpus_per_node={lau.gpus_per_node}, gres={lau.gres}) "
                "but gpu=cpu: set a gpu (gpu=h100 ...) or launcher.gpus_per_node=0",
            )
        else:
            _check(
                lau.gpus_per_node >= 1,
                f"gpu={gpu.name} but launcher.gpus_per_node=0: a GPU job needs >= 1 GPU per node",
            )


def validate(cfg: DictConfig, machine: MachineFacts | None = None) -> RunConfig:
    """Resolve and check a composed config; returns it as typed objects or raises ConfigError.

    Args:
        cfg: the composed config.
        machine: what the machine that will run it has (default: probe this one); a config
            it cannot run (a GPU policy without a GPU, a missing simulator package) fails here.
    """
    check_unknown_keys(cfg)  # before to_object, which would keep them as stray attributes
    try:
        run: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except ConfigError:  # a node's own check (its __post_init__): the message says it all
        raise
    except Exception as e:  # omegaconf's errors name the key; keep its message
        raise ConfigError(f"invalid configuration: {e}") from e
    _check(
        not run.init_checkpoint or Path(run.init_checkpoint).is_file(),
        f"init_checkpoint={run.init_checkpoint}: no such file; give the path of a behaviour-"
        "cloned policy (python -m ebrl.sft.libero clone) or of a run's checkpoint.pt, or set "
        "init_checkpoint=null to start from a fresh policy",
    )
    if isinstance(run.algo, GRPONode) and isinstance(run.policy, RLinfPolicyNode):
        _check(
            run.algo.cfg.kl_coef == 0,
            f"algo.cfg.kl_coef={run.algo.cfg.kl_coef} with policy={run.policy.name}: GRPO's KL to "
            "a reference policy needs a Gaussian's loc and scale, and RLinf's models give "
            "log-probs only; set algo.cfg.kl_coef=0",
        )
    if isinstance(run.algo, GRPONode):
        _check(
            run.algo.cfg.group_size >= 2 and run.num_envs % run.algo.cfg.group_size == 0,
            f"algo.cfg.group_size={run.algo.cfg.group_size}: GRPO needs groups of >= 2 envs "
            "that divide "
            f"num_envs={run.num_envs}",
        )
    from ebrl.schedulers.ebrl import EBRLScheduler  # (on first use: see _scheduler_schemas)

    if class_of(run.scheduler) is EBRLScheduler:  # its own checks ran when the node was built
        sch = run.scheduler
        _check(
            1 <= sch.sim_workers <= run.num_envs,
            f"scheduler.sim_workers={sch.sim_workers}: must be between 1 and num_envs",
        )
        _check(sch.batch_timeout_ms >= 0, "scheduler.batch_timeout_ms must be >= 0")
    if isinstance(run.simulator, RLinfSim) and run.simulator.vectorized:
        check_vectorized(run)
    check_machine(run, machine if machine is not None else local_machine())
    check_hardware_values(run)
    check_contract(run.policy, run.simulator)
    return run
