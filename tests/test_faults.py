"""Faults under every scheduler: a run stopped by a signal, a killed worker or a killed driver is
run again in the same folder and finishes as one MLflow run with a continuous history.

Each cell of the matrix (scheduler x fault) runs ``python -m ebrl.train`` as a subprocess in a
session of its own, waits for 3 logged updates, injects the fault, waits for the process to end,
checks that nothing it started survives (no Ray process, no shared-memory segment), runs the
same command again and checks the result:

- the run finishes, and it is the same MLflow run (one run in the experiment), FINISHED;
- ``env/steps_total`` is strictly increasing across the attempts;
- the env steps logged equal the env steps the learner trained on (its checkpoint's ledger),
  plus nothing: an update trained but never logged shows as ``fault/unlogged_updates``;
- exact counts across the data path: the env steps the env workers collected (every attempt,
  every process, the step ledger: ``ebrl.ledger``) minus those never trained (the rollout in
  flight at a stop, a dead env worker's part its replacement redid) equal the learner's count.
  Each cell prints its ``LEDGER`` line (``pytest -rA`` shows it).

``make test`` runs the fast cells (``FAST``), ``make test-slow`` the ``SLOW`` ones; ``make
test-faults`` runs the whole matrix and the tracking server's outage under three schedulers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ebrl.ledger import account

from .conftest import TINY

mlflow = pytest.importorskip("mlflow")
ROOT = Path(__file__).resolve().parents[1]
ITERS = 10

SCHEDULERS = {
    "sync": ["scheduler=sync"],
    "ebrl": ["scheduler=ebrl", "scheduler.backend=ray", "scheduler.sim_workers=2"],
    "async": ["scheduler=async", "scheduler.backend=ray"],
    "hybrid": ["scheduler=hybrid", "scheduler.backend=ray"],
}
#: fault -> what to do to the running job (see inject())
FAULTS = ("sigterm", "sigterm_all", "usr2", "sigint", "driver_kill", "sim_kill", "gen_kill",
          "learner_kill", "sim_stop", "gen_stop", "learner_stop")  # fmt: skip
WORKER_FAULTS = {"sim_kill": "EnvWorker", "gen_kill": "GenWorker", "learner_kill": "LearnerWorker",
                 "sim_stop": "EnvWorker", "gen_stop": "GenWorker",
                 "learner_stop": "LearnerWorker"}  # fmt: skip
#: SIGSTOP (a hung process): found by its missing heartbeat, only EBRL sets the timeout
HANG = {"sim_stop", "gen_stop", "learner_stop"}
#: a dead or hung env worker or generator is replaced: the run goes on and finishes
REPLACED = {"sim_kill", "sim_stop", "gen_kill", "gen_stop"}
#: in `make test`: Submitit's time-limit requeue (USR2) of the synchronous schedule (~35 s). EBRL's
#: resume (tests/test_resume_all.py) and its dead workers on Ray (tests/test_ebrl_ray.py) are in the
#: default run too; its signals under Ray are the SLOW cell ebrl-sigterm_all
FAST = {("sync", "usr2")}
#: in `make test-slow` (CI runs it after `make test`): too long for the default run (~60-95 s each)
SLOW = {("ebrl", "sim_kill"), ("ebrl", "sigterm_all")}


def cells():
    for sched in SCHEDULERS:
        for fault in FAULTS:
            if sched == "sync" and fault in WORKER_FAULTS:
                continue  # no worker processes: the stages run in the driver
            if sched != "ebrl" and fault in HANG:
                continue  # the baselines keep the engine's default timeout (120 s)
            marks = [] if (sched, fault) in FAST else [pytest.mark.faults]
            if (sched, fault) in SLOW:
                marks = [pytest.mark.slow]
            yield pytest.param(sched, fault, id=f"{sched}-{fault}", marks=marks)


def command(tmp_path: Path, sched: str, extra: tuple[str, ...] = ()) -> list[str]:
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    return [
        sys.executable,
        "-m",
        "ebrl.train",
        *over,
        *SCHEDULERS[sched],
        "num_envs=4",
        f"budget.iterations={ITERS}",
        "simulator.delay_s=0.01",
        f"run_dir={tmp_path / 'run'}",
        f"tracking.store={tmp_path / 'mlflow'}",
        *extra,
    ]


def iterations(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["iterations"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def descendants(pid: int) -> dict[int, float]:
    try:
        return {c.pid: c.create_time() for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def alive(procs: dict[int, float]) -> list[str]:
    """The processes of ``procs`` (pid: start time) still running, described."""
    out = []
    for pid, created in procs.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            continue
    return out


def worker_pid(driver: int, role: str) -> int:
    """The pid of the Ray actor process running ``role`` (its title is ``ray::<Role>...``)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        for pid in descendants(driver):
            try:
                if psutil.Process(pid).cmdline()[0].startswith(f"ray::{role}"):
                    return pid
            except (psutil.NoSuchProcess, IndexError):
                continue
        time.sleep(0.2)
    raise AssertionError(f"no ray::{role} process under the driver")


