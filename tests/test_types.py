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


def with_chain(obs, chunk, out, t=0):
    """The decision with a flow policy's extras: a chain [B, 3, 2] and step indices [B, 2]."""
    ids = chunk.env_ids
    chunk.extras = {
        "chain": ids[:, None, None].float().expand(-1, 3, 2) * 100 + t,
        "inds": ids[:, None].expand(-1, 2) + 10 * t,
    }
    return obs, chunk, out


def test_extras_follow_their_decisions_through_rows_select_join_and_builder():
    """Envs run ahead of each other and arrive in any order; each decision's extras stay in its
    row, from the chunk to the segment the learner flattens."""
    _, chunk, _ = with_chain(*decision([0, 1, 2]))
    torch.testing.assert_close(
        chunk.select(torch.tensor([2, 0])).extras["inds"][:, 0], torch.tensor([2, 0])
    )
    assert chunk.rows(1, 2).extras["chain"].shape == (1, 3, 2)
    b = SegmentBuilder([0, 1, 2], decisions_per_env=2)
    for ids, t in [([2, 0], 0), ([1], 0), ([2], 1), ([0, 1], 1), ([1, 0, 2], 2)]:
        b.add(Transition.join(*with_chain(*decision(ids, t=t), t=t)))
    seg = b.pop()
    assert set(seg.extras) == {"chain", "inds"}
    assert seg.extras["chain"].shape == (2, 3, 3, 2) and seg.extras["inds"].shape == (2, 3, 2)
    for t in range(2):
        for i, e in enumerate([0, 1, 2]):
            assert seg.extras["inds"][t, i, 0] == e + 10 * t
            assert seg.extras["chain"][t, i, 0, 0] == e * 100 + t
    flat = seg.flat_extras()
    assert flat["inds"][:, 0].tolist() == seg.extras["inds"].flatten(0, 1)[:, 0].tolist()
    assert flat["chain"].shape == (6, 3, 2)
    assert seg.to("cpu").extras["chain"].shape == (2, 3, 3, 2)


def test_segments_of_several_workers_concatenate_their_extras_and_refuse_a_mismatch():
    parts = []
    for ids in ([0, 1], [2]):
        b = SegmentBuilder(ids, decisions_per_env=1)
        b.add(Transition.join(*with_chain(*decision(ids))))
        parts.append(b.pop())
    seg = Segment.cat_envs(parts)
    assert seg.extras["inds"][0, :, 0].tolist() == [0, 1, 2]
    plain = SegmentBuilder([3], decisions_per_env=1)
    plain.add(Transition.join(*decision([3])))
    with pytest.raises(ValueError, match="different extras"):
        Segment.cat_envs([*parts, plain.pop()])


def test_slots_carry_the_extras_in_the_message_beside_the_shared_rows():
    from ebrl.runtime.slots import InlineSlots, ShmSlots

    _, chunk, _ = with_chain(*decision([3, 1]))
    shm = ShmSlots.create(num_envs=4, obs_dim=O, chunk_size=K, action_dim=A)
    try:
        for slots in (shm, InlineSlots(shm.spec)):
            payload = slots.put_chunk(chunk)
            got = slots.get_chunk(chunk.env_ids.numpy(), payload)
            for name, t in chunk.extras.items():
                torch.testing.assert_close(got.extras[name], t)
            torch.testing.assert_close(got.actions, chunk.actions)
        _, plain, _ = decision([0])
        assert shm.put_chunk(plain) is None  # nothing extra to send
        assert shm.get_chunk(plain.env_ids.numpy(), None).extras == {}
    finally:
        shm.close()
