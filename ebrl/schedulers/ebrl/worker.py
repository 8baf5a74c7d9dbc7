"""What every EBRL worker shares: the run's :class:`Schedule` and the :class:`Worker` base.

Every worker has the same life: ``open()`` builds its stage and its inbox and returns its address;
``run(links, plan)`` connects to the inboxes its links name and loops until :class:`Stop`. The
same classes run as Ray actors (one process each) or as threads (the in-process backend). The base
here holds what the three loops share: the inbox, the link to the driver, the heartbeat, the local
timeline and its flushes, error reporting, the dispatch of messages through each worker's
``handlers`` table, and applying the driver's :class:`Resources`. Each role's loop is a module of
its own: ``env_worker.py`` (simulation), ``gen_worker.py`` (generation), ``learner_worker.py``
(training); each wraps one stage and decides nothing but when to call it.

Who sends what to whom is wired in one place, ``ebrl.schedulers.ebrl.wiring`` (its docstring has
the whole data flow); each worker gets its :class:`~ebrl.schedulers.ebrl.wiring.Links` there and
never looks a peer up by name.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ebrl.resources.apply import pin, pin_process
from ebrl.runtime.channel import Address, Inbox, Outbox, node_ip
from ebrl.runtime.placement_ray import pin_planned_gpus
from ebrl.runtime.slots import SlotSpec, open_slots
from ebrl.schedulers.base import UpdateBudget
from ebrl.schedulers.ebrl.heartbeat import HeartbeatSender
from ebrl.schedulers.ebrl.messages import Applied, Failed, Resources, Stop, Telemetry
from ebrl.schedulers.ebrl.wiring import Links
from ebrl.stages.factory import StageFactory
from ebrl.timeline import Timeline


@dataclass(frozen=True)
class Schedule:
    """The shape of one EBRL run, shared by every worker.

    Attributes:
        workers: env ids of each env worker (process).
        groups: env ids of each env group (the lock-step unit when step_level is off).
        decisions_per_env: T.
        staleness: k, the bound on learner version minus acting version (0: no overlap).
        step_level: level 3: envs advance and are batched one by one (first M of N).
        batch_min: M, the generator acts once M eligible envs are ready ...
        batch_timeout_s: ... or once the oldest ready env has waited this long.
        batch_max: ... on at most this many of them, oldest first (None: M, the first M of N).
        slots: the shared slot arrays' layout and name.
        home: env worker -> home cores it is pinned to (None: no pinning, no rebinding).
        rebind: level 3's core rebinding (needs ``home``).
        gen_resources: each replica's starting threads, cores and batch size (empty: its
            stage's own threads, unpinned, ``batch_min``).
        train_resources: the learner's starting threads and cores (None: its stage's own).
        driver_pid: the driver's process: a worker running inside it (the in-process backend)
            pins only its own thread, never the driver's other threads.
        start_version: the learner's version when this attempt started (0, or a resumed run's
            checkpoint version): segment ``i`` of the attempt is trained by version
            ``start_version + i``.
        budget: the learner trains no update past it (its segments are left to the shutdown).
        heartbeat_s: every worker sends the driver a :class:`Beat` this often (None: none).
        ledger: the attempt's step-ledger folder (``ebrl.ledger``): each env worker records
            the env steps it collects there (None: not recorded).
    """

    workers: list[list[int]]
    groups: list[list[int]]
    decisions_per_env: int
    staleness: int
    step_level: bool
    batch_min: int
    batch_timeout_s: float
    slots: SlotSpec
    batch_max: int | None = None
    home: dict[int, frozenset[int]] | None = None
    rebind: bool = False
    gen_resources: tuple[Resources, ...] = ()
    train_resources: Resources | None = None
    driver_pid: int = 0
    start_version: int = 0
    budget: UpdateBudget = field(default_factory=UpdateBudget)
    heartbeat_s: float | None = None
    ledger: str | None = None

    def owner(self) -> dict[int, int]:
        return {e: w for w, ids in enumerate(self.workers) for e in ids}


def pin_worker(cores: Iterable[int], driver_pid: int) -> None:
    """Pin a worker to ``cores``: every thread of its process (its heartbeat, torch's and a
    simulator's threads, started before or after), or, where the worker is a thread of the
    driver (``driver_pid`` is this process: ``scheduler.backend=inprocess``), its own thread
    only, so that the driver's other threads stay where they are."""
    if os.getpid() == driver_pid:
        pin(0, cores)
    else:
        pin_process(cores)


class Worker:
    """Inbox, driver link, local timeline and error reporting shared by the three loops.

    Args:
        factory: builds this worker's stage.
        authkey: the run's channel secret.
        driver_host: the driver's machine address (a worker elsewhere uses inline slots).
    """

    name = "worker"
    #: who reacts to what: message type -> the name of the method that handles it (Stop, in
    #: every worker, ends the loop: :meth:`_handle`)
    handlers: ClassVar[dict[type, str]] = {}
    #: a worker's spans and gauges go to the driver at most this often (and when it stops)
    flush_every_s = 0.25

    def __init__(self, factory: StageFactory, authkey: bytes, driver_host: str) -> None:
        pin_planned_gpus()  # before anything starts CUDA: the GPU the placement planned
        self.factory = factory
        self.authkey = authkey
        self.driver_host = driver_host
        self.timeline = Timeline()
        self._sent_spans = 0
        self._last_flush = 0.0

    def _open_inbox(self) -> Address:
        host = node_ip()
        local = host == self.driver_host or host.startswith("127.")
        self.inline = not local  # shared memory only reaches processes on the driver's machine
        self.inbox = Inbox(
            self.authkey,
            host="127.0.0.1" if local else "0.0.0.0",
            advertise="127.0.0.1" if local else host,
        )
        return self.inbox.address

    def run(self, links: Links, plan: Schedule) -> None:
        """Connect to the inboxes ``links`` names and loop until Stop; any exception is
        reported, then raised."""
        self.plan = plan
        self.links = links
        self.slots = open_slots(plan.slots, inline=self.inline)
        self.driver = Outbox(links.driver, self.authkey)
        beat = HeartbeatSender(self.name, links.driver, self.authkey, plan.heartbeat_s).start()
        try:
            self._connect(links)
            self._loop()
            self.flush(force=True)
        except BaseException as e:
            # if the driver is gone too, Ray still reports the exception
            with contextlib.suppress(OSError):
                tb = traceback.format_exc()
                self.driver.send(Failed(self.name, f"{type(e).__name__}: {e}", tb))
            raise
        finally:
            beat.stop()
            self.inbox.close()
            self.slots.close()
            self._close()

    def _close(self) -> None:
        """Release what the worker's own loop opened (boards, process groups)."""

    def flush(
        self,
        gauges: dict[str, float] | Callable[[], dict[str, float]] | None = None,
        force: bool = False,
    ) -> None:
        """Send spans recorded since the last flush (at most every ``flush_every_s`` unless
        forced), with ``gauges`` (a callable is only called when the message goes out)."""
        now = time.perf_counter()
        if not force and now - self._last_flush < self.flush_every_s:
            return
        self._last_flush = now
        spans = self.timeline.spans[self._sent_spans :]
        self._sent_spans += len(spans)
        g = dict((gauges() if callable(gauges) else gauges) or {})
        # the whole process's CPU: minus the stage spans' CPU, what the engine itself costs
        g[f"resource/{self.name}/cpu_s"] = time.process_time()
        self.driver.send(Telemetry(self.name, list(spans), g))

    def _connect(self, links: Links) -> None: ...

    def _handle(self, msgs: list) -> bool:
        """Hand each message to its handler in the class's :attr:`handlers`; True at a
        :class:`Stop` (every loop leaves at it; what came after it is not handled). A message
        no handler takes is dropped."""
        for m in msgs:
            if isinstance(m, Stop):
                return True
            name = self.handlers.get(type(m))
            if name is not None:
                getattr(self, name)(m)
        return False

    def _check_version(self) -> None:
        """The staleness gate counts segments from ``plan.start_version``: a generator or learner
        that loaded other weights (another checkpoint) would break the bound silently."""
        if self.stage.version != self.plan.start_version:
            raise RuntimeError(
                f"{self.name} starts at policy version {self.stage.version}, the run at "
                f"{self.plan.start_version}: it loaded another checkpoint than the driver read"
            )

    def _loop(self) -> None: ...

    def _set_batch(self, batch_min: int) -> None:
        """Only the generator has a batch size."""

    def _batch(self) -> int | None:
        return None

    def apply_resources(self, msg: Resources) -> Applied:
        """Run with ``msg``'s torch threads, cores and batch size from now on; tell the driver.

        Threads go to the stage (which sets them before every call: in-process, gen and learner
        share torch's setting) and to torch at once. Cores pin the worker (:func:`pin_worker`).
        """
        t0 = time.perf_counter()
        self.stage.threads = msg.threads
        torch.set_num_threads(msg.threads)
        if msg.cores is not None:
            pin_worker(msg.cores, self.plan.driver_pid)
        if msg.batch_min is not None:
            self._set_batch(msg.batch_min)
        done = Applied(
            self.name,
            msg.seq,
            int(self.stage.threads),
            tuple(sorted(os.sched_getaffinity(0))),
            self._batch(),
            time.perf_counter() - t0,
        )
        self.driver.send(done)
        return done
