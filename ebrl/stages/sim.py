"""The simulation stage: one env group behind observe/step calls."""

from __future__ import annotations

import torch

from ebrl.envs.base import EnvGroup
from ebrl.types import ActionChunk, ChunkOutcome, Observation


class SimStage:
    """Steps an env group through action chunks.

    Args:
        group: the envs this worker owns.
    """

    def __init__(self, group: EnvGroup) -> None:
        self.group = group

    @property
    def env_ids(self) -> torch.Tensor:  # [N] int64
        return self.group.env_ids

    def reset(self) -> Observation:
        return Observation(obs=self.group.reset(), env_ids=self.group.env_ids.clone())

    def step(self, chunk: ActionChunk) -> ChunkOutcome:
        """Every env in the chunk runs its K actions (or until its episode ends)."""
        return self.group.step_chunk(chunk)

    def close(self) -> None:
        self.group.close()
