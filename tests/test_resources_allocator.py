"""Algorithm 1: binary search against brute force, the simulators in the model, the divergence
and drift triggers, reallocation records."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebrl.resources.assign import ShareKind, make_plan
from ebrl.resources.elastic import ElasticAllocator
from ebrl.resources.monitors import DivergenceMonitor, DriftMonitor
from ebrl.resources.profiler import RatePoint, RateTable
from ebrl.resources.split import (
    AllocationError,
    Pool,
    allocate,
    balance,
    divergence,
    first_at_least,
    predict,
    profile_curve,
    shared_cpu_rate,
    sim_rate,
    stage_requests,
)
from ebrl.resources.topology import fake_topology
from tests.alloc_reference import (
    allocate_brute_force,
    balance_brute_force,
    first_at_least_brute_force,
)


def monotone(increments: list[float]) -> list[float]:
    """Cumulative sums: a non-decreasing curve whose value at 0 is 0."""
    out, acc = [0.0], 0.0
    for d in increments:
        acc += d
        out.append(acc)
    return out


@st.composite
def curve_pair(draw):
    units = draw(st.integers(2, 120))
    min_units = draw(st.integers(1, units // 2))
    inc = st.floats(0.0, 100.0, allow_nan=False)
    gen = monotone(draw(st.lists(inc, min_size=units, max_size=units)))
    train = monotone(draw(st.lists(inc, min_size=units, max_size=units)))
    return units, min_units, gen, train


@settings(max_examples=300, deadline=None)
@given(curve_pair())
def test_binary_search_matches_brute_force(case):
    units, min_units, gen, train = case
    fast = balance(gen.__getitem__, train.__getitem__, units, min_units)
    ref = balance_brute_force(gen.__getitem__, train.__getitem__, units, min_units)
    assert fast.value == ref.value
    assert min_units <= fast.gen_units <= units - min_units
    assert fast.value == min(gen[fast.gen_units], train[units - fast.gen_units])
    # O(log units) evaluations: a bisection plus the two candidates around the crossing
    assert fast.evaluations <= 2 * (math.ceil(math.log2(units + 1)) + 2)


def test_balance_linear_curves_cross_where_expected():
    # gen does 3 items/s per unit, train 1: gen needs a quarter of 100 units
    s = balance(lambda g: 3.0 * g, lambda t: 1.0 * t, 100)
    assert s.gen_units == 25 and s.value == 75.0


def test_balance_rejects_a_pool_too_small():
    with pytest.raises(AllocationError):
        balance(float, float, 1)
    with pytest.raises(AllocationError):
        Pool(1)


def test_profile_curve_interpolates_extrapolates_and_is_monotone():
    f = profile_curve([(2, 100.0), (4, 150.0), (8, 140.0)])  # the last point is noise
    assert f(0) == 0.0
    assert f(1) == 50.0  # proportional below the smallest share
    assert f(3) == 125.0  # linear between points
    assert f(8) == 150.0 and f(64) == 150.0  # running maximum, flat above
    vals = [f(u) for u in range(20)]
    assert vals == sorted(vals)


def _profile(
    gen: dict[int, dict[int, float]], train: dict[int, dict[int, float]], unit: str = "threads"
) -> RateTable:
    pts = [RatePoint("gen", s, b, y) for b, c in gen.items() for s, y in c.items()]
    pts += [RatePoint("train", s, b, y) for b, c in train.items() for s, y in c.items()]
    return RateTable(points=pts, share_unit=unit)


@st.composite
def profiles(draw):
    units = draw(st.integers(2, 64))
    shares = sorted(draw(st.sets(st.integers(1, units), min_size=1, max_size=5)))
    inc = st.floats(0.0, 1000.0, allow_nan=False)

    def stage():
        out = {}
        for b in sorted(draw(st.sets(st.sampled_from([4, 8, 16, 32, 64]), min_size=1, max_size=3))):
            # noisy, not necessarily monotone: the curve builder must cope
            ys = draw(st.lists(inc, min_size=len(shares), max_size=len(shares)))
            out[b] = dict(zip(shares, ys))
        return out

    return units, _profile(stage(), stage())


@settings(max_examples=150, deadline=None)
@given(profiles())
def test_allocate_matches_brute_force(case):
    units, prof = case
    pool = Pool(units)
    fast, ref = allocate(prof, pool), allocate_brute_force(prof, pool)
    assert fast.throughput == ref.throughput
    assert fast.gen_units + fast.train_units == units
    assert fast.evaluations <= ref.evaluations


LINEAR = _profile(
    gen={8: {1: 100.0, 8: 800.0}, 32: {1: 200.0, 8: 1600.0}},
    train={64: {1: 50.0, 8: 400.0}, 256: {1: 100.0, 8: 800.0}},
)


def test_allocate_picks_balanced_split_and_largest_useful_batches():
    a = allocate(LINEAR, Pool(8))
    # gen 200/unit at batch 32, train 100/unit at batch 256: gen takes a third of the pool
    assert (a.gen_batch, a.train_batch) == (32, 256)
    assert (a.gen_units, a.train_units) == (3, 5)
    assert a.throughput == min(600.0, 500.0)
    assert a.gen_share == 3 / 8
    limited = allocate(LINEAR, Pool(8), max_gen_batch=16, max_train_batch=64)
    assert (limited.gen_batch, limited.train_batch) == (8, 64)
    with pytest.raises(AllocationError, match="exceeds the limit"):
        allocate(LINEAR, Pool(8), max_gen_batch=4)


def test_allocate_ties_prefer_smaller_batches():
    same = _profile(gen={8: {1: 10.0}, 32: {1: 10.0}}, train={64: {1: 10.0}, 256: {1: 10.0}})
    a = allocate(same, Pool(2))
    assert (a.gen_batch, a.train_batch) == (8, 64)


def test_allocate_checks_units():
    with pytest.raises(AllocationError, match="sm_percent"):
        allocate(LINEAR, Pool(100, unit="sm_percent"))


def test_stage_requests_feed_make_plan():
    sm = _profile(
        gen={16: {10: 100.0, 100: 1000.0}}, train={256: {10: 40.0, 100: 400.0}}, unit="sm_percent"
    )
    a = allocate(sm, Pool(100, unit="sm_percent"))
    assert a.gen_units + a.train_units == 100
    plan = make_plan(fake_topology(gpus=1), stage_requests(a, gen_cores=2, train_cores=4))
    gen, train = plan.stage("gen")[0], plan.stage("train")[0]
    assert gen.gpu.kind == train.gpu.kind == ShareKind.mps
    assert (gen.gpu.sm_percent, train.gpu.sm_percent) == (a.gen_units, a.train_units)
    assert (gen.batch_size, train.batch_size) == (16, 256)
    cpu = allocate(LINEAR, Pool(8))
    plan = make_plan(fake_topology(numa_nodes=1, cores_per_node=8, gpus=0), stage_requests(cpu))
    assert len(plan.stage("gen")[0].cores) == plan.stage("gen")[0].threads == cpu.gen_units


# --- run time ---------------------------------------------------------------------------------
def test_divergence():
    assert divergence(100.0, 85.0) == pytest.approx(0.15)
    assert divergence(0.0, 0.0) == 0.0 and divergence(0.0, 5.0) == 1.0


@pytest.mark.parametrize("window", [1, 5, 20])
def test_monitor_fires_after_exactly_window_steps(window):
    m = DivergenceMonitor(threshold=0.15, window=window)
    fired = [m.update(100.0, 50.0) for _ in range(window)]
    assert fired == [False] * (window - 1) + [True]
    # firing restarts the count: a persisting divergence fires once per window
    again = [m.update(100.0, 50.0) for _ in range(window)]
    assert again == [False] * (window - 1) + [True]


def test_monitor_streak_resets_on_a_balanced_step():
    m = DivergenceMonitor(threshold=0.15, window=20)
    for _ in range(19):
        assert not m.update(100.0, 50.0)
    assert not m.update(100.0, 90.0)  # within 15%: the streak breaks
    assert m.streak == 0
    assert [m.update(50.0, 100.0) for _ in range(20)][-1]
    assert not any(m.update(100.0, 85.0) for _ in range(40))  # exactly 15% is not divergent


def test_elastic_allocator_reallocates_toward_the_slow_stage(caplog):
    clock = iter(range(1000, 2000)).__next__
    ea = ElasticAllocator(
        LINEAR, Pool(8), DivergenceMonitor(0.15, window=20), blend=1.0, clock=clock
    )
    start = ea.current
    assert (start.gen_units, start.train_units) == (3, 5)
    # at run time training is half as fast as profiled (say, longer segments than profiled)
    g = predict(LINEAR, "gen", start.gen_units, start.gen_batch)
    t = predict(LINEAR, "train", start.train_units, start.train_batch) / 2
    with caplog.at_level(logging.INFO):
        results = [ea.observe(g, t, step=i) for i in range(20)]
    assert results[:19] == [None] * 19
    r = results[19]
    assert r is not None and r.changed and r.step == 19 and r.decided_at == 1000
    assert "diverged more than 15% from the planned 600.0/s vs 500.0/s for 20 consecutive" in (
        r.cause
    )
    assert (r.measured_gen, r.measured_train) == (g, t)
    assert r.old == start and r.new.train_units > start.train_units
    # with train's curve halved: gen 200/unit, train 50/unit -> gen gets 8 * 50 / 250 = 1.6
    assert (r.new.gen_units, r.new.train_units) == (2, 6)
    assert ea.current == r.new and ea.history == [r]
    assert "reallocation at step 19" in caplog.text and "diverged" in caplog.text
    done = ea.applied(r, 0.01, latency_s=1.25)
    assert (done.apply_cost_s, done.apply_latency_s) == (0.01, 1.25) and ea.history == [done]
    with ea.applying(done):
        pass
    again = ea.history[0]
    assert again.apply_cost_s is not None and again.apply_cost_s < 1.0
    assert again.apply_latency_s == again.apply_cost_s  # applied in the block: at once


def test_elastic_allocator_records_an_unchanged_split():
    ea = ElasticAllocator(LINEAR, Pool(8), DivergenceMonitor(0.15, window=3), blend=0.5)
    cur = ea.current
    g = predict(LINEAR, "gen", cur.gen_units, cur.gen_batch)
    t = predict(LINEAR, "train", cur.train_units, cur.train_batch)
    # the first window sets each stage's level; as planned, so nothing fires
    assert [ea.observe(g, t) for _ in range(3)] == [None] * 3
    # then both slow down by the same factor: no divergence, but both drift from their levels
    rs = [ea.observe(g * 0.5, t * 0.5) for _ in range(3)]
    assert rs[:2] == [None, None]
    r = rs[-1]
    assert r is not None and not r.changed and "drifted more than 15%" in r.cause
    # both drifted: their curves take the window's means (three steps at half) as measured,
    # not blended with the profile (a window away from a stage's own level is a new level)
    f = 0.5
    assert ea.profile.throughput("gen", 8, 32) == pytest.approx(1600.0 * f)
    assert ea.profile.throughput("train", 8, 256) == pytest.approx(800.0 * f)


def test_a_drift_is_taken_in_full_and_a_divergence_is_blended():
    ea = ElasticAllocator(LINEAR, Pool(8), DivergenceMonitor(0.15, window=3), blend=0.5)
    cur = ea.current
    g = predict(LINEAR, "gen", cur.gen_units, cur.gen_batch)
    t = predict(LINEAR, "train", cur.train_units, cur.train_batch)
    # levels set 20% under the plan (a divergence too, which fires and blends)
    rs = [ea.observe(g, t * 0.8) for _ in range(3)]
    assert rs[-1] is not None and "diverged" in rs[-1].cause and "drifted" not in rs[-1].cause
    assert ea.profile.throughput("train", 8, 256) == pytest.approx(800.0 * 0.9)
    assert ea.profile.throughput("gen", 8, 32) == pytest.approx(1600.0)
    assert ea.drift.levels == {"gen": g, "train": t * 0.8}
    # the learner then slows to a third of its level: a drift; its curve takes the measurement
    before = ea.profile.throughput("train", 8, 256)
    pt = predict(ea.profile, "train", ea.current.train_units, ea.current.train_batch)
    rs = [ea.observe(g, t * 0.8 / 3) for _ in range(3)]
    r = rs[-1]
    assert r is not None and "train drifted" in r.cause
    assert ea.profile.throughput("train", 8, 256) == pytest.approx(before * (t * 0.8 / 3) / pt)
    assert ea.profile.throughput("gen", 8, 32) == pytest.approx(1600.0)  # as planned: unscaled


# --- the simulators in the model --------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(curve_pair(), st.floats(0.0, 5000.0, allow_nan=False))
def test_first_at_least_matches_brute_force(case, target):
    units, min_units, gen, _ = case
    fast = first_at_least(gen.__getitem__, target, min_units, units)
    ref = first_at_least_brute_force(gen.__getitem__, target, min_units, units)
    assert fast[0] == ref[0]
    assert fast[1] <= math.ceil(math.log2(units + 1)) + 2


@settings(max_examples=150, deadline=None)
@given(profiles(), st.floats(1.0, 3000.0, allow_nan=False), st.booleans())
def test_allocate_with_simulators_matches_brute_force(case, rate, shared):
    units, prof = case
    pool = Pool(units, shared_with_sim=shared)
    fast = allocate(prof, pool, sim_rate=rate)
    ref = allocate_brute_force(prof, pool, sim_rate=rate)
    assert fast.throughput == ref.throughput <= rate
    assert (fast.gen_units + fast.train_units, fast.gen_batch) == (
        ref.gen_units + ref.train_units,
        ref.gen_batch,
    )
    used = fast.gen_units + fast.train_units
    assert used <= units if shared else used == units
    assert fast.evaluations <= ref.evaluations or units < 8  # bisection pays off past tiny pools


def test_sim_bound_pool_shared_with_the_simulators_keeps_only_what_keeps_up():
    # LINEAR: gen 100/unit at batch 8, 200/unit at 32; train 50/unit at 64, 100/unit at 256
    a = allocate(LINEAR, Pool(8, shared_with_sim=True), sim_rate=150.0)
    # 150 * 1.15 = 172.5: gen needs 1 unit at batch 32 (200/s), train 2 at batch 256 (200/s)
    assert (a.gen_units, a.train_units, a.gen_batch, a.train_batch) == (1, 2, 32, 256)
    assert a.throughput == 150.0 and a.bound == "sim" and a.unused_units == 5
    assert "5 threads left to the simulators" in a.describe()
    # the same pool on its own hardware (a GPU's SMs): the whole pool, still capped by the sims
    b = allocate(LINEAR, Pool(8), sim_rate=150.0)
    assert b.gen_units + b.train_units == 8 and b.throughput == 150.0
    # without the simulators in the model, as before
    assert allocate(LINEAR, Pool(8)).throughput == 500.0
    # simulators faster than gen and train can go: the balanced split of the whole pool
    c = allocate(LINEAR, Pool(8, shared_with_sim=True), sim_rate=10_000.0)
    assert (c.gen_units, c.train_units) == (3, 5) and c.bound == "train"


def test_sim_bound_ties_take_the_smallest_generator_batch():
    prof = _profile(
        gen={2: {1: 300.0, 4: 300.0}, 8: {1: 900.0, 4: 900.0}}, train={64: {1: 500.0, 4: 500.0}}
    )
    # gen and train both outrun the simulators at any split: the batch is the only choice left
    a = allocate(prof, Pool(4), sim_rate=200.0)
    assert a.gen_batch == 2 and a.throughput == 200.0
    with pytest.raises(AllocationError, match="positive"):
        allocate(prof, Pool(4), sim_rate=0.0)


def test_sim_rate_reads_the_profiled_worker():
    prof = RateTable(
        points=[RatePoint("sim", 1, 4, 90.0), RatePoint("sim", 1, 8, 100.0)],
        share_unit="threads",
    )
    assert sim_rate(prof, 2, batch=8) == 200.0
    assert sim_rate(prof, 3, batch=5) == 270.0  # the nearest profiled group size
    assert sim_rate(prof, 0) is None and sim_rate(LINEAR, 2) is None


def test_drift_monitor_levels_then_window():
    m = DriftMonitor(threshold=0.15, window=3)
    assert [m.update({"a": 100.0, "b": 50.0}) for _ in range(3)] == [False] * 3
    assert m.levels == {"a": 100.0, "b": 50.0}
    assert not m.update({"a": 110.0, "b": 50.0})  # 10%: no drift
    assert m.streak == 0
    fired = [m.update({"a": 100.0, "b": 30.0}) for _ in range(3)]
    assert fired == [False, False, True] and m.stage == "b" and m.last == pytest.approx(0.4)
    assert not m.update({"a": math.nan, "b": 30.0})  # a missing stage is skipped
    m.reset()
    assert m.levels == {} and m.streak == 0
    with pytest.raises(ValueError):
        DriftMonitor(threshold=1.0)


def _with_sim(prof: RateTable, per_worker: float, batch: int = 8) -> RateTable:
    return RateTable(points=[*prof.points, RatePoint("sim", 1, batch, per_worker)])


def test_a_slower_simulator_fires_and_frees_units_for_it():
    # two simulator workers at 400/s each: gen and train set the pace, the whole pool is used
    prof = _with_sim(LINEAR, 400.0)
    ea = ElasticAllocator(
        prof,
        Pool(8, shared_with_sim=True),
        DivergenceMonitor(0.15, 3),
        blend=1.0,
        sim_workers=2,
        sim_batch=8,
    )
    cur = ea.current
    assert (cur.gen_units, cur.train_units) == (3, 5) and cur.sim_throughput == 800.0
    g = predict(prof, "gen", cur.gen_units, cur.gen_batch)
    t = predict(prof, "train", cur.train_units, cur.train_batch)
    roll = min(g, t)  # the rollout keeps pace with training (bounded staleness)
    for _ in range(3):
        assert ea.observe(g, t, sim_throughput=roll) is None
    # the simulators slow to 120/s: the rollout falls below the generator's capacity
    rs = [ea.observe(g, t, step=10 + i, sim_throughput=120.0) for i in range(3)]
    r = rs[-1]
    assert rs[:2] == [None, None] and r is not None and r.changed
    assert "sim drifted more than 15%" in r.cause and r.measured_sim == 120.0
    # blend 1: the simulators now 120/s; gen and train need only 138/s each, the rest is theirs
    assert r.new.sim_throughput == pytest.approx(120.0) and r.new.bound == "sim"
    assert (r.new.gen_units, r.new.train_units, r.new.gen_batch) == (1, 2, 32)
    assert r.new.unused_units == 5


def test_a_divergence_that_keeps_the_split_keeps_the_drift_levels():
    ea = ElasticAllocator(LINEAR, Pool(2), DivergenceMonitor(0.15, window=2), blend=0.5)
    cur = ea.current  # a pool of 2: one split, so every search keeps it
    g = predict(LINEAR, "gen", cur.gen_units, cur.gen_batch)
    t = predict(LINEAR, "train", cur.train_units, cur.train_batch)
    # train runs at a third of its plan from the start: divergence fires, the split stays
    rs = [ea.observe(g, t / 3) for _ in range(2)]
    assert rs[-1] is not None and not rs[-1].changed and "diverged" in rs[-1].cause
    assert ea.drift.levels == {"gen": g, "train": t / 3}  # set in the same window, kept
    # a later slowdown of the generator still drifts from those levels
    rs = [ea.observe(g / 2, t / 3) for _ in range(2)]
    assert rs[-1] is not None and "gen drifted more than 15%" in rs[-1].cause
    assert ea.drift.levels == {}  # a drift: the new normal sets the levels again


# --- the shared-CPU model ---------------------------------------------------------------------
def test_shared_cpu_rate_by_hand():
    # sims 100/s per core (10 ms), gen 1 thread at 200/s (5 ms), train 2 threads at 200/s (10 ms)
    assert shared_cpu_rate(2, 100.0, 2, 1, 200.0, 2, 200.0) == pytest.approx(2 / 0.025)
    # one core: 40/s; the simulators alone could do 100/s on it
    assert shared_cpu_rate(1, 100.0, 2, 1, 200.0, 2, 200.0) == pytest.approx(40.0)
    # plenty of cores: capped by the simulators' workers (2 x 100/s), then by a stage's capacity
    assert shared_cpu_rate(64, 100.0, 2, 1, 200.0, 2, 200.0) == 200.0
    assert shared_cpu_rate(64, 100.0, 2, 1, 150.0, 2, 200.0) == 150.0
    assert shared_cpu_rate(2, 100.0, 2, 1, 0.0, 2, 200.0) == 0.0


@st.composite
def profiles_with_busy_cores(draw):
    """:func:`profiles`, each point's busy cores drawn too (some not measured)."""
    units, prof = draw(profiles())
    pts = [
        dataclasses.replace(
            p, busy_cores=draw(st.one_of(st.none(), st.floats(0.05, float(p.share))))
        )
        for p in prof.points
    ]
    return units, dataclasses.replace(prof, points=pts)


