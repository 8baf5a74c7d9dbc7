"""Resource plans on fake machines: NUMA locality, GPU shares, never oversubscribing, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebrl.resources.assign import (
    PlanError,
    PlanPolicy,
    ResourcePlan,
    ShareKind,
    StageRequest,
    cpu_plan,
    cpu_split,
    make_plan,
)
from ebrl.resources.topology import Core, Topology, fake_topology

SERVER = fake_topology(numa_nodes=2, cores_per_node=32, gpus=8)


def _check_invariants(plan: ResourcePlan, topo: Topology, sharing: bool = False) -> None:
    if not sharing:
        assert max(plan.core_load().values(), default=0) <= 1
    assert all(pct <= 100 for pct in plan.gpu_percent().values())
    migs = [p.gpu.mig_uuid for p in plan.placements if p.gpu and p.gpu.mig_uuid]
    assert len(migs) == len(set(migs))
    assert set(plan.core_load()) == set(topo.core_ids)


def test_gen_and_train_share_a_gpu_with_mps_quotas_on_its_numa_node():
    plan = make_plan(
        SERVER,
        [
            StageRequest("gen", cores_per_process=4, gpu_share=0.3, batch_size=32),
            StageRequest("train", cores_per_process=8, gpu_share=0.7, batch_size=256),
            StageRequest("sim", processes=4, cores_per_process=4),
        ],
    )
    (gen,) = plan.stage("gen")
    (train,) = plan.stage("train")
    assert gen.gpu.kind == train.gpu.kind == ShareKind.mps
    assert gen.gpu.gpu == train.gpu.gpu == 0
    assert (gen.gpu.sm_percent, train.gpu.sm_percent) == (30, 70)
    assert gen.gpu.sms == round(132 * 0.3)
    assert all(SERVER.core(c).numa == 0 for c in gen.cores + train.cores)
    assert (gen.threads, train.threads) == (4, 8)
    assert (gen.batch_size, train.batch_size) == (32, 256)
    assert all(p.threads == 1 for p in plan.stage("sim"))
    assert len(plan.stage("sim")) == 4
    assert not plan.warnings
    _check_invariants(plan, SERVER)


def test_cores_follow_the_preferred_gpus_numa_node():
    plan = make_plan(
        SERVER, [StageRequest("train", cores_per_process=16, gpu_share=1.0, prefer_gpu=6)]
    )
    (p,) = plan.stage("train")
    assert p.gpu.gpu == 6 and p.gpu.kind == ShareKind.whole and p.numa == 1
    assert all(SERVER.core(c).numa == 1 for c in p.cores)


def test_placements_come_back_in_request_order():
    plan = make_plan(
        SERVER,
        [StageRequest("sim", processes=2), StageRequest("gen", gpu_share=0.5)],
    )
    assert [(p.stage, p.rank) for p in plan.placements] == [("sim", 0), ("sim", 1), ("gen", 0)]


def test_whole_gpus_spread_and_the_ninth_does_not_fit():
    plan = make_plan(SERVER, [StageRequest("train", processes=8, gpu_share=1.0)])
    assert sorted(p.gpu.gpu for p in plan.placements) == list(range(8))
    with pytest.raises(PlanError) as e:
        make_plan(SERVER, [StageRequest("train", processes=9, gpu_share=1.0)])
    msg = str(e.value)
    assert "stage 'train' process 8 of 9" in msg and "100%" in msg and "GPU7: 0% of SMs free" in msg


def test_gpu_never_beyond_100_percent():
    one = fake_topology(numa_nodes=1, cores_per_node=8, gpus=1)
    with pytest.raises(PlanError, match=r"asks for 60% .* GPU0: 40% of SMs free"):
        make_plan(one, [StageRequest("gen", gpu_share=0.6), StageRequest("train", gpu_share=0.6)])


def test_mig_instances_best_fit_and_never_twice():
    mig = fake_topology(numa_nodes=2, cores_per_node=8, gpus=2, mig=True)
    plan = make_plan(
        mig,
        [
            StageRequest("gen", processes=2, gpu_share=0.1),  # 13.2 SMs: the 16-SM instances
            StageRequest("train", gpu_share=0.4),  # 52.8 SMs: the 60-SM instance
        ],
    )
    gens = plan.stage("gen")
    assert [p.gpu.kind for p in gens] == [ShareKind.mig, ShareKind.mig]
    assert [p.gpu.sms for p in gens] == [16, 16]
    (train,) = plan.stage("train")
    assert train.gpu.sms == 60 and train.gpu.mig_uuid == "MIG-fake-0-0"
    _check_invariants(plan, mig)


def test_mig_too_big_says_which_instances_are_free():
    mig = fake_topology(numa_nodes=1, cores_per_node=8, gpus=1, mig=True)
    with pytest.raises(PlanError) as e:
        make_plan(mig, [StageRequest("train", gpu_share=0.7)])
    assert "stage 'train'" in str(e.value)
    assert "MIG instances free with SMs [60,32,16,16] of 132" in str(e.value)


def test_time_slicing_without_mps_is_recorded_as_a_warning():
    no_mps = fake_topology(numa_nodes=1, cores_per_node=8, gpus=1, mps=False)
    plan = make_plan(
        no_mps, [StageRequest("gen", gpu_share=0.5), StageRequest("train", gpu_share=0.5)]
    )
    assert all(p.gpu.kind == ShareKind.timeslice for p in plan.placements)
    assert len(plan.warnings) == 2 and "not enforced" in plan.warnings[0]
    off = make_plan(SERVER, [StageRequest("gen", gpu_share=0.5)], PlanPolicy(use_mps=False))
    assert off.placements[0].gpu.kind == ShareKind.timeslice
    assert "disabled by policy" in off.warnings[0]


def test_no_gpu_machine_refuses_gpu_requests():
    cpu = fake_topology(numa_nodes=1, cores_per_node=4, gpus=0)
    with pytest.raises(PlanError, match=r"stage 'gen' .*no GPUs"):
        make_plan(cpu, [StageRequest("gen", gpu_share=0.3)])


def test_core_error_names_stage_ask_and_free():
    small = fake_topology(numa_nodes=2, cores_per_node=4, gpus=0)
    with pytest.raises(PlanError) as e:
        make_plan(
            small,
            [
                StageRequest("sim", processes=2, cores_per_process=3),
                StageRequest("gen", cores_per_process=3),
            ],
        )
    msg = str(e.value)
    assert "stage 'gen' process 0 of 1 asks for 3 cores" in msg
    assert "2 of 8 allowed cores are free" in msg and "allow_core_sharing" in msg
    with pytest.raises(PlanError, match="allows only 8 cores"):
        make_plan(small, [StageRequest("train", cores_per_process=9)])


def test_core_sharing_on_a_two_core_machine():
    two = Topology((Core(0, 0), Core(1, 0)))
    reqs = [StageRequest("sim", processes=2), StageRequest("gen"), StageRequest("train")]
    with pytest.raises(PlanError):
        make_plan(two, reqs)
    plan = make_plan(two, reqs, PlanPolicy(allow_core_sharing=True))
    assert max(plan.core_load().values()) == 2 and min(plan.core_load().values()) == 2
    assert any("shares cores" in w for w in plan.warnings)


def test_gpu_process_spills_off_numa_with_warning_or_error():
    plan = make_plan(SERVER, [StageRequest("train", cores_per_process=40, gpu_share=1.0)])
    (p,) = plan.placements
    assert sum(SERVER.core(c).numa == 0 for c in p.cores) == 32
    assert "8 of 40 cores" in plan.warnings[0] and "off NUMA node 0" in plan.warnings[0]
    with pytest.raises(PlanError, match="strict_numa"):
        make_plan(
            SERVER,
            [StageRequest("train", cores_per_process=40, gpu_share=1.0)],
            PlanPolicy(strict_numa=True),
        )


def test_smt_siblings_are_used_last():
    smt = fake_topology(numa_nodes=1, cores_per_node=8, smt=True, gpus=0)
    plan = make_plan(
        smt, [StageRequest("gen", cores_per_process=4), StageRequest("train", cores_per_process=4)]
    )
    for p in plan.placements:
        physical = {smt.core(c).siblings for c in p.cores}
        assert len(physical) == 4  # one thread of each of 4 physical cores
    # siblings numbered next to each other: (0, 1), (2, 3), ...
    adjacent = Topology(tuple(Core(c, 0, (c - c % 2, c - c % 2 + 1)) for c in range(8)))
    spread = make_plan(adjacent, [StageRequest("gen", cores_per_process=2)])
    assert spread.placements[0].cores == (0, 2)
    packed = make_plan(
        adjacent, [StageRequest("gen", cores_per_process=2)], PlanPolicy(spread_smt=False)
    )
    assert packed.placements[0].cores == (0, 1)


def test_request_validation():
    with pytest.raises(PlanError, match="role"):
        StageRequest("learn")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="gpu_share"):
        StageRequest("gen", gpu_share=1.5)
    with pytest.raises(PlanError, match=">= 1"):
        StageRequest("gen", processes=0)
    with pytest.raises(PlanError, match="unique"):
        make_plan(SERVER, [StageRequest("sim"), StageRequest("sim")])
    with pytest.raises(PlanError, match="prefers GPU 9"):
        make_plan(SERVER, [StageRequest("gen", gpu_share=0.2, prefer_gpu=9)])


requests = st.lists(
    st.builds(
        StageRequest,
        role=st.sampled_from(["sim", "gen", "train"]),
        processes=st.integers(1, 4),
        cores_per_process=st.integers(1, 12),
        gpu_share=st.one_of(st.none(), st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.5, 0.7, 1.0])),
        prefer_gpu=st.one_of(st.none(), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=5,
).map(lambda rs: [StageRequest(**{**r.__dict__, "name": f"{r.role}{i}"}) for i, r in enumerate(rs)])


@settings(max_examples=150, deadline=None)
@given(
    reqs=requests,
    mig=st.booleans(),
    mps=st.booleans(),
    smt=st.booleans(),
    sharing=st.booleans(),
)
def test_plans_never_oversubscribe(reqs, mig, mps, smt, sharing):
    topo = fake_topology(numa_nodes=2, cores_per_node=16, smt=smt, gpus=4, mig=mig, mps=mps)
    try:
        plan = make_plan(topo, reqs, PlanPolicy(allow_core_sharing=sharing))
    except PlanError as e:
        assert "stage '" in str(e)  # every refusal names the stage
        return
    _check_invariants(plan, topo, sharing)
    for r in reqs:
        ps = plan.stage(r.name)
        assert len(ps) == r.processes
        for p in ps:
            assert len(p.cores) == r.cores_per_process
            assert (p.gpu is None) == (r.gpu_share is None)
            if p.gpu is not None and p.gpu.kind != ShareKind.mig:
                assert p.gpu.sm_percent == round(r.gpu_share * 100)
            if p.gpu is not None and p.gpu.kind == ShareKind.mig:
                assert p.gpu.sms >= r.gpu_share * 132 - 1e-9


def test_cpu_split():
    t = fake_topology(numa_nodes=2, cores_per_node=4, gpus=0)
    gen, train = cpu_split(t, 0.25)
    assert (gen, train) == ((0, 1), (2, 3, 4, 5, 6, 7))
    assert cpu_split(t, 0.0)[0] == (0,)  # each side keeps a core
    assert cpu_split(t, 1.0)[1] == (7,)
    assert cpu_split(t, 0.5, pool=[2, 3, 6, 7]) == ((2, 3), (6, 7))
    one = Topology((Core(3, 0),))
    assert cpu_split(one, 0.5) == ((3,), (3,))
    with pytest.raises(PlanError):
        cpu_split(t, 1.5)
    with pytest.raises(PlanError, match="not in the topology"):
        cpu_split(t, 0.5, pool=[99])


def test_cpu_split_keeps_smt_siblings_together():
    t = fake_topology(numa_nodes=1, cores_per_node=8, smt=True, gpus=0)
    gen, train = cpu_split(t, 0.5)
    assert {t.core(c).siblings for c in gen}.isdisjoint({t.core(c).siblings for c in train})


def test_cpu_plan_big_and_small_machines():
    big = fake_topology(numa_nodes=2, cores_per_node=8, gpus=0)
    plan = cpu_plan(big, gen_share=0.25, sim_processes=4, sim_cores_per_process=2, gen_batch=16)
    _check_invariants(plan, big)
    (gen,) = plan.stage("gen")
    (train,) = plan.stage("train")
    assert (len(gen.cores), len(train.cores)) == (2, 6)
    assert (gen.threads, train.threads, gen.batch_size) == (2, 6, 16)
    assert not plan.warnings
    two = Topology((Core(0, 0), Core(1, 0)))
    small = cpu_plan(two, gen_share=0.5, sim_processes=2)
    assert small.stage("gen")[0].cores == (0,) and small.stage("train")[0].cores == (1,)
    assert all(p.cores == (0, 1) for p in small.stage("sim"))
    assert "no room" in small.warnings[0]
    assert "gen[0]" in small.describe()
