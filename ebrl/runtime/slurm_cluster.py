"""A Ray cluster over the nodes of a multi-task Slurm job: one Ray node per Slurm task.

A job with ``launcher.nodes > 1`` (one task per node) runs the same pickled Submitit job in
every task. ebrl's Slurm launcher (``hydra_plugins/ebrl_launcher/slurm_launcher.py``) calls this
module in each of them when the job's scheduler runs its workers on Ray (:func:`wants_cluster`):

* **task 0** (``SLURM_PROCID=0``) starts the Ray head on its node (``ray start --head --block``:
  the GCS on a port derived from the job id, :func:`head_port`; the node's CPUs and GPUs),
  waits until every task's node has joined, then trains with ``scheduler.ray_address=auto`` and
  ``RAY_ADDRESS`` naming the head; when training ends (finished, failed or stopped) it stops
  the head (:func:`head_cluster`);
* **every other task** starts a Ray worker node that joins the head (``ray start
  --address=<head>:<port> --block``) and leaves when the head is gone: it stops its node and
  ends, without training (:func:`serve_worker`).

What each task does is a pure function of its Slurm environment and its host's network
(:func:`slurm_task`, :func:`plan_node`, :meth:`NodePlan.command`, :meth:`NodePlan.environment`);
:class:`RayNode`, :func:`head_cluster` and :func:`serve_worker` run it.

* **Addresses.** A node's address is one its peers reach: its host name's address unless that
  is loopback (Debian and Ubuntu map the host's own name to 127.0.1.1 in ``/etc/hosts``, which
  Ray does not replace), else the address this host routes to the job's other nodes from, else
  its first address that is not loopback; ``EBRL_RAY_INTERFACE=<name>`` (in
  ``launcher.setup``) picks an interface instead (:func:`node_address`).
* **CPUs.** A Ray node gets the CPUs its task may run on (``os.sched_getaffinity``), at most
  the ``SLURM_CPUS_PER_TASK`` Slurm granted: on Slurm 22.05-23.02 an ``srun`` without
  ``--cpus-per-task`` may bind a task to fewer (one, where a node runs several tasks) while the
  variable still says what the job asked for.
* **Token.** Ray's token authentication is on (``RAY_AUTH_MODE=token``), and ``ray start``
  makes no token: task 0 writes a fresh one into the job's shared folder (Submitit's, which
  every task reads its job from) before it starts the head, and every node and the driver read
  it through ``RAY_AUTH_TOKEN_PATH`` (:meth:`NodePlan.environment`).

No orphans: every ``ray start --block`` is its task's child and gets SIGTERM when the task
dies, however it dies (the kernel's parent-death signal); ``ray start``'s own SIGTERM handler
then ends its node's processes, and :meth:`RayNode.stop` ends any left by PID. The task also
keeps the orphan watchdog (:mod:`ebrl.runtime.watchdog`) over everything below it. SIGUSR2
(Submitit's time-limit warning, which Slurm sends to every process of the job) is ignored by the
Ray nodes: it asks the driver to checkpoint, not the cluster to fall away under it.

Run as ``python -m ebrl.runtime.slurm_cluster nodes <address> <count> <timeout_s>``, it
connects to a cluster, waits until ``count`` nodes are alive and prints them as JSON (the head
task's start-up check, kept out of the driver's process).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

#: GCS port of a job's head: ``PORT_BASE + job id mod PORT_SPAN`` (the Ray client server takes
#: the next port). Above Ray's default worker ports (10002-19999) and below Linux's ephemeral
#: range (from 32768), where outgoing connections and Ray's randomly chosen ports land.
PORT_BASE = 20000
PORT_SPAN = 12000
#: how long the head waits for every node to join, and a worker for the head to answer
JOIN_TIMEOUT_S = 300.0
#: a worker leaves once the head's GCS port has refused connections for this long
LEAVE_AFTER_S = 10.0
#: how long ``ray start`` has to end its node's processes after SIGTERM before SIGKILL
STOP_TIMEOUT_S = 30.0
#: the custom Ray resource each node gets, naming the Slurm task that started it
#: (``slurm_task_1: 1``): placement can pin a role to a task's node with it
RESOURCE_PREFIX = "slurm_task_"
#: the override the head task adds to its job: the driver joins the cluster RAY_ADDRESS names
ADDRESS_OVERRIDE = "scheduler.ray_address=auto"
#: ``scheduler.ray_address`` values that let the job choose the cluster ("local": the default,
#: "auto": asked for); any other address is a cluster the user runs, left alone
_JOB_ADDRESSES = ("local", "auto")
_PR_SET_PDEATHSIG = 1
#: names the network interface whose address a node gives Ray (set in ``launcher.setup``)
INTERFACE_VAR = "EBRL_RAY_INTERFACE"
#: Ray's variables for its token: the mode, the token itself, the file that holds it
AUTH_MODE_VAR, AUTH_TOKEN_VAR, AUTH_TOKEN_PATH_VAR = (
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
)


class ClusterError(RuntimeError):
    """The job's Ray cluster could not be started or joined."""


