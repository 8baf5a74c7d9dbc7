"""The placement of every shipped scale point and full-size experiment (issue 43), built from
the shipped configs through the function the run uses (``placement_asks.role_asks``, called by
``GpuFabric.place``) and placed on a fake cluster of the shape the job's launcher
reserves (``placement_nodes.fake_cluster``: the nodes a Ray cluster of that shape reports), held to
what the configs say: "per GPU a learner rank and a generator replica, each with half its SMs
(MPS quotas), and 8 env workers" (``conf/axis/scale/g*.yaml``, ``conf/experiment/cluster.yaml``).
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict, read_write

from ebrl.config import register
from ebrl.launch.check import compose_config
from ebrl.resources import sharing
from ebrl.runtime.backend import RayBackend
from ebrl.runtime.placement import describe, gpus_used, place
from ebrl.runtime.placement_asks import role_asks
from ebrl.runtime.placement_nodes import fake_cluster, placement_groups

ROOT = Path(__file__).resolve().parents[1]
SCALES = sorted(p.stem for p in (ROOT / "conf" / "axis" / "scale").glob("g*.yaml"))
#: what the scale points' and the cluster experiment's comments promise, per GPU and per node
PER_GPU = Counter({"learner": 1, "gen": 1})
QUOTA = {"gen": 50, "learner": 50}
SIMS_PER_GPU = 8


def job(*overrides: str) -> dict:
    """A run's config as the run resolves it (composed as a sweep composes its jobs)."""
    register()
    cfg = copy.deepcopy(compose_config(["+experiment=cluster", *overrides]))
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def placed(j: dict):
    lau = j["launcher"]
    nodes = fake_cluster(lau["nodes"], lau["gpus_per_node"], lau["cpus_per_task"])
    return nodes, place(role_asks(j["scheduler"], placement_groups(j)), nodes)


def check_promise(j: dict) -> str:
    """Assert the config's promise on its placement; returns the table."""
    nodes, ps = placed(j)
    lau, sched = j["launcher"], j["scheduler"]
    assert len(nodes) == lau["nodes"] and all(n.gpus == lau["gpus_per_node"] for n in nodes)
    quotas = sharing.quotas(sched["gen_gpus"], sched["learner_gpus"])
    assert quotas == QUOTA
    on_gpu: dict[tuple[str, int], Counter] = {
        (n.node_id, s): Counter() for n in nodes for s in range(int(n.gpus))
    }
    for p in ps:
        for s in p.gpu_slots:
            on_gpu[p.node.node_id, s][p.role] += 1
    assert all(c == PER_GPU for c in on_gpu.values()), on_gpu
    assert gpus_used(ps) == lau["nodes"] * lau["gpus_per_node"]
    sims = Counter(p.node.node_id for p in ps if p.role == "sim")
    assert sims == {n.node_id: SIMS_PER_GPU * int(n.gpus) for n in nodes}
    assert all(p.local and not p.note for p in ps if p.role == "sim")  # on their replica's node
    return describe(ps, sm_pct={p.ask: quotas[p.role] for p in ps if p.ask.gpus})


