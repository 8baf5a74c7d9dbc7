"""A tracking server that goes away mid-run: training goes on, no metric is lost.

A real ``mlflow server`` on 127.0.0.1 (one worker, sqlite store) is stopped and started again on
the same port and store while an ``MLflowTracker`` with a spool logs to it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ebrl.tracking.spool import SPOOL_NAME, Spool
from ebrl.tracking.tracker import MLflowTracker, TrackingUnavailable

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("loss", "acc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_default_wait_s() -> float:
    """Seconds MLflow's default HTTP policy sleeps between retries before it reports a refused
    connection (its retry and backoff defaults, through urllib3's own backoff formula)."""
    from mlflow.environment_variables import (
        MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES,
    )
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError
    from urllib3.util.retry import Retry

    retry = Retry(
        total=MLFLOW_HTTP_REQUEST_MAX_RETRIES.default,
        backoff_factor=MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.default,
        backoff_jitter=0.0,
    )
    wait = 0.0
    while True:
        try:
            retry = retry.increment(method="POST", url="/", error=ConnectTimeoutError())
        except MaxRetryError:
            return wait
        wait += retry.get_backoff_time()


class Server:
    """``mlflow server`` on a fixed port and store, in its own session (the CLI, its uvicorn
    worker): stopped by its process group, so no child outlives it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--workers", "1"]
        cmd += ["--backend-store-uri", f"sqlite:///{self.root / 'db.sqlite'}"]
        cmd += ["--artifacts-destination", str(self.root / "art")]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = (self.root / "server.log").open("a")
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=log, env=env, start_new_session=True, cwd=self.root
        )
        log.close()
        deadline = time.monotonic() + 90
        while True:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not come up"
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        os.killpg(proc.pid, signal.SIGTERM)  # the CLI and its uvicorn worker
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while True:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return  # nothing of it is left
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.1)

    def ensure_up(self) -> None:
        if self.proc is None:
            self.start()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("mlflow-server"))
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def tracker(server: Server, run_dir: Path, **kw) -> MLflowTracker:
    return MLflowTracker(
        uri=server.uri,
        store=run_dir / "unused",
        experiment="outage",
        run_name=run_dir.name,
        tags={},
        spool=run_dir / SPOOL_NAME,
        **kw,
    )


def log_step(tr: MLflowTracker, step: int) -> float:
    """Log one step's metrics; the seconds the call took."""
    t0 = time.perf_counter()
    tr.log_metrics({"loss": 1.0 / step, "acc": step / 100}, step=step)
    return time.perf_counter() - t0


def assert_history(uri: str, run_id: str, steps: list[int], spool: Path) -> None:
    """Every step exactly once, in order, with its value and the timestamp of its spool line."""
    client = MlflowClient(uri)
    stamps = {}
    for raw in spool.read_text().splitlines():
        line = json.loads(raw)
        stamps[line["step"]] = line["ts"]
    for key in KEYS:
        hist = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
        assert [m.step for m in hist] == steps, key
        want = [1.0 / s if key == "loss" else s / 100 for s in steps]
        assert [m.value for m in hist] == pytest.approx(want), key
        assert [m.timestamp for m in hist] == [stamps[s] for s in steps], key


def test_server_unreachable_at_start_fails_clearly(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TrackingUnavailable) as err:
        MLflowTracker(uri=uri, store=tmp_path, experiment="x", run_name="r", tags={})
    assert time.monotonic() - t0 < 15
    assert uri in str(err.value) and "tracking.enabled=false" in str(err.value)


def test_a_hung_server_costs_one_short_timeout(tmp_path):
    """A server that accepts connections but never answers: one attempt waits ``timeout_s``, not
    MLflow's 120 s per request times its retries."""
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_TIMEOUT

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # the kernel completes the handshake; nobody ever reads
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        spool = Spool(tmp_path / SPOOL_NAME, uri, "0" * 32)
        spool.append({"loss": 1.0}, step=1)
        t0 = time.monotonic()
        assert not spool.send(MlflowClient(uri), timeout_s=1)
        took = time.monotonic() - t0
    assert took < 5 and took < MLFLOW_HTTP_REQUEST_TIMEOUT.default / 20
    assert spool.state["sent"] == 0 and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


class Records(logging.Handler):
    """The messages ``ebrl.tracking`` logs (a module fixture cannot use ``caplog``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelno, record.getMessage()))


@pytest.fixture(scope="module")
def outage(server, tmp_path_factory):
    """One outage, two runs through it (a server start costs seconds): ``mid`` keeps training
    through it, ``end`` finishes while the server is down. The server is up again after it."""
    server.ensure_up()
    root = tmp_path_factory.mktemp("outage")
    mid = tracker(server, root / "mid", finish_timeout_s=20)
    end = tracker(server, root / "end", finish_timeout_s=1.5)
    for step in (1, 2, 3):
        log_step(mid, step)
    for step in (1, 2):
        log_step(end, step)
    before = [m.step for m in MlflowClient(server.uri).get_metric_history(mid.run_id, "loss")]

    server.stop()
    records = Records()
    logger = logging.getLogger("ebrl.tracking")
    logger.addHandler(records)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        took = [log_step(mid, step) for step in range(4, 9)]
        artifact = root / "mid" / "summary.json"
        artifact.write_text("{}")
        mid.log_artifact(artifact)  # queued for finish
        for step in (3, 4):
            log_step(end, step)
        t0 = time.monotonic()
        end.finish("FINISHED")  # raises nothing
        finish_s = time.monotonic() - t0
    finally:
        logger.removeHandler(records)
        logger.setLevel(old_level)
    end_state = json.loads((root / "end" / "mlflow_spool.state.json").read_text())
    server.start()
    return dict(
        mid=mid, end=end, before=before, took=took, finish_s=finish_s, end_state=end_state
    ) | {"records": records.messages}


def test_outage_mid_run_loses_nothing(server, outage):
    mid, spool = outage["mid"], outage["mid"]._spool.path
    assert outage["before"] == [1, 2, 3]
    # each call during the outage is one refused connection, not MLflow's retries (~4 min)
    default_s = mlflow_default_wait_s()
    assert default_s > 60
    took = outage["took"]
    assert max(took) < 5 and max(took) < default_s / 50, took
    warnings = [m for lvl, m in outage["records"] if lvl == logging.WARNING and str(spool) in m]
    assert len(warnings) == 1, warnings  # once per outage
    assert "unreachable" in warnings[0] and server.uri in warnings[0]

    log_step(mid, 9)  # the first call after the outage sends the backlog, then its own line
    client = MlflowClient(server.uri)
    assert [m.step for m in client.get_metric_history(mid.run_id, "loss")] == list(range(1, 10))
    log_step(mid, 10)
    mid.finish("FINISHED")
    assert_history(server.uri, mid.run_id, list(range(1, 11)), spool)
    assert client.get_run(mid.run_id).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(mid.run_id)] == ["summary.json"]
    state = json.loads(spool.with_suffix(".state.json").read_text())
    assert state["sent"] == spool.stat().st_size
    assert state["status"] is None and state["artifacts"] == []


def test_server_down_at_finish_then_replay(server, outage):
    end = outage["end"]
    run_dir = end._spool.path.parent
    assert outage["finish_s"] < 10
    errors = [m for lvl, m in outage["records"] if lvl == logging.ERROR]
    assert any(f"python -m ebrl.tracking replay {run_dir}" in e for e in errors), errors
    assert outage["end_state"]["status"] == "FINISHED"  # pending
    assert outage["end_state"]["run_id"] == end.run_id

    client = MlflowClient(server.uri)
    assert client.get_run(end.run_id).info.status == "RUNNING"
    res = subprocess.run(
        [sys.executable, "-m", "ebrl.tracking", "replay", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 metric lines" in res.stdout and "final status FINISHED" in res.stdout
    assert_history(server.uri, end.run_id, [1, 2, 3, 4], run_dir / SPOOL_NAME)
    assert client.get_run(end.run_id).info.status == "FINISHED"
    assert json.loads((run_dir / "mlflow_spool.state.json").read_text())["status"] is None


def test_resumed_job_sends_only_what_was_not_sent(server, tmp_path, monkeypatch):
    server.ensure_up()
    run_dir = tmp_path / "resume"
    first = tracker(server, run_dir)
    for step in (1, 2, 3):
        log_step(first, step)

    def refused(self, run_id, metrics=(), **kw):
        raise MlflowException("API request failed with exception ConnectionError (refused)")

    monkeypatch.setattr(MlflowClient, "log_batch", refused)
    for step in (4, 5):
        log_step(first, step)  # kept in the spool; then the job dies without finish()
    monkeypatch.undo()

    sent: list[tuple[str, int]] = []
    real = MlflowClient.log_batch

    def recording(self, run_id, metrics=(), **kw):
        sent.extend((m.key, m.step) for m in metrics)
        return real(self, run_id, metrics=metrics, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", recording)
    again = tracker(server, run_dir, resume_id=first.run_id)
    # not 1..3 again; then the second attempt's counts (the first died: not a preemption)
    counts = [("fault/attempts", 0), ("fault/preemptions", 0)]
    assert sorted(sent) == sorted([(k, s) for k in KEYS for s in (4, 5)] + counts)
    log_step(again, 6)
    again.finish()
    assert sorted(step for _, step in sent) == [0, 0, 4, 4, 5, 5, 6, 6]
    run = MlflowClient(server.uri).get_run(first.run_id)
    assert (run.data.metrics["fault/attempts"], run.data.metrics["fault/preemptions"]) == (2, 0)
    assert_history(server.uri, first.run_id, [1, 2, 3, 4, 5, 6], run_dir / SPOOL_NAME)
    assert MlflowClient(server.uri).get_run(first.run_id).info.status == "FINISHED"

    # a new run in the same folder keeps the old spool aside, replayable, and starts its own
    new = tracker(server, run_dir)
    assert (run_dir / f"mlflow_spool.{first.run_id}.jsonl").exists()
    assert (run_dir / f"mlflow_spool.{first.run_id}.state.json").exists()
    log_step(new, 1)
    new.finish()
    assert len((run_dir / SPOOL_NAME).read_text().splitlines()) == 2  # its counts, step 1
    assert_history(server.uri, new.run_id, [1], run_dir / SPOOL_NAME)
