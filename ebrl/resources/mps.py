"""An MPS control daemon on every node that hosts a role with a share of a GPU, for a run.

Side effects only; what the quotas are is ``ebrl.resources.sharing``'s to say.

Three layers, each stopping what it started on every exit:

* the keeper (``python -m ebrl.resources.mps``, :func:`keep`): a small process that joins the
  MPS daemon already serving this user on its node (its pipe directory read from the daemon's
  environment), or starts a private one (:class:`~ebrl.resources.apply.MPSDaemon`), reports
  one JSON line, then waits on its stdin. On ``stop``, or when the pipe closes because its
  parent died (SIGKILL included), it quits the daemon it started. It is detached from its
  parent's process tree and outlives the stop signals (:func:`detach`): whatever ends that tree
  (the orphan watchdog, a signal to every process of a job) must not end it before it has
  quit its daemon.
* :class:`NodeMPS`: a Ray actor pinned to one node (hard node affinity, no resources) that runs
  a keeper there. Ray ends a run's actors when their driver dies, and the keeper's pipe with it.
* :class:`ClusterMPS`: the driver's side: one :class:`NodeMPS` per machine that hosts a role
  with an SM quota, started before the roles, stopped after them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ebrl.resources.apply import MPS_CONTROL, MPSDaemon, MPSError, find_control_daemons

log = logging.getLogger(__name__)

#: where a daemon started without CUDA_MPS_PIPE_DIRECTORY listens (NVIDIA's default)
DEFAULT_PIPE = "/tmp/nvidia-mps"


@dataclass(frozen=True)
class NodeState:
    """What one node's keeper found or did.

    Attributes:
        state: ``started`` (a private daemon for this run), ``joined`` (one already served this
            user) or ``absent`` (none can serve: ``why`` says why).
        pipe: the daemon's ``CUDA_MPS_PIPE_DIRECTORY`` (None when absent).
        pids: the control daemon's pids (started or joined).
        why: why no daemon serves the node.
        node: the Ray node id.
        gpus: where no daemon serves it, the node's GPUs as NVML shows them there (MIG mode
            and instances: the fallback, ``ebrl.resources.sharing.mig_choice``).
    """

    state: str
    pipe: str | None = None
    pids: tuple[int, ...] = ()
    why: str = ""
    node: str = ""
    gpus: tuple[Any, ...] = ()

    @property
    def serves(self) -> bool:
        return self.state in ("started", "joined")


def pipe_of(pid: int) -> str:
    """The pipe directory of a running control daemon (from its environment; NVIDIA's default
    when it has none or cannot be read)."""
    import psutil

    try:
        return psutil.Process(pid).environ().get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE
    except psutil.Error:
        return DEFAULT_PIPE


def _wait_for_stop(stream: Any) -> None:
    """Block until ``stream`` says ``stop`` or closes (its writer died)."""
    while True:
        line = stream.readline()
        if line == "" or line.strip() == "stop":
            return


def keep(control: str = MPS_CONTROL, out: Any = None, inp: Any = None) -> int:
    """The keeper's body: join or start this node's daemon, report, wait, quit what it started.

    Args:
        control: the control binary (a name on PATH or a path).
        out: where the report line goes (default stdout).
        inp: the parent's pipe (default stdin).
    """
    out = out or sys.stdout
    inp = inp or sys.stdin
    # a handler that does nothing, not SIG_IGN: the daemon it forks must not inherit the
    # ignoring (a disposition survives exec, a handler does not)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(s, lambda *_: None)

    def report(**kw: Any) -> None:
        out.write(json.dumps({**kw, "keeper": os.getpid()}) + "\n")
        out.flush()

    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):  # the user points the run at their daemon
        report(state="joined", pipe=os.environ["CUDA_MPS_PIPE_DIRECTORY"], pids=[])
        _wait_for_stop(inp)
        return 0
    running = find_control_daemons(control)
    if running:
        report(state="joined", pipe=pipe_of(min(running)), pids=sorted(running))
        _wait_for_stop(inp)
        return 0
    path = shutil.which(control)
    if path is None:
        report(state="absent", why=f"no {os.path.basename(control)} on this node's PATH")
        return 0
    daemon = MPSDaemon(control=path)
    try:
        daemon.start()
    except MPSError as e:
        report(state="absent", why=f"the MPS daemon did not start ({e})")
        return 0
    try:
        report(state="started", pipe=str(daemon.pipe_dir), pids=sorted(daemon.pids))
        _wait_for_stop(inp)
    finally:
        daemon.stop()
    return 0


def detach() -> None:
    """Go on in a grandchild of the caller's parent, in a session of its own, so that nothing
    that ends the parent's process tree (the orphan watchdog ends a dead driver's descendants)
    ends the keeper before it has quit its daemon; its pipes go with it."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()


