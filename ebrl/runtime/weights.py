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
import mmap
import os
import threading
import time
import uuid
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from types import TracebackType
from typing import Self

import numpy as np
import psutil
import torch

from ebrl.runtime.slots import start_resource_tracker
from ebrl.runtime.watchdog import SHM_DIR, shm_prefix, sweep_dead_drivers

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
    """

    name: str
    layout: tuple[Entry, ...]
    nbytes: int
    changing: tuple[str, ...] | None = None

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
        #: bytes the last publish copied
        self.last_bytes = 0

    @classmethod
    def create(
        cls,
        state: Mapping[str, torch.Tensor],
        owner_pid: int,
        changing: Collection[str] | None = None,
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
        spec = BoardSpec(name=name, layout=layout, nbytes=nbytes, changing=changing)
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
        seq = self._seq if self._seq % 2 else self._seq + 1  # odd: a failed publish left it so
        self._seq = seq
        self._whole = False  # until this copy completes, if it is a whole one
        self._header[_SEQ] = seq
        _fence()
        nbytes = 0
        with torch.no_grad():
            for key, *_ in entries:
                view = self._views[key]
                if view.numel():
                    view.copy_(state[key].detach())
                    nbytes += view.numel() * view.element_size()
        self._header[_VERSION] = version
        if whole:
            self._header[_BASE] = seq + 1
        _fence()
        self._seq = seq + 1
        self._header[_SEQ] = seq + 1
        self._whole = True
        self.last_bytes = nbytes
        return time.perf_counter() - t0

    def close(self) -> None:
        """Unmap and unlink the segment (idempotent). Readers already attached keep their
        mapping until they close; no new reader can open it."""
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

    def __init__(self, spec: BoardSpec) -> None:
        self.spec = spec
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
        """Unmap (idempotent); never unlinks."""
        mm, self._mm = self._mm, None
        if mm is None:
            return
        self._views = {}
        self._holds = None
        self._header = np.full(5, -1, dtype=np.int64)
        with contextlib.suppress(BufferError):  # a view escaped: the mapping goes with it
            mm.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def open_board(spec: BoardSpec) -> BoardReader:
    """Attach to a board from a replica (any process on the writer's machine)."""
    return BoardReader(spec)