def say(message: str) -> None:
    """One line in the task's log (Submitit's ``<job>_<task>_log.out``): before Hydra sets up
    logging, and in worker tasks that never run Hydra's job, print is what reaches the file."""
    print(f"ebrl slurm_cluster: {message}", flush=True)


# --- the Slurm environment (pure) -------------------------------------------------------------
@dataclass(frozen=True)
class SlurmTask:
    """What Slurm tells one task of a multi-task job, parsed from its environment.

    Attributes:
        job_id: ``SLURM_JOB_ID`` (unique per array element; unchanged by a requeue).
        procid: ``SLURM_PROCID``, the task's rank; 0 starts the head.
        ntasks: ``SLURM_NTASKS``, the Ray nodes the cluster will have.
        node: ``SLURMD_NODENAME``, the node this task runs on.
        hosts: the step's nodes in order (``scontrol show hostnames``); task 0 runs on the
            first (Slurm's default block distribution).
        cpus: CPUs for this task's Ray node: those it may run on (its CPU affinity), at most
            ``slurm_cpus``.
        gpus: GPUs for this task's Ray node (the entries of ``CUDA_VISIBLE_DEVICES``).
        tmp: the node's temporary folder (``TMPDIR``, else /tmp), for Ray's session files.
        slurm_cpus: the CPUs Slurm says the task has (``SLURM_CPUS_PER_TASK``, else
            ``SLURM_CPUS_ON_NODE``; 0: not given).
    """

    job_id: int
    procid: int
    ntasks: int
    node: str
    hosts: tuple[str, ...]
    cpus: int
    gpus: int
    tmp: str = "/tmp"
    slurm_cpus: int = 0

    @property
    def head(self) -> bool:
        return self.procid == 0


def gpu_count(cuda_visible_devices: str | None) -> int:
    """GPUs a ``CUDA_VISIBLE_DEVICES`` value names (unset, empty or Slurm's ``NoDevFiles``: 0)."""
    if not cuda_visible_devices or cuda_visible_devices.strip() == "NoDevFiles":
        return 0
    return len([d for d in cuda_visible_devices.split(",") if d.strip()])


def scontrol_hostnames(nodelist: str) -> list[str]:
    """A Slurm node list (``gpu[01-02],cpu07``) expanded by ``scontrol show hostnames``; a plain
    comma-separated list needs no scontrol."""
    if not any(c in nodelist for c in "[]"):
        return [h for h in nodelist.split(",") if h]
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise ClusterError(f"cannot expand the node list {nodelist!r} with scontrol: {e}") from e
    return out.stdout.split()


