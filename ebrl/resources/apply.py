"""Applying a plan to the machine: the only module in ``ebrl.resources`` with side effects.

* CPU: :func:`pin` / :func:`rebind` set a process's (or thread's) affinity with
  ``os.sched_setaffinity``; :func:`affinity_guard` restores it on every exit path;
  :func:`set_threads` sets torch's intra-op threads.
* GPU: :class:`MPSDaemon` runs a private MPS control daemon (its own pipe and log directories)
  for as long as a ``with`` block, stopping it on every exit path, SIGTERM included;
  :func:`gpu_stage_env` gives the environment a GPU stage process is launched with.

The subprocess runner is injectable, so tests drive a fake ``nvidia-cuda-mps-control``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from ebrl.resources.assign import GpuShare, ShareKind, StagePlacement

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"


# --- CPU --------------------------------------------------------------------------------------
def affinity(pid: int = 0) -> set[int]:
    """The CPUs ``pid`` (0: this process; a thread's native id works too) may run on."""
    return set(os.sched_getaffinity(pid))


def pin(pid: int, cores: Iterable[int]) -> set[int]:
    """Restrict ``pid`` (0: this process; or a thread's native id) to ``cores``.

    Returns:
        The previous affinity, for restoring it.

    Raises:
        ValueError: no cores given.
        OSError: a core this process may not use (the message lists the allowed ones).
    """
    want = sorted(set(cores))
    if not want:
        raise ValueError("pin: no cores given")
    before = affinity(pid)
    try:
        os.sched_setaffinity(pid, want)
    except OSError as e:
        if isinstance(e, ProcessLookupError):
            raise
        allowed = sorted(os.sched_getaffinity(0))
        raise OSError(
            e.errno, f"pin: cannot pin pid {pid} to cores {want} ({e.strerror}); allowed: {allowed}"
        ) from e
    return before


def rebind(moves: Mapping[int, Iterable[int]]) -> dict[int, set[int]]:
    """Move running processes or threads to new cores (e.g. idle cores to straggling envs).

    A process that exited meanwhile is skipped: at run time that is a normal race.

    Args:
        moves: pid (or thread native id) -> its new cores.

    Returns:
        pid -> previous affinity, for those that were moved.
    """
    before: dict[int, set[int]] = {}
    for pid, cores in moves.items():
        try:
            before[pid] = pin(pid, cores)
        except ProcessLookupError:
            log.debug("rebind: pid %d is gone", pid)
            continue
        log.debug("rebind: pid %d %s -> %s", pid, sorted(before[pid]), sorted(set(cores)))
    return before


def threads_of(pid: int) -> list[int]:
    """The thread ids to move for ``pid``: every thread of the process when ``pid`` names a
    process (its thread-group leader), just ``pid`` when it names a thread of another (an
    in-process worker's thread must not move its host's other threads). A gone or unreadable
    id is returned as itself (``rebind`` skips it if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        tgid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Tgid:")))
        if tgid != pid:
            return [pid]
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (OSError, StopIteration, ValueError):
        return [pid]


def rebind_threads(moves: Mapping[int, Iterable[int]]) -> dict[int, set[int]]:
    """:func:`rebind` for whole processes: each pid's every thread moves (``sched_setaffinity``
    on a pid moves only its main thread; torch's intra-op threads and a simulator's workers
    would stay where they were). Thread ids of a shared process move alone
    (:func:`threads_of`).

    Returns:
        thread id -> previous affinity, for those that were moved.
    """
    expanded: dict[int, list[int]] = {}
    for pid, cores in moves.items():
        want = sorted(set(cores))
        for tid in threads_of(pid):
            expanded[tid] = want
    return rebind(expanded)


def pin_process(cores: Iterable[int]) -> dict[int, set[int]]:
    """Pin every thread of this process to ``cores`` (``pin(0, ...)`` moves only the calling
    thread; torch's worker threads and a runtime's helpers would stay where they were).

    Threads started later inherit their creator's affinity, so they follow.

    Returns:
        thread id -> its previous affinity, for the threads that were moved.
    """
    want = sorted(set(cores))
    if not want:
        raise ValueError("pin_process: no cores given")
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:  # no procfs: the calling thread is all we can reach
        tids = [threading.get_native_id()]
    return rebind(dict.fromkeys(tids, want))


@contextlib.contextmanager
def affinity_guard(pid: int = 0) -> Iterator[set[int]]:
    """Restore ``pid``'s affinity when the block exits, however it exits.

    Yields:
        The affinity at entry.
    """
    saved = affinity(pid)
    try:
        yield set(saved)
    finally:
        with contextlib.suppress(ProcessLookupError):  # another pid may have exited
            os.sched_setaffinity(pid, saved)


def set_threads(n: int) -> int:
    """Set torch's intra-op threads in this process; returns the previous count."""
    import torch  # here, not at module level: planning and MPS control do not need torch

    if n < 1:
        raise ValueError(f"set_threads: n={n} must be >= 1")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


