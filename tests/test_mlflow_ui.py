"""``make ui`` serves the MLflow store on loopback: started on a free port, queried, stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


@pytest.mark.timeout(240)
def test_make_ui_serves_the_store_on_loopback(tmp_path):
    from ebrl.tracking.tracker import MLflowTracker

    store = tmp_path / "mlflow"
    tr = MLflowTracker(uri=None, store=store, experiment="ui-test", run_name="r1", tags={})
    tr.log_metrics({"summary/throughput_e2e": 123.0}, step=1)
    tr.finish()

    port = free_port()
    cmd = ["make", "-s", "--no-print-directory", "ui", f"UI_PORT={port}", f"MLFLOW_STORE={store}"]
    dry = subprocess.run([*cmd, "-n"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "--host 127.0.0.1" in dry.stdout and f"sqlite:///{store}/mlflow.db" in dry.stdout

    log = (tmp_path / "ui.log").open("w")
    # its own session: make, the shell and mlflow's workers share one process group
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        while True:
            assert proc.poll() is None, (tmp_path / "ui.log").read_text()[-3000:]
            try:
                status, body = get(f"{base}/health")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "MLflow UI did not come up"
            time.sleep(1.0)
        assert body.strip() == b"OK"
        _, body = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=ui-test")
        exp_id = json.loads(body)["experiment"]["experiment_id"]
        _, body = get(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": [exp_id]})
        runs = json.loads(body)["runs"]
        assert [r["info"]["run_name"] for r in runs] == ["r1"]
        metrics = {m["key"]: m["value"] for m in runs[0]["data"]["metrics"]}
        assert metrics["summary/throughput_e2e"] == 123.0
        # bound to loopback only
        import psutil

        listening = {
            c.laddr.ip
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        }
        assert listening == {"127.0.0.1"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group make leads: make, mlflow, its worker
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
    time.sleep(1.0)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of it is left
