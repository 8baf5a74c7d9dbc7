"""The offline profiler: timing, the CPU stage functions, the table Algorithm 1 reads and its
round trip through the stage-profile file (``ebrl-plan-profile/1``), comparison."""

from __future__ import annotations

import os
import time

import pytest
import torch

from ebrl.envs.base import EnvSpec
from ebrl.envs.fake import CountingEnv
from ebrl.plan.profile import Profile, ProfileError
from ebrl.resources.apply import affinity_guard
from ebrl.resources.profiler import RatePoint, RateTable, profile, rate_table
from ebrl.resources.split import Pool, allocate
from ebrl.stages.factory import StageFactory
from ebrl.stages.profile import (
    gen_stage_fn,
    profile_cpu,
    sim_stage_fn,
    to_profile,
    train_stage_fn,
)


def test_profile_times_steps_and_records_its_context():
    calls: list[tuple[int, int]] = []

    def stage_fn(share: int, batch: int):
        calls.append((share, batch))

        def step() -> float:
            time.sleep(0.01)
            return float(batch)

        return step

    p = profile(stage_fn, [1, 2], [10], repeats=3, stage="fake", workload={"what": "sleep"})
    assert calls == [(1, 10), (2, 10)]
    assert p.stages == ("fake",) and p.shares("fake") == (1, 2)
    for pt in p.points:
        assert len(pt.samples) == 3
        assert 300 < pt.throughput <= 1000  # 10 items per >= 10 ms
    assert p.workload == {"fake": {"what": "sleep"}}
    assert 0.06 < p.duration_s["fake"] < 5
    assert p.created and p.machine["cpus_allowed"] == len(os.sched_getaffinity(0))


def test_profile_measures_the_cores_a_stage_keeps_busy(tmp_path):
    def stage_fn(share: int, batch: int):
        def step() -> float:
            if share == 1:  # waits: no CPU
                time.sleep(0.01)
            else:  # burns one core
                end = time.perf_counter() + 0.01
                while time.perf_counter() < end:
                    pass
            return float(batch)

        return step

    p = profile(stage_fn, [1, 2], [10], repeats=3, stage="fake")
    asleep, burning = p.busy("fake", 1, 10), p.busy("fake", 2, 10)
    assert asleep < 0.2 < 0.5 < burning <= 1.2
    # kept through runtime rescaling (a slower stage is as busy as before); through a saved
    # file: test_a_measured_table_round_trips_through_the_profile_file
    assert p.scaled("fake", 0.5).busy("fake", 2, 10) == burning
    # a point without busy cores measured, or a share never profiled: the share
    unmeasured = RateTable([RatePoint("gen", 3, 8, 1.0)])
    assert unmeasured.points[0].busy_cores is None and unmeasured.busy("gen", 3, 8) == 3.0
    assert p.busy("fake", 4, 10) == 4.0


def test_tiny_cpu_profile_with_the_mlp_policy(tmp_path):
    threads = torch.get_num_threads()
    before = os.sched_getaffinity(0)
    p = profile_cpu(
        threads=(1, 2), gen_batches=(4, 16), train_batches=(32,), repeats=2, hidden=32, layers=1
    )
    assert torch.get_num_threads() == threads and os.sched_getaffinity(0) == before
    assert p.stages == ("gen", "train")
    assert p.batch_sizes("gen") == (4, 16) and p.batch_sizes("train") == (32,)
    assert all(pt.throughput > 0 for pt in p.points)
    assert set(p.duration_s) == {"gen", "train"} and sum(p.duration_s.values()) < 60
    assert p.workload["gen"]["hidden"] == 32 and p.workload["train"]["update_epochs"] == 8

    # the allocator consumes it directly, and as the run reads it back from its file
    a = allocate(p, Pool(2))
    assert a.gen_units == a.train_units == 1 and a.throughput > 0
    sim = RateTable([RatePoint("sim", 1, 4, 300.0, (290.0, 310.0), 0.9)])
    path = to_profile(p.merge(sim), 4, 4, None, "test").save(tmp_path / "profiles" / "cpu.json")
    back = rate_table(Profile.load(path))
    ratios = back.compare(p)  # gen's points (train's size is an update's in the file)
    assert len(ratios) == 4 and all(r == pytest.approx(1.0, rel=1e-15) for r in ratios.values())
    assert allocate(back, Pool(2)).gen_units == 1


