"""Placement: stages ask for GPUs, CPUs and custom resources, :func:`place` picks their Ray nodes
(a pure function, tested on fake nodes), and Ray obeys on a 2-node cluster on this machine."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter

import psutil
import pytest

from ebrl.runtime.backend import InProcessBackend, RayBackend
from ebrl.runtime.placement import PlacementError, describe, place
from ebrl.runtime.placement_asks import Ask
from ebrl.runtime.placement_nodes import Node, cluster_nodes
from ebrl.runtime.placement_ray import NOSET_CUDA, ray_options


def node(name: str, cpus: float = 4, gpus: float = 0, **res: float) -> Node:
    """A fake node: its id is ``name`` in hex, padded to a Ray node id's 56 digits."""
    node_id = name.encode().hex().ljust(56, "0")
    return Node(node_id, address="10.0.0.1", cpus=cpus, gpus=gpus, resources=res)


def nodes_of(placements) -> list[str]:
    return [bytes.fromhex(p.node.node_id[:2]).decode() for p in placements]


# --- place ------------------------------------------------------------------------------------
def test_sims_without_feeds_are_spread_round_robin():
    ps = place([Ask("sim", w) for w in range(5)], [node("a"), node("b")])
    assert nodes_of(ps) == ["a", "b", "a", "b", "a"]
    assert [p.ask.index for p in ps] == list(range(5))  # in the order asked


def test_spread_is_weighted_by_capacity():
    ps = place([Ask("sim", w) for w in range(6)], [node("a", cpus=4), node("b", cpus=2)])
    assert Counter(nodes_of(ps)) == {"a": 4, "b": 2}
    gens = place(
        [Ask("gen", r, gpus=0.25) for r in range(6)], [node("a", gpus=1), node("b", gpus=2)]
    )
    assert Counter(nodes_of(gens)) == {"a": 2, "b": 4}


def test_gen_replicas_spread_and_sims_stay_on_the_node_they_feed():
    asks = [Ask("gen", r, gpus=1) for r in range(2)]
    asks += [Ask("sim", w, feeds=w % 2) for w in range(6)]
    ps = place(asks, [node("a", gpus=1), node("b", gpus=1)])
    gen_node = {p.index: p.node for p in ps if p.role == "gen"}
    assert gen_node[0] != gen_node[1]
    for p in ps:
        if p.role == "sim":
            assert p.node == gen_node[p.ask.feeds] and p.local and not p.note


def test_gpu_asks_go_to_gpu_nodes_and_learner_ranks_fill_a_node_first():
    nodes = [node("c", cpus=64), node("g", gpus=2), node("h", gpus=2)]
    asks = [Ask("learner", rank, gpus=1) for rank in range(2)] + [Ask("gen", 0, gpus=0.5)]
    ps = place(asks, nodes)
    assert nodes_of(ps) == ["g", "g", "h"]
    assert [p.gpu_slots for p in ps] == [(0,), (1,), (0,)]


def test_fractional_shares_are_packed_never_past_the_gpu_count():
    nodes = [node("g", gpus=2)]
    ps = place([Ask("gen", r, gpus=0.5) for r in range(4)], nodes)
    assert sorted(p.gpu_slots for p in ps) == [(0,), (0,), (1,), (1,)]
    # 0.6 + 0.4 share a GPU: two of each fit two GPUs exactly
    mixed = [Ask("learner", 0, gpus=0.6), Ask("learner", 1, gpus=0.6)]
    mixed += [Ask("gen", 0, gpus=0.4), Ask("gen", 1, gpus=0.4)]
    assert {p.gpu_slots for p in place(mixed, nodes)} == {(0,), (1,)}
    with pytest.raises(PlacementError, match=r"gen replica 4 asks 0.5 GPU; no node has that left"):
        place([Ask("gen", r, gpus=0.5) for r in range(5)], nodes)
    # a whole GPU is not made of what two shares left of two GPUs
    shares = [Ask("learner", 0, gpus=0.6), Ask("learner", 1, gpus=0.6), Ask("gen", 0, gpus=1)]
    with pytest.raises(PlacementError, match=r"gen replica 0 asks 1 GPU; .*0.8 of 2 GPUs free"):
        place(shares, nodes)


