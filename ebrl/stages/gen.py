"""The generation stage: a copy of the policy that turns observations into action chunks."""

from __future__ import annotations

import torch

from ebrl.policies.base import Policy
from ebrl.types import ActionChunk, Observation


class GenStage:
    """Runs the acting policy. Holds its own copy of the weights, stamped with a version.

    Args:
        policy: the acting copy (never the learner's module: weights arrive by :meth:`load`).
        threads: torch intra-op threads while generating (None leaves torch's setting).
    """

    def __init__(self, policy: Policy, threads: int | None = None) -> None:
        self.policy = policy.eval()
        self.threads = threads

    @property
    def version(self) -> int:
        return self.policy.version

    def generate(self, batch: Observation) -> ActionChunk:
        if self.threads:
            torch.set_num_threads(self.threads)
        return self.policy.act(batch)

    def load(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Install the learner's weights (a no-op if this version is already loaded)."""
        if version != self.policy.version:
            self.policy.set_weights(version, weights)