def affinity_cpus() -> int | None:
    """How many CPUs this process may run on (None where the system does not say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def slurm_task(
    env: Mapping[str, str],
    hostnames: Callable[[str], list[str]] = scontrol_hostnames,
    usable_cpus: Callable[[], int | None] = affinity_cpus,
) -> SlurmTask | None:
    """This task of a multi-task Slurm job (None outside Slurm, or in a job of one task).

    Args:
        env: the task's environment (``os.environ``).
        hostnames: expands a Slurm node list (default: :func:`scontrol_hostnames`).
        usable_cpus: how many CPUs the task may run on (default: its CPU affinity).

    Raises:
        ClusterError: a multi-task job whose environment lacks what a cluster needs.
    """
    ntasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    if not ntasks or int(ntasks) <= 1:
        return None
    nodelist = (
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    )
    cpus = env.get("SLURM_CPUS_PER_TASK") or env.get("SLURM_CPUS_ON_NODE")
    need = {
        "SLURM_PROCID": env.get("SLURM_PROCID"),
        "SLURM_JOB_ID": env.get("SLURM_JOB_ID"),
        "SLURMD_NODENAME": env.get("SLURMD_NODENAME"),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_CPUS_ON_NODE": cpus,
    }
    missing = [k for k, v in need.items() if not v]
    if missing:
        raise ClusterError(
            f"a job of {ntasks} Slurm tasks, but its environment has no {', '.join(missing)}: "
            "cannot start a Ray cluster over its nodes (run it through sbatch/srun)"
        )
    hosts = tuple(hostnames(str(nodelist)))
    if not hosts:
        raise ClusterError(f"the node list {nodelist!r} names no node")
    granted = int(str(cpus))
    usable = usable_cpus()
    return SlurmTask(
        job_id=int(str(need["SLURM_JOB_ID"])),
        procid=int(str(need["SLURM_PROCID"])),
        ntasks=int(ntasks),
        node=str(need["SLURMD_NODENAME"]),
        hosts=hosts,
        # a task bound to fewer CPUs than Slurm says would run Ray's workers on those alone
        cpus=min(granted, usable) if usable else granted,
        gpus=gpu_count(env.get("CUDA_VISIBLE_DEVICES")),
        tmp=env.get("TMPDIR") or "/tmp",
        slurm_cpus=granted,
    )


def describe_cpus(task: SlurmTask) -> str:
    """``96 CPUs``, or ``1 CPUs (bound to 1 of the 96 Slurm granted)`` for a log line."""
    if task.slurm_cpus and task.cpus < task.slurm_cpus:
        return (
            f"{task.cpus} CPUs (the task is bound to {task.cpus} of the {task.slurm_cpus} "
            "Slurm granted: see srun's --cpus-per-task)"
        )
    return f"{task.cpus} CPUs"


def head_port(job_id: int) -> int:
    """The GCS port of job ``job_id``'s head: the same in every task and every attempt of the
    job, without any task having to tell the others."""
    return PORT_BASE + job_id % PORT_SPAN


@dataclass(frozen=True)
class NodePlan:
    """The Ray node one task starts.

    Attributes:
        task: the task.
        head_address: ``<ip>:<port>`` of the head's GCS.
        node_ip: this node's address (``--node-ip-address``).
        temp_dir: Ray's session folder on the node, one per job: a job's processes never share
            ``session_latest`` or ``ray_current_cluster`` with another Ray instance there.
        resources: the node's custom Ray resources (``slurm_task_<procid>: 1``).
        token_path: the job's token file in its shared folder: task 0 writes it before it
            starts the head, every node and the driver read it (``RAY_AUTH_TOKEN_PATH``); None
            where the token is not the job's to make (:func:`token_path`).
    """

    task: SlurmTask
    head_address: str
    node_ip: str
    temp_dir: str
    resources: Mapping[str, float] = field(default_factory=dict)
    token_path: str | None = None

    @property
    def port(self) -> int:
        return int(self.head_address.rsplit(":", 1)[1])

    @property
    def head_host(self) -> str:
        return self.head_address.rsplit(":", 1)[0]

    def command(self, python: str = sys.executable) -> list[str]:
        """The ``ray start --block`` command line of this node."""
        t = self.task
        cmd = [
            python,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            f"--node-ip-address={self.node_ip}",
            f"--num-cpus={t.cpus}",
            f"--num-gpus={t.gpus}",
            f"--resources={json.dumps(dict(self.resources), sort_keys=True)}",
            f"--temp-dir={self.temp_dir}",
            # Ray's fixed default (52365) would clash between two nodes on one host and with
            # any other Ray instance there: 0 lets Ray choose a free port
            "--dashboard-agent-listen-port=0",
            "--disable-usage-stats",
        ]
        if t.head:
            cmd += [
                "--head",
                f"--port={self.port}",
                f"--ray-client-server-port={self.port + 1}",
                "--include-dashboard=false",
            ]
        else:
            cmd += [f"--address={self.head_address}"]
        return cmd

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment of ``ray start`` (and of the head task's driver), from ``base``.

        * ``RAY_AUTH_MODE``: kept when set; else ``token``. Ray (2.60, seen here) turns token
          authentication on for a cluster that ``ray start --head`` starts while the mode is
          unset, but a process that joins with the mode unset sends no token and is refused
          (``InvalidAuthToken``): every process of the cluster must say the same.
        * ``RAY_AUTH_TOKEN_PATH``: the job's token file (:attr:`token_path`), when there is
          one. ``ray start`` never makes a token (only a local ``ray.init()`` writes
          ``~/.ray/auth_token``): without one the head refuses to start.
        * ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0``: on SIGTERM ``ray start`` would otherwise
          drain its node for up to 30 s (for Ray Serve's proxies) before ending it.
        """
        env = dict(base)
        env.setdefault(AUTH_MODE_VAR, "token")
        if self.token_path is not None:
            env[AUTH_TOKEN_PATH_VAR] = self.token_path
        env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
        return env


# --- the node's address -----------------------------------------------------------------------
def is_loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def route_source(peer: str) -> str | None:
    """The address this host sends to ``peer`` from, by the kernel's routing table (a UDP
    socket's connect sends nothing); None if there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def interface_addresses() -> dict[str, list[str]]:
    """IPv4 addresses of this host's interfaces that are up, by interface name."""
    import psutil

    up = {name for name, st in psutil.net_if_stats().items() if st.isup}
    return {
        name: [a.address for a in addrs if a.family == socket.AF_INET]
        for name, addrs in psutil.net_if_addrs().items()
        if name in up
    }


