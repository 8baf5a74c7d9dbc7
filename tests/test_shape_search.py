"""The shape search: the schedule model plays the engine's rules, and chooses G and the step level
from stage costs (fake profiles here; a real run's in tests/test_ebrl_scheduler.py)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict

import numpy as np
import pytest

from ebrl.resources.model import (
    Shape,
    StageCosts,
    Workload,
    candidates,
    choose,
    pick,
    simulate,
    split_groups,
)
from ebrl.resources.shape import (
    Probes,
    ShapeChoice,
    gen_batches_for,
    measure,
    search,
    thread_options,
)

#: two env workers of 8 envs, segments of 8 decisions, k = 1, 2 cores, chunks of 4
WORK = Workload((tuple(range(8)), tuple(range(8, 16))), 8, 1, 2.0, 4)


def costs(
    mean: float = 0.008, tail: float = 1.0, busy: float = 1.0, gen_fixed: float = 0.004
) -> StageCosts:
    """Chunk latencies with the given mean; ``tail`` > 1: lognormal with a heavy tail."""
    rng = np.random.default_rng(0)
    if tail <= 1.0:
        lat = np.full(64, mean)
    else:
        lat = rng.lognormal(0.0, 1.0, 400)
        lat = lat / lat.mean() * mean
    return StageCosts(tuple(lat), busy, gen_fixed, 0.001, 1.0, 0.2, 1.0)  # learner: no bottleneck


# --- the rules the engine shares with the model -----------------------------------------------
def test_step_level_takes_the_first_m_ready_envs_in_arrival_order() -> None:
    ready = OrderedDict((e, 0.0) for e in (5, 3, 9, 1, 7))
    assert pick(ready, lambda e: True, [], True, 3, 1.0, now=0.0) == [5, 3, 9]


def test_step_level_skips_envs_the_staleness_gate_holds_back() -> None:
    ready = OrderedDict((e, 0.0) for e in (5, 3, 9, 1))
    assert pick(ready, lambda e: e != 3, [], True, 2, 1.0, now=0.0) == [5, 9]


def test_step_level_waits_for_m_then_takes_whoever_is_ready_at_the_timeout() -> None:
    ready = OrderedDict([(4, 10.0), (2, 10.002)])
    assert pick(ready, lambda e: True, [], True, 3, 0.005, now=10.004) == []
    assert pick(ready, lambda e: True, [], True, 3, 0.005, now=10.005) == [4, 2]


def test_a_cap_above_m_takes_the_envs_that_piled_up_in_one_call() -> None:
    ready = OrderedDict((e, 0.0) for e in (5, 3, 9, 1, 7))
    assert pick(ready, lambda e: True, [], True, 2, 1.0, now=0.0, batch_max=4) == [5, 3, 9, 1]
    assert pick(ready, lambda e: True, [], True, 2, 1.0, now=0.0, batch_max=None) == [5, 3]
    one = OrderedDict([(4, 10.0)])  # below M: the timeout still sends it alone
    assert pick(one, lambda e: True, [], True, 2, 0.005, now=10.006, batch_max=4) == [4]


def test_lock_step_takes_a_whole_group_only_in_group_order() -> None:
    groups = [[0, 1], [2, 3]]
    assert pick(
        OrderedDict([(0, 0.0), (2, 0.0), (3, 0.0)]), lambda e: True, groups, False, 1, 0.0, 0.0
    ) == [2, 3]
    assert pick(OrderedDict([(0, 0.0), (2, 0.0)]), lambda e: True, groups, False, 1, 0.0, 0.0) == []
    both = OrderedDict((e, 0.0) for e in range(4))
    assert pick(both, lambda e: True, groups, False, 1, 0.0, 0.0) == [0, 1]


def test_groups_take_a_share_of_every_worker() -> None:
    assert split_groups([[0, 1, 2, 3], [4, 5, 6, 7]], 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]


# --- the model ---------------------------------------------------------------------------------
def test_one_worker_lock_step_runs_at_the_sum_of_its_stages() -> None:
    # one worker, 1 env, k = 0: sim 10 ms, gen 5 ms per decision, train 40 ms per segment of 4
    # decisions, all in series: 4 * 15 + 40 = 100 ms per update of 4 env steps
    work = Workload(((0,),), 4, 0, 4.0, 1)
    c = StageCosts((0.01,), 1.0, 0.005, 0.0, 1.0, 0.04, 1.0, message_s=0.0)
    p = simulate(c, work, Shape(1, False, 1), updates=6, warmup=2)
    assert p.throughput == pytest.approx(4 / 0.1, rel=1e-6)


def test_overlap_hides_training_behind_the_rollout() -> None:
    work0 = Workload(((0,),), 4, 0, 4.0, 1)
    work1 = Workload(((0,),), 4, 1, 4.0, 1)
    c = StageCosts((0.01,), 1.0, 0.005, 0.0, 1.0, 0.04, 1.0, message_s=0.0)
    lock = simulate(c, work0, Shape(1, False, 1), updates=8, warmup=2).throughput
    over = simulate(c, work1, Shape(1, False, 1), updates=8, warmup=2).throughput
    # k = 1: the learner (40 ms) trains while the rollout (60 ms) runs: 60 ms per update
    assert over == pytest.approx(4 / 0.06, rel=0.02)
    assert lock == pytest.approx(4 / 0.1, rel=1e-6)


def test_cores_are_shared_when_the_jobs_ask_for_more() -> None:
    c = costs()
    fast = simulate(c, WORK, Shape(1, False, 16)).throughput
    half = simulate(c, dataclasses.replace(WORK, cores=1.0), Shape(1, False, 16)).throughput
    assert half < 0.8 * fast


def test_step_level_batches_never_exceed_m() -> None:
    p = simulate(costs(tail=3.0, busy=0.02), WORK, Shape(1, True, 4))
    assert 1.0 <= p.mean_batch <= 4.0


def test_a_cap_pays_where_a_generator_call_costs_more_than_its_envs() -> None:
    # the generator's fixed cost per call (30 ms) dwarfs an env's (1 ms): envs pile up while it
    # works, and taking them in one call pays the fixed cost once
    c = costs(tail=3.0, busy=0.02, gen_fixed=0.03)
    strict = simulate(c, WORK, Shape(1, True, 4))
    capped = simulate(c, WORK, Shape(1, True, 4, batch_max=16))
    assert capped.mean_batch > 1.5 * strict.mean_batch
    assert capped.throughput > 1.2 * strict.throughput


# --- the search ------------------------------------------------------------------------------
def test_search_keeps_one_group_in_lock_step_where_the_simulators_keep_the_cores_busy() -> None:
    # CPU physics on 2 cores, uniform step costs, a generator with a real per-call cost:
    # pipelining and the step level only add generator calls
    shape, ranked = choose(costs(busy=1.0, gen_fixed=0.04), WORK, candidates(WORK))
    assert shape == Shape(1, False, 16)
    assert ranked[0].shape == shape


def test_search_takes_the_step_level_where_simulators_wait_with_a_tail() -> None:
    shape, ranked = choose(costs(tail=3.0, busy=0.02), WORK, candidates(WORK))
    assert shape.step_level
    one_group = next(p for p in ranked if p.shape == Shape(1, False, 16))
    chosen = next(p for p in ranked if p.shape == shape)
    assert chosen.throughput > 1.2 * one_group.throughput


def test_search_pipelines_where_simulators_wait_without_a_tail() -> None:
    shape, _ = choose(costs(busy=0.02), WORK, candidates(WORK, step_level=(False,)))
    assert shape.groups > 1 and not shape.step_level


def test_a_pinned_knob_is_not_searched() -> None:
    c = costs(tail=3.0, busy=0.02)
    assert not search(c, WORK, None, False, None, 0.005).shape.step_level
    assert search(c, WORK, [2], False, None, 0.005).shape == Shape(2, False, 8, 0.005)
    assert search(c, WORK, None, True, 3, 0.005).shape.batch_min == 3


def test_a_simpler_shape_within_the_margin_wins() -> None:
    # identical predictions (no tail, no cost to a call): the first, simplest candidate
    c = StageCosts((0.001,), 0.0, 0.0, 0.0, 0.0, 0.001, 0.0, message_s=0.0)
    shape, _ = choose(c, WORK, candidates(WORK))
    assert shape == candidates(WORK)[0]


def test_gen_batches_cover_every_candidate() -> None:
    sizes = gen_batches_for(WORK)
    for s in candidates(WORK):
        assert s.batch_min in sizes and s.cap in sizes


def test_candidates_weigh_the_first_m_of_n_and_a_cap_at_every_env() -> None:
    step = [s for s in candidates(WORK) if s.step_level]
    assert {(s.batch_min, s.cap) for s in step} == {(8, 8), (8, 16), (4, 4), (4, 16), (2, 2),
                                                    (2, 16)}  # fmt: skip
    pinned = candidates(WORK, step_level=(True,), batch_min=4, batch_max=4)
    assert [(s.batch_min, s.cap) for s in pinned] == [(4, 4)]


# --- measuring ---------------------------------------------------------------------------------
def test_measure_fits_the_generator_and_reads_how_busy_a_stage_keeps_the_cpu() -> None:
    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    probes = Probes(
        sim_envs=2,
        step_one=lambda i: time.sleep(0.004),  # a waiting simulator: little CPU
        gen_call=lambda b: spin(0.002 + 0.0005 * b),
        train_update=lambda: spin(0.01),
    )
    table, took = measure(probes, [1, 4, 8], sim_rounds=3, gen_repeats=3)
    assert list(table) == [(1, 1)]  # the threads of neither stage searched
    c = table[1, 1]
    assert len(c.sim_chunk_s) >= 6 and len(c.sim_chunk_s) % 2 == 0  # whole rounds
    assert c.sim_busy < 0.5
    assert c.gen_busy > 0.5
    assert c.gen_per_env_s == pytest.approx(0.0005, rel=0.5)
    assert c.gen_fixed_s == pytest.approx(0.002, abs=0.0015)
    assert c.train_s == pytest.approx(0.01, rel=0.5)
    assert took > 0


def test_measure_times_each_stage_at_every_thread_count_it_may_get() -> None:
    """The generator and the learner run on the threads ``measure`` sets before each call;
    every (gen, train) split of the counts gets a cost set, fewest threads first."""
    import torch

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    seen: set[tuple[str, int]] = set()

    def gen(b: int) -> None:
        seen.add(("gen", torch.get_num_threads()))
        spin(0.004 / torch.get_num_threads())

    def train() -> None:
        seen.add(("train", torch.get_num_threads()))
        spin(0.02 / torch.get_num_threads())  # a learner that scales perfectly (fake)

    before = torch.get_num_threads()
    probes = Probes(2, lambda i: time.sleep(0.001), gen, train)
    table, _ = measure(probes, [1, 2], gen_threads=(1, 2), train_threads=(1, 2))
    assert list(table) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert seen == {("gen", 1), ("gen", 2), ("train", 1), ("train", 2)}
    assert table[1, 2].train_s == pytest.approx(table[1, 1].train_s / 2, rel=0.3)
    assert table[2, 1].gen_fixed_s == pytest.approx(table[1, 1].gen_fixed_s / 2, rel=0.4)
    assert table[1, 1].sim_chunk_s == table[2, 2].sim_chunk_s  # the simulator timed once
    assert torch.get_num_threads() == before  # restored


def test_thread_options_are_powers_of_two_up_to_the_bound() -> None:
    assert thread_options(1) == (1,)
    assert thread_options(2) == (1, 2)
    assert thread_options(6) == (1, 2, 4, 6)


def test_the_search_gives_a_thread_only_where_it_pays() -> None:
    """The learner paces the run (a 1.2 s update against a 0.5 s rollout of waiting
    simulators). A second thread that halves the update is taken; one that only keeps a second
    core busy is not (fewer threads are the simpler shape)."""
    base = dataclasses.replace(costs(busy=0.02), train_s=1.2)
    scales = {(1, 1): base, (1, 2): dataclasses.replace(base, train_s=0.6, train_busy=2.0)}
    flat = {(1, 1): base, (1, 2): dataclasses.replace(base, train_busy=2.0)}
    assert search(scales, WORK, None, None, None, 0.005).shape.threads == (1, 2)
    choice = search(flat, WORK, None, None, None, 0.005)
    assert choice.shape.threads == (1, 1)
    assert {s.threads for s in choice.shapes} == {(1, 1), (1, 2)}
    assert choice.chosen_costs() is base
    assert set(choice.to_dict()["costs_by_threads"]) == {"1+1", "1+2"}
    assert choice.params()["shape/train_threads"] == 1


def test_a_search_at_one_split_leaves_the_threads_to_the_run() -> None:
    choice = search({(1, 2): costs()}, WORK, None, None, None, 0.005)
    assert choice.shape.threads is None and all(s.threads is None for s in choice.shapes)
    assert "costs_by_threads" not in choice.to_dict()


def test_measure_releases_the_probes_even_when_a_stage_fails() -> None:
    closed = threading.Event()

    def boom(_: int) -> None:
        raise RuntimeError("simulator crashed")

    probes = Probes(1, boom, lambda b: None, lambda: None, close=closed.set)
    with pytest.raises(RuntimeError, match="simulator crashed"):
        measure(probes, [1])
    assert closed.is_set()


def test_the_generator_picks_with_the_plans_cap() -> None:
    """GenWorker._pick is the model's rule with the run's M and cap (no stage, no sockets)."""
    from types import SimpleNamespace

    from ebrl.schedulers.ebrl.gen_worker import GenWorker
    from ebrl.schedulers.ebrl.messages import Reshape

    gen = GenWorker.__new__(GenWorker)
    gen.plan = SimpleNamespace(
        batch_timeout_s=1.0, start_version=0, decisions_per_env=8, staleness=1
    )
    gen.stage = SimpleNamespace(version=0)
    gen.served, gen.gone = set(range(8)), set()
    gen._owner = dict.fromkeys(range(8), 0)
    gen._reshape(Reshape([list(range(8))], True, 2, 4))
    ready = OrderedDict((e, 0.0) for e in (6, 1, 4, 0, 3))
    decisions = np.zeros(8, dtype=np.int64)
    assert gen._pick(ready, decisions) == [6, 1, 4, 0]
    gen._reshape(Reshape([list(range(8))], True, 2, None))  # the first M of N
    assert gen._pick(ready, decisions) == [6, 1]
    gen._reshape(Reshape([[0, 1, 3], [4, 6]], False, 2, None))  # lock step: a whole group
    assert gen._pick(ready, decisions) == [0, 1, 3]


# --- in the run: the model refit to what the run measured ------------------------------------
def test_fit_cores_finds_the_capacity_that_explains_a_measured_rate() -> None:
    from ebrl.resources.model import fit_cores

    c = costs(gen_fixed=0.02)
    shape = Shape(2, False, 8)
    at_1_3 = np.mean([simulate(c, dataclasses.replace(WORK, cores=1.3), shape, seed=s).throughput
                      for s in (0, 1)])  # fmt: skip
    assert fit_cores(c, WORK, shape, float(at_1_3)) == pytest.approx(1.3, abs=0.02)
    full = simulate(c, WORK, shape).throughput
    assert fit_cores(c, WORK, shape, 10 * full) == WORK.cores  # faster than the model can be


def test_the_shortlist_holds_the_choice_one_group_in_lock_step_and_the_close_ones() -> None:
    """Simulators waiting with a tail: the model's choice runs first, then the simplest
    candidate (the Async schedule) whatever the model predicts for it, so a schedule the search
    contains is always measured, then the shapes predicted within 10% of the best."""
    from ebrl.resources.shape import shortlist

    choice = search(costs(tail=3.0, busy=0.05), WORK, None, None, None, 0.005)
    short = shortlist(choice)
    assert short[0] == choice.shape != Shape(1, False, 16, 0.005)
    assert short[1] == Shape(1, False, 16, 0.005)
    assert 2 <= len(short) <= 3 and len(set(short)) == len(short)
    best = choice.ranked[0].throughput
    by = {p.shape: p.throughput for p in choice.ranked}
    assert all(by[s] >= 0.9 * best for s in short[2:])
    assert shortlist(choice, most=1) == (choice.shape,)
    # where the choice is the simplest shape, it is not measured twice
    lock = search(costs(busy=1.0, gen_fixed=0.05), WORK, None, None, None, 0.005)
    assert lock.shape == Shape(1, False, 16, 0.005)
    assert shortlist(lock).count(lock.shape) == 1


def _choice_at(rates: dict[Shape, float]) -> ShapeChoice:
    """A search's result with the given predictions (shapes simplest first, as given), the
    model's choice the best of them."""
    from ebrl.resources.model import Prediction

    preds = [
        Prediction(s, r, 1.0, 1.0, 8.0, 0.0, 1.0, (1.0,), {}, {})
        for s, r in sorted(rates.items(), key=lambda x: -x[1])
    ]
    return ShapeChoice(preds[0].shape, tuple(preds), costs(), 0.0, 0.0, WORK, tuple(rates))


