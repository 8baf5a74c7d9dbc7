"""The run's resource manager on fakes: starting splits, run-time reallocations, the config
refusals, and the synthetic simulator's injected slowdown."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ebrl.config import ConfigError, validate
from ebrl.envs.synthetic import SyntheticCostEnv
from ebrl.hardware import MachineFacts
from ebrl.resources.allotment import (
    ResourceSettings,
    StageResources,
    gen_batch_candidates,
    initial_resources,
    pool_size,
    restrict_train_batch,
    split_resources,
    train_minibatch,
)
from ebrl.resources.controller import RunController, elastic_allocator
from ebrl.resources.meters import RolloutMeter
from ebrl.resources.profiler import RatePoint, RateTable
from ebrl.resources.split import AllocationError, Pool, allocate
from ebrl.resources.topology import fake_topology
from ebrl.train import _refuse_unwired_resources

from .conftest import TINY, make_cfg

ROOT = Path(__file__).resolve().parents[1]

TOPO = fake_topology(numa_nodes=2, cores_per_node=32, gpus=0)


def manager(prof, res, s, out_dir, max_gen_batch, clock=None, sent=None) -> RunController:
    """The run-time manager with Algorithm 1, its splits sent into ``sent`` (role, seq, res)."""
    m = RunController(
        res, num_envs=4, elastic=elastic_allocator(prof, res, s, max_gen_batch), topology=TOPO,
        out_dir=out_dir, **({"clock": clock} if clock else {}),
    )  # fmt: skip
    m.connect(
        send_split=lambda role, seq, r: (sent if sent is not None else []).append((role, seq, r))
    )
    return m


def fake_profile(gen_per_thread: float = 1000.0, train_per_thread: float = 500.0) -> RateTable:
    """Linear curves over 1..8 threads; gen at batches 1, 2 and 4, train at 16 and 64."""
    pts = [
        RatePoint("gen", t, b, gen_per_thread * t * (0.5 + b / 8))
        for t in range(1, 9)
        for b in (1, 2, 4)
    ]
    pts += [RatePoint("train", t, b, train_per_thread * t) for t in range(1, 9) for b in (16, 64)]
    return RateTable(points=pts)


def test_static_unpinned_is_the_configs_threads():
    res = initial_resources(ResourceSettings(gen_threads=3, train_threads=5), TOPO, 2)
    assert res.gen == StageResources(3, None, None) and res.train == StageResources(5)
    assert res.sim_home is None and res.allocation is None
    res = initial_resources(ResourceSettings(gen_batch=4), TOPO, 2)
    assert res.gen.batch == 4


def test_static_pinned_never_shares_a_core_when_there_is_room():
    s = ResourceSettings(pin=True, gen_threads=4, train_threads=8)
    res = initial_resources(s, TOPO, sim_workers=6)
    sims = [c for cores in res.sim_home.values() for c in cores]
    assert len(sims) == len(set(sims)) == 6
    gen, train = set(res.gen.cores), set(res.train.cores)
    assert not gen & train and not (gen | train) & set(sims)
    # the threads are the config's; the cores split the rest of the machine 4 : 8
    assert (res.gen.threads, res.train.threads) == (4, 8)
    assert len(gen) == round(4 / 12 * (64 - 6))
    assert len(gen) + len(train) == 64 - 6


def test_pinned_core_counts_are_honoured():
    s = ResourceSettings(pin=True, sim_cores=4, gen_cores=2, train_cores=6)
    res = initial_resources(s, TOPO, sim_workers=2)
    assert [len(c) for c in res.sim_home.values()] == [2, 2]
    assert len(res.gen.cores) == 2 and len(res.train.cores) == 6
    assert res.pool_cores == tuple(sorted(res.gen.cores + res.train.cores))


def test_small_machine_shares_cores_and_says_so():
    topo = fake_topology(numa_nodes=1, cores_per_node=2, gpus=0)
    res = initial_resources(ResourceSettings(pin=True), topo, sim_workers=2)
    assert all(c == frozenset({0, 1}) for c in res.sim_home.values())
    assert res.gen.cores == (0,) and res.train.cores == (1,)
    assert any("no room" in w for w in res.warnings)


def test_elastic_starts_from_algorithm_1():
    prof = restrict_train_batch(fake_profile(), 16)
    s = ResourceSettings(allocator="elastic", gen_threads=4, train_threads=4)
    res = initial_resources(s, TOPO, 2, prof, max_gen_batch=2)
    # unpinned, the thread pool is the simulators' CPUs too (the machine's 64 cores)
    pool = Pool(8, shared_with_sim=True, cores=64)
    want = allocate(prof, pool, max_gen_batch=2, sim_workers=2)
    assert res.allocation == want and res.pool == pool
    assert (res.gen.threads, res.train.threads, res.gen.batch) == (
        want.gen_units,
        want.train_units,
        want.gen_batch,
    )
    with pytest.raises(AllocationError, match="profile"):
        initial_resources(s, TOPO, 2, None)


def test_elastic_with_simulators_on_few_cores_spares_threads():
    """A profile with a ``sim`` stage on a 2-core machine: the shared-CPU model prices every
    split, and threads that would only take CPU from the simulators stay unused."""
    pts = [RatePoint("gen", t, 2, 250.0 + 10 * t) for t in (1, 2, 3)]
    pts += [RatePoint("train", t, 16, 180.0 + 20 * t) for t in (1, 2, 3)]
    pts += [RatePoint("sim", 1, 2, 230.0)]
    prof = RateTable(points=pts)
    two = fake_topology(numa_nodes=1, cores_per_node=2, gpus=0)
    s = ResourceSettings(allocator="elastic", gen_threads=2, train_threads=2)
    res = initial_resources(s, two, 2, prof, max_gen_batch=2)
    assert (res.gen.threads, res.train.threads) == (1, 1)
    assert res.pool == Pool(4, shared_with_sim=True, cores=2)
    assert res.allocation is not None and res.allocation.unused_units == 2


def test_elastic_pinned_splits_the_cores_left_to_gen_and_train():
    prof = restrict_train_batch(fake_profile(), 16)
    s = ResourceSettings(pin=True, allocator="elastic", gen_cores=3, train_cores=5)
    res = initial_resources(s, TOPO, 2, prof)
    assert res.pool == Pool(8) and pool_size(s, TOPO, 2) == 8
    assert len(res.gen.cores) == res.allocation.gen_units == res.gen.threads
    assert set(res.gen.cores) | set(res.train.cores) == set(res.pool_cores)
    assert not set(res.gen.cores) & set(res.train.cores)
    one = fake_topology(numa_nodes=1, cores_per_node=1, gpus=0)
    with pytest.raises(AllocationError, match="nothing to split"):
        initial_resources(ResourceSettings(pin=True, allocator="elastic"), one, 1, prof)


def test_split_resources_moves_cores_with_units():
    prof = restrict_train_batch(fake_profile(), 16)
    alloc = allocate(prof, Pool(6))
    pool = (10, 11, 12, 13, 14, 15)
    gen, train = split_resources(alloc, pool, TOPO)
    assert len(gen.cores) == alloc.gen_units and len(train.cores) == alloc.train_units
    assert set(gen.cores) | set(train.cores) == set(pool)
    gen, train = split_resources(alloc, None)
    assert gen.cores is None and gen.threads == alloc.gen_units


def test_train_batch_is_the_runs_not_a_choice():
    prof = restrict_train_batch(fake_profile(), 40)
    assert prof.batch_sizes("train") == (16,)  # nearest to 40 of (16, 64), ties to the smaller
    assert restrict_train_batch(fake_profile(), 60).batch_sizes("train") == (64,)
    assert prof.batch_sizes("gen") == (1, 2, 4)
    assert gen_batch_candidates(8) == (2, 4, 8) and gen_batch_candidates(1) == (1,)


def test_rollout_meter_discounts_time_blocked_by_staleness():
    m = RolloutMeter(num_envs=4)
    assert m.update(10.0, 0, 0.0) is None  # a baseline first
    # 2 s, 100 decisions; half the envs blocked for the whole interval: free 1 s
    assert m.update(12.0, 100, 4.0) == pytest.approx(100.0)
    assert m.update(12.0, 100, 4.0) is None  # no new data
    assert m.update(13.0, 150, 8.0) is None  # blocked throughout: no rollout capacity to tell


def test_the_manager_reallocates_after_patience_and_records_the_cost(tmp_path):
    prof = restrict_train_batch(fake_profile(gen_per_thread=1000, train_per_thread=500), 16)
    s = ResourceSettings(allocator="elastic", gen_threads=1, train_threads=2, rebalance_patience=3)
    res = initial_resources(s, TOPO, 2, prof, max_gen_batch=2)
    assert (res.gen.threads, res.train.threads) == (1, 2)
    now = [100.0]
    sent = []
    rb = manager(prof, res, s, tmp_path, 2, clock=lambda: now[0], sent=sent)
    # the rollout far slower than the profile says, the learner faster: 3 divergent updates
    assert rb.rebalance(150.0, 2500.0, step=1) is None
    assert rb.rebalance(150.0, 2500.0, step=2) is None
    seq, gen, train = rb.rebalance(150.0, 2500.0, step=3)
    assert (gen.threads, train.threads) == (2, 1)
    assert sent == [("gen", seq, gen), ("learner", seq, train)]  # both stages told
    assert rb.applied("gen", seq, 0.002, 2) is None  # the learner has not applied it yet
    assert rb.applied("gen", seq, 0.5, 2) is None  # a repeated acknowledgement counts once
    now[0] += 0.25
    done = rb.applied("learner", seq, 0.001, 1)
    # cost: the stages' own work applying it; latency: decision to the last acknowledgement
    assert done is not None and done.apply_cost_s == pytest.approx(0.003)
    assert done.apply_latency_s == pytest.approx(0.25)
    row = json.loads((tmp_path / "reallocations.jsonl").read_text())
    assert row["step"] == 3 and row["changed"] and row["applied"]
    assert "diverged more than 15% from the planned" in row["cause"]
    assert "for 3 consecutive steps" in row["cause"]
    assert row["apply_cost_s"] == pytest.approx(0.003)
    assert row["apply_latency_s"] == pytest.approx(0.25)
    assert (row["old"]["gen_units"], row["new"]["gen_units"]) == (1, 2)
    rb.replaced("gen")  # a replacement generator starts with the split in force
    assert sent[-1] == ("gen", seq, gen)
    m = rb.elastic_metrics()
    assert m["resource/reallocations"] == 1.0
    assert m["resource/realloc_cost_s"] == pytest.approx(0.003)
    assert m["resource/realloc_latency_s"] == 0.25


def test_rebalancer_records_a_kept_split_and_unapplied_moves(tmp_path):
    prof = restrict_train_batch(fake_profile(gen_per_thread=100), 16)
    s = ResourceSettings(allocator="elastic", gen_threads=1, train_threads=1, rebalance_patience=1)
    res = initial_resources(s, TOPO, 2, prof, max_gen_batch=4)
    assert res.gen.batch == 4  # gen is the slower stage: its fastest batch
    sent = []
    rb = manager(prof, res, s, tmp_path, 4, sent=sent)
    # a pool of 2: one split; gen already at its largest batch, so the search keeps it all
    assert rb.rebalance(10.0, 1000.0, step=5) is None and sent == []
    row = json.loads((tmp_path / "reallocations.jsonl").read_text())
    assert row["changed"] is False and row["applied"] is False and row["step"] == 5
    assert rb.elastic_metrics()["resource/rebalances_unchanged"] == 1.0

    prof = restrict_train_batch(fake_profile(), 16)
    s3 = ResourceSettings(allocator="elastic", gen_threads=1, train_threads=2, rebalance_patience=1)
    res = initial_resources(s3, TOPO, 2, prof, max_gen_batch=2)
    rb = manager(prof, res, s3, tmp_path / "b", 2)
    assert rb.rebalance(150.0, 2500.0, step=7) is not None
    rb.close()  # the run ended before the workers applied it
    row = json.loads((tmp_path / "b" / "reallocations.jsonl").read_text())
    assert row["changed"] and row["applied"] is False and row["apply_cost_s"] is None
    assert row["apply_latency_s"] is None


def test_one_manager_measures_the_shortlist_from_the_reports_and_keeps_the_fastest(tmp_path):
    """The driver feeds the run-time manager each update's report; the shape trials run in
    it: each shortlisted shape in turn is sent to the workers, then the fastest measured, and
    the model refit to it is saved in ``shape.json`` and reported once."""
    from ebrl.resources.shape import ShapeTrials, search, shortlist

    from .test_shape_search import WORK, costs

    choice = search(costs(tail=3.0, busy=0.05), WORK, None, None, None, 0.005)
    short = shortlist(choice)
    assert len(short) >= 2
    res = initial_resources(ResourceSettings(), TOPO, 2, None, max_gen_batch=8)
    trials = ShapeTrials(short, skip=1, updates=1, settle=0)
    m = RunController(res, 16, out_dir=tmp_path, choice=choice, trials=trials)
    sent = []
    m.connect(send_shape=sent.append)
    # update i arrives at t = i, then the last shortlisted shape's one twice as fast
    times = [float(i) for i in range(len(short))] + [len(short) - 0.5]
    out = [m.report(i, 100, {}, at=t) for i, t in enumerate(times)]
    assert sent == list(short[1:])  # each in turn; the fastest is the last: no move back
    assert [o.get("shape/trials") for o in out] == [None] * len(short) + [float(len(short))]
    rec = m.choice.recalibration
    assert rec is not None and rec.after == short[-1]
    saved = json.loads((tmp_path / "shape.json").read_text())["recalibration"]
    assert len(saved["trials"]) == len(short)
    # while the run runs, the refit model has predicted the measured shapes only
    assert len(saved["predictions"]) == len(short) and saved["rerank_s"] is None
    assert m.report(len(short) + 1, 100, {}, at=99.0) == {}  # the trials are over: nothing more
    m.close()  # the run's end: every candidate re-ranked on the refit model, saved
    saved = json.loads((tmp_path / "shape.json").read_text())["recalibration"]
    assert len(saved["predictions"]) == len(choice.shapes) and saved["rerank_s"] >= 0
    assert m.choice.recalibration.rerank_s == saved["rerank_s"]


def test_a_failed_re_rank_at_the_end_neither_fails_the_run_nor_loses_the_trials(
    tmp_path, monkeypatch
):
    """The re-rank is bookkeeping in the run's clean-up (a ``finally``): if the model fails
    there, the run's own outcome stands and ``shape.json`` keeps what the trials measured."""
    from ebrl.resources import controller
    from ebrl.resources.shape import ShapeTrials, search, shortlist

    from .test_shape_search import WORK, costs

    choice = search(costs(tail=3.0, busy=0.05), WORK, None, None, None, 0.005)
    short = shortlist(choice)
    res = initial_resources(ResourceSettings(), TOPO, 2, None, max_gen_batch=8)
    m = RunController(res, 16, out_dir=tmp_path, choice=choice, trials=ShapeTrials(short, 1, 1, 0))
    m.connect(send_shape=lambda s: None)
    for i in range(len(short) + 1):
        m.report(i, 100, {}, at=float(i))

    def stalled(choice):
        raise RuntimeError("the modelled schedule stalled")

    monkeypatch.setattr(controller, "rerank", stalled)
    m.close()
    saved = json.loads((tmp_path / "shape.json").read_text())["recalibration"]
    assert len(saved["trials"]) == len(short) and saved["rerank_s"] is None


