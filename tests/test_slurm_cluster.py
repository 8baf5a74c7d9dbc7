"""A Ray cluster over a multi-task Slurm job's nodes (``ebrl.runtime.slurm_cluster``, with
``slurm_env``, ``slurm_plan`` and ``ray_node``, and the Slurm launcher that calls it), on fake
Slurm environments: which task does what, the head's address and port, the ``ray start``
commands; the node process's life on fake ``ray start`` programs; the launcher's routing; the
dry run's account of it. The real thing runs in
``tests/slurm/test_slurm_multinode.py`` (``make test-slurm``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import ClassVar

import psutil
import pytest

from ebrl.runtime import ray_node, slurm_env, slurm_plan
from ebrl.runtime import slurm_cluster as sc
from ebrl.runtime.slurm_env import ClusterError, SlurmTask
from ebrl.runtime.slurm_plan import NodePlan

from .conftest import make_cfg

HOSTS = {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2", "gpu03": "10.0.0.3"}


def env_of(procid: int, node: str, **extra: str) -> dict[str, str]:
    """A task's environment as srun sets it in a 3-node job, one task per node."""
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_NTASKS": "3",
        "SLURM_PROCID": str(procid),
        "SLURMD_NODENAME": node,
        "SLURM_JOB_NODELIST": "gpu[01-03]",
        "SLURM_CPUS_ON_NODE": "96",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    env.update(extra)
    return env


def expand(nodelist: str) -> list[str]:
    """``scontrol show hostnames`` for the node lists these tests use."""
    if "[" not in nodelist:
        return nodelist.split(",")
    return {"gpu[01-03]": ["gpu01", "gpu02", "gpu03"], "gpu[01-02]": ["gpu01", "gpu02"]}[nodelist]


def task(procid: int, node: str, **extra: str) -> SlurmTask:
    t = slurm_env.slurm_task(
        env_of(procid, node, **extra), hostnames=expand, usable_cpus=lambda: 96
    )
    assert t is not None
    return t


def plan(procid: int, node: str, **extra: str) -> NodePlan:
    return slurm_plan.plan_node(task(procid, node, **extra), resolve=HOSTS.__getitem__, env={})


# --- the Slurm environment --------------------------------------------------------------------
def test_no_cluster_outside_slurm_or_for_a_single_task():
    assert slurm_env.slurm_task({}) is None
    assert slurm_env.slurm_task(env_of(0, "gpu01", SLURM_NTASKS="1"), hostnames=expand) is None


def test_each_task_reads_its_rank_node_hosts_cpus_and_gpus():
    t = task(2, "gpu03")
    assert (t.job_id, t.procid, t.ntasks, t.node) == (123456, 2, 3, "gpu03")
    assert t.hosts == ("gpu01", "gpu02", "gpu03") and not t.head
    assert (t.cpus, t.gpus, t.tmp) == (96, 8, "/tmp")
    assert task(0, "gpu01").head
    # a task's own CPUs win over the node's; TMPDIR is honoured
    t = task(1, "gpu02", SLURM_CPUS_PER_TASK="12", TMPDIR="/scratch/job")
    assert (t.cpus, t.tmp) == (12, "/scratch/job")
    # the step's node list (what srun ran the tasks on) wins over the job's
    t = slurm_env.slurm_task(
        env_of(0, "gpu01", SLURM_STEP_NODELIST="gpu[01-02]", SLURM_NTASKS="2"),
        hostnames=expand,
    )
    assert t is not None and t.hosts == ("gpu01", "gpu02")


def test_ray_gets_the_cpus_the_task_may_run_on_not_what_slurm_says(monkeypatch):
    # Slurm 22.05-23.02: an srun without --cpus-per-task may bind a task to one CPU while
    # SLURM_CPUS_PER_TASK still says what the job asked for
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    t = slurm_env.slurm_task(env_of(1, "gpu02", SLURM_CPUS_PER_TASK="96"), hostnames=expand)
    assert t is not None and (t.cpus, t.slurm_cpus) == (1, 96)
    assert "--num-cpus=1" in slurm_plan.plan_node(t, resolve=HOSTS.__getitem__, env={}).command()
    # a task free to run on more CPUs than it was given gets what it was given
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(128)))
    t = slurm_env.slurm_task(env_of(1, "gpu02", SLURM_CPUS_PER_TASK="96"), hostnames=expand)
    assert t is not None and (t.cpus, t.slurm_cpus) == (96, 96)


@pytest.mark.parametrize(
    ("value", "n"), [(None, 0), ("", 0), ("NoDevFiles", 0), ("0", 1), ("0,1,2,3", 4), ("3,", 1)]
)
def test_gpus_are_the_entries_of_cuda_visible_devices(value, n):
    assert slurm_env.gpu_count(value) == n


