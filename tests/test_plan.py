"""The capacity planner (issue 21): the schedule model plays the engine's rules and every
scheduler; the profile file, the CLI, the GPU profile writer (on fakes and on the CPU)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebrl.plan.cli import EXAMPLE, main
from ebrl.plan.from_run import RunFacts, profile_from_run
from ebrl.plan.machine import MachineSpec, from_conf
from ebrl.plan.measure import assemble, level_env, measure_level, measure_profile
from ebrl.plan.profile import (
    Point,
    Profile,
    ProfileError,
    StageProfile,
    SyncCosts,
    lognormal_samples,
)
from ebrl.plan.schedulers import PlanWorkload, allreduce_s, build, plan_one
from ebrl.resources.model import (
    Layout,
    Machine,
    Shape,
    StageCall,
    StageCosts,
    Workload,
    admits,
    pinned_batch_min,
    play,
    replica_blocks,
    served_groups,
)

CPU = MachineSpec(cores_per_node=2.0)


def cpu_profile(sim: float = 0.003, gen16: float = 0.045, train2: float = 0.8) -> Profile:
    """A CPU profile of the embedded workload's shape: generation and training at 1 and 2
    threads, 16 envs, T = 12."""
    gen = tuple(
        Point(b, (gen16 * (0.2 + 0.8 * b / 16)) * f, threads=t, busy=bz)
        for t, f, bz in ((1, 1.0, 1.0), (2, 1.05, 1.3))
        for b in (1, 4, 8, 16)
    )
    train = (
        Point(192, train2 * 1.3, threads=1, busy=1.0),
        Point(192, train2, threads=2, busy=1.55),
    )
    return Profile(
        (sim,),
        1.0,
        StageProfile(gen, "batch"),
        StageProfile(train, "samples"),
        SyncCosts(publish_s=0.005),
        chunk_size=4,
        episode_steps=50,
    )


def overlaps(a, b) -> bool:
    return a.start < b.end - 1e-12 and b.start < a.end - 1e-12


# --- the engine's rules and their twins --------------------------------------------------------
def _gen_worker(t: int, k: int, groups: list[list[int]], n: int):
    from ebrl.schedulers.ebrl.gen_worker import GenWorker
    from ebrl.schedulers.ebrl.messages import Reshape

    gen = GenWorker.__new__(GenWorker)
    gen.plan = SimpleNamespace(
        batch_timeout_s=1.0, start_version=0, decisions_per_env=t, staleness=k, groups=groups
    )
    gen.stage = SimpleNamespace(version=0)
    gen.gone = set()
    gen._owner = dict.fromkeys(range(n), 0)
    return gen, Reshape


@settings(max_examples=40, deadline=None)
@given(
    t=st.integers(1, 12),
    k=st.integers(0, 4),
    version=st.integers(0, 10),
    decisions=st.integers(0, 150),
)
def test_the_staleness_gate_is_the_engines(t, k, version, decisions):
    gen, _ = _gen_worker(t, k, [[0]], 1)
    gen.stage.version = version
    assert admits(decisions, t, k, version) == gen._eligible(0, np.array([decisions]))


def test_a_replicas_groups_blocks_and_pinned_m_are_the_engines():
    from ebrl.schedulers.ebrl import EBRLScheduler
    from ebrl.schedulers.ebrl.wiring import Roles

    groups = [[0, 1, 4, 5], [2, 3, 6, 7]]
    gen, reshape = _gen_worker(4, 1, groups, 8)
    gen.served = {1, 2, 3, 5}
    gen._reshape(reshape(groups, False, 2, None))
    assert served_groups(groups, gen.served) == gen.groups == [[1, 5], [2, 3]]
    for sims, reps in ((5, 2), (8, 3), (64, 8), (128, 16), (3, 3)):
        roles = Roles([[i] for i in range(sims)], reps)
        assert replica_blocks(sims, reps) == roles.replica_of
    for n, g, r, workers in ((16, 2, 1, 2), (64, 2, 2, 16), (512, 2, 16, 128), (6, 4, 1, 2)):
        sched = EBRLScheduler(backend="inprocess", sim_workers=workers, gen_replicas=r)
        ctx = SimpleNamespace(factory=SimpleNamespace(cfg={"num_envs": n}), env_groups=g)
        roles = Roles([list(x) for x in np.array_split(np.arange(n), workers)], r)
        pinned = sched.pinned_shape(ctx, roles)
        assert pinned.batch_min == pinned_batch_min(n, pinned.groups, r)


# --- the schedule equals the engine's on a deterministic fake workload -------------------------
#: seconds: a physics step (a chunk is 2), a generator call (fixed, per env), an update. Each
#: update is published 26-42 ms before the generator's next decision point in the modelled
#: schedules below: the engine's own work (a real PPO step, messages) only ever delays it
STEP_S, GEN_S, GEN_ENV_S, TRAIN_S = 0.012, 0.030, 0.004, 0.14


def engine_calls(monkeypatch, workers: int, k: int, shape: Shape, updates: int = 3):
    """The engine in-process on the counting env with fixed stage delays: every generator call
    (its envs in order, its policy version) and every update's version."""
    from ebrl.config import validate
    from ebrl.schedulers.base import RunContext
    from ebrl.schedulers.ebrl import EBRLScheduler
    from ebrl.stages import TrainStage
    from ebrl.stages.factory import StageFactory
    from ebrl.stages.gen import GenStage
    from ebrl.timeline import Timeline

    from .conftest import TINY, make_cfg

    cfg = make_cfg(
        [
            *TINY,
            "num_envs=4",
            "env_groups=2",
            "chunk_size=2",
            "rollout_steps=8",
            "scheduler=ebrl",
            "tracking.enabled=false",
            "simulator.episode_len=1000",
            "algo.cfg.update_epochs=1",
            "algo.cfg.num_minibatches=1",
            f"simulator.delay_s={STEP_S}",
        ]
    )
    calls, trains, lock = [], [], threading.Lock()
    gen_orig, train_orig = GenStage.generate, TrainStage.train

    def generate(self, batch):
        with lock:
            calls.append((tuple(int(e) for e in batch.env_ids), int(self.version)))
        time.sleep(GEN_S + GEN_ENV_S * len(batch.env_ids))
        return gen_orig(self, batch)

    def train(self, seg):
        trains.append(int(self.version))
        time.sleep(TRAIN_S)
        return train_orig(self, seg)

    monkeypatch.setattr(GenStage, "generate", generate)
    monkeypatch.setattr(TrainStage, "train", train)
    run = validate(cfg)
    ctx = RunContext(
        factory=StageFactory.from_config(cfg),
        decisions_per_env=run.decisions_per_env,
        env_groups=shape.groups,
        timeline=Timeline(),
    )
    sched = EBRLScheduler(
        backend="inprocess",
        sim_workers=workers,
        overlap=k > 0,
        staleness=k,
        pipeline=shape.groups > 1,
        step_level=shape.step_level,
        batch_min=shape.batch_min,
        batch_max=shape.batch_max,
        batch_timeout_ms=shape.batch_timeout_s * 1000,
        reshape_window=0,
        hang_timeout_s=None,
    )
    it = sched.run(ctx)
    try:
        for _ in range(updates):
            next(it)
    finally:
        it.close()
    return calls, trains


