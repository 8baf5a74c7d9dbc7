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

from ebrl.rollout import EpisodeStats, SegmentBuilder
from ebrl.stages import GenStage, SimStage, TrainStage
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
    stages: Stages
    decisions_per_env: int  # T: decisions each env contributes to one segment
    timeline: Timeline


class Scheduler(Protocol):
    def run(self, ctx: RunContext) -> Iterator[IterationReport]: ...


def cat_obs(parts: list[Observation]) -> Observation:
    return Observation(
        obs=torch.cat([p.obs for p in parts]), env_ids=torch.cat([p.env_ids for p in parts])
    )


def new_builder(ctx: RunContext) -> tuple[SegmentBuilder, EpisodeStats]:
    return SegmentBuilder(ctx.stages.env_ids, ctx.decisions_per_env), EpisodeStats()
