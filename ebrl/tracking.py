"""Experiment tracking: MLflow behind a three-method interface, and a no-op for tests/debugging.

Default store: a local sqlite database ``<tracking.store>/mlflow.db`` with artifacts in
``<tracking.store>/mlartifacts`` (``outputs/mlflow`` under the working directory unless configured).
A remote tracking server works the same way through ``tracking.uri=http://host:port``.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Tracker(Protocol):
    run_id: str | None

    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: str | Path) -> None: ...
    def finish(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Tracks nothing (``tracking.enabled=false``)."""

    run_id: str | None = None

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: str | Path) -> None:
        pass

    def finish(self, status: str = "FINISHED") -> None:
        pass


def local_store_uri(store: str | Path) -> tuple[str, str]:
    """(tracking URI, artifact root URI) of a local sqlite store folder."""
    root = Path(store).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}", (root / "mlartifacts").as_uri()


class MLflowTracker:
    """One MLflow run, driven through ``MlflowClient`` (no global active-run state).

    Args:
        uri: tracking URI (``sqlite:///...``, ``http://...``); ``store`` is used when None.
        store: local store folder for the default sqlite URI.
        experiment: experiment name, created if missing.
        run_name: display name of the run.
        tags: tags set on the run at creation.
        resume_id: continue this existing run (a resumed job) instead of creating one.
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
    ) -> None:
        import mlflow  # heavy import (~2 s): only when tracking is on
        from mlflow.tracking import MlflowClient

        artifact_root = None
        if uri is None:
            uri, artifact_root = local_store_uri(store)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        exp_id = _experiment_id(self.client, experiment, artifact_root)
        if resume_id is not None:
            self.run_id = resume_id
            self.client.update_run(resume_id, status="RUNNING")
            self.client.set_tag(resume_id, "resumed", "true")
        else:
            self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id
        self._entities = mlflow.entities

    def log_params(self, params: dict[str, Any]) -> None:
        items = [self._entities.Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit is 100 params
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        import time

        ts = int(time.time() * 1000)
        items = [self._entities.Metric(k, float(v), ts, step) for k, v in metrics.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def log_artifact(self, path: str | Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


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
