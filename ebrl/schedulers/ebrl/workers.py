"""The three EBRL worker loops. Each wraps one stage and decides nothing but when to call it.

Every worker has the same life: ``open()`` builds its stage and its inbox and returns its address;
``run(links, plan)`` connects to the inboxes its links name and loops until :class:`Stop`. The
same classes run as Ray actors (one process each) or as threads (the in-process backend).

Who sends what to whom is wired in one place, ``ebrl.schedulers.ebrl.wiring`` (its docstring has
the whole data flow); each worker gets its :class:`~ebrl.schedulers.ebrl.wiring.Links` there and
never looks a peer up by name.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from ebrl.envs.base import EnvSpec
from ebrl.ledger import StepLedger, writer_path
from ebrl.resources.apply import pin, pin_process, rebind_threads
from ebrl.resources.model import pick
from ebrl.rollout import EpisodeStats, SegmentBuilder
from ebrl.runtime.channel import Address, Inbox, Outbox, node_ip
from ebrl.runtime.dist_group import destroy, free_port, init_group
from ebrl.runtime.placement import pin_planned_gpus
from ebrl.runtime.slots import SlotSpec, open_slots
from ebrl.runtime.weight_board import BoardSpec, WeightBoard
from ebrl.runtime.weight_cast import cast_address, open_board
from ebrl.schedulers.base import UpdateBudget
from ebrl.schedulers.ebrl.heartbeat import HeartbeatSender
from ebrl.schedulers.ebrl.messages import (
    Applied,
    Failed,
    Go,
    Hello,
    Lost,
    Owed,
    Part,
    Ready,
    Reconnect,
    Report,
    Reshape,
    Resources,
    Resync,
    Rewire,
    Stop,
    Telemetry,
    Weights,
)
from ebrl.schedulers.ebrl.rebind import rebind_plan
from ebrl.schedulers.ebrl.wiring import Links, gen_name, learner_name
from ebrl.stages.factory import StageFactory
from ebrl.timeline import Timeline
from ebrl.types import Observation, Segment, Transition


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


class _Worker:
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
        share torch's setting) and to torch at once. Cores pin the whole worker process, or only
        this thread when the worker is a thread of the driver.
        """
        t0 = time.perf_counter()
        self.stage.threads = msg.threads
        torch.set_num_threads(msg.threads)
        if msg.cores is not None:
            if os.getpid() == self.plan.driver_pid:
                pin(0, msg.cores)
            else:
                pin_process(msg.cores)
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


