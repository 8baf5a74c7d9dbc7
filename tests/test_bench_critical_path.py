"""benchmarks/scheduler_throughput.py's critical path (how much of the steady window each side of
the pipeline ran), where the cores went, and the order the runs are made in, on made-up timelines
(microseconds, as the engine's ``timeline.json``) and made-up ``utilisation.csv`` samples."""

from __future__ import annotations

import math

import pytest

from benchmarks.scheduler_throughput import core_shares, critical_path, run_order


def span(name: str, start_ms: float, end_ms: float, cpu_s: float | None = None) -> dict:
    e = {"name": name, "ph": "X", "ts": start_ms * 1e3, "dur": (end_ms - start_ms) * 1e3}
    if cpu_s is not None:
        e["args"] = {"cpu": cpu_s}
    return e


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


def samples(until_ms: float, every_ms: float, busy_pct: tuple[float, ...]) -> list[dict]:
    """utilisation.csv rows: one per core per sample, ``t_s`` at the end of each interval."""
    rows, t = [], every_ms
    while t <= until_ms:
        rows += [
            {"t_s": str(t / 1e3), "device": "cpu", "index": str(i), "util_pct": str(b)}
            for i, b in enumerate(busy_pct)
        ]
        t += every_ms
    rows.append({"t_s": "0.5", "device": "gpu", "index": "0", "util_pct": "0"})  # not a core
    return rows


def test_core_shares_split_the_window_into_stage_cpu_other_cpu_and_idle():
    # 2 cores; each 100 ms update: a 100 ms train span that used 80 ms of CPU (contended) and a
    # 100 ms sim span that used 60 ms; the cores were 95% and 75% busy in every sample
    events = []
    for u in range(8):
        events += [span("train", u * 100, u * 100 + 100, cpu_s=0.08)]
        events += [span("sim", u * 100, u * 100 + 100, cpu_s=0.06)]
    got = core_shares(events, samples(800, 20, (95.0, 75.0)), warmup=3)
    assert got["stage_share"] == pytest.approx(0.14 / 0.2)  # 140 ms of CPU per 200 core-ms
    assert got["idle_share"] == pytest.approx(0.15)
    assert got["other_share"] == pytest.approx(1 - 0.70 - 0.15)


def test_core_shares_count_a_span_only_for_its_part_inside_the_window():
    # the window is 300..700 ms; a sim span 250..350 ms (100 ms of CPU) counts half
    events = [span("train", u * 100, u * 100 + 100) for u in range(7)]
    events.append(span("sim", 250, 350, cpu_s=0.1))
    got = core_shares(events, samples(700, 50, (100.0,)), warmup=3)
    assert got["stage_share"] == pytest.approx(0.05 / 0.4)
    assert got["idle_share"] == pytest.approx(0.0)


def test_core_shares_without_samples_or_updates_give_nan():
    events = [span("train", u * 100, u * 100 + 100, cpu_s=0.1) for u in range(6)]
    assert all(math.isnan(v) for v in core_shares(events, [], warmup=3).values())
    few = core_shares(events[:2], samples(600, 50, (50.0,)), warmup=3)
    assert all(math.isnan(v) for v in few.values())


def test_every_other_seed_runs_the_configurations_in_reverse():
    order = run_order([0, 1, 2], ["async", "ebrl"])
    assert order == [
        (0, "async"),
        (0, "ebrl"),
        (1, "ebrl"),
        (1, "async"),
        (2, "async"),
        (2, "ebrl"),
    ]
    # over an even number of seeds each configuration runs first as often as second
    firsts = [n for i, (_, n) in enumerate(run_order([0, 1, 2, 3], ["a", "b", "c"])) if i % 3 == 0]
    assert sorted(firsts) == ["a", "a", "c", "c"]
