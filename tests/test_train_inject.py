"""The learner's injected load (``inject.train_*``): more work per update, the same learning."""

from __future__ import annotations

import pytest
import torch

from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.stages import TrainStage
from ebrl.stages.train import extra_passes
from tests.test_ppo import A, O, _bandit_segment


def _stage(**kw) -> TrainStage:
    torch.manual_seed(0)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    return TrainStage(PPO(pol, PPOConfig(update_epochs=2, num_minibatches=2)), **kw)


def _segments(n: int) -> list:
    torch.manual_seed(1)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    return [_bandit_segment(pol) for _ in range(n)]


def _count_evaluate(monkeypatch) -> list[int]:
    calls = [0]
    orig = MLPPolicy.evaluate

    def counted(self, obs, actions, extras=None):
        calls[0] += 1
        return orig(self, obs, actions, extras)

    monkeypatch.setattr(MLPPolicy, "evaluate", counted)
    return calls


def test_injected_load_changes_no_weight_optimiser_or_random_state():
    segs = _segments(4)
    plain, loaded = _stage(), _stage(extra_after=2, extra_epochs=3)
    # PPO shuffles minibatches with torch's generator: seeded once, so a pass that drew from it
    # would change every later update's minibatches
    torch.manual_seed(7)
    for seg in segs:
        plain.train(seg)
    torch.manual_seed(7)
    flags = [loaded.train(seg)["train/injected_load"] for seg in segs]
    assert flags == [0.0, 0.0, 1.0, 1.0]
    assert plain.version == loaded.version == 4
    for (k, a), (_, b) in zip(
        plain.algo.policy.state_dict().items(), loaded.algo.policy.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), k
    sa, sb = plain.algo.optimizer.state_dict()["state"], loaded.algo.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)


def test_injected_load_runs_its_passes_from_the_set_version_on(monkeypatch):
    segs = _segments(4)
    plain, loaded = _stage(), _stage(extra_after=2, extra_epochs=3)
    calls = _count_evaluate(monkeypatch)
    extra = []
    for seg in segs:
        before = calls[0]
        plain.train(seg)
        mid = calls[0]
        loaded.train(seg)
        extra.append((calls[0] - mid) - (mid - before))
    assert extra == [0, 0, 3, 3]


def test_extra_passes_leave_no_gradient_behind():
    stage = _stage()
    seg = _segments(1)[0]
    extra_passes(stage.algo.policy, seg, 2)
    assert all(p.grad is None for p in stage.algo.policy.parameters())


@pytest.mark.parametrize(
    "override", ["inject.train_extra_epochs=-1", "inject.train_after_updates=-2"]
)
def test_negative_injection_is_refused_by_name(tiny_cfg, override):
    from ebrl.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"inject\.train_"):
        validate(tiny_cfg([override]))


def test_factory_passes_the_injection_to_the_learner(tiny_cfg):
    from ebrl.stages.factory import StageFactory

    cfg = tiny_cfg(["inject.train_after_updates=5", "inject.train_extra_epochs=2"])
    factory = StageFactory.from_config(cfg)
    env = factory.make_env(0)
    stage = factory.with_spec(env.spec).train()
    env.close()
    assert (stage.extra_after, stage.extra_epochs) == (5, 2)