# --- simulation -------------------------------------------------------------------------------
class EnvWorker(_Worker):
    """Owns one env group's worth of envs (one process); steps chunks as they arrive.

    Args:
        first_segment: the segment index its first part belongs to (a replacement for a dead
            worker continues where the learner is missing its predecessor's part).
        incarnation: 0 for the run's first process of this worker, n for its n-th replacement
            (its envs reset from a stream of initial states of their own).
    """

    handlers: ClassVar[dict[type, str]] = {
        Go: "_queue",  # chunks to step (from the replica)
        Rewire: "_rewire",  # the replica was replaced (driver)
        Reshape: "_reshape",  # the run's new shape (driver)
    }

    def __init__(
        self,
        index: int,
        env_ids: list[int],
        factory: StageFactory,
        authkey: bytes,
        host: str,
        first_segment: int = 0,
        incarnation: int = 0,
    ) -> None:
        super().__init__(factory, authkey, host)
        self.index = index
        self.name = f"sim{index}"
        self.env_ids = env_ids
        self.first_segment = first_segment
        self.incarnation = incarnation

    def open(self) -> tuple[Address, EnvSpec]:
        self.stage = self.factory.sim(self.env_ids, incarnation=self.incarnation)
        return self._open_inbox(), self.stage.group.spec

    def _connect(self, links: Links) -> None:
        if self.plan.home is not None:  # pinned home cores (level 3 rebinds from there)
            pin(0, self.plan.home[self.index])
        self.gen: Outbox | None = Outbox(links.gen, self.authkey)
        self.learner = Outbox(links.learner, self.authkey)
        first = self.first_segment * self.plan.decisions_per_env
        # what core rebinding moves: this process (every thread of it), or in-process (a
        # thread of the driver) this worker's own thread only
        pid = os.getpid()
        self.mover = threading.get_native_id() if pid == self.plan.driver_pid else pid
        self.gen.send(Hello(self.index, self.mover, self.incarnation, self.inbox.address, first))
        # where each env stands: decisions of this attempt executed, envs holding a chunk not
        # yet stepped, and the generator replica's incarnation chunks must come from
        self.executed = dict.fromkeys((int(e) for e in self.env_ids), first)
        self.stepping: set[int] = set()
        self.epoch = 0
        self.dropped_chunks = 0  # chunks a dead replica sent, dropped after the rewire
        self.step_level = self.plan.step_level  # a Reshape may change it

    def _send_gen(self, msg: Ready | Resync) -> None:
        """To the generator replica; if its process is gone, nothing: the driver replaces it,
        and the :class:`Rewire` that follows hands the replacement every waiting env."""
        if self.gen is None:
            return
        try:
            self.gen.send(msg)
        except OSError:
            self.gen = None

    def _ready(self, ids: np.ndarray, obs: np.ndarray) -> None:
        self._send_gen(Ready(ids, self.slots.put_obs(ids, obs)))

    def _queue(self, m: Go) -> None:
        if m.epoch < self.epoch:  # sent by a dead replica: its envs were handed over
            self.dropped_chunks += len(m.env_ids)
            return
        self.work.append(m)
        self.stepping.update(int(e) for e in m.env_ids)

    def _reshape(self, m: Reshape) -> None:
        self.step_level = m.step_level

    def _rewire(self, m: Rewire) -> None:
        """The replica died and was replaced: tell the new one where every env stands, then
        hand it the envs that wait for an action (the others report when their chunk is done)."""
        with contextlib.suppress(OSError):
            if self.gen is not None:
                self.gen.close()
        self.gen, self.epoch = Outbox(m.gen, self.authkey), m.epoch
        decisions = {e: n + (e in self.stepping) for e, n in self.executed.items()}
        self._send_gen(Resync(self.index, self.mover, decisions, sorted(self.stepping)))
        idle = np.array([e for e in self.executed if e not in self.stepping], dtype=np.int64)
        if len(idle):
            self._ready(idle, torch.stack([self.last_obs[int(e)] for e in idle]).numpy())

    def _close(self) -> None:
        if getattr(self, "ledger", None) is not None:
            self.ledger.close()

    def _loop(self) -> None:
        plan, tl = self.plan, self.timeline
        self.ledger = None
        if plan.ledger is not None:
            path = writer_path(Path(plan.ledger), self.name, self.incarnation)
            self.ledger = StepLedger(path, self.first_segment)
        builder = SegmentBuilder(self.env_ids, plan.decisions_per_env, self.ledger)
        episodes = EpisodeStats()
        with tl.span("sim", self.name, reset=1):
            first = self.stage.reset()
        self.last_obs = {int(e): first.obs[i] for i, e in enumerate(first.env_ids)}
        last_obs = self.last_obs
        mine = set(self.env_ids)
        for group in plan.groups:  # first observations, group by group
            ids = np.array([e for e in group if e in mine], dtype=np.int64)
            if len(ids):
                self._ready(ids, torch.stack([last_obs[int(e)] for e in ids]).numpy())
        work: deque[Go] = deque()  # chunks to step, in arrival order
        self.work = work
        seg_index = self.first_segment
        while True:
            if self._handle(self.inbox.recv(timeout=0.0 if work else None)):
                return
            if not work:
                continue
            go = work.popleft()
            chunk = self.slots.get_chunk(go.env_ids, go.payload)
            units = (
                [chunk.rows(i, i + 1) for i in range(len(chunk))]  # level 3: env by env
                if self.step_level
                else [chunk]  # lock step: the whole group's chunks, then one Ready
            )
            for unit in units:
                with tl.span("sim", self.name, batch=len(unit)):
                    out = self.stage.step(unit)
                ids = unit.env_ids.numpy()
                self._ready(ids, out.next_obs.numpy())  # first: the generator can start
                obs = Observation(
                    obs=torch.stack([last_obs[int(e)] for e in ids]), env_ids=unit.env_ids
                )
                builder.add(Transition.join(obs, unit, out))
                episodes.update(out)
                for i, e in enumerate(ids):
                    last_obs[int(e)] = out.next_obs[i]
                    self.executed[int(e)] += 1
                    self.stepping.discard(int(e))
                # level 3: take new work in as soon as it arrives
                if self.step_level and self._handle(self.inbox.recv(timeout=0.0)):
                    return
            while builder.ready():
                seg = builder.pop()
                self.learner.send(Part(seg_index, self.index, seg, episodes.take()))
                seg_index += 1
            # with each env's step latency (P50/P99 of its last steps), when the message goes
            self.flush(
                lambda: {
                    "fault/gen_dropped_chunks": float(self.dropped_chunks),
                    **self.stage.gauges(),
                }
            )


