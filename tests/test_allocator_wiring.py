"""The resource manager wired into the EBRL scheduler: runs on the fake env (in-process unless
said otherwise). The plan reaches the workers, an elastic run reallocates and logs it, nothing a
run changes outlives it, and the default config runs as it did before the manager."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest
import torch

from ebrl.plan.profile import Point, Profile, StageProfile
from ebrl.resources.allotment import ResourceSettings, initial_resources
from ebrl.resources.profiler import rate_table
from ebrl.resources.split import predict
from ebrl.resources.topology import Topology, discover_cores
from ebrl.schedulers.ebrl import worker
from ebrl.train import train

from .conftest import TINY, make_cfg

EBRL = ["scheduler=ebrl", "scheduler.backend=inprocess", "tracking.enabled=false"]
two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")


@pytest.fixture
def applied(monkeypatch):
    """Every Resources message a gen or learner worker applied, with what it reported back."""
    got: list = []
    orig = worker.Worker.apply_resources

    def spy(self, msg):
        done = orig(self, msg)
        got.append((msg, done))
        return done

    monkeypatch.setattr(worker.Worker, "apply_resources", spy)
    return got


def last(applied, worker: str):
    return [done for _, done in applied if done.worker == worker][-1]


def metrics(tmp_path) -> list[dict[str, str]]:
    return list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))


def test_static_default_runs_as_before(tiny_cfg, tmp_path, applied, monkeypatch):
    """threads.* as before, no pinning anywhere, the scheduler's batch_min, nothing reallocated
    (the levels pinned: no shape search)."""
    pins = []
    # env workers pin their home cores, Resources pin gen and learner (both worker.pin_worker)
    monkeypatch.setattr(worker, "pin", lambda *a: pins.append(a))
    monkeypatch.setattr(worker, "pin_process", lambda *a: pins.append(a))
    levels = ["scheduler.pipeline=true", "scheduler.step_level=true"]
    cfg = tiny_cfg([*EBRL, *levels, "threads.gen=1", "threads.train=1"])
    train(cfg)
    assert pins == []
    gen, learner = last(applied, "gen"), last(applied, "learner")
    assert (gen.seq, learner.seq) == (0, 0) and len(applied) == 2
    assert gen.threads == 1 and learner.threads == 1
    assert gen.batch_min == 1  # the scheduler's own: half a group of 2 envs
    run = tmp_path / "run"
    assert not (run / "reallocations.jsonl").exists()
    info = json.loads((run / "resources.json").read_text())
    assert info["allocator"] == "static" and info["gen"]["cores"] is None
    assert all(float(r["resource/gen_threads"]) == 1.0 for r in metrics(tmp_path))


def test_resource_threads_and_batch_reach_the_workers(tiny_cfg, applied):
    """With the levels pinned there is no shape search: the configured threads are the run's."""
    levels = ["scheduler.pipeline=true", "scheduler.step_level=true"]
    cfg = tiny_cfg(
        [*EBRL, *levels, "resources.gen_threads=2", "resources.train_threads=3",
         "resources.gen_batch=2"]
    )  # fmt: skip
    train(cfg)
    gen, learner = last(applied, "gen"), last(applied, "learner")
    assert (gen.threads, gen.batch_min, learner.threads) == (2, 2, 3)


def test_the_searched_threads_reach_the_workers(tiny_cfg, tmp_path, applied):
    """A searched shape carries its thread split, at most the configured threads, and the
    workers run it (shape.json says which; the trials off so the start split stays)."""
    cfg = tiny_cfg([*EBRL, "threads.gen=2", "threads.train=2", "scheduler.reshape_window=0"])
    train(cfg)
    info = json.loads((tmp_path / "run" / "shape.json").read_text())
    want = (info["shape"]["gen_threads"], info["shape"]["train_threads"])
    assert set(info["costs_by_threads"]) == {"1+1", "1+2", "2+1", "2+2"}
    assert {(p["gen_threads"], p["train_threads"]) for p in info["predictions"]} == {
        (1, 1),
        (1, 2),
        (2, 1),
        (2, 2),
    }
    gen, learner = last(applied, "gen"), last(applied, "learner")
    assert (gen.threads, learner.threads) == want