def test_each_learner_rank_owns_its_gpu_and_each_gpu_gets_one_replica():
    """Half-GPU shares, as a scale point asks (issue 43): learner ranks are not packed two to
    a GPU (their process group would fall back to gloo), replicas take one GPU each, and the
    ranks of two 8-GPU nodes fill one node, one rank per GPU, before the next."""
    nodes = [node("a", gpus=8), node("b", gpus=8)]
    asks = [Ask("learner", i, gpus=0.5) for i in range(16)]
    asks += [Ask("gen", r, gpus=0.5) for r in range(16)]
    ps = place(asks, nodes)
    held = Counter((p.node.node_id, p.gpu_slots, p.role) for p in ps)
    assert set(held.values()) == {1}  # no GPU holds two of one role
    assert len({(p.node.node_id, p.gpu_slots) for p in ps}) == 16  # every GPU used
    learners = [p for p in ps if p.role == "learner"]
    assert nodes_of(learners) == ["a"] * 8 + ["b"] * 8


def test_refusal_names_role_ask_and_capacity():
    cpu_only = [node("a"), node("b")]
    asks = [Ask("learner", 0), Ask("learner", 1, gpus=1)]
    with pytest.raises(PlacementError) as e:
        place(asks, cpu_only)
    msg = str(e.value)
    assert msg.startswith("learner rank 1 asks 1 GPU; nodes have 0 GPUs")
    assert "run on a GPU node or set learner.gpus=0" in msg
    with pytest.raises(PlacementError, match=r"set scheduler\.gpus\.learner=0"):
        place(asks, cpu_only, gpu_setting={"learner": "scheduler.gpus.learner"})
    with pytest.raises(PlacementError, match=r"asks 4 GPUs; the largest node has 2 GPUs"):
        place([Ask("learner", 0, gpus=4)], [node("g", gpus=2), node("h", gpus=2)])
    with pytest.raises(PlacementError, match=r"learner rank 1 asks 1 GPU; .*0 of 1 GPUs free"):
        place([Ask("learner", 0, gpus=1), Ask("learner", 1, gpus=1)], [node("g", gpus=1)])


def test_custom_resources_are_respected():
    nodes = [node("a"), node("b", sim_node=1)]
    ps = place([Ask("sim", w, resources={"sim_node": 0.1}) for w in range(3)], nodes)
    assert nodes_of(ps) == ["b", "b", "b"]
    with pytest.raises(
        PlacementError, match=r"sim worker 1 asks 0.6 sim_node; .*0.4 sim_node free"
    ):
        place([Ask("sim", w, resources={"sim_node": 0.6}) for w in range(2)], nodes)
    # the custom resources a sim asks for beat feeding its replica node-locally
    asks = [Ask("gen", 0, resources={"gen_node": 1})]
    asks += [Ask("sim", w, feeds=0, resources={"sim_node": 0.1}) for w in range(2)]
    gen, s0, s1 = place(asks, [node("a", gen_node=1), node("b", sim_node=1)])
    assert nodes_of([gen, s0, s1]) == ["a", "b", "b"]
    assert s0.local is False and "sim worker 0 feeds gen replica 0 on node 10.0.0.1/" in s0.note
    assert "gen 0 (off-node)" in describe([gen, s0, s1])
    assert "note: sim worker 1 feeds gen replica 0" in describe([gen, s0, s1])
    with pytest.raises(PlacementError, match=r"sim worker 0 asks 0.1 sim_node; no node"):
        place(asks, [node("a", gen_node=1)])


def test_cpus_are_counted_only_when_asked():
    nodes = [node("a", cpus=1), node("b", cpus=1)]
    asks = [Ask("sim", w, cpus=2) for w in range(4)]
    ps = place(asks, nodes)  # default: the resource manager pins cores, Ray counts none
    assert all(p.num_cpus == 0 for p in ps)
    with pytest.raises(PlacementError, match=r"sim worker 0 asks 2 CPUs"):
        place(asks, nodes, count_cpus=True)
    ok = place([Ask("sim", w, cpus=1) for w in range(2)], nodes, count_cpus=True)
    assert nodes_of(ok) == ["a", "b"] and all(p.num_cpus == 1 for p in ok)


