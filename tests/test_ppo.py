"""Decoupled PPO loss on hand-computed numbers, and PPO.update on tiny segments."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ebrl.algos.loss import decoupled_ppo_loss
from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.algos.returns import chunk_returns, gae
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.types import Observation, Segment

RATIOS = torch.tensor([1.0, 1.5, 0.5, 1.1])
ADV = torch.tensor([1.0, 1.0, -1.0, -2.0])
# per-sample max(-A r, -A clip(r, .8, 1.2)): -1, max(-1.5, -1.2), max(.5, .8), max(2.2, 2.2)
HAND_LOSS = (-1.0 - 1.2 + 0.8 + 2.2) / 4


def _loss(cur, prox, behav, adv, **kw):
    kw = {"clip_coef": 0.2, "behave_weight_threshold": 2.0, "dual_clip": 3.0} | kw
    return decoupled_ppo_loss(cur, prox, behav, adv, **kw)


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_fresh_data_is_standard_ppo_clip(dual_clip):
    prox = torch.tensor([0.3, -1.0, 2.0, 0.0])
    cur = prox + RATIOS.log()
    out = _loss(cur, prox, prox.clone(), ADV, dual_clip=dual_clip)
    assert out.loss.item() == pytest.approx(HAND_LOSS, abs=1e-6)
    assert out.clipfrac == pytest.approx(0.5)  # 1.5 and 0.5 leave [0.8, 1.2]
    want_kl = float(((RATIOS - 1) - RATIOS.log()).mean())
    assert out.approx_kl == pytest.approx(want_kl, abs=1e-6)
    assert out.behave_weight_mean == pytest.approx(1.0)
    assert out.behave_dropped_frac == 0.0


@settings(max_examples=50, deadline=None)
@given(data=st.data(), b=st.integers(1, 16))
def test_fresh_data_matches_cleanrl_formula_with_grads(data, b):
    """behav == prox: loss and gradient equal CleanRL's clipped surrogate (no dual clip)."""
    f = st.floats(-2, 2, allow_nan=False)
    prox = torch.tensor(data.draw(st.lists(f, min_size=b, max_size=b)), dtype=torch.float64)
    delta = torch.tensor(data.draw(st.lists(f, min_size=b, max_size=b)), dtype=torch.float64)
    adv = torch.tensor(data.draw(st.lists(f, min_size=b, max_size=b)), dtype=torch.float64)
    cur = (prox + delta).requires_grad_(True)
    out = _loss(cur, prox, prox, adv, dual_clip=None, behave_weight_threshold=2.0)
    (g,) = torch.autograd.grad(out.loss, cur)
    cur2 = (prox + delta).requires_grad_(True)
    ratio = (cur2 - prox).exp()
    ref = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
    (g2,) = torch.autograd.grad(ref, cur2)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-9, abs=1e-12)
    assert torch.allclose(g, g2)


def test_behaviour_weights_and_dropping():
    prox = torch.zeros(4)
    behav = -torch.tensor([1.0, 1.5, 3.0, 0.5]).log()  # w = exp(prox - behav) = 1, 1.5, 3, .5
    adv = torch.ones(4)
    out = _loss(prox.clone(), prox, behav, adv)  # ratio 1: per-sample loss -A = -1
    # w=3 dropped; the mean runs over the 3 kept samples (RLinf v0.3 masked_mean)
    assert out.loss.item() == pytest.approx(-(1.0 + 1.5 + 0.5) / 3)
    assert out.behave_dropped_frac == pytest.approx(0.25)
    assert out.behave_weight_mean == pytest.approx(1.0)
    kept_all = _loss(prox.clone(), prox, behav, adv, behave_weight_threshold=None)
    assert kept_all.loss.item() == pytest.approx(-(1.0 + 1.5 + 3.0 + 0.5) / 4)


def test_dual_clip_caps_negative_advantage_loss():
    prox = torch.zeros(2)
    cur = torch.tensor([5.0, 5.0]).log().requires_grad_(True)  # ratio 5
    adv = torch.tensor([-1.0, 1.0])
    out = _loss(cur, prox, prox, adv)
    # A<0: max(5, 1.2) = 5, capped at 3*|A| = 3; A>0: max(-5, -1.2) = -1.2 (no dual clip)
    assert out.loss.item() == pytest.approx((3.0 - 1.2) / 2)
    (g,) = torch.autograd.grad(out.loss, cur)
    assert torch.equal(g, torch.zeros(2))  # both samples are clipped: no gradient
    no_dual = _loss(cur, prox, prox, adv, dual_clip=None)
    assert no_dual.loss.item() == pytest.approx((5.0 - 1.2) / 2)