def test_a_run_that_measures_one_shape_starts_with_the_simplest_the_model_cannot_tell_apart():
    """Seed 2 of 2026-12-04's make run: 1 + 2 threads predicted 3% above Async's 1 + 1, and a
    10-update run measures one shape only. Inside the model's 10% band the simplest shape runs;
    a gain beyond it keeps the search's choice, and the simplest within the band is the first
    in the search's order (fewest threads, then fewest groups, lock step)."""
    lock11, lock12 = Shape(1, False, 16, threads=(1, 1)), Shape(1, False, 16, threads=(1, 2))
    pipe11 = Shape(2, False, 8, threads=(1, 1))
    close = _choice_at({lock11: 460.0, lock12: 474.0, pipe11: 300.0})
    assert close.shape == lock12
    settled = close.unmeasured()
    assert settled.shape == lock11 and settled.searched == lock12
    assert settled.to_dict()["searched"] == lock12.to_dict()
    assert settled.predicted() == 460.0  # its prediction is the one the run starts from
    far = _choice_at({lock11: 400.0, lock12: 474.0, pipe11: 300.0})  # 16% apart
    assert far.unmeasured() is far
    middle = _choice_at({lock11: 400.0, lock12: 440.0, pipe11: 474.0})
    assert middle.unmeasured().shape == lock12
    simplest = _choice_at({lock11: 474.0, lock12: 470.0})
    assert simplest.unmeasured() is simplest and "searched" not in simplest.to_dict()


