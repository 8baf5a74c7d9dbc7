"""Preemption: SIGTERM mid-run, then the same command again, continues the same MLflow run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import TINY

mlflow = pytest.importorskip("mlflow")
ROOT = Path(__file__).resolve().parents[1]


def command(tmp_path: Path) -> list[str]:
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    return [
        sys.executable,
        "-m",
        "ebrl.train",
        *over,
        "budget.iterations=10",
        "simulator.delay_s=0.01",
        f"run_dir={tmp_path / 'run'}",
        f"tracking.store={tmp_path / 'mlflow'}",
    ]


@pytest.mark.slow  # ~30 s; make test has the fault matrix's sync-usr2 cell (tests/test_faults.py)
def test_sigterm_then_rerun_resumes_into_the_same_mlflow_run(tmp_path):
    progress = tmp_path / "run" / "progress.json"
    proc = subprocess.Popen(
        command(tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if progress.exists() and json.loads(progress.read_text())["iterations"] >= 3:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run made no progress")
        proc.send_signal(signal.SIGTERM)  # what Slurm sends before preempting a job
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = json.loads(progress.read_text())
    assert 3 <= before["iterations"] < 10, before

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ebrl")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "KILLED"
    first = client.get_metric_history(run.info.run_id, "env/steps_total")

    subprocess.run(command(tmp_path), cwd=ROOT, check=True, capture_output=True, timeout=300)
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id]  # the same run, not a new one
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags.get("resumed") == "true"
    hist = sorted(
        client.get_metric_history(run.info.run_id, "env/steps_total"), key=lambda m: m.timestamp
    )
    steps = [m.value for m in hist]
    assert len(hist) == 10 and len(first) == before["iterations"]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # continued, not restarted
    wall = [
        m.value
        for m in sorted(
            client.get_metric_history(run.info.run_id, "time/wall_s"), key=lambda m: m.timestamp
        )
    ]
    assert wall == sorted(wall)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == 10 and summary["status"] == "FINISHED"
    import torch

    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    # the learner continued from its checkpoint: its version counts every update of both attempts
    assert ckpt["version"] >= 10


def test_a_run_folder_refuses_to_resume_a_different_config(tmp_path):
    from ebrl.config import ConfigError
    from ebrl.train import train

    from .conftest import make_cfg

    base = [*TINY, f"run_dir={tmp_path / 'run'}", "tracking.enabled=false"]
    train(make_cfg(base))
    with pytest.raises(ConfigError, match="different config"):
        train(make_cfg([*base, "seed=7"]))
    # a bigger budget is the same run: it resumes
    s = train(
        make_cfg(
            [o if not o.startswith("budget.iterations") else "budget.iterations=5" for o in base]
        )
    )
    assert s.iterations == 5
