"""What a run records about itself in MLflow: the config options as typed, the classes behind them,
MLflow's system metrics where asked, and every file of the run folder as an artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebrl import utilisation
from ebrl.choices import option_of, run_choices
from ebrl.config import ConfigError, validate
from ebrl.tracking.spool import Spool, _artifact_entry
from ebrl.tracking.tracker import system_metrics_wanted

from .conftest import TINY, make_cfg

mlflow = pytest.importorskip("mlflow")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], ("sync", "mlp", "pushcube", "cpu", "ppo")),
        (
            ["+experiment=embedded", "scheduler=ebrl"],
            ("ebrl", "transformer_l", "pushcube", "cpu", "ppo"),
        ),
        (
            ["scheduler=async", "policy=transformer_m", "simulator=pickcube", "gpu=h100"],
            ("async", "transformer_m", "pickcube", "h100", "ppo"),
        ),
        (["scheduler=rlinf_async", "algo=grpo"], ("rlinf_async", "mlp", "pushcube", "cpu", "grpo")),
        (
            ["scheduler=colocated", "simulator=counting"],
            ("colocated", "mlp", "counting", "cpu", "ppo"),
        ),
        # a node changed after composing names the option it now equals
        (
            ["+experiment=embedded", "policy.size=M"],
            ("sync", "transformer_m", "pushcube", "cpu", "ppo"),
        ),
    ],
)
def test_options_are_recovered_from_the_nodes_outside_hydra(overrides, expected):
    got = run_choices(make_cfg(overrides))
    assert tuple(got[g] for g in ("scheduler", "policy", "simulator", "gpu", "algo")) == expected


def test_a_node_no_option_explains_is_named_by_its_class():
    cfg = make_cfg(["simulator.task=StackCube-v1"])  # ManiSkill, but neither option's task
    assert option_of("simulator", cfg.simulator) is None
    assert run_choices(cfg)["simulator"] == "ManiSkillEnv"


@pytest.mark.parametrize(
    ("value", "mode"), [("true", "true"), ("False", "false"), ("auto", "auto")]
)
def test_system_metrics_setting_takes_every_spelling(value, mode):
    run = validate(make_cfg([f"tracking.system_metrics={value}"]))
    assert run.tracking.system_metrics == mode


def test_system_metrics_setting_refuses_other_values():
    with pytest.raises(ConfigError, match=r"tracking\.system_metrics=.sometimes."):
        validate(make_cfg(["tracking.system_metrics=sometimes"]))
    with pytest.raises(ConfigError, match=r"tracking\.utilisation_interval_s"):
        validate(make_cfg(["tracking.utilisation_interval_s=0"]))


@pytest.mark.parametrize("gpu", [True, False])
def test_system_metrics_auto_follows_the_gpu(monkeypatch, gpu):
    monkeypatch.setattr(utilisation, "gpu_visible", lambda: gpu)
    assert system_metrics_wanted("auto") is gpu
    assert system_metrics_wanted("true") is True
    assert system_metrics_wanted("false") is False


class FakeNVML:
    """NVML with ``n`` GPUs named by UUID ``GPU-<i>``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}aaaa".encode()


@pytest.mark.parametrize(
    ("mask", "expected"),
    [(None, [0, 1, 2]), ("", []), ("2,0", [2, 0]), ("1,7,2", [1]), ("GPU-2", [2]), ("-1", [])],
)
def test_visible_gpus_follow_cuda_visible_devices(monkeypatch, mask, expected):
    if mask is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    assert utilisation.visible_gpus(FakeNVML(3)) == expected


def test_a_run_logs_system_metrics_and_every_file_of_its_folder(tmp_path):
    from mlflow.tracking import MlflowClient

    from ebrl.train import train

    cfg = make_cfg(
        [
            *TINY,
            "simulator.delay_s=0.01",  # a run of a second or two: several samples
            "tracking.system_metrics=true",
            "tracking.system_metrics_interval_s=0.25",
            "tracking.utilisation=true",
            "tracking.utilisation_interval_s=0.1",
        ],
        tmp_path,
    )
    s = train(cfg)
    assert (s.scheduler, s.scheduler_class, s.gpu) == ("sync", "SyncScheduler", "cpu")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ebrl").experiment_id])
    assert run.info.status == "FINISHED"
    assert client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")

    def files(path: str | None = None) -> set[str]:
        out = set()
        for a in client.list_artifacts(run.info.run_id, path):
            out |= files(a.path) if a.is_dir else {a.path}
        return out

    uploaded = files()
    run_dir = tmp_path / "run"
    ledger = {p.relative_to(run_dir).as_posix() for p in (run_dir / "ledger").rglob("*.log")}
    assert ledger and ledger <= uploaded
    assert {"utilisation.csv", "summary.json", "timeline.json", "metrics.csv"} <= uploaded
    header = (run_dir / "utilisation.csv").read_text().splitlines()[0]
    assert header.startswith("t_s,device,index,util_pct")


class RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []

    def log_artifact(self, run_id: str, path: str, folder: str | None = None) -> None:
        self.calls.append((run_id, Path(path).name, folder))


def test_spooled_artifacts_keep_their_folder(tmp_path):
    """An artifact queued during an outage goes to its folder when sent; a spool written before
    folders existed (bare paths) still sends its files to the top."""
    a, b = tmp_path / "a.txt", tmp_path / "start.json"
    a.write_text("a")
    b.write_text("{}")
    spool = Spool(tmp_path / "mlflow_spool.jsonl", "http://127.0.0.1:1", "run1")
    spool.state["artifacts"] = [str(a), [str(b), "ledger/attempt-0"]]
    client = RecordingClient()
    assert spool.send_artifacts(client, 1.0)
    assert client.calls == [("run1", "a.txt", None), ("run1", "start.json", "ledger/attempt-0")]
    assert _artifact_entry([str(b), ""]) == (str(b), None)
    state = json.loads((tmp_path / "mlflow_spool.state.json").read_text())
    assert state["artifacts"] == []


@pytest.mark.parametrize(
    ("kind", "option", "old", "extra"),
    [
        ("scheduler", "ebrl", "EBRLScheduler", {}),
        ("scheduler", "async", "AsyncScheduler", {}),
        ("policy", "transformer_l", "TransformerPolicy", {"size": "L"}),
        ("simulator", "pushcube", "PushCube-v1", {}),
    ],
)
def test_analysis_reads_option_tags_as_it_read_class_tags(kind, option, old, extra):
    """Runs tagged with options and runs tagged with class names get one name in tables."""
    from analysis import names

    assert names.key(kind, option, **extra) == names.key(kind, old, **extra) == option
    assert names.display(kind, option, **extra) == names.display(kind, old, **extra)
