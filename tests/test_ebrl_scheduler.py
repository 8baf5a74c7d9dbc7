"""The EBRL scheduler on the deterministic fake env (in-process backend unless said otherwise)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebrl.schedulers.base import StageError
from ebrl.schedulers.ebrl import EBRLScheduler
from ebrl.stages import TrainStage

from .conftest import TINY, context, make_cfg

LEVELS = list(itertools.product([False, True], repeat=3))  # overlap, pipeline, step_level


def collect(cfg, sched: EBRLScheduler, iterations: int, monkeypatch, train_delay: float = 0.0):
    """Run ``iterations`` updates; return the reports and every segment the learner trained on."""
    segments = []
    orig = TrainStage.train

    def spy(self, seg):
        segments.append((self.version, seg))
        if train_delay:
            import time

            time.sleep(train_delay)
        return orig(self, seg)

    monkeypatch.setattr(TrainStage, "train", spy)
    _, ctx = context(cfg)
    gen = sched.run(ctx)
    try:
        reports = [next(gen) for _ in range(iterations)]
    finally:
        gen.close()
    return reports, segments, ctx


def fake_cfg(extra=()):
    return make_cfg(
        [*TINY, "num_envs=6", "env_groups=2", "scheduler=ebrl", "tracking.enabled=false", *extra]
    )


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    k=st.integers(0, 8),
    levels=st.sampled_from(LEVELS),
    jitter=st.sampled_from([0.0, 0.0005, 0.002]),
    train_delay=st.sampled_from([0.0, 0.01, 0.05]),
)
def test_staleness_bound_holds_under_random_delays(k, levels, jitter, train_delay):
    overlap, pipeline, step_level = levels
    cfg = fake_cfg([f"simulator.delay_jitter_s={jitter}"])
    sched = EBRLScheduler(
        backend="inprocess",
        sim_workers=2,
        overlap=overlap,
        staleness=k,
        pipeline=pipeline,
        step_level=step_level,
        batch_timeout_ms=1.0,
    )
    with pytest.MonkeyPatch.context() as mp:
        reports, segments, _ = collect(cfg, sched, 4, mp, train_delay)
    bound = k if overlap else 0
    assert len(segments) >= 4
    for version, seg in segments:
        assert int((version - seg.policy_version).max()) <= bound
        assert int((version - seg.policy_version).min()) >= 0
    for r in reports:
        assert r.metrics["pipeline/staleness_max"] <= bound


@pytest.mark.parametrize("overlap,pipeline,step_level", LEVELS)
def test_no_transition_lost_duplicated_or_reordered(overlap, pipeline, step_level, monkeypatch):
    """Every env's decisions form one unbroken, ordered history across all segments."""
    cfg = fake_cfg(["simulator.delay_jitter_s=0.0005"])
    sched = EBRLScheduler(
        backend="inprocess",
        overlap=overlap,
        staleness=2,
        pipeline=pipeline,
        step_level=step_level,
        batch_timeout_ms=1.0,
    )
    _, segments, _ = collect(cfg, sched, 4, monkeypatch)
    env_ids = segments[0][1].env_ids
    assert env_ids.tolist() == list(range(6))
    obs = torch.cat([s.obs for _, s in segments])  # [4T, N, O]
    final = torch.cat([s.final_obs for _, s in segments])
    done = torch.cat([s.terminated | s.truncated for _, s in segments])
    ep = torch.cat([s.episode_id for _, s in segments])
    step = torch.cat([s.episode_step for _, s in segments])
    n_steps = torch.cat([s.n_steps for _, s in segments])
    actions = torch.cat([s.actions for _, s in segments])  # [4T, N, K, A]
    # CountingEnv obs: [env id, resets so far, t in episode, running sum of action[0]]
    assert torch.equal(obs[:, :, 0], env_ids.float().expand(obs.shape[:2]))
    for t in range(obs.shape[0] - 1):
        cont = ~done[t]
        # the next decision starts where this one ended (nothing lost, nothing doubled)
        assert torch.equal(obs[t + 1][cont], final[t][cont])
        assert torch.equal(ep[t + 1], ep[t] + done[t].long())
        assert torch.equal(step[t + 1], torch.where(done[t], 0, step[t] + n_steps[t]))
    # actions were applied in order: the running sum moved by exactly the executed action[0]s
    k = actions.shape[2]
    executed = (actions[..., 0] * (torch.arange(k) < n_steps[..., None])).sum(-1)
    assert torch.allclose(final[:, :, 3] - obs[:, :, 3], executed, atol=1e-4)


