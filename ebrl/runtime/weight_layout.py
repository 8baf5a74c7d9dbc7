"""The weight board's bytes: where a state dict's tensors sit in a segment, and the header.

:mod:`ebrl.runtime.weight_board` writes and reads a board in this format, and
:mod:`ebrl.runtime.weight_cast` derives its broadcast's buckets from the same entries (same keys,
dtypes, shapes, same alignment), so that every node's board has the leader's layout.

Layout of the segment: a 64-byte header, then every tensor of the state dict at a 64-byte
aligned offset (one :data:`Entry` per tensor: key, dtype, shape and offset)::

    [0:8)  seq      int64, even when the weights are whole, odd while the writer is copying
    [8:16) version  int64, the version of the weights below (-1: nothing published yet)
    [16:24) nbytes  int64, the segment's size as the spec says (a reader checks it)
    [24:32) magic   int64, marks the segment as a weight board
    [32:40) base    int64, the ``seq`` a publish of the whole state ended at (-1: none yet)

Memory ordering (:func:`fence`): on x86-64 stores become visible in program order and loads are
not reordered with other loads, which is all the board's seqlock needs. For weakly ordered CPUs
(aarch64) the board puts a lock acquire and release between the ``seq`` accesses and the copies
(in CPython 3.11/3.12 on Linux ``sem_trywait``/``sem_post``, which POSIX lists among the calls
that synchronise memory); this has been tested on x86-64 only. Torch's worker threads join
before a copy returns.
"""

from __future__ import annotations

import mmap
import threading
import warnings
from collections.abc import Mapping

import numpy as np
import torch

#: header bytes before the first tensor; every tensor starts on a multiple of ALIGN
HEADER = 64
ALIGN = 64
MAGIC = 0x31304257_4C524245  # b"EBRLWB01" little-endian
#: the header's int64 fields, by index
SEQ, VERSION, NBYTES, MAGIC_AT, BASE = range(5)

#: (key, dtype name, shape, byte offset)
Entry = tuple[str, str, tuple[int, ...], int]

_barrier = threading.Lock()


def fence() -> None:
    """Order the copies against the ``seq`` accesses on CPUs that would reorder them."""
    _barrier.acquire()
    _barrier.release()


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype an entry names (``"float32"``, ``"bfloat16"``...)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"weight board: unknown dtype {name!r}")
    return dt


def entry_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """The bytes of a tensor of ``dtype`` and ``shape`` (without the padding to ALIGN)."""
    return int(np.prod(shape, dtype=np.int64)) * dtype_of(dtype).itemsize


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
        off += -(-entry_bytes(dtype, shape) // ALIGN) * ALIGN
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


def tensor_views(buf: memoryview | mmap.mmap, layout: tuple[Entry, ...]) -> dict[str, torch.Tensor]:
    """Tensors over the segment's bytes, one per layout entry (read-only buffers warn: they
    are only ever copied from)."""
    views: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "the given buffer is not writable"
        for key, dtype, shape, off in layout:
            n = entry_bytes(dtype, shape)
            if n == 0:
                views[key] = torch.empty(shape, dtype=dtype_of(dtype))
                continue
            raw = np.frombuffer(buf, dtype=np.uint8, count=n, offset=off)
            views[key] = torch.from_numpy(raw).view(dtype_of(dtype)).view(shape)
    return views