# --- PPO.update ---------------------------------------------------------------------------------
O, A = 3, 2


def _target(obs):  # [B, O] -> [B, A]
    return torch.tanh(obs[:, :A] * 2)


def _bandit_segment(policy, t_len=6, n=8, k=2, version=None) -> Segment:
    """Episodes of one decision; reward per step -|a_j - target(obs)|_1."""
    obs = torch.randn(t_len, n, O)  # [T, N, O]
    chunks = [policy.act(Observation(obs=obs[t], env_ids=torch.arange(n))) for t in range(t_len)]
    actions = torch.stack([c.actions for c in chunks])  # [T, N, K, A]
    reward = -(actions - _target(obs.flatten(0, 1)).view(t_len, n, 1, A)).abs().sum(-1)
    pv = torch.stack([c.policy_version for c in chunks])
    return Segment(
        obs=obs,
        actions=actions,
        logprob=torch.stack([c.logprob for c in chunks]),
        value=torch.stack([c.value for c in chunks]),
        reward=reward,  # [T, N, K]
        n_steps=torch.full((t_len, n), k),
        terminated=torch.ones(t_len, n, dtype=torch.bool),
        truncated=torch.zeros(t_len, n, dtype=torch.bool),
        success=torch.zeros(t_len, n, dtype=torch.bool),
        final_obs=torch.zeros(t_len, n, O),
        episode_id=torch.arange(t_len).view(t_len, 1).expand(t_len, n).clone(),
        episode_step=torch.zeros(t_len, n, dtype=torch.int64),
        env_ids=torch.arange(n),
        policy_version=pv if version is None else version,
    )


KEYS = {
    "train/policy_loss",
    "train/value_loss",
    "train/entropy",
    "train/approx_kl",
    "train/clipfrac",
    "train/behave_weight_mean",
    "train/behave_dropped_frac",
    "train/explained_variance",
    "train/epochs_run",
    "pipeline/staleness_mean",
    "pipeline/staleness_max",
}


def test_update_metrics_version_and_fresh_weights():
    torch.manual_seed(0)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    ppo = PPO(pol, PPOConfig(update_epochs=2, num_minibatches=2))
    m = ppo.update(_bandit_segment(pol))
    assert set(m) >= KEYS
    assert pol.version == 1
    assert m["pipeline/staleness_mean"] == 0.0 and m["pipeline/staleness_max"] == 0.0
    assert m["train/behave_weight_mean"] == pytest.approx(1.0, abs=1e-5)  # fresh: prox == behav
    assert m["train/behave_dropped_frac"] == 0.0
    assert 0 < m["train/epochs_run"] <= 2
    assert all(isinstance(v, float) for v in m.values())


def test_staleness_and_stale_samples_dropped():
    torch.manual_seed(1)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    pol.version = 5
    versions = torch.tensor([3, 4, 5, 5]).view(4, 1).expand(4, 8).clone()  # [T, N]
    seg = _bandit_segment(pol, t_len=4, version=versions)
    seg.logprob[0] -= 10.0  # pretend the behaviour policy found these far less likely: w = e^10
    m = PPO(pol, PPOConfig(update_epochs=1, num_minibatches=1)).update(seg)
    assert m["pipeline/staleness_mean"] == pytest.approx((2 + 1 + 0 + 0) / 4)
    assert m["pipeline/staleness_max"] == 2.0
    assert m["train/behave_dropped_frac"] == pytest.approx(0.25)
    assert pol.version == 6


def test_target_kl_scales_with_chunk_only_for_chunk_ratios():
    chunk = PPOConfig(ratio_level="chunk")
    assert chunk.effective_target_kl(4) == pytest.approx(0.4)
    assert PPOConfig(ratio_level="chunk", scale_target_kl_with_chunk=False).effective_target_kl(
        4
    ) == pytest.approx(0.1)
    assert PPOConfig().effective_target_kl(4) == pytest.approx(0.1)  # per action: no scaling
    assert PPOConfig(target_kl=None).effective_target_kl(4) is None
    with pytest.raises(ValueError, match="ratio_level='token'"):
        PPOConfig(ratio_level="token")


