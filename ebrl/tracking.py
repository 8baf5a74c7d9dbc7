"""Experiment tracking: MLflow behind a three-method interface, and a no-op for tests/debugging.

Default store: a local sqlite database ``<tracking.store>/mlflow.db`` with artifacts in
``<tracking.store>/mlartifacts`` (``outputs/mlflow`` under the working directory unless configured).
A remote tracking server works the same way through ``tracking.uri=http://host:port``.

With a spool file in the run folder, a server that goes away mid-run does not stop training:
metrics are kept there and sent when it returns, at the end, or by
``python -m ebrl.tracking replay <run_dir>`` (see :class:`MLflowTracker`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Tracker(Protocol):
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


def local_store_uri(store: str | Path) -> tuple[str, str]:
    """(tracking URI, artifact root URI) of a local sqlite store folder."""
    root = Path(store).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}", (root / "mlartifacts").as_uri()


#: The spool's file name in a run folder: ``python -m ebrl.tracking replay <run_dir>`` looks for it.
SPOOL_NAME = "mlflow_spool.jsonl"
_BATCH = 1000  # MLflow's limit of metrics per log_batch request


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be reached when a run starts: the run cannot be created without
    it, so the job stops before training rather than training untracked."""


_ENV_LOCK = threading.RLock()


@contextmanager
def _bounded_http(timeout_s: float, retries: int = 0) -> Iterator[None]:
    """Bound MLflow's HTTP retries and per-request timeout for the requests made in the block.

    MLflow's REST client reads its retry policy from the environment at every request
    (``mlflow.utils.rest_utils.http_request``): by default 7 retries with exponential backoff,
    about 4 minutes against a dead server, and 120 s per request. That suits a rate-limited
    server, but training must not stall on a server that is gone: its metrics are in the spool
    and are resent later. The variables are process-wide, so they are set only around our own
    requests, under a lock, and restored after (another thread's MLflow request made meanwhile
    gets the short policy too).
    """
    bounded = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(timeout_s))),  # an int for MLflow
    }
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in bounded}
        os.environ.update(bounded)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _send_errors() -> tuple[type[Exception], ...]:
    """What a failed request raises: MLflow's errors (it wraps connection errors and timeouts),
    requests' and the OS's (artifact uploads raise those unwrapped)."""
    import requests
    from mlflow.exceptions import MlflowException

    return (MlflowException, requests.RequestException, OSError)


def _rejected(err: Exception, uri: str) -> bool:
    """Whether the store answered and refused the request (bad key, deleted or unknown run).

    Unlike an outage, retrying cannot help. Over HTTP only an error from MLflow itself
    (``RestException``) counts: a proxy's error page while the server is down is an outage.
    """
    from mlflow.exceptions import MlflowException, RestException

    if not isinstance(err, MlflowException):
        return False
    if uri.startswith(("http://", "https://")) and not isinstance(err, RestException):
        return False
    code = err.get_http_status_code()
    return 400 <= code < 500 and code != 429


def _artifact_entry(entry: str | list[str]) -> tuple[str, str | None]:
    """(local path, folder in the run's artifacts or None) of a spooled artifact: a path alone
    (the top of the run's artifacts, as spools before folders were written), or [path, folder]."""
    if isinstance(entry, str):
        return entry, None
    return str(entry[0]), (str(entry[1]) if len(entry) > 1 and entry[1] else None)


