"""What every scheduler gets and gives.

A scheduler decides the order and overlap of stage calls; it does no simulation, generation or
training itself. It receives the stages in a :class:`Stages` bundle and yields one
:class:`IterationReport` per training update. The caller (``ebrl.train``) owns the budget: it
stops iterating (``generator.close()``), and the scheduler's ``finally`` shuts its workers down.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from ebrl.stages import GenStage, SimStage, TrainStage
from ebrl.stages.factory import StageFactory
from ebrl.timeline import Timeline
from ebrl.types import Observation


@dataclass
class Stages:
    """The workers of one run. ``sims`` are the env groups (one per sim worker)."""

    sims: list[SimStage]
    gen: GenStage
    train: TrainStage

    @property
    def env_ids(self) -> list[int]:
        return [int(e) for s in self.sims for e in s.env_ids]


@dataclass
class IterationReport:
    """One training update's worth of results.

    Attributes:
        iteration: 0-based update index.
        env_steps: environment steps (single actions) in the segment this update trained on.
        metrics: ``train/*``, ``env/*``, ``pipeline/*`` values for this iteration.
        params: run parameters decided while running (the shape the resource manager chose),
            logged once as MLflow params.
        at: when the update's report reached the driver (``time.perf_counter``), before the
            driver's own work on it (the resource manager's); the run's throughput is timed on
            it, so that work cannot move the steady window's ends. None: when it is yielded.
    """

    iteration: int
    env_steps: int
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    at: float | None = None


@dataclass(frozen=True)
class UpdateBudget:
    """The part of the run's budget a learner can check by itself, in the units the driver
    counts (learner versions, trained env steps), so that an asynchronous learner stops at the
    update where the driver stops counting instead of training one more that nobody logs.

    Attributes:
        updates: stop once the learner's version reaches this (None: no limit).
        env_steps: stop once this many env steps have been trained on (None: no limit).
    """

    updates: int | None = None
    env_steps: int | None = None

    def spent(self, version: int, trained_env_steps: int) -> bool:
        return (self.updates is not None and version >= self.updates) or (
            self.env_steps is not None and trained_env_steps >= self.env_steps
        )


@dataclass
class RunContext:
    """What a scheduler gets: how to build the stages, the shape of the run, a shared clock.

    Attributes:
        factory: builds the sim/gen/train stages wherever the scheduler places them.
        decisions_per_env: T, decisions each env contributes to one segment.
        env_groups: G, env groups (the unit of pipelining and of lock-step batching).
        timeline: where every stage span of the run is recorded.
        budget: where the learner stops by itself (the driver stops iterating there too).
        run_dir: the run folder, as ``ebrl.train`` chose it: where a scheduler writes its own
            files (the resource manager's ``resources.json``, ``profile.json``,
            ``reallocations.jsonl``; real RLinf's ``rlinf/``). None: the run has none (a
            scheduler driven directly, in tests): write nothing.
        manage_resources: the run's ``resources`` group is applied by the resource manager
            (``ebrl/schedulers/ebrl/control.py``): ``ebrl.train`` sets it for
            ``scheduler=ebrl``. False for the baselines on EBRL's workers (hybrid, async),
            which keep their fixed split (``ebrl.train`` refuses a non-default ``resources``
            group for them), and for every scheduler built without ``ebrl.train``.
        ledger: this attempt's folder of the step ledger (``ebrl.ledger``): whoever builds
            segments records the env steps it collected there. None: nothing recorded.
    """

    factory: StageFactory
    decisions_per_env: int
    env_groups: int
    timeline: Timeline
    budget: UpdateBudget = field(default_factory=UpdateBudget)
    run_dir: Path | None = None
    manage_resources: bool = False
    ledger: Path | None = None

    def step_ledger(self, writer: str, incarnation: int = 0, first_segment: int = 0):
        """The step ledger of one writer of this attempt (None without a ledger folder)."""
        if self.ledger is None:
            return None
        from ebrl.ledger import StepLedger, writer_path

        return StepLedger(writer_path(self.ledger, writer, incarnation), first_segment)

    def build_local(self) -> Stages:
        """All stages in this process, one sim stage per env group; the policy's on the run's
        device (:meth:`StageFactory.local_device`)."""
        sims = [self.factory.sim(ids) for ids in self.factory.env_partition(self.env_groups)]
        factory = self.factory.with_spec(sims[0].group.spec)
        device = factory.local_device()
        return Stages(sims=sims, gen=factory.gen(device), train=factory.train(device))


class Scheduler(Protocol):
    def run(self, ctx: RunContext) -> Iterator[IterationReport]: ...


def cat_obs(parts: list[Observation]) -> Observation:
    return Observation(
        obs=torch.cat([p.obs for p in parts]), env_ids=torch.cat([p.env_ids for p in parts])
    )


class StageError(RuntimeError):
    """A stage failed or its worker died; names the stage. The run's data so far is kept."""

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"stage '{stage}' failed: {detail}")
        self.stage = stage
        self.detail = detail

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # pickled as its two arguments (a launcher unpickles a job's error: the default would
        # call __init__ with the message alone and fail)
        return (StageError, (self.stage, self.detail))