def test_the_run_starts_with_the_simplest_close_shape_only_when_it_measures_one(tmp_path):
    """The scheduler's side: a 10-update run (one shape measured) starts with the simplest
    shape within the band, and says so in shape.json; a 40-update run starts with the model's
    choice and measures the simplest beside it; trials off count as one shape measured."""
    import json

    from ebrl.schedulers.ebrl.control import start_trials

    lock11, lock12 = Shape(1, False, 16, threads=(1, 1)), Shape(1, False, 16, threads=(1, 2))
    choice = _choice_at({lock11: 460.0, lock12: 474.0})
    short_run = {"budget": {"iterations": 10}}
    shape, kept, trials = start_trials(choice, short_run, 3, tmp_path)
    assert shape == kept.shape == lock11 and trials is not None
    saved = json.loads((tmp_path / "shape.json").read_text())
    assert saved["shape"] == lock11.to_dict() and saved["searched"] == lock12.to_dict()
    assert [t.shape for t in trials.trials] == [lock11]
    shape, kept, trials = start_trials(choice, {"budget": {"iterations": 40}}, 3, None)
    assert shape == lock12 and kept is choice
    assert trials is not None and [t.shape for t in trials.trials][:2] == [lock12, lock11]
    # scheduler.reshape_window=0: trials off
    assert start_trials(choice, short_run, 0, None)[:2] == (lock11, choice.unmeasured())
    assert start_trials(choice, short_run, 0, None)[2] is None


