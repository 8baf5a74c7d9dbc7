"""A CPU-size sweep through Submitit, end to end: 2 schedulers x 3 seeds on the counting env, each
job its own process (hydra/launcher=submitit_local via launcher=submitit_local), 6 MLflow runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~80 s: in `make test-slow`, which CI runs after `make test`
@pytest.mark.timeout(600)
def test_smoke_sweep_lands_as_six_mlflow_runs(tmp_path):
    # EBRL's in-process backend (threads): six Ray instances would not fit two cores
    conf = tmp_path / "conf" / "scheduler"
    conf.mkdir(parents=True)
    (conf / "ebrl_threads.yaml").write_text(
        "defaults:\n  - ebrl_schema\n  - _self_\nbackend: inprocess\nsim_workers: 1\n"
    )
    store, sweep_dir = tmp_path / "mlflow", tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "ebrl.launch",
        "smoke",
        "launcher=submitit_local",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "scheduler=sync,ebrl_threads",
        f"tracking.store={store}",
        "--out",
        str(sweep_dir),
    ]
    before = set(ROOT.glob(".submitit*"))
    # cwd=tmp_path: anything written relative to the cwd stays in tmp_path; stdin closed
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=560, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    client = mlflow.tracking.MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name("smoke")
    runs = client.search_runs([exp.experiment_id])
    # the sweep's own run (ebrl.launch), FINISHED with its jobs, and one child run per job
    (parent,) = [r for r in runs if r.data.tags.get("run_kind") == "sweep"]
    assert parent.info.run_name == "smoke" and parent.info.status == "FINISHED"
    runs = [r for r in runs if r.info.run_id != parent.info.run_id]
    assert len(runs) == 6
    # tagged with the options as typed (a custom option by its own name)
    got = {(r.data.tags["scheduler"], r.data.tags["seed"]) for r in runs}
    assert got == {(s, str(k)) for s in ("sync", "ebrl_threads") for k in range(3)}
    for r in runs:
        assert r.info.status == "FINISHED"
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert r.data.tags["simulator"] == "counting" and r.data.tags["policy"] == "mlp"
        assert r.data.params["launcher.kind"] == "submitit_local"
        assert r.data.metrics["summary/throughput_e2e"] > 0
    # one process per job: each left its Submitit folder (logs, pickles) under the sweep folder
    jobs = [d for d in (sweep_dir / ".submitit").iterdir() if d.name != "%j"]
    assert len(jobs) == 6
    assert all(any(d.glob("*_log.out")) for d in jobs)
    assert sorted(p.name for p in sweep_dir.iterdir() if p.name.isdigit()) == list("012345")
    assert set(ROOT.glob(".submitit*")) == before  # nothing left in the repository
