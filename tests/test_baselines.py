"""RLinf's three modes as replicas on ebrl's stages: their schedules on the deterministic fake env.

Each test spies on the stage classes (the in-process backends run every worker in this process),
so it sees which envs every gen and sim call served and when, and what the learner trained on.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import pytest
import torch
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

from baselines.async_ppo import AsyncScheduler
from baselines.colocated import ColocatedScheduler, all_cores, offload, reload
from baselines.hybrid import HybridScheduler
from ebrl.config import ConfigError, validate
from ebrl.policies.base import PolicySpec
from ebrl.policies.mlp import MLPPolicy
from ebrl.policies.transformer import TransformerPolicy
from ebrl.schedulers.base import RunContext
from ebrl.schedulers.ebrl.scheduler import env_groups
from ebrl.stages import GenStage, SimStage, TrainStage
from ebrl.stages.factory import StageFactory
from ebrl.timeline import Timeline
from ebrl.types import Observation

from .conftest import TINY, make_cfg


@dataclass(frozen=True)
class Call:
    stage: str  # gen, sim, train
    envs: frozenset[int]
    start: float
    end: float
    threads: int | None = None

    def overlaps(self, other: Call) -> bool:
        return self.start < other.end and other.start < self.end


def cfg_of(scheduler: str, extra=()):
    return make_cfg([*TINY, f"scheduler={scheduler}", "tracking.enabled=false", *extra])


def context(cfg) -> RunContext:
    run = validate(cfg)
    return RunContext(
        factory=StageFactory.from_config(cfg),
        decisions_per_env=run.decisions_per_env,
        env_groups=run.env_groups,
        timeline=Timeline(),
    )


def record(sched, cfg, iterations: int, monkeypatch, train_delay: float = 0.0):
    """Run ``iterations`` updates; return (reports, stage calls, trained (version, segment)s,
    context)."""
    calls: list[Call] = []
    trained = []
    gen0, sim0, train0 = GenStage.generate, SimStage.step, TrainStage.train

    def gen(self, batch):
        t = time.perf_counter()
        out = gen0(self, batch)
        calls.append(Call("gen", frozenset(batch.env_ids.tolist()), t, time.perf_counter()))
        return out

    def sim(self, chunk):
        t = time.perf_counter()
        out = sim0(self, chunk)
        calls.append(Call("sim", frozenset(chunk.env_ids.tolist()), t, time.perf_counter()))
        return out

    def train(self, seg):
        t = time.perf_counter()
        trained.append((self.version, seg))
        time.sleep(train_delay)
        out = train0(self, seg)
        calls.append(Call("train", frozenset(), t, time.perf_counter(), self.threads))
        return out

    monkeypatch.setattr(GenStage, "generate", gen)
    monkeypatch.setattr(SimStage, "step", sim)
    monkeypatch.setattr(TrainStage, "train", train)
    ctx = context(cfg)
    run = sched.run(ctx)
    try:
        reports = [next(run) for _ in range(iterations)]
    finally:
        run.close()
    return reports, calls, trained, ctx


def staleness(trained) -> list[int]:
    return [int((v - seg.policy_version).max()) for v, seg in trained]


def no_rollout_during_training(calls: list[Call]) -> bool:
    trains = [c for c in calls if c.stage == "train"]
    return not any(c.overlaps(t) for t in trains for c in calls if c.stage in ("gen", "sim"))


# --- Colocated --------------------------------------------------------------------------------
def test_colocated_turns_offload_and_reload_every_iteration(monkeypatch):
    cfg = cfg_of("colocated")
    sched = instantiate(cfg.scheduler)
    assert isinstance(sched, ColocatedScheduler)
    loads = []
    import baselines.colocated as colocated

    def spy_reload(policy, parked, version, weights):
        loads.append(version)
        colocated_reload(policy, parked, version, weights)

    colocated_reload = colocated.reload
    monkeypatch.setattr(colocated, "reload", spy_reload)
    reports, calls, trained, ctx = record(sched, cfg, 3, monkeypatch)

    # RLinf's step order: rollout (gen, then every env group), train, sync; nothing overlaps.
    # The offload closes the last gen call, inside its span (spans are recorded as they end).
    spans = ctx.timeline.spans
    t = ctx.decisions_per_env
    rollout = ["gen", "sim", "sim"] * t
    per_iter = [*rollout[:-3], "offload", "gen", "sim", "sim", "train", "sync"]
    assert [s.stage for s in spans] == ["sim"] + per_iter * 3
    turns = [s for s in spans if s.stage != "offload"]
    assert all(a.end <= b.start for a, b in itertools.pairwise(turns))
    for i, s in enumerate(spans):
        if s.stage == "offload":
            assert spans[i + 1].stage == "gen"
            assert spans[i + 1].start <= s.start and s.end <= spans[i + 1].end
    assert no_rollout_during_training(calls)
    # the generator's weights were dropped after every rollout and reloaded from the learner
    assert loads == [1, 2, 3]
    assert staleness(trained) == [0, 0, 0]
    assert all(r.metrics["pipeline/staleness_max"] == 0 for r in reports)
    # gen and train each had every core in their turn
    assert {c.threads for c in calls if c.stage == "train"} == {all_cores()}


def test_colocated_without_offload_only_syncs(monkeypatch):
    cfg = cfg_of("colocated", ["scheduler.offload=false", "scheduler.threads=1"])
    _, calls, _, ctx = record(instantiate(cfg.scheduler), cfg, 2, monkeypatch)
    stages = [s.stage for s in ctx.timeline.spans]
    assert "offload" not in stages and stages.count("sync") == 2
    assert {c.threads for c in calls if c.stage == "train"} == {1}


@pytest.mark.parametrize("make", [MLPPolicy, lambda spec: TransformerPolicy(spec, size="S")])
def test_offload_frees_weights_and_reload_restores_the_learners(make):
    spec = PolicySpec(obs_dim=4, action_dim=2, chunk_size=2)
    torch.manual_seed(0)
    acting, learner = make(spec), make(spec)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(0.1)
    obs = Observation(obs=torch.randn(3, 4), env_ids=torch.arange(3))
    noise = torch.randn(3, 2, 2)
    expected = learner.act(obs, noise=noise).actions

    parked = offload(acting)
    assert all(p.is_meta for p in acting.parameters())
    reload(acting, parked, 7, learner.get_weights()[1])
    assert acting.version == 7
    assert not any(p.is_meta or b.is_meta for p in acting.parameters() for b in acting.buffers())
    assert torch.allclose(acting.act(obs, noise=noise).actions, expected)


# --- Hybrid -----------------------------------------------------------------------------------
HYBRID = ["num_envs=8", "simulator.delay_s=0.002", "scheduler.backend=inprocess"]


def hybrid_run(monkeypatch):
    cfg = cfg_of("hybrid", HYBRID)
    sched = instantiate(cfg.scheduler)
    assert isinstance(sched, HybridScheduler)
    reports, calls, trained, _ = record(sched, cfg, 3, monkeypatch, train_delay=0.03)
    groups = [frozenset(g) for g in env_groups(StageFactory.from_config(cfg).env_partition(2), 2)]
    return reports, calls, trained, groups


def test_hybrid_trains_after_the_rollout_on_all_cores(monkeypatch):
    reports, calls, trained, groups = hybrid_run(monkeypatch)
    assert no_rollout_during_training(calls)
    assert staleness(trained) == [0, 0, 0]
    assert all(r.metrics["pipeline/staleness_bound"] == 0 for r in reports)
    # the generator acts on whole env groups (lock step within a group)
    for c in calls:
        if c.stage == "gen":
            assert c.envs in (groups[0], groups[1])  # one group per batch: pipelined
    assert {c.threads for c in calls if c.stage == "train"} == {all_cores()}


def test_hybrid_pipelines_sim_of_one_group_with_gen_of_the_other(monkeypatch):
    _, calls, _, groups = hybrid_run(monkeypatch)
    gens = [c for c in calls if c.stage == "gen"]
    sims = [c for c in calls if c.stage == "sim"]
    assert any(
        g.envs <= groups[a] and s.envs <= groups[1 - a] and g.overlaps(s)
        for a in (0, 1)
        for g in gens
        for s in sims
    )


@pytest.mark.parametrize(
    "extra, words",
    [(["env_groups=1"], "env_groups=1"), (["num_envs=3", "env_groups=2"], "num_envs=3")],
)
def test_hybrid_refuses_what_would_not_be_hybrid(extra, words):
    cfg = cfg_of("hybrid", ["scheduler.backend=inprocess", *extra])
    with pytest.raises(ValueError, match=words):
        next(instantiate(cfg.scheduler).run(context(cfg)))


# --- Async ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2])
def test_async_overlaps_rollout_with_training_within_staleness(k, monkeypatch):
    cfg = cfg_of(
        "async",
        [
            f"scheduler.staleness={k}",
            "scheduler.backend=inprocess",
            "simulator.delay_s=0.001",
            "threads.gen=1",
            "threads.train=1",
        ],
    )
    sched = instantiate(cfg.scheduler)
    assert isinstance(sched, AsyncScheduler) and sched.engine.k == k
    reports, calls, trained, _ = record(sched, cfg, 4, monkeypatch, train_delay=0.05)
    assert not no_rollout_during_training(calls)  # rollout and training at once
    lags = staleness(trained)
    assert max(lags) <= k and min(lags) >= 0
    assert max(lags) >= 1  # it did act with an older policy
    assert all(r.metrics["pipeline/staleness_max"] <= k for r in reports)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["algo=grpo", "algo.cfg.group_size=2"], "PPO only"),
        (["algo.cfg.behave_weight_threshold=null"], "behave_weight_threshold"),
        (["algo.cfg.dual_clip=null"], "dual_clip"),
        ([f"threads.gen={all_cores()}", "threads.train=1"], "fixed split"),
    ],
)
def test_async_refuses_what_would_not_be_rlinf_async(extra, words):
    cfg = cfg_of("async", ["scheduler.backend=inprocess", "threads.train=1", *extra])
    with pytest.raises(ValueError, match=words):
        next(instantiate(cfg.scheduler).run(context(cfg)))


def test_async_defaults_to_a_split_that_fits_two_cores():
    """The CPU sweeps run ``scheduler=async`` beside the others with no per-scheduler threads:
    its group sets the fixed split (1 + 1), the command line can still change it."""
    base = [o for o in TINY if not o.startswith("threads.")] + ["tracking.enabled=false"]
    cfg = make_cfg([*base, "scheduler=async", "scheduler.backend=inprocess"])
    assert (cfg.threads.gen, cfg.threads.train) == (1, 1)
    instantiate(cfg.scheduler).check(context(cfg))  # accepted on this machine
    assert make_cfg([*base, "scheduler=async", "threads.train=3"]).threads.train == 3
    assert make_cfg([*base, "scheduler=ebrl"]).threads.train == 2  # the others: the default


# --- configuration ----------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 3])
def test_async_staleness_outside_1_2_fails_validation(k):
    with pytest.raises(ConfigError, match=f"staleness={k}"):
        validate(cfg_of("async", [f"scheduler.staleness={k}"]))
    with pytest.raises(ValueError, match=f"staleness={k}"):
        AsyncScheduler(staleness=k)


@pytest.mark.parametrize(
    "scheduler, key",
    [
        ("colocated", "scheduler.backend=ray"),
        ("hybrid", "scheduler.overlap=true"),
        ("hybrid", "scheduler.staleness=1"),
        ("async", "scheduler.pipeline=true"),
        ("async", "scheduler.step_level=true"),
    ],
)
def test_level_switches_are_not_keys_of_the_baselines(scheduler, key):
    with pytest.raises(ConfigCompositionException):
        cfg_of(scheduler, [key])


def test_colocated_runs_through_train(tmp_path):
    from ebrl.train import train

    cfg = make_cfg([*TINY, "scheduler=colocated", "tracking.enabled=false"], tmp_path)
    s = train(cfg)
    assert s.scheduler == "colocated" and s.scheduler_class == "ColocatedScheduler"
    assert s.iterations == 3
    assert {"gen", "sim", "train", "sync", "offload"} <= set(s.stage_busy_s)
