"""Typed configuration: the schema Hydra composes ``conf/`` against.

Each config group option (``conf/<group>/<name>.yaml``) extends one of the node dataclasses below,
so a misspelt key or a value of the wrong type fails at composition with Hydra naming the key.
Value checks that types cannot express (ranges, combinations) run in :func:`validate`, before any
work starts. Objects are built from ``_target_`` by ``hydra.utils.instantiate``: adding a
simulator, policy, algorithm or scheduler is a new dataclass + yaml file, never an if/elif.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ebrl.algos.grpo import GRPOConfig
from ebrl.algos.ppo import PPOConfig


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the fix."""


# --- simulators -------------------------------------------------------------------------------
@dataclass
class ManiSkillSim:
    """ManiSkill3 task on CPU physics with state observations (needs the ``sim`` extra)."""

    _target_: str = "ebrl.envs.maniskill.ManiSkillEnv"
    task: str = "PushCube-v1"
    control_mode: str = "pd_joint_delta_pos"
    max_episode_steps: int = 50
    reward_mode: str = "normalized_dense"


class CostMode(StrEnum):
    burn = "burn"
    sleep = "sleep"


@dataclass
class SyntheticSim:
    """Synthetic point-mass task whose only purpose is a controllable per-step cost."""

    _target_: str = "ebrl.envs.synthetic.SyntheticCostEnv"
    step_cost_ms: float = 1.2
    tail_ratio: float = 1.5
    cost_mode: CostMode = CostMode.burn
    dim: int = 4
    episode_steps_start: int = 50
    episode_steps_end: int = 50
    shrink_episodes: int = 0


@dataclass
class CountingSim:
    """Deterministic fake env for tests (``ebrl.envs.fake.CountingEnv``)."""

    _target_: str = "ebrl.envs.fake.CountingEnv"
    episode_len: int | None = None
    obs_dim: int = 4
    action_dim: int = 2
    delay_s: float = 0.0
    delay_jitter_s: float = 0.0
    fail_after_steps: int | None = None
    fail_mode: str = "raise"


# --- policies ---------------------------------------------------------------------------------
@dataclass
class MLPPolicyNode:
    _target_: str = "ebrl.policies.mlp.MLPPolicy"
    hidden: int = 256
    layers: int = 3
    log_std_init: float = -0.5


class ModelSize(StrEnum):
    S = "S"
    M = "M"
    L = "L"


@dataclass
class TransformerPolicyNode:
    _target_: str = "ebrl.policies.transformer.TransformerPolicy"
    size: ModelSize = ModelSize.S
    log_std_init: float = -0.5


# --- algorithms -------------------------------------------------------------------------------
@dataclass
class PPONode:
    _target_: str = "ebrl.algos.ppo.PPO"
    cfg: PPOConfig = field(default_factory=PPOConfig)


@dataclass
class GRPONode:
    _target_: str = "ebrl.algos.grpo.GRPO"
    cfg: GRPOConfig = field(default_factory=GRPOConfig)


# --- schedulers -------------------------------------------------------------------------------
@dataclass
class SyncSchedulerNode:
    _target_: str = "ebrl.schedulers.sync.SyncScheduler"


class BackendKind(StrEnum):
    ray = "ray"
    inprocess = "inprocess"


@dataclass
class EBRLSchedulerNode:
    """EBRL's asynchronous pipelined scheduler; each level switchable (see its docstring)."""

    _target_: str = "ebrl.schedulers.ebrl.EBRLScheduler"
    #: ray: one process per worker; inprocess: threads (tests, debugging)
    backend: BackendKind = BackendKind.ray
    #: env worker processes
    sim_workers: int = 2
    #: level 1: rollout of the next segment overlaps training on this one
    overlap: bool = True
    #: k: the acting policy is at most k versions behind the learner (0..8)
    staleness: int = 1
    #: level 2: pipeline the run's env_groups (off: one group)
    pipeline: bool = True
    #: level 3: envs advance and are batched one by one (first M of N)
    step_level: bool = True
    #: M of "first M of N" (None: half a group)
    batch_min: int | None = None
    #: ms a ready env waits for M others before the generator acts anyway
    batch_timeout_ms: float = 5.0
    #: Ray address: "local" starts a private instance; "auto" or ray://... joins a cluster
    ray_address: str = "local"
    #: Ray custom resources per role ("sim", "gen", "learner") for multi-node placement
    resources: dict[str, dict[str, float]] | None = None