def model_calls(workers: int, k: int, shape: Shape, updates: int = 3):
    costs = StageCosts((2 * STEP_S,), 0.0, GEN_S, GEN_ENV_S, 0.0, TRAIN_S, 0.0, message_s=0.0)
    work = Workload(
        tuple(tuple(int(x) for x in b) for b in np.array_split(np.arange(4), workers)), 4, k, 8.0, 2
    )
    played = play(costs, work, shape, updates=updates, warmup=0)
    gens = [(ev[2], ev[3]) for ev in played.events if ev[0] == "gen"]
    return gens, [ev[1] for ev in played.events if ev[0] == "train"], played


CASES = {
    "levels off (k=0, G=1)": (2, 0, Shape(1, False, 4, 0.001)),
    "overlap and pipelining (k=1, G=2)": (2, 1, Shape(2, False, 2, 0.001)),
    # a timeout never reached: the batches follow from arrival order alone
    "step level, first 2 of 4 capped at 3 (k=1)": (1, 1, Shape(1, True, 2, 1.0, 3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_modelled_schedule_is_the_engines(case, monkeypatch):
    """The same generator calls (envs, in order, and the policy version acting) and updates,
    in the same order, on a workload whose stage costs are fixed and far apart (sleeps)."""
    workers, k, shape = CASES[case]
    want, want_trains, played = model_calls(workers, k, shape)
    got, trains = engine_calls(monkeypatch, workers, k, shape)
    # the engine goes on acting until it is stopped: compare the calls the model began before
    # its last update was published (gen spans are in the order the calls ended: one replica)
    starts = [s.start for s in played.spans if s.stage == "gen"]
    n = sum(1 for s in starts if s < played.update_end[-1])
    assert n >= 12, want
    assert got[:n] == want[:n]
    assert trains[:3] == want_trains[:3] == [0, 1, 2]


# --- the model's invariants ---------------------------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    k=st.integers(0, 3),
    n_workers=st.integers(1, 3),
    per_worker=st.integers(1, 5),
    t=st.integers(1, 5),
    groups=st.integers(1, 4),
    step=st.booleans(),
    m=st.integers(1, 8),
    cap=st.sampled_from([None, 4, 16]),
    tail=st.sampled_from([1.0, 3.0]),
    train_s=st.sampled_from([0.001, 0.05, 0.3]),
    replicas=st.integers(1, 3),
)
def test_staleness_never_exceeds_k(
    k, n_workers, per_worker, t, groups, step, m, cap, tail, train_s, replicas
):
    ids = np.arange(n_workers * per_worker)
    workers = tuple(tuple(int(x) for x in b) for b in np.array_split(ids, n_workers))
    chunk = lognormal_samples(0.01, tail, n=64)
    costs = StageCosts(chunk, 0.5, 0.003, 0.001, 1.0, train_s, 1.0)
    work = Workload(workers, t, k, 2.0, 4)
    r = min(replicas, n_workers)
    layout = Layout({"cpu": 2.0}, ("cpu",) * n_workers, ((("cpu", 1.0),),) * r, (("cpu", 1.0),))
    shape = Shape(groups, step, m, 0.002, cap)
    played = play(costs, work, shape, layout, updates=5, warmup=1)
    for ev in played.events:
        if ev[0] == "gen":
            _, _, _batch, version, segments = ev
            assert all(0 <= s - version <= k for s in segments), ev
    assert len(played.prediction.staleness) == k + 1
    assert sum(played.prediction.staleness) == pytest.approx(1.0)


def test_a_pool_shares_its_capacity_and_a_job_alone_gets_its_nominal_cores():
    done = []
    m = Machine({"cpu": 1.0})
    for i in range(2):
        m.add(StageCall(1.0, (("cpu", 1.0),), lambda i=i: done.append((i, m.now)), "x", f"t{i}"))
    while m.advance():
        pass
    assert [round(t, 9) for _, t in done] == [2.0, 2.0]  # each at half speed
    m = Machine({"cpu": 1.5}, nominal={"cpu": 2.0})
    m.add(StageCall(1.0, (("cpu", 1.6),), lambda: done.append(("alone", m.now)), "x", "a"))
    while m.advance():
        pass
    assert done[-1][1] == pytest.approx(1.0)  # alone: measured alone, the nominal cores
    m = Machine({"cpu": 1.5}, nominal={"cpu": 2.0})
    ends = []
    for i in range(2):
        m.add(StageCall(1.0, (("cpu", 1.0),), lambda: ends.append(m.now), "x", f"t{i}"))
    while m.advance():
        pass
    assert ends == pytest.approx([2 / 1.5, 2 / 1.5])  # together: the effective cores
    # a GPU call's host thread takes a core from the CPU pool, but the GPU sets its pace
    m = Machine({"cpu": 1.0, "gpu": 1.0})
    ends = []
    m.add(
        StageCall(
            1.0,
            (("gpu", 1.0),),
            lambda: ends.append(("gpu", m.now)),
            "gen",
            "g",
            loads=(("cpu", 1.0),),
        )
    )
    m.add(StageCall(1.0, (("cpu", 1.0),), lambda: ends.append(("sim", m.now)), "sim", "s"))
    while m.advance():
        pass
    assert dict(ends) == pytest.approx({"gpu": 1.0, "sim": 1.5})


# --- every scheduler's own character ------------------------------------------------------------
def test_sync_is_fully_serial_and_costs_the_sum_of_its_stages():
    prof, wl = cpu_profile(), PlanWorkload()
    row = plan_one("sync", prof, wl, CPU, keep=True, updates=5)
    spans = row.played.spans
    assert not any(overlaps(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :])
    s = build("sync", prof, wl, CPU)
    per_update = 12 * (s.costs.gen_s(16) + 16 * prof.chunk_s[0]) + s.costs.train_s + s.costs.sync_s
    assert row.prediction.update_s == pytest.approx(per_update, rel=1e-6)
    assert row.prediction.staleness == (1.0,)


def test_hybrid_pipelines_its_two_groups_and_trains_alone():
    row = plan_one("hybrid", cpu_profile(), PlanWorkload(), CPU, keep=True, updates=5)
    spans = row.played.spans
    gens = [s for s in spans if s.stage == "gen"]
    sims = [s for s in spans if s.stage == "sim"]
    trains = [s for s in spans if s.stage == "train"]
    assert row.shape == Shape(2, False, 8, 0.005) and row.prediction.mean_batch == 8
    assert any(overlaps(g, s) for g in gens for s in sims)  # one group steps, the other acts
    assert not any(overlaps(t, x) for t in trains for x in gens + sims)  # k = 0
    assert row.prediction.staleness == (1.0,)


def test_async_overlaps_training_with_the_rollout_and_beats_sync():
    prof, wl = cpu_profile(), PlanWorkload()
    row = plan_one("async", prof, wl, CPU, keep=True, updates=5)
    spans = row.played.spans
    trains = [s for s in spans if s.stage == "train"]
    rollout = [s for s in spans if s.stage in ("sim", "gen")]
    assert row.shape == Shape(1, False, 16, 0.005)
    assert any(overlaps(t, r) for t in trains for r in rollout)
    assert row.prediction.staleness[1] > 0.5  # most decisions one version behind
    assert row.prediction.throughput > plan_one("sync", prof, wl, CPU).prediction.throughput


def test_colocated_offloads_after_the_rollout_and_reloads_with_the_weights():
    prof = dataclasses.replace(cpu_profile(), sync=SyncCosts(0.005, 0.0, 0.2, 0.3))
    s = build("colocated", prof, PlanWorkload(), CPU)
    assert s.costs.offload_s == 0.2 and s.costs.sync_s == pytest.approx(0.305)
    played = play(s.costs, s.work, s.shape, s.layout, updates=3, warmup=1)
    gens = [x.end - x.start for x in played.spans if x.stage == "gen"]
    # every 12th call (the rollout's last) carries the offload
    assert gens[11] == pytest.approx(gens[0] + 0.2) and gens[10] == pytest.approx(gens[0])


def test_ebrl_searches_its_shape_with_one_replica_and_pins_it_with_several():
    prof = cpu_profile()
    one = plan_one("ebrl", prof, PlanWorkload(), CPU)
    assert one.ranked and one.shape in [p.shape for p in one.ranked]
    gpu = MachineSpec(gpus_per_node=2, cores_per_node=16)
    prof_gpu = gpu_profile()
    two = plan_one(
        "ebrl",
        prof_gpu,
        PlanWorkload(
            num_envs=32,
            sim_workers=4,
            gen_replicas=2,
            learner_ranks=2,
            gen_gpus=0.5,
            learner_gpus=0.5,
        ),
        gpu,
    )
    assert not two.ranked and two.shape == Shape(2, True, 4, 0.005)  # half a replica's group


def test_ebrl_weighs_every_thread_split_on_cores_and_takes_a_thread_only_where_it_pays():
    """As the run's search does (control.searched_threads): every shape at 1 + 1 and 1 + 2
    threads, each split on its own costs and layout. A learner-paced workload whose second
    thread cuts the update takes it; one where the second thread only keeps a core busy
    does not (fewer threads are the simpler shape)."""
    paced = cpu_profile(train2=3.0)  # 3.9 s an update at 1 thread, 3.0 at 2
    row = plan_one("ebrl", paced, PlanWorkload(), CPU)
    assert {p.shape.threads for p in row.ranked} == {(1, 1), (1, 2)}
    assert row.shape.threads == (1, 2)
    flat = dataclasses.replace(
        paced,
        train=StageProfile(
            (Point(192, 3.0, threads=1, busy=1.0), Point(192, 3.0, threads=2, busy=1.9)),
            "samples",
        ),
    )
    assert plan_one("ebrl", flat, PlanWorkload(), CPU).shape.threads == (1, 1)


# --- at scale: replicas, ranks, placement -------------------------------------------------------
def gpu_profile(train_per: float = 0.002) -> Profile:
    gen = tuple(Point(b, 0.02 + 0.001 * b / s, share=s) for s in (0.25, 0.5, 1.0) for b in (1, 64))
    train = tuple(
        Point(n, 0.5 + train_per * n / s, share=s) for s in (0.25, 0.5, 1.0) for n in (64, 1024)
    )
    return Profile(
        (0.004,),
        1.0,
        StageProfile(gen, "batch"),
        StageProfile(train, "samples"),
        SyncCosts(0.05, 0.02, 0.1, 0.1, 1e9),
        chunk_size=4,
        param_bytes=2e9,
        allreduces=2,
    )


def test_replicas_are_placed_like_the_engine_and_scale_a_generator_bound_run():
    machine = MachineSpec(nodes=2, gpus_per_node=4, cores_per_node=32)
    prof = dataclasses.replace(gpu_profile(train_per=1e-5), chunk_s=(0.0005,))
    rates = {}
    for r in (1, 2, 4, 8):
        wl = PlanWorkload(
            num_envs=64 * r,
            sim_workers=4 * r,
            gen_replicas=r,
            learner_ranks=1,
            gen_gpus=0.5,
            learner_gpus=0.5,
            staleness=2,
        )
        s = build("async", prof, wl, machine)
        # a replica on each GPU in turn, spread over the nodes; its env workers on its node
        node_of = {p: p.split(".")[0].removeprefix("gpu") for g in s.layout.gens for p, _ in g}
        for w, pool in enumerate(s.layout.sims):
            ((gpu_pool, _),) = s.layout.gens[s.layout.replica_of[w]]
            assert pool == f"cpu{node_of[gpu_pool]}"
        if r == 8:
            assert {node_of[p] for p in node_of} == {"0", "1"}
        rates[r] = plan_one("async", prof, wl, machine).prediction.throughput
    for r in (2, 4, 8):
        assert rates[r] == pytest.approx(r * rates[1], rel=0.1)


def test_a_learner_of_l_ranks_trains_a_share_each_and_all_reduces():
    prof = gpu_profile()
    one_node = MachineSpec(nodes=1, gpus_per_node=8, cores_per_node=64)
    two_nodes = MachineSpec(nodes=2, gpus_per_node=4, cores_per_node=64)
    base = PlanWorkload(
        num_envs=64,
        decisions_per_env=16,
        sim_workers=8,
        gen_replicas=1,
        gen_gpus=0.5,
        learner_gpus=0.5,
    )
    t1 = build("async", prof, base, one_node).costs.train_s
    for ranks in (2, 4):
        wl = dataclasses.replace(base, learner_ranks=ranks)
        s = build("async", prof, wl, one_node)
        share = prof.train.curve(0.5).seconds(64 * 16 / ranks)
        ring = 2 * 2 * (ranks - 1) / ranks * 2e9 / (200e9)
        assert s.costs.train_s == pytest.approx(share + ring)
        assert s.costs.train_s < t1
        # each rank's share of a GPU, each rank on its own GPU as the engine places them
        assert sum(d for _, d in s.layout.learner) == pytest.approx(0.5 * ranks)
        assert len(s.layout.learner) == ranks
    # six whole-GPU ranks fill the first node and spill onto the second: the ring crosses nodes
    wide = build(
        "async", prof, dataclasses.replace(base, learner_ranks=6, learner_gpus=1.0), two_nodes
    )
    assert {p.split(".")[0] for p, _ in wide.layout.learner} == {"gpu0", "gpu1"}
    assert wide.costs.train_s == pytest.approx(
        prof.train.curve(1.0).seconds(64 * 16 / 6) + allreduce_s(prof, 6, 2, two_nodes)
    )
    assert allreduce_s(prof, 6, 2, two_nodes) > allreduce_s(prof, 6, 1, one_node)


def test_numa_domains_are_pools_of_their_own():
    from collections import Counter

    m = MachineSpec(gpus_per_node=2, cores_per_node=16, numa_per_node=2, cores_effective=0.75)
    wl = PlanWorkload(num_envs=32, sim_workers=8, gen_replicas=2, gen_gpus=0.5, learner_gpus=0.5)
    s = build("async", gpu_profile(), wl, m)
    assert s.layout.pools["cpu0.0"] == s.layout.pools["cpu0.1"] == 6.0  # 8 cores, 0.75 of them
    assert s.layout.nominal == {"cpu0.0": 8.0, "cpu0.1": 8.0}
    assert Counter(s.layout.sims) == {"cpu0.0": 4, "cpu0.1": 4}


def test_the_scale_points_and_cluster_machines_come_from_the_configs():
    m, roles = from_conf("scale/g16")
    assert (m.nodes, m.gpus_per_node, m.cores_per_node) == (2, 8, 96.0)
    assert roles["gen_replicas"] == 16 and roles["num_envs"] == 512
    m, roles = from_conf("cluster")
    assert m.gpus == 8 and m.gpu == "h100" and roles["num_envs"] == 256
    with pytest.raises(ValueError, match="scale points"):
        from_conf("scale/g3")


# --- the profile file ---------------------------------------------------------------------------
def test_a_profile_round_trips_and_interpolates_between_measured_shares(tmp_path):
    prof = Profile.load(EXAMPLE)
    assert prof.illustrative and "NOT MEASURED" in prof.source
    path = prof.save(tmp_path / "p.json")
    again = Profile.load(path)
    assert again == prof
    a, b, mid = prof.gen.curve(0.25), prof.gen.curve(0.5), prof.gen.curve(0.35)
    assert min(a.per_unit, b.per_unit) < mid.per_unit < max(a.per_unit, b.per_unit)
    with pytest.raises(ProfileError, match=r"GPU share \[0.25, 0.5, 1.0\]; the plan asks 0.1"):
        prof.gen.curve(0.1)
    assert prof.steps_per_chunk == pytest.approx(220 / 44)


def test_a_profile_names_what_is_wrong():
    raw = json.loads(EXAMPLE.read_text())
    with pytest.raises(ProfileError, match="format"):
        Profile.from_dict({**raw, "format": "other/2"})
    with pytest.raises(ProfileError, match="sim, gen, train"):
        Profile.from_dict({k: v for k, v in raw.items() if k != "train"})
    bad = {**raw, "gen": {"points": [{"share": 1.0, "seconds": 0.1}]}}
    with pytest.raises(ProfileError, match="batch point 0"):
        Profile.from_dict(bad)
    with pytest.raises(ProfileError, match="all on a CPU"):
        Profile.from_dict(
            {
                **raw,
                "gen": {
                    "points": [
                        {"share": 1, "batch": 1, "seconds": 1},
                        {"threads": 1, "batch": 1, "seconds": 1},
                    ]
                },
            }
        )


def test_a_chunk_distribution_has_the_mean_and_tail_asked():
    x = np.array(lognormal_samples(0.2, 1.5, n=4000))
    assert x.mean() == pytest.approx(0.2, rel=1e-6)
    assert np.percentile(x, 99) / x.mean() == pytest.approx(1.5, rel=0.03)
    assert lognormal_samples(0.2, 1.0) == (0.2,)


def test_a_profile_from_a_runs_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "num_envs: 16\nrollout_steps: 50\nchunk_size: 4\nthreads: {gen: 1, train: 2}\n"
        "simulator: {max_episode_steps: 50}\nresources: {gen_threads: 1, train_threads: 1}\n"
    )
    costs = {
        "sim_chunk_mean_s": 0.012,
        "sim_tail_p99_over_mean": 1.4,
        "sim_busy": 0.98,
        "gen_fixed_s": 0.02,
        "gen_per_env_s": 0.004,
        "gen_busy": 1.0,
        "train_s": 1.5,
        "train_busy": 1.0,
        "message_s": 2e-4,
    }
    (run / "shape.json").write_text(json.dumps({"costs": costs}))
    (run / "summary.json").write_text(
        json.dumps(
            {"iterations": 10, "stage_busy_s": {"sync": 0.2, "load": 0.1}, "stage_cpu_s": {}}
        )
    )
    assert main(["--profile-from-run", str(run), "--out", str(tmp_path / "p.json")]) == 0
    prof = Profile.load(tmp_path / "p.json")
    assert np.mean(prof.chunk_s) == pytest.approx(0.012)
    assert prof.gen.curve(1).seconds(8) == pytest.approx(0.02 + 0.004 * 8)
    assert prof.train.curve(1).seconds(16 * 12) == pytest.approx(1.5)
    assert prof.sync.publish_s == pytest.approx(0.02) and prof.episode_steps == 50
    # a folder without config.yaml: the caller says what it ran
    (run / "config.yaml").unlink()
    assert main(["--profile-from-run", str(run)]) == 2
    prof2 = profile_from_run(run, RunFacts(16, 12, 4, 1, 1, 50))
    assert prof2.gen == prof.gen
    # a search that weighed thread splits leaves each split's costs: a point at every count
    two = {**costs, "train_s": 1.0, "train_busy": 1.6}
    table = {"1+1": costs, "1+2": two}
    chosen = {"env_groups": 1, "gen_threads": 1, "train_threads": 1}
    (run / "shape.json").write_text(
        json.dumps({"shape": chosen, "costs": costs, "costs_by_threads": table})
    )
    prof3 = profile_from_run(run, RunFacts(16, 12, 4, 1, 2, 50))
    assert prof3.train.curve(1).seconds(16 * 12) == pytest.approx(1.5)
    assert prof3.train.curve(2).seconds(16 * 12) == pytest.approx(1.0)
    assert {p.threads for p in prof3.gen.points} == {1}


def test_a_profile_from_a_runs_timeline(tmp_path):
    from ebrl.timeline import Span, Timeline

    run = tmp_path / "run"
    run.mkdir()
    tl = Timeline()
    t = 0.0
    for _ in range(24):  # a sync run: stages in turn, wall time is each stage alone
        tl.add(Span("gen", "gen", t, t + 0.03, (("batch", 4), ("cpu", 0.03))))
        tl.add(Span("sim", "sim0", t + 0.03, t + 0.07, (("batch", 4), ("cpu", 0.04))))
        t += 0.07
    tl.add(Span("train", "learner", t, t + 0.5, (("steps", 48), ("cpu", 0.9))))
    tl.t0 = 0.0
    tl.write_chrome_trace(run / "timeline.json")
    (run / "summary.json").write_text(
        json.dumps(
            {
                "scheduler": "SyncScheduler",
                "iterations": 1,
                "stage_busy_s": tl.busy,
                "stage_cpu_s": tl.cpu,
            }
        )
    )
    prof = profile_from_run(run, RunFacts(4, 24, 4, 1, 2, None))
    assert np.mean(prof.chunk_s) == pytest.approx(0.01)
    assert prof.gen.curve(1).seconds(4) == pytest.approx(0.03)
    assert prof.train.curve(2).seconds(96) == pytest.approx(0.5)
    assert prof.train.curve(2).busy == pytest.approx(1.8)


# --- the command line ---------------------------------------------------------------------------
def test_the_cli_plans_a_scale_point_from_the_example_profile(tmp_path, capsys):
    from analysis.figures import gantt, read_trace

    out = tmp_path / "plan.json"
    rc = main(
        [
            "--profile",
            str(EXAMPLE),
            "--machine",
            "scale/g2",
            "--schedulers",
            "colocated,async,ebrl",
            "--updates",
            "3",
            "--set",
            "decisions_per_env=12",
            "--gantt",
            str(tmp_path / "gantt"),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "ILLUSTRATIVE" in text and "| async |" in text
    fig = json.loads(out.read_text())
    rows = {r["scheduler"]: r for r in fig["schedulers"]}
    assert fig["illustrative_profile"] and fig["machine"]["gpus_per_node"] == 2
    assert rows["ebrl"]["roles"] == {"env_workers": 16, "gen_replicas": 2, "learner_ranks": 2}
    for r in rows.values():
        assert r["throughput_env_steps_per_s"] > 0 and r["plan_s"] > 0
        assert set(r["stage_bubbles"]) >= {"sim", "gen", "train"}
    assert sum(rows["async"]["staleness"].values()) == pytest.approx(1.0)
    trace = read_trace(tmp_path / "gantt" / "ebrl.json")
    assert {"sim", "gen", "train"} <= set(trace.stage) and "gen1" in set(trace.track)
    assert gantt(trace) is not None


def test_the_cli_refuses_a_share_the_profile_does_not_have(tmp_path, capsys):
    rc = main(
        [
            "--profile",
            str(EXAMPLE),
            "--machine",
            "scale/g1",
            "--set",
            "gen_gpus=0.1",
            "--schedulers",
            "async",
        ]
    )
    assert rc == 2 and "the plan asks 0.1" in capsys.readouterr().err
    rc = main(["--profile", str(EXAMPLE), "--machine", "cpu", "--schedulers", "async"])
    assert rc == 2 and "profile's gen points are on a GPU" in capsys.readouterr().err


# --- the GPU profile writer ---------------------------------------------------------------------
TINY_RUN = [
    "simulator=counting",
    "policy.hidden=16",
    "policy.layers=1",
    "num_envs=4",
    "chunk_size=2",
    "rollout_steps=8",
]


def test_the_profile_writer_runs_a_process_per_share_under_its_mps_quota():
    """The GPU path on fakes: each share's child gets its quota, the records become points."""
    seen = []

    def runner(argv, env):
        seen.append((argv, dict(env)))
        level = float(argv[argv.index("--levels") + 1])
        rec = {
            "device": "cuda",
            "level": level,
            "publish_s": 0.2,
            "load_s": 0.1,
            "state_bytes": 1e6,
            "gen": [
                {"batch": b, "seconds": 0.01 + 0.001 * b / level, "busy": 1.0} for b in (1, 16)
            ],
            "train": [
                {"samples": n, "seconds": 0.1 + 0.001 * n / level, "busy": 1.0} for n in (8, 32)
            ],
        }
        return "cuda init noise\n" + json.dumps(rec) + "\n"

    prof = measure_profile(
        TINY_RUN,
        "cuda",
        [0.25, 1.0],
        [1, 16],
        [8, 32],
        runner=runner,
        mps_pipe="fake-mps-pipe",
        sims=lambda o, n: ([0.01] * 8, 0.9),
    )
    quota = [env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") for _, env in seen]
    assert quota == ["25", None]
    assert seen[0][1]["CUDA_MPS_PIPE_DIRECTORY"] == "fake-mps-pipe"
    assert prof.gen.levels() == [0.25, 1.0] and prof.gen.device == "gpu"
    assert prof.gen.curve(0.25).per_unit == pytest.approx(0.004)
    assert prof.sync.publish_s == 0.2 and prof.chunk_size == 2 and not prof.illustrative
    with pytest.raises(RuntimeError, match="MPS daemon"):
        level_env("cuda", 0.5, None)
    assert level_env("cpu", 2, None) == {}


def test_the_profile_writer_measures_the_cpu_for_real():
    rec = measure_level(TINY_RUN, "cpu", 1, [1, 4], [8], repeats=2)
    assert [g["batch"] for g in rec["gen"]] == [1, 4] and rec["state_bytes"] > 0
    assert all(g["seconds"] > 0 and g["busy"] > 0 for g in rec["gen"] + rec["train"])
    prof = assemble([rec], [0.01, 0.02], 1.0, 2, None, "test")
    assert prof.gen.levels() == [1.0] and prof.train.curve(1).seconds(8) > 0
