"""A run's clocks and counts: each update's metrics from its report, the summary's figures at the
end, the budget, and ``metrics.jsonl`` (one row per logged update, every attempt's)."""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ebrl.run.resume import Progress
from ebrl.schedulers.base import IterationReport
from ebrl.timeline import Timeline

if TYPE_CHECKING:
    from ebrl.config import RunConfig
    from ebrl.run.report import Summary


def budget_spent(run: RunConfig, steps: int, seconds: float, iters: int) -> bool:
    """Whether ``steps`` env steps, ``seconds`` of wall-clock or ``iters`` updates spend the
    run's ``budget``."""
    b = run.budget
    return (
        steps >= b.env_steps
        or (b.minutes is not None and seconds >= 60 * b.minutes)
        or (b.iterations is not None and iters >= b.iterations)
    )


class RunMeter:
    """Counts a run's updates into its :class:`~ebrl.run.report.Summary` as the reports arrive.

    Time is the reports' arrival (not when the loop was done with them, and not the shutdown
    after the last one); an attempt continues the counts and the wall-clock of the earlier ones
    (``prog``). Steady state starts after ``warmup_iters`` updates of this attempt.

    Args:
        summary: the run's summary; its counts are kept up to date with every report.
        prog: where this attempt starts.
        warmup_iters: updates of this attempt before the steady state.
        timeline: the run's stage spans (each stage's busy time and CPU time).
    """

    def __init__(
        self, summary: Summary, prog: Progress, warmup_iters: int, timeline: Timeline
    ) -> None:
        self.summary, self.timeline = summary, timeline
        summary.iterations, summary.env_steps = prog.iterations, prog.env_steps
        summary.time_to_80, summary.steps_to_80 = prog.time_to_80, prog.steps_to_80
        self.success_hist = prog.success_hist
        self.start_steps = prog.env_steps
        self.steady_at = prog.iterations + warmup_iters
        self.wall0 = prog.wall_s  # wall-clock of earlier attempts: the curves continue
        self.t_start = time.perf_counter()
        self.t_steady, self.steps_steady = self.t_start, prog.env_steps
        self.t_last = self.t_start  # when the last report arrived

    @property
    def now(self) -> float:
        """The run's wall-clock at the last report (earlier attempts included)."""
        return self.wall0 + self.t_last - self.t_start

    @property
    def success(self) -> float | None:
        """The last reported training success rate (None: none yet)."""
        return self.success_hist[-1] if self.success_hist else None

    def update(self, rep: IterationReport) -> dict[str, Any]:
        """Count one update; its metrics: the report's, and the run's time, env steps,
        throughput and each stage's busy and CPU time so far."""
        s, tl = self.summary, self.timeline
        self.t_last = max(self.t_last, time.perf_counter() if rep.at is None else rep.at)
        elapsed = self.t_last - self.t_start
        s.iterations += 1
        s.env_steps += rep.env_steps
        if s.iterations == self.steady_at:
            self.t_steady, self.steps_steady = self.t_last, s.env_steps
        m = dict(rep.metrics)
        m["time/wall_s"] = self.now
        m["env/steps_total"] = s.env_steps
        m["throughput/env_steps_per_s"] = (s.env_steps - self.start_steps) / max(elapsed, 1e-9)
        for stage, busy in tl.busy.items():
            m[f"time/{stage}/busy_s"] = busy
            # utilisation of the stage's lanes since the start; 1 - this is its bubbles
            lanes = len(tl.tracks.get(stage, ())) or 1
            m[f"pipeline/{stage}_busy_frac"] = busy / max(lanes * elapsed, 1e-9)
        for stage, cpu in tl.cpu.items():
            m[f"time/{stage}/cpu_s"] = cpu
        if "env/success_rate" in m:
            self.success_hist.append(m["env/success_rate"])
            if s.time_to_80 is None and m["env/success_rate"] >= 0.8:
                s.time_to_80, s.steps_to_80 = self.now, s.env_steps
        return m

    def spent(self, run: RunConfig) -> bool:
        """Whether the run's budget is spent, counting this attempt's updates."""
        s = self.summary
        return budget_spent(run, s.env_steps, self.now, s.iterations)

    def progress(self, prog: Progress) -> Progress:
        """``prog`` advanced to the last update (what ``progress.json`` holds)."""
        s = self.summary
        return replace(
            prog,
            iterations=s.iterations,
            env_steps=s.env_steps,
            wall_s=self.now,
            time_to_80=s.time_to_80,
            steps_to_80=s.steps_to_80,
            success_hist=list(self.success_hist),
        )

    def finish(self) -> None:
        """The summary's figures: wall-clock, throughput (overall, and in the steady state),
        the success rate of the last tenth of the updates, each stage's busy and CPU time, and
        the steady state's share of time in which no stage ran."""
        s, tl = self.summary, self.timeline
        wall = self.t_last - self.t_start
        s.wall_s = self.wall0 + wall
        s.throughput_overall = (s.env_steps - self.start_steps) / max(wall, 1e-9)
        steady_s = self.t_last - self.t_steady
        s.throughput_e2e = (s.env_steps - self.steps_steady) / max(steady_s, 1e-9)
        if self.t_steady == self.t_start or steady_s <= 0:  # no update after the warm-up
            s.throughput_e2e = s.throughput_overall
        hist = self.success_hist
        tail = hist[-max(1, math.ceil(len(hist) * 0.1)) :]
        s.success_rate = float(np.mean(tail)) if tail else float("nan")
        s.stage_busy_s = dict(tl.busy)
        s.stage_cpu_s = dict(tl.cpu)
        covered = tl.covered(self.t_steady, until=self.t_last)
        s.overhead_frac = max(0.0, 1.0 - covered / max(steady_s, 1e-9))


class MetricsFile:
    """``metrics.jsonl``: a row per logged update, appended as it is logged (every attempt's,
    so a resumed run's file holds the whole run); ``metrics.csv`` is written from it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, iteration: int, metrics: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def write_csv(self, path: Path) -> None:
        """The rows as a table, a column per metric any row has (nothing without rows)."""
        rows = self.rows()
        if rows:
            keys = sorted({k for r in rows for k in r})
            with path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(rows)
