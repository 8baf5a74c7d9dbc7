"""FSDP sharding of a learner rank's policy and optimiser (strategy ``"fsdp"``).

Under ``"fsdp"`` (:class:`ebrl.runtime.dist.DataParallel`, whose module docstring gives the
data-parallel arithmetic) torch's FSDP2 (:func:`torch.distributed.fsdp.fully_shard`) shards
every parameter along dim 0 over the ranks, and with it the gradients and Adam's moments:
between steps a rank holds about 1/L of them. A unit's parameters are all-gathered around its
forward and backward and its gradients reduce-scattered, SUMMED (divide factor 1, sum-only
collectives: :func:`shard_module`), so the per-rank losses' global normalisers keep their
meaning; each rank clips with the global gradient norm (torch's ``clip_grad_norm_`` reduces the
sharded norms) and steps its own shard. FSDP2 is the FSDP that runs here: FSDP1
(``FullyShardedDataParallel``) refuses a CPU-only process ("FSDP needs a non-CPU accelerator
device") and hooks ``forward`` only, while a policy is called through ``dist`` and ``value``,
which FSDP2 can hook too (:func:`~torch.distributed.fsdp.register_fsdp_forward_method`, through
:func:`_hook_method`). Units follow one rule, :func:`shard_units`. Full weights and a full
optimiser state (a one-rank learner's, exactly) come back from the shards with
:func:`gather_full`; :func:`shard_optimizer` goes the other way. :func:`held_bytes` and
:func:`devices_of` say what a rank then holds, and where.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from ebrl.runtime.dist import DataParallel

# torch.distributed.tensor and .fsdp are imported where FSDP is used, not here: they take ~1 s to
# import and every process that trains imports this module

Tensor = torch.Tensor


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
    (learning rate, the env steps :func:`ebrl.algos.optim.anneal_lr` counts) carry over.

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