def test_a_multi_task_job_without_its_slurm_variables_is_refused_by_name():
    env = env_of(1, "gpu02")
    del env["SLURM_PROCID"], env["SLURMD_NODENAME"]
    with pytest.raises(ClusterError, match=r"no SLURM_PROCID, SLURMD_NODENAME"):
        slurm_env.slurm_task(env, hostnames=expand)


def test_plain_node_lists_need_no_scontrol():
    assert slurm_env.scontrol_hostnames("a,b") == ["a", "b"]


# --- what each task starts --------------------------------------------------------------------
def test_every_task_agrees_on_the_head_and_its_port_a_pure_function_of_the_job():
    plans = [plan(0, "gpu01"), plan(1, "gpu02"), plan(2, "gpu03")]
    port = slurm_plan.head_port(123456)
    assert port == slurm_plan.PORT_BASE + 123456 % slurm_plan.PORT_SPAN
    assert {p.head_address for p in plans} == {f"10.0.0.1:{port}"}
    assert [p.node_ip for p in plans] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert {p.temp_dir for p in plans} == {"/tmp/ray-ebrl-123456"}
    assert [dict(p.resources) for p in plans] == [{f"slurm_task_{i}": 1.0} for i in range(3)]
    # another job, another port; both (and the client server's, port + 1) below the
    # ephemeral range and above Ray's worker ports
    other = slurm_plan.head_port(123457)
    assert other != port
    for jid in (0, 123456, slurm_plan.PORT_SPAN - 1, 10**9 + 7):
        assert slurm_plan.head_port(jid) >= 20000 and slurm_plan.head_port(jid) + 1 < 32768


def test_the_head_must_run_on_the_first_node():
    t = task(0, "gpu02")
    with pytest.raises(ClusterError, match="task 0 runs on gpu02, but the job's first node"):
        slurm_plan.plan_node(t, resolve=HOSTS.__getitem__, env={})


# --- the node's address on a host whose name resolves to loopback -----------------------------
#: what Debian's and Ubuntu's /etc/hosts give for the host's own name
DEBIAN = "127.0.1.1"
#: each node's interfaces (IPv4 addresses of those that are up)
IFACES = {
    n: {"lo": ["127.0.0.1"], "eth0": [ip], "ib0": [ip.replace("10.0.", "10.1.")]}
    for n, ip in HOSTS.items()
}


def resolver_on(node: str):
    """``gethostbyname`` as ``node`` sees it: its own name from /etc/hosts (loopback), the
    others' from DNS."""
    return lambda name: DEBIAN if name == node else HOSTS[name]


def plan_on(procid: int, node: str, env=None, route=None, ifaces=None, **extra: str) -> NodePlan:
    """Task ``procid``'s plan as computed on ``node`` (a Debian host): its route to any peer
    leaves from its eth0 address unless ``route`` says otherwise."""
    return slurm_plan.plan_node(
        task(procid, node, **extra),
        resolve=resolver_on(node),
        route=route or (lambda peer: HOSTS[node]),
        interfaces=lambda: IFACES[node] if ifaces is None else ifaces,
        env=env or {},
    )


def test_a_host_name_resolving_to_loopback_gives_this_hosts_routable_address():
    """Through the system's own routing table and interfaces (this machine's)."""
    import ipaddress

    import psutil

    ours = {
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET
    }
    if all(ipaddress.ip_address(a).is_loopback for a in ours):
        pytest.skip("this machine has no address but loopback")
    p = slurm_plan.plan_node(task(0, "gpu01"), resolve=resolver_on("gpu01"), env={})
    assert not ipaddress.ip_address(p.node_ip).is_loopback, p.node_ip
    assert p.node_ip in ours
    assert p.head_address == f"{p.node_ip}:{slurm_plan.head_port(123456)}"


def test_every_node_gets_the_address_its_peers_reach_under_debians_etc_hosts():
    head, worker = plan_on(0, "gpu01"), plan_on(1, "gpu02")
    port = slurm_plan.head_port(123456)
    assert (head.node_ip, head.head_address) == ("10.0.0.1", f"10.0.0.1:{port}")
    assert (worker.node_ip, worker.head_address) == ("10.0.0.2", f"10.0.0.1:{port}")
    assert "--node-ip-address=10.0.0.1" in head.command()
    # no route known: the host's first address that is not loopback
    nowhere = plan_on(1, "gpu02", route=lambda peer: None)
    assert nowhere.node_ip == "10.0.0.2"
    # an interface named in the environment wins (a cluster's fast network)
    assert plan_on(1, "gpu02", env={"EBRL_RAY_INTERFACE": "ib0"}).node_ip == "10.1.0.2"


def test_an_interface_that_does_not_exist_is_refused_by_name():
    with pytest.raises(ClusterError, match=r"EBRL_RAY_INTERFACE=ib7.*gpu02.*eth0, ib0"):
        plan_on(1, "gpu02", env={"EBRL_RAY_INTERFACE": "ib7"})