def test_algorithm_1_waits_for_the_shape_trials_to_end(tmp_path, monkeypatch):
    """While the trials move the shape, the rates move with it: Algorithm 1 observes from the
    update after the last trial, not before."""
    from ebrl.resources.shape import ShapeTrials, search, shortlist

    from .test_shape_search import WORK, costs

    choice = search(costs(tail=3.0, busy=0.05), WORK, None, None, None, 0.005)
    short = shortlist(choice)[:2]
    prof = restrict_train_batch(fake_profile(), 16)
    s = ResourceSettings(allocator="elastic", gen_threads=1, train_threads=2, rebalance_patience=2)
    res = initial_resources(s, TOPO, 2, prof, max_gen_batch=2)
    m = RunController(
        res, num_envs=4, elastic=elastic_allocator(prof, res, s, 2), topology=TOPO,
        out_dir=tmp_path, choice=choice, trials=ShapeTrials(short, skip=1, updates=1, settle=0),
    )  # fmt: skip
    m.connect(send_split=lambda *a: None, send_shape=lambda shape: None)
    observed = []
    monkeypatch.setattr(m, "_rates", lambda: (100.0, 200.0))
    monkeypatch.setattr(m, "rebalance", lambda gen, train, step, rollout: observed.append(step))
    # update 0: start-up; 1 and 2: one trial each (the trials end at 2); then Algorithm 1
    for i in range(5):
        m.report(i, 100, {"resource/train_per_s_update": 50.0}, at=float(i))
    assert m.trials.done
    assert observed == [3, 4]


