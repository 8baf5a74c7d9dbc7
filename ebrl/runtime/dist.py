"""Data-parallel learner ranks over torch.distributed (gloo on CPU, NCCL on CUDA).

The backend is chosen from what every rank sees (:func:`choose_backend` over each rank's
:func:`rank_devices`: its ``CUDA_VISIBLE_DEVICES``, torch's CUDA devices and their UUIDs): NCCL
where each rank owns its GPUs, gloo where a rank computes on the CPU, sees no GPU, or shares one
with another rank (NCCL refuses that); the choice and its reason are logged.

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
* ``"fsdp"``: torch's FSDP2 (:func:`torch.distributed.fsdp.fully_shard`) shards every parameter
  along dim 0 over the ranks, and with it the gradients and Adam's moments: between steps a rank
  holds about 1/L of them. A unit's parameters are all-gathered around its forward and backward
  and its gradients reduce-scattered, SUMMED (divide factor 1, sum-only collectives:
  :func:`shard_module`), so the per-rank losses' global normalisers keep their meaning; each rank
  clips with the global gradient norm (torch's ``clip_grad_norm_`` reduces the sharded norms) and
  steps its own shard. FSDP2 is the FSDP that runs here: FSDP1 (``FullyShardedDataParallel``)
  refuses a CPU-only process ("FSDP needs a non-CPU accelerator device") and hooks ``forward``
  only, while a policy is called through ``dist`` and ``value``, which FSDP2 can hook too
  (:func:`~torch.distributed.fsdp.register_fsdp_forward_method`, through :func:`_hook_method`).
  Units follow one rule, :func:`shard_units`. Full weights and a full optimiser state (a one-rank
  learner's, exactly) come back from the shards with :func:`gather_full`;
  :func:`shard_optimizer` goes the other way.

:data:`SOLO` is the one-process learner: it communicates nothing, and code given it runs as it did
before data parallelism existed, bit for bit.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# torch.distributed.tensor and .fsdp are imported where FSDP is used, not here: they take ~1 s to
# import and every process that trains or acts imports this module

log = logging.getLogger(__name__)

Tensor = torch.Tensor
BACKENDS = ("gloo", "nccl")
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
            (:func:`choose_backend`), as logged.
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


# --- FSDP (strategy "fsdp") ----------------------------------------------------------------------
def shard_units(module: nn.Module) -> list[nn.Module]:
    """The modules :func:`shard_module` makes FSDP units of their own, before the root.

    The rule: a model's repeated blocks are the children of an ``nn.ModuleList`` (how torch and
    Hugging Face stack transformer layers: ``nn.TransformerEncoder.layers``, a Llama's
    ``model.layers``), and each such block is a unit, so a rank gathers one block's parameters at
    a time. Only the outermost lists count (a block's own lists stay in the block). Everything
    else (embeddings, heads, the critic, the log-std; the whole of an MLP, which has no
    ``ModuleList``) belongs to the root unit, the module itself.
    """
    units: list[nn.Module] = []
    inside: set[int] = set()  # ids of modules already within a chosen block
    for m in module.modules():  # pre-order: a list is met before the lists inside its blocks
        if id(m) in inside or not isinstance(m, nn.ModuleList):
            continue
        for block in m.children():
            if any(True for _ in block.parameters()):
                units.append(block)
                inside.update(id(x) for x in block.modules())
    return units


def shard_module(
    module: nn.Module,
    dp: DataParallel,
    methods: Collection[str] = (),
    reshard_root: bool | None = None,
) -> None:
    """Shard ``module``'s parameters over ``dp``'s ranks with FSDP2, in place.

    Each of :func:`shard_units` becomes a unit, then the module itself (the root) takes what is
    left. Gradients are reduce-scattered as sums (divide factor 1) with sum-only collectives
    (gloo has no average or pre-multiplied sum), because the learner's per-rank losses already
    carry the whole minibatch's normalisers (:func:`ebrl.algos.loss.sgd_update`).

    Every rank must then run the same forwards and backwards in the same order (each all-gathers
    and reduce-scatters), and the same parameters must get gradients on every rank (a parameter
    left out on one rank only would desynchronise the reduce-scatter): a shard may be empty, but
    its forward still runs. The learner's loop guarantees both.

    Args:
        module: the model; its parameters become ``DTensor`` shards (dim 0 over the ranks).
            Any optimiser built on the old parameters is stale: :func:`shard_optimizer`.
        dp: the group (``dp.mesh``).
        methods: methods of ``module`` called instead of ``forward`` (a policy's ``dist``,
            ``value``); FSDP gathers the root's parameters around each (:func:`_hook_method`).
        reshard_root: free the root's gathered parameters after each forward (None: FSDP's
            default, keep them until the backward; True for a model that never runs backward).
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not dp.sharded:
        raise ValueError(f"shard_module: {dp} is not an FSDP group (strategy 'fsdp')")
    # FSDP2 warns at every forward that returns a view (a value head's squeeze, a dist's loc):
    # an in-place op on it would skip the backward's all-gather. The learner takes none on a
    # policy's outputs: tests/test_fsdp_quiet.py holds 2 ranks' update to one rank's
    warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor")
    for unit in shard_units(module):
        fully_shard(unit, mesh=dp.mesh)
    fully_shard(module, mesh=dp.mesh, reshard_after_forward=reshard_root)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    for name in methods:
        _hook_method(module, name)