@settings(max_examples=100, deadline=None)
@given(
    profiles_with_busy_cores(),
    st.floats(1.0, 2000.0, allow_nan=False),
    st.integers(1, 8),
    st.integers(1, 8),
)
def test_shared_cpu_allocation_is_the_best_split_it_can_price(case, per_core, workers, cores):
    units, prof = case
    pool = Pool(units, shared_with_sim=True, cores=cores)
    rate = per_core * workers
    a = allocate(prof, pool, sim_rate=rate, sim_workers=workers)
    assert a.gen_units + a.train_units <= units and min(a.gen_units, a.train_units) >= 1
    per_core = rate / workers  # as allocate derives it (not always per_core to the last bit)
    best = 0.0
    for bg in prof.batch_sizes("gen"):
        gen = profile_curve(prof.curve("gen", bg))
        for bt in prof.batch_sizes("train"):
            train = profile_curve(prof.curve("train", bt))
            for g in range(1, units):
                for t in range(1, units - g + 1):
                    r = shared_cpu_rate(
                        cores,
                        per_core,
                        workers,
                        prof.busy("gen", g, bg),
                        gen(g),
                        prof.busy("train", t, bt),
                        train(t),
                    )
                    best = max(best, r)
    assert a.throughput == best
    # the brute-force reference takes the same path
    assert allocate_brute_force(prof, pool, sim_rate=rate, sim_workers=workers) == a


