"""The MPS daemon of a run whose roles share a GPU (ebrl.resources.mps), on the fake control
binary of tests/test_gpu_fake.py (real processes).

A share below one GPU is an SM quota only under an MPS daemon; without one the roles' processes
time-slice the GPU. The first GPU check (2026-12-04) ran the g1 scale point's schedulers without
one: the shipped default ``ray_address: local`` skipped the daemon. The whole path, through
``python -m ebrl.train``, is tests/test_gpu_fake.py; these pin its parts.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
from hydra.utils import instantiate

from ebrl.resources.mps import Keeper, NodeState, keep
from ebrl.resources.sharing import Sharing

from .conftest import make_cfg
from .test_gpu_fake import alive, fake_gpu_layer, gone_within, mps_log

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    """This process's PATH and environment with the fake control binary first."""
    env = fake_gpu_layer(tmp_path)
    for k in [k for k in os.environ if k.startswith("CUDA_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("FAKE_MPS_LOG", env["FAKE_MPS_LOG"])
    return env


def test_the_keeper_starts_a_daemon_reports_its_pipe_and_quits_it_on_stop(tmp_path, fake_env):
    k = Keeper()
    try:
        assert k.state.state == "started" and k.state.serves
        ((_, pid, pipe),) = mps_log(tmp_path)
        assert k.state.pipe == pipe and k.state.pids == (int(pid),)
        assert alive(int(pid))
    finally:
        keeper = k.pid
        k.stop()
    assert ["quit", pipe] in mps_log(tmp_path)
    assert not alive(keeper)
    assert gone_within([int(pid)], 10) == []
    assert not Path(pipe).exists()  # its private directory went with it


def test_the_keeper_quits_the_daemon_when_its_parent_dies(tmp_path, fake_env):
    """SIGKILL of the process that holds the keeper's pipe (a Ray actor killed with its
    driver): the pipe closes and the keeper quits its daemon."""
    script = (
        "import time\n"
        "from ebrl.resources.mps import Keeper\n"
        "k = Keeper()\n"
        "print(k.state.pids[0], flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        pid = int(parent.stdout.readline())
        assert alive(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert gone_within([pid], 20) == [], "the daemon outlived its keeper's parent"
    assert [ln[0] for ln in mps_log(tmp_path)] == ["start", "quit"]


def test_the_keeper_ignores_the_stop_signals_until_its_daemon_is_quit(tmp_path, fake_env):
    """A signal to every process of a job reaches the keeper too: it must outlive it to quit the
    daemon when its parent goes (and the daemon must not inherit the ignoring)."""
    k = Keeper()
    try:
        assert k.pid is not None and k.pid != k.proc.pid  # detached from its launcher
        os.kill(k.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert alive(k.pid)
        (pid,) = k.state.pids
        os.kill(pid, signal.SIGTERM)  # the daemon itself still ends on SIGTERM
        assert gone_within([pid], 10) == []
    finally:
        k.stop()


def test_a_daemon_already_serving_the_user_is_joined_and_left_running(tmp_path, fake_env):
    pipe = tmp_path / "user-mps"
    pipe.mkdir()
    subprocess.run(
        ["nvidia-cuda-mps-control", "-d"],
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        check=True,
    )
    ((_, pid, _),) = mps_log(tmp_path)
    try:
        k = Keeper()
        assert k.state.state == "joined" and k.state.pipe == str(pipe)  # read from its env
        k.stop()
        assert alive(int(pid)) and [ln[0] for ln in mps_log(tmp_path)] == ["start"]
    finally:
        subprocess.run(
            ["nvidia-cuda-mps-control"],
            input="quit\n",
            text=True,
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        )
    assert gone_within([int(pid)], 10) == []


def test_the_users_pipe_directory_is_joined(monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/mps")
    out, inp = io.StringIO(), io.StringIO("stop\n")
    assert keep("nvidia-cuda-mps-control", out, inp) == 0
    got = json.loads(out.getvalue())
    assert (got["state"], got["pipe"], got["pids"]) == ("joined", "/run/mps", [])


def test_without_the_control_binary_the_keeper_says_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    out = io.StringIO()
    keep("nvidia-cuda-mps-control", out, io.StringIO())
    got = json.loads(out.getvalue())
    assert got["state"] == "absent" and "no nvidia-cuda-mps-control" in got["why"]


# --- the scheduler's decision, from the shipped config ----------------------------------------
class FakeCluster:
    """Stands in for ClusterMPS (its Ray actors): every machine answers ``state``."""

    started: ClassVar[list[dict[str, str]]] = []

    def __init__(self, control: str, state: NodeState) -> None:
        self.state = state

    def start(self, nodes, daemon=True):
        FakeCluster.started.append(dict(nodes))
        return dict.fromkeys(nodes, self.state)

    def pipes(self):
        return {}


def shipped(monkeypatch, state: NodeState):
    """The scheduler of ``scheduler=ebrl +axis/scale=g1 gpu=h100``, as the run builds it."""
    FakeCluster.started = []
    monkeypatch.setattr(
        "ebrl.schedulers.ebrl.gpu.ClusterMPS", lambda control: FakeCluster(control, state)
    )
    s = instantiate(make_cfg(["scheduler=ebrl", "+axis/scale=g1", "gpu=h100"]).scheduler)
    assert s.ray_address == "local" and s.gen_gpus == s.learner_gpus == 0.5
    s.gpu.placed = []
    return s


def test_the_shipped_g1_config_starts_a_daemon_on_its_node(monkeypatch):
    """Issue 42: with the shipped ``ray_address: local`` no daemon was started."""
    s = shipped(monkeypatch, NodeState("started", "/tmp/p", (1,)))
    s.gpu.start_mps({"n1": "10.0.0.1"})
    assert FakeCluster.started == [{"n1": "10.0.0.1"}]
    assert s.gpu.sharing == Sharing.mps


def test_a_node_without_mps_warns_once_and_the_run_is_time_sliced(monkeypatch, caplog):
    s = shipped(monkeypatch, NodeState("absent", why="no nvidia-cuda-mps-control on PATH"))
    with caplog.at_level(logging.WARNING):
        s.gpu.start_mps({"n1": "10.0.0.1", "n2": "10.0.0.1"})
    (rec,) = caplog.records
    assert "time-slice the GPU" in rec.getMessage()
    assert rec.getMessage().count("no nvidia-cuda-mps-control") == 1  # one machine, said once
    assert s.gpu.sharing == Sharing.time_sliced