def test_levels_shape_the_schedule(monkeypatch):
    """All levels off: no gen runs while the learner trains. Overlap on: they do overlap."""
    cfg = fake_cfg(["simulator.delay_s=0.001"])
    off = EBRLScheduler(backend="inprocess", overlap=False, pipeline=False, step_level=False)
    _, _, ctx = collect(cfg, off, 3, monkeypatch, train_delay=0.05)
    trains = [s for s in ctx.timeline.spans if s.stage == "train"]
    sims = [s for s in ctx.timeline.spans if s.stage == "sim" and "reset" not in dict(s.args)]
    for tr in trains:
        assert not any(s.start < tr.end and s.end > tr.start for s in sims)
    on = EBRLScheduler(backend="inprocess", overlap=True, staleness=1)
    _, _, ctx = collect(cfg, on, 3, monkeypatch, train_delay=0.05)
    trains = [s for s in ctx.timeline.spans if s.stage == "train"]
    sims = [s for s in ctx.timeline.spans if s.stage == "sim"]
    assert any(s.start < tr.end and s.end > tr.start for tr in trains for s in sims)


def test_a_trial_of_another_thread_split_moves_the_generator_and_the_learner(monkeypatch, tmp_path):
    """A shortlisted shape that differs only in its threads: the move sends the new split to
    the replica and the learner (torch threads set in their workers), and the run goes on."""
    import dataclasses

    from ebrl.schedulers.ebrl import control, worker

    applied = []
    orig_apply = worker.Worker.apply_resources

    def spy_apply(self, msg):
        done = orig_apply(self, msg)
        applied.append(done)
        return done

    monkeypatch.setattr(worker.Worker, "apply_resources", spy_apply)

    def other(choice):
        g, t = choice.shape.threads
        return (choice.shape, dataclasses.replace(choice.shape, threads=(g, 3 - t)))

    monkeypatch.setattr(control, "shortlist", other)
    cfg = fake_cfg(["threads.gen=1", "threads.train=2", "budget.iterations=12"])
    sched = EBRLScheduler(backend="inprocess", pipeline=None, step_level=False, reshape_window=1)
    _, ctx = context(cfg)
    ctx = dataclasses.replace(ctx, manage_resources=True, run_dir=tmp_path)
    gen = sched.run(ctx)
    try:
        reports = [next(gen) for _ in range(5)]
    finally:
        gen.close()
    start = sched.shape_choice.shape.threads
    assert start is not None
    moved = (start[0], 3 - start[1])
    learner = [a.threads for a in applied if a.worker == "learner"]
    assert learner[0] == start[1] and moved[1] in learner[1:]
    rec = sched.shape_choice.recalibration
    assert rec is not None and [t.shape.threads for t in rec.trials] == [start, moved]
    assert reports[3].metrics["shape/final_train_threads"] == float(rec.after.threads[1])


def test_stage_exception_names_the_stage():
    cfg = fake_cfg(["simulator.fail_after_steps=5"])
    sched = EBRLScheduler(backend="inprocess")
    _, ctx = context(cfg)
    with pytest.raises(StageError, match=r"stage 'sim\d' failed: RuntimeError: .*injected failure"):
        for _ in sched.run(ctx):
            pass


