"""A planned stop reads clean (issue 45): what a user finds in a Slurm job's log after Submitit's
time-limit warning (USR2) or a preemption is the run's own account of it, not tracebacks and
errors.

- Slurm signals every process of the job, Python's resource tracker included: the tracker of
  the process that made the shared-memory slots must outlive USR2, or unlinking the slots starts
  a new tracker that knows none of them and prints a ``KeyError`` traceback per segment.
- The stop is a warning, not an ERROR; Ray being slow to shut down while its processes got the
  same signal is expected, not a warning.
- Each attempt of a run counts itself: ``fault/attempts`` and ``fault/preemptions`` in MLflow,
  so a FINISHED run shows the attempts a stop ended before it.
- Submitit's "Bypassing sacct error" (every poll, where Slurm keeps no accounting) is said once.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import TINY, make_cfg

ROOT = Path(__file__).resolve().parents[1]


def test_slots_outlive_a_usr2_sent_to_every_process_without_tracebacks():
    """USR2 to the slot owner's resource tracker (Slurm's ``--signal=USR2`` reaches every
    process of the job): closing the slots afterwards prints nothing and leaves no segment."""
    script = textwrap.dedent(
        """
        import os, signal, time
        import psutil
        from ebrl.runtime.slots import ShmSlots
        slots = ShmSlots.create(num_envs=4, obs_dim=3, chunk_size=2, action_dim=1)
        names = [s.name for s in slots._shm]
        trackers = [c for c in psutil.Process().children()
                    if "resource_tracker" in " ".join(c.cmdline())]
        assert trackers, "no resource tracker"
        for t in trackers:
            os.kill(t.pid, signal.SIGUSR2)
        time.sleep(0.5)
        slots.close()
        time.sleep(0.5)
        print("LEFT", [n for n in names if os.path.exists("/dev/shm/" + n.lstrip("/"))])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert "LEFT []" in out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "KeyError" not in out.stderr, out.stderr
    assert "resource_tracker" not in out.stderr, out.stderr


def _stop_after(monkeypatch, n: int, signum: int) -> None:
    """Make the synchronous schedule receive ``signum`` after ``n`` updates."""
    from ebrl.schedulers.sync import SyncScheduler

    orig = SyncScheduler._loop

    def loop(self, st, ctx, builder, episodes):
        for i, rep in enumerate(orig(self, st, ctx, builder, episodes)):
            yield rep
            if i == n - 1:
                signal.raise_signal(signum)

    monkeypatch.setattr(SyncScheduler, "_loop", loop)


def _cfg(tmp_path, iterations: int):
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    extra = ["scheduler=sync", f"budget.iterations={iterations}", "simulator.delay_s=0.001"]
    return make_cfg([*over, *extra], tmp_path)


def _latest(client, run_id: str, key: str) -> float:
    return max(client.get_metric_history(run_id, key), key=lambda m: m.timestamp).value


def test_a_stopped_run_logs_no_error_and_its_attempts_are_counted(tmp_path, monkeypatch, caplog):
    """USR2 stops the first attempt at WARNING (no ERROR record); the second attempt finishes
    the run, whose metrics then say 2 attempts, 1 of them preempted."""
    mlflow = pytest.importorskip("mlflow")
    from ebrl.signals import Preempted
    from ebrl.train import train

    caplog.set_level(logging.INFO)
    with monkeypatch.context() as m:
        _stop_after(m, 2, signal.SIGUSR2)
        with pytest.raises(Preempted):
            train(_cfg(tmp_path, 6))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert any("SIGUSR2" in r.getMessage() for r in caplog.records)

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ebrl").experiment_id])
    assert run.info.status == "KILLED"
    assert _latest(client, run.info.run_id, "fault/attempts") == 1
    assert _latest(client, run.info.run_id, "fault/preemptions") == 0

    s = train(_cfg(tmp_path, 6))
    assert s.status == "FINISHED"
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    assert _latest(client, run.info.run_id, "fault/attempts") == 2
    assert _latest(client, run.info.run_id, "fault/preemptions") == 1
    # the run's own folder says so too
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "FINISHED"


def test_ray_slow_to_stop_after_a_stop_signal_is_not_a_warning(monkeypatch, caplog):
    """Slurm signalled Ray's processes too: its shutdown outliving the bound is expected."""
    import threading

    from ebrl.runtime import backend

    release = threading.Event()

    class SlowRay:
        def shutdown(self):
            release.wait(10)

        def kill(self, actor, no_restart=True):
            pass

    rb = object.__new__(backend.RayBackend)
    rb._ray, rb._started, rb._watchdog, rb.handles = SlowRay(), True, None, []
    monkeypatch.setattr(backend.RayBackend, "shutdown_timeout_s", 0.1)
    monkeypatch.setattr(backend, "stopping", lambda: True)
    caplog.set_level(logging.DEBUG, logger="ebrl.runtime.backend")
    try:
        rb.shutdown()
    finally:
        release.set()
    said = [r for r in caplog.records if "did not shut down" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said), [
        (r.levelname, r.getMessage()) for r in said
    ]


def test_submitits_sacct_warning_is_said_once_per_process():
    """Submitit warns "Bypassing sacct error" on every poll where Slurm keeps no accounting,
    each time through three handlers (its stdout and stderr ones, the root's): after the
    launcher's filter, one line in all, saying that repeats are not shown."""
    from hydra_plugins.ebrl_launcher.slurm_launcher import SlurmLauncher  # installs the filter

    assert SlurmLauncher
    submitit, root = logging.getLogger("submitit"), logging.getLogger()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handlers = [(submitit, Keep()), (submitit, Keep()), (root, Keep())]  # as Submitit's are
    old_level = root.level
    root.setLevel(logging.INFO)
    for logger, h in handlers:
        logger.addHandler(h)
    try:
        for n in range(1, 7):
            submitit.warning(
                f"Call #{n} - Bypassing sacct error Command '['sacct', '-o', 'JobID']' returned "
                "non-zero exit status 1., status may be inaccurate."
            )
        submitit.warning("Bypassing signal SIGTERM")  # anything else is untouched
    finally:
        for logger, h in handlers:
            logger.removeHandler(h)
        root.setLevel(old_level)
    sacct = [m for m in seen if "sacct" in m]
    assert len(sacct) == 1 and "not shown" in sacct[0], seen
    assert seen.count("Bypassing signal SIGTERM") == 3
