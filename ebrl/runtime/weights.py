"""The weight board: the learner's latest policy weights in one shared-memory segment.

After every update the learner publishes new weights to every generator replica on its machine.
Pickling a state dict through a socket per replica costs a serialisation, a kernel copy per
replica and an unpickle per replica; the board costs one copy into POSIX shared memory (from
the GPU, if the weights live there) and one copy out per replica, straight into the replica's
own tensors. Only a tiny message (the version) needs to travel, and a replica that misses
messages simply reads the latest weights when it next looks.

Layout of the segment: a 64-byte header, then every tensor of the state dict at a 64-byte
aligned offset (:class:`BoardSpec` records key, dtype, shape and offset)::

    [0:8)  seq      int64, even when the weights are whole, odd while the writer is copying
    [8:16) version  int64, the version of the weights below (-1: nothing published yet)
    [16:24) nbytes  int64, the segment's size as the spec says (a reader checks it)
    [24:32) magic   int64, marks the segment as a weight board
    [32:40) base    int64, the ``seq`` a publish of the whole state ended at (-1: none yet)

Only what trains is rewritten. A board made with ``changing`` (the keys an update can change: a
policy's parameters with ``requires_grad`` and its buffers; a VLA whose action expert alone
trains) has its whole state written by the first publish and by none after it unless asked
(``full=True``): later publishes copy the changing tensors only, the frozen ones staying on the
board as they are. A reader that copied the whole state into the same tensors before, at the
same ``base``, copies the changing tensors only too; any other read (a new reader, other
tensors, a whole publish since) copies everything. Both sides keep the seqlock, so a reader
still gets one version, whole.

Consistency is a seqlock, with one writer (the learner leader) and any number of readers that
never write: the writer makes ``seq`` odd, copies, writes ``version`` and makes ``seq`` even; a
reader waits for an even ``seq``, copies, re-reads ``seq`` and starts over if it moved. A reader
therefore never returns a torn mix of two versions, and never blocks the writer. It always gets
the *latest* version, which may be newer than the version in the message that made it look;
callers must use the version :meth:`BoardReader.read` returns, not the message's.

Memory ordering: on x86-64 stores become visible in program order and loads are not reordered
with other loads, which is all a seqlock needs. For weakly ordered CPUs (aarch64) the board puts a
lock acquire and release between the ``seq`` accesses and the copies (in CPython 3.11/3.12 on
Linux ``sem_trywait``/``sem_post``, which POSIX lists among the calls that synchronise memory);
this has been tested on x86-64 only. Torch's worker threads join before a copy returns.

Other nodes: a board reaches the processes of its own machine only. Where the wiring knows the
replicas' Ray nodes, a replica on another node than the leader's reads its node's board, which
one replica of that node (its receiver, a thread: :class:`Receiver`) writes from the leader's
broadcast: after every publish the leader sends the same bytes (the board's layout, in the
learner's own dtypes, the changing tensors after the first whole one) to every node's receiver
in one torch.distributed group of its own (:class:`Caster`; gloo, or NCCL where every member
owns its GPU: :func:`ebrl.runtime.dist.choose_backend`), in buckets of at most
:data:`CAST_BUCKET` bytes, and returns once every node's board holds the version, so a replica
told the version finds it there. One copy crosses to each node per update, instead of a pickled
state dict per replica. The broadcast's seconds are ``pipeline/weights_cast_s`` (within
``pipeline/weights_publish_s``); a load from a node's board is a ``load`` span with source
``collective``.

Shared-memory hygiene follows :mod:`ebrl.runtime.slots`: the segment is named
``ebrl_<driver pid>_wb<id>`` so that the orphan watchdog (:mod:`ebrl.runtime.watchdog`) removes it
when the driver dies, and the creating process's resource tracker holds it so that it is removed
when the creating process (the learner) dies. Readers map the file under ``/dev/shm`` themselves,
read-only, instead of attaching with :class:`multiprocessing.shared_memory.SharedMemory`: before
Python 3.13 attaching registers the segment with the reader's resource tracker, which unlinks it
when the reader exits (or, for a reader started by :mod:`multiprocessing` and sharing its
parent's tracker, would drop the writer's registration when undone).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import pickle
import threading
import time
import uuid
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import shared_memory
from types import TracebackType
from typing import Any, Self

import numpy as np
import psutil
import torch

from ebrl.runtime.slots import start_resource_tracker
from ebrl.runtime.watchdog import SHM_DIR, shm_prefix, sweep_dead_drivers

log = logging.getLogger(__name__)

#: header bytes before the first tensor; every tensor starts on a multiple of ALIGN
HEADER = 64
ALIGN = 64
_MAGIC = 0x31304257_4C524245  # b"EBRLWB01" little-endian
_SEQ, _VERSION, _NBYTES, _MAGIC_AT, _BASE = range(5)

#: (key, dtype name, shape, byte offset)
Entry = tuple[str, str, tuple[int, ...], int]

_barrier = threading.Lock()


def _fence() -> None:
    """Order the copies against the ``seq`` accesses on CPUs that would reorder them."""
    _barrier.acquire()
    _barrier.release()


@dataclass(frozen=True)
class BoardSpec:
    """What a reader needs to open a board: picklable, sent once to every replica.

    Attributes:
        name: the shared-memory segment's name (``ebrl_<driver pid>_wb<id>``).
        layout: per tensor, ``(key, dtype name, shape, byte offset)`` in state-dict order.
        nbytes: the segment's size, header included.
        changing: the keys a publish after the first rewrites (an update's trainable
            parameters and the buffers); None: every key.
        cast_at: where the writer meets the other nodes' receivers, should there be any
            (:func:`cast_address`; None: this board reaches its own node only).
    """

    name: str
    layout: tuple[Entry, ...]
    nbytes: int
    changing: tuple[str, ...] | None = None
    cast_at: tuple[str, int] | None = None

    def entries(self, whole: bool) -> tuple[Entry, ...]:
        """The layout's entries a copy touches: all of them (``whole``), else the changing."""
        if whole or self.changing is None:
            return self.layout
        keep = set(self.changing)
        return tuple(e for e in self.layout if e[0] in keep)


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"weight board: unknown dtype {name!r}")
    return dt


