"""The weights across nodes: the leader's board broadcast to one receiver per node, which writes
its node's board for the node's replicas (``ebrl.runtime.weight_cast``: ``Caster``, ``Receiver``,
``open_board`` of a ``NodeBoard``).

Here the leader and two nodes' receivers are threads of this process, each with its own gloo
group (NCCL needs a GPU per member and cannot run on this machine; its choice is tested in
``tests/test_dist_backend.py``). A two-node Ray cluster runs it through the scheduler in
``tests/test_weights_two_nodes.py``.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from ebrl.runtime import weight_cast
from ebrl.runtime.dist_group import free_port
from ebrl.runtime.watchdog import SHM_DIR
from ebrl.runtime.weight_board import BoardSpec, WeightBoard
from ebrl.runtime.weight_cast import CastSpec, NodeBoard, buckets, open_board
from ebrl.runtime.weight_layout import ALIGN


def _state(seed: int) -> dict[str, torch.Tensor]:
    """A policy-like state: fp32 and bf16 weights (a VLA keeps parts in bf16), an int64 buffer,
    a bool mask, an empty tensor; ``frozen.*`` does not train."""
    g = torch.Generator().manual_seed(seed)
    return {
        "frozen.w": torch.randn(33, 7, generator=g),
        "expert.w": torch.randn(5, 9, generator=g),
        "expert.b16": torch.randn(17, generator=g).to(torch.bfloat16),
        "count": torch.tensor([seed, seed + 1], dtype=torch.int64),
        "mask": torch.rand(6, generator=g) > 0.5,
        "empty": torch.zeros(0, 3),
    }


CHANGING = ("expert.w", "expert.b16", "count", "mask", "empty")


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


@pytest.fixture
def cast_world(monkeypatch):
    """The leader's board (casting to 2 receivers) and 3 readers: node 1's receiver, another
    replica of node 1, node 2's receiver. Buckets of at most 256 bytes: several per update."""
    monkeypatch.setattr(weight_cast, "CAST_BUCKET", 256)
    board = WeightBoard.create(_state(0), os.getpid(), CHANGING)
    cast = CastSpec(("127.0.0.1", free_port()), receivers=2, timeout_s=30)
    joined: list[BaseException] = []

    def lead() -> None:
        try:
            board.cast_to(cast)
        except BaseException as e:  # surfaced by the test
            joined.append(e)

    t = threading.Thread(target=lead)
    t.start()
    readers = [
        open_board(NodeBoard(cast, 1, board.spec, receiver=True)),
        open_board(NodeBoard(cast, 1, board.spec)),
        open_board(NodeBoard(cast, 2, board.spec, receiver=True)),
    ]
    t.join(30)
    assert not t.is_alive() and not joined, joined
    yield board, readers
    for r in readers:
        r.close()
    board.close()


def test_every_nodes_replicas_read_what_the_leader_published(cast_world):
    board, readers = cast_world
    assert [r.path for r in readers] == ["collective"] * 3
    # node 1's two replicas read one board (its receiver's); node 2 its own
    assert readers[0].spec.name == readers[1].spec.name != readers[2].spec.name
    assert board.spec.name not in {r.spec.name for r in readers}
    s0 = _state(0)
    board.publish(0, s0)
    for r in readers:  # the publish returned: every node's board holds version 0 already
        version, got = r.read()
        assert version == 0
        _same(got, s0)
    m = board.cast_metrics()
    assert m["pipeline/weights_cast_nodes"] == 2.0 and m["pipeline/weights_cast_nccl"] == 0.0
    whole_mb = m["pipeline/weights_cast_mb"]
    # the next update: the changing tensors only travel, the frozen one stays as it was
    s1 = _state(1)
    board.publish(1, {k: s1[k] for k in CHANGING})
    want = {**s1, "frozen.w": s0["frozen.w"]}
    for r in readers:
        version, got = r.read()
        assert version == 1
        _same(got, want)
    m = board.cast_metrics()
    assert 0 < m["pipeline/weights_cast_mb"] < whole_mb
    assert m["pipeline/weights_cast_s"] > 0
    assert [r.receiver.versions for r in (readers[0], readers[2])] == [2, 2]


def test_a_replica_reads_into_its_policys_tensors_in_their_dtype(cast_world):
    board, readers = cast_world
    s0 = _state(3)
    board.publish(5, s0)
    into = {k: torch.empty_like(v) for k, v in s0.items()}
    version, got = readers[1].read(into=into)
    assert version == 5 and got is into
    _same(into, s0)
    assert into["expert.b16"].dtype == torch.bfloat16  # no upcast on the way


def test_the_leaders_stop_ends_the_receivers_and_their_boards_go_with_them(cast_world):
    board, readers = cast_world
    board.publish(0, _state(0))
    names = [r.spec.name for r in (readers[0], readers[2])]
    threads = [r.receiver._thread for r in (readers[0], readers[2])]
    board.close()  # sends the stop
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    for r in readers:
        r.close()
    assert not any((SHM_DIR / n).exists() for n in names)


def test_buckets_cover_every_byte_once_aligned():
    board = WeightBoard.create(_state(0), os.getpid())
    try:
        entries = board.spec.layout
        bs = buckets(entries, limit=256)
        assert len(bs) > 1
        keys = [e[0] for b in bs for e, _ in b]
        assert keys == [e[0] for e in entries if e[0] != "empty"]  # an empty tensor: no bytes
        for b in bs:
            assert all(off % ALIGN == 0 for _, off in b)
            assert weight_cast.bucket_bytes(b) <= 256 or len(b) == 1  # a larger tensor goes alone
    finally:
        board.close()


