"""The run-level nodes: :class:`RunConfig` (the root, ``conf/config.yaml``) and its sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from ebrl.config.base import ConfigError, _check
from ebrl.config.resources import GPUNode, LauncherNode, ResourcesNode, ScaleConfig
from ebrl.runtime.placement_nodes import PlacementConfig


@dataclass
class BudgetConfig:
    #: stop after training on this many environment steps
    env_steps: int = 200_000
    #: and/or after this many minutes of wall-clock time (None: no limit)
    minutes: float | None = None
    #: and/or after this many updates (None: no limit)
    iterations: int | None = None

    def __post_init__(self) -> None:
        _check(self.env_steps > 0, "budget.env_steps must be > 0")


@dataclass
class ThreadsConfig:
    #: torch intra-op threads of the generator (1 is best on 2 cores: see notes)
    gen: int = 1
    #: torch intra-op threads of the learner (scheduler=ebrl's shape search: the most each
    #: stage may get, with the static unpinned split)
    train: int = 2

    def __post_init__(self) -> None:
        _check(self.gen >= 1 and self.train >= 1, "threads.gen/train must be >= 1")


@dataclass
class TrackingConfig:
    #: log to MLflow (params, metrics, artifacts)
    enabled: bool = True
    #: tracking URI; None means the local sqlite store in ``store``
    uri: str | None = None
    #: folder of the local store (``mlflow.db`` + ``mlartifacts/``), relative to the cwd
    store: str = "outputs/mlflow"
    #: MLflow experiment name
    experiment: str = "ebrl"
    #: MLflow run name (None: scheduler-policy-simulator-seed)
    run_name: str | None = None
    #: the sweep's parent run: this run is its child (``mlflow.parentRunId``). ``ebrl.launch``
    #: sets it for every job of a sweep; a run started by hand has none
    parent_run_id: str | None = None
    #: MLflow's system metrics (CPU, memory, disk, network; GPUs through NVML) every
    #: ``system_metrics_interval_s``: ``auto`` logs them where a GPU is visible and not on a
    #: CPU-only machine, where the sampler would take time from a timing run's few cores;
    #: ``true`` / ``false`` force it
    system_metrics: str = "auto"
    #: seconds between two samples of the system metrics
    system_metrics_interval_s: float = 10.0
    #: sample every CPU core this job may use and every visible GPU (utilisation, SM occupancy
    #: where the driver exposes it, memory) every ``utilisation_interval_s`` into the run
    #: folder's ``utilisation.csv`` (``ebrl.utilisation``; the motivation figure reads it)
    utilisation: bool = False
    #: seconds between two samples of utilisation.csv
    utilisation_interval_s: float = 0.2

    def __post_init__(self) -> None:
        # Hydra parses `tracking.system_metrics=true` as a bool, which the str field keeps as
        # "True": every spelling is normalised here, and anything else is refused by name
        mode = str(self.system_metrics).strip().lower()
        if mode not in ("auto", "true", "false"):
            raise ConfigError(
                f"tracking.system_metrics={self.system_metrics!r}: one of auto, true, false"
            )
        self.system_metrics = mode
        for key in ("system_metrics_interval_s", "utilisation_interval_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"tracking.{key}={getattr(self, key)}: must be > 0 seconds")


@dataclass
class CheckpointConfig:
    #: save the learner (weights, optimiser, version) every this many updates (0: never)
    every_iters: int = 1
    #: continue from ``<run_dir>/checkpoint.pt`` and ``progress.json`` when they exist
    #: (a requeued Slurm job re-runs the same command in the same run folder)
    resume: bool = True


@dataclass
class InjectConfig:
    """Synthetic extra load on a stage, for the allocator's slowdown study (off by default).

    The simulator's own slowdown lives in ``simulator=synthetic`` (``slowdown_*``); this one is
    the learner's: a heavier update (as a larger model or longer trajectories would make it), with
    the algorithm and its results unchanged.
    """

    #: from the update that starts at this learner version on, every update also runs
    #: ``train_extra_epochs`` forward-backward passes over its segment (None: never)
    train_after_updates: int | None = None
    #: extra forward-backward passes per update, gradients discarded; they run on the learner's
    #: torch threads, so more threads make them faster, as they do the real update
    train_extra_epochs: int = 0

    def __post_init__(self) -> None:
        _check(
            self.train_extra_epochs >= 0
            and (self.train_after_updates is None or self.train_after_updates >= 0),
            f"inject.train_extra_epochs={self.train_extra_epochs} and inject.train_after_updates="
            f"{self.train_after_updates}: must be >= 0",
        )


class EvalInitStates(StrEnum):
    """Where the evaluation's episodes start (``eval.init_states``)."""

    auto = "auto"
    fixed = "fixed"
    train = "train"