class Keeper:
    """A keeper process (the parent's side of :func:`keep`). It is detached (:func:`detach`):
    the parent holds its pipes, not its pid; its exit closes its stdout.

    Args:
        control: the control binary.
        timeout_s: how long the keeper may take to report.
    """

    def __init__(self, control: str = MPS_CONTROL, timeout_s: float = 30.0) -> None:
        import psutil

        env = dict(os.environ)
        if env.get("CUDA_VISIBLE_DEVICES") == "":  # Ray's for a process without GPUs: the
            del env["CUDA_VISIBLE_DEVICES"]  # daemon must see every GPU of the node
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ebrl.resources.mps", control],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.process: Any = None  # the detached keeper (psutil), once it reported
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)  # the launcher exits as soon as it forked the keeper
        try:
            got = json.loads(line)
        except json.JSONDecodeError:
            got = {"state": "absent", "why": f"the MPS keeper did not report in {timeout_s:g} s"}
        with contextlib.suppress(KeyError, psutil.Error):
            self.process = psutil.Process(int(got["keeper"]))
        if "keeper" not in got:
            self.stop()
        self.state = NodeState(
            state=str(got["state"]),
            pipe=got.get("pipe"),
            pids=tuple(int(p) for p in got.get("pids", ())),
            why=str(got.get("why", "")),
        )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def stop(self, timeout_s: float = 20.0) -> None:
        """Tell the keeper to quit its daemon; wait until it exits (its stdout closes); kill it
        past ``timeout_s``."""
        import psutil

        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write("stop\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        out = self.proc.stdout
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(OSError, ValueError):
            while time.monotonic() < deadline:
                ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
                if ready and out.readline() == "":  # type: ignore[union-attr]
                    break  # EOF: the keeper exited
        if self.process is not None:  # its stdout closes a moment before it is gone
            with contextlib.suppress(psutil.Error):
                self.process.wait(timeout=max(1.0, deadline - time.monotonic()))
            with contextlib.suppress(psutil.Error):
                if self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE:
                    log.warning("MPS keeper %d did not exit: killed", self.process.pid)
                    self.process.kill()
            self.process = None
        with contextlib.suppress(OSError, ValueError):
            out.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1)


def mig_gpus(nodes: Mapping[str, NodeState]) -> dict[str, tuple[Any, ...]]:
    """Node id -> its GPUs in MIG mode with instances, for the nodes no daemon serves."""
    out = {}
    for n, s in nodes.items():
        migs = tuple(g for g in s.gpus if g.mig_enabled and g.mig_instances)
        if not s.serves and migs:
            out[n] = migs
    return out


class NodeMPS:
    """A Ray actor that keeps one node's MPS daemon for a run (see the module docstring)."""

    def __init__(self) -> None:
        self.keeper: Keeper | None = None

    def start(self, control: str, daemon: bool = True) -> NodeState:
        """Join or start the node's daemon (``daemon``; else none: MIG was asked for); where
        none serves, the node's GPUs as NVML shows them (their MIG instances)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        state = NodeState("absent", why="no MPS daemon asked (resources.gpu_sharing=mig)")
        if daemon:
            self.keeper = Keeper(control)
            state = self.keeper.state
        gpus: tuple[Any, ...] = ()
        if not state.serves:  # MIG instances may serve instead
            from ebrl.resources.topology import discover_gpus

            gpus = tuple(discover_gpus(mps_control=control))
        return NodeState(**{**state.__dict__, "node": node, "gpus": gpus})

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None


class ClusterMPS:
    """The run's MPS daemons: one :class:`NodeMPS` per machine that hosts a role with a quota.

    Args:
        control: the control binary each node looks for on its PATH.
    """

    def __init__(self, control: str = MPS_CONTROL) -> None:
        self.control = control
        self.actors: dict[str, Any] = {}
        self.nodes: dict[str, NodeState] = {}

    def start(
        self, nodes: Mapping[str, str], timeout_s: float = 60.0, daemon: bool = True
    ) -> dict[str, NodeState]:
        """Start (or join) a daemon on each machine of ``nodes``; returns node id -> what its
        machine's keeper found.

        Args:
            nodes: node id -> its address. Ray nodes at one address are one machine (a test
                cluster, or several raylets on a big host), and one user has one MPS daemon
                per machine: one keeper serves them all.
            daemon: False: no daemon, only each node's GPUs (MIG asked for).
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(NodeMPS)
        by_address: dict[str, list[str]] = {}
        for node, address in nodes.items():
            by_address.setdefault(address, []).append(node)
        refs = {}
        for address, ids in by_address.items():
            actor = remote.options(
                num_cpus=0,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=ids[0], soft=False),
            ).remote()
            self.actors[address] = actor
            refs[address] = actor.start.remote(self.control, daemon)
        for address, ref in refs.items():
            state = ray.get(ref, timeout=timeout_s)
            for node in by_address[address]:
                self.nodes[node] = state
            if state.state == "started":
                log.info("MPS: daemon %s started on %s, pipes in %s", state.pids, address,
                         state.pipe)  # fmt: skip
            elif state.state == "joined":
                log.info("MPS: %s joins the daemon already serving it (pipes in %s)", address,
                         state.pipe)  # fmt: skip
        return self.nodes

    def pipes(self) -> dict[str, str]:
        """Node id -> the pipe directory of the daemon serving it (nodes without one left out)."""
        return {n: s.pipe for n, s in self.nodes.items() if s.serves and s.pipe}

    def stop(self, timeout_s: float = 30.0) -> None:
        """Quit the daemons this run started (joined ones stay); end the actors. Never raises:
        it runs on error paths."""
        import ray

        refs = []
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                refs.append(actor.stop.remote())
        deadline = time.monotonic() + timeout_s
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        started = sorted({p for s in self.nodes.values() if s.state == "started" for p in s.pids})
        if started:
            log.info("MPS: daemons %s stopped", started)
        self.actors.clear()


if __name__ == "__main__":
    detach()
    sys.exit(keep(sys.argv[1] if len(sys.argv) > 1 else MPS_CONTROL))