# --- generation -------------------------------------------------------------------------------
class GenWorker(_Worker):
    """A generator replica: batches the ready observations of the env workers it serves, acts,
    hands chunks back; enforces staleness against its own policy version; rebinds idle cores to
    its straggling env workers (level 3).

    Args:
        replica: which replica (``Roles.served_by(replica)`` are its env workers).
        device: where it acts.
        epoch: 0 for the replica's first process, n for its n-th replacement: it takes over
            from the newest weights on the board (or the learner's next message) and from where
            its env workers' envs stand (their :class:`Resync`); its chunks carry the epoch.
    """

    name = "gen"
    handlers: ClassVar[dict[type, str]] = {
        Ready: "_on_ready",  # observations to act on (env workers)
        Hello: "_hello",  # an env worker (or its replacement) starts
        Resync: "_resync",  # where a rewired env worker's envs stand
        Weights: "_load",  # a new version (learner)
        Reshape: "_reshape",  # the run's new shape (driver)
        Resources: "apply_resources",  # threads, cores, batch size (driver)
    }
    #: applies core moves {pid: cores}; tests replace it with a recorder
    rebinder = staticmethod(rebind_threads)

    def __init__(
        self,
        factory: StageFactory,
        authkey: bytes,
        driver_host: str,
        replica: int = 0,
        device: str = "cpu",
        epoch: int = 0,
    ) -> None:
        super().__init__(factory, authkey, driver_host)
        self.replica = replica
        self.name = gen_name(replica)
        self.device = device
        self.epoch = epoch

    def open(self) -> Address:
        self.stage = self.factory.gen(device=self.device, incarnation=self.epoch)
        return self._open_inbox()

    def _connect(self, links: Links) -> None:
        mine = sorted(links.envs)
        self.envs = {w: Outbox(a, self.authkey) for w, a in links.envs.items()}
        self.board = open_board(links.board) if links.board is not None else None
        self.pids: dict[int, int] = {}  # env worker -> pid (from its Hello)
        self.pending = dict.fromkeys(mine, 0)  # env worker -> envs it is stepping
        home = self.plan.home
        self.home = {w: home[w] for w in mine} if home is not None else None
        self.bound: dict[int, frozenset[int]] = dict(self.home or {})
        self.rebinds = 0
        self.incarnation = dict.fromkeys(mine, 0)  # env worker -> its process's incarnation
        # the lock-step groups, restricted to the envs this replica acts for
        served = {e for w in mine for e in self.plan.workers[w]}
        self.served = served
        plan = self.plan
        self._reshape(Reshape(plan.groups, plan.step_level, plan.batch_min, plan.batch_max))
        self.gone: set[int] = set()  # env workers whose process died (until replaced)
        self.lost_decisions = 0  # decisions issued to dead env workers, never trained on
        # rollout accounting for the allocator: decisions issued, and env-seconds in which a
        # ready env waited only because acting on it would break the staleness bound
        self.decided = 0
        self.gen_busy_s = 0.0  # seconds inside the policy: the generator's own capacity
        self.load_s, self.loads = 0.0, 0  # installing new weights (the sync's cost here)
        self.blocked_env_s = 0.0
        self._n_blocked = 0
        self._t_acc = time.perf_counter()
        self._owner = self.plan.owner()
        # envs whose next Ready is a hand-over after a rewire, not the end of a chunk
        self.fresh: set[int] = set()
        if self.epoch == 0:
            self._check_version()
        elif self.board is not None:  # a replacement: the learner has moved on meanwhile
            self.stage.load_from(self.board)
        if self.plan.gen_resources:
            self.apply_resources(self.plan.gen_resources[self.replica])

    def _close(self) -> None:
        if getattr(self, "board", None) is not None:
            self.board.close()

    def _load(self, m: Weights) -> None:
        """Install the learner's weights: from the board (the newest published version, which
        may be newer than ``m``'s: never older) or inline from the message."""
        t0 = time.perf_counter()
        source = getattr(self.board, "path", "board") if m.state is None else "inline"
        with self.timeline.span("load", self.name, version=m.version, source=source):
            if m.state is None:
                self.stage.load_from(self.board)
            else:
                self.stage.load(m.version, m.state)
        self.load_s += time.perf_counter() - t0
        self.loads += 1

    def _reshape(self, m: Reshape) -> None:
        """Run with ``m``'s shape from the next batch on (the groups: this replica's envs)."""
        mine = ([e for e in grp if e in self.served] for grp in m.groups)
        self.groups = [g for g in mine if g]
        self.step_level = m.step_level
        self.batch_min, self.batch_max = max(1, int(m.batch_min)), m.batch_max

    def _set_batch(self, batch_min: int) -> None:
        self.batch_min = max(1, int(batch_min))

    def _batch(self) -> int | None:
        return self.batch_min

    def _account(self, ready: OrderedDict[int, float], decisions: np.ndarray) -> None:
        """Charge the time since the last call to the envs blocked then; recount them."""
        now = time.perf_counter()
        self.blocked_env_s += self._n_blocked * (now - self._t_acc)
        self._t_acc = now
        self._n_blocked = sum(1 for e in ready if not self._eligible(e, decisions))

    def _rebind(self) -> None:
        """Level 3: idle env workers' cores go to stragglers (see rebind.py)."""
        if not (self.plan.rebind and self.home):
            return
        want = rebind_plan(self.home, self.pending)
        moves = {
            self.pids[w]: c for w, c in want.items() if c != self.bound.get(w) and w in self.pids
        }
        if moves:
            self.rebinder(moves)
            self.bound.update({w: c for w, c in want.items() if w in self.pids})
            self.rebinds += 1

    def _hello(self, m: Hello) -> None:
        if m.incarnation > self.incarnation[m.worker]:
            self._replaced(m)
        self.pids[m.worker] = m.pid

    def _on_ready(self, m: Ready) -> None:
        """Envs whose observation waits for an action (a chunk done, or handed over)."""
        now = time.perf_counter()
        for i, e in enumerate(m.env_ids.tolist()):
            self.ready[e] = now
            if m.payload is not None:
                self.payload[e] = m.payload[i]
            if e in self.fresh:  # handed over by a rewire
                self.fresh.discard(e)
            elif self.decisions[e] > 0:  # its chunk is done (not the first obs)
                self.pending[self._owner[e]] -= 1
        self._rebind()

    def _replaced(self, m: Hello) -> None:
        """A replacement env worker: forget its predecessor's envs' state, count what was lost
        (decisions issued after the last segment the learner has of it), talk to the new one."""
        decisions, ready, payload = self.decisions, self.ready, self.payload
        w = m.worker
        mine = np.array(self.plan.workers[w], dtype=np.int64)
        self.lost_decisions += int((decisions[mine] - m.first_decision).clip(min=0).sum())
        decisions[mine] = m.first_decision
        for e in mine.tolist():
            ready.pop(e, None)
            payload.pop(e, None)
        self.pending[w] = 0
        with contextlib.suppress(OSError):
            self.envs[w].close()
        self.envs[w] = Outbox(m.address, self.authkey)
        self.incarnation[w] = m.incarnation
        self.gone.discard(w)

    def _resync(self, m: Resync) -> None:
        """A replacement replica learns where env worker ``m.worker``'s envs stand: the
        decisions they have taken (the staleness gate and the segments count from there), and
        which are still stepping a chunk; the others' Ready follows as a hand-over."""
        w = m.worker
        for e, n in m.decisions.items():
            self.decisions[int(e)] = int(n)
        self.pids[w] = m.pid
        self.pending[w] = len(m.stepping)
        stepping = set(m.stepping)
        self.fresh.update(e for e in self.plan.workers[w] if e not in stepping)

    def _send_go(self, w: int, go: Go) -> bool:
        """Hand env worker ``w`` its chunks; False if its process is gone (the driver replaces
        it, and the replacement's Hello resets its envs here)."""
        if w in self.gone:
            return False
        try:
            self.envs[w].send(go)
            return True
        except OSError:
            self.gone.add(w)
            self.pids.pop(w, None)
            return False

    def _eligible(self, e: int, decisions: np.ndarray) -> bool:
        # the decision lands in the attempt's segment decisions[e] // T, trained by learner
        # version start_version + that index; acting with version v keeps staleness <= k iff
        # start_version + index - v <= k
        plan = self.plan
        trainer = plan.start_version + decisions[e] // plan.decisions_per_env
        return trainer - plan.staleness <= self.stage.version and self._owner[e] not in self.gone

    def _pick(self, ready: OrderedDict[int, float], decisions: np.ndarray) -> list[int]:
        """The next batch by the engine's rule, :func:`ebrl.resources.model.pick` (the schedule
        model plays the same function). Lock step: whole groups only (the barrier of levels
        1-2), one group per batch, so the first group's chunks go out while the generator works
        on the next (pipelining); the barrier is over the envs of the group the staleness gate
        lets act (in lock step all of them or none, but the envs of a replaced env worker
        restart a segment behind the rest of their group and catch up on their own). Step
        level: the first M eligible ready envs, or all of them once the oldest has waited the
        timeout."""
        plan = self.plan
        return pick(
            ready,
            lambda e: self._eligible(e, decisions),
            self.groups,
            self.step_level,
            self.batch_min,
            plan.batch_timeout_s,
            time.perf_counter(),
            self.batch_max,
        )

    def _loop(self) -> None:
        plan, tl = self.plan, self.timeline
        owner = self._owner
        # env id -> when it became ready; its observation (inline slots only); decisions taken
        ready: OrderedDict[int, float] = OrderedDict()
        payload: dict[int, np.ndarray] = {}
        decisions = np.zeros(plan.slots.num_envs, dtype=np.int64)
        self.ready, self.payload, self.decisions = ready, payload, decisions
        batches = sizes = depth = 0.0
        counted = -1  # the weights version whose counters last went out
        while True:
            self._account(ready, decisions)
            batch = self._pick(ready, decisions)
            if not batch:
                eligible = [e for e in ready if self._eligible(e, decisions)]
                timeout = None
                if eligible:  # wait out the batching timeout of the oldest eligible env
                    timeout = max(
                        0.0, plan.batch_timeout_s - (time.perf_counter() - ready[eligible[0]])
                    )
                msgs = self.inbox.recv(timeout=timeout if timeout is None else timeout + 1e-4)
                if self._handle(msgs):
                    return
                continue
            ids = np.array(batch, dtype=np.int64)
            depth += len(ready)
            obs = (
                np.stack([payload.pop(e) for e in batch])
                if self.inline
                else self.slots.get_obs(ids)
            )
            t_gen = time.perf_counter()
            with tl.span("gen", self.name, batch=len(ids)):
                chunk = self.stage.generate(
                    Observation(obs=torch.from_numpy(obs), env_ids=torch.from_numpy(ids))
                )
            self.gen_busy_s += time.perf_counter() - t_gen
            for e in batch:
                del ready[e]
            decisions[ids] += 1
            self.decided += len(ids)
            batches += 1
            sizes += len(ids)
            by_worker: dict[int, list[int]] = {}
            for row, e in enumerate(batch):
                by_worker.setdefault(owner[e], []).append(row)
            for w, rows in by_worker.items():
                part = chunk.select(torch.tensor(rows))
                go = Go(part.env_ids.numpy(), self.slots.put_chunk(part), self.epoch)
                if self._send_go(w, go):
                    self.pending[w] += len(rows)
            self._rebind()
            # out at least once per weights version (about one update), not only every
            # flush_every_s: the driver measures the generator's capacity update by update
            # (Algorithm 1's monitors), and an update can take less than flush_every_s
            fresh = self.stage.version != counted
            counted = self.stage.version
            self.flush(
                {
                    "pipeline/gen_batch_mean": sizes / batches,
                    "pipeline/ready_depth_mean": depth / batches,
                    "pipeline/gen_version": float(self.stage.version),
                    "resource/rebinds": float(self.rebinds),
                    "resource/gen_decisions": float(self.decided),
                    "resource/gen_busy_s": self.gen_busy_s,
                    "resource/gen_blocked_env_s": self.blocked_env_s,
                    "resource/gen_clock": time.perf_counter(),
                    "fault/lost_decisions": float(self.lost_decisions),
                    "pipeline/weights_load_s_mean": self.load_s / max(1, self.loads),
                },
                force=fresh,
            )