def test_per_action_ratios_hand_computed_with_mask():
    """Two decisions of K=2: each executed action has its own clipped ratio, weighted by its
    decision's advantage; the unexecuted second action of decision 1 does not count."""
    prox = torch.zeros(2, 2)
    cur = torch.log(torch.tensor([[1.5, 1.0], [0.5, 3.0]]))  # [B, K] ratios
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[True, True], [True, False]])
    behav = prox.sum(dim=1)  # fresh: w = 1
    out = _loss(cur, prox, behav, adv, mask=mask, dual_clip=None)
    # max(-A r, -A clip(r)): (0,0): max(-1.5, -1.2) = -1.2; (0,1): -1; (1,0): max(.5, .8) = .8
    assert out.loss.item() == pytest.approx((-1.2 - 1.0 + 0.8) / 3)
    assert out.clipfrac == pytest.approx(2 / 3)  # 1.5 and 0.5 leave [0.8, 1.2]; 3.0 is masked
    # without the mask the ratio of 3.0 on a negative advantage counts: max(3, 1.2) = 3
    unmasked = _loss(cur, prox, behav, adv, dual_clip=None)
    assert unmasked.loss.item() == pytest.approx((-1.2 - 1.0 + 0.8 + 3.0) / 4)


def test_per_action_behaviour_weight_is_the_chunks():
    """The behaviour weight multiplies every action of its chunk and comes from the chunk's
    summed proximal log-prob; a dropped chunk drops all its actions."""
    prox = torch.tensor([[0.1, 0.2], [0.0, 0.0]])  # [B, K]
    cur = prox.clone()  # ratio 1 everywhere
    behav = torch.tensor([0.3 - math.log(1.5), -5.0])  # w = 1.5 and e^5 (dropped)
    adv = torch.tensor([1.0, 1.0])
    out = _loss(cur, prox, behav, adv)
    assert out.loss.item() == pytest.approx(-1.5)  # (-1 * 1.5) * 2 actions / 2 kept actions
    assert out.behave_dropped_frac == pytest.approx(0.5)
    assert out.behave_weight_mean == pytest.approx(1.5)


def test_chunk_and_action_ratios_agree_for_single_actions():
    torch.manual_seed(0)
    prox = torch.randn(6, 1)
    cur = prox + 0.3 * torch.randn(6, 1)
    adv = torch.randn(6)
    a = _loss(cur, prox, prox.sum(1), adv)
    c = _loss(cur.sum(1), prox.sum(1), prox.sum(1), adv)
    assert a.loss.item() == pytest.approx(c.loss.item())
    assert a.approx_kl == pytest.approx(c.approx_kl)


@pytest.mark.parametrize("level", ["action", "chunk"])
def test_update_runs_at_either_ratio_level(level):
    torch.manual_seed(0)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    m = PPO(pol, PPOConfig(update_epochs=2, num_minibatches=2, ratio_level=level)).update(
        _bandit_segment(pol)
    )
    assert pol.version == 1 and 0 < m["train/epochs_run"] <= 2


def test_update_improves_surrogate_and_value():
    """On a fixed segment, one update raises the clipped surrogate and lowers the value loss."""
    torch.manual_seed(2)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=64, layers=2)
    cfg = PPOConfig(update_epochs=4, num_minibatches=2, bootstrap_at_done=False, target_kl=None)
    seg = _bandit_segment(pol, t_len=8, n=16)
    flat_obs, flat_act = seg.obs.flatten(0, 1), seg.actions.flatten(0, 1)
    with torch.no_grad():
        v0 = pol.value(flat_obs).view(seg.shape)
        nv0 = pol.value(seg.final_obs.flatten(0, 1)).view(seg.shape)
    ret, disc = chunk_returns(seg.reward, seg.n_steps, cfg.gamma)
    adv, returns = gae(ret, disc, v0, nv0, seg.terminated, ~seg.terminated, cfg.gae_lambda)
    adv = (adv - adv.mean()) / adv.std()
    PPO(pol, cfg).update(seg)
    with torch.no_grad():
        ev = pol.evaluate(flat_obs, flat_act)
    ratio = (ev.logprob - seg.logprob.flatten()).exp()
    surrogate = float((adv.flatten() * ratio).mean())  # 0 before the update (ratio 1, mean A 0)
    assert surrogate > 0.05
    v_before = float(0.5 * ((v0 - returns) ** 2).mean())
    v_after = float(0.5 * ((ev.value.view(seg.shape) - returns) ** 2).mean())
    assert v_after < v_before