@dataclass
class EvalConfig:
    #: episodes of the final weights to run after training (0: no evaluation); see ebrl.evaluate
    episodes: int = 0
    #: envs stepped together during evaluation
    num_envs: int = 8
    #: act with the chunk's mean (False: sample, as in training)
    deterministic: bool = True
    #: learning curve: keep the learner's weights every this many updates and, after the run,
    #: evaluate each on ``curve_episodes`` episodes (logged as eval/success_rate at the env step
    #: and wall-clock of that update); 0: no curve
    every_iters: int = 0
    #: episodes per point of the learning curve
    curve_episodes: int = 24
    #: auto: the simulator's fixed initial states where it has them (LIBERO), whatever the run
    #: trained from; fixed: those (an error where there are none); train: the run's own
    init_states: EvalInitStates = EvalInitStates.auto
    #: processes the evaluations after training run on, at once (the snapshots and the final
    #: weights: each on one of them; the results do not depend on it); 1: in the run's process
    workers: int = 1

    def __post_init__(self) -> None:
        _check(
            self.episodes >= 0 and self.num_envs >= 1 and self.every_iters >= 0,
            f"eval.episodes={self.episodes}, eval.num_envs={self.num_envs}, "
            f"eval.every_iters={self.every_iters}: need episodes >= 0, num_envs >= 1 and "
            "every_iters >= 0",
        )
        _check(
            self.workers >= 1,
            f"eval.workers={self.workers}: the evaluation's processes must be >= 1 (1: in the "
            "run's own process)",
        )
        _check(
            self.every_iters == 0 or self.curve_episodes >= 1,
            f"eval.curve_episodes={self.curve_episodes}: a curve needs at least 1 episode per "
            "point (or set eval.every_iters=0)",
        )
        allowed = [m.value for m in EvalInitStates]  # Hydra refuses others at composition
        _check(
            self.init_states in allowed,
            f"eval.init_states={self.init_states}: use {', '.join(allowed)}",
        )


@dataclass
class RunConfig:
    #: the simulator group's option (conf/simulator/)
    simulator: Any = MISSING
    #: the policy group's option (conf/policy/)
    policy: Any = MISSING
    #: the algo group's option (conf/algo/)
    algo: Any = MISSING
    #: the scheduler group's option (conf/scheduler/)
    scheduler: Any = MISSING
    #: when the run stops
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    #: torch threads of the generator and the learner
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)
    #: MLflow logging and utilisation sampling
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    #: saving the learner, and resuming a run
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    #: evaluation after the run, and the learning curve
    eval: EvalConfig = field(default_factory=EvalConfig)
    #: synthetic extra load on the learner (off by default)
    inject: InjectConfig = field(default_factory=InjectConfig)
    #: the accelerator type (conf/gpu/)
    gpu: GPUNode = field(default_factory=GPUNode)
    #: how cores, threads and SMs are split between stages (conf/resources/)
    resources: ResourcesNode = field(default_factory=ResourcesNode)
    #: where a sweep's jobs run (conf/launcher/)
    launcher: LauncherNode = field(default_factory=LauncherNode)
    #: the roles at scale (replicas, learner ranks, GPU shares) for ebrl / hybrid / async
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    #: the node group each role is pinned to (placement.groups.sim=rtx)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    #: which variant of a sweep axis this run is (e.g. ablation/full); a param in MLflow
    variant: str = ""
    #: run seed: policy init, sampling, env reset seeds
    seed: int = 0
    #: environments in total
    num_envs: int = 16
    #: env groups (one simulator worker each); the EBRL scheduler pipelines them
    env_groups: int = 2
    #: K: actions per policy decision (1 = single actions)
    chunk_size: int = 4
    #: env steps per env per iteration; T = rollout_steps // chunk_size decisions
    rollout_steps: int = 50
    #: iterations excluded from steady-state throughput
    warmup_iters: int = 2
    #: show a progress bar
    progress: bool = True
    #: run folder (None: Hydra's output dir, or a fresh folder under outputs/runs)
    run_dir: str | None = None
    #: start the policy from these weights (a behaviour-cloned policy, ``python -m
    #: ebrl.sft.libero clone``, or a run's checkpoint.pt): a fresh run, its version, optimiser
    #: and counters new (``checkpoint.resume`` continues a run instead). None: a fresh policy
    init_checkpoint: str | None = None
    #: multiply the std of the initial policy's Gaussian by this (its log-std shifted by the
    #: log), after ``init_checkpoint`` is loaded: a behaviour clone's std is its
    #: demonstrations' residual, and chunks sampled at it can fail where the clone's mean
    #: succeeds (PPO's rollouts sample). 1: unchanged
    init_std_scale: float = 1.0

    def __post_init__(self) -> None:
        # the run's own values; the checks that need two groups are ebrl.config.checks'
        _check(
            self.init_std_scale > 0,
            f"init_std_scale={self.init_std_scale}: the factor of the initial policy's std must "
            "be > 0 (1: unchanged)",
        )
        _check(self.num_envs >= 1, f"num_envs={self.num_envs}: need at least 1 env")
        _check(
            1 <= self.env_groups <= self.num_envs,
            f"env_groups={self.env_groups}: must be between 1 and num_envs={self.num_envs}",
        )
        _check(self.chunk_size >= 1, f"chunk_size={self.chunk_size}: must be >= 1")
        _check(
            self.rollout_steps >= self.chunk_size,
            f"rollout_steps={self.rollout_steps} < chunk_size={self.chunk_size}: "
            "an iteration needs at least one decision per env",
        )
        _check(self.warmup_iters >= 0, "warmup_iters must be >= 0")
        _check(
            self.eval.episodes == 0 or self.checkpoint.every_iters == 1,
            f"eval.episodes={self.eval.episodes} evaluates the learner's last checkpoint, but "
            f"checkpoint.every_iters={self.checkpoint.every_iters} would leave it behind the final "
            "weights: set checkpoint.every_iters=1 or eval.episodes=0",
        )

    @property
    def decisions_per_env(self) -> int:
        return max(1, self.rollout_steps // self.chunk_size)
