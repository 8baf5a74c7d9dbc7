"""ebrl's own stages as the offline profiler times them (``ebrl.resources.profiler``).

A stage function ``stage_fn(share, batch_size) -> step`` (the profiler's contract), with
defaults sized so a whole profile takes seconds:

* :func:`gen_stage_fn`: the policy acting on a batch (items: decisions).
* :func:`train_stage_fn`: PPO minibatch updates (items: decisions of a segment consumed, i.e.
  minibatch size divided by the update epochs, so they compare with gen's decisions).
* :func:`sim_stage_fn`: one env group stepping action chunks in this process (items: env steps).

:func:`profile_for_run` profiles a run's own policy and simulator into a stage-profile file
(``ebrl-plan-profile/1``, :func:`to_profile`); :func:`profile_cpu` an MLP on this machine. The
resource manager calls these; it imports no policy, algorithm or env itself.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ebrl.algos.loss import FlatBatch, sgd_update
from ebrl.algos.ppo import PPOConfig
from ebrl.envs.base import EnvGroup
from ebrl.plan.profile import Point, Profile, StageProfile
from ebrl.policies.base import PolicySpec
from ebrl.policies.mlp import MLPPolicy
from ebrl.resources.apply import pin
from ebrl.resources.profiler import RateTable, StageFn, Step, profile
from ebrl.types import ActionChunk, Observation


def ppo_config(cfg: Mapping[str, Any]) -> Any:
    """The run's :class:`ebrl.algos.ppo.PPOConfig` (the ``algo.cfg`` keys it has), for
    timing a learner update outside the run."""
    algo = dict(cfg["algo"].get("cfg", {}) or {})
    names = {f.name for f in dataclasses.fields(PPOConfig)}
    return PPOConfig(**{k: v for k, v in algo.items() if k in names})


def profile_for_run(
    factory: Any,
    threads: Sequence[int],
    gen_batches: Sequence[int],
    minibatch: int,
    sim_group: int,
    repeats: int = 2,
    min_step_s: float = 0.05,
) -> Profile:
    """Profile this run's policy: gen at each thread count and batch, train at its minibatch,
    and one env worker's group of ``sim_group`` envs on one core; as a stage-profile file
    (:func:`to_profile`).

    Args:
        factory: a :class:`~ebrl.stages.factory.StageFactory` that knows the env spec; gen and
            train each get a fresh copy of the run's initial policy.
        threads: thread counts to measure (the pool's possible shares).
        gen_batches: generator batch sizes to measure.
        minibatch: the learner's minibatch (decisions).
        sim_group: envs per env worker.
        repeats: timed repeats per point.
        min_step_s: each repeat lasts at least this long.
    """
    ppo = ppo_config(factory.cfg)
    policy = factory.policy()
    shape = policy_shape(policy)
    prof = profile_gen_and_train(
        policy,
        factory.policy(),
        ppo,
        threads,
        gen_batches,
        [minibatch],
        repeats,
        shape,
        min_step_s,
    )
    chunk = int(factory.cfg.get("chunk_size", policy.spec.chunk_size))
    sim = profile(
        sim_stage_fn(
            make_group=lambda ids: factory.group(ids, probe=True, seed=0),
            chunk_size=chunk,
            decisions=True,
        ),
        [1],
        [sim_group],
        repeats,
        stage="sim",
        workload={"simulator": str(factory.cfg.get("simulator", {}).get("name", "?"))},
        min_step_s=min_step_s,
    )
    table = prof.merge(sim)
    simulator = factory.cfg.get("simulator") or {}
    episode = simulator.get("max_episode_steps") or simulator.get("episode_len")
    source = (
        f"the run's offline profile (ebrl.stages.profile), {table.created} on "
        f"{table.machine.get('host')} in {sum(table.duration_s.values()):.1f} s: policy "
        f"{shape['policy']} ({shape['parameters']} parameters), simulator "
        f"{str(simulator.get('_target_', '?')).rsplit('.', 1)[-1]}"
    )
    minibatches = max(1, ppo.num_minibatches)
    return to_profile(table, minibatches, chunk, int(episode) if episode else None, source)


def to_profile(
    table: RateTable,
    minibatches: int,
    chunk_size: int,
    episode_steps: int | None,
    source: str,
) -> Profile:
    """Measured CPU rates (gen, train and sim from :func:`~ebrl.resources.profiler.profile`) as
    a stage-profile file, which :func:`~ebrl.resources.profiler.rate_table` reads back to them.

    A gen point at batch ``b`` with rate ``x`` is a call of ``b / x`` seconds. Train was timed a
    minibatch ``B`` at a time, each segment decision counted once: an update of
    ``B * minibatches`` decisions (every epoch and minibatch) takes ``B * minibatches / x``
    seconds. The simulators' rate ``y`` (one worker on one core) is one env's chunk of ``1 / y``.

    Args:
        table: the rates, with ``gen``, ``train`` and ``sim`` points.
        minibatches: the learner's minibatches per epoch (``algo.cfg.num_minibatches``).
        chunk_size: K, env steps per decision.
        episode_steps: env steps per episode (None: episodes never cut a chunk short).
        source: how the numbers were made.
    """

    def points(stage: str, per: int) -> tuple[Point, ...]:
        return tuple(
            Point(
                p.batch_size * per,
                p.batch_size * per / p.throughput,
                threads=p.share,
                busy=table.busy(stage, p.share, p.batch_size),
                repeats_s=tuple(p.batch_size * per / x for x in p.samples),
            )
            for p in table.points
            if p.stage == stage
        )

    sim = next(p for p in table.points if p.stage == "sim")
    return Profile(
        (1.0 / sim.throughput,),
        min(1.0, table.busy("sim", sim.share, sim.batch_size)),
        StageProfile(points("gen", 1), "batch"),
        StageProfile(points("train", minibatches), "samples"),
        chunk_size=chunk_size,
        episode_steps=episode_steps,
        source=source,
    )


# --- run time ---------------------------------------------------------------------------------


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
    policy = policy.eval()

    def make(threads: int, batch: int) -> Step:
        _use_cores(threads, pin_cores)
        g = torch.Generator().manual_seed(seed)
        dev = policy_device(policy)  # the observations where the policy acts
        obs = Observation(
            obs=torch.randn(batch, policy.spec.obs_dim, generator=g).to(dev),  # [B, O]
            env_ids=torch.arange(batch, device=dev),  # [B]
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
) -> RateTable:
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


def policy_device(policy: Any) -> torch.device:
    """Where ``policy`` computes: its parameters' device (the CPU for one without any)."""
    first = next(iter(policy.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def sampled_batch(
    policy: Any, batch: int, g: torch.Generator, device: torch.device | None = None
) -> FlatBatch:
    """A learner's minibatch of ``batch`` decisions as a rollout makes them: random
    observations, the chunks (and their extras) the policy samples for them, its own scores as
    the behaviour and proximal log-probs, random advantages and returns; every tensor on
    ``device`` (default: the policy's, :func:`policy_device`), where the loss meets them."""
    device = device if device is not None else policy_device(policy)
    spec = policy.spec
    obs = torch.randn(batch, spec.obs_dim, generator=g).to(device)  # [B, O]
    noise = torch.randn(batch, spec.chunk_size, spec.action_dim, generator=g)  # [B, K, A]
    with torch.no_grad():
        chunk = policy.act(
            Observation(obs=obs, env_ids=torch.arange(batch, device=device)),
            noise=noise.to(device),
        )
        actions = chunk.actions  # [B, K, A]
        lp = policy.dist(obs, actions, chunk.extras).log_prob(actions).sum(dim=2)  # [B, K]
    return FlatBatch(
        obs=obs,
        actions=actions,
        behav_logprob=lp.sum(dim=1),
        prox_logprob=lp,
        advantages=torch.randn(batch, generator=g).to(device),
        returns=torch.randn(batch, generator=g).to(device),
        extras=chunk.extras,
    )


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
    cfg = ppo_cfg if ppo_cfg is not None else PPOConfig()
    one = dataclasses.replace(cfg, update_epochs=1, num_minibatches=1)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=cfg.adam_eps)

    def make(threads: int, batch: int) -> Step:
        _use_cores(threads, pin_cores)
        data = sampled_batch(policy, batch, torch.Generator().manual_seed(seed))
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
) -> RateTable:
    """Profile gen and train of an MLP policy on this machine's CPUs (seconds at the defaults).

    The default sizes are PushCube's state observation and action dimensions with the run's
    default MLP. Pass ``policy_factory`` (e.g. ``StageFactory.policy``) to profile another
    policy; each stage gets its own copy.
    """
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
