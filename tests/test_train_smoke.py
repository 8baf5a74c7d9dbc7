"""A whole run through train(cfg): outputs on disk and in a temporary MLflow store."""

import json

import pytest

from ebrl.train import train

mlflow = pytest.importorskip("mlflow")


def test_train_logs_to_mlflow_and_writes_summary(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    s = train(cfg)
    assert s.iterations == 3 and s.status == "FINISHED"
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == s.env_steps > 0
    assert summary["throughput_e2e"] > 0
    assert {"gen", "sim", "train"} <= set(summary["stage_busy_s"])
    assert (run_dir / "metrics.csv").read_text().count("\n") == 4
    trace = json.loads((run_dir / "timeline.json").read_text())
    assert any(e.get("name") == "train" for e in trace["traceEvents"])

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ebrl")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    # the config options users type, and the classes behind them
    tags = run.data.tags
    assert (tags["scheduler"], tags["policy"], tags["simulator"], tags["gpu"]) == (
        "sync",
        "mlp",
        "counting",
        "cpu",
    )
    assert (tags["scheduler_class"], tags["policy_class"]) == ("SyncScheduler", "MLPPolicy")
    assert "mlflow.parentRunId" not in tags  # a run started by hand has no parent
    assert run.data.tags["seed"] == "0"
    assert run.data.params["num_envs"] == "4"
    hist = client.get_metric_history(run.info.run_id, "throughput/env_steps_per_s")
    assert len(hist) == 3
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "config.yaml", "timeline.json", "metrics.csv"} <= arts


def test_failed_run_keeps_its_data(tiny_cfg, tmp_path, monkeypatch):
    """A stage that raises: the error propagates, the run is marked FAILED, data so far kept."""
    from ebrl.stages import train as train_mod

    calls = {"n": 0}
    orig = train_mod.TrainStage.train

    def flaky(self, seg):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom in train stage")
        return orig(self, seg)

    monkeypatch.setattr(train_mod.TrainStage, "train", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        train(tiny_cfg())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["iterations"] == 1
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ebrl").experiment_id])
    assert run.info.status == "FAILED"
    assert len(client.get_metric_history(run.info.run_id, "throughput/env_steps_per_s")) == 1


def test_observability_metrics_are_logged(tiny_cfg, tmp_path):
    """Staleness histogram, stage utilisation (bubbles = 1 - busy) per update."""
    import csv

    train(tiny_cfg(["scheduler=ebrl", "scheduler.backend=inprocess", "scheduler.staleness=2"]))
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    keys = {k for r in rows for k, v in r.items() if v}
    assert {"pipeline/sim_busy_frac", "pipeline/gen_busy_frac", "pipeline/train_busy_frac"} <= keys
    assert {"pipeline/ready_depth_mean", "pipeline/gen_batch_mean"} <= keys
    for r in rows:
        fracs = [float(r[k]) for k in r if k.startswith("pipeline/staleness_frac_") and r[k]]
        assert sum(fracs) == pytest.approx(1.0)
        assert all(not r.get(f"pipeline/staleness_frac_{v}") for v in range(3, 9))
    # worker spans reach the driver with telemetry, a little after the report they belong to
    assert 0 < float(rows[-1]["pipeline/train_busy_frac"]) <= 1.0


def test_elastic_allocator_is_refused_outside_the_ebrl_scheduler(tiny_cfg, tmp_path):
    """The resource manager drives scheduler=ebrl only: elsewhere it is refused before any work,
    naming the scheduler and the fix."""
    from ebrl.config import ConfigError

    cfg = tiny_cfg(["resources.allocator=elastic"])
    assert not cfg.scheduler._target_.endswith("EBRLScheduler")
    with pytest.raises(ConfigError, match=r"not wired into scheduler .* use scheduler=ebrl"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_experiment_created_by_a_concurrent_run_is_reused():
    """Runs launched together race to create their experiment: the loser reuses the winner's."""
    from mlflow.exceptions import MlflowException

    from ebrl.tracking.store import experiment_id

    class Racing:
        created = None

        def get_experiment_by_name(self, name):
            return self.created

        def create_experiment(self, name, artifact_location=None):
            self.created = type("Exp", (), {"experiment_id": "7"})()  # the other run won
            raise MlflowException(f"Experiment(name={name}) already exists")

    assert experiment_id(Racing(), "sweep", None) == "7"

    class Broken(Racing):
        def create_experiment(self, name, artifact_location=None):
            raise MlflowException("database is locked")

    with pytest.raises(MlflowException, match="locked"):
        experiment_id(Broken(), "sweep", None)


def test_portable_takes_out_this_machines_paths(tmp_path, monkeypatch):
    from pathlib import Path

    import ebrl
    from ebrl.tracking.provenance import portable

    root = Path(ebrl.__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    assert portable(f"sqlite:///{root}/outputs/m.db") == "sqlite:///outputs/m.db"
    assert portable(f"--out {tmp_path}/results/x") == "--out results/x"
    assert portable("/home/someone/data/f.csv") == "~/data/f.csv"
    assert portable("/srv/elsewhere/f.csv --seeds 0,1") == "/srv/elsewhere/f.csv --seeds 0,1"


def test_a_baseline_refusing_the_run_leaves_no_mlflow_run(tiny_cfg, tmp_path):
    """A scheduler's check(ctx) (here the async baseline's fixed split of the cores) runs before
    the MLflow run is made: a ConfigError naming the fix, and nothing logged."""
    from baselines.colocated import all_cores
    from ebrl.config import ConfigError

    cfg = tiny_cfg(["scheduler=async", "scheduler.backend=inprocess", f"threads.gen={all_cores()}"])
    with pytest.raises(ConfigError, match="fixed split of the cores; lower one"):
        train(cfg)
    assert not (tmp_path / "mlflow").exists()


def test_the_steady_window_is_timed_on_the_reports_arrival(tiny_cfg, tmp_path, monkeypatch):
    """The driver's own work on a report (the resource manager's refit, a search) must not move
    the steady window's ends: throughput is timed on when each update's report arrived
    (``IterationReport.at``), not on when the scheduler was done with it."""
    import dataclasses
    import time

    from ebrl.schedulers.sync import SyncScheduler

    arrived: list[tuple[float, int]] = []
    orig = SyncScheduler.run

    def stalling(self, ctx):
        for rep in orig(self, ctx):
            at = time.perf_counter()
            arrived.append((at, rep.env_steps))
            if rep.iteration == 1:  # the driver busy with the warm-up's last report
                time.sleep(0.5)
            yield dataclasses.replace(rep, at=at)

    monkeypatch.setattr(SyncScheduler, "run", stalling)
    s = train(tiny_cfg(["budget.iterations=5", "warmup_iters=2"]))
    assert s.iterations == 5
    (t_warm, _), (t_end, _) = arrived[1], arrived[-1]
    steady_steps = sum(n for _, n in arrived[2:])
    assert s.throughput_e2e == pytest.approx(steady_steps / (t_end - t_warm), rel=1e-9)
