"""The synchronous scheduler on the deterministic fake env: ordering, versions, no mixing."""

import torch

from ebrl.config import validate
from ebrl.schedulers.base import RunContext
from ebrl.schedulers.sync import SyncScheduler
from ebrl.stages import TrainStage
from ebrl.stages.factory import StageFactory
from ebrl.timeline import Timeline


def context(cfg, tl=None):
    run = validate(cfg)
    return run, RunContext(
        factory=StageFactory.from_config(cfg),
        decisions_per_env=run.decisions_per_env,
        env_groups=run.env_groups,
        timeline=tl or Timeline(),
    )


def test_sync_schedule_order_versions_and_segments(tiny_cfg):
    tl = Timeline()
    run, ctx = context(tiny_cfg(), tl)
    gen = SyncScheduler().run(ctx)
    reports = [next(gen) for _ in range(3)]
    gen.close()
    assert [r.iteration for r in reports] == [0, 1, 2]
    # strictly sequential: each iteration is T gen calls, each followed by sims, then train+sync
    names = [s.stage for s in tl.spans]
    T = run.decisions_per_env
    per_iter = ["gen", "sim", "sim"] * T + ["train", "sync"]
    assert names == ["sim"] + per_iter * 3
    for a, b in zip(tl.spans, tl.spans[1:]):
        assert a.end <= b.start  # nothing overlaps
    for r in reports:
        assert r.metrics["pipeline/staleness_max"] == 0
        assert r.env_steps > 0


def test_sync_segments_follow_each_env(tiny_cfg, monkeypatch):
    """obs[t+1] of an env is the next_obs its own outcome at t produced (no mixing)."""
    _run, ctx = context(tiny_cfg())
    seen = []
    orig = TrainStage.train

    def spy(self, seg):
        seen.append(seg)
        return orig(self, seg)

    monkeypatch.setattr(TrainStage, "train", spy)
    gen = SyncScheduler().run(ctx)
    next(gen)
    next(gen)
    gen.close()
    for seg in seen:
        done = seg.terminated | seg.truncated
        same = torch.isclose(seg.obs[1:], seg.final_obs[:-1]).all(dim=-1)
        assert bool(same[~done[:-1]].all())
        # CountingEnv's obs[0] is the env id: every column is one env
        assert torch.equal(seg.obs[:, :, 0], seg.env_ids.float().expand(seg.shape))
    # the second segment continues where the first stopped
    a, b = seen
    assert torch.equal(
        b.obs[0][~(a.terminated[-1] | a.truncated[-1])],
        a.final_obs[-1][~(a.terminated[-1] | a.truncated[-1])],
    )
