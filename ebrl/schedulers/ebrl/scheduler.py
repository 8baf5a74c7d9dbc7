"""The EBRL asynchronous pipelined scheduler, driver side (README.md, "What is here").

Three levels, each switchable for the paper's ablation:

1. ``overlap`` (inter-iteration overlap): rollout of segment i+1 runs while the learner trains on
   segment i; the acting policy is at most ``staleness`` (k) versions behind the learner that
   consumes the data. The generator enforces the bound when it picks envs to act for, the learner
   re-checks every segment, and the loss corrects the lag (decoupled PPO). ``overlap=false`` means
   k = 0: the rollout waits for each update.
2. ``pipeline`` (env-group pipelining): each env worker's envs form G = ``env_groups`` groups; while
   one group simulates, another's observations are on the generator. ``pipeline=false``: G = 1.
3. ``step_level`` (step-level orchestration): every env advances on its own. The env worker reports
   each env the moment its chunk is done; the generator acts on the first ``batch_min`` ready envs
   (or whoever is ready after ``batch_timeout_ms``). ``step_level=false``: the generator waits for
   a whole group and the env worker steps a group's chunks together.

With all three off this is a synchronous schedule on the same worker processes, which is what the
throughput benchmark compares EBRL against.

The driver only wires workers, relays reports and merges telemetry: per-step data flows worker to
worker (``ebrl.schedulers.ebrl.workers``). It also runs the resource manager (``manage.py``): the
``resources`` group sets the generator's and the learner's threads, cores and the generator's batch
size, and with ``resources.allocator=elastic`` Algorithm 1 re-splits them while the run goes on.
Whatever the workers change (in-process: threads of this process), the driver's affinity and torch
threads are restored when the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ebrl.resources.apply import affinity_guard, threads_guard
from ebrl.runtime.backend import InProcessBackend, RayBackend, WorkerDied
from ebrl.runtime.channel import Inbox, Outbox, new_authkey, node_ip
from ebrl.runtime.slots import ShmSlots, SlotSpec
from ebrl.schedulers.base import IterationReport, RunContext, StageError
from ebrl.schedulers.ebrl import manage
from ebrl.schedulers.ebrl.manage import ResourceDriver
from ebrl.schedulers.ebrl.messages import (
    Applied,
    Beat,
    Failed,
    Lost,
    Owed,
    Report,
    Stop,
    Telemetry,
)
from ebrl.schedulers.ebrl.rebind import home_cores
from ebrl.schedulers.ebrl.workers import EnvWorker, GenWorker, LearnerWorker, Plan

log = logging.getLogger(__name__)


def env_groups(workers: list[list[int]], groups: int) -> list[list[int]]:
    """Group g = the g-th contiguous share of every worker's envs (so every worker has work
    in every group, and alternating groups keeps every worker busy)."""
    out: list[list[int]] = [[] for _ in range(groups)]
    for ids in workers:
        for g, part in enumerate(np.array_split(np.array(ids, dtype=np.int64), groups)):
            out[g].extend(int(e) for e in part)
    return [g for g in out if g]


@dataclass
class EBRLScheduler:
    """Asynchronous pipelined scheduler. Config: ``conf/scheduler/ebrl.yaml``.

    Args:
        backend: ``ray`` (one process per worker) or ``inprocess`` (threads; tests, debugging).
        sim_workers: env worker processes.
        overlap: level 1.
        staleness: k, 0..8 (forced to 0 when ``overlap`` is off).
        pipeline: level 2 (G = the run's ``env_groups``; 1 when off).
        step_level: level 3.
        batch_min: M of "first M of N" (None: half a group).
        batch_timeout_ms: how long a ready env waits for M to be reached.
        ray_address: ``local`` (a private Ray instance) or a cluster address.
        resources: Ray custom resources per role (``sim``, ``gen``, ``learner``) for placement.
        pin_sim: pin each env worker to a home core (round robin over this process's CPUs).
        rebind: level 3's core rebinding: idle env workers' cores go to straggling ones
            (implies ``pin_sim``; needs ``step_level``).
        max_restarts: env worker processes that may die (a simulator crash, the OOM killer)
            and be replaced during the run, in all; one more stops it with a StageError.
        hang_timeout_s: a worker whose heartbeat stops for this long is hung (frozen, or
            stuck holding the GIL): an env worker is killed and replaced, a generator or
            learner stops the run with a StageError (None: no heartbeats).
    """

    backend: str = "ray"
    sim_workers: int = 2
    overlap: bool = True
    staleness: int = 1
    pipeline: bool = True
    step_level: bool = True
    batch_min: int | None = None
    batch_timeout_ms: float = 5.0
    ray_address: str = "local"
    resources: dict[str, dict[str, float]] | None = None
    pin_sim: bool = False
    rebind: bool = False
    max_restarts: int = 3
    hang_timeout_s: float | None = 120.0

    def __post_init__(self) -> None:
        if self.rebind and not self.step_level:
            raise ValueError("scheduler.rebind needs scheduler.step_level=true (level 3)")
        if self.backend not in ("ray", "inprocess"):
            raise ValueError(f"scheduler.backend={self.backend!r}: choose 'ray' or 'inprocess'")
        if not 0 <= self.staleness <= 8:
            raise ValueError(f"scheduler.staleness={self.staleness}: must be within 0..8")
        if self.sim_workers < 1:
            raise ValueError("scheduler.sim_workers must be >= 1")
        if self.hang_timeout_s is not None and self.hang_timeout_s <= 0:
            raise ValueError(
                f"scheduler.hang_timeout_s={self.hang_timeout_s}: must be > 0 (or null: off)"
            )
        if self.max_restarts < 0:
            raise ValueError(f"scheduler.max_restarts={self.max_restarts}: must be >= 0")

    @property
    def k(self) -> int:
        return self.staleness if self.overlap else 0

    def plan(
        self, ctx: RunContext, slots: SlotSpec, resources: ResourceDriver | None = None
    ) -> Plan:
        n = int(ctx.factory.cfg["num_envs"])
        if self.sim_workers > n:
            raise ValueError(f"scheduler.sim_workers={self.sim_workers} > num_envs={n}")
        workers = ctx.factory.env_partition(self.sim_workers)
        g = ctx.env_groups if self.pipeline else 1
        groups = env_groups(workers, min(g, min(len(w) for w in workers)))
        m = self.batch_min or max(1, math.ceil(n / len(groups) / 2))
        plan = Plan(
            workers=workers,
            groups=groups,
            decisions_per_env=ctx.decisions_per_env,
            staleness=self.k,
            step_level=self.step_level,
            batch_min=m,
            batch_timeout_s=self.batch_timeout_ms / 1000,
            slots=slots,
            home=home_cores(len(workers), sorted(os.sched_getaffinity(0)))
            if (self.pin_sim or self.rebind)
            else None,
            rebind=self.rebind,
            driver_pid=os.getpid(),
            start_version=ctx.factory.start_version,
            budget=ctx.budget,
            heartbeat_s=min(1.0, self.hang_timeout_s / 10) if self.hang_timeout_s else None,
        )
        if resources is None:
            return plan
        gen, train = resources.start_messages()
        home = resources.resources.sim_home
        return dataclasses.replace(
            plan,
            home=home if home is not None else plan.home,
            gen_resources=gen,
            train_resources=train,
        )

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        # in-process workers are threads of this process: what they set must not outlive the run
        with affinity_guard(), threads_guard():
            yield from self._run(ctx)

    def _run(self, ctx: RunContext) -> Iterator[IterationReport]:
        backend = (
            InProcessBackend() if self.backend == "inprocess" else RayBackend(self.ray_address)
        )
        authkey, host = new_authkey(), node_ip()
        inbox = Inbox(authkey)
        slots: ShmSlots | None = None
        handles: list = []
        peers: dict[str, Any] = {"driver": inbox.address}
        res = self.resources or {}
        manager: ResourceDriver | None = None
        try:
            factory = ctx.factory
            workers = factory.env_partition(self.sim_workers)
            for w, ids in enumerate(workers):
                h = backend.spawn(
                    f"sim{w}", EnvWorker, w, ids, factory, authkey, host, resources=res.get("sim")
                )
                handles.append(h)
            # sim workers build their envs first: they report the spec the policy is built from
            for w, h in enumerate(handles):
                peers[f"sim{w}"], spec = h.open()
            n, k = int(factory.cfg["num_envs"]), int(factory.cfg["chunk_size"])
            slots = ShmSlots.create(n, spec.obs_dim, k, spec.action_dim)
            factory = factory.with_spec(spec)
            plan = self.plan(ctx, slots.spec)
            manager = manage.setup(
                factory,
                len(workers),
                max(len(g) for g in plan.groups),
                ctx.decisions_per_env,
            )
            plan = self.plan(ctx, slots.spec, manager)
            for role, cls in (("gen", GenWorker), ("learner", LearnerWorker)):
                h = backend.spawn(role, cls, factory, authkey, host, resources=res.get(role))
                handles.append(h)
                peers[role] = h.open()
            for h in handles:
                h.start(peers, plan)
            if manager is not None:
                manager.connect(peers, authkey)
            restarts = _EnvRestarts(
                backend, factory, workers, authkey, host, res.get("sim"), peers, plan,
                self.max_restarts,
            )  # fmt: skip
            yield from self._relay(inbox, handles, ctx, plan, manager, restarts)
        finally:
            if manager is not None:
                manager.close()
            self._shutdown(inbox, handles, backend, slots, peers, authkey)

    def _relay(
        self,
        inbox: Inbox,
        handles: list,
        ctx: RunContext,
        plan: Plan,
        manager: ResourceDriver | None = None,
        restarts: _EnvRestarts | None = None,
    ):
        """Yield the learner's reports; merge telemetry; replace dead env workers; turn any
        other failure into a StageError."""
        gauges: dict[str, float] = {}
        beats = _Heartbeats(self.hang_timeout_s, handles)
        while True:
            for m in inbox.recv(timeout=0.5):
                if isinstance(m, Beat):
                    beats.seen(m.worker)
                elif isinstance(m, Owed) and restarts is not None:
                    restarts.replace(m, handles)
                elif isinstance(m, Report):
                    metrics = {**m.metrics, **gauges}
                    metrics["pipeline/staleness_bound"] = float(plan.staleness)
                    if restarts is not None:
                        metrics["fault/env_worker_restarts"] = float(restarts.done)
                    if manager is not None:
                        metrics.update(manager.report(m.iteration, m.metrics))
                    yield IterationReport(m.iteration, m.env_steps, metrics)
                elif isinstance(m, Telemetry):
                    for span in m.spans:
                        ctx.timeline.add(span)
                    g = dict(m.gauges)
                    if manager is not None:
                        manager.gauges(g)
                    for k in manage.COUNTERS:  # the allocator's inputs, not run metrics
                        g.pop(k, None)
                    gauges.update(g)
                elif isinstance(m, Applied):
                    if manager is not None:
                        manager.applied(m)
                elif isinstance(m, Failed):
                    raise StageError(
                        m.worker, f"{m.error}\n--- worker traceback ---\n{m.traceback}"
                    )
            for h, silent in beats.hung():
                if restarts is None or not h.name.startswith("sim") or not hasattr(h, "kill"):
                    raise StageError(
                        h.name,
                        f"no heartbeat for {silent:.0f} s: its process is alive but hung "
                        "(frozen, or stuck in native code holding the GIL); "
                        "scheduler.hang_timeout_s sets the limit",
                    )
                log.warning("%s: no heartbeat for %.0f s; killing it", h.name, silent)
                h.kill()  # Ray then reports it dead, and it is replaced below
            for h in handles:
                if restarts is not None and h in restarts.dead:
                    continue
                try:
                    finished = h.poll()
                except WorkerDied as e:
                    if restarts is None or not h.name.startswith("sim"):
                        raise StageError(h.name, f"{type(e).__name__}: {e}") from e
                    restarts.died(h, str(e))
                    continue
                except Exception as e:
                    raise StageError(h.name, f"{type(e).__name__}: {e}") from e
                if finished:
                    raise StageError(h.name, "the worker left its loop without being stopped")

    def _shutdown(self, inbox, handles, backend, slots, peers, authkey) -> None:
        """Stop every worker (politely, then by force), free the slots; never raises."""

        def tell(addr: Any) -> None:
            with contextlib.suppress(Exception):  # a dead worker cannot be told
                out = Outbox(addr, authkey, retries=1)
                out.send(Stop())
                out.close()

        # each in a thread of its own, for at most 2 s in all: connecting to a hung worker's
        # inbox (a frozen process) never completes its handshake; such a worker is killed below
        tellers = [
            threading.Thread(target=tell, args=(addr,), daemon=True)
            for name, addr in peers.items()
            if name != "driver"
        ]
        for t in tellers:
            t.start()
        deadline = time.monotonic() + 2.0
        for t in tellers:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for h in handles:
            try:
                h.stop()
            except Exception as e:  # keep shutting the others down
                log.warning("stopping %s: %s", h.name, e)
        with contextlib.suppress(Exception):
            backend.shutdown()
        inbox.close()
        if slots is not None:
            slots.close()


class _EnvRestarts:
    """Replaces env worker processes that die while the run goes on (at most ``limit`` in all).

    A death (Ray reports the actor's process gone) is answered in two steps, neither of which
    stops the other workers: the learner is asked which segment it still needs of that worker
    (:class:`Lost` -> :class:`Owed`), then a new process with the same envs is started there.
    Its envs reset; the decisions its predecessor had taken since that segment are lost (the
    generator counts them: ``fault/lost_decisions``) and never trained on. Only env workers are
    replaced: a dead generator or learner holds state no other process has, and stops the run
    with a StageError (its checkpoint resumes it).
    """

    def __init__(
        self,
        backend: Any,
        factory: Any,
        workers: list[list[int]],
        authkey: bytes,
        host: str,
        resources: dict[str, float] | None,
        peers: dict[str, Any],
        plan: Plan,
        limit: int,
    ) -> None:
        self.backend, self.factory, self.workers = backend, factory, workers
        self.authkey, self.host, self.resources = authkey, host, resources
        self.peers, self.plan, self.limit = peers, plan, limit
        self.done = 0
        self.dead: list[Any] = []  # handles of dead processes (never polled again)

    def died(self, handle: Any, why: str) -> None:
        w = int(handle.name.removeprefix("sim"))
        if self.done >= self.limit:
            raise StageError(
                handle.name,
                f"{why}; {self.done} env worker(s) already replaced during this run "
                f"(scheduler.max_restarts={self.limit}): stopping. The checkpoint resumes it",
            )
        self.done += 1
        self.dead.append(handle)
        log.warning("%s: %s; replacing it (%d/%d)", handle.name, why, self.done, self.limit)
        out = Outbox(self.peers["learner"], self.authkey)
        out.send(Lost(w))
        out.close()

    def replace(self, owed: Owed, handles: list) -> None:
        w = owed.worker
        h = self.backend.spawn(
            f"sim{w}", EnvWorker, w, self.workers[w], self.factory, self.authkey, self.host,
            owed.index, self.done, resources=self.resources,
        )  # fmt: skip
        self.peers[f"sim{w}"], _ = h.open()
        handles.append(h)
        h.start(self.peers, self.plan)
        log.warning("sim%d: replaced; it continues at segment %d", w, owed.index)


class _Heartbeats:
    """When each worker was last heard from (its :class:`Beat`), and which have gone silent.

    A handle's clock starts when it is first seen here (its process may take a while to build
    its stage before it beats); a handle already reported hung is not reported again. Silence
    is only counted while the driver reads its inbox: after the driver itself was busy elsewhere
    (starting a replacement worker takes seconds) every clock restarts, since beats sent
    meanwhile were not read yet.
    """

    #: the driver checks every ~0.5 s; a longer gap means it was away
    AWAY_S = 2.0

    def __init__(self, timeout_s: float | None, handles: list) -> None:
        self.timeout_s = timeout_s
        self.handles = handles
        self.last: dict[str, float] = {}
        self.reported: set[int] = set()
        self.checked = time.monotonic()

    def seen(self, worker: str) -> None:
        self.last[worker] = time.monotonic()

    def hung(self) -> list[tuple[Any, float]]:
        if not self.timeout_s:
            return []
        now, out = time.monotonic(), []
        if now - self.checked > self.AWAY_S:
            self.last = dict.fromkeys(self.last, now)
        self.checked = now
        for h in self.handles:
            if id(h) in self.reported:
                continue
            last = self.last.setdefault(h.name, now)
            if now - last > self.timeout_s:
                self.reported.add(id(h))
                out.append((h, now - last))
        return out