def _hook_method(module: nn.Module, name: str) -> None:
    """Make ``module.<name>`` a forward of ``module``'s FSDP root unit.

    FSDP2 runs its pre-forward (gather) and post-forward around a method registered with
    :func:`~torch.distributed.fsdp.register_fsdp_forward_method`, and hooks the output's tensors
    for the backward: the root's gradients are reduce-scattered, and its parameters resharded,
    only if one of them is reached. It finds tensors in tuples, lists and dicts, not inside a
    ``torch.distributions`` object, which is what a policy's ``dist`` returns (its ``loc`` and
    ``scale``). So the method FSDP wraps is a twin that returns ``(output, its tensors)``, and
    ``module.<name>`` returns the output alone: the same object, computed by the same code.
    """
    from torch.distributed.fsdp import register_fsdp_forward_method

    orig = getattr(module, name)
    twin = f"_fsdp_{name}"

    def exposed(*args: Any, **kwargs: Any) -> tuple[Any, list[Tensor]]:
        out = orig(*args, **kwargs)
        inside = []
        if isinstance(out, torch.distributions.Distribution):
            inside = [v for v in vars(out).values() if torch.is_tensor(v)]
        return out, inside

    object.__setattr__(module, twin, exposed)
    register_fsdp_forward_method(module, twin)  # replaces it with FSDP's wrapper of it
    wrapped = getattr(module, twin)

    def method(*args: Any, **kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)[0]

    object.__setattr__(module, name, method)