@contextlib.contextmanager
def threads_guard(n: int | None = None) -> Iterator[None]:
    """Optionally set torch's intra-op threads; restore the entry count on exit."""
    import torch

    saved = torch.get_num_threads()
    try:
        if n is not None:
            set_threads(n)
        yield
    finally:
        torch.set_num_threads(saved)


def apply_placement(placement: StagePlacement) -> None:
    """Pin this process to its placement's cores and set its torch threads.

    Called by a stage process itself at start-up (torch's thread count is per process, so
    nobody else can set it).
    """
    pin(0, placement.cores)
    set_threads(placement.threads)
    log.info(
        "%s[%d]: cores %s, %d threads",
        placement.stage,
        placement.rank,
        sorted(placement.cores),
        placement.threads,
    )


# --- MPS --------------------------------------------------------------------------------------
class MPSError(RuntimeError):
    """The MPS control daemon could not be started, or one already runs for this user."""


class Runner(Protocol):
    """Runs a command to completion (the seam tests replace)."""

    def __call__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        input: str | None = None,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]: ...


def run_command(
    args: Sequence[str], *, env: Mapping[str, str], input: str | None = None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """The real runner: ``args`` with ``env`` added to this process's environment.

    Output goes through temporary files, not pipes: ``nvidia-cuda-mps-control -d`` forks a
    daemon that may keep its parent's output open, and reading a pipe would then wait for it.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.run(
            list(args),
            env={**os.environ, **env},
            input=input,
            stdout=out,
            stderr=err,
            text=True,
            timeout=timeout,
            check=False,
        )
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read())


def find_control_daemons(control: str = MPS_CONTROL) -> list[int]:
    """Pids of MPS control processes of this user (the binary, or a script named like it)."""
    import psutil

    name = os.path.basename(control)
    uid = os.getuid()
    found = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "uids", "status"]):
        info = p.info
        if info["uids"] is None or info["uids"].real != uid or info["pid"] == os.getpid():
            continue
        if info["status"] == psutil.STATUS_ZOMBIE:  # dead, waiting for a parent to reap it
            continue
        argv = info["cmdline"] or []
        # a script (a test's fake) runs as "python <path>": look at the first two arguments
        names = {info["name"]} | {os.path.basename(a) for a in argv[:2]}
        if name in names:
            found.append(int(info["pid"]))
    return found


def process_gone(proc: Any) -> bool:
    """Whether a psutil process has exited. A zombie counts as gone: the daemon is orphaned
    once its launcher exits, and some init processes (containers, VMs) never reap orphans."""
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(procs: list[Any], timeout: float) -> list[Any]:
    """Poll until every process is gone or ``timeout`` passes; returns those still alive."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not process_gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not process_gone(p)]
    return alive


class MPSDaemon:
    """A private MPS control daemon for the length of a ``with`` block.

    It gets its own ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` under a temporary
    directory, so it never collides with a system-wide daemon's ``/tmp/nvidia-mps``. It refuses to
    start when an MPS control daemon already runs for this user (one per user). Stage processes
    join it through :meth:`env` / :func:`gpu_stage_env`. The block stops it on every exit: normal,
    exception, and SIGTERM (a handler installed for the block, then restored).

    Args:
        base_dir: where the pipe and log directories go (default: a fresh temporary directory,
            removed on stop).
        runner: runs the control binary (tests pass a fake).
        control: the control binary.
        find_daemons: lists this user's control daemon pids (tests pass a fake).
        gpus: restrict the daemon to these GPUs (``CUDA_VISIBLE_DEVICES``; None: all).
        timeout_s: how long a start or stop may take.
    """

    def __init__(
        self,
        base_dir: str | Path | None = None,
        runner: Runner = run_command,
        control: str = MPS_CONTROL,
        find_daemons: Callable[[], list[int]] | None = None,
        gpus: Sequence[int | str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.runner = runner
        self.control = control
        self.find_daemons = find_daemons or (lambda: find_control_daemons(control))
        self.gpus = gpus
        self.timeout_s = timeout_s
        self._own_dir = base_dir is None
        self._base = Path(base_dir) if base_dir is not None else None
        self.pids: set[int] = set()
        self.running = False
        self._prev_handler: Any = None
        self._handler_installed = False

    @property
    def pipe_dir(self) -> Path:
        if self._base is None:
            raise MPSError("MPSDaemon: not started (no pipe directory yet)")
        return self._base / "pipe"

    @property
    def log_dir(self) -> Path:
        if self._base is None:
            raise MPSError("MPSDaemon: not started (no log directory yet)")
        return self._base / "log"

    def env(self) -> dict[str, str]:
        """Variables the daemon and its clients share."""
        out = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }
        if self.gpus is not None:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        return out

    def already_running(self) -> list[int]:
        """Pids of MPS control daemons of this user that are not this one's."""
        return [p for p in self.find_daemons() if p not in self.pids]

    def start(self) -> None:
        """Start the daemon (a no-op when this instance already runs one).

        Raises:
            MPSError: another daemon runs for this user, the binary failed, or no daemon
                process appeared within ``timeout_s``.
        """
        if self.running:
            return
        others = self.already_running()
        if others:
            raise MPSError(
                f"an MPS control daemon already runs for this user (pids {others}); only one "
                "per user: stop it (echo quit | nvidia-cuda-mps-control) or reuse it"
            )
        if self._own_dir:
            self._base = Path(tempfile.mkdtemp(prefix="ebrl-mps-"))
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            p = self.runner([self.control, "-d"], env=self.env(), timeout=self.timeout_s)
        except (OSError, subprocess.SubprocessError) as e:
            self._cleanup_dir()
            raise MPSError(f"cannot run {self.control} -d: {e}") from e
        if p.returncode != 0:
            self._cleanup_dir()
            raise MPSError(
                f"{self.control} -d exited {p.returncode}: {(p.stderr or p.stdout).strip()}"
            )
        deadline = time.monotonic() + self.timeout_s
        while not self.pids and time.monotonic() < deadline:
            self.pids = set(self.find_daemons())
            if not self.pids:
                time.sleep(0.05)
        self.running = True  # even without a pid: stop() must still send quit
        if not self.pids:
            self.stop()
            raise MPSError(f"{self.control} -d returned but no daemon appeared")
        log.info("MPS control daemon %s started, pipes in %s", sorted(self.pids), self.pipe_dir)

    def stop(self) -> None:
        """Send ``quit``; kill the daemon if it does not go; remove its directory. Never raises:
        it runs on error paths, where a second exception would hide the first."""
        if not self.running:
            return
        self.running = False
        try:
            p = self.runner([self.control], env=self.env(), input="quit\n", timeout=self.timeout_s)
            if p.returncode != 0:
                log.warning("MPS quit exited %d: %s", p.returncode, (p.stderr or "").strip())
        except Exception as e:  # still make sure the process goes below
            log.warning("MPS quit failed: %s", e)
        self._reap()
        log.info("MPS control daemon %s stopped", sorted(self.pids))
        self.pids = set()
        self._cleanup_dir()

    def _reap(self) -> None:
        """Wait for this daemon's processes to exit; terminate, then kill, what stays."""
        import psutil

        procs = []
        for pid in self.pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        alive = _wait_gone(procs, self.timeout_s)
        for sig_name in ("terminate", "kill"):
            if not alive:
                return
            log.warning("MPS daemon %s ignored quit: %s", [p.pid for p in alive], sig_name)
            for proc in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    getattr(proc, sig_name)()
            alive = _wait_gone(alive, 2.0)

    def _cleanup_dir(self) -> None:
        if self._own_dir and self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None

    # -- context manager ------------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_handler
        self._restore_handler()
        if prev == signal.SIG_IGN:
            return  # the process ignores SIGTERM: it goes on, so does its daemon
        self.stop()
        if callable(prev):
            prev(signum, frame)
        else:
            # default action: terminate. SystemExit unwinds every with/finally on the way out
            raise SystemExit(128 + signum)

    def _restore_handler(self) -> None:
        if self._handler_installed:
            signal.signal(signal.SIGTERM, self._prev_handler)
            self._handler_installed = False

    def __enter__(self) -> MPSDaemon:
        # signal handlers can only be installed from the main thread
        if threading.current_thread() is threading.main_thread():
            self._prev_handler = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._handler_installed = True
        try:
            self.start()
        except BaseException:
            self._restore_handler()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_handler()


def gpu_stage_env(share: GpuShare, mps: MPSDaemon | str | Path | None = None) -> dict[str, str]:
    """Environment variables to launch a GPU stage process with, for its share.

    * ``whole``: ``CUDA_VISIBLE_DEVICES`` = the GPU.
    * ``mps``: plus ``CUDA_MPS_PIPE_DIRECTORY`` (the daemon's) and
      ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the SM quota).
    * ``mig``: ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``.
    * ``timeslice``: the GPU, and a logged warning: nothing enforces the share.

    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes a plain index mean NVML's index (CUDA's default order
    is fastest first); a GPU uuid, when known, is used instead.

    Args:
        share: the process's share from a :class:`~ebrl.resources.assign.ResourcePlan`.
        mps: the running daemon or its pipe directory (needed for ``mps`` shares).

    Raises:
        ValueError: an ``mps`` share without a daemon.
    """
    device = share.gpu_uuid or str(share.gpu)
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": device}
    if share.kind == ShareKind.mig:
        env["CUDA_VISIBLE_DEVICES"] = str(share.mig_uuid)
    elif share.kind == ShareKind.mps:
        if mps is None:
            raise ValueError(
                f"an MPS share of GPU {share.gpu} ({share.sm_percent}%) needs the MPS daemon "
                "(or its pipe directory): start one with MPSDaemon"
            )
        pipe = mps.pipe_dir if isinstance(mps, MPSDaemon) else Path(mps)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share.sm_percent)
    elif share.kind == ShareKind.timeslice:
        log.warning(
            "GPU %d shared by plain time-slicing: %d%% is not enforced (no MPS, no MIG)",
            share.gpu,
            share.sm_percent,
        )
    return env
