"""The motivation measurements: the utilisation sampler (CPU here, GPUs on a fake NVML) and the
statistics, figures and table of ``analysis.motivation`` on run folders with known contents."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis import motivation as mot
from ebrl import utilisation
from ebrl.utilisation import UtilisationSampler

ROOT = Path(__file__).resolve().parents[1]


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_the_sampler_reads_every_allowed_core_on_the_timeline_clock(tmp_path):
    t0 = time.perf_counter()
    path = tmp_path / "utilisation.csv"
    with UtilisationSampler(path, interval_s=0.05, t0=t0, gpus=False) as s:
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:  # keep a core busy meanwhile
            pass
    got = rows(path)
    cores = sorted(os.sched_getaffinity(0))
    assert s.samples >= 3
    assert {int(r["index"]) for r in got} == set(cores)
    assert {r["device"] for r in got} == {"cpu"}
    ts = [float(r["t_s"]) for r in got]
    assert ts == sorted(ts) and 0 < ts[0] < ts[-1] < time.perf_counter() - t0
    busy = [float(r["util_pct"]) for r in got]
    assert all(0 <= b <= 100 for b in busy) and max(busy) > 50  # this test's own busy loop
    assert all(r["sm_occupancy_pct"] == "" for r in got)


class FakeGPM:
    """A GPM sample: what the fake driver read at that moment."""

    occupancy = 0.0


class FakeNVML:
    """Two GPUs; GPU 0 has GPM (SM occupancy 30% then 10%...), GPU 1 does not."""

    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_SM_UTIL = 2

    def __init__(self) -> None:
        self.shut = 0
        self.freed = 0
        self.reads = 0

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=h == 0)

    def nvmlGpmSampleAlloc(self):
        return FakeGPM()

    def nvmlGpmSampleFree(self, s):
        self.freed += 1

    def nvmlGpmSampleGet(self, h, sample):
        self.reads += 1
        sample.occupancy = 30.0 if self.reads % 2 else 10.0

    def c_nvmlGpmMetricsGet_t(self):
        metric = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(2)]
        return SimpleNamespace(metrics=metric)

    def nvmlGpmMetricsGet(self, req):
        req.metrics[0].value = req.sample2.occupancy
        req.metrics[1].value = 2 * req.sample2.occupancy

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=40 + h, memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=2**30, total=80 * 2**30)

    def nvmlShutdown(self):
        self.shut += 1


@pytest.mark.parametrize(("mask", "gpus"), [(None, [0, 1]), ("1", [1]), ("", [])])
def test_the_sampler_reads_gpus_through_nvml(tmp_path, monkeypatch, mask, gpus):
    nvml = FakeNVML()
    monkeypatch.setattr(utilisation, "_nvml", lambda: nvml)
    if mask is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    path = tmp_path / "u.csv"
    s = UtilisationSampler(path, interval_s=0.05).start()
    time.sleep(0.3)
    s.stop()
    got = [r for r in rows(path) if r["device"] == "gpu"]
    assert sorted({int(r["index"]) for r in got}) == gpus
    for r in got:
        assert float(r["util_pct"]) == 40 + int(r["index"])
        assert float(r["mem_total_mib"]) == 80 * 1024
        if r["index"] == "0":  # the GPM interval's occupancy: the fake's second sample
            assert float(r["sm_occupancy_pct"]) in (10.0, 30.0)
            assert float(r["sm_util_pct"]) == 2 * float(r["sm_occupancy_pct"])
        else:
            assert r["sm_occupancy_pct"] == ""  # no GPM: said by an empty cell, not a zero
    assert nvml.shut == 1 and nvml.freed == (2 if 0 in gpus else 0)


# --- statistics on a run folder with known contents -------------------------------------------
def write_run(folder: Path, *, gpu: bool, variant: str = "motivation/ebrl") -> Path:
    """A run folder: RL time from t=0.5 s (a reset) to 11 s (an update); sim spans of 2 envs x
    K=4 steps; two cores (core 0 at 80%, core 1 at 20%); with ``gpu``, one GPU at 30%
    utilisation, whose SM occupancy is 10% while the gen span runs (t in [5, 7]) and 50%
    otherwise; episodes shortening 50 -> 30."""
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(
        json.dumps(
            {
                "status": "FINISHED",
                "scheduler": "ebrl",
                "policy": "transformer_l",
                "seed": 0,
                "commit": "abc",
                "machine": "test machine",
                "wall_s": 10.0,
            }
        )
    )
    (folder / "config.yaml").write_text(f"chunk_size: 4\nvariant: {variant}\n")
    events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "sim0"}}]
    events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "gen"}})
    # 99 spans of 8 ms over 2 envs x 4 steps (1 ms a step), one of 80 ms (10 ms a step)
    durs = [0.008] * 99 + [0.080]
    for i, d in enumerate(durs):
        start = 1.0 + 0.09 * i
        args = {"batch": 2, "cpu": 0.0}
        events.append(
            {
                "name": "sim",
                "ph": "X",
                "pid": 1,
                "tid": 1,
                "ts": start * 1e6,
                "dur": d * 1e6,
                "args": args,
            }
        )
    events.append(
        {
            "name": "sim",
            "ph": "X",
            "pid": 1,
            "tid": 1,
            "ts": 0.5e6,
            "dur": 1e5,
            "args": {"reset": 1},
        }
    )
    events.append({"name": "gen", "ph": "X", "pid": 1, "tid": 2, "ts": 5e6, "dur": 2e6, "args": {}})
    events.append(
        {"name": "train", "ph": "X", "pid": 1, "tid": 2, "ts": 10.5e6, "dur": 0.5e6, "args": {}}
    )
    (folder / "timeline.json").write_text(json.dumps({"traceEvents": events}))
    samples = []
    for t in np.arange(0.2, 12.01, 0.2).round(4):
        samples += [
            {"t_s": t, "device": "cpu", "index": 0, "util_pct": 80.0},
            {"t_s": t, "device": "cpu", "index": 1, "util_pct": 20.0},
        ]
        if gpu:
            occ = 10.0 if 5.0 < t <= 7.0 else 50.0
            samples.append(
                {"t_s": t, "device": "gpu", "index": 0, "util_pct": 30.0, "sm_occupancy_pct": occ}
            )
    pd.DataFrame(samples, columns=list(utilisation.COLUMNS)).to_csv(
        folder / "utilisation.csv", index=False
    )
    lens = np.linspace(50, 30, 10)
    pd.DataFrame(
        {
            "iteration": range(10),
            "env/steps_total": np.arange(1, 11) * 800,
            "env/episode_len": lens,
        }
    ).to_csv(folder / "metrics.csv", index=False)
    return folder


def test_statistics_of_a_gpu_run(tmp_path):
    run = mot.load_run(write_run(tmp_path / "r", gpu=True))
    assert run.key == "ebrl" and run.label == "EBRL"
    assert run.window() == pytest.approx((0.5, 11.0))  # from the reset span to the update
    s = mot.stats(run)
    assert s.cpu["cores"] == 2 and s.cpu["cores_above_50"] == 1
    assert s.cpu["cpu_under_50"] == 0.0  # the cores' mean is 50%: not under
    assert s.gpu["gpu_under_50"] == 1.0
    # gen runs over (5, 7]: every sample whose interval it covers reads 10% occupancy
    assert s.gpu["gen_sm_under_20"] == pytest.approx(1.0)
    lat = s.latency
    assert lat["spans"] == 100  # the reset span is not a step
    assert lat["p50_ms"] == pytest.approx(1.0)
    assert lat["mean_ms"] == pytest.approx((99 * 1.0 + 10.0) / 100)
    assert lat["p99_ms"] == pytest.approx(1.0)  # one span in 100 is the 1% tail's edge
    assert s.trajectory["first"] == pytest.approx(np.mean(np.linspace(50, 30, 10)[:2]))
    assert s.trajectory["shortening"] == pytest.approx(1 - 31.111111 / 48.888889, rel=1e-5)
    cells = mot.cells(s)
    assert cells["cores_above_50"] == "1 of 2 (50%)"
    assert cells["gpu_under_50"] == "100%" and cells["gen_sm_under_20"] == "100%"


def test_weighted_quantile():
    v, w = np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0])
    assert mot.weighted_quantile(v, w, 0.25) == 1.0
    assert mot.weighted_quantile(v, w, 0.5) == 2.0
    assert mot.weighted_quantile(v, w, 0.99) == 3.0


def test_report_says_plainly_there_is_no_gpu(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "0", gpu=False, variant="motivation/async")
    write_run(root / "1", gpu=False, variant="motivation/ebrl")
    (root / "0" / "summary.json").write_text(
        (root / "0" / "summary.json").read_text().replace('"ebrl"', '"async"')
    )
    out = tmp_path / "report"
    assert mot.main(["--runs", str(root), "--out", str(out)]) == 0
    md = (out / "motivation.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| statistic"))
    assert header == "| statistic | paper | Async | EBRL |"  # the paper's order and names
    assert "| n/a (no GPU) |" in md and "No GPU: NVML found none these runs could see" in md
    assert "22 of 56 cores (39%)" in md and "1 of 2 (50%)" in md
    assert "48.9 -> 31.1 steps (36% shorter)" in md
    for name in ("utilisation", "latency_cdf", "episode_len", "gantt_ebrl", "gantt_async"):
        assert (out / f"motivation_{name}.png").stat().st_size > 10_000
    assert {p.name for p in (out / "data").iterdir()} == {
        "utilisation.csv",
        "step_latency.csv",
        "episode_len.csv",
    }
    stats = json.loads((out / "motivation.json").read_text())
    assert [s["key"] for s in stats] == ["async", "ebrl"]


def test_a_real_run_samples_and_reports(tmp_path):
    """ebrl.train with tracking.utilisation=true on the synthetic simulator (episodes shrink)."""
    from ebrl.train import train

    from .conftest import TINY, make_cfg

    cfg = make_cfg(
        [
            *TINY,
            "simulator=synthetic",
            "simulator.cost_mode=sleep",
            "simulator.step_cost_ms=0.3",
            "simulator.episode_steps_start=16",
            "simulator.episode_steps_end=6",
            "simulator.shrink_episodes=4",
            "rollout_steps=16",
            "budget.iterations=6",
            "tracking.enabled=false",
            "tracking.utilisation=true",
            "tracking.utilisation_interval_s=0.05",
            "variant=motivation/sync",
        ],
        tmp_path,
    )
    train(cfg)
    run = mot.load_run(tmp_path / "run")
    s = mot.stats(run)
    assert s.cpu["cores"] >= 1 and s.latency["spans"] > 0
    assert s.trajectory["shortening"] > 0.3
    assert s.gpu == {"na": "no GPU: NVML found none this run could see"}


def test_make_targets():
    """fig-motivation runs the CPU sweep then the report; SIZE=full is a dry run; the tracking
    server listens on loopback unless told, and prints the URI for the sweeps."""

    def dry(*args: str) -> str:
        cmd = ["make", "-n", "-s", "--no-print-directory", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout

    cpu = dry("fig-motivation", "TRACKING_URI=http://h:5000")
    assert "-m ebrl.launch motivation --out outputs/sweeps/motivation-cpu/" in cpu
    assert "tracking.uri=http://h:5000" in cpu
    assert "-m analysis.motivation --runs outputs/sweeps/motivation-cpu/" in cpu
    full = dry("fig-motivation", "SIZE=full")
    assert "-m ebrl.launch --dry-run motivation_full" in full and "analysis.motivation" not in full
    assert "--dry-run" not in dry("fig-motivation", "SIZE=full", "SUBMIT=1")
    local = dry("mlflow-server")
    assert "--host 127.0.0.1 --port 5000" in local and "--allowed-hosts" not in local
    assert "TRACKING_URI=http://127.0.0.1:5000" in local
    node = dry("mlflow-server", "HOST=10.1.2.3", "PORT=5123")
    assert "--host 10.1.2.3 --port 5123" in node and "TRACKING_URI=http://10.1.2.3:5123" in node
    assert "--allowed-hosts '10.1.2.3,10.1.2.3:*," in node


def test_motivation_sweeps_plan(tmp_path):
    from ebrl.launch.sweep import plan

    full = plan("motivation_full", [f"tracking.store={tmp_path}"])
    # every mode on the node's 8 GPUs (Colocated: a rank per GPU), one array
    assert not full.errors and full.n_jobs == 4
    (array,) = full.arrays
    assert array.launcher == "slurm" and array.params["gpus_per_node"] == 8
    assert [j.overrides for j in array.jobs] == [
        (f"+axis/motivation={s}", "seed=0", f"tracking.store={tmp_path}")
        for s in ("colocated", "hybrid", "async", "ebrl")
    ]