# --- training ---------------------------------------------------------------------------------
class StalenessError(RuntimeError):
    """A segment held data older than the bound allows (a scheduler bug, never tolerated)."""


class LearnerWorker(_Worker):
    """One rank of the learner. Rank 0, the leader, assembles segments from the env workers'
    parts, hands each to the other ranks, trains, publishes the weights to every replica and
    reports; ranks >= 1 train on what the leader hands them (every rank trains on its shard of
    each minibatch; the gradients are summed across ranks, ``ebrl.runtime.dist``). Under FSDP
    the ranks gather the full weights together after every update, and the leader publishes them.

    Args:
        rank: this rank (0: the leader).
        world: L, the learner's ranks.
        board: leader only: publish the weights on a shared-memory board (replicas on this
            machine read it; a replica elsewhere gets them inline). False: always inline.
        owner_pid: the driver's pid, which the board is named for.
        device: where the stage trains.
        strategy: ``ddp`` or ``fsdp`` (:mod:`ebrl.runtime.dist`), for ``world > 1``.
    """

    name = "learner"
    #: the leader's (the other ranks take segments from its broadcast, and None to stop)
    handlers: ClassVar[dict[type, str]] = {
        Part: "_part",  # an env worker's share of a segment
        Lost: "_lost",  # an env worker died: which segment its replacement owes (driver)
        Reconnect: "_reconnect",  # a replaced replica (driver)
        Resources: "apply_resources",  # threads, cores (driver)
    }

    def __init__(
        self,
        factory: StageFactory,
        authkey: bytes,
        driver_host: str,
        rank: int = 0,
        world: int = 1,
        board: bool = True,
        owner_pid: int = 0,
        device: str = "cpu",
        strategy: str = "ddp",
    ) -> None:
        super().__init__(factory, authkey, driver_host)
        self.rank, self.world = rank, world
        self.strategy = strategy
        self.name = learner_name(rank)
        self.use_board = board and rank == 0
        self.owner_pid = owner_pid or os.getpid()
        self.board: WeightBoard | None = None
        #: replicas sent the whole state inline (the others get it whole next time)
        self._sent_whole: set[int] = set()
        self.dp = None
        self.device = device

    def open(self) -> tuple[Address, tuple[str, int] | None, BoardSpec | None]:
        """Build the stage; return the inbox, and for the leader the rendezvous address of a
        learner of several ranks and the weight board's spec (None where there is none)."""
        self.stage = self.factory.train(device=self.device)
        address = self._open_inbox()
        lead = self.rank == 0 and self.world > 1
        # asked once: on a node with several interfaces a second answer could name another, and
        # the ranks' rendezvous and the weights' broadcast must advertise the same address
        cast = cast_address() if lead or self.use_board else None
        dist = None
        if lead:
            # where the other ranks reach it: this node's address as other nodes see it (the
            # inbox of a leader on the driver's machine advertises 127.0.0.1), on its own port
            host = cast[0] if cast is not None else address[0]
            dist = (host, free_port(host))
        if self.use_board:
            # named for the driver's pid (its orphan watchdog sweeps it) when on its machine
            owner = os.getpid() if self.inline else self.owner_pid
            # after the first publish, only what an update changes is copied onto it
            self.board = WeightBoard.create(self._state(), owner, self.stage.changing(), cast)
        return address, dist, self.board.spec if self.board is not None else None

    def _state(self) -> dict[str, torch.Tensor]:
        """The full weights to publish (under FSDP the leader's copy gathered after each
        update; before sharding, at ``open``, the whole policy's own)."""
        return self.stage.state()

    def _connect(self, links: Links) -> None:
        # replica -> (its inbox, whether it reads the board); None while a dead one is replaced
        self.gens: list[tuple[Outbox | None, bool]] = [
            (Outbox(a, self.authkey), via_board) for a, via_board in links.gens
        ]
        self._check_version()
        if links.world > 1:
            assert links.dist is not None
            device = next(self.stage.algo.policy.parameters()).device
            self.dp = init_group(
                links.rank, links.world, links.dist, device=device, strategy=self.strategy
            )
            self.stage.join(self.dp)  # FSDP: every rank keeps its shards of the loaded state
        if links.cast is not None and self.board is not None:  # replicas on other nodes
            self.board.cast_to(links.cast, next(self.stage.algo.policy.parameters()).device)
        if self.plan.train_resources is not None:
            self.apply_resources(self.plan.train_resources)

    def _close(self) -> None:
        if self.dp is not None:
            destroy()
            self.dp = None
        if self.board is not None:
            self.board.close()

    def _loop(self) -> None:
        if self.rank == 0:
            self._lead()
        else:
            self._follow()

    def _hand_on(self, seg: Segment | None) -> Segment | None:
        """Leader: give ``seg`` (None: stop) to the other ranks; others: receive it."""
        if self.dp is None:
            return seg
        box = [seg]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def _follow(self) -> None:
        tl = self.timeline
        while True:
            seg = self._hand_on(None)
            if seg is None:
                return
            with tl.span("train", self.name, steps=seg.num_steps):
                self.stage.train(seg)
            self.flush()

    def _publish(self) -> None:
        """The new weights to every replica: on the board for those on this machine (one copy
        in all), inline for the others."""
        with self.timeline.span("sync", self.name):
            if self.board is not None:
                self.publish_s += self.board.publish(self.stage.version, self._state())
            inline: dict = {}  # the state dicts, built once if a replica needs them inline
            for r in range(len(self.gens)):
                self._send_weights(r, inline)

    def _send_weights(self, r: int, inline: dict) -> None:
        """The current version to replica ``r``; a replica whose process is gone is skipped
        until the driver replaces it (:class:`Reconnect`). Inline, a replica gets the whole
        state once, then the tensors an update changes (``inline``: those built so far)."""
        out, via_board = self.gens[r]
        if out is None:
            return
        version = self.stage.version
        board = via_board and self.board is not None
        if board:
            msg = Weights(version, None)
        else:
            whole = r not in self._sent_whole
            if whole not in inline:
                inline[whole] = self.stage.weights(changing_only=not whole)[1]
            msg = Weights(version, inline[whole])
        try:
            out.send(msg)
        except OSError:
            self.gens[r] = (None, via_board)
            return
        if not board:
            self._sent_whole.add(r)

    def _part(self, m: Part) -> None:
        self.parts.setdefault(m.index, {})[m.worker] = m

    def _lost(self, m: Lost) -> None:
        """Its replacement starts at the first segment the leader misses its part of."""
        owed = self.segment
        while m.worker in self.parts.get(owed, {}):
            owed += 1
        self.driver.send(Owed(m.worker, owed))

    def _reconnect(self, m: Reconnect) -> None:
        """A replaced replica: the weights now, the whole state (a new process)."""
        with contextlib.suppress(OSError):
            if (old := self.gens[m.replica][0]) is not None:
                old.close()
        self.gens[m.replica] = (Outbox(m.address, self.authkey), m.via_board)
        self._sent_whole.discard(m.replica)
        self._send_weights(m.replica, {})

    def _lead(self) -> None:
        plan, tl = self.plan, self.timeline
        n_workers = len(plan.workers)
        # segment index -> env worker -> its part; the next segment to train
        parts: dict[int, dict[int, Part]] = {}
        self.parts, self.segment = parts, 0
        self.publish_s = 0.0
        while True:
            if self._handle(self.inbox.recv(timeout=None)):
                self._hand_on(None)  # the other ranks leave their loop too
                return
            while len(parts.get(self.segment, {})) == n_workers and not plan.budget.spent(
                self.stage.version, self.stage.trained_env_steps
            ):
                got = parts.pop(self.segment)
                seg = Segment.cat_envs([got[w].segment for w in range(n_workers)])
                stale = int((self.stage.version - seg.policy_version).max())
                if stale > plan.staleness:
                    raise StalenessError(
                        f"segment {self.segment} holds data {stale} versions old; "
                        f"the bound is {plan.staleness}"
                    )
                t0 = time.perf_counter()
                with tl.span("train", self.name, steps=seg.num_steps):
                    self._hand_on(seg)
                    metrics = self.stage.train(seg)
                # the learner's throughput for the allocator: decisions trained per second
                t_len, n_envs = seg.shape
                metrics["resource/train_per_s_update"] = (
                    t_len * n_envs / max(time.perf_counter() - t0, 1e-9)
                )
                self._publish()
                metrics["pipeline/weights_publish_s"] = self.publish_s / (self.segment + 1)
                if self.board is not None:
                    metrics.update(self.board.cast_metrics())
                if self.dp is not None:  # the ranks' backend: 1 NCCL, 0 gloo
                    metrics["train/dist_nccl"] = float(self.dp.backend == "nccl")
                metrics.update(EpisodeStats.merge([got[w].episodes for w in range(n_workers)]))
                self.driver.send(Report(self.segment, seg.num_steps, metrics))
                self.flush(force=True)
                self.segment += 1
