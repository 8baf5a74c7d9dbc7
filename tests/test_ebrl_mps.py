"""EBRL's roles at GPU shares get an MPS daemon for the run (EBRLScheduler.start_mps), on fakes.

A share below one GPU is an SM quota only under an MPS daemon; without one the roles'
processes time-slice the GPU. The first GPU check (2026-12-04) ran the g1 scale point's
schedulers without one: the planner's shares were not what ran.
"""

from __future__ import annotations

import logging
import re
from typing import ClassVar

import pytest

from ebrl.resources.apply import MPSError
from ebrl.runtime.placement import Ask, Node, Placement, ray_options
from ebrl.schedulers.ebrl.scheduler import EBRLScheduler


class FakeDaemon:
    started: ClassVar[list[FakeDaemon]] = []

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.pipe_dir = "/tmp/ebrl-mps-test/pipe"

    def start(self) -> None:
        if self.fail:
            raise MPSError("nvidia-cuda-mps-control -d exited 1: no GPU")
        FakeDaemon.started.append(self)


def sched(gen: float = 0.5, learner: float = 0.5, address: str | None = None) -> EBRLScheduler:
    return EBRLScheduler(backend="ray", gen_gpus=gen, learner_gpus=learner, ray_address=address)


def start(s: EBRLScheduler, nodes: int = 1, binary: bool = True, running=(), fail=False):
    return s.start_mps(
        nodes,
        which=lambda name: f"/usr/bin/{name}" if binary else None,
        daemons=lambda: list(running),
        make=lambda: FakeDaemon(fail),
    )


@pytest.fixture(autouse=True)
def no_user_daemon(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    FakeDaemon.started.clear()


def test_shares_of_a_gpu_on_one_node_start_a_daemon_whose_pipe_every_role_gets():
    d = start(sched())
    assert d is not None and FakeDaemon.started == [d]
    node = Node("ab" * 28, "10.0.0.1", cpus=16, gpus=1)
    opts = ray_options(Placement(Ask("gen", 0, gpus=0.5), node), mps_pipe=d.pipe_dir)
    env = opts["runtime_env"]["env_vars"]
    assert env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PIPE_DIRECTORY": d.pipe_dir}


@pytest.mark.parametrize(
    ("s", "kw"),
    [
        (sched(0.0, 0.0), {}),  # no GPU
        (sched(1.0, 1.0), {}),  # whole GPUs: nothing to share
        (sched(address="10.0.0.1:6379"), {}),  # a cluster's Ray: its nodes are not ours
        (sched(), {"running": [4242]}),  # a daemon serves this user already: the roles join it
    ],
)
def test_no_daemon_is_started_where_none_is_needed_or_one_runs(s, kw, caplog):
    with caplog.at_level(logging.WARNING):
        assert start(s, **kw) is None
    assert FakeDaemon.started == [] and not caplog.records


def test_the_users_own_daemon_is_joined(monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/mps")
    assert start(sched()) is None and FakeDaemon.started == []


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"nodes": 2}, "span 2 nodes: start an MPS daemon on each"),
        ({"binary": False}, "no nvidia-cuda-mps-control here"),
        ({"fail": True}, "did not start .*no GPU"),
    ],
)
def test_where_no_daemon_can_serve_the_shares_the_run_goes_on_and_says_so(kw, words, caplog):
    with caplog.at_level(logging.WARNING):
        assert start(sched(), **kw) is None
    assert caplog.records, "no warning"
    msg = caplog.records[-1].getMessage()
    assert "time-slice the GPU" in msg
    assert re.search(words, msg), msg
