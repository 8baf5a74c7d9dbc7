"""The weights across nodes: one collective per update, onto a board on every other node.

A weight board (:mod:`ebrl.runtime.weight_board`) reaches the processes of its own machine
only. Where the wiring knows the replicas' Ray nodes, a replica on another node than the
leader's reads its node's board, which one replica of that node (its receiver, a thread:
:class:`Receiver`) writes from the leader's broadcast: after every publish the leader sends the
same bytes (the board's layout, :mod:`ebrl.runtime.weight_layout`, in the learner's own dtypes,
the changing tensors after the first whole one) to every node's receiver in one
torch.distributed group of its own (:class:`Caster`; gloo, or NCCL where every member owns its
GPU: :func:`ebrl.runtime.dist_group.choose_backend`), in buckets of at most :data:`CAST_BUCKET`
bytes, and returns once every node's board holds the version, so a replica told the version finds
it there. One copy crosses to each node per update, instead of a pickled state dict per replica.
The broadcast's seconds are ``pipeline/weights_cast_s`` (within ``pipeline/weights_publish_s``);
a load from a node's board is a ``load`` span with source ``collective``.

A replica attaches to the board it reads, the leader's or its node's, with :func:`open_board`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ebrl.runtime.weight_board import BoardReader, BoardSpec, WeightBoard
from ebrl.runtime.weight_layout import ALIGN, Entry, dtype_of, entry_bytes

log = logging.getLogger(__name__)

#: the most bytes one broadcast carries (a state dict goes in buckets of at most this, a tensor
#: larger than it alone): bounds the staging memory on either side
CAST_BUCKET = 256 << 20
#: the header's fields: version, whole (1: every tensor; 0: the changing ones), stop (1: the
#: receivers leave)
_HEADER_FIELDS = 3


@dataclass(frozen=True)
class CastSpec:
    """Where the leader and the node receivers meet: the leader's side of the collective.

    Attributes:
        address: (host, port) of the leader's rendezvous store (it listens; the receivers and
            the other replicas of their nodes connect).
        receivers: N, one per node with replicas other than the leader's: the group is the
            leader (rank 0) and the receivers (ranks 1..N).
        timeout_s: the rendezvous's and every broadcast's timeout.
    """

    address: tuple[str, int]
    receivers: int
    timeout_s: float = 300.0


@dataclass(frozen=True)
class NodeBoard:
    """A replica's link to its node's board, which the collective fills (what the wiring gives
    a replica on another node than the leader's, in place of the leader's :class:`BoardSpec`).

    Attributes:
        cast: the group.
        node: this node's receiver's rank in the group (1..N).
        layout: the leader's board spec: the layout every node's board has.
        receiver: this replica runs its node's receiver (the first replica of the node).
    """

    cast: CastSpec
    node: int
    layout: BoardSpec
    receiver: bool = False


def cast_address() -> tuple[str, int] | None:
    """An address for the leader's end of the collective: this node's address as the other
    nodes reach it, and a port free there now (None where that address cannot be bound here:
    replicas on other nodes then get the weights inline)."""
    from ebrl.runtime.channel import node_ip
    from ebrl.runtime.dist_group import free_port

    host = node_ip()
    try:
        return host, free_port(host)
    except OSError as e:
        log.warning("weights: cannot listen on %s (%s): other nodes get them inline", host, e)
        return None


def buckets(entries: tuple[Entry, ...], limit: int | None = None) -> list[list[tuple[Entry, int]]]:
    """``entries`` split into consecutive buckets of at most ``limit`` bytes (a larger tensor
    is a bucket alone), each entry with its byte offset in its bucket (ALIGN-aligned, so that a
    view of the bucket's bytes as the tensor's dtype is aligned). Sender and receivers derive
    the same buckets from the same layout (``limit`` None: :data:`CAST_BUCKET`)."""
    limit = CAST_BUCKET if limit is None else limit
    out: list[list[tuple[Entry, int]]] = []
    cur: list[tuple[Entry, int]] = []
    end = 0
    for e in entries:
        n = entry_bytes(e[1], e[2])
        if n == 0:
            continue
        off = -(-end // ALIGN) * ALIGN
        if cur and off + n > limit:
            out.append(cur)
            cur, off = [], 0
        cur.append((e, off))
        end = off + n
    if cur:
        out.append(cur)
    return out


def bucket_bytes(bucket: list[tuple[Entry, int]]) -> int:
    """The bytes a bucket's broadcast carries (its last tensor's end)."""
    (_, dtype, shape, _), off = bucket[-1]
    return off + entry_bytes(dtype, shape)


def _bucket_views(buf: torch.Tensor, bucket: list[tuple[Entry, int]]) -> dict[str, torch.Tensor]:
    """The tensors of a bucket, as views of its bytes ``buf`` (uint8)."""
    out = {}
    for (key, dtype, shape, _), off in bucket:
        n = entry_bytes(dtype, shape)
        out[key] = buf[off : off + n].view(dtype_of(dtype)).view(shape)
    return out


def _store(cast: CastSpec, master: bool) -> Any:
    """The leader's rendezvous store (``master``: listen) or a connection to it."""
    import torch.distributed as tdist

    host, port = cast.address
    return tdist.TCPStore(
        host.strip("[]"),
        int(port),
        None,
        is_master=master,
        timeout=timedelta(seconds=cast.timeout_s),
        wait_for_workers=False,
    )