def test_only_loopback_on_a_job_of_several_hosts_is_refused_with_the_fix():
    lo = {"lo": ["127.0.0.1"]}
    with pytest.raises(ClusterError, match=r"gpu01 resolves to 127.0.1.1.*EBRL_RAY_INTERFACE"):
        plan_on(0, "gpu01", route=lambda peer: "127.0.0.1", ifaces=lo)
    # a worker that finds the head's host only on loopback could never reach it
    with pytest.raises(ClusterError, match=r"the head's node gpu01 resolves to 127.0.1.1 on gpu02"):
        slurm_plan.plan_node(
            task(1, "gpu02"),
            resolve=lambda name: DEBIAN,
            route=lambda peer: None,
            interfaces=lambda: IFACES["gpu02"],
            env={},
        )


def test_tasks_sharing_one_host_may_meet_on_loopback():
    one = {"SLURM_JOB_NODELIST": "gpu01,gpu01", "SLURM_NTASKS": "2"}
    lo = {"lo": ["127.0.0.1"]}
    plans = [plan_on(i, "gpu01", route=lambda peer: None, ifaces=lo, **one) for i in (0, 1)]
    assert {p.node_ip for p in plans} == {DEBIAN}
    assert {p.head_address for p in plans} == {f"{DEBIAN}:{slurm_plan.head_port(123456)}"}


def test_ray_start_commands_of_the_head_and_a_worker():
    head, worker = plan(0, "gpu01"), plan(1, "gpu02", CUDA_VISIBLE_DEVICES="")
    port = head.port
    h = head.command(python="py")
    assert h[:5] == ["py", "-m", "ray.scripts.scripts", "start", "--block"]
    for arg in (
        "--head",
        f"--port={port}",
        f"--ray-client-server-port={port + 1}",
        "--include-dashboard=false",
        "--node-ip-address=10.0.0.1",
        "--num-cpus=96",
        "--num-gpus=8",
        '--resources={"slurm_task_0": 1.0}',
        "--temp-dir=/tmp/ray-ebrl-123456",
        "--dashboard-agent-listen-port=0",
    ):
        assert arg in h, arg
    assert not any(a.startswith("--address") for a in h)
    w = worker.command(python="py")
    assert f"--address=10.0.0.1:{port}" in w and "--block" in w
    assert "--node-ip-address=10.0.0.2" in w and "--num-gpus=0" in w
    assert '--resources={"slurm_task_1": 1.0}' in w
    assert not any(a == "--head" or a.startswith("--port") for a in w)


def test_ray_start_environment_agrees_on_authentication_and_does_not_drain():
    p = plan(1, "gpu02")
    env = p.environment({"PATH": "/bin"})
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert env["PATH"] == "/bin"
    assert p.environment({"RAY_AUTH_MODE": "disabled"})["RAY_AUTH_MODE"] == "disabled"


@pytest.mark.parametrize(
    ("scheduler", "wanted"),
    [
        ({"backend": "ray", "ray_address": "local"}, True),
        ({"backend": "ray", "ray_address": "auto"}, True),
        ({"ray_address": "local"}, True),
        ({"backend": "inprocess", "ray_address": "local"}, False),
        ({"backend": "ray", "ray_address": "10.0.0.9:6379"}, False),
        ({"_target_": "ebrl.schedulers.sync.SyncScheduler"}, False),
        (None, False),
    ],
)
def test_a_cluster_only_for_schedulers_on_ray_that_leave_the_address_to_the_job(scheduler, wanted):
    assert sc.wants_cluster(scheduler) is wanted


def test_wants_cluster_on_the_composed_schedulers():
    for name, wanted in [("ebrl", True), ("async", True), ("hybrid", True), ("sync", False)]:
        cfg = make_cfg([f"scheduler={name}"])
        assert sc.wants_cluster(cfg.scheduler) is wanted, name
    assert not sc.wants_cluster(make_cfg(["scheduler=colocated"]).scheduler)
    assert not sc.wants_cluster(
        make_cfg(["scheduler=ebrl", "scheduler.backend=inprocess"]).scheduler
    )


def test_describe_job():
    ray = {"backend": "ray", "ray_address": "local"}
    assert sc.describe_job(1, 1, ray) == ""
    assert "starts a Ray cluster over its 2 nodes (2 Ray nodes" in sc.describe_job(2, 1, ray)
    assert "task 1 join(s) it" in sc.describe_job(2, 1, ray)
    assert "over its 1 node(s) x 2 tasks" in sc.describe_job(1, 2, ray)
    assert "tasks 1-3" in sc.describe_job(4, 1, ray)
    assert sc.describe_job(2, 1, {}).startswith("2 Slurm tasks but no Ray cluster")


