"""When the elastic allocator searches again: two signals over a window of steps.

At run time :class:`ElasticAllocator` fires on either of two signals held for ``window``
consecutive steps: the stages diverge from each other by more than ``threshold`` relative to what
the allocation planned (:class:`DivergenceMonitor`), or a stage's throughput drifts more than
``threshold`` from its own level under the current allocation (:class:`DriftMonitor`: a slower
simulator slows the rollout and, on shared cores, training alike, which the first signal misses).
"""

from __future__ import annotations

import math

from ebrl.resources.split import divergence


class _Window:
    """A streak of steps past ``threshold``; fires after ``window`` of them, then starts over."""

    def __init__(self, threshold: float, window: int) -> None:
        if not 0.0 <= threshold < 1.0 or window < 1:
            raise ValueError(
                f"{type(self).__name__}: threshold={threshold} must be in [0, 1), "
                f"window={window} >= 1"
            )
        self.threshold = threshold
        self.window = window
        self.streak = 0
        self.last = 0.0

    def _count(self, value: float) -> bool:
        """Record this step's value; True when it completes a window past the threshold."""
        self.last = value
        self.streak = self.streak + 1 if value > self.threshold else 0
        if self.streak >= self.window:
            self.streak = 0
            return True
        return False


class DivergenceMonitor(_Window):
    """Fires when gen and train throughputs diverge for ``window`` consecutive steps.

    Divergence is :func:`divergence`: ``(max - min) / max``. A step within the threshold resets
    the count; firing resets it too, so a persisting divergence fires once per window.

    Args:
        threshold: relative gap that counts as divergent (strictly more than it).
        window: consecutive divergent steps before firing.
    """

    def __init__(self, threshold: float = 0.15, window: int = 20) -> None:
        super().__init__(threshold, window)

    def update(self, gen_throughput: float, train_throughput: float) -> bool:
        """Feed one step's throughputs; True when this step completes a divergent window."""
        return self._count(divergence(gen_throughput, train_throughput))

    def reset(self) -> None:
        self.streak = 0


class DriftMonitor(_Window):
    """Fires when a stage's throughput drifts from its own level for ``window`` consecutive steps.

    Each stage's level is the mean of its first ``window`` observations after a (re)start, i.e.
    what it does under the allocation in force, measured where it runs (not the offline profile,
    which a stage sharing cores with others never matches). Drift is ``|x / level - 1|``, the
    largest over the stages. Firing resets the streak; :meth:`reset` (after a reallocation)
    also forgets the levels.

    Args:
        threshold: relative change that counts as drift (strictly more than it).
        window: steps that set the levels, then consecutive drifting steps before firing.
    """

    def __init__(self, threshold: float = 0.15, window: int = 20) -> None:
        super().__init__(threshold, window)
        self.stage = ""
        self.levels: dict[str, float] = {}
        self._seen: dict[str, list[float]] = {}

    def update(self, rates: dict[str, float]) -> bool:
        """Feed one step's throughputs by stage; True when this step completes a drifting window.

        A stage with a non-finite or non-positive value this step is skipped.
        """
        drift, worst = 0.0, ""
        for name, x in rates.items():
            if not (math.isfinite(x) and x > 0):
                continue
            level = self.levels.get(name)
            if level is None:
                seen = self._seen.setdefault(name, [])
                seen.append(x)
                if len(seen) == self.window:
                    self.levels[name] = sum(seen) / len(seen)
                continue
            d = abs(x / level - 1.0)
            if d > drift:
                drift, worst = d, name
        self.stage = worst
        return self._count(drift)

    def reset(self) -> None:
        self.streak = 0
        self.levels.clear()
        self._seen.clear()
