"""The data contract: shapes, joining, stacking, versions and staleness."""

import pytest
import torch

from ebrl.rollout import SegmentBuilder
from ebrl.types import ActionChunk, ChunkOutcome, Observation, Segment, Transition

O, K, A = 3, 2, 2


def decision(env_ids, version=0, t=0):
    ids = torch.tensor(env_ids, dtype=torch.int64)
    b = len(env_ids)
    obs = Observation(obs=ids[:, None].float().expand(b, O) + t, env_ids=ids)
    chunk = ActionChunk(
        actions=torch.full((b, K, A), float(t)),
        logprob=torch.zeros(b),
        value=torch.zeros(b),
        env_ids=ids,
        policy_version=torch.full((b,), version),
    )
    out = ChunkOutcome(
        reward=ids[:, None].float().expand(b, K) * 10 + t,
        n_steps=torch.full((b,), K),
        terminated=torch.zeros(b, dtype=torch.bool),
        truncated=torch.zeros(b, dtype=torch.bool),
        success=torch.zeros(b, dtype=torch.bool),
        final_obs=obs.obs + 1,
        next_obs=obs.obs + 1,
        episode_id=torch.zeros(b, dtype=torch.int64),
        episode_step=torch.zeros(b, dtype=torch.int64),
        env_ids=ids,
    )
    return obs, chunk, out


def test_join_refuses_mixed_envs():
    obs, chunk, _out = decision([0, 1])
    _, _, other = decision([1, 0])
    with pytest.raises(ValueError, match="env_ids differ"):
        Transition.join(obs, chunk, other)


def test_segment_shapes_and_staleness():
    rows = [Transition.join(*decision([0, 1, 2], version=v, t=v)) for v in range(4)]
    seg = Segment.stack(rows)
    assert seg.shape == (4, 3)
    assert seg.obs.shape == (4, 3, O)
    assert seg.actions.shape == (4, 3, K, A)
    assert seg.reward.shape == (4, 3, K)
    assert seg.num_steps == 4 * 3 * K
    assert seg.staleness(5).tolist() == [[5] * 3, [4] * 3, [3] * 3, [2] * 3]


def test_cat_envs_rejects_overlap():
    a = Segment.stack([Transition.join(*decision([0, 1]))])
    b = Segment.stack([Transition.join(*decision([2]))])
    assert Segment.cat_envs([a, b]).env_ids.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="overlap"):
        Segment.cat_envs([a, a])


def test_builder_keeps_each_env_in_order_when_envs_run_ahead():
    b = SegmentBuilder([0, 1, 2], decisions_per_env=2)
    # env 2 runs three decisions ahead, env 0 arrives last; batches mix envs arbitrarily
    b.add(Transition.join(*decision([2], t=0)))
    b.add(Transition.join(*decision([2, 1], t=1)))
    b.add(Transition.join(*decision([2], t=2)))
    b.add(Transition.join(*decision([1, 0], t=3)))
    assert not b.ready()
    b.add(Transition.join(*decision([0], t=4)))
    seg = b.pop()
    assert seg.env_ids.tolist() == [0, 1, 2]
    # obs[t, i] = env_id + the round it was produced in: every column is one env's history
    assert seg.obs[:, :, 0].tolist() == [[3.0, 2.0, 2.0], [4.0, 4.0, 3.0]]
    for i, e in enumerate([0, 1, 2]):
        assert torch.all((seg.reward[:, i, 0] - seg.obs[:, i, 0] + e) == 10 * e)
    assert b.queued(2) == 1 and b.queued(0) == 0


def test_builder_unknown_env():
    b = SegmentBuilder([0], 1)
    with pytest.raises(KeyError, match="env id 5"):
        b.add(Transition.join(*decision([5])))