def _short(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


class _Spool:
    """Metric lines on disk, and how far the tracking server has them.

    Each ``log_metrics`` call appends one JSON line (step, timestamp in ms, metrics); lines are
    sent oldest first with their own step and timestamp. A sidecar ``<stem>.state.json`` keeps
    the byte offset up to which the server has them, the run id and URI they belong to, a final
    status still to set and artifacts still to upload. So neither an outage nor a crash loses a
    metric: a resumed job (same run) sends what was not sent, and ``python -m ebrl.tracking
    replay`` does so after the job ended. A line sent twice (a crash between sending it and saving
    the offset) does no harm: MLflow's SQL store ignores an exact duplicate of a logged metric.
    """

    def __init__(self, path: str | Path, uri: str, run_id: str) -> None:
        self.path = Path(path)
        self.state_path = self.path.with_suffix(".state.json")
        self.uri = uri
        self.down = False
        self._trying = 0  # end offset of the batch being sent
        state = self.read_state(self.path)
        if self.path.exists() and state.get("run_id") != run_id:
            self._move_aside(state)
            state = {}
        self.state: dict[str, Any] = {"sent": 0, "status": None, "artifacts": [], **state}
        self.state.update(uri=uri, run_id=run_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        size = self.path.stat().st_size
        if size:
            with self.path.open("rb+") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":  # a crash cut the last line: end it, it is skipped alone
                    f.write(b"\n")
        self.save()

    @staticmethod
    def read_state(path: str | Path) -> dict[str, Any]:
        sidecar = Path(path).with_suffix(".state.json")
        return json.loads(sidecar.read_text()) if sidecar.exists() else {}

    def save(self) -> None:
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.state_path)  # atomic: a crash leaves the old offset or the new one

    def _move_aside(self, state: dict[str, Any]) -> None:
        """Keep another run's spool (a new run in a reused folder) under its run id, replayable."""
        dest = self.path.with_name(f"{self.path.stem}.{state.get('run_id', 'unknown')}.jsonl")
        self.path.replace(dest)
        if self.state_path.exists():
            self.state_path.replace(dest.with_suffix(".state.json"))
        log.warning(
            "%s belongs to MLflow run %s, not this one: moved to %s "
            "(python -m ebrl.tracking replay %s sends what it holds unsent)",
            self.path,
            state.get("run_id"),
            dest,
            dest,
        )

    def append(self, metrics: dict[str, float], step: int) -> None:
        line = {"step": int(step), "ts": int(time.time() * 1000)}
        line["metrics"] = {k: float(v) for k, v in metrics.items()}
        with self.path.open("a") as f:  # closed, so flushed: a crash after this loses nothing
            f.write(json.dumps(line) + "\n")

    def unsent(self) -> list[tuple[int, dict[str, Any] | None]]:
        """(end offset, line or None if damaged) of each line the server lacks, oldest first."""
        out: list[tuple[int, dict[str, Any] | None]] = []
        end = self.state["sent"]
        with self.path.open("rb") as f:
            f.seek(end)
            for raw in f:
                end += len(raw)
                try:
                    out.append((end, json.loads(raw)))
                except ValueError:
                    log.warning("%s: skipping a damaged line ending at byte %d", self.path, end)
                    out.append((end, None))
        return out

    def send(self, client: Any, timeout_s: float) -> bool:
        """One attempt at sending every unsent line, in batches of whole lines; the first failed
        request ends the attempt (a dead server costs one refused connection per call).

        Returns:
            True when the server has every line, False when it could not be reached.
        """
        while True:
            try:
                self._send_unsent(client, timeout_s)
            except _send_errors() as err:
                if not _rejected(err, self.uri):
                    self._outage(err)
                    return False
                log.error(
                    "MLflow at %s refused metric lines up to byte %d of %s (%s): skipped, kept "
                    "in the spool",
                    self.uri,
                    self._trying,
                    self.path,
                    _short(err),
                )
                self.state["sent"] = self._trying
                self.save()
                continue
            if self.down:
                log.info(
                    "MLflow server at %s is back: the metrics kept in %s are sent",
                    self.uri,
                    self.path,
                )
            self.down = False
            return True

    def _send_unsent(self, client: Any, timeout_s: float) -> None:
        from mlflow.entities import Metric

        lines = self.unsent()
        batch: list[Any] = []
        with _bounded_http(timeout_s):
            for i, (end, line) in enumerate(lines):
                if line is not None:
                    ts, step = line["ts"], line["step"]
                    batch += [Metric(k, v, ts, step) for k, v in line["metrics"].items()]
                if len(batch) >= _BATCH or i == len(lines) - 1:
                    self._trying = end
                    if batch:
                        client.log_batch(self.state["run_id"], metrics=batch)
                    self.state["sent"] = end
                    self.save()
                    batch = []

    def _outage(self, err: Exception) -> None:
        if not self.down:  # once per outage
            log.warning(
                "MLflow server at %s unreachable (%s); metrics kept in %s, resent when it returns",
                self.uri,
                _short(err),
                self.path,
            )
        self.down = True

    def upload(self, client: Any, entry: str | list[str], timeout_s: float) -> bool:
        """One attempt at uploading an artifact (a path, or [path, folder in the run's
        artifacts]); False when it should be retried later."""
        path, folder = _artifact_entry(entry)
        if not Path(path).exists():
            log.error("artifact %s no longer exists: not uploaded to MLflow", path)
            return True
        try:
            with _bounded_http(timeout_s):
                client.log_artifact(self.state["run_id"], path, folder)
        except _send_errors() as err:
            if not _rejected(err, self.uri):
                self._outage(err)
                return False
            log.error("MLflow at %s refused artifact %s: %s", self.uri, path, _short(err))
        return True

    def send_artifacts(self, client: Any, timeout_s: float) -> bool:
        """One attempt at the artifacts still to upload (after a failure, the rest wait for the
        next attempt rather than each costing a timeout); True when none is left."""
        left: list[str | list[str]] = []
        for p in self.state["artifacts"]:
            if left or not self.upload(client, p, timeout_s):
                left.append(p)
        self.state["artifacts"] = left
        self.save()
        return not left

    def send_status(self, client: Any, timeout_s: float) -> bool:
        """Set the pending final status, if any; True when none is left."""
        if self.state["status"] is None:
            return True
        try:
            with _bounded_http(timeout_s):
                client.set_terminated(self.state["run_id"], status=self.state["status"])
        except _send_errors() as err:
            if not _rejected(err, self.uri):
                self._outage(err)
                return False
            log.error("MLflow at %s refused the run's status: %s", self.uri, _short(err))
        self.state["status"] = None
        self.save()
        return True

    def deliver(self, client: Any, status: str | None, budget_s: float, timeout_s: float) -> bool:
        """Send the backlog, then the final status, then the artifacts, retrying for up to
        ``budget_s`` seconds (pauses of 0.5, 1, 2, ... s between attempts).

        Returns:
            True when nothing is left; otherwise what is left stays recorded in the sidecar.
        """
        if status is not None:
            self.state["status"] = status  # pending until the server has it
            self.save()
        deadline = time.monotonic() + budget_s
        pause = 0.5
        while True:
            attempt_s = max(timeout_s, min(deadline - time.monotonic(), 10.0))
            done = (
                self.send(client, attempt_s)
                and self.send_status(client, attempt_s)
                and self.send_artifacts(client, attempt_s)
            )
            if done or time.monotonic() + pause > deadline:
                return done
            time.sleep(pause)
            pause = min(2 * pause, 5.0)

    def left(self) -> str:
        """What the server does not have yet, in words."""
        parts = []
        if n := sum(1 for _, line in self.unsent() if line is not None):
            parts.append(f"{n} metric line{'s' * (n != 1)}")
        if self.state["status"] is not None:
            parts.append(f"final status {self.state['status']}")
        if arts := [_artifact_entry(a)[0] for a in self.state["artifacts"]]:
            parts.append(f"{len(arts)} artifact{'s' * (len(arts) != 1)} ({', '.join(arts)})")
        return ", ".join(parts) or "nothing"

    def replay_command(self) -> str:
        target = self.path.parent if self.path.name == SPOOL_NAME else self.path
        return f"python -m ebrl.tracking replay {target}"


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
            exp_id = _experiment_id(self.client, experiment, artifact_root)
            if resume_id is not None:
                self.run_id: str | None = resume_id
                pending = _Spool.read_state(spool).get("status") if spool is not None else None
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
        self._spool = None if spool is None else _Spool(spool, uri, self.run_id)
        if self._spool is not None:
            self._spool.state["status"] = None  # running again: this attempt's finish sets it
            self._spool.save()
            self._spool.send(self.client, timeout_s)  # what an earlier attempt left unsent
        self.log_metrics({ATTEMPTS: self.attempts, PREEMPTIONS: self.preemptions}, step=0)

    @contextmanager
    def _needed(self) -> Iterator[None]:
        """Requests a run cannot start without: a few quick retries, then a clear error."""
        try:
            with _bounded_http(max(self.timeout_s, 10.0), retries=2):
                yield
        except _send_errors() as err:
            if _rejected(err, self.uri):
                raise
            raise TrackingUnavailable(
                f"MLflow tracking at {self.uri} is unavailable at the start of the run "
                f"({_short(err)}). Start the server (e.g. `mlflow server --host 127.0.0.1 "
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
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + _BATCH])

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

        with _bounded_http(10.0, retries=2):
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


