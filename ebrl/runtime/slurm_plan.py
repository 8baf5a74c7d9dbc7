"""The Ray node one Slurm task starts: its address, the head's, its resources, its ``ray start``
command line and environment, and the job's token.

Every task of a multi-task job computes its own plan (:func:`plan_node`) from its
:class:`~ebrl.runtime.slurm_env.SlurmTask` and its host's network, without any task telling the
others anything: the head's address is the first node's, its port a function of the job id
(:func:`head_port`). :mod:`ebrl.runtime.slurm_cluster` runs the plan, as a
:class:`~ebrl.runtime.ray_node.RayNode`.

* **Addresses.** A node's address is one its peers reach: its host name's address unless that
  is loopback (Debian and Ubuntu map the host's own name to 127.0.1.1 in ``/etc/hosts``, which
  Ray does not replace), else the address this host routes to the job's other nodes from, else
  its first address that is not loopback; ``EBRL_RAY_INTERFACE=<name>`` (in
  ``launcher.setup``) picks an interface instead (:func:`node_address`).
* **Token.** Ray's token authentication is on (``RAY_AUTH_MODE=token``), and ``ray start``
  makes no token: task 0 writes a fresh one into the job's shared folder (Submitit's, which
  every task reads its job from) before it starts the head (:func:`ensure_token`), and every
  node and the driver read it through ``RAY_AUTH_TOKEN_PATH`` (:meth:`NodePlan.environment`,
  :func:`wait_for_token`).

The plan is pure (the network is read through functions a test replaces); the token's file is
made and awaited by the functions of the last section.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ebrl.runtime.slurm_env import ClusterError, SlurmTask

#: GCS port of a job's head: ``PORT_BASE + job id mod PORT_SPAN`` (the Ray client server takes
#: the next port). Above Ray's default worker ports (10002-19999) and below Linux's ephemeral
#: range (from 32768), where outgoing connections and Ray's randomly chosen ports land.
PORT_BASE = 20000
PORT_SPAN = 12000
#: the custom Ray resource each node gets, naming the Slurm task that started it
#: (``slurm_task_1: 1``): placement can pin a role to a task's node with it
RESOURCE_PREFIX = "slurm_task_"
#: names the network interface whose address a node gives Ray (set in ``launcher.setup``)
INTERFACE_VAR = "EBRL_RAY_INTERFACE"
#: Ray's variables for its token: the mode, the token itself, the file that holds it
AUTH_MODE_VAR, AUTH_TOKEN_VAR, AUTH_TOKEN_PATH_VAR = (
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
)


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
        task: this task (:func:`~ebrl.runtime.slurm_env.slurm_task`).
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