# --- the node process, on fake `ray start` programs -------------------------------------------
#: a fake `ray start --block`: starts a child that ignores SIGTERM (as Ray's agents do) and
#: writes its pid to argv[1]; on SIGTERM it exits 1 without ending that child (the worst case
#: for stop()); with argv[2] == "die" it exits by itself 2 s later, leaving the child an orphan
FAKE_RAY = textwrap.dedent(
    """
    import pathlib, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    pathlib.Path(sys.argv[1]).write_text(str(child.pid))
    time.sleep(2 if sys.argv[2] == "die" else 300)
    sys.exit(3)
    """
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids, timeout: float = 20.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def start_fake(tmp_path, mode: str) -> tuple[ray_node.RayNode, int]:
    out = tmp_path / "child.pid"
    node = ray_node.RayNode([sys.executable, "-c", FAKE_RAY, str(out), mode], interval=0.1)
    node.start()
    deadline = time.time() + 20
    while not out.exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)  # written whole, and recorded
    return node, int(out.read_text())


def test_stop_ends_ray_start_and_what_it_left_by_pid(tmp_path):
    node, child = start_fake(tmp_path, "block")
    assert node.alive() and not gone(child)
    # USR2 (Submitit's time-limit warning, sent by Slurm to every process) is ignored
    os.kill(node.pid, signal.SIGUSR2)
    time.sleep(0.5)
    assert node.alive()
    assert node.stop(timeout=10) == 1
    assert not node.alive() and wait_gone([child])


def test_stop_ends_what_a_node_that_died_by_itself_left(tmp_path):
    node, child = start_fake(tmp_path, "die")
    deadline = time.time() + 20
    while node.alive() and time.time() < deadline:
        time.sleep(0.1)
    assert node.exit_code() == 3 and not gone(child)  # an orphan now, no longer below it
    assert node.stop(timeout=10) == 3
    assert wait_gone([child])


#: a task that starts a fake Ray node, prints its pid, then waits to be killed
TASK = textwrap.dedent(
    """
    import sys, time
    from ebrl.runtime.ray_node import RayNode
    node = RayNode([sys.executable, "-c", "import time; time.sleep(300)"])
    node.start()
    print(node.pid, flush=True)
    time.sleep(300)
    """
)


def test_a_ray_node_dies_with_its_task_however_the_task_dies():
    proc = subprocess.Popen([sys.executable, "-c", TASK], stdout=subprocess.PIPE, text=True)
    try:
        node = int(proc.stdout.readline())
        assert not gone(node)
        proc.kill()  # SIGKILL: no finally, no atexit in the task
        proc.wait()
        assert wait_gone([node], 10), "the Ray node outlived its task"
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


# --- the worker task and the head task, with fakes --------------------------------------------
class FakeNode:
    """Stands for a RayNode: records what it was started with; alive until stopped or killed."""

    made: ClassVar[list[FakeNode]] = []

    def __init__(self, command, env):
        self.command, self.env = list(command), dict(env)
        self.started = self.stopped = False
        self.dead = False
        FakeNode.made.append(self)

    def start(self):
        self.started = True

    def alive(self):
        return self.started and not self.stopped and not self.dead

    def exit_code(self):
        return None if self.alive() else 1

    def stop(self, timeout: float = 0.0):
        self.stopped = True
        return 0


class Head:
    """The head's GCS port as a worker probes it: answers from the ``up``-th probe on, until
    ``down`` probes (None: forever)."""

    def __init__(self, up: int = 0, down: int | None = None):
        self.up, self.down, self.probes = up, down, 0

    def __call__(self, host, port):
        self.probes += 1
        assert (host, port) == ("10.0.0.1", slurm_plan.head_port(123456))
        return self.probes > self.up and (self.down is None or self.probes <= self.down)


def serve(head: Head, **kw):
    FakeNode.made.clear()
    opts = {
        "node_factory": FakeNode,
        "reachable": head,
        "environ": {},
        "join_timeout_s": 5.0,
        "leave_after_s": 0.2,
        "poll_s": 0.01,
        "watchdog": False,
    }
    return sc.serve_worker(plan(1, "gpu02"), **(opts | kw))


def test_a_worker_waits_for_the_head_joins_and_leaves_when_the_head_is_gone():
    rep = serve(Head(up=5, down=30))
    (node,) = FakeNode.made
    assert node.started and node.stopped
    assert f"--address=10.0.0.1:{slurm_plan.head_port(123456)}" in node.command
    assert node.env["RAY_AUTH_MODE"] == "token"
    assert rep.left == "the head's cluster ended" and rep.signum is None
    assert rep.task == 1 and rep.node == "gpu02" and rep.joined_s is not None


def test_a_worker_whose_head_never_answers_fails_without_starting_a_node():
    with pytest.raises(ClusterError, match="did not answer within 0 s"):
        serve(Head(up=10**9), join_timeout_s=0.1)
    assert not FakeNode.made


