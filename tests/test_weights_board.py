"""The weight board: round trips, in-place reads, layout checks, the seqlock, cleanup, processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from collections.abc import Callable

import pytest
import torch

from ebrl.policies import MLPPolicy, PolicySpec, TransformerPolicy
from ebrl.runtime.watchdog import SHM_DIR, shm_prefix
from ebrl.runtime.weight_board import BoardReader, BoardSpec, WeightBoard
from ebrl.runtime.weight_cast import open_board

SPEC = PolicySpec(7, 3, 4)


def _mlp(seed: int) -> MLPPolicy:
    torch.manual_seed(seed)
    return MLPPolicy(SPEC, hidden=32, layers=2)


@pytest.fixture
def board():
    b = WeightBoard.create(_mlp(0).state_dict(), os.getpid())
    yield b
    b.close()


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_round_trip_of_a_policy(kind):
    torch.manual_seed(0)
    src = _mlp(0) if kind == "mlp" else TransformerPolicy(SPEC, "S", obs_tokens=3)
    state = src.state_dict()
    with WeightBoard.create(state, os.getpid()) as b, open_board(b.spec) as r:
        assert b.publish(3, state) >= 0.0
        v, out = r.read()
        assert v == 3 == r.version() == b.version
        assert list(out) == list(state)
        for k, t in state.items():
            assert (
                torch.equal(out[k], t) and out[k].dtype == t.dtype and out[k].device.type == "cpu"
            )
        # a copy, not a view of the board: the next publish leaves it alone
        before = {k: t.clone() for k, t in out.items()}
        b.publish(4, {k: t + 1 for k, t in state.items()})
        assert all(torch.equal(out[k], before[k]) for k in out)
        dst = _mlp(1) if kind == "mlp" else TransformerPolicy(SPEC, "S", obs_tokens=3)
        dst.set_weights(*r.read())
        assert dst.version == 4
        assert all(torch.equal(dst.state_dict()[k], state[k] + 1) for k in state)


def test_read_into_a_policys_tensors_allocates_nothing(board):
    src, dst = _mlp(0), _mlp(1)
    board.publish(7, src.state_dict())
    sd = dst.state_dict()
    ptrs = {k: t.data_ptr() for k, t in sd.items()}
    with BoardReader(board.spec) as r:
        v, out = r.read(into=sd)
    assert v == 7 and out is sd
    assert {k: t.data_ptr() for k, t in sd.items()} == ptrs
    # the policy's parameters share that storage: dst now acts like src
    for a, b in zip(dst.parameters(), src.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_wrong_layout_is_refused(board):
    good = _mlp(0).state_dict()
    key = next(iter(good))
    missing = {k: t for k, t in good.items() if k != key}
    extra = {**good, "extra": torch.zeros(2)}
    shape = {**good, key: torch.zeros(good[key].numel() + 1)}
    dtype = {**good, key: good[key].double()}
    other = MLPPolicy(SPEC, hidden=16, layers=2).state_dict()
    for bad, match in [
        (missing, "missing keys"),
        (extra, "unexpected keys"),
        (shape, "the board has float32"),
        (dtype, "is float64"),
        (other, "does not match"),
    ]:
        with pytest.raises(ValueError, match=match):
            board.publish(1, bad)
    assert board.version == -1  # nothing was written
    board.publish(2, good)
    with open_board(board.spec) as r, pytest.raises(ValueError, match="read into"):
        r.read(into=shape)
    with pytest.raises(ValueError, match=">= 0"):
        board.publish(-1, good)


def test_version_is_minus_one_before_the_first_publish(board):
    with open_board(board.spec) as r:
        assert r.version() == -1
        assert r.read() == (-1, {})
        sd = _mlp(1).state_dict()
        before = {k: t.clone() for k, t in sd.items()}
        v, out = r.read(into=sd)
        assert v == -1 and out is sd and all(torch.equal(sd[k], before[k]) for k in sd)
        board.publish(0, _mlp(0).state_dict())
        assert r.version() == 0


def _uniform_state(value: float) -> dict[str, torch.Tensor]:
    # many tensors, so a read that is not guarded crosses publishes between them
    return {f"w{i}": torch.full((16384,), value) for i in range(16)}


def test_a_reader_racing_the_writer_never_sees_a_torn_state():
    zeros, ones = _uniform_state(0.0), _uniform_state(1.0)
    with WeightBoard.create(zeros, os.getpid()) as b, open_board(b.spec) as r:
        b.publish(0, zeros)
        stop = threading.Event()

        def write() -> None:  # even versions all 0, odd versions all 1
            # pauses of 0-300 us between publishes (about one read's time): a writer that never
            # pauses would starve the reader, as it would any seqlock's
            rng, v = random.Random(0), 0
            while not stop.is_set():
                v += 1
                b.publish(v, ones if v % 2 else zeros)
                time.sleep(rng.uniform(0, 3e-4))

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        into = _uniform_state(-1.0)
        # until the race has happened often enough (reads started over), at most 8 s
        seen, reads, deadline = set(), 0, time.monotonic() + 8.0
        try:
            while (r.retries < 20 or reads < 100) and time.monotonic() < deadline:
                v, out = r.read(into=into if reads % 2 else None, timeout=10)
                flat = torch.cat(list(out.values()))
                lo, hi = float(flat.min()), float(flat.max())
                assert lo == hi == float(v % 2), f"torn read: version {v}, values {lo}..{hi}"
                seen.add(lo)
                reads += 1
        finally:
            stop.set()
            writer.join(10)
        assert seen == {0.0, 1.0}
        assert r.retries >= 20, f"the reader raced the writer only {r.retries} times"


class _Spy(torch.Tensor):
    """A tensor that calls ``on_copy`` whenever it takes part in a ``copy_``."""

    on_copy: Callable[[], None] = staticmethod(lambda: None)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            cls.on_copy()
        return super().__torch_function__(func, types, args, kwargs or {})


def test_the_seq_is_odd_while_a_publish_copies(board, monkeypatch):
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(_Spy, "on_copy", lambda: seen.append(tuple(board._header[:2].tolist())))
    board.publish(3, {k: t.as_subclass(_Spy) for k, t in _mlp(0).state_dict().items()})
    assert seen and all(seq % 2 == 1 and version == -1 for seq, version in seen)
    assert board._header[0] % 2 == 0 and board.version == 3


def test_a_read_that_a_publish_overlapped_starts_over(board, monkeypatch):
    old, new = _mlp(0).state_dict(), _mlp(1).state_dict()
    board.publish(1, old)
    calls = []

    def publish_once() -> None:  # a whole publish lands in the middle of the reader's copy
        calls.append(1)
        if len(calls) == 2:
            board.publish(2, new)

    monkeypatch.setattr(_Spy, "on_copy", publish_once)
    into = {k: torch.zeros_like(t).as_subclass(_Spy) for k, t in old.items()}
    with open_board(board.spec) as r:
        v, out = r.read(into=into)
        assert v == 2 and r.retries == 1
    assert all(torch.equal(out[k].as_subclass(torch.Tensor), new[k]) for k in new)


def test_a_reader_waits_while_the_seq_is_odd(board):
    state = _mlp(0).state_dict()
    board.publish(5, state)
    header = board._header  # the writer is "copying": seq odd, as mid-publish
    header[0] += 1
    with open_board(board.spec) as r:
        with pytest.raises(TimeoutError):
            r.read(timeout=0.1)
        with pytest.raises(TimeoutError):
            r.version(timeout=0.1)
        got: list[int] = []
        reader = threading.Thread(target=lambda: got.append(r.read(timeout=10)[0]), daemon=True)
        reader.start()
        time.sleep(0.3)
        assert reader.is_alive() and not got  # still waiting
        header[1] = 6  # the "copy" completes as version 6
        header[0] += 1
        reader.join(5)
        assert got == [6]


def test_close_unlinks_and_the_watchdog_can_find_the_segment(board):
    name = board.spec.name
    assert name.startswith(shm_prefix(os.getpid()))
    assert name.split("_")[1] == str(os.getpid())  # how sweep_dead_drivers reads the owner
    assert SHM_DIR / name in SHM_DIR.glob(shm_prefix(os.getpid()) + "*")
    r = open_board(board.spec)
    r.close()
    r.close()
    assert (SHM_DIR / name).exists()  # a reader never unlinks
    board.close()
    board.close()
    assert not (SHM_DIR / name).exists()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_board(board.spec)


def test_an_owner_that_is_not_a_live_process_is_refused():
    dead = mp.get_context("spawn").Process(target=int)
    dead.start()
    dead.join()
    with pytest.raises(ValueError, match="owner pid"):
        WeightBoard.create(_mlp(0).state_dict(), dead.pid)


def _child_reads(spec: BoardSpec, q) -> None:
    with open_board(spec) as r:
        v, state = r.read()
    q.put((v, {k: t.numpy() for k, t in state.items()}))


def test_a_reader_in_another_process_reads_what_was_published(board):
    state = {k: t + 0.5 for k, t in _mlp(0).state_dict().items()}
    board.publish(11, state)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(board.spec, q))
    child.start()
    v, got = q.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0 and v == 11
    assert all(torch.equal(torch.from_numpy(got[k]), state[k]) for k in state)
    # the child's exit (and its resource tracker) left the segment alone
    assert (SHM_DIR / board.spec.name).exists()
    with open_board(board.spec) as r:
        assert r.read()[0] == 11


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_publish_from_gpu_tensors():
    src = _mlp(0).cuda()
    with WeightBoard.create(src.state_dict(), os.getpid()) as b, open_board(b.spec) as r:
        b.publish(1, src.state_dict())
        dst = _mlp(1).cuda()
        v, _ = r.read(into=dst.state_dict())
        assert v == 1
        assert all(torch.equal(a, c) for a, c in zip(dst.parameters(), src.parameters()))