def test_bad_asks_are_refused():
    with pytest.raises(ValueError, match=r"learner rank 0 asks 1.5 GPUs: .*whole number"):
        Ask("learner", 0, gpus=1.5)
    with pytest.raises(ValueError, match=r"resource 'GPU' is not a custom resource: ask gpus=1"):
        Ask("gen", 0, resources={"GPU": 1})
    with pytest.raises(ValueError, match=r"only a sim worker feeds"):
        Ask("gen", 0, feeds=1)
    with pytest.raises(ValueError, match=r"role 'actor'"):
        Ask("actor", 0)
    with pytest.raises(
        PlacementError, match=r"sim worker 0 feeds gen replica 3, but the replicas are \[0\]"
    ):
        place([Ask("gen", 0), Ask("sim", 0, feeds=3)], [node("a")])
    with pytest.raises(PlacementError, match=r"asked for twice"):
        place([Ask("sim", 0), Ask("sim", 0)], [node("a")])
    with pytest.raises(PlacementError, match=r"no alive Ray node"):
        place([Ask("sim", 0)], [])
    assert len({Ask("sim", 0, resources={"x": 1}), Ask("sim", 0, resources={"x": 1})}) == 1


def test_cluster_nodes_reads_ray_nodes():
    raw = [
        {"NodeID": "bb" * 28, "NodeManagerAddress": "10.0.0.2", "Alive": True,
         "Resources": {"CPU": 8.0, "GPU": 2.0, "sim_node": 1.0, "node:10.0.0.2": 1.0}},
        {"NodeID": "dd" * 28, "NodeManagerAddress": "10.0.0.9", "Alive": False,
         "Resources": {"CPU": 8.0}},
        {"NodeID": "aa" * 28, "NodeManagerAddress": "10.0.0.3", "Alive": True,
         "Resources": {"CPU": 4.0, "node:__internal_head__": 1.0}},
    ]  # fmt: skip
    head, other = cluster_nodes(raw)
    assert head.head and head.node_id == "aa" * 28 and head.gpus == 0 and head.cpus == 4
    assert other.gpus == 2 and other.cpus == 8 and other.resources["sim_node"] == 1
    assert "CPU" not in other.resources and "GPU" not in other.resources


