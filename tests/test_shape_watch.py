"""The shape at run time (``ebrl.resources.watch``): a stage that drifts has the whole shape
searched again on its scaled costs, and the run moves where another shape wins; noise does not
move it, and a shape the run measured slower is not taken on the model's word. Fake costs and
fake reports here; a real run in ``test_a_heavier_learner_in_a_real_run_fires_the_watch``."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest

from ebrl.resources.allotment import ResourceSettings, initial_resources
from ebrl.resources.controller import RunController
from ebrl.resources.meters import SIM_SECONDS, SIM_STEPS, SimMeter
from ebrl.resources.shape import search
from ebrl.resources.topology import fake_topology
from ebrl.resources.watch import ShapeWatch, scaled_costs

from .test_shape_search import WORK, costs

TOPO = fake_topology(numa_nodes=1, cores_per_node=4, gpus=0)


@functools.cache
def learner_choice():
    """A run whose learner is cheap at start (1 + 1 threads chosen: the second learner thread
    gains nothing), and whose second thread halves the update (it pays once the learner paces
    the run)."""
    base = dataclasses.replace(costs(busy=0.02), train_s=0.2)
    table = {(1, 1): base, (1, 2): dataclasses.replace(base, train_s=0.1, train_busy=2.0)}
    choice = search(table, WORK, None, None, None, 0.005)
    assert choice.shape.threads == (1, 1)
    return choice


STEADY = {"sim": 1000.0, "gen": 500.0, "train": 100.0}


def test_scaled_costs_scale_each_drifted_stage_alone() -> None:
    c = costs(mean=0.01)
    s = scaled_costs(c, {"train": 3.0, "sim": 0.5})
    assert s.train_s == pytest.approx(3 * c.train_s)
    assert s.sim_mean_s == pytest.approx(0.5 * c.sim_mean_s)
    assert (s.gen_fixed_s, s.gen_per_env_s) == (c.gen_fixed_s, c.gen_per_env_s)
    with pytest.raises(ValueError, match="the gen factor"):
        scaled_costs(c, {"gen": 0.0})


def test_a_learner_that_slows_moves_the_run_to_the_thread_that_pays() -> None:
    """Levels over 2 updates, then the learner 6x slower for 2: the watch fires, scales the
    update's cost by 6 and moves the run to the learner's second thread."""
    watch = ShapeWatch(learner_choice(), threshold=0.15, patience=2, settle=0)
    for i in range(2):
        assert watch.observe(STEADY, i) is None
    slow = {**STEADY, "train": 100.0 / 6}
    assert watch.observe(slow, 2) is None  # one drifting update: not yet
    move = watch.observe(slow, 3)
    assert move is not None and move.changed and move.step == 3
    assert move.new.threads == (1, 2) and move.new.groups == move.old.groups
    assert move.factors == {"train": pytest.approx(6.0)}
    assert move.predicted_new > 1.1 * move.predicted_old
    assert "train 100/s -> 16.67/s" in move.cause
    assert watch.shape == move.new  # the levels are set again under the new shape
    assert watch.monitor.levels == {}
    row = move.to_dict()
    assert row["kind"] == "shape" and row["new"]["train_threads"] == 2


def test_noise_within_the_threshold_never_moves_the_run() -> None:
    watch = ShapeWatch(learner_choice(), threshold=0.15, patience=2, settle=0)
    rng = np.random.default_rng(0)
    for i in range(60):
        jitter = {k: v * rng.uniform(0.9, 1.1) for k, v in STEADY.items()}
        assert watch.observe(jitter, i) is None
    assert watch.moves == []


def test_a_streak_of_faster_and_slower_updates_is_noise_not_a_drift() -> None:
    """Each update 60% off the learner's level, one faster, one slower: no stage moved on
    average, so nothing fires and the levels stay; a slowdown after it still fires (seen in a
    tiny real run: a firing on such a streak set the levels anew inside the slowdown)."""
    watch = ShapeWatch(learner_choice(), threshold=0.5, patience=2, settle=0)
    for i in range(2):
        watch.observe(STEADY, i)
    fast, slow = {**STEADY, "train": 160.0}, {**STEADY, "train": 40.0}
    assert watch.observe(fast, 2) is None
    assert watch.observe(slow, 3) is None  # the streak is complete, the mean is 100/s
    assert watch.moves == [] and watch.monitor.levels["train"] == pytest.approx(100.0)
    much_slower = {**STEADY, "train": 100.0 / 6}
    assert watch.observe(much_slower, 4) is None
    move = watch.observe(much_slower, 5)
    assert move is not None and move.factors == {"train": pytest.approx(6.0)}


def test_a_drift_that_changes_no_ranking_keeps_the_shape() -> None:
    """Every stage 30% slower: the same shape wins on the scaled costs; the firing is
    recorded, the shape kept."""
    watch = ShapeWatch(learner_choice(), threshold=0.15, patience=2, settle=0)
    for i in range(2):
        watch.observe(STEADY, i)
    slow = {k: v / 1.3 for k, v in STEADY.items()}
    assert watch.observe(slow, 2) is None
    move = watch.observe(slow, 3)
    assert move is not None and not move.changed and move.new == move.old
    assert set(move.factors) == {"sim", "gen", "train"}


def test_a_shape_the_run_measured_slower_is_not_taken_on_the_models_word() -> None:
    """The trials measured the 2-thread learner at a third of the model's rate: the same
    slowdown that moves an uncorrected run keeps this one."""
    choice = learner_choice()
    watch = ShapeWatch(choice, threshold=0.15, patience=2, settle=0)
    two = [s for s in choice.shapes if s.threads == (1, 2)]
    watch.restart(choice.shape, corrections={choice.shape: 1.0, **dict.fromkeys(two, 1 / 3)})
    for i in range(2):
        watch.observe(STEADY, i)
    watch.observe({**STEADY, "train": 100.0 / 6}, 2)
    move = watch.observe({**STEADY, "train": 100.0 / 6}, 3)
    assert move is not None and not move.changed


def test_the_watch_waits_for_the_update_after_a_move_to_settle() -> None:
    watch = ShapeWatch(learner_choice(), threshold=0.15, patience=1, settle=1)
    assert watch.observe({**STEADY, "train": 1.0}, 0) is None  # settling: not fed
    assert watch.observe(STEADY, 1) is None  # the level
    assert watch.monitor.levels["train"] == 100.0


def test_the_sim_meter_reads_the_env_workers_rate_between_reports() -> None:
    m = SimMeter()
    assert m.update({SIM_STEPS: 100.0, SIM_SECONDS: 1.0}) is None
    assert m.update({SIM_STEPS: 300.0, SIM_SECONDS: 2.0}) == pytest.approx(200.0)
    assert m.update({SIM_STEPS: 10.0, SIM_SECONDS: 0.1}) is None  # a replaced worker
    assert m.update({}) is None


def test_the_manager_moves_the_shape_once_the_trials_are_over_and_logs_the_move(
    tmp_path, monkeypatch
) -> None:
    """The run-time manager feeds the watch each report's rates (the sim's from the env
    workers' gauges, the generator's from its counters, the learner's from its report); the
    move goes to the workers, and ``reallocations.jsonl`` records it with the time until the
    next report."""
    choice = learner_choice()
    res = initial_resources(ResourceSettings(), TOPO, 2, None, max_gen_batch=8)
    watch = ShapeWatch(choice, threshold=0.15, patience=2, settle=0)
    m = RunController(res, 16, warmup=1, out_dir=tmp_path, choice=choice, watch=watch)
    sent = []
    m.connect(send_shape=sent.append)
    monkeypatch.setattr(m, "_rates", lambda: (400.0, 500.0))
    train = [100.0, 100.0, 100.0, 100.0 / 6, 100.0 / 6, 100.0 / 6]
    outs = []
    for i, t in enumerate(train):
        metrics = {
            "resource/train_per_s_update": t,
            SIM_STEPS: 100.0 * (i + 1),
            SIM_SECONDS: 0.1 * (i + 1),
        }
        outs.append(m.report(i, 100, metrics, at=float(i)))
    assert [s.threads for s in sent] == [(1, 2)]
    assert outs[4]["shape/moves"] == 1.0 and outs[4]["shape/drift"] > 0.15
    assert outs[2]["resource/sim_steps_per_s_update"] == pytest.approx(1000.0)
    rows = [json.loads(x) for x in (tmp_path / "reallocations.jsonl").open()]
    assert len(rows) == 1 and rows[0]["kind"] == "shape" and rows[0]["changed"]
    assert rows[0]["applied"] and rows[0]["apply_latency_s"] == pytest.approx(1.0)
    assert rows[0]["step"] == 4


def test_the_watch_and_algorithm_1_do_not_both_move_a_run() -> None:
    from ebrl.resources.controller import elastic_allocator

    from .test_allocator_manager import fake_profile

    choice = learner_choice()
    s = ResourceSettings(allocator="elastic", gen_threads=1, train_threads=2, rebalance_patience=2)
    prof = fake_profile()
    res = initial_resources(s, TOPO, 2, prof, max_gen_batch=2)
    with pytest.raises(ValueError, match="would both move"):
        RunController(
            res, 4, elastic=elastic_allocator(prof, res, s, 2), choice=choice,
            watch=ShapeWatch(choice),
        )  # fmt: skip
