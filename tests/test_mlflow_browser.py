"""The MLflow UI in a real browser (headless Chromium): a sweep's run with EBRL and Async jobs as
children, the runs view filtered by ``tags.scheduler = 'ebrl'``, and the comparison page of an
EBRL and an Async run. ``scripts/mlflow_ui.py`` drives the browser; screenshots go to tmp_path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("aiohttp", reason="aiohttp (from ray[default]) drives Chromium's DevTools")

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mlflow_ui", ROOT / "scripts" / "mlflow_ui.py")
ui = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
sys.modules["mlflow_ui"] = ui  # its dataclasses look their module up there
spec.loader.exec_module(ui)  # type: ignore[union-attr]

pytestmark = [
    pytest.mark.slow,  # an MLflow server and a browser: ~30-60 s on 2 cores
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        ui.chromium() is None, reason="no chromium here (apt-get install -y chromium)"
    ),
]


def make_store(store: Path) -> dict[str, str]:
    """A sweep's run with two EBRL and two Async job runs as ebrl.launch and ebrl.train make
    them; returns run name -> id."""
    from mlflow.tracking import MlflowClient

    from ebrl.tracking.store import local_store_uri
    from ebrl.tracking.tracker import MLflowTracker

    uri, root = local_store_uri(store)
    client = MlflowClient(uri)
    exp = client.create_experiment("headline-ui", artifact_location=root)
    parent = client.create_run(
        exp, run_name="headline", tags={"run_kind": "sweep", "sweep": "headline"}
    ).info.run_id
    ids = {"headline": parent}
    for sched, tp in (("ebrl", 120.0), ("async", 100.0)):
        for seed in (0, 1):
            name = f"{sched}-transformer_l-pushcube-s{seed}"
            tags = {
                "scheduler": sched,
                "policy": "transformer_l",
                "simulator": "pushcube",
                "gpu": "cpu",
                "seed": str(seed),
                "mlflow.parentRunId": parent,
            }
            tr = MLflowTracker(
                uri=None, store=store, experiment="headline-ui", run_name=name, tags=tags
            )
            tr.log_params({"scheduler.staleness": 1, "num_envs": 16})
            tr.log_metrics({"summary/throughput_e2e": tp + seed}, step=800)
            tr.finish()
            ids[name] = str(tr.run_id)
    client.set_terminated(parent, "FINISHED")
    return ids


def test_the_ui_lists_a_sweeps_ebrl_jobs_and_compares_them_with_async(tmp_path):
    store = tmp_path / "mlflow"
    ids = make_store(store)
    ebrl = ["ebrl-transformer_l-pushcube-s0", "ebrl-transformer_l-pushcube-s1"]
    other = ["async-transformer_l-pushcube-s0", "async-transformer_l-pushcube-s1"]
    with ui.serve(store) as url:
        exp = ui.experiment_id(url, "headline-ui")
        runs = ui.look(
            ui.runs_url(url, exp, "tags.scheduler = 'ebrl'"),
            tmp_path / "runs.png",
            expect=["headline", *ebrl],
        )
        # the filter keeps the Async jobs out; the sweep's run shows as their parent
        assert not any(name in runs.text for name in other)
        assert "3 matching runs" in runs.text  # the two EBRL jobs and the sweep's run above them
        compare = ui.look(
            ui.compare_url(url, exp, [ids[ebrl[0]], ids[other[0]]]),
            tmp_path / "compare.png",
            ready="Run ID|Run Name",
            expect=[ebrl[0], other[0], "throughput_e2e"],
            expand=False,
        )
        assert ebrl[1] not in compare.text and other[1] not in compare.text
    for shot in (runs.screenshot, compare.screenshot):
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