# --- Ray options ------------------------------------------------------------------------------
def test_ray_options_hard_affinity_gpu_share_and_mps_quota():
    pytest.importorskip("ray")
    half, whole, cpu = place(
        [Ask("gen", 0, gpus=0.5, resources={"x": 0.1}), Ask("learner", 0, gpus=1), Ask("sim", 0)],
        [node("g", gpus=2, x=1)],
    )
    o = ray_options(half)
    s = o["scheduling_strategy"]
    assert s.node_id == node("g").node_id and s.soft is False
    assert o["num_gpus"] == 0.5 and o["num_cpus"] == 0 and o["resources"] == {"x": 0.1}
    # its planned GPU (Ray would pack shares in creation order) and its SM quota
    pinned = {"EBRL_GPU_SLOTS": str(half.gpu_slots[0]), NOSET_CUDA: "1"}
    assert o["runtime_env"] == {"env_vars": {**pinned, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}}
    assert ray_options(whole)["runtime_env"]["env_vars"] == {
        "EBRL_GPU_SLOTS": str(whole.gpu_slots[0]),
        NOSET_CUDA: "1",
    }  # a whole GPU: no quota
    assert ray_options(whole)["num_gpus"] == 1
    assert "runtime_env" not in ray_options(cpu) and ray_options(cpu)["num_gpus"] == 0
    assert "resources" not in ray_options(cpu)
    assert ray_options(half, mps=False)["runtime_env"]["env_vars"] == pinned
    env = ray_options(half, mps_pipe="/tmp/ebrl-mps-x/pipe")["runtime_env"]["env_vars"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/ebrl-mps-x/pipe"
    assert Ask("gen", 0, gpus=0.333).mps_percent == 33


def test_describe_lists_every_worker_and_node():
    ps = place(
        [Ask("learner", 0, gpus=0.5), Ask("gen", 0, gpus=0.25), Ask("sim", 0, cpus=2, feeds=0)],
        [node("g", gpus=1)],
    )
    text = describe(ps)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["role", "index", "node"]
    assert any(ln.split()[:2] == ["learner", "0"] and "50" in ln for ln in lines)
    assert any(ln.startswith("sim") and "gen 0" in ln and "(pinned)" in ln for ln in lines)
    assert "gpu 10.0.0.1/67000000#0: learner 0 (50%), gen 0 (25%)" in text
    assert "node 10.0.0.1/67000000: 1 learner, 1 gen, 1 sim (env workers 0); GPUs 0.75/1" in text


# --- the backends take the options ------------------------------------------------------------
class _FakeRay:
    def __init__(self) -> None:
        self.opts: dict = {}

    def remote(self, cls):
        fake = self

        class Remote:
            def options(self, **kw):
                fake.opts = kw
                return self

            def remote(self, *args):
                return object()

        return Remote()


def test_spawn_merges_options_over_the_defaults():
    b = RayBackend.__new__(RayBackend)  # no Ray: only the options handed to it
    b._ray, b.handles = _FakeRay(), []
    b.spawn("sim0", object, resources={"sim_node": 0.1})
    assert b._ray.opts == {
        "num_cpus": 0,
        "name": None,
        "max_restarts": 0,
        "resources": {"sim_node": 0.1},
    }  # fmt: skip  (unchanged for today's callers)
    b.spawn(
        "gen",
        object,
        resources={"sim_node": 0.1, "a": 1},
        options={"num_gpus": 0.5, "resources": {"a": 2}},
    )
    assert b._ray.opts["num_gpus"] == 0.5 and b._ray.opts["max_restarts"] == 0
    assert b._ray.opts["resources"] == {"sim_node": 0.1, "a": 2}
    b.spawn("learner", object, options={"num_cpus": 2})
    assert b._ray.opts["num_cpus"] == 2 and "resources" not in b._ray.opts

    class Stage:
        def __init__(self, x):
            self.x = x

    h = InProcessBackend().spawn("gen", Stage, 7, resources={"a": 1}, options={"num_gpus": 1})
    assert h.obj.x == 7


# --- a 2-node Ray cluster on this machine -----------------------------------------------------
TAG = "EBRL_PLACEMENT_TEST_TAG"


def own_ray_pids(tag: str) -> set[int]:
    """``pgrep -f raylet|gcs_server|ray::`` of this user, started under this test's tag."""
    out = set()
    uid = os.getuid()
    for p in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            if p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if not any(t in cmd for t in ("raylet", "gcs_server", "ray::", "default_worker.py")):
                continue
            if p.environ().get(TAG) == tag:
                out.add(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


@pytest.mark.slow  # a 2-node Ray cluster: ~20 s; make test-slow (CI runs it)
def test_two_node_cluster_puts_every_actor_on_its_placement(monkeypatch):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG, tag)  # inherited by the Ray processes this test starts, only them
    assert not own_ray_pids(tag)
    assert not ray.is_initialized()
    job_env = {"EBRL_COMMIT": f"placement-{tag[:8]}"}  # set in the job's runtime_env only

    class Probe:
        """Reports where it runs and what it was given."""

        def __init__(self, name):
            self.name = name

        def open(self):
            keys = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "EBRL_COMMIT")
            return {
                "node": ray.get_runtime_context().get_node_id(),
                "env": {k: os.environ.get(k) for k in keys},
                "gpus": ray.get_gpu_ids(),
            }

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 1, "include_dashboard": False},
    )
    backend = None
    try:
        cluster.add_node(num_cpus=1, num_gpus=0)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, runtime_env={"env_vars": job_env})
        # RayBackend joins the cluster this driver is connected to
        backend = RayBackend(address=cluster.address)
        nodes = cluster_nodes()
        assert len(nodes) == 2 and [n.gpus for n in nodes] == [1, 0]

        asks = [Ask("learner", 0, gpus=0.5), Ask("gen", 0, gpus=0.25), Ask("gen", 1)]
        asks += [Ask("sim", w, cpus=1, feeds=w % 2) for w in range(4)]  # cpus: pinned, not Ray's
        ps = place(asks, nodes)
        print("\n" + describe(ps))
        assert {p.node.node_id for p in ps if p.role == "sim"} == {n.node_id for n in nodes}

        handles = [
            backend.spawn(f"{p.role}{p.index}", Probe, p.ask.name, options=ray_options(p))
            for p in ps
        ]
        t0 = time.time()
        seen = [h.open() for h in handles]
        print(f"{len(handles)} actors up in {time.time() - t0:.1f} s")
        for p, s in zip(ps, seen):
            assert s["node"] == p.node.node_id, p.ask.name
            assert s["env"]["EBRL_COMMIT"] == job_env["EBRL_COMMIT"]  # the job's env kept
            want = str(p.ask.mps_percent) if p.ask.mps_percent is not None else None
            assert s["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == want, p.ask.name
            assert bool(s["gpus"]) == (p.ask.gpus > 0), p.ask.name
        learner = seen[0]
        assert learner["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    finally:
        if backend is not None:
            backend.shutdown()  # kills the actors; the cluster is not the backend's to stop
        ray.shutdown()
        cluster.shutdown()
    deadline = time.time() + 20
    while own_ray_pids(tag) and time.time() < deadline:
        time.sleep(0.5)
    assert not own_ray_pids(tag), "Ray processes left behind"