@pytest.mark.parametrize("scale", SCALES)
def test_every_scale_point_keeps_its_promise(scale):
    scheduler = "ebrl"  # hybrid and async take the same roles (below, and conf/scheduler/)
    j = job(f"+axis/scale={scale}", f"scheduler={scheduler}")
    table = check_promise(j)
    print(f"\n--- {scale} ({scheduler}):\n{table}")
    if j["launcher"]["nodes"] > 1:  # g16: the ranks fill node 0's GPUs, then node 1's
        nodes, ps = placed(j)
        ranks = {p.index: p.node for p in ps if p.role == "learner"}
        per_node = j["launcher"]["gpus_per_node"]
        assert all(ranks[i] == nodes[i // per_node] for i in ranks)


@pytest.mark.parametrize(
    ("gpu", "scheduler"),
    [("h100", "ebrl"), ("h100", "hybrid"), ("h100", "async"), ("a100", "ebrl")],
)  # the headline's GPU types and schedulers on EBRL's workers
def test_the_full_size_experiment_keeps_its_promise(gpu, scheduler):
    j = job(f"gpu={gpu}", f"scheduler={scheduler}")
    assert j["gpu"]["name"] == gpu
    check_promise(j)


def test_the_run_places_by_the_same_asks(monkeypatch):
    """``GpuFabric.place`` (what a run calls) places g8's roles as the dry run and the
    tests above do: its table is theirs."""
    from hydra.utils import instantiate

    import ebrl.schedulers.ebrl.gpu as mod
    from ebrl.schedulers.ebrl.wiring import Roles

    j = job("+axis/scale=g8", "scheduler=ebrl")
    nodes, ps = placed(j)
    sched = instantiate(OmegaConf.create(j["scheduler"]))
    monkeypatch.setattr(mod, "cluster_nodes", lambda: nodes)
    monkeypatch.setattr(sched.gpu, "start_mps", lambda nodes: {})
    backend = RayBackend.__new__(RayBackend)  # no Ray: only the placement is asked of it
    s = j["scheduler"]
    envs = [[w] for w in range(s["sim_workers"])]
    roles = Roles(envs, replicas=s["gen_replicas"], ranks=s["learner_ranks"])
    options = sched.gpu.place(roles, backend, None, placement_groups(j))
    assert [(p.ask, p.node, p.gpu_slots) for p in sched.gpu.placed] == [
        (p.ask, p.node, p.gpu_slots) for p in ps
    ]
    assert len(options) == len(ps)
    assert options["learner"]["runtime_env"]["env_vars"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == (
        "50"
    )


# --- the planned GPU, in the role's process -------------------------------------------------------
def test_each_gpu_role_is_told_its_planned_gpus_and_ray_to_leave_them():
    """Ray hands fractional shares out in the order actors are created, not as planned: every
    GPU role's options name its planned slots and switch Ray's own assignment off."""
    from ebrl.runtime.placement_ray import NOSET_CUDA, SLOTS_VAR, ray_options

    _, ps = placed(job("+axis/scale=g8", "scheduler=ebrl"))
    for p in ps:
        env = ray_options(p).get("runtime_env", {}).get("env_vars", {})
        if p.ask.gpus:
            assert env[SLOTS_VAR] == ",".join(map(str, p.gpu_slots)) and env[NOSET_CUDA] == "1"
        else:
            assert SLOTS_VAR not in env and NOSET_CUDA not in env


@pytest.mark.parametrize(
    ("node", "slots", "want"),
    [("3,5", "1", "5"), (None, "1", "1"), ("0,1,2,3", "2,3", "2,3"), ("GPU-a,GPU-b", "0", "GPU-a")],
)
def test_a_slot_is_the_nodes_own_device_of_that_index(node, slots, want):
    from ebrl.runtime.placement_ray import SLOTS_VAR, pin_planned_gpus

    env = {SLOTS_VAR: slots} | ({"CUDA_VISIBLE_DEVICES": node} if node else {})
    assert pin_planned_gpus(env) == want == env["CUDA_VISIBLE_DEVICES"]
    assert pin_planned_gpus({}) is None  # no plan: Ray's or the user's devices stay


def test_a_slot_past_the_nodes_devices_is_refused_naming_them():
    from ebrl.runtime.placement_ray import SLOTS_VAR, pin_planned_gpus

    with pytest.raises(RuntimeError, match=r"slot 2.*CUDA_VISIBLE_DEVICES=3,5"):
        pin_planned_gpus({SLOTS_VAR: "2", "CUDA_VISIBLE_DEVICES": "3,5"})


class _Probe:
    """A GPU role's first act, as EBRL's workers do it: take the planned GPUs."""

    def __init__(self) -> None:
        from ebrl.runtime.placement_ray import pin_planned_gpus

        pin_planned_gpus()

    def devices(self) -> str:
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES", "")


@pytest.mark.slow
def test_on_ray_each_gpu_holds_one_replica_and_one_rank_as_planned():
    """g2 on a one-node Ray with 2 GPUs declared, the actors created as the run creates them
    (every replica before any rank): without the pin Ray put both replicas on GPU 0 and both
    ranks on GPU 1."""
    import ray

    from ebrl.runtime.placement_nodes import cluster_nodes
    from ebrl.runtime.placement_ray import ray_options

    j = job("+axis/scale=g2", "scheduler=ebrl")
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False)
    try:
        ps = place(role_asks(j["scheduler"], {}), cluster_nodes())
        gpu_roles = sorted((p for p in ps if p.ask.gpus), key=lambda p: p.role != "gen")
        actors = [(p, ray.remote(_Probe).options(**ray_options(p)).remote()) for p in gpu_roles]
        seen: dict[str, Counter] = {}
        for p, a in actors:
            dev = ray.get(a.devices.remote(), timeout=120)
            assert dev == ",".join(map(str, p.gpu_slots)), (p.ask.name, dev)
            seen.setdefault(dev, Counter())[p.role] += 1
        assert seen == {"0": PER_GPU, "1": PER_GPU}
    finally:
        ray.shutdown()
