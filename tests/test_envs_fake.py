"""CountingEnv and EnvGroup: chunked stepping, auto-reset, episode ids, reset seeds, no mixing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ebrl.envs import CountingEnv, Env, EnvGroup, reset_seed
from ebrl.envs.fake import SEED_MOD, counting_reward
from ebrl.types import ActionChunk

A = 2


def make_group(ids: list[int], seed: int = 7) -> EnvGroup:
    """Default-length CountingEnvs (3 + id % 4 steps) showing their reset seed in obs[4]."""
    return EnvGroup([CountingEnv(g, obs_dim=5) for g in ids], ids, seed=seed)


def chunk(ids: list[int], actions: np.ndarray) -> ActionChunk:
    """An ActionChunk for ``ids`` with actions ``[M, K, A]``."""
    m = len(ids)
    return ActionChunk(
        actions=torch.as_tensor(actions, dtype=torch.float32),
        logprob=torch.zeros(m),
        value=torch.zeros(m),
        env_ids=torch.as_tensor(ids, dtype=torch.int64),
        policy_version=torch.zeros(m, dtype=torch.int64),
    )


def int_actions(m: int, k: int, start: int = 1) -> np.ndarray:  # [M, K, A]
    """Distinct small-integer actions, so every reward term is recoverable."""
    a = np.zeros((m, k, A), np.float32)
    a[..., 0] = np.arange(start, start + m * k).reshape(m, k) % 7
    return a


def test_counting_env_protocol_and_episode():
    env = CountingEnv(2, obs_dim=5)
    assert isinstance(env, Env)
    assert env.episode_len == 5 and env.spec.max_episode_steps == 5
    obs = env.reset(123)
    assert obs.dtype == np.float32 and obs.shape == (5,)
    np.testing.assert_array_equal(obs, [2, 1, 0, 0, 123])
    total = 0.0
    for t in range(1, 6):
        r = env.step(np.array([t, 0], np.float32))
        total += t
        assert r.reward == counting_reward(2, t, t)
        np.testing.assert_array_equal(r.obs[:4], [2, 1, t, total])
        assert r.terminated == r.success == (t == 5) and not r.truncated
    with pytest.raises(RuntimeError):
        env.step(np.zeros(A, np.float32))


def test_counting_env_truncation_flag():
    env = CountingEnv(0, episode_len=10, max_steps=3)
    env.reset(0)
    out = [env.step(np.zeros(A, np.float32)) for _ in range(3)]
    assert [o.truncated for o in out] == [False, False, True]
    assert not any(o.terminated or o.success for o in out)


def test_chunks_end_at_different_times_and_auto_reset():
    ids = [0, 1, 2, 3]  # episode lengths 3, 4, 5, 6
    g = make_group(ids)
    obs0 = g.reset()
    np.testing.assert_array_equal(obs0[:, :3].numpy(), [[i, 1, 0] for i in ids])
    k = 4
    acts = int_actions(4, k)
    out = g.step_chunk(chunk(ids, acts))
    # env 0 ends its 3-step episode inside the chunk; env 1 exactly at the chunk's end.
    assert out.n_steps.tolist() == [3, 4, 4, 4]
    assert out.terminated.tolist() == [True, True, False, False]
    assert out.success.tolist() == [True, True, False, False]
    assert not out.truncated.any()
    assert out.episode_id.tolist() == [0, 0, 0, 0]
    # Rewards: each row is its own env's, its own steps', its own actions'; zero after the end.
    for row, g_id in enumerate(ids):
        n = int(out.n_steps[row])
        for j in range(k):
            want = counting_reward(g_id, j + 1, acts[row, j, 0]) if j < n else 0.0
            assert out.reward[row, j].item() == want
    # final_obs is the end of the chunk before reset; next_obs the new episode when done.
    assert out.final_obs[:, 2].tolist() == [3, 4, 4, 4]
    assert out.next_obs[:, 2].tolist() == [0, 0, 4, 4]
    assert out.next_obs[:, 1].tolist() == [2, 2, 1, 1]  # done envs were reset once more
    np.testing.assert_array_equal(out.final_obs[2:].numpy(), out.next_obs[2:].numpy())
    np.testing.assert_array_equal(out.next_obs.numpy(), g.observe().numpy())
    # Second chunk: episode ids moved on for the envs that finished.
    out2 = g.step_chunk(chunk(ids, int_actions(4, k, start=3)))
    assert out2.episode_id.tolist() == [1, 1, 0, 0]
    assert out2.n_steps.tolist() == [3, 4, 1, 2]
    assert out2.terminated.tolist() == [True, True, True, True]
    assert g.episode_id.tolist() == [2, 2, 1, 1]


def test_subset_and_order_follow_the_chunk():
    ids = [10, 11, 12, 13]
    g = make_group(ids)
    g.reset()
    sub = [13, 11]  # a subset, out of group order
    acts = int_actions(2, 2)
    out = g.step_chunk(chunk(sub, acts))
    assert out.env_ids.tolist() == sub
    assert out.final_obs[:, 0].tolist() == sub  # obs[0] is the env id
    assert out.reward[0, 0].item() == counting_reward(13, 1, acts[0, 0, 0])
    assert out.reward[1, 1].item() == counting_reward(11, 2, acts[1, 1, 0])
    # Untouched envs did not move.
    assert g.observe(torch.tensor([10, 12]))[:, 2].tolist() == [0, 0]
    with pytest.raises(KeyError):
        g.step_chunk(chunk([99], int_actions(1, 2)))


def test_step_one_equals_step_chunk():
    ids = [0, 1, 2]
    a, b = make_group(ids), make_group(ids)
    a.reset(), b.reset()
    rng = np.random.default_rng(0)
    for _ in range(6):
        env_id = int(rng.integers(0, 3))
        acts = rng.integers(-3, 4, size=(1, 3, A)).astype(np.float32)
        oa = a.step_chunk(chunk([env_id], acts))
        ob = b.step_one(env_id, acts[0])
        for f in (
            "reward",
            "n_steps",
            "terminated",
            "truncated",
            "success",
            "final_obs",
            "next_obs",
            "episode_id",
            "env_ids",
        ):
            assert torch.equal(getattr(oa, f), getattr(ob, f)), f
    np.testing.assert_array_equal(a.observe().numpy(), b.observe().numpy())


def test_truncation_reported_through_group():
    g = EnvGroup([CountingEnv(0, episode_len=10, max_steps=2)], [0], seed=0)
    g.reset()
    out = g.step_chunk(chunk([0], int_actions(1, 4)))
    assert out.n_steps.tolist() == [2]
    assert out.truncated.tolist() == [True] and out.terminated.tolist() == [False]
    assert out.success.tolist() == [False]


def test_reset_seeds_deterministic_and_shared_within_reset_groups():
    ids = [0, 1, 2, 3]

    def run(seed: int) -> list[list[int]]:
        envs = [CountingEnv(g, episode_len=2, obs_dim=5) for g in ids]
        g = EnvGroup(envs, ids, seed=seed, reset_group_size=2)
        g.reset()
        for _ in range(3):  # each chunk ends every episode: one reset per chunk
            g.step_chunk(chunk(ids, int_actions(4, 2)))
        return [e.seeds for e in envs]

    seeds = run(5)
    assert seeds == run(5)  # deterministic
    assert seeds != run(6)  # and a function of the run seed
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3]  # shared within a reset group
    assert seeds[0] != seeds[2]
    assert len(set(seeds[0])) == 4  # a new initial state per episode
    assert seeds[2] == [reset_seed(5, 1, e) for e in range(4)]


def test_reset_seed_visible_in_obs_and_groups_of_one():
    ids = [0, 1]
    g = make_group(ids, seed=3)
    obs = g.reset()
    want = [reset_seed(3, i, 0) % SEED_MOD for i in ids]
    assert obs[:, 4].tolist() == want


@settings(max_examples=30, deadline=None)
@given(
    lens=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    k=st.integers(1, 5),
    rounds=st.integers(1, 6),
)
def test_property_no_mixing_and_consistent_histories(lens, k, rounds):
    """Random lengths and chunk sizes: each env's data stays its own and histories chain."""
    ids = [5 * i + 1 for i in range(len(lens))]
    envs = [CountingEnv(g, episode_len=n) for g, n in zip(ids, lens)]
    g = EnvGroup(envs, ids, seed=0)
    prev = g.reset()
    steps = {gid: 0 for gid in ids}
    for r in range(rounds):
        acts = int_actions(len(ids), k, start=r)
        out = g.step_chunk(chunk(ids, acts))
        for row, gid in enumerate(ids):
            n = int(out.n_steps[row])
            assert 1 <= n <= k
            t0 = int(prev[row, 2])  # the step count this chunk started from
            assert out.final_obs[row, 0] == gid and out.final_obs[row, 2] == t0 + n
            for j in range(n):
                want = counting_reward(gid, t0 + j + 1, acts[row, j, 0])
                assert out.reward[row, j].item() == want
            assert (out.reward[row, n:] == 0).all()
            done = bool(out.terminated[row])
            assert done == (t0 + n == lens[row]) and (done or n == k)
            steps[gid] += n
        prev = out.next_obs
    assert {gid: e.steps_total for gid, e in zip(ids, envs)} == steps
