"""What the schedule model is given (stage costs, the workload, the shape, where roles run) and
what it predicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ebrl.resources.model.machine import Use

#: torch intra-op threads of (the generator, the learner)
Split = tuple[int, int]


@dataclass(frozen=True)
class StageCosts:
    """What one unit of each stage costs at full speed, alone on the machine.

    Attributes:
        sim_chunk_s: wall seconds of one env's action chunk (K physics steps), samples: their
            spread is the step-latency tail the model replays.
        sim_busy: cores a stepping env worker keeps busy (CPU seconds per wall second): about 1
            for CPU physics, near 0 for a simulator that waits (a remote or GPU simulator).
        gen_fixed_s: seconds of one generator call regardless of its batch.
        gen_per_env_s: seconds per env in a generator call.
        gen_busy: cores a generator call keeps busy.
        train_s: seconds of one update (a whole segment, every epoch).
        train_busy: cores the learner keeps busy while it trains.
        message_s: CPU seconds of the engine's own work per unit sent (a Ready or a Go handled
            at both ends), added to each sim unit and, per env, to each generator call.
        sync_s: seconds the learner spends publishing each new version (its ``sync`` span; the
            sync schedule's weight load, Colocated's reload included) before it reports.
        load_s: seconds a generator replica spends installing a new version (its ``load`` span,
            between two batches).
        offload_s: seconds the generator spends dropping its weights after a rollout's last
            call (Colocated's offload, inside that ``gen`` span).
    """

    sim_chunk_s: tuple[float, ...]
    sim_busy: float
    gen_fixed_s: float
    gen_per_env_s: float
    gen_busy: float
    train_s: float
    train_busy: float
    message_s: float = 2e-4
    sync_s: float = 0.0
    load_s: float = 0.0
    offload_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.sim_chunk_s or min(self.sim_chunk_s) <= 0:
            raise ValueError("StageCosts.sim_chunk_s: at least one positive sample")
        for name in (
            "gen_fixed_s",
            "gen_per_env_s",
            "train_s",
            "message_s",
            "sync_s",
            "load_s",
            "offload_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"StageCosts.{name} must be >= 0")

    def gen_s(self, batch: int, messages: int | None = None) -> float:
        """Seconds of one generator call on ``batch`` envs that handles ``messages`` messages
        (the Ready messages its envs came in and the Go messages it sends; None: one per
        env)."""
        handled = batch if messages is None else messages
        return self.gen_fixed_s + self.gen_per_env_s * batch + self.message_s * handled

    @property
    def sim_mean_s(self) -> float:
        return float(np.mean(self.sim_chunk_s))

    @property
    def tail(self) -> float:
        """P99 / mean of a chunk's latency."""
        return float(np.percentile(self.sim_chunk_s, 99)) / self.sim_mean_s


@dataclass(frozen=True)
class Workload:
    """The run's fixed part: who holds which envs, segment length, staleness bound, cores.

    Attributes:
        workers: env ids of each env worker.
        decisions_per_env: T, chunks per env per segment.
        staleness: k (0: the rollout waits for every update).
        cores: cores the run's processes share (the machine's one pool when no
            :class:`Layout` is given).
        chunk_size: K, env steps per chunk (throughput is in env steps).
        steps_per_chunk: env steps a chunk really makes on average (an episode's end cuts its
            last chunk short: ``episode / ceil(episode / K)``); None: K.
    """

    workers: tuple[tuple[int, ...], ...]
    decisions_per_env: int
    staleness: int
    cores: float
    chunk_size: int = 1
    steps_per_chunk: float | None = None

    @property
    def num_envs(self) -> int:
        return sum(len(w) for w in self.workers)

    @property
    def env_steps_per_update(self) -> float:
        per_chunk = self.chunk_size if self.steps_per_chunk is None else self.steps_per_chunk
        return self.num_envs * self.decisions_per_env * per_chunk


@dataclass(frozen=True)
class Shape:
    """What the shape search chooses: G, step level, M, the batch cap (timeout: the engine's)
    and the torch threads of the generator and the learner (None: the run's own, not searched).

    At the step level the generator acts once ``batch_min`` (M) eligible envs are ready, on the
    first ``batch_max`` of them in arrival order: ``batch_max`` = M (None) is EnvPool's "first M
    of N"; a larger cap lets the envs that piled up while the generator was busy share one call
    (its fixed cost paid once), which is what pays when a call costs much more than an env.
    """

    groups: int
    step_level: bool
    batch_min: int
    batch_timeout_s: float = 0.005
    batch_max: int | None = None
    threads: Split | None = None

    @property
    def cap(self) -> int:
        """The most envs one step-level call takes."""
        return max(self.batch_min, self.batch_max or self.batch_min)

    def describe(self) -> str:
        if self.step_level:
            if self.cap > self.batch_min:
                out = f"step level, M={self.batch_min} up to {self.cap}"
            else:
                out = f"step level, M={self.batch_min}"
        else:
            out = f"G={self.groups}, lock step"
        if self.threads is not None:
            out += f", threads {self.threads[0]}+{self.threads[1]}"
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "env_groups": self.groups,
            "step_level": self.step_level,
            "batch_min": self.batch_min if self.step_level else None,
            "batch_max": self.cap if self.step_level else None,
            "gen_threads": self.threads[0] if self.threads else None,
            "train_threads": self.threads[1] if self.threads else None,
        }


