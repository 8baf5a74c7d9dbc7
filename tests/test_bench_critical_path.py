"""benchmarks/scheduler_throughput.py's critical path: how much of the steady window each side of
the pipeline ran, on made-up timelines (microseconds, as the engine's ``timeline.json``)."""

from __future__ import annotations

import math

import pytest

from benchmarks.scheduler_throughput import critical_path


def span(name: str, start_ms: float, end_ms: float) -> dict:
    return {"name": name, "ph": "X", "ts": start_ms * 1e3, "dur": (end_ms - start_ms) * 1e3}


def lock_step(updates: int, sim_ms: float, gen_ms: float, train_ms: float) -> list[dict]:
    """A rollout chain of sim (two env workers at once) then gen, 10 of each per update, back to
    back, beside a learner that trains for ``train_ms`` at the start of each update's window."""
    events, t = [], 0.0
    period = 10 * (sim_ms + gen_ms)
    for u in range(updates):
        start = u * period
        for i in range(10):
            t = start + i * (sim_ms + gen_ms)
            events += [span("sim", t, t + sim_ms), span("sim", t, t + sim_ms)]
            events.append(span("gen", t + sim_ms, t + sim_ms + gen_ms))
        events.append(span("train", start, start + train_ms))
    return events


def test_a_rollout_bound_run_shows_the_learners_idle_share():
    # each update: the chain runs 10 x (6 + 4) = 100 ms without a gap, the learner 70 ms of it
    got = critical_path(lock_step(8, sim_ms=6, gen_ms=4, train_ms=70), warmup=3)
    assert got["rollout_busy"] == pytest.approx(1.0, abs=0.02)
    assert got["learner_busy"] == pytest.approx(0.70, abs=0.02)
    assert got["both_busy"] == pytest.approx(0.70, abs=0.02)


def test_the_window_starts_where_the_metrics_steady_window_does():
    # slow warm-up updates must not count: updates 0-2 train 100 ms, the rest 40 ms
    events = [e for e in lock_step(8, sim_ms=6, gen_ms=4, train_ms=40) if e["name"] != "train"]
    events += [span("train", u * 100, u * 100 + (100 if u < 3 else 40)) for u in range(8)]
    # the window opens at the end of the 3rd train span (300 ms) and closes at 740 ms
    got = critical_path(events, warmup=3)
    assert got["learner_busy"] == pytest.approx(5 * 40 / 440, abs=0.01)


def test_gaps_in_the_chain_and_weight_loads_count_as_they_are():
    # the chain idles 2 ms of every 12 ms; a sync after each update and a load on the chain
    events, period = [], 120.0
    for u in range(6):
        for i in range(10):
            t = u * period + i * 12
            events += [span("sim", t, t + 6), span("gen", t + 6, t + 10)]
        events += [span("train", u * period, u * period + 50)]
        events += [span("sync", u * period + 50, u * period + 60)]
        events += [span("load", u * period + 10, u * period + 12)]  # fills one gap per update
    got = critical_path(events, warmup=2)
    # the window: 70 ms (end of update 2's train) .. 650 ms (end of the last train)
    assert got["rollout_busy"] == pytest.approx(1 - (2 / 12) * (1 - 1 / 10), abs=0.03)
    assert got["learner_busy"] == pytest.approx(0.5, abs=0.05)


def test_too_few_updates_give_nan():
    got = critical_path(lock_step(2, 6, 4, 70), warmup=3)
    assert all(math.isnan(v) for v in got.values())