# --- the wiring: who reads which board ------------------------------------------------------
def test_replicas_on_other_nodes_read_their_nodes_board_filled_by_the_first_of_them():
    from ebrl.schedulers.ebrl.wiring import DRIVER, Roles, weight_routes, wire

    roles = Roles([[0], [1], [2], [3], [4]], replicas=5, ranks=2)
    book = {n: ("127.0.0.1", 1000 + i) for i, n in enumerate([DRIVER, *roles.names()])}
    board = BoardSpec("ebrl_1_wbx", (), 64, cast_at=("10.0.0.1", 29600))
    # the leader and gen on node A; gen1, gen2 on B; gen3, gen4 on C (one machine's address:
    # Ray nodes, not addresses, tell them apart)
    nodes = {"learner": "A", "learner1": "B", "gen": "A", "gen1": "B", "gen2": "B",
             "gen3": "C", "gen4": "C"}  # fmt: skip
    links = wire(roles, book, board, ("127.0.0.1", 29500), nodes)
    cast = links["learner"].cast
    assert cast == CastSpec(("10.0.0.1", 29600), receivers=2)
    assert links["learner1"].cast is None
    assert links["gen"].board is board
    assert links["gen1"].board == NodeBoard(cast, 1, board, receiver=True)
    assert links["gen2"].board == NodeBoard(cast, 1, board, receiver=False)
    assert links["gen3"].board == NodeBoard(cast, 2, board, receiver=True)
    assert links["gen4"].board == NodeBoard(cast, 2, board, receiver=False)
    # the leader tells every replica the version only: they all read a board
    assert [via for _, via in links["learner"].gens] == [True] * 5
    assert weight_routes(roles, links) == (
        "weights: broadcast to 2 node receiver(s); gen: the leader's board; "
        "gen1: collective (node 1's board, receiver); gen2: collective (node 1's board, reads); "
        "gen3: collective (node 2's board, receiver); gen4: collective (node 2's board, reads)"
    )


def test_without_nodes_or_a_board_the_wiring_is_as_before():
    from ebrl.schedulers.ebrl.wiring import DRIVER, Roles, wire

    roles = Roles([[0], [1]], replicas=2)
    book = {n: ("127.0.0.1", 1000 + i) for i, n in enumerate([DRIVER, *roles.names()])}
    book["gen1"] = ("10.0.0.2", 999)  # another machine
    board = BoardSpec("ebrl_1_wbx", (), 64, cast_at=("10.0.0.1", 29600))
    for links in (wire(roles, book, board), wire(roles, book, board, nodes={})):
        assert links["learner"].cast is None
        assert links["gen"].board is board and links["gen1"].board is None  # inline
        assert [via for _, via in links["learner"].gens] == [True, False]
    # no board (scheduler.weight_board=false): inline everywhere, nodes or not
    links = wire(roles, book, None, nodes={"learner": "A", "gen": "A", "gen1": "B"})
    assert links["learner"].cast is None and links["gen1"].board is None


# --- through the scheduler: the run is the same whichever way the weights travel -------------
def test_a_replica_fed_by_the_collective_acts_as_one_fed_by_the_board(monkeypatch):
    """An in-process run whose second replica is told it sits on another node (the wiring's
    nodes, faked: in-process workers have none): it loads every version from its node's board,
    filled by the leader's broadcast, and the run computes what the board-only run computes."""
    from ebrl.schedulers.ebrl import EBRLScheduler, spawn

    from .test_scale_out import LOCKSTEP, cfg8, run, same

    cfg = cfg8()
    board, _ = run(cfg, EBRLScheduler(backend="inprocess", gen_replicas=2, **LOCKSTEP))
    fake = {"learner": "node-a", "gen": "node-a", "gen1": "node-b"}
    monkeypatch.setattr(spawn, "nodes_of", lambda options: fake)
    cast, ctx = run(cfg, EBRLScheduler(backend="inprocess", gen_replicas=2, **LOCKSTEP))
    same(board, cast, rel=1e-6)
    loads = {(s.track, dict(s.args)["source"]) for s in ctx.timeline.spans if s.stage == "load"}
    assert loads == {("gen", "board"), ("gen1", "collective")}
    assert cast[-1].metrics["pipeline/weights_cast_nodes"] == 1.0
    assert cast[-1].metrics["pipeline/weights_cast_nccl"] == 0.0


def test_the_learner_leader_advertises_one_address_to_its_ranks_and_to_the_broadcast(
    tiny_cfg, monkeypatch
):
    """The leader of two ranks asks :func:`cast_address` once: a node with several interfaces
    may answer with another address each time, and the ranks' rendezvous and the weights'
    broadcast (its board's ``cast_at``) must name the same one. Each keeps a port of its own."""
    from ebrl.envs.fake import CountingEnv
    from ebrl.runtime.channel import node_ip
    from ebrl.schedulers.ebrl import learner_worker
    from ebrl.stages.factory import StageFactory

    answers = iter([("10.0.0.1", 29601), ("10.0.0.2", 29602)])  # two interfaces, two answers
    monkeypatch.setattr(learner_worker, "cast_address", lambda: next(answers))
    # nothing binds 10.0.0.x here
    monkeypatch.setattr(learner_worker, "free_port", lambda host: 29700)
    spec = CountingEnv(env_id=0, obs_dim=5, action_dim=3).spec
    factory = StageFactory.from_config(tiny_cfg()).with_spec(spec)
    leader = learner_worker.LearnerWorker(factory, b"k", node_ip(), rank=0, world=2)
    try:
        _, dist, board = leader.open()
    finally:
        leader.inbox.close()
        leader._close()
    assert board is not None and board.cast_at == ("10.0.0.1", 29601)
    assert dist == ("10.0.0.1", 29700)
    assert next(answers) == ("10.0.0.2", 29602)  # asked once: the second answer is unused
