"""Shapes, log-prob consistency, weight round trips and determinism of both policies."""

from __future__ import annotations

import pytest
import torch

from ebrl.policies import MLPPolicy, Policy, PolicySpec, TransformerPolicy
from ebrl.policies.transformer import SIZES
from ebrl.types import Observation

O, A = 7, 3  # O not a multiple of obs_tokens: exercises padding


def _make(kind: str, k: int) -> Policy:
    spec = PolicySpec(O, A, k)
    if kind == "mlp":
        return MLPPolicy(spec, hidden=32, layers=2)
    return TransformerPolicy(spec, "S", obs_tokens=3)


def _obs(b: int) -> Observation:
    return Observation(obs=torch.randn(b, O), env_ids=torch.arange(b) + 10)


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
@pytest.mark.parametrize("k", [1, 4])
def test_shapes_and_logprob_consistency(kind, k):
    torch.manual_seed(0)
    pol = _make(kind, k)
    pol.version = 7
    ob = _obs(5)
    c = pol.act(ob)
    assert c.actions.shape == (5, k, A)
    assert c.logprob.shape == c.value.shape == (5,)
    assert torch.equal(c.env_ids, ob.env_ids)
    assert c.policy_version.tolist() == [7] * 5
    ev = pol.evaluate(ob.obs, c.actions)
    assert ev.logprob.shape == ev.entropy.shape == ev.value.shape == (5,)
    assert torch.allclose(ev.logprob, c.logprob, atol=1e-5)
    assert torch.allclose(ev.value, c.value, atol=1e-6)
    (ev.logprob.sum() + ev.value.sum()).backward()  # gradients reach actor, log-std and critic
    assert pol.log_std.grad is not None and pol.log_std.grad.shape == (k, A)
    assert all(p.grad is not None for p in pol.critic.parameters())


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_initial_actions_near_zero(kind):
    torch.manual_seed(0)
    pol = _make(kind, 4)
    c = pol.act(_obs(16), deterministic=True)
    assert float(c.actions.abs().max()) < 0.1
    assert torch.allclose(pol.log_std, torch.full((4, A), -0.5))


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_weights_round_trip(kind):
    torch.manual_seed(0)
    src = _make(kind, 4)
    torch.manual_seed(1)
    dst = _make(kind, 4)
    src.version = 3
    version, weights = src.get_weights()
    dst.set_weights(version, weights)
    assert dst.version == 3
    ob = _obs(4)
    assert torch.equal(
        src.act(ob, deterministic=True).actions, dst.act(ob, deterministic=True).actions
    )
    weights[next(iter(weights))].add_(1.0)  # the copy is detached from the source
    assert not torch.equal(src.state_dict()[next(iter(weights))], weights[next(iter(weights))])


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_determinism_given_seed(kind):
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        pol = _make(kind, 4)
        ob = Observation(obs=torch.ones(3, O), env_ids=torch.arange(3))
        outs.append(pol.act(ob))
    assert torch.equal(outs[0].actions, outs[1].actions)
    assert torch.equal(outs[0].logprob, outs[1].logprob)


def test_transformer_sizes_build_and_overrides():
    spec = PolicySpec(35, 8, 4)
    counts = []
    for size in SIZES:
        pol = TransformerPolicy(spec, size)
        d, layers, heads = SIZES[size]
        assert (pol.d_model, pol.num_layers, pol.num_heads) == (d, layers, heads)
        counts.append(sum(p.numel() for p in pol.parameters()))
    assert counts == sorted(counts)
    pol = TransformerPolicy(spec, "S", d_model=32, layers=1, heads=2)
    assert (pol.d_model, pol.num_layers, pol.num_heads) == (32, 1, 2)
    assert pol.act(Observation(obs=torch.randn(2, 35), env_ids=torch.arange(2))).actions.shape == (
        2,
        4,
        8,
    )
    with pytest.raises(ValueError):
        TransformerPolicy(spec, "XXL")
    with pytest.raises(ValueError):
        TransformerPolicy(spec, "S", d_model=30, heads=4)
