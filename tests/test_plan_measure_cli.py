"""``python -m ebrl.plan.measure``'s command line: its defaults fit the machine it runs on, and a
CPU level that is not a thread count is refused by name (docs/planning.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebrl.plan import measure
from ebrl.plan.profile import Profile


@pytest.fixture
def captured(monkeypatch) -> dict:
    """``measure_profile`` replaced by a recorder: the CLI's choices, no measurement."""
    seen: dict = {}

    def fake(overrides, device, levels, batches, samples, sim_envs, repeats, **kw) -> Profile:
        seen.update(device=device, levels=list(levels))
        raise SystemExit(0)  # stop before the profile is assembled and written

    monkeypatch.setattr(measure, "measure_profile", fake)
    return seen


def test_on_a_machine_without_cuda_the_defaults_measure_the_cpu_at_1_and_2_threads(
    captured, monkeypatch, tmp_path: Path
):
    monkeypatch.setattr(measure, "cuda_available", lambda: False)
    with pytest.raises(SystemExit) as done:
        measure.main(["--out", str(tmp_path / "p.json"), "--samples", "8"])
    assert done.value.code == 0
    assert captured == {"device": "cpu", "levels": [1.0, 2.0]}


def test_device_cpu_alone_takes_the_cpu_levels(captured, tmp_path: Path):
    with pytest.raises(SystemExit) as done:
        measure.main(["--device", "cpu", "--out", str(tmp_path / "p.json"), "--samples", "8"])
    assert done.value.code == 0
    assert captured == {"device": "cpu", "levels": [1.0, 2.0]}


def test_on_a_gpu_machine_the_defaults_are_gpu_shares(captured, monkeypatch, tmp_path: Path):
    monkeypatch.setattr(measure, "cuda_available", lambda: True)
    monkeypatch.setattr(measure.shutil, "which", lambda name: None)  # no MPS here
    with pytest.raises(SystemExit, match="nvidia-cuda-mps-control not found"):
        measure.main(["--out", str(tmp_path / "p.json"), "--samples", "8"])
    with pytest.raises(SystemExit) as done:
        measure.main(["--out", str(tmp_path / "p.json"), "--samples", "8", "--levels", "1"])
    assert done.value.code == 0 and captured == {"device": "cuda", "levels": [1.0]}


@pytest.mark.parametrize("levels", ["0.25,0.5,1", "0", "2,-1"])
def test_a_cpu_level_that_is_not_a_thread_count_is_refused_by_name(
    captured, levels: str, tmp_path: Path, capsys
):
    with pytest.raises(SystemExit) as done:
        measure.main(
            [
                "--device",
                "cpu",
                "--levels",
                levels,
                "--out",
                str(tmp_path / "p.json"),
                "--samples",
                "8",
            ]
        )
    assert done.value.code == 2 and not captured
    err = capsys.readouterr().err
    assert f"--levels {levels}" in err and "torch thread counts" in err


def _cpu_profile(path: Path, threads: float) -> Path:
    """A CPU profile measured at one thread count only (as a run's profile is)."""
    rec = {
        "device": "cpu",
        "level": threads,
        "publish_s": 0.001,
        "load_s": 0.001,
        "state_bytes": 1e5,
        "gen": [{"batch": b, "seconds": 0.002 + 0.0005 * b, "busy": 1.0} for b in (1, 16)],
        "train": [{"samples": n, "seconds": 0.05 + 0.001 * n, "busy": 1.0} for n in (8, 64)],
    }
    measure.assemble([rec], [0.01, 0.012, 0.02], 1.0, 4, None, "test: one thread").save(path)
    return path


def test_a_cpu_profile_at_one_thread_plans_at_its_threads_unless_asked(tmp_path, capsys):
    """A profile from a run has the run's threads only: the plan takes those where the workload
    does not name its own, and says so; asked for threads it lacks, it says how to get them."""
    from ebrl.plan.cli import main as plan

    prof = _cpu_profile(tmp_path / "p.json", 1.0)
    assert plan(["--profile", str(prof), "--machine", "cpu", "--set", "num_envs=8"]) == 0
    out = capsys.readouterr().out
    assert "note: the profile has threads [1]: planning gen+train threads sync 1+1" in out
    assert "colocated 1+1" in out and "hybrid 1+1" in out
    assert all(f"| {name} |" in out for name in ("sync", "colocated", "hybrid", "async", "ebrl"))
    code = plan(["--profile", str(prof), "--machine", "cpu", "--set", "train_threads=2"])
    err = capsys.readouterr().err
    assert code == 2 and "--set gen_threads=1 train_threads=1" in err
    assert "ebrl.plan.measure --device cpu --levels 1,2" in err