class _Group:
    """The leader and the receivers as a torch.distributed group of their own (not the default
    group: the leader's is its learner ranks'), its backend chosen from what each member sees
    (:func:`ebrl.runtime.dist_group.choose_backend`: NCCL where each owns its GPU, else gloo)."""

    def __init__(self, store: Any, rank: int, cast: CastSpec, device: torch.device) -> None:
        import torch.distributed as tdist

        from ebrl.runtime.dist_group import RankDevices, choose_backend, exchange, rank_devices

        size = cast.receivers + 1
        mine = rank_devices(device).dumps()
        views = [RankDevices.loads(v) for v in exchange(store, rank, size, "cast-devices", mine)]
        self.backend, self.why = choose_backend(views)
        timeout = timedelta(seconds=cast.timeout_s)
        prefixed = tdist.PrefixStore("ebrl/cast", store)
        if self.backend == "nccl":
            self.device = device if device.index is not None else torch.device("cuda", 0)
            torch.cuda.set_device(self.device)
            opts = tdist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg: Any = tdist.ProcessGroupNCCL(prefixed, rank, size, opts)
        else:
            self.device = torch.device("cpu")
            self.pg = tdist.ProcessGroupGloo(prefixed, rank, size, timeout)
        self._opts = tdist.BroadcastOptions()
        self._opts.rootRank = 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.pg.broadcast([tensor], self._opts).wait()

    def ack(self) -> None:
        """Every member got this far (a one-element all-reduce)."""
        self.pg.allreduce([torch.ones(1, device=self.device)]).wait()


