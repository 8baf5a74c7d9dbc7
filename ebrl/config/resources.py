"""The gpu, resources and launcher groups' nodes and the run's scale (``conf/gpu/``,
``conf/resources/``, ``conf/launcher/``, ``conf/axis/scale/``): the hardware a run asks for."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from ebrl.config.base import _check
from ebrl.hardware import MachineFacts

if TYPE_CHECKING:
    from ebrl.config.run import RunConfig


@dataclass
class GPUNode:
    """One accelerator type (``conf/gpu/``): what the resource manager splits, what Slurm gives."""

    #: the group option's name: cpu, h100, a100, h20, rtx4090, h200
    name: str = "cpu"
    #: substring of the CUDA device name that identifies it (None: no GPU)
    device_name: str | None = None
    #: streaming multiprocessors per device: the SM pool that MPS quotas divide
    sm_count: int = 0
    #: device memory, GiB, as the driver reports it (rounded)
    memory_gib: float = 0.0
    #: NVIDIA MPS SM quotas (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) work on it
    mps: bool = False
    #: MIG partitions work on it
    mig: bool = False
    #: RT cores (ray tracing): Isaac Sim based simulators (BEHAVIOR) need them
    rt_cores: bool = False
    #: Slurm node feature that selects it (sbatch --constraint); site-specific
    slurm_constraint: str | None = None
    #: Slurm GRES type (sbatch --gres=gpu:<type>:N); site-specific
    slurm_gres: str | None = None


class GpuSharing(StrEnum):
    """How roles that share a GPU get their SM quotas (``resources.gpu_sharing``); the values
    are those of what a run records (``ebrl.resources.sharing.Sharing``), plus ``auto``."""

    #: MPS where a daemon can serve the node, else its GPU's MIG instances, else time-sliced
    #: (warned once, naming what to install or enable)
    auto = "auto"
    #: MPS quotas, or the run stops before any work where no daemon can serve a node
    mps = "mps"
    #: MIG instances, no MPS daemon; the run stops before any work where a GPU has none
    mig = "mig"
    #: no quotas: the roles' kernels take turns on the GPU (a baseline, or a driver without MPS)
    time_sliced = "time-sliced"


class AllocatorKind(StrEnum):
    static = "static"
    elastic = "elastic"


@dataclass
class ResourcesNode:
    """How cores, threads and SMs are split between stages (``conf/resources/``). Data only:
    the resource manager (``ebrl/resources/``) reads it."""

    #: pin each stage process to its cores (os.sched_setaffinity), NUMA-local to its GPU
    pin: bool = False
    #: CPU cores of simulation, generation, training (None: the resource manager decides)
    sim_cores: int | None = None
    #: CPU cores of generation (None: the resource manager decides)
    gen_cores: int | None = None
    #: CPU cores of training (None: the resource manager decides)
    train_cores: int | None = None
    #: torch intra-op threads of the generator and the learner (unpinned elastic: their sum is
    #: the thread budget Algorithm 1 splits)
    gen_threads: int = 1
    #: torch intra-op threads of the learner
    train_threads: int = 2
    #: generator batch size, M of "first M of N" (None: scheduler.batch_min; elastic: chosen)
    gen_batch: int | None = None
    #: GPU SM quota, percent, of generation and training (an MPS cap; None: the role's GPU
    #: share, scheduler.gen_gpus / learner_gpus; ebrl/resources/sharing.py)
    gen_sm_pct: int | None = None
    #: GPU SM quota of training, percent (None: the learner's GPU share)
    train_sm_pct: int | None = None
    #: a GPU stage profile (ebrl.plan.measure --device cuda) from which Algorithm 1 splits the
    #: SMs of a GPU the generator and the learner share, where the quotas are unpinned
    gpu_profile: str | None = None
    #: how roles that share a GPU get their quotas: auto (MPS, else MIG, else time-sliced with
    #: a warning), mps, mig (each: or stop before any work), time_sliced (no quotas)
    gpu_sharing: GpuSharing = GpuSharing.auto
    #: static: keep the split; elastic: Algorithm 1 re-balances it at run time
    allocator: AllocatorKind = AllocatorKind.static
    #: elastic: re-balance when stage throughputs diverge by more than this fraction ...
    rebalance_threshold: float = 0.15
    #: ... for this many consecutive steps (updates); None: scaled to the run, a tenth of its
    #: updates between 2 and 20 (a 10-update CPU sweep: 2, a run of 200 updates or more: 20)
    rebalance_patience: int | None = None
    #: elastic: a stored stage profile (ebrl-plan-profile/1, CPU threads) to allocate
    #: from (None: profile the run's policy at start and save it in the run folder)
    profile: str | None = None

    def __post_init__(self) -> None:
        for key in ("sim_cores", "gen_cores", "train_cores"):
            v = getattr(self, key)
            _check(v is None or v >= 1, f"resources.{key}={v}: must be >= 1 (or null)")
        _check(
            self.gen_threads >= 1 and self.train_threads >= 1, "resources.*_threads must be >= 1"
        )
        for key in ("gen_sm_pct", "train_sm_pct"):
            v = getattr(self, key)
            _check(v is None or 1 <= v <= 100, f"resources.{key}={v}: must be 1..100 (or null)")
        _check(0 < self.rebalance_threshold < 1, "resources.rebalance_threshold must be in (0, 1)")
        _check(
            self.rebalance_patience is None or self.rebalance_patience >= 1,
            "resources.rebalance_patience must be >= 1 (or null: scaled to the run)",
        )


class LauncherKind(StrEnum):
    local = "local"
    submitit_local = "submitit_local"
    slurm = "slurm"


@dataclass
class ScaleConfig:
    """The roles a run asks for at scale (issue 16), for the schedulers on EBRL's workers: the
    ``ebrl``, ``hybrid`` and ``async`` scheduler nodes take their role settings from here
    (``conf/scheduler/*.yaml`` interpolate them), so one scale point (``conf/axis/scale/``) sizes
    every scheduler of a sweep alike. ``colocated`` runs ``learner_ranks`` processes, each with
    every stage (``scheduler.ranks``: one per GPU); ``sync`` runs every stage in the driver."""

    #: env worker processes (scheduler.sim_workers)
    sim_workers: int = 2
    #: generator replicas (scheduler.gen_replicas)
    gen_replicas: int = 1
    #: data-parallel learner ranks (scheduler.learner_ranks)
    learner_ranks: int = 1
    #: GPU share per replica (scheduler.gen_gpus; < 1: an MPS quota)
    gen_gpus: float = 0.0
    #: GPU share per learner rank (scheduler.learner_gpus)
    learner_gpus: float = 0.0


@dataclass
class LauncherNode:
    """Where a sweep's jobs run (``conf/launcher/``); its values reach ``hydra.launcher`` (the
    hydra-submitit-launcher keys) by interpolation, so one place holds them."""

    #: local: one job after another in this process; submitit_local: Submitit's local jobs; slurm
    kind: LauncherKind = LauncherKind.local
    #: Slurm partition, account and QoS (site-specific)
    partition: str | None = None
    #: Slurm account (sbatch --account)
    account: str | None = None
    #: Slurm QoS (sbatch --qos)
    qos: str | None = None
    #: wall-clock limit of one job, minutes
    time_min: int = 60
    #: nodes per job
    nodes: int = 1
    #: tasks per node
    tasks_per_node: int = 1
    #: GPUs per node (0: a CPU job)
    gpus_per_node: int = 0
    #: CPU cores per task (None: Slurm's default)
    cpus_per_task: int | None = None
    #: memory per node, GB (None: Slurm's default)
    mem_gb: int | None = None
    #: node feature (sbatch --constraint); launcher=slurm takes it from the gpu group
    constraint: str | None = None
    #: generic resources (sbatch --gres); launcher=slurm_gres builds gpu:<type>:<n> from gpu
    gres: str | None = None
    #: jobs of one array that run at once (sbatch --array=0-N%this)
    array_parallelism: int = 256
    #: a preempted job goes back to the queue (sbatch --requeue) and resumes from its run folder
    requeue: bool = True
    #: resubmissions after a timeout (submitit's max_num_timeout)
    max_requeues: int = 0
    #: seconds between Slurm's warning signal and the kill (time to checkpoint)
    signal_delay_s: int = 120
    #: whole nodes (sbatch --exclusive): throughput is not measured next to other jobs
    exclusive: bool = False
    #: shell lines the sbatch script runs first (module load, source .venv/bin/activate)
    setup: list[str] = field(default_factory=list)
    #: let a GPU job through the dry run that leaves GPUs idle or computes on the CPU
    allow_idle_gpus: bool = False

    def __post_init__(self) -> None:
        _check(self.time_min >= 1, f"launcher.time_min={self.time_min}: must be >= 1 minute")
        _check(
            self.nodes >= 1 and self.tasks_per_node >= 1,
            "launcher.nodes/tasks_per_node must be >= 1",
        )
        _check(self.array_parallelism >= 1, "launcher.array_parallelism must be >= 1")
        _check(self.max_requeues >= 0, "launcher.max_requeues must be >= 0")


def target_machine(run: RunConfig) -> MachineFacts:
    """The machine a launcher would give ``run`` (for dry runs): its gpu group's GPUs and CPUs;
    packages, paths and environment unknown (not checked)."""
    gpu, lau = run.gpu, run.launcher
    n = max(1, lau.gpus_per_node) if gpu.device_name else 0
    return MachineFacts(
        where=f"a {lau.kind.value} node with gpu={gpu.name}",
        gpus=(f"NVIDIA {gpu.device_name}",) * n,
        cuda=n > 0,
        cpus=lau.cpus_per_task or 10**6,
    )