def inject(proc: subprocess.Popen, fault: str) -> None:
    if fault == "sigterm":  # scancel of the driver alone
        proc.send_signal(signal.SIGTERM)
    elif fault == "sigterm_all":  # Slurm's preemption: every process of the job at once
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    elif fault == "usr2":  # Submitit's time-limit warning (no Submitit here: USR2 ends it)
        proc.send_signal(signal.SIGUSR2)
    elif fault == "sigint":
        proc.send_signal(signal.SIGINT)
    elif fault == "driver_kill":
        proc.kill()
    else:
        sig = signal.SIGSTOP if fault in HANG else signal.SIGKILL
        os.kill(worker_pid(proc.pid, WORKER_FAULTS[fault]), sig)


def shm_of(pid: int) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"ebrl_{pid}_*")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("sched", "fault"), list(cells()))
def test_fault_then_rerun_finishes_the_same_run(sched, fault, tmp_path):
    run_dir = tmp_path / "run"
    log = (tmp_path / "attempt1.log").open("w")
    extra = ("scheduler.hang_timeout_s=5",) if fault in HANG else ()
    proc = subprocess.Popen(
        command(tmp_path, sched, extra), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    started: dict[int, float] = {}
    try:
        deadline = time.time() + 240
        while iterations(run_dir) < 3:
            assert proc.poll() is None, (tmp_path / "attempt1.log").read_text()[-3000:]
            assert time.time() < deadline, "the run made no progress"
            started.update(descendants(proc.pid))
            time.sleep(0.05)
        started.update(descendants(proc.pid))
        inject(proc, fault)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = (tmp_path / "attempt1.log").read_text()
    # how the first attempt ended: by its signal (re-delivered after the clean-up), or with an
    # error naming the dead worker
    if fault in ("sigterm", "sigterm_all"):
        assert code == -signal.SIGTERM, text[-3000:]
    elif fault == "usr2":
        assert code == -signal.SIGUSR2, text[-3000:]
    elif fault == "sigint":
        assert code == 128 + signal.SIGINT, text[-3000:]
    elif fault == "driver_kill":
        assert code == -signal.SIGKILL
    elif fault in REPLACED:  # replaced: the run goes on and finishes
        assert code == 0, text[-3000:]
    elif fault == "learner_stop":  # hung: found by its heartbeat, the run stops naming it
        assert code == 1 and "no heartbeat" in text, text[-3000:]
    else:  # a dead learner stops the run, naming it; the checkpoint resumes it
        assert code == 1 and "StageError" in text and "died" in text, text[-3000:]
    # nothing the attempt started outlives it by more than a few seconds (the orphan watchdog
    # ends a SIGKILLed driver's Ray processes)
    deadline = time.time() + 15
    while alive(started) and time.time() < deadline:
        time.sleep(0.25)
    assert not alive(started), alive(started)
    assert not shm_of(proc.pid)

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ebrl")
    (first,) = client.search_runs([exp.experiment_id])
    # a SIGKILLed driver cannot mark its run; the rerun takes it over
    expected = "RUNNING" if fault == "driver_kill" else "KILLED"
    if fault in WORKER_FAULTS:
        expected = "FINISHED" if fault in REPLACED else "FAILED"
    assert first.info.status == expected, text[-3000:]

    again = subprocess.run(
        command(tmp_path, sched, extra), cwd=ROOT, capture_output=True, text=True, timeout=400
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [first.info.run_id]
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags.get("resumed") == "true"
    if fault in REPLACED:
        key = "fault/env_worker_restarts" if fault.startswith("sim") else "fault/gen_restarts"
        (restarted,) = {m.value for m in client.get_metric_history(run.info.run_id, key)} - {0.0}
        assert restarted == 1.0
    hist = sorted(
        client.get_metric_history(run.info.run_id, "env/steps_total"), key=lambda m: m.timestamp
    )
    steps = [m.value for m in hist]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    gaps = client.get_metric_history(run.info.run_id, "fault/unlogged_updates")
    unlogged = sum(m.value for m in gaps)
    assert len(steps) + unlogged == ITERS
    import torch

    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["iterations"] == ITERS
    assert ckpt["version"] == ITERS
    # every env step counted was trained on exactly once
    assert ckpt["trained_env_steps"] == summary["env_steps"] == steps[-1]
    # ... and the env workers' own record of every attempt agrees, exactly
    acc = account(run_dir, ITERS)
    collected, discarded = summary["collected_env_steps"], summary["discarded_env_steps"]
    assert (collected, discarded) == (acc.collected, acc.discarded)
    assert collected - discarded == acc.trained == ckpt["trained_env_steps"]
    last = {  # each attempt logs the whole run's so far: the newest is the run's
        k: max(client.get_metric_history(run.info.run_id, k), key=lambda m: m.timestamp).value
        for k in ("env/collected_steps_total", "fault/discarded_env_steps")
    }
    assert last == {
        "env/collected_steps_total": collected,
        "fault/discarded_env_steps": discarded,
    }
    print(
        f"LEDGER {sched}-{fault}: attempts {len(acc.by_attempt)}, collected {collected}, "
        f"discarded {discarded} (superseded {acc.superseded}), trained {acc.trained}; "
        f"per attempt (collected, trained, discarded) {acc.by_attempt}"
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "sched",
    [pytest.param(s, marks=pytest.mark.faults) for s in ("ebrl", "sync", "async")],
)
def test_tracking_server_stopped_and_restarted_mid_run(sched, tmp_path):
    """Training goes on while the MLflow server is down; its metrics arrive when it is back."""
    from .test_tracking_outage import Server

    server = Server(tmp_path / "server")
    server.root.mkdir()
    server.start()
    run_dir = tmp_path / "run"
    cmd = [c for c in command(tmp_path, sched) if not c.startswith("tracking.store=")]
    cmd += [f"tracking.uri={server.uri}", "simulator.delay_s=0.02"]
    log = (tmp_path / "train.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        while iterations(run_dir) < 2:
            assert proc.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
            assert time.time() < deadline, "the run made no progress"
            time.sleep(0.05)
        server.stop()
        down_at = iterations(run_dir)
        while iterations(run_dir) < down_at + 3 and proc.poll() is None:
            time.sleep(0.05)  # training goes on without the server
        server.start()
        assert proc.wait(timeout=300) == 0, (tmp_path / "train.log").read_text()[-3000:]
        # a run that ended while the server was still down (its restart takes 15-50 s here)
        # left its status pending: the replay sets it; after a run that saw the server back, it
        # has nothing to send
        replay = subprocess.run(
            [sys.executable, "-m", "ebrl.tracking", "replay", str(run_dir)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]
        client = mlflow.tracking.MlflowClient(server.uri)
        (run,) = client.search_runs([client.get_experiment_by_name("ebrl").experiment_id])
        assert run.info.status == "FINISHED"
        hist = client.get_metric_history(run.info.run_id, "env/steps_total")
        steps = [m.value for m in sorted(hist, key=lambda m: m.step)]
        assert len(steps) == ITERS and len(set(steps)) == ITERS and steps == sorted(steps)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert steps[-1] == summary["env_steps"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
