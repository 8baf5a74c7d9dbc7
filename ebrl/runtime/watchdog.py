"""The orphan watchdog: when a driver dies without cleaning up, end what it started.

A driver killed by SIGKILL (the OOM killer, ``kill -9``, a node agent) runs no ``finally``: the
private Ray instance it started (GCS server, raylet, agents, actor processes) and its
shared-memory slots would outlive it; Ray's agents even ignore SIGTERM. While a driver runs Ray,
it keeps one watchdog process (its own session, so a signal to the driver's process group does
not reach it) connected by a pipe. The watchdog records the driver's descendants every
``interval`` seconds; when the pipe closes without a ``stop`` (the driver is gone), it sends
SIGTERM to every recorded process still alive (the same pid *and* start time, never a reused
pid), SIGKILL to any left after ``grace`` seconds, and unlinks the driver's shared-memory
segments (``/dev/shm/ebrl_<driver pid>_*``).

Run as ``python -m ebrl.runtime.watchdog <driver pid>`` by :class:`Watchdog`. It watches the
driver; the driver watches its workers (their heartbeats, and the Stop that ends them) in
:mod:`ebrl.schedulers.ebrl.heartbeat`, whose docstring has who watches whom.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")


def shm_prefix(pid: int) -> str:
    """Name prefix of the shared-memory segments a driver process creates."""
    return f"ebrl_{pid}_"


def sweep_shm(pid: int) -> list[str]:
    """Unlink the segments of driver ``pid``; returns their names."""
    gone = []
    for p in SHM_DIR.glob(shm_prefix(pid) + "*"):
        with contextlib.suppress(OSError):
            p.unlink()
            gone.append(p.name)
    return gone


def sweep_dead_drivers() -> list[str]:
    """Unlink every ``ebrl_<pid>_*`` segment whose creating process no longer exists (a
    driver that died with its watchdog, e.g. a whole process tree SIGKILLed)."""
    gone = []
    for p in SHM_DIR.glob("ebrl_*_*"):
        pid = p.name.split("_")[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            gone += sweep_shm(int(pid))
    return gone


def end_processes(known: dict[int, float], grace: float) -> list[int]:
    """SIGTERM, then after ``grace`` s SIGKILL, every ``pid: start time`` still running."""
    procs = []
    for pid, created in known.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 1e-3:
                procs.append(p)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in procs]


def watch(driver_pid: int, interval: float = 0.5, grace: float = 3.0) -> int:
    """Watch the driver until its pipe (our stdin) says ``stop`` or closes; 0 on stop.

    The stop signals are ignored: a signal to every process of a job (Slurm's preemption) must
    not take the watchdog down before the driver it watches."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)
    me = os.getpid()
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        driver = None
    known: dict[int, float] = {}
    while driver is not None:
        with contextlib.suppress(psutil.Error):
            for c in driver.children(recursive=True):
                if c.pid != me:
                    known[c.pid] = c.create_time()
        ready, _, _ = select.select([sys.stdin], [], [], interval)
        if ready:
            line = sys.stdin.readline()
            if line.strip() == "stop":
                return 0
            if line == "":  # EOF: the driver's end of the pipe is closed
                break
    ended = end_processes(known, grace)
    swept = sweep_shm(driver_pid)
    print(
        f"ebrl watchdog: driver {driver_pid} died; ended {len(ended)} process(es), "
        f"removed {len(swept)} shared-memory segment(s)",
        file=sys.stderr,
        flush=True,
    )
    return 1


class Watchdog:
    """The driver's side: start the watchdog process, and :meth:`stop` it on a clean exit."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ebrl.runtime.watchdog", str(os.getpid())],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def stop(self) -> None:
        """Tell the watchdog the driver cleaned up itself; it exits without ending anything."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write("stop\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1])))