def test_shape_trials_need_the_search_choice():
    from ebrl.resources.shape import ShapeTrials, search, shortlist

    from .test_shape_search import WORK, costs

    choice = search(costs(tail=3.0, busy=0.05), WORK, None, None, None, 0.005)
    res = initial_resources(ResourceSettings(), TOPO, 2, None, max_gen_batch=8)
    with pytest.raises(ValueError, match="trials need the shape search"):
        RunController(res, 4, trials=ShapeTrials(shortlist(choice)))


def test_train_minibatch_from_the_config():
    cfg = {"num_envs": 16, "algo": {"cfg": {"num_minibatches": 2}}}
    assert train_minibatch(cfg, decisions_per_env=12) == 96


# --- config refusals ----------------------------------------------------------------------------
def run_of(extra, on: MachineFacts | None = None):
    return validate(make_cfg([*TINY, *extra]), machine=on)


def test_default_resources_pass_under_every_scheduler():
    for sched in ("sync", "ebrl", "async"):
        _refuse_unwired_resources(run_of([f"scheduler={sched}"]))


def test_other_schedulers_still_refuse_resources():
    with pytest.raises(ConfigError, match="not wired into scheduler SyncScheduler"):
        _refuse_unwired_resources(run_of(["resources.allocator=elastic"]))
    with pytest.raises(ConfigError, match=r"resources\.pin=True"):
        _refuse_unwired_resources(run_of(["scheduler=async", "resources.pin=true"]))


