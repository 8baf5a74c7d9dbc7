"""The sweep's own MLflow run: one run per sweep, with a child run per job.

Before any job starts, :func:`start_sweep_runs` creates a run named after the sweep in the
experiment the jobs log to (tagged ``run_kind=sweep``, the sweep, the commit, the command and the
output folder; the plan, as :mod:`ebrl.launch.preview` prints it, is its description and its
artifacts), and every job gets its id as ``tracking.parent_run_id=<id>`` on the Hydra command line
(:data:`ebrl.launch.sweep.PARENT_KEY`; so it is in the pickled job Submitit runs, and in a requeued
or resumed job; the job's run is tagged ``mlflow.parentRunId``). :func:`end_sweep_runs` ends it
when its jobs do: FINISHED when every array succeeded and every child run finished, FAILED
otherwise, KILLED when the launcher is stopped. A job run by hand has no parent.
:func:`prepare_stores` creates the stores and experiments before jobs start side by side.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ebrl.launch.check import Store
from ebrl.launch.preview import as_json, describe
from ebrl.launch.sweep import JobArray, SweepPlan

#: the tag that marks a sweep's own run (``analysis.export`` leaves such runs out)
SWEEP_RUN_TAG = ("run_kind", "sweep")


def prepare_stores(p: SweepPlan) -> None:
    """Create each MLflow store and experiment before jobs start side by side: the first writers
    of an empty sqlite store race on its schema migration, and two creators of one experiment
    collide."""
    from mlflow.tracking import MlflowClient

    from ebrl.tracking.store import local_store_uri

    for uri, store, experiment in sorted(p.stores, key=str):
        artifact_root = None
        if uri is None:
            uri, artifact_root = local_store_uri(store)
        client = MlflowClient(tracking_uri=uri)
        if client.get_experiment_by_name(experiment) is None:
            client.create_experiment(experiment, artifact_location=artifact_root)


def _client(store: Store) -> tuple[Any, str]:
    """(MlflowClient, experiment id) of a plan's store, the experiment created if missing."""
    from mlflow.tracking import MlflowClient

    from ebrl.tracking.store import experiment_id, local_store_uri

    uri, folder, experiment = store
    artifact_root = None
    if uri is None:
        uri, artifact_root = local_store_uri(folder)
    client = MlflowClient(tracking_uri=uri)
    return client, experiment_id(client, experiment, artifact_root)


def start_sweep_runs(p: SweepPlan, command: str) -> dict[Store, str]:
    """Create the sweep's run in every store and experiment its jobs log to (one, unless the
    experiment is itself an axis); returns store -> run id.

    The run is named after the sweep and tagged with it, ``run_kind=sweep``, the commit, the
    command, the machine it was launched from and the output folder; the plan (what
    ``--dry-run`` prints) is its description in the UI and, with its JSON, its artifacts.
    """
    import tempfile

    from mlflow.entities import Param

    from ebrl.tracking.provenance import git_commit, machine, portable

    text = portable(describe(p, dry_run=False))
    out: dict[Store, str] = {}
    for store in sorted(p.stores, key=str):
        client, exp_id = _client(store)
        jobs = sum(1 for s in p.job_stores.values() if s == store)
        note = f"Sweep `{p.sweep}`: `{portable(command)}`\n\n```\n{text}\n```"
        tags = {
            SWEEP_RUN_TAG[0]: SWEEP_RUN_TAG[1],
            "sweep": p.sweep,
            "git_commit": git_commit(),
            "command": portable(command),
            "machine": machine(),
            "sweep_dir": portable(p.out),
            "mlflow.note.content": note,
        }
        run_id = client.create_run(exp_id, run_name=p.sweep, tags=tags).info.run_id
        params = {"sweep": p.sweep, "jobs": jobs, "arrays": len(p.arrays)}
        params["overrides"] = " ".join(p.overrides) or "-"
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        with tempfile.TemporaryDirectory() as tmp:
            for name, body in (("sweep_plan.txt", text), ("sweep_plan.json", as_json(p))):
                path = Path(tmp) / name
                path.write_text(portable(body) + "\n")
                client.log_artifact(run_id, str(path))
        out[store] = run_id
    return out


def array_parent(p: SweepPlan, a: JobArray, parents: dict[Store, str]) -> str | None:
    """The sweep run array ``a``'s jobs are children of: the run of the store they all log to
    (None when they log to several, or tracking is off)."""
    stores = {p.job_stores.get(j.index) for j in a.jobs}
    if len(stores) != 1:
        print(
            f"note: the jobs of array {a.label or 'all jobs'} log to {len(stores)} MLflow "
            "experiments: their runs get no parent run",
            file=sys.stderr,
        )
        return None
    (store,) = stores
    return parents.get(store) if store is not None else None


def end_sweep_runs(p: SweepPlan, parents: dict[Store, str], codes: list[int], killed: bool) -> None:
    """End each sweep run with its jobs: KILLED when the launcher was stopped; FAILED when an
    array failed or a child run did not finish; else FINISHED. Its metrics count the child runs
    by status (``sweep/runs_finished``...) against the jobs planned (``sweep/jobs``)."""
    from mlflow.entities import Metric

    from ebrl.tracking.store import bounded_http

    for store, run_id in parents.items():
        try:
            with bounded_http(10.0, retries=2):
                client, exp_id = _client(store)
                children = client.search_runs(
                    [exp_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
                )
                counts: dict[str, int] = {}
                for r in children:
                    counts[r.info.status] = counts.get(r.info.status, 0) + 1
                jobs = sum(1 for s in p.job_stores.values() if s == store)
                finished = counts.get("FINISHED", 0)
                if killed:
                    status = "KILLED"
                elif any(codes) or finished < len(children):
                    status = "FAILED"
                else:
                    status = "FINISHED"
                values = {"sweep/jobs": jobs, "sweep/runs": len(children)}
                values |= {f"sweep/runs_{k.lower()}": v for k, v in counts.items()}
                ts = int(time.time() * 1000)
                metrics = [Metric(k, float(v), ts, 0) for k, v in values.items()]
                client.log_batch(run_id, metrics=metrics)
                client.set_terminated(run_id, status=status)
        except Exception as e:  # the store is gone: the run stays RUNNING there; say so
            print(
                f"MLflow: the sweep's run {run_id} was not ended ({type(e).__name__}: {e}); it "
                "stays RUNNING in the UI",
                file=sys.stderr,
            )
            continue
        print(
            f"MLflow: sweep run {run_id} {status}: {finished} of {jobs} job runs finished",
            flush=True,
        )
