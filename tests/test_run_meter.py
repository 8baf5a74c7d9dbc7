"""ebrl.run: the arithmetic of a run's metrics, and metrics.jsonl, apart from train()'s loop."""

from __future__ import annotations

import pytest

from ebrl.run.metrics import MetricsFile, RunMeter
from ebrl.run.report import Summary
from ebrl.run.resume import Progress
from ebrl.schedulers.base import IterationReport
from ebrl.timeline import Timeline


def test_a_resumed_attempt_continues_the_counts_and_times_its_steady_state_after_the_warmup():
    summary = Summary(
        seed=0, commit="", machine="", scheduler="s", policy="p", simulator="x", algo="a"
    )
    prog = Progress(iterations=2, env_steps=100, wall_s=50.0, success_hist=[0.5])
    meter = RunMeter(summary, prog, warmup_iters=1, timeline=Timeline())
    t0 = meter.t_start  # the reports arrive 1 s and 2 s after this attempt started
    first = meter.update(IterationReport(2, 10, {"env/success_rate": 0.7}, {}, t0 + 1.0))
    assert (summary.iterations, summary.env_steps) == (3, 110)
    assert first["time/wall_s"] == pytest.approx(51.0)  # the earlier attempts' 50 s continue
    assert first["env/steps_total"] == 110
    assert first["throughput/env_steps_per_s"] == pytest.approx(10.0)  # this attempt's steps
    assert summary.time_to_80 is None
    meter.update(IterationReport(3, 30, {"env/success_rate": 0.9}, {}, t0 + 2.0))
    assert (summary.time_to_80, summary.steps_to_80) == (pytest.approx(52.0), 140)
    saved = meter.progress(prog)
    assert (saved.iterations, saved.env_steps, saved.success_hist) == (4, 140, [0.5, 0.7, 0.9])
    assert prog.iterations == 2  # where the attempt started stays as it was
    meter.finish()
    assert summary.wall_s == pytest.approx(52.0)
    assert summary.throughput_overall == pytest.approx(20.0)  # 40 env steps in 2 s
    assert summary.throughput_e2e == pytest.approx(30.0)  # after the warm-up: 30 in 1 s
    assert summary.success_rate == pytest.approx(0.9)  # the last tenth of the updates


def test_without_an_update_after_the_warmup_the_steady_throughput_is_the_overall_one():
    summary = Summary(
        seed=0, commit="", machine="", scheduler="s", policy="p", simulator="x", algo="a"
    )
    meter = RunMeter(summary, Progress(), warmup_iters=3, timeline=Timeline())
    meter.update(IterationReport(0, 8, {}, {}, meter.t_start + 2.0))
    meter.finish()
    assert summary.throughput_e2e == summary.throughput_overall == pytest.approx(4.0)
    assert summary.success_rate != summary.success_rate  # nan: no success reported


def test_the_metrics_file_keeps_every_attempts_rows_and_tables_them(tmp_path):
    f = MetricsFile(tmp_path / "metrics.jsonl")
    assert f.rows() == []
    f.append(0, {"a": 1.0})
    MetricsFile(f.path).append(1, {"b": 2.0})  # the next attempt appends to the same file
    assert f.rows() == [{"iteration": 0, "a": 1.0}, {"iteration": 1, "b": 2.0}]
    f.write_csv(tmp_path / "metrics.csv")
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "a,b,iteration",
        "1.0,,0",
        ",2.0,1",
    ]