def reshard(module: nn.Module) -> None:
    """Free every gathered (unsharded) parameter of ``module``'s FSDP units: a rank then holds
    its shards only. A forward without a backward (the KL early stop's, any ``no_grad`` one)
    leaves the root's parameters gathered until this is called."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def gather_full(obj: Any, keep: bool = True) -> Any:
    """``obj`` (a state dict, an optimiser's state dict: nested dicts, lists and tuples) with
    every ``DTensor`` all-gathered to its full tensor and every tensor copied to the CPU.

    A collective: every rank calls it on alike-shaped ``obj`` (it walks ``obj`` in order and
    gathers one tensor at a time, so a rank holds at most one full tensor besides its result).
    ``keep=False`` takes part in the gathers and returns None (a rank that needs no copy).
    A module state dict's ``_metadata`` is kept, for ``load_state_dict``.
    """
    out = _gather(obj, keep)
    return out if keep else None


def _gather(obj: Any, keep: bool) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        full = obj.full_tensor()
        return full.detach().cpu() if keep else None
    if torch.is_tensor(obj):
        return obj.detach().cpu().clone() if keep else None
    if isinstance(obj, dict):
        out = type(obj)((k, _gather(v, keep)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [_gather(v, keep) for v in obj]
    if type(obj) is tuple:
        return tuple(_gather(v, keep) for v in obj)
    return obj


def shard_like(full: Tensor, param: Tensor) -> Tensor:
    """This rank's shard of ``full``, sharded as ``param`` is (``full`` itself where ``param``
    is not a DTensor or the shapes differ, e.g. Adam's scalar ``step``). Every rank holds the
    same ``full``, so each takes its own part and nothing is communicated."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor) or tuple(full.shape) != tuple(param.shape):
        return full
    return distribute_tensor(
        full.to(param.device, param.dtype), param.device_mesh, param.placements, src_data_rank=None
    )


def shard_optimizer(
    optimizer: torch.optim.Optimizer,
    module: nn.Module,
    dp: DataParallel,
    methods: Collection[str] = (),
    reshard_root: bool | None = None,
) -> torch.optim.Optimizer:
    """Shard ``module`` (:func:`shard_module`) together with its optimiser, state included.

    ``optimizer`` (over ``module``'s parameters, with whatever state it has: a resumed
    checkpoint's) is rebuilt, same class, same settings and param groups, on the sharded
    parameters, and its state is sharded like them; step counters and every param-group entry
    (learning rate, the env steps :func:`ebrl.algos.loss.anneal_lr` counts) carry over.

    Returns:
        The new optimiser; the old one must not be stepped again.
    """
    names = {id(p): n for n, p in module.named_parameters()}
    missing = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in names]
    if missing:
        raise ValueError(
            f"shard_optimizer: {len(missing)} of the optimiser's parameters are not the module's; "
            "FSDP can shard only an optimiser over the module it shards"
        )
    groups = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    state = optimizer.state_dict()  # keyed by position over the param groups
    shard_module(module, dp, methods, reshard_root)
    params = dict(module.named_parameters())
    new = type(optimizer)(
        [{"params": [params[n] for n in g]} for g in groups], **optimizer.defaults
    )
    order = [params[n] for g in groups for n in g]
    state["state"] = {
        i: {k: shard_like(v, order[i]) if torch.is_tensor(v) else v for k, v in s.items()}
        for i, s in state["state"].items()
    }
    new.load_state_dict(state)
    return new


