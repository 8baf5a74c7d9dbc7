"""The EBRL scheduler on Ray: same results as in-process, failures named, nothing left behind,
and a multi-node cluster (Ray's own multi-node-on-one-machine utility) working the same way."""

from __future__ import annotations

import json

import psutil
import pytest

from ebrl.schedulers.base import StageError
from ebrl.schedulers.ebrl import EBRLScheduler
from ebrl.train import train

from .conftest import TINY, make_cfg
from .test_ebrl_scheduler import context

ray = pytest.importorskip("ray")

RAY_PROCS = ("raylet", "gcs_server", "ray::", "default_worker.py")
#: set in this module's tests, so inherited by every Ray process they start (raylet, GCS, workers)
TAG = "EBRL_RAY_TEST_TAG"


@pytest.fixture(autouse=True)
def _tag_ray_processes(monkeypatch):
    """Mark the Ray processes this test starts: another Ray instance on the machine (a user's job,
    a benchmark) is not this test's to count."""
    import uuid

    monkeypatch.setenv(TAG, uuid.uuid4().hex)


def ray_pids() -> set[int]:
    """Ray processes started by the running test (they carry its tag in their environment)."""
    import os

    tag = os.environ.get(TAG)
    out = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if not any(t in cmd for t in RAY_PROCS):
            continue
        try:
            if tag is None or p.environ().get(TAG) == tag:
                out.add(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def wait_gone(before: set[int], timeout: float = 20.0) -> set[int]:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        left = ray_pids() - before
        if not left:
            return left
        time.sleep(0.5)
    return ray_pids() - before


def reports(cfg, sched, n):
    _, ctx = context(cfg)
    gen = sched.run(ctx)
    try:
        return [next(gen) for _ in range(n)]
    finally:
        gen.close()


@pytest.mark.slow  # ~27 s; make test-slow (CI runs it)
def test_ray_and_inprocess_backends_give_the_same_results():
    """k = 0 makes the versions deterministic; per-env noise makes actions batch-independent."""
    cfg = make_cfg([*TINY, "num_envs=6", "scheduler=ebrl", "tracking.enabled=false"])
    kw = dict(overlap=False, pipeline=True, step_level=True, batch_timeout_ms=1.0)
    before = ray_pids()
    a = reports(cfg, EBRLScheduler(backend="inprocess", **kw), 3)
    b = reports(cfg, EBRLScheduler(backend="ray", **kw), 3)
    for x, y in zip(a, b):
        assert x.env_steps == y.env_steps
        for key in ("env/return", "env/episodes", "train/policy_loss", "train/value_loss"):
            assert x.metrics[key] == pytest.approx(y.metrics[key], rel=1e-4, abs=1e-5), key
    assert not ray.is_initialized()
    assert not wait_gone(before)


def test_dead_env_worker_is_named_and_the_run_keeps_its_data(tmp_path):
    before = ray_pids()
    cfg = make_cfg(
        [
            *TINY,
            "scheduler=ebrl",
            "budget.iterations=20",
            "simulator.fail_after_steps=30",
            "simulator.fail_mode=exit",
        ],
        tmp_path,
    )
    with pytest.raises(StageError, match=r"stage 'sim\d' failed: .*died"):
        train(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["iterations"] >= 1
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ebrl").experiment_id])
    assert run.info.status == "FAILED"
    hist = client.get_metric_history(run.info.run_id, "throughput/env_steps_per_s")
    assert len(hist) == summary["iterations"]
    assert not wait_gone(before)


def test_stage_exception_on_ray_shuts_everything_down():
    before = ray_pids()
    cfg = make_cfg(
        [*TINY, "scheduler=ebrl", "tracking.enabled=false", "simulator.fail_after_steps=12"]
    )
    _, ctx = context(cfg)
    with pytest.raises(StageError, match=r"injected failure"):
        for _ in EBRLScheduler(backend="ray").run(ctx):
            pass
    assert not ray.is_initialized()
    assert not wait_gone(before)


@pytest.mark.slow  # a 2-node Ray cluster: ~30 s; make test-slow (CI runs it)
def test_multi_node_cluster_places_roles_by_resources():
    from ray.cluster_utils import Cluster

    before = ray_pids()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"learner_node": 1}},
    )
    cluster.add_node(num_cpus=1, resources={"sim_node": 1})
    try:
        ray.init(address=cluster.address)
        cfg = make_cfg([*TINY, "scheduler=ebrl", "tracking.enabled=false"])
        sched = EBRLScheduler(
            backend="ray",
            resources={
                "sim": {"sim_node": 0.1},
                "gen": {"learner_node": 0.1},
                "learner": {"learner_node": 0.1},
            },
        )
        reps = reports(cfg, sched, 2)
        assert [r.iteration for r in reps] == [0, 1]
        assert ray.is_initialized()  # we joined a cluster we did not start: left running
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        assert any("sim_node" in r for r in nodes.values()) and len(nodes) == 2
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert not wait_gone(before)


def _kill_when(run_dir, updates: int, title: str, done: list) -> None:
    """SIGKILL the Ray worker whose process title starts with ``title`` once ``updates`` have
    been logged in ``run_dir`` (from a thread: ``train`` runs in the main one)."""
    import os
    import signal
    import time

    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            if json.loads((run_dir / "progress.json").read_text())["iterations"] >= updates:
                break
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.05)
    for pid in ray_pids():
        try:
            if psutil.Process(pid).cmdline()[0].startswith(title):
                os.kill(pid, signal.SIGKILL)
                done.append(pid)
                return
        except (psutil.NoSuchProcess, IndexError):
            continue


@pytest.mark.parametrize(
    "step_level",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # `make test-slow`
)
def test_a_dead_generator_is_replaced_and_no_transition_is_lost(step_level, tmp_path):
    """SIGKILL of the generator's process mid-run: a replacement takes the newest weights, its
    env workers hand their envs over, and the run finishes with the staleness bound held (the
    learner raises StalenessError otherwise) and every trained step accounted for by the env
    workers' ledger; no env was reset (the env workers kept every decision)."""
    import threading

    from ebrl.ledger import account
    from ebrl.stages.train import load_checkpoint

    before = ray_pids()
    # a tiny update takes tens of ms: the run must outlast finding and killing the process
    # (8 updates were over before the kill landed once, in a full suite on 2 cores)
    iters = 20
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    cfg = make_cfg(
        [*over, "scheduler=ebrl", f"budget.iterations={iters}", "simulator.delay_s=0.005",
         f"scheduler.step_level={str(step_level).lower()}", "scheduler.pipeline=true"],
        tmp_path,
    )  # fmt: skip
    killed: list[int] = []
    watcher = threading.Thread(
        target=_kill_when, args=(tmp_path / "run", 2, "ray::GenWorker", killed), daemon=True
    )
    watcher.start()
    summary = train(cfg)
    watcher.join(timeout=5)
    assert killed, "the generator's process was never found"
    assert summary.status == "FINISHED" and summary.iterations == iters
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["fault/gen_restarts"] == 1.0
    assert rows[-1]["fault/env_worker_restarts"] == 0.0
    assert all(r.get(f"pipeline/staleness_frac_{v}", 0.0) == 0.0 for r in rows for v in (2, 3))
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    acc = account(tmp_path / "run", iters)
    assert acc.trained == ckpt["trained_env_steps"] == summary.env_steps
    assert acc.superseded == 0  # no env worker redid anything
    assert not wait_gone(before)