def _entry_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * _dtype(dtype).itemsize


def layout_of(state: Mapping[str, torch.Tensor]) -> tuple[tuple[Entry, ...], int]:
    """The board layout for a state dict, and the segment size it needs."""
    entries: list[Entry] = []
    off = HEADER
    for key, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"weight board: {key!r} is a {type(t).__name__}, not a tensor")
        dtype = str(t.dtype).removeprefix("torch.")
        shape = tuple(int(s) for s in t.shape)
        entries.append((key, dtype, shape, off))
        off += -(-_entry_bytes(dtype, shape) // ALIGN) * ALIGN
    return tuple(entries), off


def check_layout(layout: tuple[Entry, ...], state: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise :class:`ValueError` naming every difference between ``state`` and ``layout``."""
    want = {key: (dtype, tuple(shape)) for key, dtype, shape, _ in layout}
    problems = []
    missing = [k for k in want if k not in state]
    extra = [k for k in state if k not in want]
    if missing:
        problems.append(f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if extra:
        problems.append(f"unexpected keys {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    for key, (dtype, shape) in want.items():
        t = state.get(key)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            problems.append(f"{key!r} is a {type(t).__name__}, not a tensor")
            continue
        got_dtype, got_shape = str(t.dtype).removeprefix("torch."), tuple(t.shape)
        if (got_dtype, got_shape) != (dtype, shape):
            problems.append(
                f"{key!r} is {got_dtype}{list(got_shape)}, the board has {dtype}{list(shape)}"
            )
    if problems:
        raise ValueError(
            f"weight board: {what} does not match the board's layout: " + "; ".join(problems)
        )


def _views(buf: memoryview | mmap.mmap, layout: tuple[Entry, ...]) -> dict[str, torch.Tensor]:
    """Tensors over the segment's bytes, one per layout entry (read-only buffers warn: they
    are only ever copied from)."""
    views: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "the given buffer is not writable"
        for key, dtype, shape, off in layout:
            n = _entry_bytes(dtype, shape)
            if n == 0:
                views[key] = torch.empty(shape, dtype=_dtype(dtype))
                continue
            raw = np.frombuffer(buf, dtype=np.uint8, count=n, offset=off)
            views[key] = torch.from_numpy(raw).view(_dtype(dtype)).view(shape)
    return views


def _reserve(name: str, nbytes: int) -> None:
    """Allocate the segment's pages now: a tmpfs without room then fails here with ENOSPC,
    not with SIGBUS in the middle of a publish."""
    fd = os.open(SHM_DIR / name, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)


class WeightBoard:
    """The writer's side (the learner leader; one writer per board).

    Create it with :meth:`create`, send :attr:`spec` to the replicas once, then :meth:`publish`
    after every update and send the replicas only the version.
    """

    def __init__(self, shm: shared_memory.SharedMemory, spec: BoardSpec) -> None:
        self.spec = spec
        self._shm: shared_memory.SharedMemory | None = shm
        self._header = np.frombuffer(shm.buf, dtype=np.int64, count=5)
        self._views = _views(shm.buf, spec.layout)
        self._seq = 0
        #: the whole state is on the board (a publish of all of it completed)
        self._whole = False
        #: the collective to the other nodes' boards (:meth:`cast_to`); None: this node only
        self._cast: Caster | None = None
        #: bytes the last publish copied
        self.last_bytes = 0

    @classmethod
    def create(
        cls,
        state: Mapping[str, torch.Tensor],
        owner_pid: int,
        changing: Collection[str] | None = None,
        cast_at: tuple[str, int] | None = None,
    ) -> WeightBoard:
        """A new board sized for ``state`` (its keys, dtypes and shapes), nothing published.

        Args:
            state: a state dict of the policy whose weights the board will carry.
            owner_pid: the driver's pid, carried in the name so that the orphan watchdog (and
                any later :meth:`create` or :meth:`ebrl.runtime.slots.ShmSlots.create`) removes
                the segment once that process is gone. It must be a live process on this
                machine: a pid that does not exist here makes the board an orphan at once.
            changing: the keys of ``state`` an update can change (its trainable parameters and
                buffers): after the first publish only they are copied. None: every key.
            cast_at: the address the writer would broadcast from to other nodes
                (:func:`cast_address`; :meth:`cast_to` listens there), carried in the spec.
        """
        if changing is not None:
            unknown = sorted(set(changing) - set(state))
            if unknown:
                raise ValueError(
                    f"weight board: changing keys {unknown[:5]} are not in the state dict"
                )
            changing = tuple(k for k in state if k in set(changing))  # in layout order
        if not psutil.pid_exists(owner_pid):
            raise ValueError(
                f"weight board: owner pid {owner_pid} is not a process on this machine; the "
                "board would be swept as an orphan (pass the driver's pid, or this process's "
                "when the driver runs elsewhere)"
            )
        sweep_dead_drivers()
        layout, nbytes = layout_of(state)
        name = f"{shm_prefix(owner_pid)}wb{uuid.uuid4().hex[:12]}"
        start_resource_tracker()  # one that outlives Slurm's USR2 (ebrl.runtime.slots)
        shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        try:
            _reserve(name, nbytes)
        except OSError as e:
            shm.close()
            shm.unlink()
            raise OSError(
                e.errno,
                f"weight board: cannot reserve {nbytes} bytes in {SHM_DIR} ({e.strerror}); "
                "a container's /dev/shm may be too small (docker run --shm-size)",
            ) from e
        header = np.frombuffer(shm.buf, dtype=np.int64, count=5)
        header[:] = (0, -1, nbytes, _MAGIC, -1)
        del header
        spec = BoardSpec(
            name=name, layout=layout, nbytes=nbytes, changing=changing, cast_at=cast_at
        )
        return cls(shm, spec)

    @property
    def version(self) -> int:
        """The last version published (-1: none yet)."""
        return int(self._header[_VERSION]) if self._shm is not None else -1

    def publish(
        self, version: int, state: Mapping[str, torch.Tensor], *, full: bool = False
    ) -> float:
        """Copy ``state`` onto the board as ``version``; returns the seconds it took.

        The first publish (and one with ``full``, or after a publish that failed) copies the
        whole state; the others copy the spec's ``changing`` tensors only (``state`` may then
        hold just those). Tensors may sit on any device (a GPU's are copied to the host). A
        state whose keys, shapes or dtypes differ from the board's layout (or, after the first
        publish, whose changing tensors do) raises :class:`ValueError` before anything is
        written. Readers that look meanwhile wait for the copy to finish (they never see part
        of it). If a copy fails midway, the board stays "being written" (readers wait, then
        time out) until the next publish completes.
        """
        t0 = time.perf_counter()
        if self._shm is None:
            raise RuntimeError("weight board: publish after close")
        if version < 0:
            raise ValueError(f"weight board: versions are >= 0, got {version}")
        whole = full or not self._whole
        entries = self.spec.entries(whole)
        if whole:
            check_layout(entries, state, "the published state")
        else:
            missing = [e[0] for e in entries if e[0] not in state]
            if missing:
                raise ValueError(
                    f"weight board: the published state lacks changing keys {missing[:5]}"
                )
            check_layout(entries, {e[0]: state[e[0]] for e in entries}, "the published state")
        seq = self._begin()
        nbytes = 0
        with torch.no_grad():
            for key, *_ in entries:
                nbytes += self._write(key, state[key])
        self._commit(version, whole, seq, nbytes)
        cast = self._cast
        if cast is not None:  # the other nodes' boards, by the collective
            cast.cast(version, state, whole)
        return time.perf_counter() - t0

    def _begin(self) -> int:
        """Mark the board as being written (``seq`` odd); returns that ``seq``."""
        if self._shm is None:
            raise RuntimeError("weight board: write after close")
        seq = self._seq if self._seq % 2 else self._seq + 1  # odd: a failed publish left it so
        self._seq = seq
        self._whole = False  # until this copy completes (a failed one: the next is whole)
        self._header[_SEQ] = seq
        _fence()
        return seq

    def _write(self, key: str, tensor: torch.Tensor) -> int:
        """Copy one tensor onto the board (between :meth:`_begin` and :meth:`_commit`);
        returns the bytes copied."""
        view = self._views[key]
        if not view.numel():
            return 0
        view.copy_(tensor.detach())
        return view.numel() * view.element_size()

    def _commit(self, version: int, whole: bool, seq: int, nbytes: int) -> None:
        """The copy begun at ``seq`` is complete: ``version`` is on the board (``seq`` even)."""
        self._header[_VERSION] = version
        if whole:
            self._header[_BASE] = seq + 1
        _fence()
        self._seq = seq + 1
        self._header[_SEQ] = seq + 1
        self._whole = True
        self.last_bytes = nbytes

    def cast_to(self, cast: CastSpec, device: torch.device | str = "cpu") -> None:
        """From now on every :meth:`publish` also sends the weights to the node receivers of
        ``cast`` (one collective per update, :class:`Caster`); joins their group now (blocks
        until every receiver joined, or ``cast.timeout_s``).

        Args:
            cast: where the group meets (the leader's store) and how many receivers.
            device: where the learner's weights live (the group's backend follows it).
        """
        self._cast = Caster(cast, self.spec, device)

    def cast_metrics(self) -> dict[str, float]:
        """The collective's metrics so far (empty where no other node gets the weights)."""
        return self._cast.metrics() if self._cast is not None else {}

    def close(self) -> None:
        """Unmap and unlink the segment (idempotent). Readers already attached keep their
        mapping until they close; no new reader can open it. Stops the node receivers."""
        cast, self._cast = self._cast, None
        if cast is not None:
            cast.close()
        shm, self._shm = self._shm, None
        if shm is None:
            return
        self._views.clear()
        self._header = np.zeros(5, dtype=np.int64)
        try:  # unlink first: a view still held elsewhere must not keep the name alive
            shm.unlink()
        except FileNotFoundError:  # swept already; the tracker must forget it all the same
            from ebrl.runtime.slots import _untrack

            _untrack(shm)
        with contextlib.suppress(BufferError):  # a view escaped: the mapping goes with it
            shm.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class BoardReader:
    """A replica's side: maps the board read-only and copies the latest weights out.

    It never registers the segment with a resource tracker and never unlinks it, so a reader's
    exit (clean or not) leaves the board to its writer.

    Attributes:
        retries: reads started over because the writer was copying (a statistic).
        last_bytes: bytes the last completed read copied.
    """

    def __init__(self, spec: BoardSpec, path: str = "board") -> None:
        self.spec = spec
        #: how the weights reach this board: "board" (the leader writes it), "collective" (a
        #: node receiver writes what the leader broadcast)
        self.path = path
        #: the node's receiver, where this replica runs it (closed with the reader)
        self.receiver: Receiver | None = None
        self.retries = 0
        self.last_bytes = 0
        #: (the tensors the last read filled whole or in part, the base they hold): a read
        #: into them again at that base copies the changing tensors only
        self._holds: tuple[dict[str, torch.Tensor], int] | None = None
        path = SHM_DIR / spec.name
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"weight board {spec.name!r} does not exist (closed by its writer, or swept "
                "because its owner pid is gone)"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size < spec.nbytes:
                raise ValueError(
                    f"weight board {spec.name!r}: segment has {size} bytes, spec {spec.nbytes}"
                )
            self._mm: mmap.mmap | None = mmap.mmap(fd, spec.nbytes, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._header = np.frombuffer(self._mm, dtype=np.int64, count=5)
        if int(self._header[_MAGIC_AT]) != _MAGIC or int(self._header[_NBYTES]) != spec.nbytes:
            self.close()
            raise ValueError(f"weight board {spec.name!r}: not a board made for this spec")
        self._views = _views(self._mm, spec.layout)

    def _even_seq(self, deadline: float | None) -> int:
        """Wait until the writer is not copying; returns ``seq``."""
        waits = 0
        while True:
            seq = int(self._header[_SEQ])
            if seq % 2 == 0:
                return seq
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"weight board {self.spec.name!r}: the writer has been copying for too long "
                    "(did it die mid-publish?)"
                )
            # spin briefly (a publish takes ~ms), then back off to at most 1 ms sleeps
            time.sleep(0 if waits < 50 else min(1e-3, 1e-5 * 2 ** min(waits - 50, 7)))
            waits += 1

    def version(self, timeout: float | None = 60.0) -> int:
        """The latest published version (-1: none yet); waits out a publish in progress."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seq = self._even_seq(deadline)
            version = int(self._header[_VERSION])
            _fence()
            if int(self._header[_SEQ]) == seq:
                return version

    def read(
        self, into: dict[str, torch.Tensor] | None = None, *, timeout: float | None = 60.0
    ) -> tuple[int, dict[str, torch.Tensor]]:
        """A consistent snapshot of the latest weights: ``(version, state)``.

        Args:
            into: tensors to copy into in place (e.g. ``policy.state_dict()``, whose tensors
                share storage with the parameters: the policy is updated with no allocation and
                no ``load_state_dict``; set ``policy.version`` to the returned version). They
                may sit on any device. Keys, shapes and dtypes must match the layout
                (:class:`ValueError` otherwise). When a read is started over, ``into`` holds a
                mix until the retry completes; on :class:`TimeoutError` it may be left so.
            timeout: seconds to wait for the writer to finish a publish (None: forever).

        Returns:
            The version and ``into`` (or new CPU tensors). Before the first publish:
            ``(-1, into)`` with ``into`` untouched, or ``(-1, {})``.
        """
        if into is not None:
            check_layout(self.spec.layout, into, "the tensors to read into")
        deadline = None if timeout is None else time.monotonic() + timeout
        out: dict[str, torch.Tensor] | None = into
        while True:
            seq = self._even_seq(deadline)
            version = int(self._header[_VERSION])
            if version < 0:
                _fence()
                if int(self._header[_SEQ]) == seq:
                    return -1, into if into is not None else {}
                continue
            base = int(self._header[_BASE])
            if out is None:
                out = {k: torch.empty_like(v) for k, v in self._views.items()}
            # the frozen tensors are in ``out`` already when it is what the last read filled,
            # from the same whole publish
            holds, self._holds = self._holds, None  # a torn copy holds nothing
            whole = holds is None or holds[0] is not out or holds[1] != base
            nbytes = 0
            _fence()
            with torch.no_grad():
                for key, *_ in self.spec.entries(whole):
                    view = self._views[key]
                    if view.numel():
                        out[key].copy_(view)
                        nbytes += view.numel() * view.element_size()
            _fence()
            if int(self._header[_SEQ]) == seq:
                self._holds = (out, base)
                self.last_bytes = nbytes
                return version, out
            self.retries += 1
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"weight board {self.spec.name!r}: no read completed between publishes "
                    f"within the timeout ({self.retries} retries)"
                )

    def close(self) -> None:
        """Unmap (idempotent); never unlinks (a node's receiver, if it runs here, removes its
        board)."""
        rx, self.receiver = self.receiver, None
        mm, self._mm = self._mm, None
        if mm is not None:
            self._views = {}
            self._holds = None
            self._header = np.full(5, -1, dtype=np.int64)
            with contextlib.suppress(BufferError):  # a view escaped: the mapping goes with it
                mm.close()
        if rx is not None:
            rx.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# --- the weights across nodes: one collective per update ----------------------------------------
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
    from ebrl.runtime.dist import free_port

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
        n = _entry_bytes(e[1], e[2])
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
    (_, dtype, shape, _), off = bucket[-1]
    return off + _entry_bytes(dtype, shape)


def _bucket_views(buf: torch.Tensor, bucket: list[tuple[Entry, int]]) -> dict[str, torch.Tensor]:
    """The tensors of a bucket, as views of its bytes ``buf`` (uint8)."""
    out = {}
    for (key, dtype, shape, _), off in bucket:
        n = _entry_bytes(dtype, shape)
        out[key] = buf[off : off + n].view(_dtype(dtype)).view(shape)
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
    (:func:`ebrl.runtime.dist.choose_backend`: NCCL where each owns its GPU, else gloo)."""

    def __init__(self, store: Any, rank: int, cast: CastSpec, device: torch.device) -> None:
        import torch.distributed as tdist

        from ebrl.runtime.dist import RankDevices, choose_backend, exchange, rank_devices

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
            key: torch.empty(shape, dtype=_dtype(dtype)) for key, dtype, shape, _ in layout.layout
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
        seq = board._begin()
        nbytes = 0
        with torch.no_grad():
            for bucket in buckets(board.spec.entries(bool(whole))):
                buf = torch.empty(bucket_bytes(bucket), dtype=torch.uint8, device=group.device)
                group.broadcast(buf)
                for key, view in _bucket_views(buf, bucket).items():
                    nbytes += board._write(key, view)
        board._commit(version, bool(whole), seq, nbytes)
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