def test_ebrl_takes_what_it_honours():
    for extra in (
        ["resources.allocator=elastic", "resources.rebalance_patience=3"],
        ["resources.rebalance_patience=3", "resources.rebalance_threshold=0.3"],  # the watch's
        ["resources.pin=true", "resources.gen_cores=1", "resources.train_cores=1"],
        ["resources.gen_threads=2", "resources.train_threads=1", "resources.gen_batch=2"],
    ):
        _refuse_unwired_resources(run_of(["scheduler=ebrl", *extra]))


@pytest.mark.parametrize(
    "extra, words",
    [
        (["resources.gen_cores=1"], "resources.pin=true"),
        (["resources.gen_batch=2", "scheduler.step_level=false"], "step_level"),
        # the shape watch reads the trigger's settings too: refused only with it off
        (
            ["resources.rebalance_patience=3", "scheduler.reshape_on_drift=false"],
            "allocator=elastic",
        ),
        (["resources.allocator=elastic", "resources.profile=/no/such.json"], "no such file"),
    ],
)
def test_ebrl_refuses_what_it_would_not_honour(extra, words):
    with pytest.raises(ConfigError, match=words):
        _refuse_unwired_resources(run_of(["scheduler=ebrl", *extra]))


def test_a_stored_profile_the_run_cannot_read_is_refused_before_any_work(tmp_path):
    """``resources.profile`` is a stage-profile file measured on CPU threads: a run profile in
    the untagged format of before, or a GPU profile, is refused naming the key and the fix."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"points": [{"stage": "gen", "share": 1, "batch_size": 8,
                                           "throughput": 1.0}]}))  # fmt: skip
    gpu = ROOT / "conf" / "plan" / "example_gpu_profile.json"
    for path, words in ((old, r"python -m ebrl\.plan\.measure"), (gpu, r"resources\.gpu_profile")):
        elastic = ["scheduler=ebrl", "resources.allocator=elastic", f"resources.profile={path}"]
        with pytest.raises(ConfigError, match=words) as e:
            _refuse_unwired_resources(run_of(elastic))
        assert f"resources.profile={path}" in str(e.value)


def test_an_sm_quota_for_a_role_on_the_cores_is_refused_by_name():
    """A quota needs the role's GPU share (tests/test_gpu_fake.py: quotas that are taken)."""
    h100 = MachineFacts(where="a node", gpus=("NVIDIA H100 80GB HBM3",), cuda=True, cpus=16)
    run = run_of(["scheduler=ebrl", "gpu=h100", "resources.gen_sm_pct=60"], on=h100)
    with pytest.raises(ConfigError, match=r"resources.gen_sm_pct=60, but scheduler.gen_gpus=0"):
        _refuse_unwired_resources(run)


