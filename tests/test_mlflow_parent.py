"""A sweep is one MLflow run with its jobs as children: ``ebrl.launch`` makes the sweep's run before
the jobs start, passes its id on every array's command, and ends it with the jobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ebrl.launch.preview import describe
from ebrl.launch.runs import array_parent, end_sweep_runs, start_sweep_runs
from ebrl.launch.sweep import hydra_command, plan
from ebrl.tracking.tracker import MLflowTracker

from .conftest import TINY, make_cfg

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """One MLflow store for the module (creating one costs seconds); each test its experiment."""
    return tmp_path_factory.mktemp("mlflow")


def job_cfg(store: Path, run_dir: Path, *extra: str):
    return make_cfg([*TINY, f"run_dir={run_dir}", f"tracking.store={store}", *extra])


def child(store: Path, experiment: str, parent: str, name: str, status: str, **tags: str) -> str:
    """A job's run as ebrl.train makes it (tags, parent), ended with ``status``."""
    tr = MLflowTracker(
        uri=None,
        store=store,
        experiment=experiment,
        run_name=name,
        tags={**tags, "mlflow.parentRunId": parent},
    )
    tr.log_metrics({"summary/throughput_e2e": 10.0, "time/wall_s": 1.0}, step=1)
    tr.finish(status)
    assert tr.run_id is not None
    return tr.run_id


def test_a_sweep_run_parents_its_jobs_and_ends_with_them(store, tmp_path):
    from analysis.export import export_runs
    from ebrl.train import train

    p = plan("smoke", ["scheduler=sync", "seed=0,1", f"tracking.store={store}"])
    command = "python -m ebrl.launch smoke scheduler=sync seed=0,1"
    parents = start_sweep_runs(p, command)
    ((_, _, experiment), pid), *more = parents.items()
    assert not more and experiment == "smoke"
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    parent = client.get_run(pid)
    tags = parent.data.tags
    assert parent.info.run_name == "smoke" and parent.info.status == "RUNNING"
    assert tags["run_kind"] == "sweep" and tags["sweep"] == "smoke"
    assert tags["command"] == command and tags["git_commit"]
    assert "[1] python -m ebrl.train +sweep=smoke" in tags["mlflow.note.content"]
    assert parent.data.params["jobs"] == "2"
    assert {a.path for a in client.list_artifacts(pid)} == {"sweep_plan.txt", "sweep_plan.json"}
    # every array's command carries the parent's id: the jobs Submitit pickles have it
    (array,) = p.arrays
    cmd = hydra_command(p, array, array_parent(p, array, parents))
    assert cmd[-1] == f"tracking.parent_run_id={pid}"

    # a job: ebrl.train with the override is the parent's child, tagged with its options
    train(job_cfg(store, tmp_path, "tracking.experiment=smoke", f"tracking.parent_run_id={pid}"))
    (job,) = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{pid}'"
    )
    assert (job.data.tags["scheduler"], job.data.tags["simulator"]) == ("sync", "counting")
    end_sweep_runs(p, parents, [0], killed=False)
    parent = client.get_run(pid)
    assert parent.info.status == "FINISHED"
    assert (
        parent.data.metrics["sweep/jobs"] == 2 and parent.data.metrics["sweep/runs_finished"] == 1
    )

    # the export reads the jobs and leaves the sweep's run out, saying so
    ex = export_runs(f"sqlite:///{store / 'mlflow.db'}", ["smoke"])
    assert ex.runs["run_id"].tolist() == [job.info.run_id]
    assert ex.report.sweeps == [f"smoke ({pid})"]


@pytest.mark.parametrize(
    ("codes", "killed", "child_status", "expected"),
    [
        ([0], False, "FAILED", "FAILED"),  # a job failed, Hydra went on
        ([1], False, "FINISHED", "FAILED"),  # an array failed
        ([], True, "FINISHED", "KILLED"),  # the launcher was stopped
    ],
)
def test_the_sweep_run_fails_with_a_job(store, codes, killed, child_status, expected):
    name = f"status-{expected}-{len(codes)}"
    p = plan("smoke", ["scheduler=sync", "seed=0,1", f"tracking.store={store}"])
    p.stores = {(u, s, name) for u, s, _ in p.stores}  # this case's own experiment
    p.job_stores = {i: next(iter(p.stores)) for i in p.job_stores}
    parents = start_sweep_runs(p, "python -m ebrl.launch smoke")
    (((_, _, experiment), pid),) = parents.items()
    child(store, experiment, pid, "a", "FINISHED", scheduler="sync")
    child(store, experiment, pid, "b", child_status, scheduler="sync")
    end_sweep_runs(p, parents, codes, killed=killed)
    run = MlflowClient(f"sqlite:///{store / 'mlflow.db'}").get_run(pid)
    assert run.info.status == expected
    assert run.data.metrics["sweep/runs"] == 2


def test_a_resumed_job_keeps_its_parent(store, tmp_path):
    """The second attempt of a job (a requeue, or the same command by hand without the override)
    continues its run, whose parent stays the sweep's."""
    from ebrl.train import train

    # MLflow keeps the tag whether or not the parent exists: an id stands for the sweep's run
    exp = "tracking.experiment=resume"
    train(job_cfg(store, tmp_path, exp, "budget.iterations=2", "tracking.parent_run_id=p0"))
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    s = train(job_cfg(store, tmp_path, exp, "budget.iterations=3"))
    assert s.iterations == 3
    (resumed,) = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert resumed.info.run_id == run.info.run_id
    assert resumed.data.tags["mlflow.parentRunId"] == "p0"
    assert resumed.data.tags["resumed"] == "true"


def test_the_dry_run_says_where_the_sweep_run_goes(tmp_path):
    p = plan("smoke", ["scheduler=sync", "seed=0", f"tracking.store={tmp_path}"])
    text = describe(p, dry_run=True)
    assert "MLflow: the sweep's own run 'smoke' in experiment 'smoke'" in text
    assert "will be the parent of its jobs' runs" in text
    assert not (tmp_path / "mlflow.db").exists()  # a dry run creates nothing


@pytest.mark.slow  # two real sweeps through Hydra, ~2-3 min on 2 cores
@pytest.mark.timeout(900)
def test_launched_sweeps_end_their_run_finished_or_failed(tmp_path):
    store = tmp_path / "mlflow"
    base = [sys.executable, "-m", "ebrl.launch", "smoke", f"tracking.store={store}"]
    ok = subprocess.run(
        [*base, "scheduler=sync", "seed=0,1", "--out", str(tmp_path / "ok")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    bad = subprocess.run(
        [
            *base,
            "scheduler=sync",
            "seed=0",
            "simulator.fail_after_steps=10",
            "tracking.experiment=smoke-bad",
            "--out",
            str(tmp_path / "bad"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert bad.returncode != 0
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    for experiment, status, jobs in (("smoke", "FINISHED", 2), ("smoke-bad", "FAILED", 1)):
        runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        (parent,) = [r for r in runs if r.data.tags.get("run_kind") == "sweep"]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert parent.info.status == status, (experiment, ok.stdout[-2000:], bad.stdout[-2000:])
        assert len(children) == jobs == len(runs) - 1
        assert all(c.data.tags["scheduler"] == "sync" for c in children)
