"""``python -m ebrl.plan.measure``'s command line: its defaults fit the machine it runs on, and a
CPU level that is not a thread count is refused by name (README, "Planning capacity")."""

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
