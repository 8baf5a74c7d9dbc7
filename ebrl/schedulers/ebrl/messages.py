"""Messages between the EBRL workers. Small and typed; per-step rows ride in ``payload`` only when
the slots are inline (a worker on another machine), else they sit in shared memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ebrl.timeline import Span
from ebrl.types import Segment


@dataclass(slots=True)
class Ready:
    """env worker -> gen: these envs' next observations are in their slots."""

    env_ids: np.ndarray  # [M] int64
    payload: Any = None


@dataclass(slots=True)
class Hello:
    """env worker -> gen, once per process: its pid (for core rebinding: every thread of it
    moves; an in-process worker gives its thread's native id, and only that thread moves).

    A replacement for a dead env worker (``incarnation`` > 0) also gives its inbox and the
    decision its envs start counting from (``first_segment`` x T): the generator drops what it
    held for the dead process's envs and counts the decisions lost with it. Sent on the same
    connection as the worker's first ``Ready``, so it always arrives before it.
    """

    worker: int
    pid: int
    incarnation: int = 0
    address: Any = None
    first_decision: int = 0


@dataclass(slots=True)
class Lost:
    """driver -> learner: env worker ``worker``'s process died; which segment does it owe?"""

    worker: int


@dataclass(slots=True)
class Owed:
    """learner -> driver: the first segment index the learner has no part of ``worker`` for
    (the replacement worker starts its segments there)."""

    worker: int
    index: int


@dataclass(slots=True)
class Go:
    """gen -> env worker: these envs' action chunks are in their slots.

    ``epoch`` is the generator replica's incarnation (0, then n for its n-th replacement): an
    env worker rewired to a replacement drops chunks a dead predecessor sent (:class:`Rewire`).
    """

    env_ids: np.ndarray  # [M] int64
    payload: Any = None
    epoch: int = 0


@dataclass(slots=True)
class Rewire:
    """driver -> env worker: its generator replica died and was replaced; the replacement's
    inbox, and its incarnation. The env worker tells the replacement where its envs stand
    (:class:`Resync`), hands it the envs waiting for an action (:class:`Ready`), and from now on
    drops any :class:`Go` of an older epoch (chunks the dead replica sent, not yet read)."""

    gen: Any
    epoch: int


@dataclass(slots=True)
class Resync:
    """env worker -> a replacement generator replica, first on its connection: the decisions
    each of its envs has taken (executed, or received and still to run: ``stepping``), so the
    staleness gate and segment counting continue exactly where the dead replica left them."""

    worker: int
    pid: int
    decisions: dict[int, int]  # env id -> decisions of this attempt
    stepping: list[int]  # envs holding a chunk not yet stepped (their Ready comes later)


@dataclass(slots=True)
class Reconnect:
    """driver -> learner (leader): generator replica ``replica`` was replaced; its inbox, and
    whether it reads the weight board. The leader sends it the current weights at once."""

    replica: int
    address: Any
    via_board: bool


@dataclass(slots=True)
class Part:
    """env worker -> learner: one worker's share (its envs x T decisions) of segment ``index``."""

    index: int
    worker: int
    segment: Segment
    episodes: dict[str, list] = field(default_factory=dict)  # returns / lengths / successes


@dataclass(slots=True)
class Weights:
    """learner -> gen: new policy weights."""

    version: int
    state: dict[str, Any]


@dataclass(slots=True)
class Report:
    """learner -> driver: one update done."""

    iteration: int
    env_steps: int
    metrics: dict[str, float]


@dataclass(slots=True)
class Telemetry:
    """any worker -> driver: spans since the last message and gauges (queue depths, batches)."""

    worker: str
    spans: list[Span]
    gauges: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Failed:
    """any worker -> driver: the stage raised; the driver re-raises it as a StageError."""

    worker: str
    error: str
    traceback: str


@dataclass(slots=True)
class Resources:
    """driver -> gen / learner: run with these threads, cores and (gen) batch size from now on.

    ``seq`` 0 is the run's starting split; reallocations count up from 1."""

    seq: int
    threads: int
    cores: tuple[int, ...] | None = None
    batch_min: int | None = None


@dataclass(slots=True)
class Applied:
    """gen / learner -> driver: ``Resources`` number ``seq`` is in force; what the worker now
    runs with (read back from torch and the kernel) and how long applying took."""

    worker: str
    seq: int
    threads: int
    cores: tuple[int, ...]
    batch_min: int | None
    seconds: float


@dataclass(slots=True)
class Reshape:
    """driver -> every replica and env worker: run with this shape from now on (the resource
    manager re-chose it from what the run measured: ``ebrl.resources.shape.recalibrate``).
    Env workers read ``step_level`` (step env by env, or a group's chunks together); replicas
    all of it. Taking it between two batches is safe: a lock-step group waits for its envs in
    flight, a step-level batch takes whoever is ready."""

    groups: list[list[int]]
    step_level: bool
    batch_min: int
    batch_max: int | None = None


@dataclass(slots=True)
class Beat:
    """any worker -> driver, every ``Schedule.heartbeat_s`` from a thread of its own: the process is
    alive and not frozen (a simulator spinning with the GIL held, a SIGSTOPped process)."""

    worker: str


@dataclass(slots=True)
class Stop:
    """driver -> every worker: leave the loop."""