def node_address(
    task: SlurmTask,
    resolve: Callable[[str], str] = socket.gethostbyname,
    route: Callable[[str], str | None] = route_source,
    interfaces: Callable[[], Mapping[str, Sequence[str]]] = interface_addresses,
    env: Mapping[str, str] = os.environ,
) -> str:
    """The address of this task's Ray node: one the job's other nodes reach.

    In order: the IPv4 address of the interface ``EBRL_RAY_INTERFACE`` names; the node's name
    resolved, unless it is loopback (Debian's and Ubuntu's ``/etc/hosts`` give 127.0.1.1 for the
    host's own name, which Ray does not replace); the address this host routes to the job's
    other nodes from; its first address that is not loopback. Tasks that share one host all
    get the same answer, and loopback is enough for them when it is all there is.

    Raises:
        ClusterError: the named interface has no IPv4 address here, or a job over several
            hosts finds only loopback on this one.
    """
    iface = env.get(INTERFACE_VAR)
    if iface:
        have = interfaces()
        addrs = [a for a in have.get(iface, ()) if a]
        if not addrs:
            named = ", ".join(sorted(n for n, a in have.items() if a and n != "lo")) or "none"
            raise ClusterError(
                f"{INTERFACE_VAR}={iface}: node {task.node} has no interface {iface} with an "
                f"IPv4 address (interfaces with one: {named}); set {INTERFACE_VAR} in "
                "launcher.setup to an interface every node of the job has"
            )
        return addrs[0]
    own = resolve(task.node)
    if not is_loopback(own):
        return own
    others = list(dict.fromkeys(h for h in task.hosts if h != task.node))
    for host in others[:8]:  # the head's host first; a few are enough to find the route
        try:
            peer = resolve(host)
        except OSError:
            continue
        if not is_loopback(peer) and (src := route(peer)) and not is_loopback(src):
            return src
    for _, addrs in sorted(interfaces().items()):
        for a in addrs:
            if a and not is_loopback(a):
                return a
    if others:
        raise ClusterError(
            f"node {task.node} resolves to {own}, a loopback address, and has no other IPv4 "
            "address: the job's other nodes could not reach its Ray node; set "
            f"{INTERFACE_VAR}=<interface> in launcher.setup (e.g. export {INTERFACE_VAR}=eth0)"
        )
    return own


def token_path(task: SlurmTask, env: Mapping[str, str], shared_dir: str | None) -> str | None:
    """The job's token file, ``<shared_dir>/<job id>_ray_auth_token``, where the job must make
    the token: token authentication on (``RAY_AUTH_MODE`` unset or ``token``) and no token
    given (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``: the user's, left to Ray). None when no
    shared folder is known: the head then makes Ray's own default file if it is missing
    (:func:`ensure_token`), which every node reads only on a shared home."""
    if env.get(AUTH_MODE_VAR, "token").lower() != "token":
        return None
    if env.get(AUTH_TOKEN_VAR) or env.get(AUTH_TOKEN_PATH_VAR) or not shared_dir:
        return None
    return os.path.join(shared_dir, f"{task.job_id}_ray_auth_token")


def plan_node(
    task: SlurmTask,
    resolve: Callable[[str], str] = socket.gethostbyname,
    *,
    route: Callable[[str], str | None] = route_source,
    interfaces: Callable[[], Mapping[str, Sequence[str]]] = interface_addresses,
    env: Mapping[str, str] = os.environ,
    shared_dir: str | None = None,
) -> NodePlan:
    """The Ray node ``task`` starts.

    Args:
        task: this task (:func:`slurm_task`).
        resolve: host name -> IP address (default: the system's resolver).
        route: peer address -> the address this host sends to it from (:func:`route_source`).
        interfaces: this host's IPv4 addresses by interface (:func:`interface_addresses`).
        env: the task's environment (``EBRL_RAY_INTERFACE``, Ray's token variables).
        shared_dir: a folder every task of the job reads (Submitit's job folder), for the
            job's token (:func:`token_path`).

    Raises:
        ClusterError: task 0 does not run on the step's first node (every task computes the
            head's address from that node's name), or no address the job's nodes reach
            (:func:`node_address`).
    """
    head_host = task.hosts[0]
    if task.head and task.node != head_host:
        raise ClusterError(
            f"task 0 runs on {task.node}, but the job's first node is {head_host}: the other "
            "tasks would look for the Ray head there (Slurm's default block distribution puts "
            "task 0 on the first node; do not set --distribution)"
        )
    node_ip = node_address(task, resolve, route, interfaces, env)
    if task.node == head_host:  # the head's host: the same choice as the head's own
        head_ip = node_ip
    else:
        head_ip = resolve(head_host)
        if is_loopback(head_ip):
            raise ClusterError(
                f"the head's node {head_host} resolves to {head_ip} on {task.node}, a loopback "
                f"address: this node cannot reach the Ray head; fix the name's entry in "
                f"{task.node}'s /etc/hosts or DNS"
            )
    return NodePlan(
        task=task,
        head_address=f"{head_ip}:{head_port(task.job_id)}",
        node_ip=node_ip,
        temp_dir=f"{task.tmp.rstrip('/')}/ray-ebrl-{task.job_id}",
        resources={f"{RESOURCE_PREFIX}{task.procid}": 1.0},
        token_path=token_path(task, env, shared_dir),
    )


