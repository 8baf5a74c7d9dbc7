"""Applying plans: affinity set and restored here; the MPS daemon's life with fake controls."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from ebrl.resources.apply import (
    MPSDaemon,
    MPSError,
    affinity,
    affinity_guard,
    apply_placement,
    gpu_stage_env,
    pin,
    rebind,
    set_threads,
    threads_guard,
)
from ebrl.resources.assign import PlanPolicy, StageRequest, make_plan
from ebrl.resources.topology import fake_topology
from tests.fake_mps import write_control

REPO = Path(__file__).resolve().parents[1]
ALLOWED = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two allowed cores")


# --- CPU --------------------------------------------------------------------------------------
@needs_two_cores
def test_pin_and_guard_restore_affinity():
    before = affinity()
    with affinity_guard() as saved:
        assert saved == before
        prev = pin(0, [ALLOWED[0]])
        assert prev == before
        assert affinity() == {ALLOWED[0]}
    assert affinity() == before


@needs_two_cores
def test_guard_restores_on_exception():
    before = affinity()
    with pytest.raises(RuntimeError, match="boom"), affinity_guard():
        pin(0, [ALLOWED[-1]])
        raise RuntimeError("boom")
    assert affinity() == before


def test_pin_errors_name_the_allowed_cores():
    with pytest.raises(ValueError, match="no cores"):
        pin(0, [])
    with affinity_guard(), pytest.raises(OSError, match="allowed"):
        pin(0, [100_000])
    assert affinity() == set(ALLOWED)


@needs_two_cores
def test_rebind_moves_a_running_process_and_skips_a_gone_one():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        prev = rebind({child.pid: [ALLOWED[1]]})
        assert prev == {child.pid: set(ALLOWED)}
        assert os.sched_getaffinity(child.pid) == {ALLOWED[1]}
    finally:
        child.kill()
        child.wait()
    assert rebind({child.pid: [ALLOWED[0]]}) == {}  # exited and reaped: skipped, no error


def test_set_threads_and_guard():
    start = torch.get_num_threads()
    with threads_guard(1):
        assert torch.get_num_threads() == 1
        assert set_threads(2) == 1
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == start
    with pytest.raises(ValueError):
        set_threads(0)


def test_apply_placement_pins_this_process_and_sets_threads():
    topo = fake_topology(numa_nodes=1, cores_per_node=len(ALLOWED), gpus=0)
    plan = make_plan(topo, [StageRequest("gen", cores_per_process=1)], PlanPolicy())
    (p,) = plan.placements
    before = affinity()
    with affinity_guard(), threads_guard():
        apply_placement(p)
        assert affinity() == set(p.cores) and torch.get_num_threads() == p.threads
    assert affinity() == before


# --- MPS with an in-memory fake ---------------------------------------------------------------
NO_SUCH_PID = 2**22 + 12345  # above the kernel's largest pid


class FakeControl:
    """Stands in for ``nvidia-cuda-mps-control`` and the process table."""

    def __init__(self, fail: bool = False, existing: list[int] | None = None) -> None:
        self.fail = fail
        self.calls: list[tuple[list[str], dict[str, str], str | None]] = []
        self.daemons = list(existing or [])

    def __call__(self, args, *, env, input=None, timeout):
        self.calls.append((list(args), dict(env), input))
        if list(args[1:]) == ["-d"]:
            if self.fail:
                return subprocess.CompletedProcess(args, 1, "", "fake: no GPU")
            self.daemons.append(NO_SUCH_PID)
        elif input and input.strip() == "quit":
            self.daemons = [d for d in self.daemons if d != NO_SUCH_PID]
        return subprocess.CompletedProcess(args, 0, "", "")

    def find(self) -> list[int]:
        return list(self.daemons)


def test_mps_start_env_and_stop_with_fake_runner():
    fake = FakeControl()
    d = MPSDaemon(runner=fake, find_daemons=fake.find, gpus=[0])
    with d:
        assert d.running and d.pids == {NO_SUCH_PID}
        args, env, _ = fake.calls[0]
        assert args == ["nvidia-cuda-mps-control", "-d"]
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(d.pipe_dir) and d.pipe_dir.is_dir()
        assert env["CUDA_MPS_LOG_DIRECTORY"] == str(d.log_dir) and d.log_dir.is_dir()
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        base = d.pipe_dir.parent
    assert fake.calls[-1][2] == "quit\n"
    assert not d.running and not fake.daemons and not base.exists()
    d.stop()  # idempotent
    assert len(fake.calls) == 2


def test_mps_refuses_a_second_daemon_of_this_user():
    fake = FakeControl(existing=[1234])
    with pytest.raises(MPSError, match=r"already runs for this user \(pids \[1234\]\)"):
        MPSDaemon(runner=fake, find_daemons=fake.find).start()
    assert fake.calls == []


def test_mps_start_failure_is_reported_and_cleaned_up(tmp_path):
    fake = FakeControl(fail=True)
    handler = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(MPSError, match="exited 1: fake: no GPU"),
        MPSDaemon(runner=fake, find_daemons=fake.find),
    ):
        pass
    assert signal.getsignal(signal.SIGTERM) == handler


def test_mps_sigterm_chains_to_a_previous_python_handler():
    fake = FakeControl()
    seen: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with MPSDaemon(runner=fake, find_daemons=fake.find) as d:
            assert signal.getsignal(signal.SIGTERM) == d._on_sigterm
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs between bytecodes
            assert seen == [signal.SIGTERM]
            assert not d.running and not fake.daemons  # stopped before the old handler ran
        assert signal.getsignal(signal.SIGTERM) is not d._on_sigterm
    finally:
        signal.signal(signal.SIGTERM, old)


# --- MPS with a fake control binary (real processes) -------------------------------------------
@pytest.fixture
def fake_control(tmp_path: Path) -> str:
    return str(write_control(tmp_path / "bin"))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_fake_binary_daemon_lives_exactly_as_long_as_the_block(fake_control):
    with MPSDaemon(control=fake_control) as d:
        (pid,) = d.pids
        assert _alive(pid)
        deadline = time.monotonic() + 5
        while not (d.pipe_dir / "control").exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # the fake daemon creates its socket stand-in once it runs
        assert (d.pipe_dir / "control").exists()
        base = d.pipe_dir.parent
        with pytest.raises(MPSError, match="already runs"):
            MPSDaemon(control=fake_control).start()
    assert not _alive(pid) and not base.exists()


def test_fake_binary_daemon_stopped_on_exception(fake_control):
    with pytest.raises(RuntimeError, match="stage crashed"), MPSDaemon(control=fake_control) as d:
        (pid,) = d.pids
        raise RuntimeError("stage crashed")
    assert not _alive(pid)


def test_daemon_ignoring_quit_is_terminated(fake_control, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")
    with caplog.at_level(logging.WARNING), MPSDaemon(control=fake_control, timeout_s=0.5) as d:
        (pid,) = d.pids
    assert not _alive(pid)
    assert "ignored quit" in caplog.text


def test_sigterm_stops_the_daemon_and_exits(fake_control):
    script = (
        "import sys, time\n"
        "from ebrl.resources.apply import MPSDaemon\n"
        "with MPSDaemon(control=sys.argv[1]) as d:\n"
        "    print(min(d.pids), d.pipe_dir, flush=True)\n"
        "    time.sleep(60)\n"
        "print('not reached', flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, fake_control], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        pid_text, pipe = child.stdout.readline().split()
        pid = int(pid_text)
        assert _alive(pid) and Path(pipe).is_dir()
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 128 + signal.SIGTERM
        assert "not reached" not in child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not _alive(pid) and not Path(pipe).exists()


# --- launch environments ----------------------------------------------------------------------
def test_gpu_stage_env_per_share_kind(tmp_path, caplog):
    mps_plan = make_plan(
        fake_topology(numa_nodes=1, cores_per_node=4, gpus=1),
        [StageRequest("gen", gpu_share=0.3), StageRequest("train", gpu_share=0.7)],
    )
    gen = mps_plan.stage("gen")[0].gpu
    with pytest.raises(ValueError, match="needs the MPS daemon"):
        gpu_stage_env(gen)
    env = gpu_stage_env(gen, tmp_path / "pipe")
    assert env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "GPU-fake-0",
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    fake = FakeControl()
    with MPSDaemon(runner=fake, find_daemons=fake.find) as d:
        assert gpu_stage_env(gen, d)["CUDA_MPS_PIPE_DIRECTORY"] == str(d.pipe_dir)

    mig = (
        make_plan(
            fake_topology(numa_nodes=1, cores_per_node=4, gpus=1, mig=True),
            [StageRequest("gen", gpu_share=0.1)],
        )
        .placements[0]
        .gpu
    )
    assert gpu_stage_env(mig)["CUDA_VISIBLE_DEVICES"] == "MIG-fake-0-2"

    whole = (
        make_plan(
            fake_topology(numa_nodes=1, cores_per_node=4, gpus=1),
            [StageRequest("train", gpu_share=1.0)],
        )
        .placements[0]
        .gpu
    )
    assert gpu_stage_env(whole) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "GPU-fake-0",
    }

    ts = (
        make_plan(
            fake_topology(numa_nodes=1, cores_per_node=4, gpus=1, mps=False),
            [StageRequest("gen", gpu_share=0.5)],
        )
        .placements[0]
        .gpu
    )
    with caplog.at_level(logging.WARNING):
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in gpu_stage_env(ts)
    assert "time-slicing" in caplog.text