def test_a_worker_whose_node_dies_while_the_head_runs_fails_and_still_stops_it():
    class Dying(FakeNode):
        def alive(self):
            return False

    with pytest.raises(ClusterError, match=r"its Ray node ended .* while the head .* still runs"):
        serve(Head(), node_factory=Dying)
    assert FakeNode.made[0].stopped


def test_a_worker_whose_node_dies_as_the_head_goes_leaves_quietly():
    class Dying(FakeNode):
        def alive(self):
            return False

    rep = serve(Head(down=3), node_factory=Dying, leave_after_s=0.1)
    assert rep.left == "the head's cluster ended"


def test_a_worker_told_to_stop_stops_its_node_and_reports_the_signal():
    head = Head()

    def reachable(host, port):
        if head.probes == 20:
            os.kill(os.getpid(), signal.SIGTERM)  # recorded by serve_worker, not fatal
        return head(host, port)

    before = signal.getsignal(signal.SIGTERM)
    rep = serve(head, reachable=reachable)
    assert rep.signum == signal.SIGTERM and rep.left == "stopped by SIGTERM"
    assert FakeNode.made[0].stopped
    assert signal.getsignal(signal.SIGTERM) is before  # restored


def fake_wait(nodes=None, error=None, calls=None):
    def wait(address, count, timeout_s, alive, env):
        if calls is not None:
            calls.append((address, count, alive(), env["RAY_AUTH_MODE"]))
        if error:
            raise error
        return nodes or []

    return wait


def test_the_head_starts_waits_for_every_node_points_the_driver_at_it_and_stops():
    FakeNode.made.clear()
    environ = {"RAY_ADDRESS": "elsewhere:1"}
    calls: list = []
    nodes = [
        {"node_id": "a" * 40, "address": "10.0.0.1", "head": True, "resources": {"CPU": 96}},
        {"node_id": "b" * 40, "address": "10.0.0.2", "resources": {"slurm_task_1": 1}},
    ]
    p = plan(0, "gpu01")
    with sc.head_cluster(
        p,
        environ=environ,
        node_factory=FakeNode,
        wait_nodes=fake_wait(nodes, calls=calls),
        watchdog=False,
    ) as got:
        assert got == nodes
        assert environ["RAY_ADDRESS"] == p.head_address and environ["RAY_AUTH_MODE"] == "token"
        (node,) = FakeNode.made
        assert "--head" in node.command and node.alive()
    assert calls == [(p.head_address, 3, True, "token")]
    assert node.stopped
    assert environ == {"RAY_ADDRESS": "elsewhere:1"}  # restored


def test_the_head_stops_its_node_when_the_nodes_do_not_join_or_training_fails():
    FakeNode.made.clear()
    with (
        pytest.raises(ClusterError, match="1 of 3"),
        sc.head_cluster(
            plan(0, "gpu01"),
            environ={},
            node_factory=FakeNode,
            wait_nodes=fake_wait(error=ClusterError("1 of 3 Ray nodes joined")),
            watchdog=False,
        ),
    ):
        pass
    assert FakeNode.made[0].stopped
    FakeNode.made.clear()
    with (
        pytest.raises(RuntimeError, match="training failed"),
        sc.head_cluster(
            plan(0, "gpu01"),
            environ={},
            node_factory=FakeNode,
            wait_nodes=fake_wait(),
            watchdog=False,
        ),
    ):
        raise RuntimeError("training failed")
    assert FakeNode.made[0].stopped


def test_the_head_writes_the_jobs_token_before_ray_starts_and_removes_it_after(tmp_path):
    FakeNode.made.clear()
    seen: dict = {}

    class Recording(FakeNode):
        def start(self):
            path = self.env["RAY_AUTH_TOKEN_PATH"]
            seen["at start"] = (Path(path).read_text(), os.stat(path).st_mode & 0o777)
            super().start()

    p = slurm_plan.plan_node(
        task(0, "gpu01"), resolve=HOSTS.__getitem__, env={}, shared_dir=str(tmp_path)
    )
    token = tmp_path / "123456_ray_auth_token"
    assert p.token_path == str(token) and p.environment({})["RAY_AUTH_TOKEN_PATH"] == str(token)
    environ: dict[str, str] = {}
    with sc.head_cluster(
        p, environ=environ, node_factory=Recording, wait_nodes=fake_wait(), watchdog=False
    ):
        assert environ["RAY_AUTH_TOKEN_PATH"] == str(token)  # the driver reads it too
    text, mode = seen["at start"]
    assert len(text) == 64 and int(text, 16) >= 0 and mode == 0o600
    assert not token.exists() and environ == {}
    # the next attempt makes a new one (the first was removed with its head)
    FakeNode.made.clear()
    with sc.head_cluster(
        p, environ={}, node_factory=Recording, wait_nodes=fake_wait(), watchdog=False
    ):
        assert token.read_text() != text
    # one an attempt killed before its head stopped left is used, and removed after
    token.write_text("a" * 64)
    with sc.head_cluster(
        p, environ={}, node_factory=Recording, wait_nodes=fake_wait(), watchdog=False
    ):
        pass
    assert seen["at start"][0] == "a" * 64 and not token.exists()


