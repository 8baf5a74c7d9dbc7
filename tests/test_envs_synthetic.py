"""SyntheticCostEnv: cost distribution, run-time slowdown, episode shrink, determinism, task."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from ebrl.envs import Env, EnvGroup, SyntheticCostEnv
from ebrl.envs.synthetic import Z99, lognormal_sigma, sample_step_costs
from ebrl.types import ActionChunk


@pytest.mark.parametrize("ratio", [1.0, 1.2, 1.5, 3.0])
def test_sigma_solves_tail_equation(ratio):
    s = lognormal_sigma(ratio)
    assert math.exp(Z99 * s - s * s / 2) == pytest.approx(ratio, rel=1e-9)
    assert 0.0 <= s <= Z99


def test_sigma_rejects_unreachable_tails():
    with pytest.raises(ValueError):
        lognormal_sigma(0.9)
    with pytest.raises(ValueError):
        lognormal_sigma(20.0)


@pytest.mark.parametrize("ratio", [1.5, 2.5])
def test_sampled_cost_mean_and_tail(ratio):
    rng = np.random.default_rng(0)
    x = sample_step_costs(rng, 1.2e-3, ratio, n=200_000)
    assert x.mean() == pytest.approx(1.2e-3, rel=0.01)
    assert np.quantile(x, 0.99) / x.mean() == pytest.approx(ratio, rel=0.03)


def test_sleep_mode_spends_the_sampled_time_and_scale_changes_it():
    env = SyntheticCostEnv(step_cost_ms=2.0, cost_mode="sleep", episode_steps_start=1000)
    env.reset(0)
    a = np.zeros(4, np.float32)

    def timed(n: int) -> tuple[float, float]:
        c0, t0 = env.cost_seconds, time.perf_counter()
        for _ in range(n):
            env.step(a)
        return env.cost_seconds - c0, time.perf_counter() - t0

    charged, wall = timed(50)
    assert charged == pytest.approx(50 * 2e-3, rel=0.3)
    assert wall >= charged  # sleeping never returns early
    env.set_cost_scale(3.0)  # an injected slowdown
    charged3, _ = timed(50)
    assert charged3 == pytest.approx(3 * 50 * 2e-3, rel=0.3)
    env.set_cost_scale(0.0)
    assert timed(20)[0] == 0.0


def test_burn_mode_busy_waits():
    env = SyntheticCostEnv(step_cost_ms=2.0, cost_mode="burn")
    env.reset(0)
    c0, cpu0 = time.process_time(), env.cost_seconds
    for _ in range(25):
        env.step(np.zeros(4, np.float32))
    assert time.process_time() - c0 >= 0.5 * (env.cost_seconds - cpu0)  # CPU time, not sleep


def test_episodes_shrink_linearly_in_the_env_episode_counter():
    env = SyntheticCostEnv(
        step_cost_ms=0.0, episode_steps_start=40, episode_steps_end=10, shrink_episodes=3
    )
    assert [env.episode_length(n) for n in range(6)] == [40, 30, 20, 10, 10, 10]
    assert env.spec.max_episode_steps == 40
    far = np.zeros(4, np.float32)
    lengths = []
    for ep in range(5):
        env.reset(ep)
        env._target[:] = 5.0  # unreachable (positions live in [-1, 1]): only truncation ends it
        t = 0
        while True:
            t += 1
            r = env.step(far)
            if r.terminated or r.truncated:
                assert r.truncated and not r.success
                break
        lengths.append(t)
    assert lengths == [40, 30, 20, 10, 10]


def test_same_seed_same_trajectory_and_costs():
    def run(seed: int) -> tuple[np.ndarray, list[float], list[float]]:
        env = SyntheticCostEnv(step_cost_ms=0.01, cost_mode="sleep")
        obs = [env.reset(seed)]
        rewards, costs = [], []
        rng = np.random.default_rng(1)
        for _ in range(10):
            c = env.cost_seconds
            r = env.step(rng.uniform(-1, 1, 4))
            obs.append(r.obs)
            rewards.append(r.reward)
            costs.append(env.cost_seconds - c)
        return np.stack(obs), rewards, costs

    o1, r1, c1 = run(42)
    o2, r2, c2 = run(42)
    np.testing.assert_array_equal(o1, o2)
    assert r1 == r2 and c1 == c2
    o3, _, c3 = run(43)
    assert not np.array_equal(o1[0], o3[0]) and c1 != c3


def test_cost_settings_do_not_change_trajectories():
    a = SyntheticCostEnv(step_cost_ms=0.0)
    b = SyntheticCostEnv(step_cost_ms=0.05, tail_ratio=3.0, cost_mode="sleep")
    np.testing.assert_array_equal(a.reset(9), b.reset(9))
    act = np.full(4, 0.3, np.float32)
    for _ in range(5):
        np.testing.assert_array_equal(a.step(act).obs, b.step(act).obs)


def test_task_shapes_rewards_and_a_simple_controller_succeeds():
    env = SyntheticCostEnv(step_cost_ms=0.0, dim=3, action_dim=5)
    assert isinstance(env, Env)
    assert (env.spec.obs_dim, env.spec.action_dim) == (9, 5)
    successes = 0
    for ep in range(20):
        obs = env.reset(ep)
        assert obs.dtype == np.float32 and obs.shape == (9,)
        for _ in range(env.spec.max_episode_steps):
            pos, target, vel = obs[:3], obs[3:6], obs[6:]
            act = np.zeros(5, np.float32)
            act[:3] = 3.0 * (target - pos) - 2.0 * vel  # a linear policy solves the task
            r = env.step(act)
            assert -1.0 < r.reward <= 0.0
            obs = r.obs
            if r.terminated or r.truncated:
                break
        successes += r.success and r.terminated
    assert successes == 20


def test_unit_reward_range_and_in_group():
    envs = [SyntheticCostEnv(step_cost_ms=0.0, reward="unit") for _ in range(2)]
    g = EnvGroup(envs, [0, 1], seed=0)
    assert tuple(g.reset().shape) == (2, 12)
    out = g.step_chunk(
        ActionChunk(
            actions=torch.zeros(2, 3, 4),
            logprob=torch.zeros(2),
            value=torch.zeros(2),
            env_ids=torch.tensor([0, 1]),
            policy_version=torch.zeros(2, dtype=torch.int64),
        )
    )
    assert ((out.reward > 0) & (out.reward <= 1)).all()


def test_bad_arguments():
    with pytest.raises(ValueError):
        SyntheticCostEnv(dim=4, action_dim=3)
    with pytest.raises(ValueError):
        SyntheticCostEnv(cost_mode="nap")
    with pytest.raises(ValueError):
        SyntheticCostEnv(tail_ratio=50.0)
    with pytest.raises(ValueError):
        SyntheticCostEnv().set_cost_scale(-1.0)
