"""Joining and leaving the learner ranks' torch.distributed group, and choosing its backend.

The backend is chosen from what every rank sees (:func:`choose_backend` over each rank's
:func:`rank_devices`: its ``CUDA_VISIBLE_DEVICES``, torch's CUDA devices and their UUIDs): NCCL
where each rank owns its GPUs, gloo where a rank computes on the CPU, sees no GPU, or shares one
with another rank (NCCL refuses that); the choice and its reason are logged. :func:`init_group`
joins the group and returns this rank's :class:`ebrl.runtime.dist.DataParallel` (the
collectives the learner then takes part in); :func:`destroy` leaves it. :func:`exchange` and
:func:`free_port` are the rendezvous helpers, also used by the weight broadcast
(:mod:`ebrl.runtime.weight_cast`).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from ebrl.runtime.dist import STRATEGIES, DataParallel

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")


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
            "call ebrl.runtime.dist_group.destroy() first"
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
