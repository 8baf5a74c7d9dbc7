"""Node groups (issue 43): a role pinned to the nodes that declare a custom resource or a Ray
label (``placement.groups.<role>``), checked against the cluster before any worker starts, and
shown in the placement table. The slow test runs a two-node Ray cluster on this machine (two
``ray start`` processes, one declaring the group) with the env workers pinned to it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebrl.runtime.placement import PlacementError, check_groups, describe, place
from ebrl.runtime.placement_asks import Ask, role_asks
from ebrl.runtime.placement_nodes import cluster_nodes, fake_cluster, in_group, placement_groups

ROOT = Path(__file__).resolve().parents[1]
#: one 8-GPU node and two CPU nodes, the second of which declares the resource ``rtx``
RAW = [
    {"NodeID": "aa" * 28, "NodeManagerAddress": "10.0.0.1", "Alive": True,
     "Resources": {"CPU": 16.0, "GPU": 8.0, "node:__internal_head__": 1.0,
                   "node:10.0.0.1": 1.0, "memory": 1e9}},
    {"NodeID": "bb" * 28, "NodeManagerAddress": "10.0.0.2", "Alive": True,
     "Resources": {"CPU": 64.0, "node:10.0.0.2": 1.0}, "Labels": {"pool": "cpu"}},
    {"NodeID": "cc" * 28, "NodeManagerAddress": "10.0.0.3", "Alive": True,
     "Resources": {"CPU": 32.0, "rtx": 4.0, "node:10.0.0.3": 1.0},
     "Labels": {"ray.io/node-id": "cc" * 28}},
]  # fmt: skip
SCHED = {"sim_workers": 4, "gen_replicas": 2, "learner_ranks": 2}
SCHED |= {"gen_gpus": 0.5, "learner_gpus": 0.5, "resources": {}}


def test_a_group_is_a_custom_resource_a_label_key_or_a_label_value():
    head, cpu, rtx = cluster_nodes(RAW)
    assert in_group(rtx, "rtx") and not in_group(cpu, "rtx") and not in_group(head, "rtx")
    assert in_group(cpu, "pool") and in_group(cpu, "pool=cpu") and not in_group(cpu, "pool=gpu")
    assert cpu.labels == {"pool": "cpu"} and cpu.tags == "pool=cpu"
    assert rtx.tags == "rtx=4"  # Ray's own resources and labels are not shown as tags


def test_each_role_goes_to_its_group_and_the_table_shows_it():
    nodes = cluster_nodes(RAW)
    asks = role_asks(SCHED, {"sim": "rtx"})
    ps = place(asks, nodes)
    sims = [p for p in ps if p.role == "sim"]
    assert {p.node.address for p in sims} == {"10.0.0.3"}
    assert all(p.local is False and "not in its node group rtx" in p.note for p in sims)
    assert {p.node.address for p in ps if p.role != "sim"} == {"10.0.0.1"}
    table = describe(ps)
    assert any(ln.startswith("sim ") and " rtx " in f"{ln} " for ln in table.splitlines())
    assert "node 10.0.0.3/cccccccc: 4 sim (env workers 0-3); GPUs 0/0" in table
    assert "tags rtx=4" in table
    # a label names a group as well
    ps = place(role_asks(SCHED, {"sim": "pool=cpu"}), nodes)
    assert {p.node.address for p in ps if p.role == "sim"} == {"10.0.0.2"}


def test_a_group_no_node_is_in_is_refused_naming_it_and_the_nodes_seen():
    nodes = cluster_nodes(RAW)
    with pytest.raises(PlacementError) as e:
        place(role_asks(SCHED, {"gen": "a100"}), nodes)
    msg = str(e.value)
    assert msg.startswith("placement.groups.gen=a100: no node of the cluster is in node group")
    assert "nodes seen (3): 10.0.0.1/aaaaaaaa (head): none; 10.0.0.2/bbbbbbbb: pool=cpu; " \
        "10.0.0.3/cccccccc: rtx=4" in msg  # fmt: skip
    assert "ray start --resources '{\"a100\": 1}'" in msg and "unset placement.groups.gen" in msg
    with pytest.raises(PlacementError, match=r"placement.groups.actor: 'actor' is not a role"):
        check_groups({"actor": "rtx"}, nodes)
    # a group whose nodes cannot take the ask: the refusal names the group's nodes only
    with pytest.raises(PlacementError, match=r"learner rank 0 asks 0.5 GPU, a node of group rtx"):
        place([Ask("learner", 0, gpus=0.5, group="rtx")], nodes)


def test_the_config_key_reaches_the_asks():
    from omegaconf import OmegaConf

    from .conftest import make_cfg

    cfg = OmegaConf.to_container(make_cfg(["scheduler=ebrl", "placement.groups.sim=rtx"]))
    assert placement_groups(cfg) == {"sim": "rtx"}
    with pytest.raises(Exception, match=r"placement.groups.actor"):  # not a role
        make_cfg(["scheduler=ebrl", "placement.groups.actor=rtx"])
    assert placement_groups(OmegaConf.to_container(make_cfg(["scheduler=ebrl"]))) == {}
    assert all(a.group == "rtx" for a in role_asks(SCHED, {"sim": "rtx"}) if a.role == "sim")
    assert fake_cluster(2, 8, 96)[1].resources["slurm_task_1"] == 1


# --- a two-node Ray cluster on this machine --------------------------------------------------
#: a local test cluster: no token authentication (every process of it must say the same)
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_start(tmp: Path, *args: str) -> subprocess.Popen:
    """``ray start --block ...`` as a child process of its own group (stopped by its PID)."""
    ray = str(Path(sys.executable).with_name("ray"))
    env = dict(os.environ, **RAY_ENV)
    return subprocess.Popen(
        [ray, "start", "--block", "--disable-usage-stats", *args],
        stdout=open(tmp / f"ray-{len(list(tmp.glob('ray-*')))}.log", "w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def stop(p: subprocess.Popen) -> None:
    """End ``ray start --block`` and what it started (its own process group, by its PID):
    SIGTERM, then SIGKILL for what ignores it (Ray's agents do)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


PROBE = """
import json, sys, time
import ray
from ebrl.runtime.backend import RayBackend
from ebrl.runtime.placement import PlacementError, describe, place
from ebrl.runtime.placement_asks import role_asks
from ebrl.runtime.placement_nodes import cluster_nodes
from ebrl.runtime.placement_ray import ray_options

ray.init(address=sys.argv[1])
backend = RayBackend(address=sys.argv[1])
try:
    deadline = time.time() + 40
    while len(cluster_nodes()) < 2 and time.time() < deadline:  # the group's node joins
        time.sleep(0.5)
    sched = {"sim_workers": 4, "gen_replicas": 1, "learner_ranks": 1, "gen_gpus": 0.5,
             "learner_gpus": 0.5, "resources": {}}
    ps = place(role_asks(sched, {"sim": "rtx"}), cluster_nodes())
    print(describe(ps), file=sys.stderr)

    class Probe:
        def open(self):
            return ray.get_runtime_context().get_node_id()

    handles = [backend.spawn(f"{p.role}{p.index}", Probe, options=ray_options(p)) for p in ps]
    seen = [h.open() for h in handles]
    try:
        place(role_asks(sched, {"sim": "a100"}), cluster_nodes())
        missing = ""
    except PlacementError as e:
        missing = str(e)
    rows = [[p.role, p.node.node_id, s] for p, s in zip(ps, seen)]
    print(json.dumps({"rows": rows, "missing": missing}))
finally:
    backend.shutdown()
    ray.shutdown()
"""


def wait_for(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in {log} after {timeout_s} s:\n{log.read_text()[-2000:]}")


@pytest.mark.slow  # two `ray start` nodes and a driver: ~40 s on a loaded 2-core machine
def test_on_two_ray_nodes_the_env_workers_run_on_their_group_and_a_missing_one_is_refused(
    tmp_path,
):
    port = free_port()
    addr = f"127.0.0.1:{port}"
    head = ray_start(tmp_path, "--head", f"--port={port}", "--num-gpus=1", "--num-cpus=2")
    worker = None
    try:
        wait_for(tmp_path / "ray-0.log", "Ray runtime started", 120)
        worker = ray_start(
            tmp_path, f"--address={addr}", "--resources", json.dumps({"rtx": 4}), "--num-cpus=2"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT), **RAY_ENV)
        run = subprocess.run(
            [sys.executable, "-c", PROBE, addr], env=env, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        print(run.stderr[-3000:])
        out = json.loads(run.stdout.strip().splitlines()[-1])
        rows = out["rows"]
        assert all(planned == seen for _, planned, seen in rows)  # Ray obeyed the table
        sim_nodes = {planned for role, planned, _ in rows if role == "sim"}
        other = {planned for role, planned, _ in rows if role != "sim"}
        assert len(sim_nodes) == 1 and sim_nodes.isdisjoint(other)  # the rtx node: no GPU
        assert "; tags rtx=4" in run.stderr  # the group's node in the table
        msg = out["missing"]
        assert msg.startswith("placement.groups.sim=a100: no node of the cluster is in node")
        assert "nodes seen (2): " in msg and "rtx=4" in msg  # with what each declares
    finally:
        for p in (worker, head):
            if p is not None:
                stop(p)
    deadline = time.time() + 10
    while any(group_alive(p.pid) for p in (worker, head) if p) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(group_alive(p.pid) for p in (worker, head) if p), "Ray processes left"