def test_trials_measure_each_shape_in_turn_and_keep_the_fastest() -> None:
    """After one start-up update, each shape runs ``updates`` updates, timed from the reports'
    arrival; the run moves to the next, and at the end to the fastest (here the second)."""
    from ebrl.resources.shape import ShapeTrials

    a, b, c = Shape(1, False, 16), Shape(2, False, 8), Shape(1, True, 8)
    t = ShapeTrials((a, b, c), skip=1, updates=2, settle=0)
    moves = []
    # start-up at t=1; a: 2 updates of 100 steps in 2 s; b: in 1 s; c: in 4 s
    for at in (1.0, 2.0, 3.0, 3.5, 4.0, 6.0, 8.0, 9.0, 10.0):
        moves.append(t.add(at, 100))
    assert moves == [None, None, b, None, c, None, b, None, None]
    assert t.done and t.winner is not None and t.winner.shape == b
    assert [x.rate for x in t.trials] == pytest.approx([100.0, 200.0, 50.0])
    assert t.seconds == pytest.approx(7.0)
    # the last shape measured is the fastest: no move at the end
    t2 = ShapeTrials((a, b), skip=1, updates=1, settle=0)
    assert [t2.add(at, 100) for at in (0.0, 2.0, 2.5, 3.0)] == [None, b, None, None]
    assert t2.winner.shape == b


