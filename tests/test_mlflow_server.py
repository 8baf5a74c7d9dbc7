"""``make mlflow-server``: a tracking server a run logs to through ``tracking.uri``, its
artifacts uploaded through the server into the store folder; stopped with nothing left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import TINY, make_cfg
from .test_mlflow_ui import free_port

mlflow = pytest.importorskip("mlflow")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a server and a run through it: ~30-60 s on 2 cores
@pytest.mark.timeout(600)
def test_a_run_logs_through_make_mlflow_server(tmp_path):
    from mlflow.tracking import MlflowClient

    from ebrl.train import train

    store, port = tmp_path / "server-store", free_port()
    cmd = ["make", "-s", "--no-print-directory", "mlflow-server", f"PORT={port}"]
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [*cmd, f"MLFLOW_STORE={store}"], cwd=ROOT, stdout=log, stderr=log, start_new_session=True
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the tracking server did not come up"
            time.sleep(1.0)
        assert f"TRACKING_URI={uri}" in (tmp_path / "server.log").read_text()
        cfg = make_cfg(
            [*TINY, f"run_dir={tmp_path / 'run'}", f"tracking.uri={uri}", "tracking.experiment=srv"]
        )
        s = train(cfg)
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("srv").experiment_id])
        assert run.info.status == "FINISHED" and run.data.tags["scheduler"] == "sync"
        assert run.data.metrics["summary/throughput_e2e"] == pytest.approx(s.throughput_e2e)
        # uploaded through the server (mlflow-artifacts:), kept in the store folder
        assert any((store / "mlartifacts").rglob("summary.json"))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make, mlflow and its worker: one process group
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
    time.sleep(1.0)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
