"""The training stage: an algorithm updating the learner's policy on segments.

Checkpoints have one layout whatever trained them: the full policy and the full optimiser state of
a one-rank learner (Adam's moments by parameter position). A learner of L ranks writes it from
its leader; under FSDP the ranks first gather their shards into it. So a checkpoint written by
one rank, by DDP ranks or by FSDP ranks resumes under any of the three: every rank loads the full
state (:meth:`ebrl.stages.factory.StageFactory.train`), and an FSDP rank shards it afterwards
(:meth:`TrainStage.join`).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ebrl.algos.loss import row_slices
from ebrl.algos.optim import optimizer_to
from ebrl.memory import micro_batch_for
from ebrl.policies.base import Policy
from ebrl.runtime.dist import SOLO, DataParallel
from ebrl.runtime.dist_fsdp import gather_full, reshard, shard_module, shard_optimizer
from ebrl.types import Segment

log = logging.getLogger(__name__)

#: the Policy methods a learner calls as forward passes (``evaluate`` calls both): under FSDP the
#: root unit's parameters are gathered around each
LEARNER_METHODS = ("dist", "value")


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
            gradients; only the leader (rank 0) writes checkpoints and snapshots. An FSDP group
            shards the policy and optimiser (:meth:`join`). Every rank must be given the same
            checkpoint and snapshot settings (under FSDP each save gathers on all ranks).
            Default: one process.
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
        self.dp = SOLO
        #: FSDP leader: the full weights (CPU) as of the last update, what it publishes and
        #: snapshots (the ranks gather them together after every update); None elsewhere
        self._full: dict[str, torch.Tensor] | None = None
        self.device = torch.device(device) if device is not None else None
        if self.device is not None:
            move = getattr(algo, "to", None)
            if callable(move):
                move(self.device)
            else:
                algo.policy.to(self.device)
                if hasattr(algo, "optimizer"):
                    optimizer_to(algo.optimizer, self.device)
        if dp is not SOLO:  # after the move: FSDP shards the policy where it trains
            self.join(dp)
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
        #: size the algorithm's micro-batch from the GPU's free memory at the first update
        #: (``algo.cfg.micro_batch`` unset on a GPU; on the CPU the whole minibatch is one pass)
        self._size_micro_batch = (
            self.device is not None
            and self.device.type == "cuda"
            and hasattr(algo, "micro_batch")
            and algo.micro_batch is None  # type: ignore[attr-defined]
        )

    def join(self, dp: DataParallel) -> None:
        """Train as ``dp``'s rank from now on (set on the algorithm as ``algo.dp``).

        With ``dp.strategy == "fsdp"`` the policy is sharded now (FSDP2 units:
        :func:`ebrl.runtime.dist_fsdp.shard_units`), its optimiser rebuilt on the shards with its
        state (a resumed checkpoint's) sharded alike, and a GRPO reference policy sharded too;
        from here on a rank holds about 1/L of them between updates. Call it once, after the
        policy reached its device and its checkpoint was loaded, on every rank.
        """
        if not hasattr(self.algo, "dp"):
            raise TypeError(
                f"TrainStage: {type(self.algo).__name__} has no 'dp' attribute, so it cannot "
                "train data-parallel; pass dp=SOLO or use PPO / GRPO"
            )
        if self.dp is not SOLO:
            raise RuntimeError(f"TrainStage.join: already a rank of {self.dp}")
        if dp.sharded:
            algo = self.algo
            if not isinstance(getattr(algo, "optimizer", None), torch.optim.Optimizer):
                raise TypeError(
                    f"TrainStage: {type(algo).__name__} has no 'optimizer' to shard; FSDP "
                    "shards a learner's optimiser state with its policy"
                )
            # the weights the leader publishes until its first update (gathered ones after)
            self._full = gather_full(algo.policy.state_dict(), keep=dp.leader)
            algo.optimizer = shard_optimizer(algo.optimizer, algo.policy, dp, LEARNER_METHODS)
            reference = getattr(algo, "reference", None)
            if isinstance(reference, nn.Module):  # forward only: free its gathers at once
                shard_module(reference, dp, ("dist",), reshard_root=True)
        self.dp = dp
        self.algo.dp = dp  # type: ignore[attr-defined]

    def fit_micro_batch(self, seg: Segment, free: int, total: int) -> int:
        """The micro-batch that ``free`` of ``total`` device bytes hold for this learner: its
        policy's activations measured on two of ``seg``'s decisions
        (:func:`ebrl.memory.micro_batch_for`), at most a rank's share of a minibatch; the
        smallest over the ranks of a data-parallel learner (they must make the same passes)."""
        seg = seg.to(self.device) if self.device is not None else seg
        t_len, n = seg.shape
        minibatch = -(-t_len * n // max(1, int(self.algo.cfg.num_minibatches)))  # type: ignore[attr-defined]
        optimizer = getattr(self.algo, "optimizer", None)
        micro = micro_batch_for(
            self.algo.policy,
            seg.obs.flatten(0, 1)[:2],
            seg.actions.flatten(0, 1)[:2],
            {k: v[:2] for k, v in seg.flat_extras().items()},
            free=free,
            total=total,
            decisions=-(-minibatch // self.dp.world),
            optimizer_ready=bool(optimizer is not None and optimizer.state),
        )
        micro = self.dp.min_int(micro)
        log.info("learner micro-batch: %d decisions per pass (from the device's memory)", micro)
        return micro

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
        if self._size_micro_batch:
            self._size_micro_batch = False
            free, total = torch.cuda.mem_get_info(self.device)
            self.algo.micro_batch = self.fit_micro_batch(seg, free, total)  # type: ignore[attr-defined]
        metrics = self.algo.update(seg)
        self.trained_env_steps += seg.num_steps
        if loaded:
            micro = getattr(self.algo, "micro_batch", None)
            extra_passes(self.algo.policy, seg, self.extra_epochs, self.device, micro)
        metrics["train/injected_load"] = float(loaded)
        save = self.checkpoint is not None and self.version % self.every == 0
        optimizer_state = None
        if self.dp.sharded:
            # between updates a rank holds its shards only (a forward without backward, the KL
            # stop's, leaves the root's gathered); then the full weights for the replicas and,
            # when a checkpoint is due, the full optimiser state: collectives, on every rank
            policy = self.algo.policy
            reshard(policy)
            self._full = gather_full(policy.state_dict(), keep=self.dp.leader)
            if save:
                optimizer_state = gather_full(
                    self.algo.optimizer.state_dict(),  # type: ignore[attr-defined]
                    keep=self.dp.leader,
                )
        # the staleness histogram: fraction of this segment's decisions v versions old
        for v, count in enumerate(hist.tolist()):
            metrics[f"pipeline/staleness_frac_{v}"] = count / max(1, seg.policy_version.numel())
        # the ranks hold identical learners: the leader alone writes them
        if self.dp.leader:
            if save:
                save_learner(
                    self.checkpoint,  # type: ignore[arg-type]
                    self.algo,
                    self.trained_env_steps,
                    policy_state=self._full,
                    optimizer_state=optimizer_state,
                )
            if self.snapshots is not None and self.version % self.snapshot_every == 0:
                save_snapshot(self.snapshots, self.algo.policy, self._full)
        return metrics

    def weights(self, changing_only: bool = False) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, a detached CPU copy of the policy's full state dict), ready to publish;
        ``changing_only``: of the tensors an update changes only (:meth:`changing`).

        Under FSDP only the leader holds it (gathered after each update); another rank raises.
        """
        keys = self.changing() if changing_only else None
        if not self.dp.sharded:
            state = self.algo.policy.state_dict()
            keys = keys if keys is not None else tuple(state)
            return self.version, {k: state[k].detach().cpu().clone() for k in keys}
        full = self.state()  # the leader's gathered CPU copy, already its own
        return self.version, {k: full[k] for k in (keys if keys is not None else full)}

    def changing(self) -> tuple[str, ...] | None:
        """The state-dict keys an update can change: the parameters that train
        (``requires_grad``) and every buffer; None when that is every key. A VLA whose
        backbone is frozen trains its action expert only: the rest need publishing once."""
        policy = self.algo.policy
        frozen = {
            n for n, p in policy.named_parameters(remove_duplicate=False) if not p.requires_grad
        }
        if not frozen:
            return None
        return tuple(k for k in policy.state_dict(keep_vars=True) if k not in frozen)

    def state(self) -> dict[str, torch.Tensor]:
        """The policy's full state dict, for the weight board: its live tensors (no copy), or
        under FSDP the leader's gathered CPU copy (RuntimeError on another rank)."""
        if not self.dp.sharded:
            return self.algo.policy.state_dict()
        if self._full is None:
            raise RuntimeError(
                f"TrainStage.state: rank {self.dp.rank} of an FSDP learner holds shards only; "
                "the leader (rank 0) holds the full weights"
            )
        return self._full


def extra_passes(
    policy: Policy,
    seg: Segment,
    passes: int,
    device: torch.device | None = None,
    micro_batch: int | None = None,
) -> None:
    """Injected learner load: ``passes`` forward-backward passes of the policy over the segment's
    decisions (moved to ``device`` first, when given; in micro-batches of ``micro_batch``, as
    the update's), gradients thrown away. The weights, the optimiser and every random state are
    left as they were, so the run learns exactly as without it, only more slowly."""
    if device is not None:
        seg = seg.to(device)
    obs = seg.obs.flatten(0, 1)  # [T*N, O]
    actions = seg.actions.flatten(0, 1)  # [T*N, K, A]
    extras = seg.flat_extras()  # name -> [T*N, ...]
    for _ in range(passes):
        for s in row_slices(len(obs), micro_batch):
            ev = policy.evaluate(obs[s], actions[s], {k: v[s] for k, v in extras.items()})
            (ev.logprob.sum() + ev.entropy.sum() + ev.value.sum()).backward()
        policy.zero_grad(set_to_none=True)


def save_learner(
    path: Path,
    algo: Algorithm,
    trained_env_steps: int = 0,
    *,
    policy_state: dict | None = None,
    optimizer_state: dict | None = None,
) -> None:
    """Everything a resumed learner needs to continue exactly: policy weights, version,
    optimiser state, the env steps trained on so far and the learner process's torch random
    state (minibatch shuffles continue their stream; a CUDA learner's CUDA generator state too,
    as ``torch_cuda_rng``). Tensors are saved as CPU copies wherever the learner trains. Written
    atomically: a kill mid-write leaves the previous checkpoint intact.

    ``policy_state`` / ``optimizer_state``: full states gathered from FSDP shards
    (:func:`ebrl.runtime.dist_fsdp.gather_full`) to save instead of ``algo``'s own, which are
    shards.
    """
    if policy_state is None:
        policy_state = algo.policy.state_dict()
    if optimizer_state is None:
        optimizer_state = algo.optimizer.state_dict()  # type: ignore[attr-defined]
    state = {
        "version": algo.policy.version,
        "policy": _cpu(policy_state),
        "optimizer": _cpu(optimizer_state),
        "trained_env_steps": int(trained_env_steps),
        "torch_rng": torch.get_rng_state(),
    }
    device = next(algo.policy.parameters()).device
    if device.type == "cuda":  # minibatch shuffles of a CUDA learner draw from its generator
        state["torch_cuda_rng"] = torch.cuda.get_rng_state(device)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def save_snapshot(folder: Path, policy: Policy, state: dict | None = None) -> Path:
    """The policy's weights and version as ``folder/v<version>.pt`` (atomic); ``state``: its
    full state dict when the policy's own is FSDP shards."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"v{policy.version:07d}.pt"
    tmp = path.with_suffix(".tmp")
    weights = policy.state_dict() if state is None else state
    torch.save({"version": policy.version, "policy": _cpu(weights)}, tmp)
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
