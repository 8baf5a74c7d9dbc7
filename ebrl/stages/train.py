"""The training stage: an algorithm updating the learner's policy on segments."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

import torch

from ebrl.algos.loss import optimizer_to
from ebrl.policies.base import Policy
from ebrl.runtime.dist import SOLO, DataParallel
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
        dp: this learner's rank of a data-parallel group (:mod:`ebrl.runtime.dist`): every rank
            trains on the same whole segments, and the algorithm's updates combine their
            gradients; only the leader (rank 0) writes checkpoints and snapshots. Set on the
            algorithm as ``algo.dp``. Default: one process.
        device: where the learner trains (None: where the policy already is). The policy and
            its optimiser state (a GRPO reference policy too) are moved there; segments move to
            it per update; :meth:`weights`, checkpoints and snapshots are CPU copies.
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
        dp: DataParallel = SOLO,
        device: torch.device | str | None = None,
    ) -> None:
        self.algo = algo
        self.dp = dp
        if dp is not SOLO:
            if not hasattr(algo, "dp"):
                raise TypeError(
                    f"TrainStage: {type(algo).__name__} has no 'dp' attribute, so it cannot "
                    "train data-parallel; pass dp=SOLO or use PPO / GRPO"
                )
            algo.dp = dp  # type: ignore[attr-defined]
        self.device = torch.device(device) if device is not None else None
        if self.device is not None:
            move = getattr(algo, "to", None)
            if callable(move):
                move(self.device)
            else:
                algo.policy.to(self.device)
                if hasattr(algo, "optimizer"):
                    optimizer_to(algo.optimizer, self.device)
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
            extra_passes(self.algo.policy, seg, self.extra_epochs, self.device)
        metrics["train/injected_load"] = float(loaded)
        # the staleness histogram: fraction of this segment's decisions v versions old
        for v, count in enumerate(hist.tolist()):
            metrics[f"pipeline/staleness_frac_{v}"] = count / max(1, seg.policy_version.numel())
        # the ranks hold identical learners: the leader alone writes them
        if self.dp.leader:
            if self.checkpoint is not None and self.version % self.every == 0:
                save_learner(self.checkpoint, self.algo, self.trained_env_steps)
            if self.snapshots is not None and self.version % self.snapshot_every == 0:
                save_snapshot(self.snapshots, self.algo.policy)
        return metrics

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, a detached CPU copy of the policy's state dict), ready to publish."""
        return self.algo.policy.get_weights()


def extra_passes(
    policy: Policy, seg: Segment, passes: int, device: torch.device | None = None
) -> None:
    """Injected learner load: ``passes`` forward-backward passes of the policy over the segment's
    decisions (moved to ``device`` first, when given), gradients thrown away. The weights, the
    optimiser and every random state are left as they were, so the run learns exactly as without
    it, only more slowly."""
    if device is not None:
        seg = seg.to(device)
    obs = seg.obs.flatten(0, 1)  # [T*N, O]
    actions = seg.actions.flatten(0, 1)  # [T*N, K, A]
    for _ in range(passes):
        ev = policy.evaluate(obs, actions)
        (ev.logprob.sum() + ev.entropy.sum() + ev.value.sum()).backward()
        policy.zero_grad(set_to_none=True)


def save_learner(path: Path, algo: Algorithm, trained_env_steps: int = 0) -> None:
    """Everything a resumed learner needs to continue exactly: policy weights, version,
    optimiser state, the env steps trained on so far and the learner process's torch random
    state (minibatch shuffles continue their stream; a CUDA learner's CUDA generator state too,
    as ``torch_cuda_rng``). Tensors are saved as CPU copies wherever the learner trains. Written
    atomically: a kill mid-write leaves the previous checkpoint intact."""
    state = {
        "version": algo.policy.version,
        "policy": _cpu(algo.policy.state_dict()),
        "optimizer": _cpu(algo.optimizer.state_dict()),
        "trained_env_steps": int(trained_env_steps),
        "torch_rng": torch.get_rng_state(),
    }
    device = next(algo.policy.parameters()).device
    if device.type == "cuda":  # minibatch shuffles of a CUDA learner draw from its generator
        state["torch_cuda_rng"] = torch.cuda.get_rng_state(device)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def save_snapshot(folder: Path, policy: Policy) -> Path:
    """The policy's weights and version as ``folder/v<version>.pt`` (atomic)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"v{policy.version:07d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"version": policy.version, "policy": _cpu(policy.state_dict())}, tmp)
    os.replace(tmp, path)
    return path


def _cpu(obj):
    """``obj`` with every tensor in its dicts, lists and tuples on the CPU (CPU tensors are
    kept as they are, not copied)."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        kind = OrderedDict if isinstance(obj, OrderedDict) else dict
        out = kind((k, _cpu(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # a module state dict's versions, for load_state_dict
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [_cpu(v) for v in obj]
    if type(obj) is tuple:
        return tuple(_cpu(v) for v in obj)
    return obj


def snapshots(folder: Path) -> list[Path]:
    """The snapshots in ``folder``, oldest version first."""
    return sorted(folder.glob("v*.pt")) if folder.exists() else []


def load_checkpoint(path: str | Path) -> dict | None:
    """The checkpoint at ``path``, or None when there is none."""
    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
