"""What the run's controller measures from the reports: the rollout's capacity
(:class:`RolloutMeter`), the simulators' rate (:class:`SimMeter`) and the run's time left at its
pace (:class:`Pace`). Pure, fed by the controller (:mod:`ebrl.resources.controller`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RolloutMeter:
    """The rollout's decisions per second of time it was not held back by the staleness bound.

    The generator reports cumulative counters: its clock, decisions issued, and env-seconds
    during which ready envs waited only because acting on them would exceed the staleness bound.
    Over an interval of ``dt`` seconds with ``n`` envs, the rollout was free for
    ``dt - blocked / n`` seconds.
    """

    def __init__(self, num_envs: int) -> None:
        self.num_envs = max(1, num_envs)
        self.last: tuple[float, float, float] | None = None

    def update(self, clock: float, decisions: float, blocked_env_s: float) -> float | None:
        """Feed the counters; the capacity since the previous call (None: no new data)."""
        prev, self.last = self.last, (clock, decisions, blocked_env_s)
        if prev is None:
            return None
        dt = clock - prev[0]
        free = dt - (blocked_env_s - prev[2]) / self.num_envs
        # counters that went backwards: a replaced generator's, counting from zero again
        if dt <= 0 or free <= 1e-3 * dt or decisions < prev[1]:
            return None
        return (decisions - prev[1]) / free


#: the env workers' cumulative gauges, summed over the workers (``ebrl.stages.sim.SimStage``)
SIM_STEPS, SIM_SECONDS = "sim/steps_total", "sim/step_s_total"


class SimMeter:
    """The simulators' rate between two reports: env steps per second of stepping (one env's
    steps per second), from the env workers' cumulative gauges."""

    def __init__(self) -> None:
        self.last: tuple[float, float] | None = None

    def update(self, metrics: Mapping[str, float]) -> float | None:
        """Feed a report's merged gauges; the rate since the previous one (None: no new data,
        or counters that went backwards: a replaced env worker counts from zero again)."""
        if SIM_STEPS not in metrics or SIM_SECONDS not in metrics:
            return None
        now = (float(metrics[SIM_STEPS]), float(metrics[SIM_SECONDS]))
        prev, self.last = self.last, now
        if prev is None:
            return None
        steps, seconds = now[0] - prev[0], now[1] - prev[1]
        if steps <= 0 or seconds <= 0:
            return None
        return steps / seconds


class Pace:
    """The run's seconds left, at its pace since the first report it was given: the least of
    what its ``budget`` node's updates, env steps and minutes leave (minutes counted from
    ``started``, the run's start on the same clock)."""

    def __init__(self, budget: Mapping[str, Any] | None, started: float) -> None:
        self.budget = dict(budget or {})
        self.started = started
        self.first: tuple[float, int] | None = None  # (clock, update) of the first report

    def seconds_left(self, iteration: int, env_steps: int, now: float) -> float | None:
        """None: unknown yet (no minutes budget, and no pace measured)."""
        if self.first is None:
            self.first = (now, iteration)
        t0, i0 = self.first
        per_update = (now - t0) / (iteration - i0) if iteration > i0 else None
        left = []
        if (minutes := self.budget.get("minutes")) is not None:
            left.append(self.started + 60.0 * float(minutes) - now)
        if per_update is not None:
            if (updates := self.budget.get("iterations")) is not None:
                left.append((int(updates) - iteration) * per_update)
            if (steps := self.budget.get("env_steps")) is not None and env_steps > 0 and iteration:
                left.append((int(steps) - env_steps) / env_steps * iteration * per_update)
        return max(0.0, min(left)) if left else None
