"""The run's shape while it goes: a stage whose rate drifts has the whole shape searched again.

The start-up search (:mod:`ebrl.resources.shape`) chooses G, the step level, M and the threads
from costs measured in the first seconds, and the trials keep the fastest of a shortlist. A run
of hours does not keep those costs: episodes lengthen as the policy learns, a simulator's scenes
get heavier, a node's neighbour starts a job. :class:`ShapeWatch` follows each stage's rate in
the run, under the shape in force: the simulators' (env steps per second of one env, from the
env workers' step latencies), the generator's (decisions per second it is busy) and the
learner's (samples per second of training). Each stage's level is the mean of its first
``patience`` updates under the shape (:class:`~ebrl.resources.monitors.DriftMonitor`); when a
stage stays more than ``threshold`` away from it for ``patience`` updates, that stage's costs
are scaled by its level over its recent rate, every candidate shape (every thread split) is
weighed again on the scaled costs (the machine's cores as the trials refit them, and each shape
the trials measured corrected by what the run measured of it against the model), and the run
moves when another shape beats the one in force: by more than the search's margin (2%) for a
shape the run has measured, by more than the trials' band (10%) for one it has not, since the
model has ranked shapes that close in the wrong order. The levels are then set again under the
shape that runs. A streak of updates that left the level both ways, with no stage's mean beyond
the threshold, is noise: it fires nothing and keeps the levels.

It imports no engine: the run-time controller (:class:`~ebrl.resources.controller.RunController`)
feeds it each update's rates and sends its moves.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ebrl.resources.model import CostTable, Shape, StageCosts, Workload, rank
from ebrl.resources.monitors import DriftMonitor
from ebrl.resources.shape import ShapeChoice

#: the stages watched (the keys of :meth:`ShapeWatch.observe`'s rates)
STAGES = ("sim", "gen", "train")
#: a shape in force is kept unless another is predicted faster by more than this share (the
#: search's own margin: a gain the model cannot resolve is not worth a move)
MARGIN = 0.02
#: ... or by more than this, for a shape the run has not measured (the trials' band: the
#: model's error between shapes)
UNMEASURED_MARGIN = 0.10


def scaled_costs(costs: StageCosts, factors: Mapping[str, float]) -> StageCosts:
    """``costs`` with each stage's work multiplied by its factor (``sim``: every chunk sample;
    ``gen``: a call's fixed and per-env seconds; ``train``: the update). A stage without a
    factor is unchanged."""
    f = {s: float(factors.get(s, 1.0)) for s in STAGES}
    for s, x in f.items():
        if not (math.isfinite(x) and x > 0):
            raise ValueError(f"scaled_costs: the {s} factor must be finite and > 0, not {x}")
    return dataclasses.replace(
        costs,
        sim_chunk_s=tuple(c * f["sim"] for c in costs.sim_chunk_s),
        gen_fixed_s=costs.gen_fixed_s * f["gen"],
        gen_per_env_s=costs.gen_per_env_s * f["gen"],
        train_s=costs.train_s * f["train"],
    )


def scaled_table(
    costs: StageCosts | CostTable, factors: Mapping[str, float]
) -> StageCosts | CostTable:
    """:func:`scaled_costs` of one set of costs, or of every thread split of a table (a stage
    that became heavier is heavier at every thread count)."""
    if isinstance(costs, StageCosts):
        return scaled_costs(costs, factors)
    return {split: scaled_costs(c, factors) for split, c in costs.items()}


@dataclass(frozen=True)
class ShapeMove:
    """One firing of the watch: what drifted, and the shape it searched.

    Attributes:
        step: the update it fired at.
        cause: which stage drifted, from what level to what rate.
        old: the shape in force; new: the one to run (``old`` when it was kept).
        factors: each drifted stage's cost factor (its level over its recent rate).
        predicted_old / predicted_new: both shapes' predicted env steps/s on the scaled costs.
        search_s: the driver's seconds weighing the candidates again.
        decided_at: when it fired (the controller's clock).
    """

    step: int
    cause: str
    old: Shape
    new: Shape
    factors: dict[str, float]
    predicted_old: float
    predicted_new: float
    search_s: float
    decided_at: float

    @property
    def changed(self) -> bool:
        return self.new != self.old

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "shape",
            "step": self.step,
            "changed": self.changed,
            "cause": self.cause,
            "old": self.old.to_dict(),
            "new": self.new.to_dict(),
            "factors": self.factors,
            "predicted_old": self.predicted_old,
            "predicted_new": self.predicted_new,
            "search_s": self.search_s,
            "decided_at": self.decided_at,
        }


class ShapeWatch:
    """Searches the shape again when a stage's rate drifts (see the module's docstring).

    Args:
        choice: the start-up search's outcome (its costs, workload and candidates).
        threshold: relative change of a stage's rate that counts as a drift.
        patience: updates that set the levels, then consecutive drifting updates that fire.
        settle: updates after a (re)start not fed to the levels (the first interval after a
            move still holds the old shape's decisions).
        margin: a shape in force is kept unless another the run measured is predicted faster
            by more than this; unmeasured: another that is faster by ``unmeasured_margin``.
        clock: the decision's timestamp (injectable for tests).
    """

    def __init__(
        self,
        choice: ShapeChoice,
        threshold: float = 0.15,
        patience: int = 2,
        settle: int = 1,
        margin: float = MARGIN,
        unmeasured_margin: float = UNMEASURED_MARGIN,
        clock: Any = time.perf_counter,
    ) -> None:
        if choice.work is None:
            raise ValueError("ShapeWatch: the choice carries no workload (made by search())")
        self.costs: StageCosts | CostTable = choice.costs
        self.work: Workload = choice.work
        self.shapes = choice.shapes or (choice.shape,)
        self.shape = choice.shape
        self.monitor = DriftMonitor(threshold, patience)
        self.settle, self.margin, self.clock = max(0, settle), margin, clock
        self.unmeasured_margin = unmeasured_margin
        #: shape -> measured rate / the model's, for the shapes the run measured
        self.corrections: dict[Shape, float] = {}
        self.recent: dict[str, deque[float]] = {s: deque(maxlen=patience) for s in STAGES}
        self.waiting = self.settle
        self.moves: list[ShapeMove] = []

    def restart(
        self,
        shape: Shape,
        cores: float | None = None,
        corrections: Mapping[Shape, float] | None = None,
    ) -> None:
        """The run now runs ``shape`` (the trials' winner, a move): levels are set again after
        ``settle`` updates; ``cores`` (the trials' refit) replaces the model's cores, and
        ``corrections`` (a measured shape's rate over the model's at those cores) the
        corrections."""
        self.shape = shape
        if cores is not None:
            self.work = dataclasses.replace(self.work, cores=float(cores))
        if corrections is not None:
            self.corrections = {
                s: float(c) for s, c in corrections.items() if math.isfinite(c) and c > 0
            }
        self.monitor.reset()
        for d in self.recent.values():
            d.clear()
        self.waiting = self.settle

    def observe(self, rates: Mapping[str, float | None], step: int) -> ShapeMove | None:
        """One update's rates by stage (None or non-finite: not measured this update). Returns
        the firing when this update completes a drift, else None."""
        if self.waiting:
            self.waiting -= 1
            return None
        clean = {
            k: float(v)
            for k, v in rates.items()
            if k in STAGES and v is not None and math.isfinite(v) and v > 0
        }
        for k, v in clean.items():
            self.recent[k].append(v)
        if not self.monitor.update(clean):
            return None
        th = self.monitor.threshold
        factors: dict[str, float] = {}
        parts = []
        for k, level in sorted(self.monitor.levels.items()):
            if not self.recent[k]:
                continue
            now = float(np.mean(self.recent[k]))
            if abs(now / level - 1.0) > th:
                factors[k] = level / now
                parts.append(f"{k} {level:.4g}/s -> {now:.4g}/s")
        if not factors:
            # the streak mixed faster and slower updates and no stage moved on average: noise,
            # not a drift (searching the same costs again would only set the levels anew)
            self.monitor.streak = 0
            return None
        cause = (
            f"{', '.join(parts)} for {self.monitor.window} updates "
            f"(more than {th:.0%} from its level under {self.shape.describe()})"
        )
        t0 = time.perf_counter()
        self.costs = scaled_table(self.costs, factors)
        by_shape = {
            p.shape: p.throughput * self.corrections.get(p.shape, 1.0)
            for p in rank(self.costs, self.work, self.shapes)
        }
        old = by_shape.get(self.shape, 0.0)
        new = self.shape
        for s, rate in sorted(by_shape.items(), key=lambda kv: -kv[1]):
            margin = self.margin if s in self.corrections else self.unmeasured_margin
            if s != self.shape and rate > old * (1 + margin):
                new = s
                break
        move = ShapeMove(
            step, cause, self.shape, new, factors, old, by_shape[new],
            time.perf_counter() - t0, self.clock(),
        )  # fmt: skip
        self.moves.append(move)
        self.restart(new)
        return move
