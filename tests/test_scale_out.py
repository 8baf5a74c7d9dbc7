"""EBRL scaled out: generator replicas, a data-parallel learner, the weight board.

A run with R replicas and L learner ranks must compute what a 1 + 1 run computes: with k = 0 the
acting versions are deterministic and per-env noise makes actions batch-independent, so the
trajectories are the same, and the data-parallel update is the single-rank update to float
rounding.
"""

from __future__ import annotations

import pytest

from ebrl.schedulers.ebrl import EBRLScheduler
from ebrl.schedulers.ebrl.learner_worker import StalenessError

from .conftest import TINY, make_cfg
from .test_ebrl_scheduler import context

KEYS = ("env/return", "env/episodes", "train/policy_loss", "train/value_loss", "train/approx_kl")
LOCKSTEP = dict(overlap=False, pipeline=True, step_level=True, batch_timeout_ms=1.0)


def cfg8(extra=()):
    return make_cfg([*TINY, "num_envs=8", "scheduler=ebrl", "tracking.enabled=false", *extra])


def run(cfg, sched: EBRLScheduler, n: int = 3):
    _, ctx = context(cfg)
    gen = sched.run(ctx)
    try:
        return [next(gen) for _ in range(n)], ctx
    finally:
        gen.close()


def same(a, b, rel=1e-4):
    for x, y in zip(a, b, strict=True):
        assert x.env_steps == y.env_steps
        for key in KEYS:
            assert x.metrics[key] == pytest.approx(y.metrics[key], rel=rel, abs=1e-6), key


def test_two_replicas_act_for_their_own_env_workers_and_compute_the_same_run():
    cfg = cfg8()
    one, _ = run(cfg, EBRLScheduler(backend="inprocess", sim_workers=2, **LOCKSTEP))
    two, ctx = run(
        cfg, EBRLScheduler(backend="inprocess", sim_workers=2, gen_replicas=2, **LOCKSTEP)
    )
    same(one, two, rel=1e-6)
    lanes = {s.track for s in ctx.timeline.spans if s.stage == "gen"}
    assert lanes == {"gen", "gen1"}  # both replicas acted
    # each replica loaded the learner's weights from the board, never inline (the spans, not
    # the load-time gauge: gauges go out at most every 0.25 s, and a fast run may end first)
    loads = {(s.track, dict(s.args)["source"]) for s in ctx.timeline.spans if s.stage == "load"}
    assert loads == {("gen", "board"), ("gen1", "board")}


def test_the_timeline_keeps_every_workers_last_spans_when_the_run_stops(monkeypatch):
    """Workers send spans at most every ``flush_every_s``, and once more when they stop. With the
    throttled sends turned off, the timeline holds only what the stop sends carried: every
    worker's spans must still be there (a short run on a fast machine ends before a throttled
    send, and its timeline used to miss those spans)."""
    from ebrl.schedulers.ebrl import worker

    monkeypatch.setattr(worker.Worker, "flush_every_s", float("inf"))
    _, ctx = run(
        cfg8(), EBRLScheduler(backend="inprocess", sim_workers=2, gen_replicas=2, **LOCKSTEP)
    )
    seen = {(s.stage, s.track) for s in ctx.timeline.spans}
    assert {("gen", "gen"), ("gen", "gen1"), ("load", "gen"), ("load", "gen1")} <= seen
    assert {s.stage for s in ctx.timeline.spans} >= {"sim", "gen", "load", "train", "sync"}


def test_weights_inline_or_on_the_board_give_the_same_run():
    cfg = cfg8()
    board, _ = run(cfg, EBRLScheduler(backend="inprocess", gen_replicas=2, **LOCKSTEP))
    inline, _ = run(
        cfg, EBRLScheduler(backend="inprocess", gen_replicas=2, weight_board=False, **LOCKSTEP)
    )
    same(board, inline, rel=1e-6)


@pytest.mark.parametrize("k", [1, 2])
def test_the_staleness_bound_holds_per_replica_and_across_them(k, monkeypatch):
    """Two replicas at different versions: the learner checks every segment against k (a
    violation raises StalenessError and fails the test)."""
    cfg = cfg8(["simulator.delay_jitter_s=0.002"])
    sched = EBRLScheduler(backend="inprocess", gen_replicas=2, staleness=k, batch_timeout_ms=1.0)
    reports, _ = run(cfg, sched, n=5)
    for r in reports:
        assert r.metrics["pipeline/staleness_max"] <= k
    assert StalenessError  # the learner's check is the one under test


@pytest.mark.slow  # Ray, 2 replicas and 2 ranks: ~33 s; make test-slow (CI runs it); the
# in-process 2 + 2 runs above stay in make test
def test_replicas_and_ranks_on_ray_compute_the_one_process_run():
    """The issue's check on the engine: 2 replicas and a 2-rank gloo learner on Ray give the
    1 + 1 in-process run's returns, losses and KL."""
    cfg = cfg8()
    one, _ = run(cfg, EBRLScheduler(backend="inprocess", sim_workers=2, **LOCKSTEP))
    sched = EBRLScheduler(backend="ray", sim_workers=2, gen_replicas=2, learner_ranks=2, **LOCKSTEP)
    scaled, ctx = run(cfg, sched)
    same(one, scaled)
    trained = {s.track for s in ctx.timeline.spans if s.stage == "train"}
    assert trained == {"learner", "learner1"}  # both ranks trained every segment
    assert [p.ask.role for p in sched.gpu.placed].count("learner") == 2


def test_settings_that_cannot_scale_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"learner_ranks=2 needs scheduler\.backend=ray"):
        EBRLScheduler(backend="inprocess", learner_ranks=2)
    with pytest.raises(ValueError, match=r"gen_gpus=0\.5 needs scheduler\.backend=ray"):
        EBRLScheduler(backend="inprocess", gen_gpus=0.5)
    with pytest.raises(ValueError, match=r"learner_gpus=1\.5"):
        EBRLScheduler(learner_gpus=1.5)
    cfg = cfg8()
    with pytest.raises(ValueError, match=r"gen_replicas=3 > scheduler\.sim_workers=2"):
        run(cfg, EBRLScheduler(backend="inprocess", gen_replicas=3))
    elastic = make_cfg(
        [*TINY, "num_envs=8", "scheduler=ebrl", "tracking.enabled=false", "resources=elastic"]
    )
    with pytest.raises(ValueError, match=r"resources\.allocator=static"):
        run(elastic, EBRLScheduler(backend="inprocess", gen_replicas=2))
