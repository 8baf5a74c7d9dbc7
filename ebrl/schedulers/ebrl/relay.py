"""The driver's relay on EBRL's engine: worker messages in, the run's ``IterationReport``s out.

Once the workers are started (``spawn.py``), every message sent to the driver arrives in its one
inbox, and :func:`relay` reacts to each through a table of handlers (the workers' own tables are
their ``handlers``, in the ``*_worker.py`` modules): a learner's ``Report`` becomes an
``IterationReport`` carrying the run's gauges (:func:`merge_gauges`) and the run controller's
metrics and decisions (the shape, the split, the GPU's SMs); ``Telemetry`` goes into the
timeline and the gauges; a worker that dies or stops beating is replaced (``restarts.py``) or
stops the run (:func:`check_alive`). When the run stops, :func:`keep_last_spans` keeps the
spans the relay did not read. The engine (``scheduler.py``) starts the relay and shuts the run
down after it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ebrl.resources.controller import RunController
from ebrl.resources.shape import ShapeChoice
from ebrl.runtime.backend import Handle, WorkerDied
from ebrl.runtime.channel import Inbox
from ebrl.schedulers.base import IterationReport, RunContext, StageError
from ebrl.schedulers.ebrl import control
from ebrl.schedulers.ebrl.gpu import GpuFabric
from ebrl.schedulers.ebrl.heartbeat import HeartbeatMonitor
from ebrl.schedulers.ebrl.messages import Applied, Beat, Failed, Owed, Report, Telemetry
from ebrl.schedulers.ebrl.restarts import Restarts
from ebrl.schedulers.ebrl.worker import Schedule

log = logging.getLogger(__name__)


def relay(
    inbox: Inbox,
    handles: list[Handle],
    ctx: RunContext,
    plan: Schedule,
    gpu: GpuFabric,
    hang_timeout_s: float | None,
    controller: RunController | None = None,
    restarts: Restarts | None = None,
    unread: deque[Any] | None = None,
    searched: ShapeChoice | None = None,
    on_choice: Callable[[ShapeChoice], None] | None = None,
) -> Iterator[IterationReport]:
    """Yield the learner's reports; merge telemetry; replace dead env workers; turn any
    other failure into a StageError. ``unread`` holds what was read and not handled when
    the caller stops at a report (the shutdown keeps its spans). ``searched``: the shape
    search's outcome, logged with the first report; ``on_choice`` is told the controller's shape
    choice at every report (the trials and the shape watch may move it)."""
    by_worker: dict[str, dict[str, float]] = {}  # each worker's latest gauges
    beats = HeartbeatMonitor(hang_timeout_s, handles)
    unlogged = searched  # until the first report logs it

    def report(m: Report) -> IterationReport:
        nonlocal unlogged
        arrived = time.perf_counter()  # before the controller's work on it
        metrics = {**m.metrics, **merge_gauges(by_worker)}
        metrics["pipeline/staleness_bound"] = float(plan.staleness)
        if restarts is not None:
            metrics["fault/env_worker_restarts"] = float(restarts.sims)
            metrics["fault/gen_restarts"] = float(restarts.gens)
        if controller is not None:  # the trials, the shape watch, Algorithm 1 may move
            metrics.update(controller.report(m.iteration, m.env_steps, metrics))
            if controller.choice is not None and on_choice is not None:
                on_choice(controller.choice)
        params: dict[str, Any] = {}
        choice, unlogged = unlogged, None
        if choice is not None:  # the first report carries the shape search's outcome
            params = choice.params()
            metrics.update(choice.metrics())
        params.update(gpu.unlogged_params())  # how the GPUs were shared
        if controller is not None:
            params.update(controller.unlogged_params())  # the GPU re-splits
        return IterationReport(m.iteration, m.env_steps, metrics, params, arrived)

    def telemetry(m: Telemetry) -> None:
        for span in m.spans:
            ctx.timeline.add(span)
        g = dict(m.gauges)
        if controller is not None:
            controller.gauges(g)
        for k in control.COUNTERS:  # the controller's inputs, not run metrics
            g.pop(k, None)
        by_worker.setdefault(m.worker, {}).update(g)

    def failed(m: Failed) -> None:
        raise StageError(m.worker, f"{m.error}\n--- worker traceback ---\n{m.traceback}")

    # who reacts to what on the driver (a handler's non-None result is yielded); the
    # workers' tables are their ``handlers`` (the *_worker.py modules)
    handlers: dict[type, Callable[[Any], IterationReport | None]] = {
        Report: report,
        Telemetry: telemetry,
        Beat: lambda m: beats.seen(m.worker),
        Failed: failed,
        Owed: lambda m: restarts.replace(m, handles) if restarts is not None else None,
        Applied: lambda m: control.acknowledge(controller, m) if controller is not None else None,
    }
    unread = deque() if unread is None else unread
    while True:
        if not unread:
            unread.extend(inbox.recv(timeout=0.5))
        while unread:
            m = unread.popleft()
            handle = handlers.get(type(m))
            if handle is not None and (out := handle(m)) is not None:
                yield out
        check_alive(handles, beats, restarts)


def check_alive(handles: list[Handle], beats: HeartbeatMonitor, restarts: Restarts | None) -> None:
    """Kill a hung worker (no heartbeat) and replace a dead one where it can be replaced;
    any other hung, dead or finished worker stops the run with a StageError."""
    for h, silent in beats.hung():
        if restarts is None or not restarts.replaceable(h) or not hasattr(h, "kill"):
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
            if restarts is None or not restarts.replaceable(h):
                raise StageError(h.name, f"{type(e).__name__}: {e}") from e
            restarts.died(h, str(e), handles)
            continue
        except Exception as e:
            raise StageError(h.name, f"{type(e).__name__}: {e}") from e
        if finished:
            raise StageError(h.name, "the worker left its loop without being stopped")


def keep_last_spans(
    inbox: Inbox,
    timeline: Any,
    unread: list[Any] | None = None,
    quiet_s: float = 0.1,
    limit_s: float = 2.0,
) -> None:
    """Add to ``timeline`` the spans of ``unread`` (messages the run's loop read and did not
    handle before it stopped) and of the workers' final flushes (each worker sends one when
    it stops; the run's loop no longer reads them): read until the inbox stays quiet for
    ``quiet_s``, for at most ``limit_s``. Without it a short run's timeline misses its last
    spans, those since each worker's previous (throttled) flush."""
    deadline = time.monotonic() + limit_s
    msgs = list(unread or ())
    while True:
        for m in msgs:
            if isinstance(m, Telemetry):
                for span in m.spans:
                    timeline.add(span)
        if time.monotonic() >= deadline:
            return
        msgs = inbox.recv(timeout=quiet_s)
        if not msgs:
            return


#: gauges each replica reports whose run value is the oldest, not a sum
_MIN_GAUGES = ("pipeline/gen_version",)


def merge_gauges(by_worker: dict[str, dict[str, float]]) -> dict[str, float]:
    """The run's gauges from each worker's latest: a gauge only one worker reports is its value;
    one several replicas report is summed (counts), averaged (``*_mean``) or the oldest
    (``pipeline/gen_version``)."""
    values: dict[str, list[float]] = {}
    for g in by_worker.values():
        for k, v in g.items():
            values.setdefault(k, []).append(v)
    out = {}
    for k, vs in values.items():
        if len(vs) == 1:
            out[k] = vs[0]
        elif k in _MIN_GAUGES:
            out[k] = min(vs)
        elif k.endswith("_mean"):
            out[k] = sum(vs) / len(vs)
        else:
            out[k] = sum(vs)
    return out
