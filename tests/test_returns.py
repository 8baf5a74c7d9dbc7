"""chunk_returns and gae against hand-computed numbers, plus a telescoping property."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ebrl.algos.returns import chunk_returns, gae

GAMMA, LAM = 0.5, 0.5


def _tiny():
    """T=3, N=2, K=2; column 0 terminates at t=1, column 1 truncates at t=0."""
    reward = torch.tensor(
        [
            [[1.0, 2.0], [2.0, 0.0]],
            [[3.0, 5.0], [0.0, 4.0]],  # 5.0 is a stray reward after env 0's chunk ended
            [[1.0, 1.0], [1.0, 0.0]],
        ]
    )  # [T, N, K]
    n_steps = torch.tensor([[2, 1], [1, 2], [2, 1]])  # [T, N]
    value = torch.tensor([[1.0, 0.5], [2.0, 1.0], [3.0, 2.0]])  # [T, N]
    next_value = torch.tensor([[2.0, 4.0], [10.0, 2.0], [4.0, 6.0]])  # [T, N]
    terminated = torch.tensor([[False, False], [True, False], [False, False]])
    truncated = torch.tensor([[False, True], [False, False], [False, False]])
    return reward, n_steps, value, next_value, terminated, truncated


def test_chunk_returns_hand_computed():
    reward, n_steps, *_ = _tiny()
    ret, disc = chunk_returns(reward, n_steps, GAMMA)
    # env 0: 1 + .5*2, 3 (the stray 5 is masked), 1 + .5*1; env 1: 2, 0 + .5*4, 1
    assert torch.allclose(ret, torch.tensor([[2.0, 2.0], [3.0, 2.0], [1.5, 1.0]]))
    assert torch.allclose(disc, torch.tensor([[0.25, 0.5], [0.5, 0.25], [0.25, 0.5]]))


def test_gae_hand_computed_no_bootstrap_on_termination():
    reward, n_steps, value, next_value, term, trunc = _tiny()
    ret, disc = chunk_returns(reward, n_steps, GAMMA)
    done = term | trunc
    adv, returns = gae(ret, disc, value, next_value, done, ~term, LAM)
    # env 0: t2: 1.5 + .25*4 - 3 = -.5; t1 (terminal, no bootstrap): 3 - 2 = 1;
    #        t0: 2 + .25*2 - 1 + .25*.5*1 = 1.625
    # env 1: t2: 1 + .5*6 - 2 = 2; t1: 2 + .25*2 - 1 + .25*.5*2 = 1.75;
    #        t0 (truncated, bootstraps, cuts the recursion): 2 + .5*4 - .5 = 3.5
    expected = torch.tensor([[1.625, 3.5], [1.0, 1.75], [-0.5, 2.0]])
    assert torch.allclose(adv, expected)
    assert torch.allclose(returns, expected + value)


def test_gae_bootstrap_at_done():
    reward, n_steps, value, next_value, term, trunc = _tiny()
    ret, disc = chunk_returns(reward, n_steps, GAMMA)
    adv, _ = gae(ret, disc, value, next_value, term | trunc, torch.ones_like(term), LAM)
    # env 0 t1 now bootstraps V(final_obs)=10: 3 + .5*10 - 2 = 6; t0: 1.5 + .25*.5*6 = 2.25
    assert adv[1, 0] == pytest.approx(6.0)
    assert adv[0, 0] == pytest.approx(2.25)
    assert adv[0, 1] == pytest.approx(3.5)  # env 1 unchanged


@settings(max_examples=40, deadline=None)
@given(
    t_len=st.integers(1, 6),
    gamma=st.floats(0.0, 1.0),
    data=st.data(),
)
def test_gae_lambda_one_is_discounted_sum(t_len, gamma, data):
    """K=1, lam=1, no dones, consistent next values: returns are n-step discounted sums."""
    floats = st.floats(-10, 10, allow_nan=False)
    r = torch.tensor(data.draw(st.lists(floats, min_size=t_len, max_size=t_len)))  # [T]
    v = torch.tensor(data.draw(st.lists(floats, min_size=t_len + 1, max_size=t_len + 1)))
    reward = r.view(t_len, 1, 1).double()  # [T, 1, 1]
    value = v[:-1].view(t_len, 1).double()  # [T, 1]
    next_value = v[1:].view(t_len, 1).double()  # [T, 1], V(obs_{t+1}), last one bootstraps
    ret, disc = chunk_returns(reward, torch.ones(t_len, 1, dtype=torch.int64), gamma)
    no = torch.zeros(t_len, 1, dtype=torch.bool)
    _, returns = gae(ret, disc, value, next_value, no, ~no, 1.0)
    for t in range(t_len):
        want = sum(gamma**j * float(r[t + j]) for j in range(t_len - t))
        want += gamma ** (t_len - t) * float(v[-1])
        assert float(returns[t, 0]) == pytest.approx(want, rel=1e-9, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 5), gamma=st.floats(0.0, 1.0), data=st.data())
def test_chunk_returns_matches_loop(k, gamma, data):
    n = data.draw(st.integers(1, k))
    r = data.draw(st.lists(st.floats(-5, 5), min_size=k, max_size=k))
    ret, disc = chunk_returns(
        torch.tensor(r, dtype=torch.float64).view(1, 1, k), torch.tensor([[n]]), gamma
    )
    assert float(ret) == pytest.approx(sum(gamma**j * r[j] for j in range(n)), abs=1e-9)
    assert float(disc) == pytest.approx(gamma**n)
