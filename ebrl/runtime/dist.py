"""Data-parallel learner ranks: one rank's view of its group and the collectives it takes part in.

A data-parallel learner is L processes (ranks) that each hold the WHOLE segment and the same
policy and optimiser state. They compute the same advantages and draw the same minibatch
permutations (same RNG state: the ranks are seeded alike), and within each minibatch rank r
computes the loss only on its shard of the minibatch (:meth:`DataParallel.shard`), normalised by
the whole minibatch's counts; summing the gradients over the ranks then gives exactly the
gradient of the whole minibatch's loss (:func:`ebrl.algos.loss.sgd_update`), and every rank
applies the same clipped step.

Two strategies (``DataParallel.strategy``) share that arithmetic and differ in what a rank holds:

* ``"ddp"``: every rank holds the whole policy and optimiser state; after each backward the
  gradients are summed over the ranks in one flat buffer (:meth:`DataParallel.sum_grads`) and
  every rank applies the same step to its whole copy.
* ``"fsdp"``: torch's FSDP2 shards every parameter along dim 0 over the ranks, and with it the
  gradients and Adam's moments: between steps a rank holds about 1/L of them. Gradients are
  reduce-scattered as sums, so the per-rank losses' global normalisers keep their meaning; each
  rank clips with the global gradient norm and steps its own shard. The sharding itself lives
  in :mod:`ebrl.runtime.dist_fsdp` (:func:`~ebrl.runtime.dist_fsdp.shard_module`,
  :func:`~ebrl.runtime.dist_fsdp.gather_full`, ...); this module gives it the group's device
  mesh (:attr:`DataParallel.mesh`).

:data:`SOLO` is the one-process learner: it communicates nothing, and code given it runs as it did
before data parallelism existed, bit for bit. A group of several ranks is joined with
:func:`ebrl.runtime.dist_group.init_group` (which also picks the backend, gloo or NCCL, from
what every rank sees) and left with :func:`ebrl.runtime.dist_group.destroy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as tdist
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

Tensor = torch.Tensor
#: what a learner rank holds: "ddp", the whole policy; "fsdp", a shard of it (module docstring)
STRATEGIES = ("ddp", "fsdp")


class DataParallel:
    """One rank of a data-parallel learner group (see the module docstring).

    Args:
        rank: this process's rank, ``0 <= rank < world``; rank 0 is the leader (it alone writes
            checkpoints and snapshots).
        world: number of learner ranks L.
        group: the torch.distributed process group (None: the default group).
        device: where small buffers (statistics) are reduced: CUDA for NCCL, CPU for gloo.
        strategy: ``"ddp"`` (every rank holds the whole policy) or ``"fsdp"`` (each holds a
            shard; needs ``world >= 2``). The strategy is carried out by whoever owns the
            policy (:meth:`ebrl.stages.train.TrainStage.join` shards it).
        learner_device: where the learner's parameters live, and so the device type of FSDP's
            mesh (None: ``device``). A learner on a GPU keeps its shards there under gloo too
            (ranks sharing a GPU): a mesh of another device type would move them.
        backend: the group's torch.distributed backend, and ``why``: the reason it was chosen
            (:func:`ebrl.runtime.dist_group.choose_backend`), as logged.
    """

    def __init__(
        self,
        rank: int = 0,
        world: int = 1,
        group: tdist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        strategy: str = "ddp",
        learner_device: torch.device | str | None = None,
        backend: str = "gloo",
        why: str = "",
    ) -> None:
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"DataParallel: need 0 <= rank < world, got rank={rank} world={world}")
        if strategy not in STRATEGIES:
            raise ValueError(f"DataParallel: strategy {strategy!r}: expected one of {STRATEGIES}")
        if strategy == "fsdp" and world < 2:
            raise ValueError(
                "DataParallel: strategy 'fsdp' shards the policy over the ranks, and a group "
                "of one has nothing to shard it over; use 'ddp' (the default) or 2+ ranks"
            )
        self.rank = rank
        self.world = world
        self.group = group
        self.device = torch.device(device)
        self.learner_device = torch.device(learner_device) if learner_device else self.device
        self.strategy = strategy
        self.backend = backend
        self.why = why
        self._mesh: DeviceMesh | None = None

    @property
    def solo(self) -> bool:
        """A group of one: nothing is communicated."""
        return self.world == 1

    @property
    def sharded(self) -> bool:
        """FSDP: parameters, gradients and optimiser state are sharded over the ranks."""
        return self.strategy == "fsdp"

    @property
    def mesh(self) -> DeviceMesh:
        """The group as a one-dimensional device mesh (what FSDP2 shards over), on the learner's
        device type (FSDP moves the parameters it shards to the mesh's device); built once."""
        from torch.distributed.device_mesh import DeviceMesh

        if self._mesh is None:
            group = self.group if self.group is not None else tdist.group.WORLD
            self._mesh = DeviceMesh.from_group(group, self.learner_device.type)
        return self._mesh

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def shard(self, idx: Tensor) -> Tensor:
        """This rank's part of a minibatch's indices ``[b]``: contiguous, sizes differ by at most
        one (a rank's part is empty when ``b < world``); ``idx`` itself for a group of one."""
        if self.world == 1:
            return idx
        return torch.tensor_split(idx, self.world)[self.rank]

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it (untouched for a group of one)."""
        if self.world > 1:
            tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM, group=self.group)
        return tensor

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """Sums over the ranks of a few Python floats (in float64; one collective)."""
        if self.world == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        return self.all_reduce_sum(t).tolist()

    def min_int(self, value: int) -> int:
        """The smallest of an integer over the ranks (one collective): what every rank then
        uses where they must agree (the learner's micro-batch: FSDP's passes are collectives)."""
        if self.world == 1:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def check_same(self, tensor: Tensor, what: str) -> None:
        """Raise on every rank (the same RuntimeError, so none is left waiting in a collective)
        unless ``tensor`` (integers) is the same on all ranks; compares a position-weighted
        checksum, one small collective."""
        if self.world == 1:
            return
        flat = tensor.reshape(-1).to(torch.int64)
        h = (flat * torch.arange(1, flat.numel() + 1, device=flat.device)).sum()
        pair = torch.stack([h, -h]).to(self.device)  # max of both: max and -min over the ranks
        tdist.all_reduce(pair, op=tdist.ReduceOp.MAX, group=self.group)
        hi, neg_lo = pair.tolist()
        if hi != -neg_lo:
            raise RuntimeError(
                f"data-parallel ranks disagree on {what}: their torch random states differ. "
                "Seed every learner rank alike (torch.manual_seed) and let no rank draw from "
                "torch's global generator outside the update"
            )

    def sum_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Replace every parameter's gradient by its sum over the ranks.

        One flattened buffer per dtype (one collective for a float32 policy), not one per
        parameter. A parameter without a gradient counts as zeros; it gets the summed gradient
        if any rank had one, and keeps None if none had (an optimiser then skips it, as it
        would in a one-process run).
        """
        if self.world == 1:
            return
        buckets: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in params:
            buckets.setdefault(p.dtype, []).append(p)
        for ps in buckets.values():
            flat = [
                p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in ps
            ]
            has = torch.tensor(
                [float(p.grad is not None) for p in ps], dtype=ps[0].dtype, device=ps[0].device
            )  # [P]
            buf = self.all_reduce_sum(torch.cat([*flat, has]))  # [sum numel + P]
            views = torch.split(buf, [p.numel() for p in ps] + [len(ps)])
            for p, g, any_grad in zip(ps, views[:-1], views[-1].tolist()):
                if not any_grad:
                    continue
                if p.grad is None:
                    p.grad = g.view_as(p).clone()
                else:
                    p.grad.copy_(g.view_as(p))

    def average_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Replace every gradient by its mean over the ranks (:meth:`sum_grads` / world). The
        learner sums instead: its per-rank losses already carry the global normalisers."""
        if self.world == 1:
            return
        params = list(params)
        self.sum_grads(params)
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.world)

    def barrier(self) -> None:
        if self.world > 1:
            tdist.barrier(group=self.group)

    def __repr__(self) -> str:
        return (
            f"DataParallel(rank={self.rank}, world={self.world}, device={self.device}, "
            f"strategy={self.strategy}, backend={self.backend})"
        )


#: the one-process learner: no communication, results exactly as without data parallelism
SOLO = DataParallel()