class Caster:
    """The leader's side: after each publish, the weights (the board's layout, in the learner's
    own dtypes) go to every node receiver by broadcast, in buckets (:func:`buckets`), the whole
    state the first time and the changing tensors after; it returns once every receiver has
    them on its node's board, so a replica told the version finds it there.

    Args:
        cast: the group (this process listens at ``cast.address``).
        spec: the leader's board spec (the layout).
        device: where the learner's weights live.
    """

    def __init__(self, cast: CastSpec, spec: BoardSpec, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.receivers = cast.receivers
        self._store = _store(cast, master=True)
        self.group = _Group(self._store, 0, cast, torch.device(device))
        self._sent_whole = False
        self.casts = 0
        self.seconds = 0.0
        self.last_bytes = 0
        log.info(
            "weights: broadcast to %d node receiver(s) over %s (%s)",
            self.receivers, self.group.backend, self.group.why,
        )  # fmt: skip

    def _header(self, version: int, whole: bool, stop: bool) -> None:
        h = torch.tensor([version, int(whole), int(stop)], dtype=torch.int64)
        self.group.broadcast(h.to(self.group.device))

    def cast(self, version: int, state: Mapping[str, torch.Tensor], whole: bool = False) -> float:
        """Send ``version``'s ``state`` (the whole of it when ``whole`` or never sent whole
        before, else its changing tensors); returns the seconds until every receiver holds it."""
        t0 = time.perf_counter()
        whole = whole or not self._sent_whole
        self._header(version, whole, False)
        nbytes = 0
        dev = self.group.device
        with torch.no_grad():
            for bucket in buckets(self.spec.entries(whole)):
                buf = torch.empty(bucket_bytes(bucket), dtype=torch.uint8, device=dev)
                for key, view in _bucket_views(buf, bucket).items():
                    view.copy_(state[key].detach())
                self.group.broadcast(buf)
                nbytes += buf.numel()
        self.group.ack()
        self._sent_whole = True
        dt = time.perf_counter() - t0
        self.casts += 1
        self.seconds += dt
        self.last_bytes = nbytes
        return dt

    def metrics(self) -> dict[str, float]:
        """``pipeline/weights_cast_*``: seconds per update (mean), bytes of the last, the
        receivers, and the backend (``nccl`` 1, gloo 0)."""
        return {
            "pipeline/weights_cast_s": self.seconds / max(1, self.casts),
            "pipeline/weights_cast_mb": self.last_bytes / 2**20,
            "pipeline/weights_cast_nodes": float(self.receivers),
            "pipeline/weights_cast_nccl": float(self.group.backend == "nccl"),
        }

    def close(self) -> None:
        """Tell the receivers to leave (best effort: one may be gone already)."""
        with contextlib.suppress(Exception):
            self._header(-1, False, True)


class Receiver:
    """A node's receiver: a thread of one replica's process that takes every broadcast of the
    leader (:class:`Caster`) onto this node's board, which the node's replicas read as they
    read the leader's. The board is named for this process (its pid; the orphan watchdog and
    this process's resource tracker remove it when the process is gone).

    Args:
        ref: this node's link (``ref.receiver``).
    """

    def __init__(self, ref: NodeBoard) -> None:
        self.ref = ref
        layout = ref.layout
        empty = {
            key: torch.empty(shape, dtype=dtype_of(dtype)) for key, dtype, shape, _ in layout.layout
        }
        self.board = WeightBoard.create(empty, os.getpid(), layout.changing)
        self.versions = 0
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._store = _store(ref.cast, master=False)
        # the node's other replicas read the board's name from the leader's store
        self._store.set(_board_key(ref.node), pickle.dumps(self.board.spec))
        self._thread = threading.Thread(target=self._run, daemon=True, name="ebrl-weights-rx")
        self._thread.start()

    def _run(self) -> None:
        ref = self.ref
        try:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            group = _Group(self._store, ref.node, ref.cast, device)
            log.info("weights: node receiver %d over %s (%s)", ref.node, group.backend, group.why)
            while self._step(group):
                pass
        except BaseException as e:  # the replica reads on; the leader's broadcast fails loudly
            self.error = e
            log.error("weights: node receiver %d stopped: %s", ref.node, e)

    def _step(self, group: _Group) -> bool:
        """One update from the leader onto the board; False at the leader's stop."""
        h = torch.zeros(_HEADER_FIELDS, dtype=torch.int64, device=group.device)
        group.broadcast(h)
        version, whole, stop = (int(x) for x in h.tolist())
        if stop:
            return False
        t0 = time.perf_counter()
        board = self.board
        seq = board.begin()
        nbytes = 0
        with torch.no_grad():
            for bucket in buckets(board.spec.entries(bool(whole))):
                buf = torch.empty(bucket_bytes(bucket), dtype=torch.uint8, device=group.device)
                group.broadcast(buf)
                for key, view in _bucket_views(buf, bucket).items():
                    nbytes += board.write(key, view)
        board.commit(version, bool(whole), seq, nbytes)
        self.versions += 1
        self.seconds += time.perf_counter() - t0
        group.ack()  # the leader tells the replicas once every node's board holds it
        return True

    def close(self) -> None:
        """Remove the board (the thread, a daemon, ends with the leader's stop or the process)."""
        self.board.close()


def _board_key(node: int) -> str:
    return f"ebrl/cast/board/{node}"


def open_board(spec: BoardSpec | NodeBoard) -> BoardReader:
    """Attach to a board from a replica: the leader's (a :class:`BoardSpec`, any process on the
    writer's machine), or its node's (a :class:`NodeBoard`: the node's receiver creates the
    board and starts receiving; the node's other replicas wait for its name in the leader's
    store). The reader's ``path`` says which: ``board`` or ``collective``."""
    if isinstance(spec, BoardSpec):
        return BoardReader(spec)
    if spec.receiver:
        rx = Receiver(spec)
        reader = BoardReader(rx.board.spec, path="collective")
        reader.receiver = rx
        return reader
    store = _store(spec.cast, master=False)
    named = pickle.loads(bytes(store.get(_board_key(spec.node))))
    return BoardReader(named, path="collective")
