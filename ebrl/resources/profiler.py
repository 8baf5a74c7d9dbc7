"""Offline profiler: a stage's throughput as a function of its share and batch size.

A *stage function* ``stage_fn(share, batch_size) -> step`` prepares one measurement point (sets
threads, builds inputs) and returns ``step() -> items``, one unit of work that reports how many
items it processed; a step with a ``close`` attribute has it called after its point (envs).
:func:`profile` times ``repeats`` steps per point after one warm-up step.
The share is whatever the pool is counted in: torch threads (= cores) on CPU, SM percent on GPU.

Concrete CPU stage functions (defaults sized so a whole profile takes seconds):

* :func:`gen_stage_fn`: the policy acting on a batch (items: decisions).
* :func:`train_stage_fn`: PPO minibatch updates (items: decisions of a segment consumed, i.e.
  minibatch size divided by the update epochs, so they compare with gen's decisions).
* :func:`sim_stage_fn`: one env group stepping action chunks in this process (items: env steps).

A :class:`Profile` is saved as JSON with the machine, the date, the workload's config and how
long profiling took; :meth:`Profile.compare` gives throughput ratios against another profile.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ebrl.resources.apply import affinity_guard, pin, threads_guard

Step = Callable[[], float]
StageFn = Callable[[int, int], Step]


@dataclass(frozen=True)
class ProfilePoint:
    """Throughput of one stage at one (share, batch size).

    Attributes:
        stage: ``gen``, ``train``, ``sim``.
        share: threads/cores on CPU, SM percent on GPU.
        batch_size: items per step the stage was asked for.
        throughput: median over repeats of items per second (robust to a preempted repeat on
            a busy machine).
        samples: items per second of each repeat (their spread is the noise).
        busy_cores: CPU seconds per wall second while it ran (this process's CPU time over all
            its threads, median over repeats): the cores the stage keeps busy at this share.
            Threads that wait at a synchronisation point sleep (``OMP_WAIT_POLICY=PASSIVE``),
            so a 2-thread learner may keep 1.2 cores busy, not 2. None: not measured (profiles
            from before it was), and the allocator then counts the whole share as busy.
    """

    stage: str
    share: int
    batch_size: int
    throughput: float
    samples: tuple[float, ...] = ()
    busy_cores: float | None = None


def machine_description() -> dict[str, Any]:
    """What the numbers were measured on."""
    from ebrl.resources.topology import discover

    try:
        topo = discover().describe()
    except Exception as e:  # a profile is still worth saving on an odd machine
        topo = f"unknown ({e})"
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "topology": topo,
    }


@dataclass
class Profile:
    """Measured throughputs of one or more stages.

    Attributes:
        points: one per (stage, share, batch size).
        share_unit: what shares count: ``threads`` (CPU) or ``sm_percent`` (GPU).
        machine: :func:`machine_description` of where it was measured.
        created: ISO timestamp.
        workload: the config of what was measured (policy sizes, env, ...), per stage.
        duration_s: seconds profiling took, per stage.
    """

    points: list[ProfilePoint]
    share_unit: str = "threads"
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    workload: dict[str, Any] = field(default_factory=dict)
    duration_s: dict[str, float] = field(default_factory=dict)

    # -- queries --------------------------------------------------------------------------------
    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(sorted({p.stage for p in self.points}))

    def shares(self, stage: str) -> tuple[int, ...]:
        return tuple(sorted({p.share for p in self.points if p.stage == stage}))

    def batch_sizes(self, stage: str) -> tuple[int, ...]:
        return tuple(sorted({p.batch_size for p in self.points if p.stage == stage}))

    def point(self, stage: str, share: int, batch_size: int) -> ProfilePoint | None:
        """The profiled point at (stage, share, batch size), or None."""
        for p in self.points:
            if (p.stage, p.share, p.batch_size) == (stage, share, batch_size):
                return p
        return None

    def throughput(self, stage: str, share: int, batch_size: int) -> float:
        """The measured throughput at a profiled point."""
        p = self.point(stage, share, batch_size)
        if p is None:
            raise KeyError(
                f"no {stage} point at share={share}, batch={batch_size}; profiled shares "
                f"{self.shares(stage)}, batch sizes {self.batch_sizes(stage)}"
            )
        return p.throughput

    def busy(self, stage: str, share: int, batch_size: int) -> float:
        """The cores a stage keeps busy at ``share``: the profiled :attr:`ProfilePoint.busy_cores`
        where that point was measured with it, else the share itself (every unit busy)."""
        p = self.point(stage, share, batch_size)
        return float(share) if p is None or p.busy_cores is None else p.busy_cores

    def curve(self, stage: str, batch_size: int) -> list[tuple[int, float]]:
        """(share, throughput) of one stage at one batch size, by share."""
        pts = [p for p in self.points if p.stage == stage and p.batch_size == batch_size]
        return sorted((p.share, p.throughput) for p in pts)

    def scaled(self, stage: str, factor: float) -> Profile:
        """A copy with one stage's throughputs multiplied by ``factor`` (runtime feedback).

        Busy cores are kept: a stage that got slower (heavier work, a slower simulator) keeps
        its threads as busy as before, each item then costing ``1 / factor`` times the CPU.
        """
        pts = [
            dataclasses.replace(
                p, throughput=p.throughput * factor, samples=tuple(s * factor for s in p.samples)
            )
            if p.stage == stage
            else p
            for p in self.points
        ]
        return dataclasses.replace(self, points=pts)

    def merge(self, other: Profile) -> Profile:
        """Both profiles' points (``other`` wins where both measured a point)."""
        if other.share_unit != self.share_unit:
            raise ValueError(
                f"Profile.merge: share units differ ({self.share_unit} vs {other.share_unit})"
            )
        keep = {(p.stage, p.share, p.batch_size): p for p in self.points}
        keep.update({(p.stage, p.share, p.batch_size): p for p in other.points})
        return Profile(
            points=sorted(keep.values(), key=lambda p: (p.stage, p.batch_size, p.share)),
            share_unit=self.share_unit,
            machine=other.machine or self.machine,
            created=max(self.created, other.created),
            workload={**self.workload, **other.workload},
            duration_s={**self.duration_s, **other.duration_s},
        )

    def compare(self, other: Profile) -> dict[tuple[str, int, int], float]:
        """Throughput ratios ``self / other`` at every point both profiles measured.

        Keys are ``(stage, share, batch_size)``; a ratio above 1 means ``self`` is faster.
        """
        theirs = {(p.stage, p.share, p.batch_size): p.throughput for p in other.points}
        out = {}
        for p in self.points:
            key = (p.stage, p.share, p.batch_size)
            if key in theirs:
                out[key] = p.throughput / theirs[key] if theirs[key] > 0 else math.inf
        return out

    # -- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        pts = [ProfilePoint(**{**p, "samples": tuple(p.get("samples", ()))}) for p in d["points"]]
        return cls(
            points=pts,
            share_unit=d.get("share_unit", "threads"),
            machine=d.get("machine", {}),
            created=d.get("created", ""),
            workload=d.get("workload", {}),
            duration_s=d.get("duration_s", {}),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_dict(json.loads(Path(path).read_text()))


def profile(
    stage_fn: StageFn,
    shares: Sequence[int],
    batch_sizes: Sequence[int],
    repeats: int = 3,
    *,
    stage: str = "stage",
    share_unit: str = "threads",
    workload: dict[str, Any] | None = None,
    min_step_s: float = 0.0,
) -> Profile:
    """Measure ``stage_fn`` at every (share, batch size).

    Each point: ``step = stage_fn(share, batch)``, one untimed warm-up step, then ``repeats``
    timed repeats of at least one step (and at least ``min_step_s``); the point's throughput is
    the median repeat's, and its busy cores the median of the repeats' CPU time over wall time
    (this process's, all threads). torch's thread count and this process's affinity are
    restored afterwards, whatever the stage function set.

    Args:
        stage_fn: ``(share, batch_size) -> step``; ``step() -> items processed``.
        shares: shares to try (threads on CPU, SM percent on GPU).
        batch_sizes: batch sizes to try.
        repeats: timed steps per point.
        stage: the stage's name in the profile.
        share_unit: what ``shares`` count.
        workload: config of what is measured, stored with the profile.
        min_step_s: each repeat runs steps until it lasted at least this long (steadier timing
            of steps shorter than the scheduler's time slice).
    """
    if repeats < 1:
        raise ValueError("profile: repeats must be >= 1")
    t0 = time.perf_counter()
    points = []
    with threads_guard(), affinity_guard():
        for share in shares:
            for batch in batch_sizes:
                step = stage_fn(int(share), int(batch))
                try:
                    step()  # warm-up: allocations, lazy init, caches
                    samples, busy = [], []
                    for _ in range(repeats):
                        items, start, cpu = 0.0, time.perf_counter(), time.process_time()
                        while True:
                            items += step()
                            secs = time.perf_counter() - start
                            if secs >= min_step_s:
                                break
                        samples.append(items / secs if secs > 0 else math.inf)
                        busy.append((time.process_time() - cpu) / secs if secs > 0 else 0.0)
                finally:
                    close = getattr(step, "close", None)
                    if close is not None:
                        close()
                tput = float(np.median(samples))
                cores = float(np.median(busy))
                points.append(
                    ProfilePoint(stage, int(share), int(batch), tput, tuple(samples), cores)
                )
    return Profile(
        points=points,
        share_unit=share_unit,
        machine=machine_description(),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        workload={stage: dict(workload or {})},
        duration_s={stage: time.perf_counter() - t0},
    )


# --- CPU stage functions ----------------------------------------------------------------------
def _use_cores(threads: int, pin_cores: bool) -> None:
    torch.set_num_threads(threads)
    if pin_cores:
        allowed = sorted(os.sched_getaffinity(0))
        pin(0, allowed[: max(1, min(threads, len(allowed)))])


def gen_stage_fn(policy: Any, pin_cores: bool = False, seed: int = 0) -> StageFn:
    """Generation throughput of ``policy`` (decisions/s) at ``threads`` and batch ``B``.

    Args:
        policy: an :class:`ebrl.policies.base.Policy` (e.g. ``StageFactory.policy()``).
        pin_cores: also pin this process to the first ``threads`` allowed cores while measuring
            (:func:`profile` restores the affinity).
        seed: for the random observations.
    """
    from ebrl.types import Observation

    policy = policy.eval()

    def make(threads: int, batch: int) -> Step:
        _use_cores(threads, pin_cores)
        g = torch.Generator().manual_seed(seed)
        obs = Observation(
            obs=torch.randn(batch, policy.spec.obs_dim, generator=g),  # [B, O]
            env_ids=torch.arange(batch),  # [B]
        )

        def step() -> float:
            policy.act(obs)
            return float(batch)

        return step

    return make


def profile_gen_and_train(
    gen_policy: Any,
    train_policy: Any,
    ppo_cfg: Any,
    threads: Sequence[int],
    gen_batches: Sequence[int],
    train_batches: Sequence[int],
    repeats: int,
    shape: dict[str, Any],
    min_step_s: float,
) -> Profile:
    """Profile generation (``gen_policy``) and training (``train_policy`` under ``ppo_cfg``) over
    the same thread shares, and merge the two into one profile."""
    gen = profile(
        gen_stage_fn(gen_policy),
        threads,
        gen_batches,
        repeats,
        stage="gen",
        workload=shape,
        min_step_s=min_step_s,
    )
    train = profile(
        train_stage_fn(train_policy, ppo_cfg),
        threads,
        train_batches,
        repeats,
        stage="train",
        workload=shape | {"update_epochs": ppo_cfg.update_epochs},
        min_step_s=min_step_s,
    )
    return gen.merge(train)


def policy_shape(policy: Any) -> dict[str, Any]:
    """What a profile records about the policy it measured (its class, sizes, parameters)."""
    return {
        "policy": type(policy).__name__,
        "obs_dim": policy.spec.obs_dim,
        "action_dim": policy.spec.action_dim,
        "chunk_size": policy.spec.chunk_size,
        "parameters": sum(p.numel() for p in policy.parameters()),
    }


def train_stage_fn(
    policy: Any, ppo_cfg: Any | None = None, pin_cores: bool = False, seed: int = 0
) -> StageFn:
    """PPO update throughput at ``threads`` and minibatch size ``B``.

    One step is one minibatch update (forward, backward, Adam) on random data, with KL early
    stopping off so every step does the same work. Items are ``B / update_epochs``: the segment
    decisions consumed per second, since each decision is trained on ``update_epochs`` times.

    Args:
        policy: the learner's policy (trained in place: pass a copy you can spare).
        ppo_cfg: :class:`ebrl.algos.ppo.PPOConfig` (default: its defaults).
        pin_cores: pin to the first ``threads`` allowed cores while measuring.
        seed: for the random data.
    """
    from ebrl.algos.loss import FlatBatch, sgd_update
    from ebrl.algos.ppo import PPOConfig

    cfg = ppo_cfg if ppo_cfg is not None else PPOConfig()
    one = dataclasses.replace(cfg, update_epochs=1, num_minibatches=1)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    k, a, o = policy.spec.chunk_size, policy.spec.action_dim, policy.spec.obs_dim

    def make(threads: int, batch: int) -> Step:
        _use_cores(threads, pin_cores)
        g = torch.Generator().manual_seed(seed)
        obs = torch.randn(batch, o, generator=g)  # [B, O]
        actions = torch.randn(batch, k, a, generator=g)  # [B, K, A]
        with torch.no_grad():
            lp = policy.dist(obs, actions).log_prob(actions).sum(dim=2)  # [B, K]
        data = FlatBatch(
            obs=obs,
            actions=actions,
            behav_logprob=lp.sum(dim=1),
            prox_logprob=lp,
            advantages=torch.randn(batch, generator=g),
            returns=torch.randn(batch, generator=g),
        )
        policy.train()

        def step() -> float:
            sgd_update(policy, opt, data, one, target_kl=None, vf_coef=cfg.vf_coef)
            return batch / cfg.update_epochs

        return step

    return make


def sim_stage_fn(
    make_env: Callable[[int], Any] | None = None,
    chunk_size: int = 4,
    seed: int = 0,
    decisions: bool = False,
    make_group: Callable[[list[int]], Any] | None = None,
) -> StageFn:
    """Simulation throughput (env steps/s) of one env group of ``B`` envs in this process.

    The share is the cores the process may use; a simulator steps on one thread, so it only
    pins (share cores), which is what a sim process gets from a plan.

    Args:
        make_env: env id -> an :class:`ebrl.envs.base.Env` (an EnvGroup of them is timed).
        chunk_size: K actions per env per step.
        seed: reset seeds and random actions.
        decisions: count decisions (one action chunk per env per step, the unit of gen and
            train) instead of env steps.
        make_group: env ids -> the group to time, instead of ``make_env`` (the run's own group:
            one vectorised instance for a vectorised simulator).
    """
    from ebrl.envs.base import EnvGroup
    from ebrl.types import ActionChunk

    if (make_env is None) == (make_group is None):
        raise ValueError("sim_stage_fn: give make_env or make_group")

    def make(cores: int, batch: int) -> Step:
        allowed = sorted(os.sched_getaffinity(0))
        pin(0, allowed[: max(1, min(cores, len(allowed)))])
        ids_ = list(range(batch))
        if make_group is not None:
            group = make_group(ids_)
        else:
            group = EnvGroup([make_env(i) for i in ids_], ids_, seed=seed)  # type: ignore[misc]
        group.reset()
        spec = group.spec
        rng = np.random.default_rng(seed)
        ids = torch.arange(batch)

        def step() -> float:
            acts = rng.uniform(
                spec.action_low, spec.action_high, (batch, chunk_size, spec.action_dim)
            )
            chunk = ActionChunk(
                actions=torch.from_numpy(acts.astype(np.float32)),  # [B, K, A]
                logprob=torch.zeros(batch),
                value=torch.zeros(batch),
                env_ids=ids,
                policy_version=torch.zeros(batch, dtype=torch.int64),
            )
            steps = float(group.step_chunk(chunk).n_steps.sum())
            return float(batch) if decisions else steps

        step.close = group.close  # type: ignore[attr-defined]
        return step

    return make


def _mlp(obs_dim: int, action_dim: int, chunk_size: int, hidden: int, layers: int) -> Any:
    from ebrl.policies.base import PolicySpec
    from ebrl.policies.mlp import MLPPolicy

    torch.manual_seed(0)
    return MLPPolicy(PolicySpec(obs_dim, action_dim, chunk_size), hidden=hidden, layers=layers)


def profile_cpu(
    threads: Sequence[int] = (1, 2),
    gen_batches: Sequence[int] = (8, 32),
    train_batches: Sequence[int] = (64, 256),
    repeats: int = 3,
    *,
    min_step_s: float = 0.05,
    obs_dim: int = 35,
    action_dim: int = 8,
    chunk_size: int = 4,
    hidden: int = 256,
    layers: int = 3,
    policy_factory: Callable[[], Any] | None = None,
) -> Profile:
    """Profile gen and train of an MLP policy on this machine's CPUs (seconds at the defaults).

    The default sizes are PushCube's state observation and action dimensions with the run's
    default MLP. Pass ``policy_factory`` (e.g. ``StageFactory.policy``) to profile another
    policy; each stage gets its own copy.
    """
    from ebrl.algos.ppo import PPOConfig

    allowed = len(os.sched_getaffinity(0))
    threads = [t for t in threads if t <= allowed] or [1]
    build = policy_factory or (lambda: _mlp(obs_dim, action_dim, chunk_size, hidden, layers))
    gen_policy = build()
    shape = policy_shape(gen_policy)
    if policy_factory is None:
        shape |= {"hidden": hidden, "layers": layers}
    return profile_gen_and_train(
        gen_policy,
        build(),
        PPOConfig(),
        threads,
        gen_batches,
        train_batches,
        repeats,
        shape,
        min_step_s,
    )