@pytest.mark.parametrize(
    "given",
    [
        {"RAY_AUTH_TOKEN": "t" * 64},
        {"RAY_AUTH_TOKEN_PATH": "/shared/tok"},
        {"RAY_AUTH_MODE": "disabled"},
    ],
)
def test_a_token_or_mode_the_user_gives_is_left_to_ray(tmp_path, given):
    p = slurm_plan.plan_node(
        task(0, "gpu01"), resolve=HOSTS.__getitem__, env=given, shared_dir=str(tmp_path)
    )
    assert p.token_path is None
    env = p.environment(given)
    assert env.get("RAY_AUTH_TOKEN_PATH") == given.get("RAY_AUTH_TOKEN_PATH")
    assert not list(tmp_path.iterdir())


def test_without_a_shared_folder_the_head_makes_rays_own_token_file_if_missing(tmp_path):
    p = plan(0, "gpu01")
    assert p.token_path is None
    home = tmp_path / "home"
    with sc.head_cluster(
        p,
        environ={"HOME": str(home)},
        node_factory=FakeNode,
        wait_nodes=fake_wait(),
        watchdog=False,
    ):
        pass
    made = (home / ".ray" / "auth_token").read_text()
    assert len(made) == 64  # kept: it is the user's, as a local ray.init() would leave it
    with sc.head_cluster(
        p,
        environ={"HOME": str(home)},
        node_factory=FakeNode,
        wait_nodes=fake_wait(),
        watchdog=False,
    ):
        pass
    assert (home / ".ray" / "auth_token").read_text() == made


def test_a_worker_joins_with_the_jobs_token_and_refuses_when_it_cannot_read_it(tmp_path):
    p = slurm_plan.plan_node(
        task(1, "gpu02"), resolve=HOSTS.__getitem__, env={}, shared_dir=str(tmp_path)
    )
    opts = {
        "node_factory": FakeNode,
        "reachable": Head(down=30),
        "environ": {},
        "join_timeout_s": 0.5,
        "leave_after_s": 0.2,
        "poll_s": 0.01,
        "watchdog": False,
    }
    FakeNode.made.clear()
    with pytest.raises(
        ClusterError,
        match=r"token file .*123456_ray_auth_token is not readable "
        r"on gpu02.*submitit_folder",
    ):
        sc.serve_worker(p, **opts)
    assert not FakeNode.made
    slurm_plan.write_token(str(tmp_path / "123456_ray_auth_token"))
    sc.serve_worker(p, **opts)
    (node,) = FakeNode.made
    assert node.env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "123456_ray_auth_token")


def test_waiting_for_nodes_stops_when_the_head_ends_or_the_time_is_up():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    address = f"127.0.0.1:{free}"
    with pytest.raises(ClusterError, match="the Ray head ended while starting"):
        sc.wait_for_nodes(address, 2, 30.0, alive=lambda: False)
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="did not answer within 1 s"):
        sc.wait_for_nodes(address, 2, 1.0, alive=lambda: True)
    assert time.monotonic() - t0 < 10


def test_describe_nodes_names_the_task_of_each_node():
    line = sc.describe_nodes(
        [
            {"node_id": "cccccccc00", "address": "10.0.0.3",
             "resources": {"CPU": 1.0, "slurm_task_10": 1.0}},
            {"node_id": "99999999aa", "address": "10.0.0.2",
             "resources": {"CPU": 1.0, "GPU": 8.0, "slurm_task_2": 1.0}},
            {"node_id": "abcdef0123", "address": "10.0.0.1", "head": True,
             "resources": {"CPU": 2.0, "slurm_task_0": 1.0}},
        ]
    )  # fmt: skip
    assert line == (
        "task 0 (head) 10.0.0.1/abcdef01 2 CPUs 0 GPUs; task 2 10.0.0.2/99999999 1 CPUs 8 GPUs; "
        "task 10 10.0.0.3/cccccccc 1 CPUs 0 GPUs"
    )