def wants_cluster(scheduler: Mapping[str, Any] | None) -> bool:
    """Whether a job's scheduler runs its workers on Ray and lets the job choose the cluster:
    ``backend: ray`` and ``ray_address`` ``local`` (the default) or ``auto``. A scheduler without
    Ray (sync, and Colocated with one rank: every stage in the driver) or with a cluster address
    of its own gets no cluster from the job; Colocated's ranks (``ranks`` >= 2) are Ray actors."""
    if not scheduler or "ray_address" not in scheduler:
        return False
    if int(scheduler.get("ranks", 2) or 2) < 2:  # Colocated in one process
        return False
    return (
        str(scheduler.get("backend", "ray")) == "ray"
        and str(scheduler["ray_address"]) in _JOB_ADDRESSES
    )


def describe_job(nodes: int, tasks_per_node: int, scheduler: Mapping[str, Any] | None) -> str:
    """What a Slurm job of ``nodes`` x ``tasks_per_node`` tasks does about Ray, for the dry run
    ("" for a job of one task)."""
    n = nodes * tasks_per_node
    if n <= 1:
        return ""
    where = f"{nodes} nodes" if tasks_per_node == 1 else f"{nodes} node(s) x {tasks_per_node} tasks"
    others = "task 1" if n == 2 else f"tasks 1-{n - 1}"
    if wants_cluster(scheduler):
        return (
            f"starts a Ray cluster over its {where} ({n} Ray nodes, one per Slurm task: task 0 "
            f"starts the head, {others} join(s) it; the driver joins with {ADDRESS_OVERRIDE})"
        )
    return (
        f"{n} Slurm tasks but no Ray cluster (its scheduler does not run on Ray, or names its "
        f"own ray_address): task 0 trains, {others} end(s) at once"
    )


