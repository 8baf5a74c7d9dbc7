"""analysis.export on a temporary sqlite MLflow store holding a few fake runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.export import ExportError, export_runs, main, write

mlflow = pytest.importorskip("mlflow")


def _log_run(
    client, exp_id, name, *, scheduler, seed, params, success=True, status="FINISHED", evals=False
):
    """One fake run shaped like train.py's: tags, params, per-update metrics, summary."""
    from mlflow.entities import Metric, Param

    tags = {"scheduler": scheduler, "seed": str(seed), "policy": "MLPPolicy", "sweep": "t"}
    tags.update(simulator="PushCube-v1", algo="PPO", git_commit="abc", implementation="ebrl")
    run_id = client.create_run(exp_id, run_name=name, tags=tags).info.run_id
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
    speed = 200.0 if scheduler == "EBRLScheduler" else 100.0
    metrics = []
    for i in range(1, 5):
        step, wall = 800 * i, 800 * i / speed
        metrics += [
            Metric("time/wall_s", wall, 1000 * i, step),
            Metric("throughput/env_steps_per_s", speed + seed, 1000 * i, step),
            Metric("time/sim/busy_s", wall / 2, 1000 * i, step),
        ]
        if success:
            metrics.append(Metric("env/success_rate", 0.25 * i, 1000 * i, step))
    final = {"summary/throughput_e2e": speed + seed, "summary/wall_s": 3200 / speed}
    final.update({"summary/throughput_overall": speed, "summary/overhead_frac": 0.1})
    if success:
        final["summary/success_rate"] = 1.0
    if evals:
        final["summary/eval_success_rate"] = 0.9
    metrics += [Metric(k, v, 9000, 3200) for k, v in final.items()]
    client.log_batch(run_id, metrics=metrics)
    client.set_terminated(run_id, status=status)
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """sqlite store: ``exp`` (2 schedulers x 2 seeds + a failed run), ``partial`` (one run without
    success metrics), ``empty`` (no runs)."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.tracking.MlflowClient(uri)
    art = (root / "art").as_uri()
    exp = client.create_experiment("exp", artifact_location=art)
    base = {"num_envs": 16, "chunk_size": 4, "policy.hidden": 256}
    ebrl = {**base, "scheduler.overlap": True, "scheduler.staleness": 1, "scheduler.pipeline": True}
    for seed in (0, 1):
        _log_run(client, exp, f"sync-s{seed}", scheduler="SyncScheduler", seed=seed, params=base)
        _log_run(client, exp, f"ebrl-s{seed}", scheduler="EBRLScheduler", seed=seed, params=ebrl)
    off = {**ebrl, "scheduler.overlap": False}
    _log_run(client, exp, "bad", scheduler="EBRLScheduler", seed=2, params=off, status="FAILED")
    part = client.create_experiment("partial", artifact_location=art)
    elastic = {**off, "resources.allocator": "elastic"}
    _log_run(
        client, part, "nosucc", scheduler="EBRLScheduler", seed=0, params=elastic, success=False
    )
    client.create_experiment("empty", artifact_location=art)
    ev = client.create_experiment("evals", artifact_location=art)
    _log_run(client, ev, "ev-s0", scheduler="SyncScheduler", seed=0, params=base, evals=True)
    return uri


def test_export_runs_and_curves(store):
    ex = export_runs(store, ["exp"])
    runs, curves = ex.runs, ex.curves
    assert len(runs) == 4 and set(runs["status"]) == {"FINISHED"}
    assert ex.report.excluded == [f"bad ({_id(store, 'exp', 'bad')}): FAILED"]
    assert set(runs["scheduler_variant"]) == {"SyncScheduler", "EBRLScheduler"}
    assert runs["seed"].tolist() == [0, 1, 0, 1]  # sorted by variant then seed, numeric
    e0 = runs[runs["run_name"] == "ebrl-s0"].iloc[0]
    assert e0["throughput_e2e"] == 200.0 and e0["success_rate"] == 1.0
    assert e0["param.num_envs"] == 16 and e0["param.scheduler.staleness"] == 1
    assert bool(e0["param.scheduler.overlap"]) is True
    assert e0["sweep"] == "t"  # custom tags are columns too
    # params that do not apply to a run are empty; summary metrics are never
    assert (
        runs.loc[runs["scheduler_variant"] == "SyncScheduler", "param.scheduler.staleness"]
        .isna()
        .all()
    )
    assert not runs[["throughput_e2e", "success_rate", "wall_s"]].isna().any().any()
    assert "param.policy.hidden" not in runs  # neither a key param nor varying
    assert list(curves.columns) == ["run_id", "step", "wall_s", "timestamp", "key", "value"]
    assert set(curves["key"]) == {
        "throughput/env_steps_per_s",
        "env/success_rate",
        "time/sim/busy_s",
    }
    one = curves[(curves["run_id"] == e0["run_id"]) & (curves["key"] == "env/success_rate")]
    assert one["step"].tolist() == [800, 1600, 2400, 3200]
    assert one["wall_s"].tolist() == [4.0, 8.0, 12.0, 16.0]
    assert one["value"].tolist() == [0.25, 0.5, 0.75, 1.0]


def _id(uri: str, exp: str, name: str) -> str:
    client = mlflow.tracking.MlflowClient(uri)
    eid = client.get_experiment_by_name(exp).experiment_id
    (r,) = client.search_runs([eid], filter_string=f"attributes.run_name = '{name}'")
    return r.info.run_id


def test_optional_summary_metric_is_exported_once_any_run_has_it(store):
    assert "eval_success_rate" not in export_runs(store, ["exp"]).runs  # no run evaluated
    ex = export_runs(store, ["evals"])
    assert ex.runs["eval_success_rate"].tolist() == [0.9]
    with pytest.raises(ExportError) as e:  # then every run must have it: no silent holes
        export_runs(store, ["exp", "evals"])
    assert "sync-s0" in str(e.value) and "summary/eval_success_rate" in str(e.value)


def test_unfinished_runs_on_request(store):
    ex = export_runs(store, ["exp"], statuses=("FINISHED", "FAILED"))
    bad = ex.runs[ex.runs["run_name"] == "bad"].iloc[0]
    assert bad["scheduler_variant"] == "EBRLScheduler[-overlap]" and bad["status"] == "FAILED"
    assert ex.report.excluded == []


def test_missing_metric_raises_and_names_the_run(store):
    with pytest.raises(ExportError) as e:
        export_runs(store, ["exp", "partial"])
    msg = str(e.value)
    assert "nosucc" in msg and "summary/success_rate" in msg and "env/success_rate" in msg


def test_allow_missing_writes_explicit_nan_and_reports(store, tmp_path):
    ex = export_runs(store, ["exp", "partial"], allow_missing=True)
    row = ex.runs[ex.runs["run_name"] == "nosucc"].iloc[0]
    assert math.isnan(row["success_rate"]) and row["throughput_e2e"] == 200.0
    assert row["scheduler_variant"] == "EBRLScheduler[-overlap]+elastic"
    assert row["param.resources.allocator"] == "elastic"
    (label,) = ex.report.missing
    assert label.startswith("nosucc (")
    assert ex.report.missing[label] == ["summary/success_rate", "env/success_rate"]
    paths = write(ex, tmp_path / "out", command="test")
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    meta = json.loads((tmp_path / "out" / "export.json").read_text())
    assert any("nosucc" in line for line in meta["lines"])
    back = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert back["success_rate"].isna().sum() == 1 and len(back) == 5


def test_empty_and_unknown_experiments(store):
    with pytest.raises(ExportError, match="'empty' has no runs"):
        export_runs(store, ["exp", "empty"])
    with pytest.raises(ExportError, match="nothing to export"):
        export_runs(store, ["empty"], allow_missing=True)
    with pytest.raises(ExportError, match="no experiment named"):
        export_runs(store, ["nope"])
    ex = export_runs(store, ["exp", "empty"], allow_missing=True)
    assert len(ex.runs) == 4 and ex.report.empty == ["experiment 'empty' has no runs"]


def test_tag_filter_across_experiments(store):
    ex = export_runs(store, tag="sweep=t", allow_missing=True)
    assert set(ex.runs["experiment"]) == {"exp", "partial", "evals"}
    assert len(export_runs(store, ["exp"], tag="scheduler=SyncScheduler").runs) == 2


def test_cli(store, tmp_path, capsys):
    assert main(["--uri", store, "--experiment", "exp", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "exported 4 runs" in out and "runs.csv" in out
    assert (tmp_path / "o" / "curves.csv").stat().st_size > 0
    assert main(["--uri", store, "--experiment", "partial", "--out", str(tmp_path / "p")]) == 1
    assert "nosucc" in capsys.readouterr().err


def test_written_provenance_names_no_absolute_path_of_this_machine(store, tmp_path, monkeypatch):
    db = Path(store.removeprefix("sqlite:///"))
    cwd = db.parent.parent  # pytest's base folder: the store and tmp_path are under it
    monkeypatch.chdir(cwd)
    ex = export_runs(store, ["exp"])
    out = tmp_path / "out"
    write(ex, out, command=f"python -m analysis.export --uri {store} --out {out}")
    meta = json.loads((out / "export.json").read_text())
    rel_db, rel_out = db.relative_to(cwd), out.relative_to(cwd)
    assert meta["report"]["uri"] == f"sqlite:///{rel_db}"
    assert meta["command"] == f"python -m analysis.export --uri sqlite:///{rel_db} --out {rel_out}"
    assert str(cwd) not in (out / "export.json").read_text()