# --- the launcher's routing -------------------------------------------------------------------
@pytest.fixture
def launcher(monkeypatch):
    """ebrl's SlurmLauncher with hydra-submitit-launcher's job (the base ``__call__``) and the
    cluster functions replaced by recorders."""
    from hydra.core.utils import JobReturn, JobStatus

    from hydra_plugins.ebrl_launcher import slurm_launcher as sl

    seen: dict = {"jobs": [], "events": []}

    def job(self, overrides, *args):
        seen["jobs"].append(list(overrides))
        seen["events"].append("train")
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value="trained")

    @contextlib.contextmanager
    def head_cluster(p):
        seen["events"].append(("head up", p.task.procid))
        yield []
        seen["events"].append("head down")

    def serve_worker(p):
        seen["events"].append(("worker", p.task.procid))
        return sc.WorkerReport(task=p.task.procid, node=p.task.node, head=p.head_address,
                               left="the head's cluster ended")  # fmt: skip

    real_plan = slurm_plan.plan_node
    # the class it derives from (Hydra's plugin scan may have loaded that module twice)
    monkeypatch.setattr(sl.SlurmLauncher.__bases__[0], "__call__", job)
    monkeypatch.setattr(sc, "head_cluster", head_cluster)
    monkeypatch.setattr(sc, "serve_worker", serve_worker)
    monkeypatch.setattr(
        slurm_plan,
        "plan_node",
        lambda t, **kw: real_plan(t, resolve=HOSTS.__getitem__, env={}, **kw),
    )
    for k in [k for k in os.environ if k.startswith("SLURM")]:
        monkeypatch.delenv(k)

    def run(env: dict[str, str] | None, wants: bool = True):
        for k, v in (env or {}).items():  # a plain node list: no scontrol here
            monkeypatch.setenv(k, "gpu01,gpu02,gpu03" if k == "SLURM_JOB_NODELIST" else v)
        monkeypatch.setattr(sl.SlurmLauncher, "wants_cluster", lambda self, o, s: wants)
        seen["jobs"].clear()
        seen["events"].clear()
        ret = sl.SlurmLauncher(submitit_folder="x")(["seed=0"], "hydra.sweep.dir", 0, "j0", {})
        return ret, seen

    return run


def test_a_job_of_one_task_runs_as_before(launcher):
    ret, seen = launcher(None)
    assert seen["jobs"] == [["seed=0"]] and seen["events"] == ["train"]
    assert ret.return_value == "trained"
    ret, seen = launcher(env_of(0, "gpu01", SLURM_NTASKS="1"))
    assert seen["jobs"] == [["seed=0"]] and seen["events"] == ["train"]


def test_task_0_trains_inside_its_head_cluster_on_the_address_it_set(launcher):
    ret, seen = launcher(env_of(0, "gpu01"))
    assert seen["events"] == [("head up", 0), "train", "head down"]
    assert seen["jobs"] == [["seed=0", "scheduler.ray_address=auto"]]
    assert ret.return_value == "trained"


def test_other_tasks_serve_a_ray_node_and_never_train(launcher):
    ret, seen = launcher(env_of(2, "gpu03"))
    assert seen["events"] == [("worker", 2)] and seen["jobs"] == []
    assert ret.return_value["left"] == "the head's cluster ended"


def test_without_ray_task_0_trains_alone_and_the_others_end(launcher):
    _, seen = launcher(env_of(0, "gpu01"), wants=False)
    assert seen["events"] == ["train"] and seen["jobs"] == [["seed=0"]]
    ret, seen = launcher(env_of(1, "gpu02"), wants=False)
    assert seen["events"] == [] and ret.return_value is None


