"""The generation stage: a copy of the policy that turns observations into action chunks."""

from __future__ import annotations

import numpy as np
import torch

from ebrl.policies.base import Policy
from ebrl.runtime.weight_board import BoardReader
from ebrl.types import ActionChunk, Observation


class GenStage:
    """Runs the acting policy. Holds its own copy of the weights, stamped with a version.

    Sampling noise comes from one random stream per env (seeded by the run seed and the env id),
    so an env's actions do not depend on which other envs shared its batch: the same run gives
    the same trajectories under any scheduler's batching.

    Args:
        policy: the acting copy (never the learner's module: weights arrive by :meth:`load`).
        threads: torch intra-op threads while generating (None leaves torch's setting).
        seed: run seed for the per-env noise streams.
        stream: the learner version a resumed run restarts at (0: a fresh run); a resumed
            attempt draws fresh noise streams instead of replaying the first attempt's.
        device: where the policy computes (``cuda`` for a replica with a GPU share); chunks
            come back on the CPU.
    """

    def __init__(
        self,
        policy: Policy,
        threads: int | None = None,
        seed: int = 0,
        stream: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.policy = policy.to(self.device).eval()
        self.threads = threads
        self.seed = seed
        self.stream = stream
        self._rng: dict[int, torch.Generator] = {}
        self._live: dict[str, torch.Tensor] | None = None
        k, a = policy.spec.chunk_size, policy.spec.action_dim
        self._shape = (k, a)

    @property
    def version(self) -> int:
        return self.policy.version

    def _noise(self, env_ids: torch.Tensor) -> torch.Tensor:  # [B, K, A]
        rows = []
        for e in env_ids.tolist():
            g = self._rng.get(e)
            if g is None:
                g = self._rng[e] = torch.Generator().manual_seed(
                    noise_seed(self.seed, e, self.stream)
                )
            rows.append(torch.randn(self._shape, generator=g))
        return torch.stack(rows)

    def generate(self, batch: Observation) -> ActionChunk:
        if self.threads:
            torch.set_num_threads(self.threads)
        if self.device.type == "cpu":
            return self.policy.act(batch, noise=self._noise(batch.env_ids))
        # the noise streams stay on the CPU (the same draws on any device)
        on = Observation(obs=batch.obs.to(self.device), env_ids=batch.env_ids.to(self.device))
        return self.policy.act(on, noise=self._noise(batch.env_ids).to(self.device)).to("cpu")

    def load(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Install the learner's weights (a no-op if this version is already loaded): a whole
        state dict, or only the tensors an update changes (the learner sends those after a
        whole one; the frozen rest stays as that left it)."""
        if version == self.policy.version:
            return
        if self._live is None:  # the state dict's tensors share the parameters' storage
            self._live = self.policy.state_dict()
        if weights.keys() == self._live.keys():
            self.policy.set_weights(version, weights)
            return
        unknown = sorted(weights.keys() - self._live.keys())
        if unknown:
            raise ValueError(f"GenStage.load: keys {unknown[:5]} are not the policy's")
        with torch.no_grad():
            for key, tensor in weights.items():
                self._live[key].copy_(tensor)
        self.policy.version = version

    def load_from(self, board: BoardReader) -> int:
        """Install the newest weights on a board, copied straight into the policy's own
        tensors (no state dict is built); returns the version now loaded."""
        if board.version() == self.policy.version:
            return self.policy.version
        if self._live is None:  # the state dict's tensors share the parameters' storage
            self._live = self.policy.state_dict()
        with torch.no_grad():
            version, _ = board.read(into=self._live)
        self.policy.version = version
        return version


def noise_seed(seed: int, env_id: int, stream: int = 0) -> int:
    """The seed of env ``env_id``'s sampling-noise stream (stream 0: as before resuming existed)."""
    if stream == 0:
        return seed * 1_000_003 + env_id
    ss = np.random.SeedSequence([seed & 0xFFFFFFFF, env_id, stream, 0x6E6F6973])  # "nois"
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> 1)
