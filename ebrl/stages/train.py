"""The training stage: an algorithm updating the learner's policy on segments."""

from __future__ import annotations

from typing import Protocol

import torch

from ebrl.policies.base import Policy
from ebrl.types import Segment


class Algorithm(Protocol):
    policy: Policy

    def update(self, seg: Segment) -> dict[str, float]: ...


class TrainStage:
    """Owns the learner policy and its optimiser state.

    Args:
        algo: PPO, GRPO, ... (anything with ``update(segment) -> metrics``).
        threads: torch intra-op threads while training (None leaves torch's setting).
    """

    def __init__(self, algo: Algorithm, threads: int | None = None) -> None:
        self.algo = algo
        self.threads = threads

    @property
    def version(self) -> int:
        return self.algo.policy.version

    def train(self, seg: Segment) -> dict[str, float]:
        """One update on a segment; the learner's version goes up by one."""
        if self.threads:
            torch.set_num_threads(self.threads)
        self.algo.policy.train()
        return self.algo.update(seg)

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        return self.algo.policy.get_weights()