def test_a_run_reshaped_in_flight_keeps_every_history_and_the_bound(monkeypatch, tmp_path):
    """The resource manager measures its shortlist in the run: one group in lock step, then
    (``Reshape`` to every replica and env worker between two batches) the step level one env a
    call, then it keeps the faster. No decision is lost, doubled or reordered, the staleness
    bound holds across the switches, and the trials are logged and saved."""
    import dataclasses
    import json

    from ebrl.resources.model import Shape
    from ebrl.schedulers.ebrl import control

    step1 = Shape(1, True, 1, 0.001)  # one env a call: every batch under it is 1
    monkeypatch.setattr(control, "shortlist", lambda choice: (choice.shape, step1))
    # a run long enough that its trials (2 shapes and an update to settle) fit a quarter of it
    cfg = fake_cfg(["simulator.delay_jitter_s=0.0005", "budget.iterations=12"])
    sched = EBRLScheduler(
        backend="inprocess", staleness=1, pipeline=None, step_level=False, batch_timeout_ms=1.0,
        reshape_window=1,
    )  # fmt: skip
    _, ctx = context(cfg)
    ctx = dataclasses.replace(ctx, manage_resources=True, run_dir=tmp_path)
    segments = []
    orig = TrainStage.train

    def spy(self, seg):
        segments.append((self.version, seg))
        return orig(self, seg)

    monkeypatch.setattr(TrainStage, "train", spy)
    gen = sched.run(ctx)
    try:
        reports = [next(gen) for _ in range(5)]
    finally:
        gen.close()
    assert sched.shape_choice is not None and not sched.shape_choice.shape.step_level
    # update 0 is start-up; update 1 measures the lock step, update 2 settles after the move
    # (its interval still holds lock-step decisions), update 3 measures the step level
    assert "shape/trials" not in reports[2].metrics
    assert reports[3].metrics["shape/trials"] == 2.0
    rec = sched.shape_choice.recalibration
    assert rec is not None and [t.shape for t in rec.trials] == [sched.shape_choice.shape, step1]
    assert all(t.updates == 1 and t.env_steps > 0 for t in rec.trials)
    assert rec.after == max(rec.trials, key=lambda t: t.rate).shape
    assert reports[3].metrics["shape/reshaped"] == float(rec.after == step1)
    saved = json.loads((tmp_path / "shape.json").read_text())["recalibration"]
    assert [t["step_level"] for t in saved["trials"]] == [False, True]
    for version, seg in segments:
        assert int((version - seg.policy_version).min()) >= 0
        assert int((version - seg.policy_version).max()) <= 1
    obs = torch.cat([s.obs for _, s in segments])
    final = torch.cat([s.final_obs for _, s in segments])
    done = torch.cat([s.terminated | s.truncated for _, s in segments])
    for t in range(obs.shape[0] - 1):
        cont = ~done[t]
        assert torch.equal(obs[t + 1][cont], final[t][cont])
    # the generator acted on whole groups, then one env at a time: its calls in the timeline
    batches = [dict(s.args)["batch"] for s in ctx.timeline.spans if s.stage == "gen"]
    assert batches[0] >= 3 and 1 in batches[batches.index(max(batches)) :]


def test_the_timeline_keeps_every_train_span_when_the_run_stops_at_a_report(monkeypatch):
    """The learner flushes its spans right behind its report: when both come in one read and
    the run stops at that report, the train span still reaches the run's timeline (every train
    call the learner made is in it)."""
    from ebrl.runtime import channel

    recv = channel.Inbox.recv

    def slow_recv(self, timeout=None):  # let messages pile up: a report and its flush together
        import time

        time.sleep(0.03)
        return recv(self, timeout)

    monkeypatch.setattr(channel.Inbox, "recv", slow_recv)
    cfg = fake_cfg()
    sched = EBRLScheduler(backend="inprocess", overlap=False, pipeline=False, step_level=False)
    reports, segments, ctx = collect(cfg, sched, 3, monkeypatch)
    trains = [s for s in ctx.timeline.spans if s.stage == "train"]
    assert len(reports) == 3
    assert len(trains) == len(segments) >= 3
