"""The weight board: the learner's latest policy weights in one shared-memory segment.

After every update the learner publishes new weights to every generator replica on its machine.
Pickling a state dict through a socket per replica costs a serialisation, a kernel copy per
replica and an unpickle per replica; the board costs one copy into POSIX shared memory (from
the GPU, if the weights live there) and one copy out per replica, straight into the replica's
own tensors. Only a tiny message (the version) needs to travel, and a replica that misses
messages simply reads the latest weights when it next looks. The segment's bytes (a header,
then every tensor at an aligned offset) are :mod:`ebrl.runtime.weight_layout`'s.

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

A board reaches the processes of its own machine only; :mod:`ebrl.runtime.weight_cast` carries
each publish to a board on every other node with replicas (:meth:`WeightBoard.cast_to`), and
its :func:`~ebrl.runtime.weight_cast.open_board` attaches a replica to whichever board it reads.

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
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from types import TracebackType
from typing import TYPE_CHECKING, Self

import numpy as np
import psutil
import torch

from ebrl.runtime.slots import start_resource_tracker
from ebrl.runtime.watchdog import SHM_DIR, shm_prefix, sweep_dead_drivers
from ebrl.runtime.weight_layout import (
    BASE,
    MAGIC,
    MAGIC_AT,
    NBYTES,
    SEQ,
    VERSION,
    Entry,
    check_layout,
    fence,
    layout_of,
    tensor_views,
)

if TYPE_CHECKING:
    from ebrl.runtime.weight_cast import Caster, CastSpec, Receiver


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
            (:func:`~ebrl.runtime.weight_cast.cast_address`; None: this board reaches its own
            node only).
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
        self._views = tensor_views(shm.buf, spec.layout)
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
                (:func:`~ebrl.runtime.weight_cast.cast_address`; :meth:`cast_to` listens
                there), carried in the spec.
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
        header[:] = (0, -1, nbytes, MAGIC, -1)
        del header
        spec = BoardSpec(
            name=name, layout=layout, nbytes=nbytes, changing=changing, cast_at=cast_at
        )
        return cls(shm, spec)

    @property
    def version(self) -> int:
        """The last version published (-1: none yet)."""
        return int(self._header[VERSION]) if self._shm is not None else -1

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
        seq = self.begin()
        nbytes = 0
        with torch.no_grad():
            for key, *_ in entries:
                nbytes += self.write(key, state[key])
        self.commit(version, whole, seq, nbytes)
        cast = self._cast
        if cast is not None:  # the other nodes' boards, by the collective
            cast.cast(version, state, whole)
        return time.perf_counter() - t0

    # A publish in three steps: begin, write each tensor, commit. A node's receiver
    # (ebrl.runtime.weight_cast.Receiver) takes them one by one, its tensors arriving by bucket.
    def begin(self) -> int:
        """Mark the board as being written (``seq`` odd); returns that ``seq``."""
        if self._shm is None:
            raise RuntimeError("weight board: write after close")
        seq = self._seq if self._seq % 2 else self._seq + 1  # odd: a failed publish left it so
        self._seq = seq
        self._whole = False  # until this copy completes (a failed one: the next is whole)
        self._header[SEQ] = seq
        fence()
        return seq

    def write(self, key: str, tensor: torch.Tensor) -> int:
        """Copy one tensor onto the board (between :meth:`begin` and :meth:`commit`);
        returns the bytes copied."""
        view = self._views[key]
        if not view.numel():
            return 0
        view.copy_(tensor.detach())
        return view.numel() * view.element_size()

    def commit(self, version: int, whole: bool, seq: int, nbytes: int) -> None:
        """The copy begun at ``seq`` is complete: ``version`` is on the board (``seq`` even)."""
        self._header[VERSION] = version
        if whole:
            self._header[BASE] = seq + 1
        fence()
        self._seq = seq + 1
        self._header[SEQ] = seq + 1
        self._whole = True
        self.last_bytes = nbytes

    def cast_to(self, cast: CastSpec, device: torch.device | str = "cpu") -> None:
        """From now on every :meth:`publish` also sends the weights to the node receivers of
        ``cast`` (one collective per update, :class:`~ebrl.runtime.weight_cast.Caster`); joins
        their group now (blocks until every receiver joined, or ``cast.timeout_s``).

        Args:
            cast: where the group meets (the leader's store) and how many receivers.
            device: where the learner's weights live (the group's backend follows it).
        """
        from ebrl.runtime.weight_cast import Caster  # it builds on this module

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
        if int(self._header[MAGIC_AT]) != MAGIC or int(self._header[NBYTES]) != spec.nbytes:
            self.close()
            raise ValueError(f"weight board {spec.name!r}: not a board made for this spec")
        self._views = tensor_views(self._mm, spec.layout)

    def _even_seq(self, deadline: float | None) -> int:
        """Wait until the writer is not copying; returns ``seq``."""
        waits = 0
        while True:
            seq = int(self._header[SEQ])
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
            version = int(self._header[VERSION])
            fence()
            if int(self._header[SEQ]) == seq:
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
            version = int(self._header[VERSION])
            if version < 0:
                fence()
                if int(self._header[SEQ]) == seq:
                    return -1, into if into is not None else {}
                continue
            base = int(self._header[BASE])
            if out is None:
                out = {k: torch.empty_like(v) for k, v in self._views.items()}
            # the frozen tensors are in ``out`` already when it is what the last read filled,
            # from the same whole publish
            holds, self._holds = self._holds, None  # a torn copy holds nothing
            whole = holds is None or holds[0] is not out or holds[1] != base
            nbytes = 0
            fence()
            with torch.no_grad():
                for key, *_ in self.spec.entries(whole):
                    view = self._views[key]
                    if view.numel():
                        out[key].copy_(view)
                        nbytes += view.numel() * view.element_size()
            fence()
            if int(self._header[SEQ]) == seq:
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
