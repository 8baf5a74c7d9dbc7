"""What every scheduler gets and gives.

A scheduler decides the order and overlap of stage calls; it does no simulation, generation or
training itself. It receives the stages in a :class:`Stages` bundle and yields one
:class:`IterationReport` per training update. The caller (``ebrl.train``) owns the budget: it
stops iterating (``generator.close()``), and the scheduler's ``finally`` shuts its workers down.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

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
    """

    iteration: int
    env_steps: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RunContext:
    """What a scheduler gets: how to build the stages, the shape of the run, a shared clock.

    Attributes:
        factory: builds the sim/gen/train stages wherever the scheduler places them.
        decisions_per_env: T, decisions each env contributes to one segment.
        env_groups: G, env groups (the unit of pipelining and of lock-step batching).
        timeline: where every stage span of the run is recorded.
    """

    factory: StageFactory
    decisions_per_env: int
    env_groups: int
    timeline: Timeline

    def build_local(self) -> Stages:
        """All stages in this process, one sim stage per env group."""
        sims = [self.factory.sim(ids) for ids in self.factory.env_partition(self.env_groups)]
        factory = self.factory.with_spec(sims[0].group.spec)
        return Stages(sims=sims, gen=factory.gen(), train=factory.train())


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
