"""Data-parallel learner ranks over torch.distributed (gloo on CPU, NCCL on CUDA).

A data-parallel learner is L processes (ranks) that each hold the WHOLE segment and the same
policy and optimiser state. They compute the same advantages and draw the same minibatch
permutations (same RNG state: the ranks are seeded alike), and within each minibatch rank r
computes the loss only on its shard of the minibatch (:meth:`DataParallel.shard`), normalised by
the whole minibatch's counts; summing the gradients over the ranks then gives exactly the
gradient of the whole minibatch's loss (:func:`ebrl.algos.loss.sgd_update`), and every rank
applies the same clipped step.

:data:`SOLO` is the one-process learner: it communicates nothing, and code given it runs as it did
before data parallelism existed, bit for bit.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as tdist
from torch import nn

Tensor = torch.Tensor
BACKENDS = ("gloo", "nccl")


class DataParallel:
    """One rank of a data-parallel learner group (see the module docstring).

    Args:
        rank: this process's rank, ``0 <= rank < world``; rank 0 is the leader (it alone writes
            checkpoints and snapshots).
        world: number of learner ranks L.
        group: the torch.distributed process group (None: the default group).
        device: where small buffers (statistics) are reduced: CUDA for NCCL, CPU for gloo.
    """

    def __init__(
        self,
        rank: int = 0,
        world: int = 1,
        group: tdist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"DataParallel: need 0 <= rank < world, got rank={rank} world={world}")
        self.rank = rank
        self.world = world
        self.group = group
        self.device = torch.device(device)

    @property
    def solo(self) -> bool:
        """A group of one: nothing is communicated."""
        return self.world == 1

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
        return f"DataParallel(rank={self.rank}, world={self.world}, device={self.device})"


#: the one-process learner: no communication, results exactly as without data parallelism
SOLO = DataParallel()


def resolve_backend(backend: str, device: torch.device | str | None = None) -> str:
    """The torch.distributed backend for learner ranks on ``device``.

    ``"auto"`` picks NCCL for a CUDA device and gloo otherwise. NCCL is refused (RuntimeError
    naming the fix) where this process has no CUDA or the learner's tensors live on the CPU.
    """
    dev = torch.device(device) if device is not None else None
    if backend == "auto":
        backend = "nccl" if dev is not None and dev.type == "cuda" else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"data-parallel backend {backend!r}: expected 'auto', 'gloo' or 'nccl'")
    if backend == "nccl":
        if not torch.cuda.is_available() or not tdist.is_nccl_available():
            raise RuntimeError(
                "data-parallel backend 'nccl' needs CUDA, and this process has no CUDA device "
                f"(torch.cuda.is_available() is {torch.cuda.is_available()}, NCCL available: "
                f"{tdist.is_nccl_available()}); use backend 'gloo' for learner ranks on CPU, or "
                "run the learner ranks on GPUs (a CUDA build of torch, TrainStage device 'cuda')"
            )
        if dev is not None and dev.type != "cuda":
            raise RuntimeError(
                f"data-parallel backend 'nccl' reduces CUDA tensors only, but the learner device "
                f"is {dev}; use backend 'gloo' (or 'auto') for a CPU learner, or a CUDA device"
            )
    return backend


def init_group(
    rank: int,
    world: int,
    address: tuple[str, int],
    backend: str = "auto",
    timeout_s: float = 300.0,
    device: torch.device | str | None = None,
) -> DataParallel:
    """Join the default torch.distributed group of ``world`` learner ranks; returns this rank's
    :class:`DataParallel`.

    Every rank calls it with the same ``address`` (rank 0 listens there: pick it with
    :func:`free_port` on rank 0's host) and blocks until all ``world`` ranks joined or
    ``timeout_s`` passed (then torch raises). ``timeout_s`` also bounds every later collective,
    so a rank that died mid-update is noticed. Undo with :func:`destroy`.

    Args:
        rank: this rank.
        world: number of ranks.
        address: (host, port) of rank 0's rendezvous store (TCP).
        backend: "gloo", "nccl", or "auto" (from ``device``: :func:`resolve_backend`).
        timeout_s: rendezvous and collective timeout.
        device: the learner's device; with NCCL it becomes this process's current CUDA device
            (default: the current one).
    """
    backend = resolve_backend(backend, device)
    if tdist.is_initialized():
        raise RuntimeError(
            "init_group: torch.distributed is already initialised in this process; "
            "call ebrl.runtime.dist.destroy() first"
        )
    host, port = address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    comm_device = torch.device("cpu")
    if backend == "nccl":
        comm_device = torch.device(device) if device is not None else torch.device("cuda")
        if comm_device.index is None:
            comm_device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(comm_device)
    tdist.init_process_group(
        backend=backend,
        init_method=f"tcp://{host}:{int(port)}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return DataParallel(rank, world, device=comm_device)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it; another process may still take
    it before the group binds it, so use it at once)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return int(s.getsockname()[1])


def destroy() -> None:
    """Tear down this process's default group (no-op when there is none). Local: it does not
    wait for the other ranks (call :meth:`DataParallel.barrier` first for that)."""
    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()
