"""The training stage: an algorithm updating the learner's policy on segments."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import torch

from ebrl.policies.base import Policy
from ebrl.types import Segment


class Algorithm(Protocol):
    policy: Policy

    def update(self, seg: Segment) -> dict[str, float]: ...


class TrainStage:
    """Owns the learner policy and its optimiser state, and checkpoints them.

    Args:
        algo: PPO, GRPO, ... (anything with ``update(segment) -> metrics``).
        threads: torch intra-op threads while training (None leaves torch's setting).
        checkpoint: file to save the learner to every ``every`` updates (None: never).
        every: updates between checkpoints.
        snapshots: folder to keep a copy of the weights in every ``snapshot_every`` updates
            (``v<version>.pt``: version and policy only), for evaluating the learning curve
            after the run without spending the run's CPU on it (None: keep none).
        snapshot_every: updates between snapshots.
        extra_after: injected load (``inject.*``): from the update that starts at this learner
            version on, each update also runs ``extra_epochs`` forward-backward passes over its
            segment, gradients discarded (None: never).
        extra_epochs: passes per update of the injected load.
    """

    def __init__(
        self,
        algo: Algorithm,
        threads: int | None = None,
        checkpoint: str | Path | None = None,
        every: int = 1,
        snapshots: str | Path | None = None,
        snapshot_every: int = 1,
        extra_after: int | None = None,
        extra_epochs: int = 0,
    ) -> None:
        self.algo = algo
        self.threads = threads
        self.checkpoint = Path(checkpoint) if checkpoint else None
        self.every = max(1, every)
        self.snapshots = Path(snapshots) if snapshots else None
        self.snapshot_every = max(1, snapshot_every)
        self.extra_after = extra_after
        self.extra_epochs = extra_epochs
        #: env steps of every segment this learner has trained on, across resumed attempts (the
        #: checkpoint carries it): what a resumed run's driver counts from
        self.trained_env_steps = 0

    @property
    def version(self) -> int:
        return self.algo.policy.version

    def train(self, seg: Segment) -> dict[str, float]:
        """One update on a segment; the learner's version goes up by one."""
        if self.threads:
            torch.set_num_threads(self.threads)
        self.algo.policy.train()
        hist = torch.bincount(seg.staleness(self.version).flatten().clamp(min=0))  # [max + 1]
        loaded = (
            self.extra_epochs > 0
            and self.extra_after is not None
            and self.version >= self.extra_after
        )
        metrics = self.algo.update(seg)
        self.trained_env_steps += seg.num_steps
        if loaded:
            extra_passes(self.algo.policy, seg, self.extra_epochs)
        metrics["train/injected_load"] = float(loaded)
        # the staleness histogram: fraction of this segment's decisions v versions old
        for v, count in enumerate(hist.tolist()):
            metrics[f"pipeline/staleness_frac_{v}"] = count / max(1, seg.policy_version.numel())
        if self.checkpoint is not None and self.version % self.every == 0:
            save_learner(self.checkpoint, self.algo, self.trained_env_steps)
        if self.snapshots is not None and self.version % self.snapshot_every == 0:
            save_snapshot(self.snapshots, self.algo.policy)
        return metrics

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        return self.algo.policy.get_weights()


def extra_passes(policy: Policy, seg: Segment, passes: int) -> None:
    """Injected learner load: ``passes`` forward-backward passes of the policy over the segment's
    decisions, gradients thrown away. The weights, the optimiser and every random state are left
    as they were, so the run learns exactly as without it, only more slowly."""
    obs = seg.obs.flatten(0, 1)  # [T*N, O]
    actions = seg.actions.flatten(0, 1)  # [T*N, K, A]
    for _ in range(passes):
        ev = policy.evaluate(obs, actions)
        (ev.logprob.sum() + ev.entropy.sum() + ev.value.sum()).backward()
        policy.zero_grad(set_to_none=True)


def save_learner(path: Path, algo: Algorithm, trained_env_steps: int = 0) -> None:
    """Everything a resumed learner needs to continue exactly: policy weights, version,
    optimiser state, the env steps trained on so far and the learner process's torch random
    state (minibatch shuffles continue their stream). Written atomically: a kill mid-write leaves
    the previous checkpoint intact."""
    state = {
        "version": algo.policy.version,
        "policy": algo.policy.state_dict(),
        "optimizer": algo.optimizer.state_dict(),
        "trained_env_steps": int(trained_env_steps),
        "torch_rng": torch.get_rng_state(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def save_snapshot(folder: Path, policy: Policy) -> Path:
    """The policy's weights and version as ``folder/v<version>.pt`` (atomic)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"v{policy.version:07d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"version": policy.version, "policy": policy.state_dict()}, tmp)
    os.replace(tmp, path)
    return path


def snapshots(folder: Path) -> list[Path]:
    """The snapshots in ``folder``, oldest version first."""
    return sorted(folder.glob("v*.pt")) if folder.exists() else []


def load_checkpoint(path: str | Path) -> dict | None:
    """The checkpoint at ``path``, or None when there is none."""
    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