@two_cores
def test_pinned_plan_reaches_every_worker(tiny_cfg, tmp_path, applied, monkeypatch):
    homes = []
    real_pin = worker.pin

    def record(pid, cores):
        homes.append(frozenset(cores))
        return real_pin(pid, cores)

    monkeypatch.setattr(worker, "pin", record)  # homes and Resources, applied in-process
    before = os.sched_getaffinity(0)
    train(tiny_cfg([*EBRL, "resources.pin=true", "threads.gen=1", "threads.train=1"]))
    want = initial_resources(
        ResourceSettings(pin=True, gen_threads=1, train_threads=1),
        Topology(tuple(discover_cores())),
        sim_workers=2,
    )
    gen, learner = last(applied, "gen"), last(applied, "learner")
    # in-process workers pin their own thread: what the kernel reports back is the plan's
    assert gen.cores == want.gen.cores and learner.cores == want.train.cores
    assert set(gen.cores).isdisjoint(learner.cores)
    assert set(want.sim_home.values()) <= set(homes)  # the env workers went home too
    rows = metrics(tmp_path)
    assert float(rows[-1]["resource/gen_cores"]) == len(want.gen.cores)
    assert os.sched_getaffinity(0) == before


def slow_gen_profile(path) -> str:
    """A profile in which gen is half as fast as train per thread, so Algorithm 1 starts
    gen-heavy: 2 gen threads, 1 train thread. Its figures are low: the blend (half profile,
    half measurement) then moves the thread once the measured gen exceeds 200 + 2 x train per
    second, which the tiny policy's generator does several times over (at 500/1000 per thread it
    needed gen > 1440/s; runs here measured 1100-1350/s as well as 5400/s)."""
    gen = [Point(b, b / (100.0 * t), threads=t, busy=t) for t in (1, 2) for b in (1, 2)]
    train = [Point(16, 16 / (200.0 * t), threads=t, busy=t) for t in (1, 2)]
    # simulators far faster than both: they cost the shared cores nothing to speak of
    sims = (1e-6,)
    prof = Profile(
        sims, 1.0, StageProfile(tuple(gen), "batch"), StageProfile(tuple(train), "samples")
    )
    return str(prof.save(path))


def test_elastic_run_reallocates_applies_and_logs(tiny_cfg, tmp_path, applied):
    """The run's learner is far slower than profiled (32 update epochs, the profile's 1), its
    generator as fast: after ``patience`` divergent updates the allocator moves a thread from
    gen to train; both workers
    apply it; the run folder and the metrics record it with its cause and cost; and the driver's
    affinity and torch threads are as before."""
    torch.set_num_threads(1)
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    cfg = tiny_cfg(
        [
            *EBRL,
            "resources.allocator=elastic",
            f"resources.profile={slow_gen_profile(tmp_path / 'profile.json')}",
            "resources.gen_threads=1",
            "resources.train_threads=2",
            "resources.rebalance_patience=2",
            "algo.cfg.update_epochs=32",
            # a wall-clock budget: the generator reports its counters at most every 0.25 s, and
            # patience 2 needs 3 reports; 10 updates took 0.5 s here (1-2 reports), so whether
            # it fired depended on the machine's speed. 12 s: on a slow day the start-up and the
            # first update alone took 4.9 s, and a 3 s budget ended the run after it
            "budget.iterations=100000",
            "budget.minutes=0.2",
        ]
    )
    train(cfg)
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == before
    starts = [done for msg, done in applied if msg.seq == 0]
    assert {(a.worker, a.threads) for a in starts} == {("gen", 2), ("learner", 1)}
    moves = [json.loads(x) for x in (tmp_path / "run" / "reallocations.jsonl").open()]
    first = next(m for m in moves if m["changed"])
    assert first["applied"] and first["apply_cost_s"] > 0
    assert first["apply_latency_s"] >= first["apply_cost_s"]
    assert (first["gen"]["threads"], first["train"]["threads"]) == (1, 2)
    assert first["measured_gen"] > 2 * first["measured_train"]
    assert first["measured_sim"] > 0  # the rollout's rate, recorded beside them
    assert "consecutive steps" in first["cause"] and first["step"] >= 1
    assert {("gen", 1), ("learner", 2)} <= {(a.worker, a.threads) for _, a in applied if a.seq}
    rows = metrics(tmp_path)
    assert float(rows[-1]["resource/reallocations"]) >= 1
    assert float(rows[-1]["resource/gen_threads"]) == 1.0
    assert not math.isnan(float(rows[-1]["resource/realloc_cost_s"]))
    assert any(r.get("resource/rollout_per_s_update") for r in rows)
    assert any(r.get("resource/gen_per_s_update") for r in rows)


