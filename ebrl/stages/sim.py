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

    def gauges(self) -> dict[str, float]:
        """Per-env step latency, milliseconds: ``sim/env<id>/step_ms_p50`` and ``_p99`` over
        each env's last steps (:meth:`EnvGroup.step_latency`); and, cumulative since the
        group was built, the env steps it took (``sim/steps_total``) and the wall seconds it
        spent stepping (``sim/step_s_total``), whose ratio between two reports is the
        simulators' rate now (the resource manager's shape watch reads it). Computed when
        asked, never on the stepping path."""
        out = {}
        steps = 0
        for env_id, (p50, p99, n) in self.group.step_latency().items():
            out[f"sim/env{env_id}/step_ms_p50"] = p50 * 1e3
            out[f"sim/env{env_id}/step_ms_p99"] = p99 * 1e3
            steps += n
        out["sim/steps_total"] = float(steps)
        out["sim/step_s_total"] = float(getattr(self.group, "sim_seconds", 0.0))
        return out

    def close(self) -> None:
        self.group.close()