def test_the_update_after_a_move_is_not_measured() -> None:
    """With overlap the first report interval after a move still holds the old shape's
    decisions: it settles, unmeasured (here it is fast, and would have made b the winner)."""
    from ebrl.resources.shape import ShapeTrials

    a, b = Shape(1, False, 16), Shape(2, False, 8)
    t = ShapeTrials((a, b), skip=1, updates=1, settle=1)
    assert [t.add(at, 100) for at in (0.0, 1.0, 1.1, 3.1)] == [None, b, None, a]
    assert [x.rate for x in t.trials] == pytest.approx([100.0, 50.0])
    assert t.winner.shape == a and t.seconds == pytest.approx(3.1)


def test_recalibration_keeps_the_fastest_measured_shape_and_refits_the_model_to_it() -> None:
    """Simulators busy on 2 cores with a cheap generator: pipelining wins on paper; a run whose
    cores are really ~1 measures one group faster, keeps it, and the refit model finds the
    capacity (~1 core) that explains that rate."""
    from ebrl.resources.shape import Trial, recalibrate, rerank

    c = costs(busy=1.0, gen_fixed=0.01)
    choice = search(c, WORK, None, False, None, 0.005)
    assert choice.shape == Shape(2, False, 8, 0.005)  # on paper: two groups pay
    one = dataclasses.replace(WORK, cores=1.0)
    lock = Shape(1, False, 16, 0.005)
    rates = {s: simulate(c, one, s).throughput for s in (choice.shape, lock)}
    assert rates[lock] > rates[choice.shape]
    trials = [Trial(s, 1, 10.0, int(rates[s] * 10)) for s in (choice.shape, lock)]
    rec = recalibrate(choice, trials, 20.0)
    assert rec.after == lock and rec.changed and rec.measured == pytest.approx(rates[lock], 0.01)
    assert rec.cores == pytest.approx(1.0, abs=0.05)
    m = rec.metrics()
    assert m["shape/reshaped"] == 1.0 and m["shape/trials"] == 2.0 and m["shape/trial_s"] == 20.0
    assert m["shape/final_env_groups"] == 1.0 and m["shape/final_step_level"] == 0.0
    assert [t["env_groups"] for t in rec.to_dict()["trials"]] == [2, 1]
    kept = recalibrate(choice, [Trial(choice.shape, 1, 1.0, 999), Trial(lock, 1, 1.0, 10)])
    assert not kept.changed
    # in the run the refit model predicts the measured shapes only; every candidate at the end
    assert {p.shape for p in rec.ranked} == {choice.shape, lock} and rec.rerank_s is None
    done = rerank(dataclasses.replace(choice, recalibration=rec)).recalibration
    assert done is not None and done.rerank_s is not None
    assert {p.shape for p in done.ranked} == set(choice.shapes)
    again = {p.shape: p.throughput for p in done.ranked}
    assert all(again[p.shape] == pytest.approx(p.throughput) for p in rec.ranked)
    assert len(done.to_dict()["predictions"]) == len(choice.shapes)
    with pytest.raises(ValueError, match="no shape was measured"):
        recalibrate(choice, [Trial(lock)])


