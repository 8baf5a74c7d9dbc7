"""GRPO advantages on hand-checked numbers, episode bookkeeping across segments, update."""

from __future__ import annotations

import math

import pytest
import torch

from ebrl.algos.grpo import GRPO, GRPOConfig, episode_advantages
from ebrl.algos.returns import group_relative_advantages
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.types import Segment

O, A = 3, 2


def _segment(rewards, dones, episode_id, success=None, version=0, first_step=None) -> Segment:
    """Segment from per-decision totals [T, N]; each split over K=2 steps to test the sum.

    ``first_step[i]``: env steps env i's episode had run before row 0 (default 0: row 0 starts it).
    """
    r = torch.tensor(rewards, dtype=torch.float32)  # [T, N]
    t_len, n = r.shape
    done = torch.tensor(dones, dtype=torch.bool)
    step = torch.zeros(t_len, n, dtype=torch.int64)
    step[0] = torch.tensor(first_step or [0] * n)
    for t in range(1, t_len):
        step[t] = torch.where(done[t - 1], 0, step[t - 1] + 2)
    reward = torch.stack([r / 2, r / 2], dim=-1)  # [T, N, 2]
    return Segment(
        obs=torch.randn(t_len, n, O),
        actions=torch.zeros(t_len, n, 2, A),
        logprob=torch.zeros(t_len, n),
        value=torch.zeros(t_len, n),
        reward=reward,
        n_steps=torch.full((t_len, n), 2),
        terminated=torch.tensor(dones, dtype=torch.bool),
        truncated=torch.zeros(t_len, n, dtype=torch.bool),
        success=torch.zeros(t_len, n, dtype=torch.bool)
        if success is None
        else torch.tensor(success, dtype=torch.bool),
        final_obs=torch.randn(t_len, n, O),
        episode_id=torch.tensor(episode_id),
        episode_step=step,
        env_ids=torch.arange(n),
        policy_version=torch.full((t_len, n), version),
    )


# N=6 envs, group_size=3: groups {0,1,2} and {3,4,5}; T=3 rows (columns are envs)
REWARDS = [
    [1, 0, 0, 1, 2, 0],
    [0, 2, 0, 1, 0, 1],
    [0, 0, 6, 1, 3, 0],
]
DONES = [
    [1, 0, 0, 0, 1, 1],
    [0, 1, 0, 0, 0, 0],
    [0, 1, 1, 0, 1, 1],
]
EPISODES = [
    [0, 0, 0, 0, 0, 0],
    [1, 0, 0, 0, 1, 1],
    [1, 1, 0, 0, 1, 1],
]


def test_hand_checked_advantages():
    seg = _segment(REWARDS, DONES, EPISODES)
    ea = episode_advantages(seg, torch.ones(6, dtype=torch.bool), group_size=3)
    # group (0, ep 0): returns 1 (env 0), 2 (env 1), 6 (env 2): mean 3, sample std sqrt(7)
    s7 = math.sqrt(7.0)
    # group (0, ep 1): only env 1's (env 0's is cut by the segment end) -> dropped
    # group (1, ep 0): env 4 (2), env 5 (0); env 3 never finishes -> +-1/sqrt(2)
    # group (1, ep 1): env 4 (3), env 5 (1) -> +-1/sqrt(2)
    h = 1 / math.sqrt(2.0)
    want = torch.tensor(
        [
            [-2 / s7, -1 / s7, 3 / s7, 0, h, -h],
            [0, -1 / s7, 3 / s7, 0, h, -h],
            [0, 0, 3 / s7, 0, h, -h],
        ]
    )
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 1, 1],
            [0, 1, 1, 0, 1, 1],
            [0, 0, 1, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(ea.mask, mask)
    assert torch.allclose(ea.advantages, want, atol=1e-5)
    assert ea.num_groups == 3


def test_success_reward():
    success = [[0, 0, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1]]
    seg = _segment(REWARDS, DONES, EPISODES, success=success)
    ea = episode_advantages(seg, torch.ones(6, dtype=torch.bool), 3, reward="success")
    # group (1, 0): env 4 succeeded, env 5 did not; group (1, 1): env 5 succeeded at its last row
    h = 1 / math.sqrt(2.0)
    assert float(ea.advantages[0, 4]) == pytest.approx(h, abs=1e-5)
    assert float(ea.advantages[0, 5]) == pytest.approx(-h, abs=1e-5)
    assert float(ea.advantages[2, 4]) == pytest.approx(-h, abs=1e-5)
    # group (0, 0): env 1 succeeded, envs 0 and 2 did not: (1 - 1/3) / std([0, 1, 0])
    assert float(ea.advantages[0, 1]) == pytest.approx((2 / 3) / math.sqrt(1 / 3), abs=1e-4)


def test_row_zero_not_a_start_is_masked():
    seg = _segment(REWARDS, DONES, EPISODES)
    first = torch.tensor([True, True, False, True, True, True])  # env 2 is mid-episode at row 0
    ea = episode_advantages(seg, first, group_size=3)
    # group (0, 0) keeps envs 0 and 1 (returns 1 and 2): -+1/sqrt(2); env 2 is masked
    assert not bool(ea.mask[:, 2].any())
    assert float(ea.advantages[0, 0]) == pytest.approx(-1 / math.sqrt(2.0), abs=1e-5)


def test_group_relative_singletons_and_ties():
    ret = torch.tensor([1.0, 3.0, 5.0, 2.0, 2.0])
    key = torch.tensor([0, 0, 1, 2, 2])
    adv, valid = group_relative_advantages(ret, key, eps=1e-6)
    assert valid.tolist() == [True, True, False, True, True]
    assert adv.tolist()[:2] == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], abs=1e-5)
    assert adv.tolist()[2:] == [0.0, 0.0, 0.0]  # singleton dropped; a tied group carries no signal