# --- run --------------------------------------------------------------------------------------
@dataclass
class BudgetConfig:
    #: stop after training on this many environment steps
    env_steps: int = 200_000
    #: and/or after this many minutes of wall-clock time (None: no limit)
    minutes: float | None = None
    #: and/or after this many updates (None: no limit)
    iterations: int | None = None


@dataclass
class ThreadsConfig:
    #: torch intra-op threads of the generator (1 is best on 2 cores: see notes)
    gen: int = 1
    #: torch intra-op threads of the learner
    train: int = 2


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


@dataclass
class CheckpointConfig:
    #: save the learner (weights, optimiser, version) every this many updates (0: never)
    every_iters: int = 1
    #: continue from ``<run_dir>/checkpoint.pt`` and ``progress.json`` when they exist
    #: (a requeued Slurm job re-runs the same command in the same run folder)
    resume: bool = True


@dataclass
class RunConfig:
    simulator: Any = MISSING
    policy: Any = MISSING
    algo: Any = MISSING
    scheduler: Any = MISSING
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
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

    @property
    def decisions_per_env(self) -> int:
        return max(1, self.rollout_steps // self.chunk_size)


def register() -> None:
    """Register the schema nodes with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="ebrl_schema", node=RunConfig)
    for group, name, node in [
        ("simulator", "maniskill_schema", ManiSkillSim),
        ("simulator", "synthetic_schema", SyntheticSim),
        ("simulator", "counting_schema", CountingSim),
        ("policy", "mlp_schema", MLPPolicyNode),
        ("policy", "transformer_schema", TransformerPolicyNode),
        ("algo", "ppo_schema", PPONode),
        ("algo", "grpo_schema", GRPONode),
        ("scheduler", "sync_schema", SyncSchedulerNode),
        ("scheduler", "ebrl_schema", EBRLSchedulerNode),
    ]:
        cs.store(group=group, name=name, node=node)


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def validate(cfg: DictConfig) -> RunConfig:
    """Resolve and check a composed config; returns it as typed objects or raises ConfigError."""
    try:
        run: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except Exception as e:  # omegaconf's errors name the key; keep its message
        raise ConfigError(f"invalid configuration: {e}") from e
    _check(run.num_envs >= 1, f"num_envs={run.num_envs}: need at least 1 env")
    _check(
        1 <= run.env_groups <= run.num_envs,
        f"env_groups={run.env_groups}: must be between 1 and num_envs={run.num_envs}",
    )
    _check(run.chunk_size >= 1, f"chunk_size={run.chunk_size}: must be >= 1")
    _check(
        run.rollout_steps >= run.chunk_size,
        f"rollout_steps={run.rollout_steps} < chunk_size={run.chunk_size}: "
        "an iteration needs at least one decision per env",
    )
    _check(run.budget.env_steps > 0, "budget.env_steps must be > 0")
    _check(run.threads.gen >= 1 and run.threads.train >= 1, "threads.gen/train must be >= 1")
    _check(run.warmup_iters >= 0, "warmup_iters must be >= 0")
    if isinstance(run.algo, GRPONode):
        _check(
            run.algo.cfg.group_size >= 2 and run.num_envs % run.algo.cfg.group_size == 0,
            f"algo.cfg.group_size={run.algo.cfg.group_size}: GRPO needs groups of >= 2 envs "
            "that divide "
            f"num_envs={run.num_envs}",
        )
    if isinstance(run.scheduler, EBRLSchedulerNode):
        sch = run.scheduler
        _check(0 <= sch.staleness <= 8, f"scheduler.staleness={sch.staleness}: must be 0..8")
        _check(
            1 <= sch.sim_workers <= run.num_envs,
            f"scheduler.sim_workers={sch.sim_workers}: must be between 1 and num_envs",
        )
        _check(sch.batch_timeout_ms >= 0, "scheduler.batch_timeout_ms must be >= 0")
    if isinstance(run.simulator, SyntheticSim):
        _check(run.simulator.step_cost_ms >= 0, "simulator.step_cost_ms must be >= 0")
        _check(run.simulator.tail_ratio >= 1.0, "simulator.tail_ratio (P99/mean) must be >= 1")
    return run