def test_elastic_run_profiles_itself_without_a_stored_profile(tiny_cfg, tmp_path):
    train(tiny_cfg([*EBRL, "resources.allocator=elastic", "threads.train=2"]))
    run = tmp_path / "run"
    stored = Profile.load(run / "profile.json")  # the stage-profile file, ebrl-plan-profile/1
    prof = rate_table(stored)
    assert prof.stages == ("gen", "sim", "train") and prof.shares("gen") == (1, 2)
    # generator batches up to the largest env group of the shape the manager chose: 4 envs in
    # G groups; the learner's update: a segment's decisions, every minibatch
    g = json.loads((run / "shape.json").read_text())["shape"]["env_groups"]
    assert max(prof.batch_sizes("gen")) == 4 // g and len(stored.chunk_s) == 1
    info = json.loads((run / "resources.json").read_text())
    assert info["allocator"] == "elastic" and info["profile_s"] > 0
    # the split was chosen on the rates the file gives back: a run reads what it wrote
    a = info["allocation"]
    assert predict(prof, "gen", a["gen_units"], a["gen_batch"]) == a["gen_throughput"]
    assert predict(prof, "train", a["train_units"], a["train_batch"]) == a["train_throughput"]
    # at most threads.gen + threads.train; threads the simulators' pace does not need are left
    assert 2 <= info["gen"]["threads"] + info["train"]["threads"] <= 3


@two_cores
@pytest.mark.slow  # Ray worker processes: ~28 s; make test-slow (CI runs it)
def test_pinned_plan_reaches_ray_worker_processes(tmp_path):
    """Each Ray worker pins its whole process; the driver's affinity stays; Ray shuts down."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    before = os.sched_getaffinity(0)
    cfg = make_cfg(
        [*TINY, "scheduler=ebrl", "tracking.enabled=false", "resources.pin=true"], tmp_path
    )
    train(cfg)  # scheduler.backend=ray: ray.init(address="local"), shut down at the end
    assert not ray.is_initialized()
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert float(rows[-1]["resource/gen_cores"]) == 1.0
    assert float(rows[-1]["resource/train_cores"]) == 1.0
    assert os.sched_getaffinity(0) == before


def test_a_heavier_learner_in_a_real_run_fires_the_shape_watch(tiny_cfg, tmp_path):
    """EBRL as typed (the shape searched, no trials here so the watch starts after the
    warm-up): from update 6 the learner does 192 more passes over every segment; the watch
    fires on the learner's drift, scales its cost and searches the shape again (moved or kept:
    the model's call), and the run folder and the metrics record it. A tiny run's rates swing by
    a third from one millisecond update to the next: the threshold is 50% held 3 updates, and
    the update does 4 epochs (at 1 its rate doubled in the first updates of some runs, which
    fired the watch on the speed-up and set the levels again in the slowed run; 2026-12-04),
    so only the slowdown (about 6x) fires."""
    cfg = tiny_cfg(
        [
            *EBRL,
            "scheduler.reshape_window=0",
            "resources.rebalance_threshold=0.5",
            "resources.rebalance_patience=3",
            "algo.cfg.update_epochs=4",  # an update long enough for its rate to be steadier
            "inject.train_after_updates=6",
            "inject.train_extra_epochs=192",
            "budget.iterations=20",
        ]
    )
    train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "reallocations.jsonl").open()]
    shape_rows = [r for r in rows if r.get("kind") == "shape"]
    learner = [r for r in shape_rows if r["factors"].get("train", 1.0) > 2.0]
    assert learner, shape_rows
    # update 6 is the first slowed one (the learner version it starts at, 6): a window of 3
    # slowed updates fires at 8; one whose first update swung past the band by chance fires at
    # 7 (seen 2026-12-07, on an idle machine, at the commit before this line: 1 run in 2)
    assert learner[0]["step"] >= 7 and "train" in learner[0]["cause"]
    assert learner[0]["search_s"] > 0
    last_row = metrics(tmp_path)[-1]
    fired = float(last_row["shape/moves"]) + float(last_row["shape/kept_on_drift"])
    assert fired == len(shape_rows) >= 1


PIN_WORKER = """
import json, os, sys, threading
from ebrl.schedulers.ebrl.worker import pin_worker

def allowed(tid):
    return sorted(os.sched_getaffinity(tid))

started, stop = threading.Event(), threading.Event()
ids = []
def beat():  # a thread started before the pin, as a worker's heartbeat is
    ids.append(threading.get_native_id())
    started.set()
    stop.wait()
t = threading.Thread(target=beat)
t.start()
started.wait()
core = max(os.sched_getaffinity(0))
driver = os.getpid() if sys.argv[1] == "inprocess" else -1
pin_worker([core], driver)
print(json.dumps({"main": allowed(0), "beat": allowed(ids[0]), "core": core}))
stop.set()
t.join()
"""


@two_cores
@pytest.mark.parametrize("where", ["process", "inprocess"])
def test_a_pinned_worker_moves_every_thread_of_its_process_but_never_the_drivers(where):
    """A worker in its own process (a Ray actor) moves every thread it has, the heartbeat
    started before the pin included; a worker that is a thread of the driver moves only
    itself."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", PIN_WORKER, where], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["main"] == [got["core"]]
    if where == "process":
        assert got["beat"] == [got["core"]]
    else:
        assert got["beat"] == sorted(os.sched_getaffinity(0))