#: stage costs by thread split: what the shape search measured at each (gen, train) split
CostTable = Mapping[Split, StageCosts]


def costs_for(costs: StageCosts | CostTable, shape: Shape) -> StageCosts:
    """The costs ``shape`` runs with: ``costs`` itself, or from a table its thread split's."""
    if isinstance(costs, StageCosts):
        return costs
    if shape.threads is None or shape.threads not in costs:
        raise KeyError(
            f"no stage costs measured for {shape.describe()} (measured: {sorted(costs)})"
        )
    return costs[shape.threads]


@dataclass(frozen=True)
class Layout:
    """Where the roles run: the pools they share and what each asks of them.

    Without a layout the model has one pool, ``cpu``, of ``Workload.cores``, and every role
    asks it for its ``StageCosts`` busy cores: the machine the shape search profiles.

    Attributes:
        pools: each pool's capacity: a node's (or NUMA domain's) effective cores, 1.0 a GPU.
        sims: the pool each env worker steps on (it asks ``StageCosts.sim_busy`` of it).
        gens: each generator replica's uses, ``((pool, demand), ...)``: R = ``len(gens)``
            (a GPU share and its host thread's cores, or the cores of its torch threads).
        learner: the learner's uses, every rank's together (the ranks step in lock step: the
            slowest pool sets the pace).
        replica_of: env worker -> the replica acting for it (None: contiguous blocks, the
            engine's ``Roles.replica_of``).
        nominal: a pool's nominal capacity where it exceeds ``pools``' effective one: what a
            job alone gets (``ebrl.resources.model.machine``); None: the effective one.
        gen_loads: each replica's host cores: taken from its node while it computes, not
            pacing it (its GPU does); empty: none.
        learner_loads: the learner ranks' host cores, likewise.
    """

    pools: Mapping[str, float]
    sims: tuple[str, ...]
    gens: tuple[tuple[Use, ...], ...]
    learner: tuple[Use, ...]
    replica_of: tuple[int, ...] | None = None
    nominal: Mapping[str, float] | None = None
    gen_loads: tuple[tuple[Use, ...], ...] = ()
    learner_loads: tuple[Use, ...] = ()

    @staticmethod
    def single(costs: StageCosts, work: Workload) -> Layout:
        """One pool of ``work.cores`` shared by every role (one replica, one learner)."""
        return Layout(
            pools={"cpu": float(work.cores)},
            sims=("cpu",) * len(work.workers),
            gens=((("cpu", costs.gen_busy),),),
            learner=(("cpu", costs.train_busy),),
        )

    @property
    def replicas(self) -> int:
        return len(self.gens)


@dataclass(frozen=True)
class Prediction:
    """The model's figures for one shape.

    Attributes:
        throughput: env steps per second, steady state.
        gen_busy: fraction of the time the generator computes (a replica's mean).
        train_busy: fraction of the time the learner trains.
        mean_batch: envs per generator call.
        bubble: fraction of the time in which no job ran.
        update_s: seconds per update, steady state.
        staleness: fraction of the steady state's decisions (the segments its updates train)
            acted by a policy i versions behind the learner version that trains on them,
            i = 0..k.
        stage_busy: seconds per update each stage computes in the steady state, summed over
            its lanes (env workers, replicas; the learner is one lane).
        stage_util: the fraction of its lanes' time each stage computes; 1 - this is the
            stage's bubbles.
    """

    shape: Shape
    throughput: float
    gen_busy: float
    train_busy: float
    mean_batch: float
    bubble: float
    update_s: float = 0.0
    staleness: tuple[float, ...] = ()
    stage_busy: Mapping[str, float] = field(default_factory=dict)
    stage_util: Mapping[str, float] = field(default_factory=dict)