# --- the synthetic simulator's slowdown -----------------------------------------------------
def test_synthetic_slowdown_multiplies_the_step_cost_after_n_steps():
    env = SyntheticCostEnv(
        step_cost_ms=0.05,
        tail_ratio=1.0,  # no spread: every step costs exactly the mean
        cost_mode="sleep",
        episode_steps_start=4,
        slowdown_after_steps=6,
        slowdown_factor=3.0,
    )
    env.reset(0)
    costs = []
    for i in range(10):
        before = env.cost_seconds
        if env.step([0.0] * 4).terminated or (i + 1) % 4 == 0:
            env.reset(i)  # the count runs over episodes
        costs.append(env.cost_seconds - before)
    assert costs[:6] == pytest.approx([5e-5] * 6) and costs[6:] == pytest.approx([1.5e-4] * 4)
    assert env.slowed and env.steps == 10
    with pytest.raises(ValueError, match="slowdown_factor"):
        SyntheticCostEnv(slowdown_factor=-1.0)
    assert math.isclose(SyntheticCostEnv().slowdown_factor, 1.0) and not SyntheticCostEnv().slowed


def test_synthetic_config_node_carries_the_slowdown():
    cfg = make_cfg(["simulator=synthetic", "simulator.slowdown_after_steps=100"])
    assert cfg.simulator.slowdown_after_steps == 100 and cfg.simulator.slowdown_factor == 1.0