def portable(text: str) -> str:
    """``text`` with this checkout's, the working directory's and the home directory's absolute
    paths taken out (``<root>/results/x`` -> ``results/x``, ``<home>/y`` -> ``~/y``).

    For what a run records (its config, summary, provenance): results are committed and shared,
    and must not carry one machine's paths. ``sqlite:////abs/root/outputs/m.db`` becomes the
    relative ``sqlite:///outputs/m.db``, still a valid URI from the repository root.
    """
    root = str(Path(__file__).resolve().parents[1])
    prefixes = {str(Path.home()): "~/", os.getcwd(): "", root: ""}
    for prefix, repl in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):
        if prefix not in ("", "/"):
            text = text.replace(prefix.rstrip("/") + "/", repl)
    return text


def git_commit() -> str:
    """The checked-out commit of the ebrl source tree, with ``-dirty`` if it has local changes.

    ``EBRL_COMMIT`` overrides it: benchmarks run from an exported snapshot (no .git) set it.
    """
    if os.environ.get("EBRL_COMMIT"):
        return os.environ["EBRL_COMMIT"]
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> str:
    """A one-line description of this machine (no hostnames or paths)."""
    import psutil

    gpu = os.environ.get("EBRL_GPU_NAME", "")
    if not gpu:
        try:
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            gpu = (
                f"{n}x {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))}"
                if n
                else ""
            )
            pynvml.nvmlShutdown()
        except Exception:  # no NVML or no GPU is the normal CPU case
            gpu = ""
    mem = psutil.virtual_memory().total / 2**30
    return (
        f"{platform.machine()} {psutil.cpu_count(logical=True)} cpus {mem:.0f} GiB, "
        f"{gpu or 'no GPU'}, {platform.system()} python {platform.python_version()}"
    )