def test_grpo_masks_an_episode_tail_cut_by_the_segment_start():
    # env 1's row 0 continues an episode begun in an earlier segment (episode_step 6 > 0): its
    # first episode here is incomplete and must not be scored with a partial return
    seg = _segment([[1, 2], [3, 4]], [[1, 1], [0, 0]], [[1, 0], [2, 1]], first_step=[0, 6])
    ea = episode_advantages(seg, seg.episode_step[0] == 0, group_size=2)
    assert ea.mask[:, 1].tolist() == [False, False]
    assert ea.num_groups == 0  # env 0's episode is alone in its group: dropped too


def test_grpo_update_metrics_and_version():
    torch.manual_seed(0)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=16, layers=1)
    seg = _segment(REWARDS, DONES, EPISODES)
    with torch.no_grad():
        # behaviour log-probs of the (zero) actions under the current policy: fresh data
        seg.logprob.copy_(
            pol.dist(seg.obs.flatten(0, 1))
            .log_prob(seg.actions.flatten(0, 1))
            .sum(dim=(1, 2))
            .view(seg.shape)
        )
    critic = [p.clone() for p in pol.critic.parameters()]
    m = GRPO(pol, GRPOConfig(group_size=3, update_epochs=2, num_minibatches=2)).update(seg)
    assert pol.version == 1
    assert m["train/grpo_groups"] == 3.0
    assert m["train/grpo_valid_frac"] == pytest.approx(12 / 18)
    assert m["train/behave_dropped_frac"] == 0.0
    assert m["train/epochs_run"] > 0
    assert {"train/policy_loss", "train/approx_kl", "pipeline/staleness_max"} <= set(m)
    assert all(torch.equal(a, b) for a, b in zip(critic, pol.critic.parameters()))  # untouched


def test_grpo_update_without_complete_groups(caplog, monkeypatch):
    """A segment shorter than every episode: nothing to learn, said once with the fix; the
    policy is never asked to score an empty batch (an RLinf VLA cannot), and the version moves
    on as every update's does."""
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=16, layers=1)
    seg = _segment([[1, 1], [1, 1]], [[0, 0], [0, 0]], [[0, 0], [0, 0]])
    full = GRPO(MLPPolicy(PolicySpec(O, A, 2), hidden=16, layers=1), GRPOConfig(group_size=3))
    keys = set(full.update(_segment(REWARDS, DONES, EPISODES)))
    grpo = GRPO(pol, GRPOConfig(group_size=2, kl_coef=0.1))
    monkeypatch.setattr(pol, "dist", lambda *a, **k: pytest.fail("scored an empty batch"))
    before = [p.clone() for p in pol.parameters()]
    with caplog.at_level("WARNING", logger="ebrl.algos.grpo"):
        m = grpo.update(seg)
        m2 = grpo.update(seg)
    assert set(m) == keys
    assert m["train/grpo_valid_frac"] == 0.0 and m["train/epochs_run"] == 0.0
    assert math.isnan(m["train/policy_loss"]) and m2["train/grpo_groups"] == 0.0
    assert pol.version == 2
    assert all(torch.equal(a, b) for a, b in zip(before, pol.parameters()))
    warned = [r.getMessage() for r in caplog.records if "learns nothing" in r.getMessage()]
    assert len(warned) == 1 and "rollout_steps x chunk_size >= " in warned[0]


def test_grpo_reference_kl_term_runs():
    torch.manual_seed(0)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=16, layers=1)
    seg = _segment(REWARDS, DONES, EPISODES)
    m = GRPO(pol, GRPOConfig(group_size=3, kl_coef=0.1, behave_weight_threshold=None)).update(seg)
    assert m["train/ref_kl"] >= 0.0


def test_config_validation():
    with pytest.raises(ValueError):
        GRPOConfig(reward="sucess")