def test_stage_functions_from_a_stage_factory(tiny_cfg):
    factory = StageFactory.from_config(tiny_cfg()).with_spec(EnvSpec(4, 2, 10))
    gen = profile(gen_stage_fn(factory.policy()), [1], [8], repeats=1, stage="gen")
    train = profile(train_stage_fn(factory.policy()), [1], [16], repeats=1, stage="train")
    merged = gen.merge(train)
    assert merged.stages == ("gen", "train")
    assert merged.throughput("gen", 1, 8) > 0 and merged.throughput("train", 1, 16) > 0


def test_sim_stage_fn_counts_env_steps():
    with affinity_guard() as before:
        p = profile(
            sim_stage_fn(lambda i: CountingEnv(i, episode_len=100), chunk_size=2),
            [1],
            [4],
            repeats=2,
            stage="sim",
            share_unit="cores",
        )
    assert os.sched_getaffinity(0) == before
    assert p.throughput("sim", 1, 4) > 0


def test_compare_scaled_and_merge():
    a = RateTable(points=[RatePoint("gen", 1, 8, 100.0, (90.0, 110.0))])
    b = a.scaled("gen", 2.0)
    assert b.throughput("gen", 1, 8) == 200.0 and b.points[0].samples == (180.0, 220.0)
    assert a.compare(b) == {("gen", 1, 8): 0.5}
    assert a.scaled("train", 3.0) == a
    c = RateTable(points=[RatePoint("gen", 2, 8, 150.0)], duration_s={"gen": 1.0})
    m = a.merge(c)
    assert m.shares("gen") == (1, 2) and m.duration_s == {"gen": 1.0}
    with pytest.raises(KeyError, match="profiled shares"):
        m.throughput("gen", 3, 8)
    with pytest.raises(ValueError, match="share units"):
        a.merge(RateTable(points=[], share_unit="sm_percent"))


def measured_table() -> RateTable:
    """Rates as the run's profiler measures them (decisions/s, not round numbers): gen at 1-3
    threads and two batches, train at one minibatch, one env worker's simulators."""
    pts = [
        RatePoint("gen", t, b, 311.7 * t**0.8 * (1 + b / 13), (300.1, 333.3), 0.93 * t)
        for t in (1, 2, 3)
        for b in (2, 4)
    ]
    pts += [RatePoint("train", t, 96, 177.3 * t**0.7, (170.9,), 0.87 * t) for t in (1, 2, 3)]
    return RateTable([*pts, RatePoint("sim", 1, 4, 403.9, (401.2, 406.6), 0.99)])


@pytest.mark.parametrize(
    "pool",
    [Pool(4), Pool(4, shared_with_sim=True, cores=2), Pool(4, shared_with_sim=True, cores=8)],
)
def test_a_measured_table_round_trips_through_the_profile_file(tmp_path, pool):
    """The run's profile -> its file -> the table Algorithm 1 reads: every measured rate comes
    back as measured (to float precision, no fitted curve in between), with its busy cores, so
    Algorithm 1 decides as on the rates in memory."""
    table = measured_table()
    prof = to_profile(table, 8, 4, 50, "test")
    assert prof.train.points[0].size == 96 * 8  # an update: every minibatch of the segment
    back = rate_table(Profile.load(prof.save(tmp_path / "profile.json")))
    for p in table.points:
        size = p.batch_size * (8 if p.stage == "train" else 1) if p.stage != "sim" else 1
        got = back.point(p.stage, p.share, size)
        assert got is not None
        assert got.throughput == pytest.approx(p.throughput, rel=1e-15, abs=0)
        assert got.busy_cores == p.busy_cores
        if p.stage != "sim":
            assert got.samples == pytest.approx(p.samples, rel=1e-15, abs=0)
    want = allocate(table, pool, sim_rate=2 * 403.9, sim_workers=2)
    got = allocate(back, pool, sim_rate=2 * 403.9, sim_workers=2)
    assert (got.gen_units, got.train_units, got.gen_batch) == (
        want.gen_units,
        want.train_units,
        want.gen_batch,
    )
    assert got.train_batch == want.train_batch * 8
    assert got.throughput == pytest.approx(want.throughput, rel=1e-14)


def test_a_run_profile_in_the_old_untagged_format_is_refused_naming_what_to_do():
    old = {"points": [{"stage": "gen", "share": 1, "batch_size": 8, "throughput": 1.0}]}
    with pytest.raises(ProfileError, match=r"python -m ebrl\.plan\.measure"):
        Profile.from_dict(old)
