"""The env worker: one process's envs, stepped chunk by chunk as the generator sends them.

It resets its envs, hands their observations to its generator replica (:class:`Ready`), steps the
action chunks that come back (:class:`Go`; lock step: a group's chunks at once, level 3: env by
env), builds segments of ``T`` decisions and sends each as its :class:`Part` to the learner. A
replaced replica is rewired here (:class:`Rewire`). The shared machinery is the
:class:`~ebrl.schedulers.ebrl.worker.Worker` base (``worker.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from ebrl.envs.base import EnvSpec
from ebrl.ledger import StepLedger, writer_path
from ebrl.rollout import EpisodeStats, SegmentBuilder
from ebrl.runtime.channel import Address, Outbox
from ebrl.schedulers.ebrl.messages import Go, Hello, Part, Ready, Reshape, Resync, Rewire
from ebrl.schedulers.ebrl.wiring import Links
from ebrl.schedulers.ebrl.worker import Worker, pin_worker
from ebrl.stages.factory import StageFactory
from ebrl.types import Observation, Transition


class EnvWorker(Worker):
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
            pin_worker(self.plan.home[self.index], self.plan.driver_pid)
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