def _experiment_id(client: Any, name: str, artifact_root: str | None) -> str:
    """The experiment's id, creating it if needed. Runs started together (a local multirun, a
    Slurm array) race to create it: the loser of the race finds the winner's."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name, artifact_location=artifact_root)
    except MlflowException:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def main(argv: list[str] | None = None) -> int:
    """``python -m ebrl.tracking replay <run_dir>``: send what a run's spool holds unsent.

    For a run that ended while its tracking server was down: its metrics, then its final status,
    then its artifacts go to the run id and URI recorded in the spool's sidecar.

    Returns:
        0 when the server has everything, 1 when it is still unreachable.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ebrl.tracking")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="send a run's unsent metrics, final status and artifacts")
    rp.add_argument("path", type=Path, help=f"run folder holding {SPOOL_NAME}, or a spool file")
    rp.add_argument("--timeout", type=float, default=30.0, help="seconds to keep trying")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    path = args.path / SPOOL_NAME if args.path.is_dir() else args.path
    state = _Spool.read_state(path)
    if not path.exists() or "run_id" not in state:
        parser.error(f"{path}: no MLflow spool with its .state.json sidecar")
    from mlflow.tracking import MlflowClient

    spool = _Spool(path, state["uri"], state["run_id"])
    todo = spool.left()
    where = f"MLflow run {state['run_id']} at {state['uri']}"
    if spool.deliver(MlflowClient(tracking_uri=state["uri"]), None, args.timeout, 10.0):
        print(f"{path}: sent {todo} to {where}")
        return 0
    print(f"{path}: {where} still unreachable; left: {spool.left()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