def test_shared_cpu_model_prices_the_cores_a_stage_keeps_busy():
    # sims 200/s per core (5 ms), gen 1 thread 500/s (2 ms); the learner is the slow stage:
    # 1 thread 100/s, 2 threads 150/s
    gen = RatePoint("gen", 1, 8, 500.0, busy_cores=1.0)
    t1 = RatePoint("train", 1, 96, 100.0, busy_cores=1.0)
    t2 = RatePoint("train", 2, 96, 150.0)
    pool = Pool(3, shared_with_sim=True, cores=2)
    # 2 learner threads counted as 2 busy cores: 2 / (5 + 2 + 13.3 ms) = 98.4/s < 100/s at 1
    a = allocate(RateTable([gen, t1, t2]), pool, sim_rate=400.0, sim_workers=2)
    assert (a.gen_units, a.train_units) == (1, 1) and a.throughput == pytest.approx(100.0)
    # measured: the 2 threads keep 1.1 cores busy (they sleep at synchronisation points), so
    # the second thread is worth its CPU: 2 / (5 + 2 + 7.3 ms) = 139.5/s
    t2 = dataclasses.replace(t2, busy_cores=1.1)
    a = allocate(RateTable([gen, t1, t2]), pool, sim_rate=400.0, sim_workers=2)
    assert (a.gen_units, a.train_units) == (1, 2)
    assert a.throughput == pytest.approx(2 / (1 / 200 + 1 / 500 + 1.1 / 150))


def test_shared_cpu_model_spares_threads_for_the_simulators():
    # gen 1 thread 250/s, 2 threads 300/s; train 1 thread 180/s, 3 threads 240/s (scaling poorly)
    prof = _profile(
        gen={8: {1: 250.0, 2: 300.0, 3: 320.0}}, train={96: {1: 180.0, 2: 240.0, 3: 240.0}}
    )
    pool = Pool(4, shared_with_sim=True, cores=2)
    a = allocate(prof, pool, sim_rate=460.0, sim_workers=2)
    # every extra thread costs the simulators more CPU than it gives its stage
    assert (a.gen_units, a.train_units) == (1, 1) and a.unused_units == 2
    want = 2 / (1 / 230 + 1 / 250 + 1 / 180)
    assert a.throughput == pytest.approx(want) and a.bound == "sim"
    # the same profile on a pool of its own (a GPU's SMs): the whole pool, Algorithm 1's split
    b = allocate(prof, Pool(4), sim_rate=460.0)
    assert b.gen_units + b.train_units == 4 and b.unused_units == 0
    with pytest.raises(AllocationError, match="cores"):
        Pool(4, shared_with_sim=True, cores=0)
