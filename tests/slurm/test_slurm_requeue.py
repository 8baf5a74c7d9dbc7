"""Preemption on a real Slurm (issue 15): one training job submitted through ``ebrl.launch``
(launcher=slurm, Submitit), requeued twice while it trains (``scontrol requeue``, then the
time-limit warning USR2 to every process of the job), finishes as one MLflow run that resumed
from its run folder each time, and says so (``fault/attempts``) without tracebacks (issue 45).

Needs a Slurm that answers ``sinfo`` (``make test-slurm`` starts a single-node one with
scripts/slurm_local.sh and stops it afterwards); skipped otherwise. Run one case at a time: each
job takes the node's CPUs.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ..conftest import TINY

mlflow = pytest.importorskip("mlflow")

pytestmark = pytest.mark.slurm

#: the job's length: ~1.5 s an update on 2 cores (sync and ebrl), so ~90 s of training
ITERATIONS = 60
DELAY_S = 0.03
#: updates an attempt makes before it is requeued (the first attempt; later ones: this many more)
PROGRESS_BEFORE_REQUEUE = 3
REQUEUES = 2

SCHEDULERS = {
    "sync": ["scheduler=sync"],
    "ebrl": ["scheduler=ebrl", "scheduler.backend=ray", "scheduler.sim_workers=2"],
}


def _slurm_unreachable() -> str | None:
    """Why Slurm cannot be used here (None: it answers)."""
    if shutil.which("sinfo") is None:
        return "no sinfo on PATH (Slurm not installed); `make test-slurm` installs and starts one"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%a %T"], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 20 s"
    if out.returncode != 0:
        err = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return f"sinfo fails ({err}); `make test-slurm` starts one"
    if not out.stdout.strip():
        return "sinfo lists no partition"
    return None


def _squeue(name: str) -> tuple[str, str, str] | None:
    """(job id, state, reason) of the job called ``name``; None once Slurm no longer lists it."""
    out = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=30
    )
    lines = out.stdout.split()
    if out.returncode != 0 or not lines:
        return None
    jid, state, reason = lines[0].split("|")
    return jid, state, reason


def _iterations(progress: Path) -> int:
    try:
        return int(json.loads(progress.read_text())["iterations"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def _tail(path: Path, n: int = 6000) -> str:
    return f"--- {path} ---\n{path.read_text(errors='replace')[-n:]}" if path.exists() else ""


class Job:
    """The launcher (a background process) and the one Slurm job it submitted."""

    def __init__(self, tmp: Path, name: str, scheduler: list[str]):
        self.name, self.sweep, self.store = name, tmp / "sweep", tmp / "mlflow"
        self.progress = self.sweep / "0" / "progress.json"
        self.log = tmp / "launcher.log"
        self.jid: str | None = None
        over = [o for o in TINY if not o.startswith("budget.iterations")]
        cmd = [
            sys.executable,
            "-m",
            "ebrl.launch",
            "smoke",
            "launcher=slurm",
            "launcher.cpus_per_task=2",
            "seed=0",  # with the scheduler: one job of the smoke sweep's 2 x 3
            *scheduler,
            *over,
            f"simulator.delay_s={DELAY_S}",
            f"budget.iterations={ITERATIONS}",
            f"tracking.store={self.store}",
            f"tracking.experiment={name}",  # also the Slurm job name
            "--out",
            str(self.sweep),
        ]
        self.t0 = time.monotonic()
        # cwd=tmp: Submitit's and Hydra's files stay out of the repository; stdin closed
        self.proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def t(self) -> float:
        return time.monotonic() - self.t0

    def logs(self, n: int = 6000) -> str:
        """The launcher's output and the job's Submitit logs (every attempt), their last n chars."""
        parts = [_tail(self.log, n)]
        sub = self.sweep / ".submitit"
        if sub.exists():
            for f in sorted(sub.glob("*/*_log.*")):
                parts.append(_tail(f, n))
        return "\n".join(p for p in parts if p)

    def wait(self, what: str, cond, timeout: float):
        """Poll ``cond()`` until it returns something truthy; fail if the launcher ends first or
        the job vanishes from the queue without finishing."""
        deadline, gone_since = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the launcher exited ({self.proc.returncode}) while waiting for {what}\n"
                    + self.logs()
                )
            if self.jid is not None and _squeue(self.name) is None:
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 60:
                    pytest.fail(
                        f"job {self.jid} left the queue while waiting for {what}\n" + self.logs()
                    )
            else:
                gone_since = None
            time.sleep(0.5)
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n" + self.logs())

    def state(self) -> str | None:
        q = _squeue(self.name)
        return q[1] if q else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.jid is not None and _squeue(self.name) is not None:
            subprocess.run(["scancel", "--full", self.jid], timeout=30, check=False)


@pytest.fixture(scope="module")
def slurm() -> None:
    reason = _slurm_unreachable()
    if reason:
        pytest.skip(f"Slurm not reachable: {reason}")
    busy = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout
    if busy.strip():
        print(f"\nnote: other jobs are queued; ours waits for them:\n{busy}")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_requeued_twice_resumes_into_one_finished_mlflow_run(slurm, tmp_path, scheduler):
    name = f"ebrl-requeue-{scheduler}-{uuid.uuid4().hex[:6]}"
    job = Job(tmp_path, name, SCHEDULERS[scheduler])
    history: list[dict] = []
    try:
        q = job.wait("the job in squeue", lambda: _squeue(name), 180)
        job.jid = q[0]
        history.append({"attempt": 1, "event": "submitted", "t_s": round(job.t(), 1)})
        done = 0  # updates made when the previous attempt ended
        for k in range(1, REQUEUES + 1):
            target = done + PROGRESS_BEFORE_REQUEUE
            job.wait(
                f"attempt {k} to reach {target} updates",
                lambda target=target: (
                    job.state() == "RUNNING" and _iterations(job.progress) >= target
                ),
                420,
            )
            at = _iterations(job.progress)
            # the first by preemption (SIGTERM), the last by the time-limit warning Submitit
            # asks for (USR2 to every process of the job's steps: Submitit requeues the job)
            how = ["scontrol", "requeue", job.jid]
            if k == REQUEUES:
                how = ["scancel", "--signal=USR2", job.jid]
            req = subprocess.run(how, capture_output=True, text=True, timeout=30)
            assert req.returncode == 0, f"{' '.join(how)}: {req.stderr}"
            t_req = job.t()
            pend = job.wait(f"job {job.jid} PENDING after requeue {k}", lambda: _pending(job), 120)
            done = _iterations(job.progress)
            t_pend = job.t()
            job.wait(f"attempt {k + 1} RUNNING", lambda: job.state() == "RUNNING", 420)
            history.append(
                {
                    "attempt": k,
                    "event": f"requeue {k}",
                    "t_s": round(t_req, 1),
                    "updates_at_requeue": at,
                    "updates_when_attempt_ended": done,
                    "stopping_s": round(t_pend - t_req, 1),  # SIGTERM -> checkpointed, ended
                    "pending_reason": pend,
                    "pending_s": round(job.t() - t_pend, 1),
                }
            )
            history.append({"attempt": k + 1, "event": "running", "t_s": round(job.t(), 1)})
        job.wait("the launcher to return", lambda: job.proc.poll() is not None, 600)
        assert job.proc.returncode == 0, job.logs()
        history.append(
            {
                "attempt": REQUEUES + 1,
                "event": "finished",
                "t_s": round(job.t(), 1),
                "updates": _iterations(job.progress),
            }
        )
    finally:
        print(f"\n[{scheduler}] Slurm job {job.jid} ({name}), attempt history:")
        for h in history:
            print("  " + json.dumps(h))
        resumed = dict.fromkeys(re.findall(r"resuming from \S+ at update (\d+)", job.logs(n=10**7)))
        print(f"  the job's log: resumed at updates {', '.join(resumed) or '(none)'}")
        job.stop()

    client = mlflow.tracking.MlflowClient(f"sqlite:///{job.store / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    assert exp is not None, job.logs()
    # the job's run (the sweep's own parent run, run_kind=sweep, aside): one, all attempts
    runs = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("run_kind") != "sweep"
    ]
    assert len(runs) == 1, [(r.info.run_id, r.info.status) for r in runs]
    (run,) = runs
    prog = json.loads(job.progress.read_text())
    assert prog["mlflow_run_id"] == run.info.run_id
    assert run.info.status == "FINISHED", run.info.status
    assert run.data.tags.get("resumed") == "true"
    hist = sorted(
        client.get_metric_history(run.info.run_id, "env/steps_total"), key=lambda m: m.timestamp
    )
    steps = [m.value for m in hist]
    assert len(steps) == ITERATIONS, steps
    assert all(a < b for a, b in itertools.pairwise(steps)), steps  # continued, never restarted
    summary = json.loads((job.sweep / "0" / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["iterations"] == ITERATIONS, summary
    # the FINISHED run shows its attempts, each stopped one a preemption (issue 45)
    latest = {
        k: max(client.get_metric_history(run.info.run_id, k), key=lambda m: m.timestamp).value
        for k in ("fault/attempts", "fault/preemptions")
    }
    assert latest == {"fault/attempts": REQUEUES + 1, "fault/preemptions": REQUEUES}, latest
    # what the user reads: Submitit's sacct warning once in the launcher's log, and no
    # resource-tracker traceback in the job's (USR2 reached every process of the job)
    assert job.log.read_text().count("Bypassing sacct error") <= 1, _tail(job.log)
    everything = job.logs(n=10**7)
    assert "KeyError" not in everything and "resource_tracker" not in everything, everything
    print(
        f"[{scheduler}] one MLflow run {run.info.run_id}: FINISHED, resumed=true, "
        f"{len(steps)} points of env/steps_total ({int(steps[0])} .. {int(steps[-1])}), "
        f"{job.t():.0f} s in all"
    )


def _pending(job: Job) -> str | None:
    q = _squeue(job.name)
    return q[2] if q and q[1] == "PENDING" else None


@pytest.mark.timeout(600)
def test_a_failing_job_fails_in_slurm_with_its_own_error(slurm, tmp_path):
    """A job whose env worker raises: Slurm records it FAILED with a non-zero exit code (not
    COMPLETED 0:0, as when Hydra's FAILED result was pickled as a success), and the launcher
    shows the stage's own error (a StageError survives pickling)."""
    name = f"ebrl-fail-{uuid.uuid4().hex[:6]}"
    job = Job(tmp_path, name, [*SCHEDULERS["ebrl"], "simulator.fail_after_steps=12"])
    try:
        q = job.wait("the job in squeue", lambda: _squeue(name), 180)
        job.jid = q[0]
        job.proc.wait(timeout=400)
        text = job.logs(n=10**6)
        # slurmctld keeps a finished job's record for MinJobAge (300 s by default)
        show = subprocess.run(
            ["scontrol", "show", "job", job.jid], capture_output=True, text=True, timeout=30
        ).stdout
    finally:
        job.stop()
    state = re.search(r"JobState=(\S+)", show)
    code = re.search(r"ExitCode=(\S+)", show)
    print(f"\n[failing job] Slurm job {job.jid}: JobState={state and state[1]}, "
          f"ExitCode={code and code[1]}, launcher exit {job.proc.returncode}")  # fmt: skip
    assert job.proc.returncode != 0, text
    assert "StageError" in text and "injected failure" in text, text
    assert "missing 1 required positional argument" not in text, text
    assert state is not None and state[1] == "FAILED", show
    assert code is not None and code[1] != "0:0", show
