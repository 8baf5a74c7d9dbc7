"""The wiring of a run on EBRL's workers: who sends what to whom, as a pure function."""

from __future__ import annotations

import pytest

from ebrl.schedulers.ebrl.control import per_replica
from ebrl.schedulers.ebrl.messages import Resources
from ebrl.schedulers.ebrl.relay import merge_gauges
from ebrl.schedulers.ebrl.wiring import DRIVER, Roles, gen_name, learner_name, sim_name, wire


def book(roles: Roles, host: str = "127.0.0.1") -> dict:
    names = [DRIVER, *roles.names()]
    return {n: (host, 1000 + i) for i, n in enumerate(names)}


def test_replicas_serve_contiguous_blocks_of_env_workers():
    roles = Roles([[0, 1], [2, 3], [4, 5], [6, 7], [8]], replicas=2)
    assert roles.replica_of == (0, 0, 0, 1, 1)
    assert roles.served_by(0) == [0, 1, 2] and roles.served_by(1) == [3, 4]


def test_names_keep_the_single_worker_names_for_replica_and_rank_zero():
    assert (gen_name(0), gen_name(1), learner_name(0), learner_name(2)) == (
        "gen",
        "gen1",
        "learner",
        "learner2",
    )
    assert Roles([[0], [1]], 2, 3).names() == [
        "sim0",
        "sim1",
        "gen",
        "gen1",
        "learner",
        "learner1",
        "learner2",
    ]


def test_more_replicas_than_env_workers_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"gen_replicas=3 > scheduler\.sim_workers=2"):
        Roles([[0], [1]], replicas=3)


def test_every_env_worker_talks_to_its_replica_and_the_leader():
    roles = Roles([[0, 1], [2, 3], [4, 5], [6, 7]], replicas=2, ranks=2)
    addrs = book(roles)
    links = wire(roles, addrs, board="BOARD", dist=("127.0.0.1", 29500))
    for w in range(4):
        sim = links[sim_name(w)]
        assert sim.gen == addrs[gen_name(roles.replica_of[w])]
        assert sim.learner == addrs["learner"]  # parts go to the leader only
        assert sim.driver == addrs[DRIVER]
    assert links["gen"].envs == {0: addrs["sim0"], 1: addrs["sim1"]}
    assert links["gen1"].envs == {2: addrs["sim2"], 3: addrs["sim3"]}
    # the leader publishes to every replica; the follower to none
    assert [a for a, _ in links["learner"].gens] == [addrs["gen"], addrs["gen1"]]
    assert links["learner1"].gens == ()
    assert {links[n].dist for n in ("learner", "learner1")} == {("127.0.0.1", 29500)}
    assert (links["learner1"].rank, links["learner1"].world) == (1, 2)


def test_weight_board_only_for_replicas_on_the_leaders_machine():
    roles = Roles([[0], [1]], replicas=2)
    addrs = book(roles)
    addrs["gen1"] = ("10.0.0.7", 4242)  # a replica on another node
    links = wire(roles, addrs, board="BOARD")
    assert links["gen"].board == "BOARD" and links["gen1"].board is None
    assert [via for _, via in links["learner"].gens] == [True, False]
    # no board at all: every replica inline; one rank: no rendezvous
    plain = wire(roles, book(roles))
    assert all(not via for _, via in plain["learner"].gens)
    assert plain["learner"].dist is None


def test_replicas_share_the_generators_threads_and_cores():
    msg = Resources(0, threads=4, cores=(0, 1, 2, 3), batch_min=5)
    a, b = per_replica(msg, 2)
    assert (a.threads, a.cores, a.batch_min) == (2, (0, 1), 3)
    assert (b.threads, b.cores) == (2, (2, 3))
    one = Resources(0, threads=1, cores=(7,))
    assert [(r.threads, r.cores) for r in per_replica(one, 2)] == [(1, (7,)), (1, (7,))]
    assert per_replica(msg, 1) == (msg,)


VERSION, BATCH, REBINDS = "pipeline/gen_version", "pipeline/gen_batch_mean", "resource/rebinds"


def test_gauges_of_several_replicas_merge_by_kind():
    merged = merge_gauges(
        {
            "gen": {VERSION: 5.0, BATCH: 4.0, REBINDS: 1.0},
            "gen1": {VERSION: 4.0, BATCH: 2.0, REBINDS: 2.0},
            "sim0": {"resource/sim0/cpu_s": 3.0},
        }
    )  # fmt: skip
    assert merged == {
        "pipeline/gen_version": 4.0,  # the oldest acting version
        "pipeline/gen_batch_mean": 3.0,
        "resource/rebinds": 3.0,
        "resource/sim0/cpu_s": 3.0,
    }