def test_srun_binds_each_task_to_the_cpus_the_job_asked_for(tmp_path):
    """Through the shipped launcher configs: the job script's srun line says --cpus-per-task
    (Slurm 22.05-23.02's srun does not take it from the batch script's environment)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate
    from submitit.slurm.slurm import _make_sbatch_string

    from ebrl.train import CONF_DIR

    for launcher in ("slurm", "slurm_gres"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(
                "config",
                [f"launcher={launcher}", "launcher.cpus_per_task=3"],
                return_hydra_config=True,
            )
        lau = instantiate(cfg.hydra.launcher, submitit_folder=str(tmp_path))
        assert lau.params["srun_args"] == ["--cpus-per-task=3"], launcher
        text = _make_sbatch_string(
            command="python -u job.py", folder=str(tmp_path), srun_args=lau.params["srun_args"]
        )
        (srun,) = [ln for ln in text.splitlines() if ln.startswith("srun ")]
        assert "--cpus-per-task=3" in srun.split(), srun
    GlobalHydra.instance().clear()
    # the user's own srun flag wins; no CPU count, no flag
    from hydra_plugins.ebrl_launcher.slurm_launcher import srun_args

    assert srun_args(4, ["--cpus-per-task=8", "--cpu-bind=cores"]) == [
        "--cpus-per-task=8",
        "--cpu-bind=cores",
    ]
    assert srun_args(None) == [] and srun_args(2, ["--mpi=none"]) == [
        "--mpi=none",
        "--cpus-per-task=2",
    ]


# --- the dry run ------------------------------------------------------------------------------
def test_dry_run_says_a_two_node_job_starts_a_ray_cluster():
    from ebrl.job_gpus import IDLE_OK
    from ebrl.launch.preview import describe
    from ebrl.launch.sweep import plan

    # sync on 16 GPUs uses one: the dry run refuses it unless let through (issue 43)
    p = plan(
        "scaling_full",
        ["+axis/scale=g16", "scheduler=ebrl,colocated,sync", "seed=0", IDLE_OK + "=true"],
    )
    assert not p.errors
    text = describe(p, dry_run=True)
    print(text)
    assert "#SBATCH --nodes=2" in text and "(2 tasks per job:" in text
    ebrl, colocated, sync = (p.roles[j.index] for a in p.arrays for j in a.jobs)
    # EBRL's workers and Colocated's 16 ranks (Ray actors) run over both nodes
    for roles in (ebrl, colocated):
        assert "starts a Ray cluster over its 2 nodes" in roles
        assert "scheduler.ray_address=auto" in roles
    assert "no Ray cluster" in sync
    # a one-node job says nothing of a cluster
    p = plan("scaling_full", ["+axis/scale=g8", "scheduler=ebrl", "seed=0"])
    assert "Ray cluster" not in describe(p, dry_run=True)


def test_nodes_command_usage():
    out = subprocess.run(
        [sys.executable, "-m", "ebrl.runtime.slurm_cluster"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "usage" in out.stderr


# --- a real two-node Ray cluster with token authentication, from a fresh home -----------------
#: one task of a two-task Slurm job on this machine, doing what the launcher does in it:
#: argv: the job's shared folder, the join timeout (s). Task 0 runs a task on task 1's node.
TASK_OF_TWO = textwrap.dedent(
    """
    import dataclasses, json, os, stat, sys
    from ebrl.runtime import slurm_cluster as sc, slurm_env, slurm_plan

    t = slurm_env.slurm_task(os.environ)
    plan = slurm_plan.plan_node(t, shared_dir=sys.argv[1])  # the launcher's: Submitit's job folder
    if not t.head:
        rep = sc.serve_worker(plan, join_timeout_s=float(sys.argv[2]), leave_after_s=3.0)
        print("REPORT", json.dumps(dataclasses.asdict(rep)), flush=True)
        sys.exit(0)
    with sc.head_cluster(plan, timeout_s=float(sys.argv[2])) as nodes:
        import ray

        @ray.remote(num_cpus=0, resources={"slurm_task_1": 1})
        def where():
            return ray.get_runtime_context().get_node_id()

        token = os.environ["RAY_AUTH_TOKEN_PATH"]
        mode = oct(stat.S_IMODE(os.stat(token).st_mode))
        ray.init(address="auto", log_to_driver=False)
        try:
            ran_on = ray.get(where.remote(), timeout=120)
        finally:
            ray.shutdown()
    print("REPORT", json.dumps({"nodes": nodes, "ran_on": ran_on, "token": token,
                                "mode": mode}), flush=True)
    """
)


def report_of(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("REPORT ")]
    assert lines, out[-6000:]
    return json.loads(lines[-1].removeprefix("REPORT "))


@pytest.mark.slow
def test_a_two_node_ray_cluster_with_token_auth_starts_from_a_fresh_home(tmp_path):
    """Two Slurm tasks on this machine, each a Ray node started by slurm_cluster's own code;
    no token anywhere beforehand (a fresh HOME, no RAY_AUTH_* variable)."""
    home, shared = tmp_path / "home", tmp_path / "submitit"
    home.mkdir()
    shared.mkdir()
    job = 7_000_000 + os.getpid() % 100_000
    host = socket.gethostname().split(".")[0]
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "SLURM")) and k != "CUDA_VISIBLE_DEVICES"
    }
    base |= {
        "HOME": str(home),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
        "SLURM_JOB_ID": str(job),
        "SLURM_NTASKS": "2",
        "SLURMD_NODENAME": host,
        "SLURM_JOB_NODELIST": f"{host},{host}",
        "SLURM_CPUS_PER_TASK": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TASK_OF_TWO, str(shared), "120"],
            env=base | {"SLURM_PROCID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=400)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(f"/tmp/ray-ebrl-{job}", ignore_errors=True)
    print("\n".join(outs))
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)[-8000:]
    head, worker = report_of(outs[0]), report_of(outs[1])
    nodes = {n["node_id"]: n for n in head["nodes"]}
    assert len(nodes) == 2
    (task1,) = [i for i, n in nodes.items() if "slurm_task_1" in n["resources"]]
    assert head["ran_on"] == task1  # the driver reached task 1's node through the cluster
    assert worker["left"] == "the head's cluster ended" and worker["joined_s"] is not None
    # the job's own token, in its shared folder, the owner's alone; gone with the cluster
    assert head["token"] == str(shared / f"{job}_ray_auth_token") and head["mode"] == "0o600"
    assert not Path(head["token"]).exists() and not (home / ".ray" / "auth_token").exists()
