"""The run's tracker: MLflow behind a small interface (:class:`Tracker`), and a no-op for
tests and debugging (:class:`NullTracker`, ``tracking.enabled=false``).

:class:`MLflowTracker` drives one MLflow run (created, or continued by a resumed job) in the store
of :mod:`ebrl.tracking.store`; with a spool (:mod:`ebrl.tracking.spool`) a server that goes away
mid-run does not stop training. It also counts the run's attempts (:data:`ATTEMPTS`,
:data:`PREEMPTIONS`) and can run MLflow's system-metrics monitor beside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from ebrl.tracking.spool import METRIC_BATCH, Spool
from ebrl.tracking.store import (
    bounded_http,
    experiment_id,
    local_store_uri,
    rejected,
    send_errors,
    short_error,
)

log = logging.getLogger(__name__)


class Tracker(Protocol):
    """What a run logs through: its parameters once, metrics per step, files, and its final
    status (``run_id``: the run in the store, None when nothing is tracked)."""

    run_id: str | None

    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...
    def finish(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Tracks nothing (``tracking.enabled=false``)."""

    run_id: str | None = None

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def finish(self, status: str = "FINISHED") -> None:
        pass


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be reached when a run starts: the run cannot be created without
    it, so the job stops before training rather than training untracked."""


class MLflowTracker:
    """One MLflow run, driven through ``MlflowClient`` (no global active-run state).

    With a ``spool``, a tracking server that goes away mid-run does not stop training: every
    metric is first appended to the spool, then sent; what could not be sent is resent, in
    order and with its own step and timestamp, on the next call after the server returns, at
    :meth:`finish`, or later by ``python -m ebrl.tracking replay <run_dir>``. Each attempt is
    short (``timeout_s``, no MLflow retries), so a dead server costs training a refused
    connection per call. Without a spool, a failed request raises as MLflow raises it.

    Args:
        uri: tracking URI (``sqlite:///...``, ``http://...``); ``store`` is used when None.
        store: local store folder for the default sqlite URI.
        experiment: experiment name, created if missing.
        run_name: display name of the run.
        tags: tags set on the run at creation.
        resume_id: continue this existing run (a resumed job) instead of creating one.
        spool: file in the run folder (``<run_dir>/mlflow_spool.jsonl``) that keeps the metrics
            until the server has them; its sidecar ``mlflow_spool.state.json`` keeps how far.
        timeout_s: limit of one request during the run (rounded up to whole seconds: MLflow
            reads an int).
        finish_timeout_s: how long :meth:`finish` keeps retrying before leaving the rest, and
            the final status, to the replay command.
        system_metrics: log MLflow's system metrics (``system/...``: CPU, memory, disk,
            network, and each GPU through NVML) from a thread of its own until :meth:`finish`.
            They go straight to the store, not through the spool: an outage ends them (MLflow's
            monitor stops when it cannot read the run), training goes on.
        system_metrics_interval_s: seconds between two system-metrics samples.

    Raises:
        TrackingUnavailable: the store is unreachable when the run starts (creating or resuming
            the run needs it).
    """

    def __init__(
        self,
        *,
        uri: str | None,
        store: str | Path,
        experiment: str,
        run_name: str,
        tags: dict[str, str],
        resume_id: str | None = None,
        spool: str | Path | None = None,
        timeout_s: float = 2.0,
        finish_timeout_s: float = 30.0,
        system_metrics: bool = False,
        system_metrics_interval_s: float = 10.0,
    ) -> None:
        import mlflow  # heavy import (~2 s): only when tracking is on
        from mlflow.tracking import MlflowClient

        artifact_root = None
        if uri is None:
            uri, artifact_root = local_store_uri(store)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.timeout_s = timeout_s
        self.finish_timeout_s = finish_timeout_s
        self._entities = mlflow.entities
        #: this attempt's number and the earlier attempts a stop signal ended (``ATTEMPTS``)
        self.attempts, self.preemptions = 1, 0
        with self._needed():
            exp_id = experiment_id(self.client, experiment, artifact_root)
            if resume_id is not None:
                self.run_id: str | None = resume_id
                pending = Spool.read_state(spool).get("status") if spool is not None else None
                self.attempts, self.preemptions = _attempt_counts(
                    self.client.get_run(resume_id), pending
                )
                self.client.update_run(resume_id, status="RUNNING")
                self.client.set_tag(resume_id, "resumed", "true")
            else:
                run = self.client.create_run(exp_id, run_name=run_name, tags=tags)
                self.run_id = run.info.run_id
        self._monitor = (
            _start_system_metrics(uri, self.run_id, system_metrics_interval_s, resume_id)
            if system_metrics
            else None
        )
        self._spool = None if spool is None else Spool(spool, uri, self.run_id)
        if self._spool is not None:
            self._spool.state["status"] = None  # running again: this attempt's finish sets it
            self._spool.save()
            self._spool.send(self.client, timeout_s)  # what an earlier attempt left unsent
        self.log_metrics({ATTEMPTS: self.attempts, PREEMPTIONS: self.preemptions}, step=0)

    @contextmanager
    def _needed(self) -> Iterator[None]:
        """Requests a run cannot start without: a few quick retries, then a clear error."""
        try:
            with bounded_http(max(self.timeout_s, 10.0), retries=2):
                yield
        except send_errors() as err:
            if rejected(err, self.uri):
                raise
            raise TrackingUnavailable(
                f"MLflow tracking at {self.uri} is unavailable at the start of the run "
                f"({short_error(err)}). Start the server (e.g. `mlflow server --host 127.0.0.1 "
                "--port PORT`), point tracking.uri at a running one, or run with "
                "tracking.enabled=false."
            ) from err

    def log_params(self, params: dict[str, Any]) -> None:
        """Log the run's parameters (once, at the start: an outage here stops the job)."""
        items = [self._entities.Param(k, str(v)[:6000]) for k, v in params.items()]
        with self._needed():
            for i in range(0, len(items), 100):  # MLflow's batch limit is 100 params
                self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._spool is not None:
            self._spool.append(metrics, step)
            self._spool.send(self.client, self.timeout_s)
            return
        ts = int(time.time() * 1000)
        items = [self._entities.Metric(k, float(v), ts, step) for k, v in metrics.items()]
        for i in range(0, len(items), METRIC_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + METRIC_BATCH])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file (into the folder ``artifact_path`` of the run's artifacts, or their
        top); during an outage it is recorded and uploaded at :meth:`finish`."""
        if self._spool is None:
            self.client.log_artifact(self.run_id, str(path), artifact_path)
            return
        resolved = str(Path(path).resolve())
        p: str | list[str] = resolved if artifact_path is None else [resolved, artifact_path]
        queued = self._spool.state["artifacts"]
        if p not in queued and (
            self._spool.down or not self._spool.upload(self.client, p, self.timeout_s)
        ):
            queued.append(p)
            self._spool.save()

    def finish(self, status: str = "FINISHED") -> None:
        """Send what is left, then set the final status. Raises nothing for an outage: what the
        server could not get in ``finish_timeout_s`` stays in the spool for the replay command,
        which then sets the status."""
        self._stop_system_metrics()  # before the status: MLflow's monitor reads it to stop
        if self._spool is None:
            self.client.set_terminated(self.run_id, status=status)
            return
        sp = self._spool
        if not sp.deliver(self.client, status, self.finish_timeout_s, self.timeout_s):
            log.error(
                "MLflow server at %s unreachable at the end of the run; not sent: %s (kept in %s; "
                "run %s stays RUNNING there). When the server is back, send them with: %s",
                self.uri,
                sp.left(),
                sp.path,
                self.run_id,
                sp.replay_command(),
            )

    def _stop_system_metrics(self) -> None:
        """Stop MLflow's system-metrics monitor and send what it holds, waiting a bounded time:
        its requests during an outage retry for minutes, and the run's end must not wait for
        them."""
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        stopper = threading.Thread(target=monitor.finish, name="system-metrics-stop", daemon=True)
        stopper.start()
        stopper.join(timeout=max(10.0, 2 * self.timeout_s))
        if stopper.is_alive():
            log.warning("MLflow system metrics: the monitor did not stop in time; left behind")


#: metrics of a run's attempts, logged when each starts (step 0; the latest value counts): a
#: FINISHED run shows the attempts before it. Its attempt number (1 for a new run, one more for
#: each resume), and how many earlier attempts a stop signal ended (SIGTERM, USR2, SIGINT: the
#: run was then KILLED; a driver killed outright leaves it RUNNING and is not counted)
ATTEMPTS, PREEMPTIONS = "fault/attempts", "fault/preemptions"


def _attempt_counts(run: Any, pending_status: str | None) -> tuple[int, int]:
    """(this attempt's number, earlier attempts stopped by a signal) of a resumed MLflow run,
    from the counts its last attempt logged and how that attempt ended (its status, or the
    status its spool still had to send)."""
    metrics = run.data.metrics
    attempts = int(metrics.get(ATTEMPTS, 1)) + 1
    status = pending_status or run.info.status
    return attempts, int(metrics.get(PREEMPTIONS, 0)) + (status == "KILLED")


def system_metrics_wanted(mode: str) -> bool:
    """Whether ``tracking.system_metrics`` (``auto``, ``true``, ``false``) turns MLflow's system
    metrics on here: ``auto`` where this process sees a GPU (NVML, ``CUDA_VISIBLE_DEVICES``
    honoured), since on a CPU-only machine its sampler competes with a timing run for the few
    cores."""
    mode = str(mode).strip().lower()
    if mode == "auto":
        from ebrl.utilisation import gpu_visible

        return gpu_visible()
    return mode == "true"


def _start_system_metrics(
    uri: str, run_id: str | None, interval_s: float, resume_id: str | None
) -> Any | None:
    """MLflow's system-metrics monitor for ``run_id``, started; None (and a warning) when it
    cannot start. A resumed run continues its system metrics' steps."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        with bounded_http(10.0, retries=2):
            monitor = SystemMetricsMonitor(
                run_id,
                sampling_interval=interval_s,
                resume_logging=resume_id is not None,
                tracking_uri=uri,
            )
        monitor.start()
    except Exception as e:  # e.g. psutil missing: the run goes on without them
        log.warning("MLflow system metrics not started (%s: %s)", type(e).__name__, e)
        return None
    log.info("MLflow system metrics on: every %.0f s (tracking.system_metrics)", interval_s)
    return monitor
