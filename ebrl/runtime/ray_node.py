"""One ``ray start --block`` process, a child of its Slurm task, that never outlives it.

:mod:`ebrl.runtime.slurm_cluster` starts one :class:`RayNode` per task, with the command line
and environment of its :class:`~ebrl.runtime.slurm_plan.NodePlan`, and stops it when the task's
part in the cluster ends.

No orphans: every ``ray start --block`` is its task's child and gets SIGTERM when the task
dies, however it dies (the kernel's parent-death signal); ``ray start``'s own SIGTERM handler
then ends its node's processes, and :meth:`RayNode.stop` ends any left by PID. The task also
keeps the orphan watchdog (:mod:`ebrl.runtime.watchdog`) over everything below it. SIGUSR2
(Submitit's time-limit warning, which Slurm sends to every process of the job) is ignored by the
Ray nodes: it asks the driver to checkpoint, not the cluster to fall away under it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from ebrl.runtime.slurm_env import say

#: how long ``ray start`` has to end its node's processes after SIGTERM before SIGKILL
STOP_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


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
        command: the command line (:meth:`~ebrl.runtime.slurm_plan.NodePlan.command`).
        env: its environment (:meth:`~ebrl.runtime.slurm_plan.NodePlan.environment`; None:
            this process's).
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