def held_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of parameters and of optimiser state this rank holds (a DTensor's local shard only;
    buffers and gathered copies in flight not counted): ``{"params": ..., "optimizer": ...}``."""
    from torch.distributed.tensor import DTensor

    def size(t: Tensor) -> int:
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    params = sum(size(p) for p in module.parameters())
    opt = 0
    if optimizer is not None:
        opt = sum(
            size(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
        )
    return {"params": params, "optimizer": opt}


def resolve_backend(
    backend: str, device: torch.device | str | None = None, shares_gpu: bool = False
) -> str:
    """The torch.distributed backend for learner ranks on ``device``.

    ``"auto"`` picks NCCL for a CUDA device of this rank's own and gloo otherwise: on the CPU,
    and where another rank computes on the same GPU (``shares_gpu``: ranks given shares of one
    GPU, MPS quotas or not), which NCCL refuses ("Duplicate GPU detected"; gloo reduces CUDA
    tensors through the host). NCCL is refused (RuntimeError naming the fix) where this process
    has no CUDA, the learner's tensors live on the CPU, or the GPU is shared.
    """
    dev = torch.device(device) if device is not None else None
    if backend == "auto":
        own_gpu = dev is not None and dev.type == "cuda" and not shares_gpu
        backend = "nccl" if own_gpu else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"data-parallel backend {backend!r}: expected 'auto', 'gloo' or 'nccl'")
    if backend == "nccl" and shares_gpu:
        raise RuntimeError(
            "data-parallel backend 'nccl' needs a GPU per learner rank, and another rank "
            "computes on this rank's GPU (NCCL refuses two ranks on one GPU, under MPS too); "
            "use backend 'auto' (gloo where ranks share a GPU), or give each rank a whole GPU "
            "(scale.learner_gpus=1)"
        )
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
    strategy: str = "ddp",
) -> DataParallel:
    """Join the default torch.distributed group of ``world`` learner ranks; returns this rank's
    :class:`DataParallel`.

    Every rank calls it with the same ``address`` (rank 0 listens there: pick it with
    :func:`free_port` on rank 0's host) and blocks until all ``world`` ranks joined or
    ``timeout_s`` passed (then torch raises). ``timeout_s`` also bounds every later collective,
    so a rank that died mid-update is noticed. Undo with :func:`destroy`.

    The ranks tell each other what devices they see (:func:`rank_devices`, through the
    rendezvous store) and every rank takes the same backend from that (:func:`choose_backend`:
    NCCL where each rank owns its GPUs, gloo where they share one or have none); the choice and
    its reason are logged and kept on the result (``backend``, ``why``).

    Args:
        rank: this rank.
        world: number of ranks.
        address: (host, port) of rank 0's rendezvous store (TCP).
        backend: "gloo", "nccl", or "auto" (from the ranks' devices).
        timeout_s: rendezvous and collective timeout.
        device: the learner's device; with NCCL it becomes this process's current CUDA device
            (default: the current one). FSDP's mesh is on its device type.
        strategy: ``"ddp"`` or ``"fsdp"`` (:class:`DataParallel`).
    """
    if strategy not in STRATEGIES:  # refused before any rank waits at the rendezvous
        raise ValueError(f"init_group: strategy {strategy!r}: expected one of {STRATEGIES}")
    if backend != "auto":  # a bad choice by name is refused before any rank waits
        resolve_backend(backend, device)
    if tdist.is_initialized():
        raise RuntimeError(
            "init_group: torch.distributed is already initialised in this process; "
            "call ebrl.runtime.dist.destroy() first"
        )
    host, port = address
    store = tdist.TCPStore(
        host.strip("[]"),
        int(port),
        world,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    dev = torch.device(device) if device is not None else None
    views = [
        RankDevices.loads(v)
        for v in exchange(store, rank, world, "devices", rank_devices(dev).dumps())
    ]
    backend, why = choose_backend(views, backend)
    # a GPU learner on gloo reduces through the host: worth a warning (Ray shows workers' only)
    say = log.warning if backend == "gloo" and dev is not None and dev.type == "cuda" else log.info
    say("learner rank %d of %d: torch.distributed backend %s: %s", rank, world, backend, why)
    comm_device = torch.device("cpu")
    if backend == "nccl":
        comm_device = dev if dev is not None else torch.device("cuda")
        if comm_device.index is None:
            comm_device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(comm_device)
    tdist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    learner = dev if dev is not None else comm_device
    return DataParallel(
        rank, world, device=comm_device, strategy=strategy, learner_device=learner,
        backend=backend, why=why,
    )  # fmt: skip


@dataclass(frozen=True)
class RankDevices:
    """What one rank's process sees of the GPUs: what :func:`choose_backend` decides from.

    Attributes:
        host: the machine's name.
        device: the device type the rank computes on (``cuda`` or ``cpu``).
        visible: ``CUDA_VISIBLE_DEVICES`` as the process sees it (None: unset).
        count: CUDA devices torch sees in the process (0 where torch has no CUDA).
        gpus: the physical GPUs the rank computes on, named so that two ranks on one GPU give
            the same name (``host/<UUID>``, or ``host/<CUDA_VISIBLE_DEVICES entry>`` where torch
            gives no UUID); empty where the rank computes on the CPU or sees no GPU.
    """

    host: str
    device: str
    visible: str | None
    count: int
    gpus: tuple[str, ...]

    def dumps(self) -> str:
        return json.dumps([self.host, self.device, self.visible, self.count, list(self.gpus)])

    @classmethod
    def loads(cls, text: str) -> RankDevices:
        host, device, visible, count, gpus = json.loads(text)
        return cls(host, device, visible, int(count), tuple(gpus))


def rank_devices(
    device: torch.device | str | None,
    env: Mapping[str, str] | None = None,
    count: int | None = None,
    uuid_of: Callable[[int], str | None] | None = None,
    host: str | None = None,
) -> RankDevices:
    """What this process sees (:class:`RankDevices`) for a rank computing on ``device``.

    The arguments after ``device`` default to this process's own (``os.environ``, torch's CUDA
    device count, each device's UUID, the host name); tests give fake layouts through them.
    A rank on a GPU names every GPU it sees (a rank owns all of them, or shares).
    """
    env = os.environ if env is None else env
    host = socket.gethostname() if host is None else host
    visible = env.get("CUDA_VISIBLE_DEVICES")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if count is None:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if uuid_of is None:
        uuid_of = _cuda_uuid
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else []
    gpus: list[str] = []
    if dev.type == "cuda":
        for i in range(count):
            name = uuid_of(i) or (entries[i] if i < len(entries) else str(i))
            gpus.append(f"{host}/{name}")
    return RankDevices(host, dev.type, visible, int(count), tuple(gpus))


def _cuda_uuid(index: int) -> str | None:
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid else getattr(props, "pci_bus_id", None)


def choose_backend(views: Sequence[RankDevices], asked: str = "auto") -> tuple[str, str]:
    """The backend every rank of a group takes, from what each sees; ``(backend, why)``.

    NCCL where every rank computes on GPUs of its own (no physical GPU seen by two ranks) and
    this torch has NCCL; gloo where a rank computes on the CPU or sees no GPU, or two ranks
    share a GPU (NCCL refuses them: "Duplicate GPU detected", MPS quotas or not). ``asked``
    "gloo" is kept; "nccl" where the ranks cannot have it is refused with the reason and the fix.
    """
    if asked not in ("auto", *BACKENDS):
        raise ValueError(f"data-parallel backend {asked!r}: expected 'auto', 'gloo' or 'nccl'")
    problem = None
    for r, v in enumerate(views):
        if v.device != "cuda":
            problem = f"rank {r} computes on the {v.device}"
        elif not v.gpus:
            problem = (
                f"rank {r} sees no GPU (CUDA_VISIBLE_DEVICES={v.visible}, torch sees "
                f"{v.count} CUDA devices)"
            )
        if problem:
            break
    if problem is None:
        owner: dict[str, int] = {}
        for r, v in enumerate(views):
            for g in v.gpus:
                if g in owner:
                    problem = f"ranks {owner[g]} and {r} share GPU {g}"
                    break
                owner[g] = r
            if problem:
                break
    if problem is None and not tdist.is_nccl_available():
        problem = "this torch has no NCCL"
    if asked == "gloo":
        return "gloo", "asked for by name" + (f" ({problem})" if problem else "")
    if problem is None:
        owned = "; ".join(f"rank {r}: {', '.join(v.gpus)}" for r, v in enumerate(views))
        return "nccl", f"each of the {len(views)} ranks owns its GPUs ({owned})"
    if asked == "nccl":
        raise RuntimeError(
            f"data-parallel backend 'nccl' needs a GPU of its own per rank, and {problem}; "
            "use backend 'auto' (gloo there), or give each rank its own GPU (a whole GPU per "
            "learner rank: scale.learner_gpus=1, ranks spread over the GPUs)"
        )
    return "gloo", problem


def devices_of(
    module: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, set[str]]:
    """The device types of what a learner rank holds: ``{"params", "grads", "optimizer"}`` ->
    the set of device types of its parameters (a DTensor's local shard), their gradients and
    the optimiser's state tensors, its scalar step counters aside (sets are empty where there
    is nothing yet).

    After sharding, every set must be the learner's device type alone: a ``cpu`` among a GPU
    learner's (or ``cuda`` among a CPU one's) means FSDP, a checkpoint load or the optimiser
    moved part of the learner off its device.
    """
    from torch.distributed.tensor import DTensor

    def kind(t: Tensor) -> str:
        return (t.to_local() if isinstance(t, DTensor) else t).device.type

    params = list(module.parameters())
    out: dict[str, set[str]] = {
        "params": {kind(p) for p in params},
        "grads": {kind(p.grad) for p in params if p.grad is not None},
        "optimizer": set(),
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            # Adam's ``step`` is a 0-dim CPU counter by design (torch keeps it on the host
            # unless ``capturable``): not a state tensor that follows the parameters
            out["optimizer"] |= {kind(v) for v in state.values() if torch.is_tensor(v) and v.ndim}
    return out


def exchange(store: Any, rank: int, world: int, key: str, value: str) -> list[str]:
    """Every rank's ``value`` of ``key``, by rank, through the rendezvous store (each rank
    waits until all have written theirs)."""
    store.set(f"ebrl/{key}/{rank}", value)
    return [bytes(store.get(f"ebrl/{key}/{r}")).decode() for r in range(world)]


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
