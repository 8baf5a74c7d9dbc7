"""Per-env slots for the hot path: observations and action chunks, indexed by global env id.

Env workers write an env's next observation into its slot and send the generator only the env id;
the generator reads the slots of a batch, writes the chunks back into the action slots and sends the
env workers only ids. On one machine the slots are POSIX shared memory (no copy through any
process in between); when a worker sits on another machine, :class:`InlineSlots` carries the same
rows inside the message instead. Both have one interface: ``put_* -> payload``, ``get_*(payload)``.

A chunk's ``extras`` (what a policy's learner call needs to score it: a flow-matching VLA's
denoising chain, ``ebrl.types``) have shapes only the policy knows, so they travel in the
message (the payload) under both, beside the fixed fields in shared memory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch

from ebrl.types import ActionChunk, Extras


def _layout(obs_dim: int, k: int, a: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """field -> (shape after the env axis, dtype)."""
    return {
        "obs": ((obs_dim,), np.float32),
        "actions": ((k, a), np.float32),
        "logprob": ((), np.float32),
        "value": ((), np.float32),
        "version": ((), np.int64),
    }


@dataclass(frozen=True)
class SlotSpec:
    num_envs: int
    obs_dim: int
    chunk_size: int
    action_dim: int
    name: str = ""  # shared-memory name prefix ("" for inline)
    owner_pid: int = 0  # the creating process (it alone registers the segments for cleanup)


class ShmSlots:
    """Slots in POSIX shared memory. The creator (the driver) unlinks them at the end."""

    def __init__(self, spec: SlotSpec, create: bool = False) -> None:
        self.spec = spec
        self._shm: list[shared_memory.SharedMemory] = []
        self.arrays: dict[str, np.ndarray] = {}
        self._owner = create
        start_resource_tracker()
        for field, (shape, dtype) in _layout(
            spec.obs_dim, spec.chunk_size, spec.action_dim
        ).items():
            full = (spec.num_envs, *shape)
            nbytes = max(1, int(np.prod(full)) * np.dtype(dtype).itemsize)
            name = f"{spec.name}_{field}"
            shm = shared_memory.SharedMemory(name=name, create=create, size=nbytes if create else 0)
            if not create and os.getpid() != spec.owner_pid:
                # another process's tracker would unlink the segment when that process exits
                _untrack(shm)
            self._shm.append(shm)
            self.arrays[field] = np.ndarray(full, dtype=dtype, buffer=shm.buf)

    @classmethod
    def create(cls, num_envs: int, obs_dim: int, chunk_size: int, action_dim: int) -> ShmSlots:
        """New slots named after this process (``ebrl_<pid>_<id>``), so that the segments of a
        driver that died without unlinking them are found and removed (here, first, and by
        the orphan watchdog)."""
        from ebrl.runtime.watchdog import shm_prefix, sweep_dead_drivers

        sweep_dead_drivers()
        name = f"{shm_prefix(os.getpid())}{uuid.uuid4().hex[:12]}"
        spec = SlotSpec(num_envs, obs_dim, chunk_size, action_dim, name, os.getpid())
        return cls(spec, create=True)

    def put_obs(self, env_ids: np.ndarray, obs: np.ndarray) -> None:
        self.arrays["obs"][env_ids] = obs
        return None

    def get_obs(self, env_ids: np.ndarray, payload: Any = None) -> np.ndarray:
        return self.arrays["obs"][env_ids].copy()

    def put_chunk(self, chunk: ActionChunk) -> Extras | None:
        """Write the chunk's rows; the payload is its extras (None without)."""
        ids = chunk.env_ids.numpy()
        self.arrays["actions"][ids] = chunk.actions.numpy()
        self.arrays["logprob"][ids] = chunk.logprob.numpy()
        self.arrays["value"][ids] = chunk.value.numpy()
        self.arrays["version"][ids] = chunk.policy_version.numpy()
        return chunk.extras or None

    def get_chunk(self, env_ids: np.ndarray, payload: Extras | None = None) -> ActionChunk:
        """The rows of ``env_ids`` (in that order, as :meth:`put_chunk` wrote them) with the
        extras its payload carried."""
        a = self.arrays
        return ActionChunk(
            actions=torch.from_numpy(a["actions"][env_ids].copy()),
            logprob=torch.from_numpy(a["logprob"][env_ids].copy()),
            value=torch.from_numpy(a["value"][env_ids].copy()),
            env_ids=torch.from_numpy(np.asarray(env_ids, dtype=np.int64)),
            policy_version=torch.from_numpy(a["version"][env_ids].copy()),
            extras=dict(payload or {}),
        )

    def close(self) -> None:
        self.arrays.clear()
        for shm in self._shm:
            shm.close()
            if self._owner:
                with contextlib.suppress(FileNotFoundError):
                    shm.unlink()
        self._shm.clear()


class InlineSlots:
    """The same interface with the rows carried in the message (workers on other machines)."""

    def __init__(self, spec: SlotSpec) -> None:
        self.spec = spec

    def put_obs(self, env_ids: np.ndarray, obs: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(obs, dtype=np.float32)

    def get_obs(self, env_ids: np.ndarray, payload: np.ndarray) -> np.ndarray:
        return payload

    def put_chunk(self, chunk: ActionChunk) -> ActionChunk:
        return chunk

    def get_chunk(self, env_ids: np.ndarray, payload: ActionChunk) -> ActionChunk:
        return payload

    def close(self) -> None:
        pass


def start_resource_tracker() -> None:
    """Start this process's :mod:`multiprocessing` resource tracker, if it is not running yet,
    deaf to SIGUSR2.

    Slurm's time-limit warning (Submitit's ``--signal=USR2@<delay>``) reaches every process of
    the job, the tracker included. Python's tracker ignores SIGINT and SIGTERM but dies of USR2;
    the next unlink then starts a new tracker that has registered nothing, and it prints a
    ``KeyError`` traceback for each segment. A signal blocked when the tracker is started stays
    blocked in it (the mask is inherited across fork and exec, as Python's own start of the
    tracker relies on for SIGINT and SIGTERM).
    """
    from multiprocessing import resource_tracker

    if not hasattr(signal, "pthread_sigmask"):
        resource_tracker.ensure_running()
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _untrack(shm: shared_memory.SharedMemory) -> None:
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:  # tracker absent (Python builds without it): nothing to undo
        pass


def open_slots(spec: SlotSpec, inline: bool) -> ShmSlots | InlineSlots:
    """Attach to the run's slots from a worker (inline when not on the driver's machine)."""
    return InlineSlots(spec) if inline or not spec.name else ShmSlots(spec, create=False)
