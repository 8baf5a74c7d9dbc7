"""The weights across two Ray nodes by the collective: a shipped scale config on a two-node Ray
cluster on this machine.

Two ``ray start --block`` processes (a head and a worker, one GPU declared on each with
``--num-gpus``) make the cluster; ``python -m ebrl.train +axis/scale=g2`` joins it, its roles
computing on the CPU (``scheduler.device=cpu``: this machine has no GPU), with 2 env workers
instead of the point's 16 (2 cores). The placement puts a replica on the node without the
learner leader; that replica's node board is filled by the leader's broadcast (gloo here: no rank
sees a GPU), so the driver logs that route, the leader's metrics say the broadcast reached one
node receiver over gloo, publish and load seconds are logged, and the replica's loads came from
the collective path. The nodes are torn down by PID (``ray start`` and what it left).

NCCL cannot run on this machine; that it is chosen where each member owns a GPU is checked on
fake device layouts in ``tests/test_dist_backend.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from ebrl.runtime.dist_group import free_port
from ebrl.runtime.slurm_cluster import wait_for_nodes

from .conftest import TINY

ROOT = Path(__file__).resolve().parents[1]
RAY = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats"]


class Node:
    """One ``ray start --block`` process and every process it started (recorded by PID while
    it runs, so that what it leaves behind is ended by PID too)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [*RAY, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.known: set[int] = set()

    def record(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            self.known |= {c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)}

    def stop(self) -> None:
        self.record()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.known:
            try:
                p = psutil.Process(pid)
                p.kill()
                p.wait(5)
            except (psutil.NoSuchProcess, psutil.TimeoutExpired):
                pass


@pytest.mark.slow  # two Ray nodes and a run on them: ~40-60 s on 2 loaded cores
def test_weights_reach_the_other_nodes_replica_by_the_collective(tmp_path):
    port = free_port()
    # Ray's socket paths must stay under 107 bytes: a short folder of our own for its sessions
    temp = Path(tempfile.mkdtemp(prefix="ebrl-ray-", dir="/tmp"))
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "RAY_ADDRESS": f"127.0.0.1:{port}",
        "PYTHONPATH": str(ROOT),
    }
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=1",
              "--dashboard-agent-listen-port=0", f"--temp-dir={temp}"]  # fmt: skip
    nodes = [
        Node(
            [
                "--head",
                f"--port={port}",
                f"--ray-client-server-port={free_port()}",
                "--include-dashboard=false",
                *common,
            ],
            env,
            tmp_path / "head.log",
        ),
    ]
    try:
        nodes.append(Node([f"--address=127.0.0.1:{port}", *common], env, tmp_path / "w.log"))
        up = wait_for_nodes(
            f"127.0.0.1:{port}", 2, 120.0, alive=lambda: nodes[0].proc.poll() is None, env=env
        )
        assert [n["resources"].get("GPU") for n in up] == [1.0, 1.0]
        for n in nodes:
            n.record()
        run = tmp_path / "run"
        proc = subprocess.run(
            [
                sys.executable, "-m", "ebrl.train", "+axis/scale=g2", "scheduler=ebrl",
                *[o for o in TINY if not o.startswith("num_envs")], "num_envs=4",
                "scheduler.backend=ray", "scheduler.ray_address=auto", "scheduler.device=cpu",
                "scheduler.sim_workers=2", "tracking.enabled=false", f"hydra.run.dir={run}",
            ],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        for n in nodes:
            n.record()
        log = (run / "train.log").read_text() if (run / "train.log").exists() else ""
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:] + log[-3000:]
    finally:
        for n in reversed(nodes):
            n.stop()
        shutil.rmtree(temp, ignore_errors=True)
    assert all(n.proc.poll() is not None for n in nodes)
    assert not [p for n in nodes for p in n.known if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
    # the placement: which node each role is on (``role index node ...`` rows)
    placed = {}
    for line in (run / "placement.txt").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3 and cols[0] in ("gen", "learner"):
            placed[f"{cols[0]}{cols[1]}"] = cols[2]
    home = placed["learner0"]
    away = [r for r in (0, 1) if placed[f"gen{r}"] != home]
    assert away, f"no replica on the other node: {placed}"
    (routes,) = [ln for ln in log.splitlines() if "weights: " in ln and "gen1: " in ln]
    assert "broadcast to 1 node receiver(s)" in routes
    for r in (0, 1):
        name = "gen" if r == 0 else f"gen{r}"
        how = "collective (node 1's board" if r in away else "the leader's board"
        assert f"{name}: {how}" in routes, routes
    # every load of a replica on the other node came from its node's board (the collective)
    events = json.loads((run / "timeline.json").read_text())["traceEvents"]
    loads = [e["args"]["source"] for e in events if e.get("name") == "load"]
    assert loads and set(loads) <= {"collective", "board"}
    assert loads.count("collective") >= len(away)
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    # the leader broadcast every update to one node receiver, over gloo (no rank sees a GPU)
    assert last["pipeline/weights_cast_nodes"] == 1.0
    assert last["pipeline/weights_cast_nccl"] == 0.0
    assert last["train/dist_nccl"] == 0.0  # the 2 learner ranks reduce over gloo too
    assert last["pipeline/weights_cast_s"] > 0 and last["pipeline/weights_cast_mb"] > 0
    assert last["pipeline/weights_publish_s"] > 0 and last["pipeline/weights_load_s_mean"] > 0
    print((run / "placement.txt").read_text())
    print(routes)
    for m in metrics:
        print({k: v for k, v in m.items() if k.startswith("pipeline/weights")})
