"""A Ray cluster over the nodes of a multi-task Slurm job: one Ray node per Slurm task.

A job with ``launcher.nodes > 1`` (one task per node) runs the same pickled Submitit job in
every task. ebrl's Slurm launcher (``hydra_plugins/ebrl_launcher/slurm_launcher.py``) calls this
module in each of them when the job's scheduler runs its workers on Ray (:func:`wants_cluster`):

* **task 0** (``SLURM_PROCID=0``) starts the Ray head on its node (``ray start --head --block``:
  the GCS on a port derived from the job id, :func:`~ebrl.runtime.slurm_plan.head_port`; the
  node's CPUs and GPUs), waits until every task's node has joined, then trains with
  ``scheduler.ray_address=auto`` and ``RAY_ADDRESS`` naming the head; when training ends
  (finished, failed or stopped) it stops the head (:func:`head_cluster`);
* **every other task** starts a Ray worker node that joins the head (``ray start
  --address=<head>:<port> --block``) and leaves when the head is gone: it stops its node and
  ends, without training (:func:`serve_worker`).

What each task does is a pure function of its Slurm environment and its host's network, in two
modules: :mod:`ebrl.runtime.slurm_env` reads the task (:func:`~ebrl.runtime.slurm_env.slurm_task`:
its rank, nodes, CPUs, GPUs), :mod:`ebrl.runtime.slurm_plan` makes its Ray node's plan
(:func:`~ebrl.runtime.slurm_plan.plan_node`: addresses, port, ``ray start`` command line and
environment, the job's token). :mod:`ebrl.runtime.ray_node` runs that node as the task's child,
which never outlives it; this module runs the task's part: :func:`head_cluster` in task 0,
:func:`serve_worker` in the others.

Run as ``python -m ebrl.runtime.slurm_cluster nodes <address> <count> <timeout_s>``, it
connects to a cluster, waits until ``count`` nodes are alive and prints them as JSON (the head
task's start-up check, kept out of the driver's process).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ebrl.runtime.ray_node import RayNode
from ebrl.runtime.slurm_env import ClusterError, describe_cpus, say
from ebrl.runtime.slurm_plan import (
    AUTH_MODE_VAR,
    AUTH_TOKEN_PATH_VAR,
    AUTH_TOKEN_VAR,
    RESOURCE_PREFIX,
    NodePlan,
    ensure_token,
    wait_for_token,
)

#: how long the head waits for every node to join, and a worker for the head to answer
JOIN_TIMEOUT_S = 300.0
#: a worker leaves once the head's GCS port has refused connections for this long
LEAVE_AFTER_S = 10.0
#: the override the head task adds to its job: the driver joins the cluster RAY_ADDRESS names
ADDRESS_OVERRIDE = "scheduler.ray_address=auto"
#: ``scheduler.ray_address`` values that let the job choose the cluster ("local": the default,
#: "auto": asked for); any other address is a cluster the user runs, left alone
_JOB_ADDRESSES = ("local", "auto")


# --- which jobs get a cluster -----------------------------------------------------------------
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


# --- the head task ----------------------------------------------------------------------------
def port_open(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host:port`` accepts a TCP connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


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

    Before the head starts, its token exists (:func:`~ebrl.runtime.slurm_plan.ensure_token`):
    ``ray start --head`` makes none and refuses to start without one. Inside the block
    ``RAY_ADDRESS`` (and ``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``) name the cluster, so a
    driver with ``ray_address=auto`` joins it. A stop signal while the cluster starts raises
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
