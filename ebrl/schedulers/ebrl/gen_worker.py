"""The generator replica: batches ready observations, acts on them, hands the chunks back.

It serves a block of env workers: batches their ready envs by the engine's rule
(:func:`ebrl.resources.model.pick`), enforces the staleness bound against its own policy version,
sends each env worker its chunks (:class:`Go`), installs the learner's weights
(:class:`Weights`), takes over from a replaced env worker (:class:`Hello`, :class:`Resync`) and,
at level 3, rebinds idle env workers' cores to stragglers (``rebind.py``). The shared machinery
is the :class:`~ebrl.schedulers.ebrl.worker.Worker` base (``worker.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from typing import ClassVar

import numpy as np
import torch

from ebrl.resources.apply import rebind_threads
from ebrl.resources.model import pick
from ebrl.runtime.channel import Address, Outbox
from ebrl.runtime.weight_cast import open_board
from ebrl.schedulers.ebrl.messages import Go, Hello, Ready, Reshape, Resources, Resync, Weights
from ebrl.schedulers.ebrl.rebind import rebind_plan
from ebrl.schedulers.ebrl.wiring import Links, gen_name
from ebrl.schedulers.ebrl.worker import Worker
from ebrl.stages.factory import StageFactory
from ebrl.types import Observation


class GenWorker(Worker):
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
