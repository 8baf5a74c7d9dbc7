"""The MLflow tracking store: where it is, its experiments, and requests that may meet an outage.

A local store is a sqlite database ``<tracking.store>/mlflow.db`` with artifacts in
``<tracking.store>/mlartifacts`` (:func:`local_store_uri`); a remote tracking server is reached
through ``tracking.uri=http://host:port``. :func:`bounded_http` keeps a request to a server that
is gone short, and :func:`send_errors` / :func:`rejected` tell an outage (retry later) from a
refusal (retrying cannot help). Used by the run's tracker (:mod:`ebrl.tracking.tracker`), its
spool (:mod:`ebrl.tracking.spool`) and the sweep's own run (:mod:`ebrl.launch.runs`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def local_store_uri(store: str | Path) -> tuple[str, str]:
    """(tracking URI, artifact root URI) of a local sqlite store folder."""
    root = Path(store).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}", (root / "mlartifacts").as_uri()


def experiment_id(client: Any, name: str, artifact_root: str | None) -> str:
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


_ENV_LOCK = threading.RLock()


@contextmanager
def bounded_http(timeout_s: float, retries: int = 0) -> Iterator[None]:
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


def send_errors() -> tuple[type[Exception], ...]:
    """What a failed request raises: MLflow's errors (it wraps connection errors and timeouts),
    requests' and the OS's (artifact uploads raise those unwrapped)."""
    import requests
    from mlflow.exceptions import MlflowException

    return (MlflowException, requests.RequestException, OSError)


def rejected(err: Exception, uri: str) -> bool:
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


def short_error(err: Exception) -> str:
    """An error's message on one line, cut to 300 characters (for a log line)."""
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."
