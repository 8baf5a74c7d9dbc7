"""The placement of every shipped scale point and full-size experiment (issue 43), built from
the shipped configs through the function the run uses (``placement.role_asks``, called by
``EBRLScheduler.placement``) and placed on a fake cluster of the shape the job's launcher
reserves (``placement.fake_cluster``: the nodes a Ray cluster of that shape reports), held to
what the configs say: "per GPU a learner rank and a generator replica, each with half its SMs
(MPS quotas), and 8 env workers" (``conf/axis/scale/g*.yaml``, ``conf/experiment/cluster.yaml``).
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict, read_write

from ebrl import launch
from ebrl.resources import sharing
from ebrl.runtime.backend import RayBackend
from ebrl.runtime.placement import (
    describe,
    fake_cluster,
    gpus_used,
    place,
    placement_groups,
    role_asks,
)

ROOT = Path(__file__).resolve().parents[1]
SCALES = sorted(p.stem for p in (ROOT / "conf" / "axis" / "scale").glob("g*.yaml"))
#: what the scale points' and the cluster experiment's comments promise, per GPU and per node
PER_GPU = Counter({"learner": 1, "gen": 1})
QUOTA = {"gen": 50, "learner": 50}
SIMS_PER_GPU = 8


def job(*overrides: str) -> dict:
    """A run's config as the run resolves it (composed as a sweep composes its jobs)."""
    launch.register()
    cfg = copy.deepcopy(launch._compose(["+experiment=cluster", *overrides]))
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
    """``EBRLScheduler.placement`` (what a run calls) places g8's roles as the dry run and the
    tests above do: its table is theirs."""
    from hydra.utils import instantiate

    import ebrl.schedulers.ebrl.scheduler as mod
    from ebrl.schedulers.ebrl.wiring import Roles

    j = job("+axis/scale=g8", "scheduler=ebrl")
    nodes, ps = placed(j)
    sched = instantiate(OmegaConf.create(j["scheduler"]))
    monkeypatch.setattr(mod, "cluster_nodes", lambda: nodes)
    monkeypatch.setattr(sched, "start_mps", lambda nodes: {})
    backend = RayBackend.__new__(RayBackend)  # no Ray: only the placement is asked of it
    s = j["scheduler"]
    envs = [[w] for w in range(s["sim_workers"])]
    roles = Roles(envs, replicas=s["gen_replicas"], ranks=s["learner_ranks"])
    options = sched.placement(roles, backend, None, placement_groups(j))
    assert [(p.ask, p.node, p.gpu_slots) for p in sched.placed] == [
        (p.ask, p.node, p.gpu_slots) for p in ps
    ]
    assert len(options) == len(ps)
    assert options["learner"]["runtime_env"]["env_vars"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == (
        "50"
    )
