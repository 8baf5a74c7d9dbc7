"""The offline profiler: timing, the CPU stage functions, JSON round trip, comparison."""

from __future__ import annotations

import os
import time

import pytest
import torch

from ebrl.envs.base import EnvSpec
from ebrl.envs.fake import CountingEnv
from ebrl.resources.apply import affinity_guard
from ebrl.resources.profiler import Profile, ProfilePoint, profile
from ebrl.resources.split import Pool, allocate
from ebrl.stages.factory import StageFactory
from ebrl.stages.profile import gen_stage_fn, profile_cpu, sim_stage_fn, train_stage_fn


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
    # kept through a save, and through runtime rescaling (a slower stage is as busy as before)
    back = Profile.load(p.save(tmp_path / "p.json"))
    assert back.busy("fake", 2, 10) == burning
    assert p.scaled("fake", 0.5).busy("fake", 2, 10) == burning
    # a profile from before busy cores were measured, or a share never profiled: the share
    old = Profile.from_dict(
        {"points": [{"stage": "gen", "share": 3, "batch_size": 8, "throughput": 1.0}]}
    )
    assert old.points[0].busy_cores is None and old.busy("gen", 3, 8) == 3.0
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

    path = p.save(tmp_path / "profiles" / "cpu.json")
    back = Profile.load(path)
    assert back == p
    assert set(back.compare(p).values()) == {1.0}

    # the allocator consumes it directly
    a = allocate(back, Pool(2))
    assert a.gen_units == a.train_units == 1 and a.throughput > 0


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
    a = Profile(points=[ProfilePoint("gen", 1, 8, 100.0, (90.0, 110.0))])
    b = a.scaled("gen", 2.0)
    assert b.throughput("gen", 1, 8) == 200.0 and b.points[0].samples == (180.0, 220.0)
    assert a.compare(b) == {("gen", 1, 8): 0.5}
    assert a.scaled("train", 3.0) == a
    c = Profile(points=[ProfilePoint("gen", 2, 8, 150.0)], duration_s={"gen": 1.0})
    m = a.merge(c)
    assert m.shares("gen") == (1, 2) and m.duration_s == {"gen": 1.0}
    with pytest.raises(KeyError, match="profiled shares"):
        m.throughput("gen", 3, 8)
    with pytest.raises(ValueError, match="share units"):
        a.merge(Profile(points=[], share_unit="sm_percent"))