def test_explained_variance_nan_safe():
    torch.manual_seed(3)
    pol = MLPPolicy(PolicySpec(O, A, 1), hidden=16, layers=1)
    seg = _bandit_segment(pol, t_len=2, n=2, k=1)
    m = PPO(pol, PPOConfig(update_epochs=1, num_minibatches=1)).update(seg)
    assert math.isfinite(m["train/explained_variance"])


def test_learning_rate_decays_over_env_steps_and_survives_a_checkpoint():
    from ebrl.algos.optim import anneal_lr

    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=8, layers=1)
    cfg = PPOConfig(lr=1e-3, lr_decay_steps=1000)
    opt = torch.optim.Adam(pol.parameters(), lr=cfg.lr)
    assert anneal_lr(opt, cfg, 250) == pytest.approx(1e-3)  # before any training
    assert anneal_lr(opt, cfg, 250) == pytest.approx(7.5e-4)
    restored = torch.optim.Adam(pol.parameters(), lr=cfg.lr)
    restored.load_state_dict(opt.state_dict())  # what a resumed run does
    assert anneal_lr(restored, cfg, 500) == pytest.approx(5e-4)
    assert anneal_lr(restored, cfg, 1) == pytest.approx(0.0)  # never negative past the budget
    assert anneal_lr(opt, PPOConfig(lr=1e-3), 10) == pytest.approx(1e-3)  # no decay: constant


def test_update_reports_the_learning_rate():
    torch.manual_seed(0)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    ppo = PPO(pol, PPOConfig(update_epochs=1, num_minibatches=1, lr_decay_steps=10**9))
    assert ppo.update(_bandit_segment(pol))["train/lr"] == pytest.approx(3e-4)
    assert ppo.update(_bandit_segment(pol))["train/lr"] < 3e-4


def _actor_critic(pol):
    actor = {k: v.clone() for k, v in pol.state_dict().items() if not k.startswith("critic.")}
    critic = {k: v.clone() for k, v in pol.state_dict().items() if k.startswith("critic.")}
    return actor, critic


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_a_critic_warm_up_holds_the_actor_and_counts_through_a_checkpoint():
    torch.manual_seed(0)
    pol = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    cfg = PPOConfig(update_epochs=2, num_minibatches=2, critic_warmup_updates=2)
    ppo = PPO(pol, cfg)
    for _ in range(2):  # the warm-up: the critic moves, the actor and its log-std do not
        actor, critic = _actor_critic(pol)
        m = ppo.update(_bandit_segment(pol))
        after_actor, after_critic = _actor_critic(pol)
        assert m["train/critic_only"] == 1.0
        assert _same(actor, after_actor) and not _same(critic, after_critic)
        assert m["train/approx_kl"] == pytest.approx(0.0, abs=1e-6)
        assert m["train/epochs_run"] == 2  # a KL of 0 never stops a warm-up update
    # a resumed run (the optimiser's state restored) counts on: the actor now trains
    resumed = PPO(pol, cfg)
    resumed.optimizer.load_state_dict(ppo.optimizer.state_dict())
    actor, _ = _actor_critic(pol)
    m = resumed.update(_bandit_segment(pol))
    assert m["train/critic_only"] == 0.0
    assert not _same(actor, _actor_critic(pol)[0])
    # no warm-up (the default): the actor trains from the first update
    fresh = MLPPolicy(PolicySpec(O, A, 2), hidden=32, layers=2)
    actor, _ = _actor_critic(fresh)
    assert (
        PPO(fresh, PPOConfig(update_epochs=1)).update(_bandit_segment(fresh))["train/critic_only"]
        == 0.0
    )
    assert not _same(actor, _actor_critic(fresh)[0])


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"critic_warmup_updates": -1}, "integer >= 0"),
        ({"critic_warmup_updates": 1.5}, "integer >= 0"),
        ({"critic_warmup_updates": 3, "vf_coef": 0.0}, "vf_coef > 0"),
    ],
)
def test_a_bad_critic_warm_up_is_refused_naming_the_key(kw, says):
    with pytest.raises(ValueError, match=r"algo\.cfg\.critic_warmup_updates") as e:
        PPOConfig(**kw)
    assert says in str(e.value)