def test_patience_scales_with_the_run_unless_set():
    """A drift must be able to fire in a 10-update CPU sweep as in a long cluster run."""
    from ebrl.resources.allotment import scaled_patience

    def cfg(iterations=None, env_steps=None):
        return {"num_envs": 16, "rollout_steps": 50, "budget": {
            "iterations": iterations, "env_steps": env_steps}}  # fmt: skip

    assert scaled_patience(None, cfg(iterations=10)) == 2
    assert scaled_patience(None, cfg(iterations=60)) == 6
    assert scaled_patience(None, cfg(iterations=5000)) == 20
    # an env-step budget ends the run first: 200k steps / (16 x 50) per update = 250 updates
    assert scaled_patience(None, cfg(iterations=None, env_steps=200_000)) == 20
    assert scaled_patience(None, cfg(iterations=None, env_steps=16_000)) == 2
    assert scaled_patience(7, cfg(iterations=10)) == 7  # a pinned value is kept
    assert scaled_patience(None, {}) == 20  # nothing known: the paper's 20
    # a minutes budget, through the search's predicted seconds per update: 10 min / 2 s
    assert scaled_patience(None, {"budget": {"minutes": 10}}, update_s=2.0) == 20
    assert scaled_patience(None, {"budget": {"minutes": 1}}, update_s=2.0) == 3  # 30 updates