def test_trials_take_at_most_a_quarter_of_the_run() -> None:
    """(shapes measured, updates each): a 10-update CPU run measures only the shape it starts
    with; longer runs measure more shapes, each shape after the first with an update to settle."""
    from ebrl.resources.allotment import trial_plan

    assert trial_plan(3, {"budget": {"iterations": 10}}, 3) == (1, 2)
    assert trial_plan(3, {"budget": {"iterations": 16}}, 3) == (2, 1)  # 2 + 1 settle <= 4
    assert trial_plan(3, {"budget": {"iterations": 40}}, 3) == (3, 2)  # 3 x 2 + 2 <= 10
    assert trial_plan(3, {"budget": {"iterations": 100}}, 3) == (3, 3)
    assert trial_plan(3, {"budget": {"iterations": 100}}, 1) == (1, 3)
    # an env-step budget: 200k steps of 16 envs x 50 steps = 250 updates
    cfg = {"budget": {"env_steps": 200_000}, "num_envs": 16, "rollout_steps": 50}
    assert trial_plan(5, cfg, 3) == (3, 5)


def test_trials_fit_a_minutes_budget_through_the_predicted_update_time() -> None:
    """A run bounded by wall-clock minutes sizes its trials by the updates the search predicts
    it will make: 2 minutes at 3 s an update is 40 updates (three shapes, 2 updates each); at
    12 s an update, 10 updates (the first shape only). Without a prediction the minutes say
    nothing about updates; the count of another budget that ends the run first wins."""
    from ebrl.resources.allotment import run_updates, trial_plan

    cfg = {"budget": {"minutes": 2.0}}
    assert run_updates(cfg, update_s=3.0) == 40
    assert trial_plan(3, cfg, 3, update_s=3.0) == (3, 2)
    assert trial_plan(3, cfg, 3, update_s=12.0) == (1, 2)
    assert run_updates(cfg) == 200  # no prediction: the default
    assert run_updates({"budget": {"minutes": 2.0, "iterations": 10}}, update_s=1.0) == 10
    assert run_updates({"budget": {"minutes": 0.01}}, update_s=60.0) == 1  # at least one