# --- the token -------------------------------------------------------------------------------
def write_token(path: str) -> bool:
    """Make the token file ``path`` (a fresh random token, readable by its owner alone) unless
    it is there; returns whether it was made. Written whole, then renamed into place: a node
    that reads it sees all of it or nothing."""
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return False
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # what `ray get-auth-token --generate` writes: 256 random bits, hex
        os.write(fd, secrets.token_hex(32).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return True


def ensure_token(plan: NodePlan, env: Mapping[str, str]) -> str | None:
    """Task 0, before ``ray start --head``: the token file the cluster will use, made if
    missing; returns its path if this call made it (None: it was there, or the token is not a
    file's). The job's own file (:attr:`NodePlan.token_path`) when it has one, else the file Ray
    reads by default (``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), as a local
    ``ray.init()`` would make it; none under ``RAY_AUTH_TOKEN`` or another mode."""
    if env.get(AUTH_MODE_VAR, "token").lower() != "token" or env.get(AUTH_TOKEN_VAR):
        return None
    path = plan.token_path or env.get(AUTH_TOKEN_PATH_VAR)
    if not path:
        home = env.get("HOME") or os.path.expanduser("~")
        path = os.path.join(home, ".ray", "auth_token")
    return path if write_token(path) else None


def wait_for_token(path: str, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Whether the token file ``path`` is readable and not empty within ``timeout_s`` (a
    network file system may show a new file on another node a little later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            if os.path.getsize(path) > 0:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


# --- running a Ray node -----------------------------------------------------------------------
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before any fork (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _descendants(pid: int, names: dict[int, str] | None = None) -> dict[int, float]:
    """``pid: start time`` of every process below ``pid`` (empty if it is gone); their names
    go into ``names``."""
    import psutil

    out: dict[int, float] = {}
    with contextlib.suppress(psutil.Error):
        for c in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                out[c.pid] = c.create_time()
                if names is not None:
                    names[c.pid] = c.name()
    return out


class RayNode:
    """One ``ray start --block`` process, a child of this task.

    While it runs, the processes below it are recorded every ``interval`` s (by pid and start
    time), so that :meth:`stop` can end those it left even after ``ray start`` itself is gone
    (its children are then no longer its descendants).

    Args:
        command: the command line (:meth:`NodePlan.command`).
        env: its environment (:meth:`NodePlan.environment`; None: this process's).
        interval: seconds between two records of its processes.
    """

    def __init__(
        self, command: Sequence[str], env: Mapping[str, str] | None = None, interval: float = 1.0
    ) -> None:
        self.command = list(command)
        self.env = dict(env) if env is not None else None
        self.interval = interval
        self.proc: subprocess.Popen | None = None
        self.known: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._recorder: threading.Thread | None = None

    def _record(self) -> None:
        if self.proc is None:
            return
        names: dict[int, str] = {}
        found = _descendants(self.proc.pid, names)
        with self._lock:
            self.known.update(found)
            self.names.update(names)

    def _keep_recording(self) -> None:
        while not self._done.wait(self.interval) and self.alive():
            self._record()

    def start(self) -> None:
        prctl, parent = _prctl(), os.getpid()

        def in_child() -> None:
            # SIGTERM when this task dies, however it dies: ray start's handler then ends
            # its node's processes (which Ray fate-shares with ray start itself)
            if prctl is not None:
                prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the task died before the line above took effect
                os._exit(1)
            # Submitit's time-limit warning is the driver's business; an ignored signal stays
            # ignored across exec, down to the raylet and the actors it starts
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)

        self.proc = subprocess.Popen(
            self.command, env=self.env, stdin=subprocess.DEVNULL, preexec_fn=in_child
        )
        self._recorder = threading.Thread(
            target=self._keep_recording, name="ray-node-recorder", daemon=True
        )
        self._recorder.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM ``ray start`` (it ends its node's processes, then itself), SIGKILL it after
        ``timeout`` s, then end by PID whatever it left; returns its exit code."""
        from ebrl.runtime.watchdog import end_processes

        p = self.proc
        if p is None:
            return None
        self._done.set()
        if self._recorder is not None:
            self._recorder.join()
        self._record()
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        left = end_processes(self.known, grace=3.0)
        if left:
            what = ", ".join(f"{self.names.get(q, '?')} {q}" for q in sorted(left))
            say(f"ended {len(left)} process(es) the Ray node left behind: {what}")
        return p.returncode


def port_open(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host:port`` accepts a TCP connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --- the head task ----------------------------------------------------------------------------
def wait_for_nodes(
    address: str,
    count: int,
    timeout_s: float,
    alive: Callable[[], bool],
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The cluster's alive nodes once ``count`` have joined (``python -m
    ebrl.runtime.slurm_cluster nodes``, a child process: the driver's own ``ray.init`` comes
    later, in a process that never connected before).

    Raises:
        ClusterError: fewer than ``count`` nodes within ``timeout_s``, or the head (``alive``)
            ended meanwhile.
    """
    deadline = time.monotonic() + timeout_s
    host, port = address.rsplit(":", 1)
    while not port_open(host, int(port)):
        if not alive():
            raise ClusterError(
                f"the Ray head ended while starting (see its output above); {address} never "
                "answered"
            )
        if time.monotonic() > deadline:
            raise ClusterError(f"the Ray head at {address} did not answer within {timeout_s:.0f} s")
        time.sleep(0.5)
    left = max(deadline - time.monotonic(), 1.0)
    cmd = [sys.executable, "-m", __name__, "nodes", address, str(count), f"{left:.1f}"]
    with subprocess.Popen(
        cmd, env=None if env is None else dict(env), stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            while proc.poll() is None:
                if not alive():
                    raise ClusterError("the Ray head ended while its nodes were joining")
                if time.monotonic() > deadline + 60:  # its own deadline passed long ago
                    raise ClusterError(f"no answer from the Ray cluster at {address}")
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
        out = proc.stdout.read() if proc.stdout is not None else ""
    try:
        nodes = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
    except json.JSONDecodeError:
        nodes = []
    if proc.returncode != 0 or len(nodes) < count:
        raise ClusterError(
            f"{len(nodes)} of {count} Ray nodes joined the head at {address} within "
            f"{timeout_s:.0f} s ({describe_nodes(nodes) or 'none'}): see the other tasks' logs "
            "(<job>_<task>_log.out)"
        )
    return nodes


def describe_nodes(nodes: Sequence[Mapping[str, Any]]) -> str:
    """``task 0 (head) 10.0.0.3/1a2b3c4d 96 CPUs 8 GPUs; task 1 ...`` for a log line."""

    def tasks(n: Mapping[str, Any]) -> list[int]:
        res = n.get("resources") or {}
        return sorted(
            int(k.removeprefix(RESOURCE_PREFIX))
            for k in res
            if k.startswith(RESOURCE_PREFIX) and k.removeprefix(RESOURCE_PREFIX).isdigit()
        )

    parts = []
    for n in sorted(nodes, key=lambda n: (not n.get("head"), tasks(n) or [1 << 30])):
        res = n.get("resources") or {}
        mine = tasks(n)
        who = f"task {','.join(map(str, mine))}" if mine else "a node of no task"
        parts.append(
            f"{who}{' (head)' if n.get('head') else ''} {n.get('address')}/"
            f"{str(n.get('node_id'))[:8]} {res.get('CPU', 0):g} CPUs {res.get('GPU', 0):g} GPUs"
        )
    return "; ".join(parts)


@contextlib.contextmanager
def head_cluster(
    plan: NodePlan,
    *,
    environ: MutableMapping[str, str] = os.environ,
    node_factory: Callable[[Sequence[str], Mapping[str, str]], RayNode] = RayNode,
    wait_nodes: Callable[..., list[dict[str, Any]]] = wait_for_nodes,
    timeout_s: float = JOIN_TIMEOUT_S,
    watchdog: bool = True,
) -> Iterator[list[dict[str, Any]]]:
    """Task 0: start the head, wait for every task's node, point this process's Ray at it;
    stop the head when the block ends, however it ends.

    Before the head starts, its token exists (:func:`ensure_token`): ``ray start --head``
    makes none and refuses to start without one. Inside the block ``RAY_ADDRESS`` (and
    ``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``) name the cluster, so a driver with
    ``ray_address=auto`` joins it. A stop signal while the cluster starts raises
    :class:`ebrl.signals.Preempted` (after the head is stopped), as it would during training.
    The job's token file is removed when the head has stopped (a file an earlier attempt
    left, killed before it could remove it, is used as it is).

    Yields:
        The cluster's nodes (:func:`wait_for_nodes`).
    """
    from ebrl.runtime.watchdog import Watchdog
    from ebrl.signals import StopSignals

    env = plan.environment(environ)
    shared = ("RAY_ADDRESS", AUTH_MODE_VAR, AUTH_TOKEN_PATH_VAR)
    saved = {k: environ.get(k) for k in shared}
    dog = Watchdog() if watchdog else None
    node = node_factory(plan.command(), env)
    t0 = time.monotonic()
    made: str | None = None
    try:
        with StopSignals():
            try:
                made = ensure_token(plan, env)
            except OSError as e:
                raise ClusterError(f"cannot write the Ray cluster's token file: {e}") from e
            if made:
                say(f"task 0: wrote the Ray cluster's token to {made}")
            say(
                f"task 0 of {plan.task.ntasks}: starting the Ray head on {plan.task.node} "
                f"({plan.head_address}, {describe_cpus(plan.task)}, {plan.task.gpus} GPUs, "
                f"temp dir {plan.temp_dir})"
            )
            node.start()
            nodes = wait_nodes(plan.head_address, plan.task.ntasks, timeout_s, node.alive, env)
        say(
            f"Ray cluster up in {time.monotonic() - t0:.1f} s, {len(nodes)} nodes: "
            + describe_nodes(nodes)
        )
        environ["RAY_ADDRESS"] = plan.head_address
        for k in shared[1:]:
            if k in env:
                environ[k] = env[k]
        yield nodes
    finally:
        for k, v in saved.items():
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v
        code = node.stop()
        say(f"task 0: Ray head stopped (ray start exit code {code})")
        if plan.token_path is not None:  # the job's own, no use after its cluster (an
            # attempt killed before this line leaves it: the next attempt's head uses it)
            with contextlib.suppress(OSError):
                os.unlink(plan.token_path)
        if dog is not None:
            dog.stop()


# --- the other tasks --------------------------------------------------------------------------
@dataclass
class WorkerReport:
    """What a worker task saw (the task's Submitit result; printed in its log).

    Attributes:
        task: its Slurm task.
        node: the Slurm node it ran on.
        head: the head's address.
        joined_s: seconds until its Ray node started (None: the head never answered).
        served_s: seconds its Ray node ran.
        left: why it left.
        exit_code: ``ray start``'s exit code.
        signum: the stop signal the task received (None: none); the launcher ends the task
            by it.
    """

    task: int
    node: str
    head: str
    joined_s: float | None = None
    served_s: float = 0.0
    left: str = ""
    exit_code: int | None = None
    signum: int | None = None


@contextlib.contextmanager
def _stop_flag() -> Iterator[list[int]]:
    """SIGTERM and SIGINT recorded into the yielded list instead of Submitit's handlers (which
    ignore SIGTERM): a worker task that is told to stop, stops. USR2 is left to Submitit, which
    ignores it in every task but task 0."""
    got: list[int] = []
    saved: dict[int, Any] = {}

    def record(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    try:
        for s in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread
                saved[s] = signal.signal(s, record)
        yield got
    finally:
        for s, h in saved.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def serve_worker(
    plan: NodePlan,
    *,
    node_factory: Callable[[Sequence[str], Mapping[str, str]], RayNode] = RayNode,
    reachable: Callable[[str, int], bool] = port_open,
    environ: Mapping[str, str] = os.environ,
    join_timeout_s: float = JOIN_TIMEOUT_S,
    leave_after_s: float = LEAVE_AFTER_S,
    poll_s: float = 1.0,
    watchdog: bool = True,
) -> WorkerReport:
    """A task other than 0: wait for the head, join it with a Ray node, and keep that node
    until the head's cluster ends (its GCS refuses connections for ``leave_after_s``), the node
    ends, or the task is told to stop (SIGTERM, SIGINT); then stop the node. The node joins with
    the job's token, which task 0 wrote before its head answered.

    Raises:
        ClusterError: the head never answered within ``join_timeout_s``, the job's token file
            is not readable here (its folder is not shared with task 0's node), or this node
            ended by itself while the head still ran (it did not join, or it died).
    """
    from ebrl.runtime.watchdog import Watchdog

    t = plan.task
    host, port = plan.head_host, plan.port
    rep = WorkerReport(task=t.procid, node=t.node, head=plan.head_address)
    t0 = time.monotonic()
    node: RayNode | None = None
    dog = Watchdog() if watchdog else None
    try:
        with _stop_flag() as stop:
            say(f"task {t.procid} of {t.ntasks} on {t.node}: waiting for the Ray head at {host}")
            while not stop and not reachable(host, port):
                if time.monotonic() - t0 > join_timeout_s:
                    raise ClusterError(
                        f"task {t.procid}: the Ray head at {plan.head_address} did not answer "
                        f"within {join_timeout_s:.0f} s (see task 0's log)"
                    )
                time.sleep(poll_s)
            token = plan.token_path
            if not stop and token is not None:
                left = max(join_timeout_s - (time.monotonic() - t0), 0.0)
                if not wait_for_token(token, min(max(left, 30.0), join_timeout_s), poll_s):
                    raise ClusterError(
                        f"task {t.procid}: the Ray head answered, but its token file {token} "
                        f"is not readable on {t.node}: the job's folder (launcher's "
                        "submitit_folder) must be on a file system every node shares; or set "
                        f"{AUTH_TOKEN_PATH_VAR} (a file every node reads) or {AUTH_TOKEN_VAR} "
                        "in launcher.setup"
                    )
            if not stop:
                node = node_factory(plan.command(), plan.environment(environ))
                node.start()
                rep.joined_s = round(time.monotonic() - t0, 1)
                say(
                    f"task {t.procid}: Ray node started ({describe_cpus(t)}, {t.gpus} GPUs), "
                    f"joining {plan.head_address}"
                )
            seen, dead_at = time.monotonic(), None
            while node is not None and not stop:
                now = time.monotonic()
                if reachable(host, port):
                    seen = now
                elif now - seen >= leave_after_s:
                    rep.left = "the head's cluster ended"
                    break
                if dead_at is None and not node.alive():
                    dead_at = now  # Slurm's SIGTERM or the head's end may be on its way
                # twice the time it takes to tell the head is gone: a node that ended as the
                # head did (one signal to every process of the job) is not an error
                if dead_at is not None and now - dead_at >= 2 * leave_after_s:
                    raise ClusterError(
                        f"task {t.procid}: its Ray node ended (ray start exit code "
                        f"{node.exit_code()}) while the head at {plan.head_address} still runs"
                    )
                time.sleep(poll_s)
            if stop:
                rep.signum = stop[0]
                rep.left = f"stopped by {signal.Signals(stop[0]).name}"
    finally:
        if node is not None:
            rep.served_s = round(time.monotonic() - t0 - (rep.joined_s or 0.0), 1)
            rep.exit_code = node.stop()
        if dog is not None:
            dog.stop()
    say(
        f"task {t.procid}: left ({rep.left}) after {rep.served_s:.0f} s as a Ray node; "
        f"ray start exit code {rep.exit_code}"
    )
    return rep


# --- python -m ebrl.runtime.slurm_cluster nodes <address> <count> <timeout_s> -------------------
def _nodes(address: str, count: int, timeout_s: float) -> int:
    import logging

    import ray

    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            if len(alive) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        ray.shutdown()
    out = [
        {
            "node_id": n["NodeID"],
            "address": n.get("NodeManagerAddress", ""),
            "head": "node:__internal_head__" in (n.get("Resources") or {}),
            "resources": {
                k: v
                for k, v in (n.get("Resources") or {}).items()
                if k in ("CPU", "GPU") or k.startswith(RESOURCE_PREFIX)
            },
        }
        for n in alive
    ]
    print(json.dumps(out), flush=True)
    return 0 if len(alive) >= count else 3


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "nodes":
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'slurm_cluster'} nodes "
                 "<address> <count> <timeout_s>")  # fmt: skip
    sys.exit(_nodes(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
