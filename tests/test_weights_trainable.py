"""Only what trains is published: after the first whole publish, the weight board and the inline
``Weights`` messages carry the parameters with ``requires_grad`` (and the buffers), as a VLA whose
backbone is frozen needs (pi0 trains its ~300M action expert of 3.3B parameters).

A policy with a frozen part, trained by PPO through ``TrainStage``: the board's frozen tensors
are written once and never again, the trainable ones after every update; a replica reading into
its own tensors copies the trainable ones only and ends with the learner's weights, version for
version; a new reader, other tensors or a whole publish since get everything; a racing reader
never sees a torn mix; a replica on another machine gets the trainable tensors inline after one
whole state.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
import torch

from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.runtime.weight_board import WeightBoard
from ebrl.runtime.weight_cast import open_board
from ebrl.stages.gen import GenStage
from ebrl.stages.train import TrainStage

from .test_data_parallel import _collect

SPEC = PolicySpec(4, 2, 3)


def _policy(seed: int = 7) -> MLPPolicy:
    """An MLP policy whose critic is frozen (the 'backbone' of this test)."""
    torch.manual_seed(seed)
    pol = MLPPolicy(SPEC, hidden=16, layers=1)
    pol.critic.requires_grad_(False)
    return pol


def _learner() -> tuple[TrainStage, list]:
    pol = _policy()
    segs = [_collect(pol, n_envs=5, t_len=4, k=3, noise=0.0, seed=u) for u in range(3)]
    algo = PPO(pol, PPOConfig(update_epochs=1, num_minibatches=2, target_kl=None, lr=1e-2))
    return TrainStage(algo, device="cpu"), segs


def _nbytes(state: dict, keys) -> int:
    return sum(state[k].numel() * state[k].element_size() for k in keys)


def test_the_changing_keys_are_the_trainable_parameters():
    stage, _ = _learner()
    changing = stage.changing()
    assert changing is not None and changing
    assert not any(k.startswith("critic.") for k in changing)
    trainable = {n for n, p in stage.algo.policy.named_parameters() if p.requires_grad}
    assert set(changing) == trainable  # the MLP has no buffers
    # a policy that trains whole changes every key: the board copies everything, as before
    whole = TrainStage(PPO(MLPPolicy(SPEC, hidden=16, layers=1), PPOConfig()), device="cpu")
    assert whole.changing() is None


def test_the_board_rewrites_only_the_trainable_part():
    stage, segs = _learner()
    state = stage.state()
    changing = stage.changing()
    frozen = [k for k in state if k not in changing]
    replica = GenStage(_policy(seed=123))  # other weights at first: the reads must fix them
    replica.policy.version = -1  # (a replica at the board's version would not read it)
    with WeightBoard.create(state, os.getpid(), changing) as board, open_board(board.spec) as r:
        assert board.spec.changing == changing
        board.publish(stage.version, state)
        assert board.last_bytes == _nbytes(state, state)  # the first publish: all of it
        assert replica.load_from(r) == 0 and r.last_bytes == _nbytes(state, state)
        for seg in segs:
            stage.train(seg)
            # frozen tensors passed as garbage: a publish that rewrote them would show it
            sent = {k: (v if k in changing else torch.full_like(v, 9.0)) for k, v in state.items()}
            board.publish(stage.version, sent)
            assert board.last_bytes == _nbytes(state, changing) < _nbytes(state, state)
            assert replica.load_from(r) == stage.version
            assert r.last_bytes == _nbytes(state, changing)
            got = replica.policy.state_dict()
            for k, v in stage.state().items():
                assert torch.equal(got[k], v), k
        assert stage.version == len(segs)
        # the trainable part moved and the frozen part did not
        start = _policy().state_dict()
        assert all(torch.equal(start[k], stage.state()[k]) for k in frozen)
        assert any(not torch.equal(start[k], stage.state()[k]) for k in changing)
        # a new reader, or a read into new tensors, copies the whole state
        with open_board(board.spec) as fresh:
            v, out = fresh.read()
            assert v == stage.version and fresh.last_bytes == _nbytes(state, state)
            assert all(torch.equal(out[k], stage.state()[k]) for k in state)
        r.read()
        assert r.last_bytes == _nbytes(state, state)
        # a whole publish makes every reader copy the whole state again
        board.publish(stage.version + 1, state, full=True)
        assert board.last_bytes == _nbytes(state, state)
        assert replica.load_from(r) == stage.version + 1
        assert r.last_bytes == _nbytes(state, state)


def test_a_partial_publish_must_carry_every_trainable_tensor():
    stage, _ = _learner()
    state, changing = stage.state(), stage.changing()
    with WeightBoard.create(state, os.getpid(), changing) as board:
        with pytest.raises(ValueError, match="missing keys"):
            board.publish(0, {k: state[k] for k in changing})  # the first one must be whole
        board.publish(0, state)
        with pytest.raises(ValueError, match="lacks changing keys"):
            board.publish(1, {k: state[k] for k in changing[1:]})
        assert board.version == 0
    with pytest.raises(ValueError, match="not in the state dict"):
        WeightBoard.create(state, os.getpid(), ["nope"])


def _state(frozen: float, trained: float) -> dict:
    return {f"f{i}": torch.full((16384,), frozen) for i in range(8)} | {
        f"t{i}": torch.full((16384,), trained) for i in range(8)
    }


def test_a_reader_racing_partial_publishes_never_sees_a_torn_state():
    changing = [f"t{i}" for i in range(8)]
    with (
        WeightBoard.create(_state(5.0, 0.0), os.getpid(), changing) as b,
        open_board(b.spec) as r,
    ):
        b.publish(0, _state(5.0, 0.0))
        stop = threading.Event()

        def write() -> None:  # odd versions trained = 1, even 0; the frozen part stays 5
            rng, v = random.Random(0), 0
            while not stop.is_set():
                v += 1
                b.publish(v, _state(-1.0, float(v % 2)))  # frozen garbage: never copied
                time.sleep(rng.uniform(0, 3e-4))

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        into = _state(-7.0, -7.0)
        reads, deadline = 0, time.monotonic() + 6.0
        try:
            while (r.retries < 10 or reads < 100) and time.monotonic() < deadline:
                v, out = r.read(into=into, timeout=10)
                trained = torch.cat([out[k] for k in changing])
                frozen = torch.cat([out[k] for k in out if k not in changing])
                assert float(trained.min()) == float(trained.max()) == float(v % 2), v
                assert float(frozen.min()) == float(frozen.max()) == 5.0, v
                reads += 1
        finally:
            stop.set()
            writer.join(10)
        assert r.retries >= 10, f"the reader raced the writer only {r.retries} times"


def test_inline_replicas_get_the_trainable_tensors_after_one_whole_state():
    stage, segs = _learner()
    changing = stage.changing()
    replica = GenStage(_policy(seed=123))
    replica.policy.version = -1  # (a replica at the learner's version would not load it)
    version, whole = stage.weights()
    assert whole.keys() == stage.state().keys()
    replica.load(version, whole)
    for seg in segs:
        stage.train(seg)
        version, part = stage.weights(changing_only=True)
        assert tuple(part) == changing
        replica.load(version, part)
        assert replica.version == stage.version
        got = replica.policy.state_dict()
        assert all(torch.equal(got[k], v) for k, v in stage.state().items())
    with pytest.raises(ValueError, match="not the policy's"):
        replica.load(99, {"nope": torch.zeros(1)})
