"""The spool: a run's metrics on disk until the tracking server has them.

With a spool file in the run folder (:data:`SPOOL_NAME`), a server that goes away mid-run does not
stop training: the run's tracker (:class:`ebrl.tracking.tracker.MLflowTracker`) appends every
metric here first, and what could not be sent is sent when the server returns, at the run's end,
or by ``python -m ebrl.tracking replay <run_dir>`` (:mod:`ebrl.tracking.replay`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ebrl.tracking.store import bounded_http, rejected, send_errors, short_error

log = logging.getLogger(__name__)

#: The spool's file name in a run folder: ``python -m ebrl.tracking replay <run_dir>`` looks for it.
SPOOL_NAME = "mlflow_spool.jsonl"
#: MLflow's limit of metrics per ``log_batch`` request
METRIC_BATCH = 1000


def _artifact_entry(entry: str | list[str]) -> tuple[str, str | None]:
    """(local path, folder in the run's artifacts or None) of a spooled artifact: a path alone
    (the top of the run's artifacts, as spools before folders were written), or [path, folder]."""
    if isinstance(entry, str):
        return entry, None
    return str(entry[0]), (str(entry[1]) if len(entry) > 1 and entry[1] else None)


class Spool:
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
            except send_errors() as err:
                if not rejected(err, self.uri):
                    self._outage(err)
                    return False
                log.error(
                    "MLflow at %s refused metric lines up to byte %d of %s (%s): skipped, kept "
                    "in the spool",
                    self.uri,
                    self._trying,
                    self.path,
                    short_error(err),
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
        with bounded_http(timeout_s):
            for i, (end, line) in enumerate(lines):
                if line is not None:
                    ts, step = line["ts"], line["step"]
                    batch += [Metric(k, v, ts, step) for k, v in line["metrics"].items()]
                if len(batch) >= METRIC_BATCH or i == len(lines) - 1:
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
                short_error(err),
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
            with bounded_http(timeout_s):
                client.log_artifact(self.state["run_id"], path, folder)
        except send_errors() as err:
            if not rejected(err, self.uri):
                self._outage(err)
                return False
            log.error("MLflow at %s refused artifact %s: %s", self.uri, path, short_error(err))
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
            with bounded_http(timeout_s):
                client.set_terminated(self.state["run_id"], status=self.state["status"])
        except send_errors() as err:
            if not rejected(err, self.uri):
                self._outage(err)
                return False
            log.error("MLflow at %s refused the run's status: %s", self.uri, short_error(err))
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
