"""What ``python -m ebrl.train`` leaves for a user: a misspelt key is one clean error (no
traceback), and a run folder's ``train.log`` holds the run, one line per update (issue 47)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _train(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # as a user has it
    return subprocess.run(
        [sys.executable, "-m", "ebrl.train", *overrides, "tracking.enabled=false"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_misspelt_key_is_one_clean_error_with_exit_code_2(tmp_path):
    proc = _train("+budget.env_step=1000", f"hydra.run.dir={tmp_path / 'h'}", cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-2000:]
    assert "ebrl.train: unknown key budget.env_step: did you mean budget.env_steps?" in proc.stderr
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow  # a whole (tiny) run in a fresh interpreter: ~25 s here
def test_a_run_folders_train_log_holds_the_run_and_ray_says_nothing_of_tokens(tmp_path):
    """Hydra's job log in the run folder (no run_dir: the folder is Hydra's) gets the start,
    one line per update and the end; the console keeps the progress bar. Ray's private
    instance does not warn that it turned token authentication on by itself."""
    run = tmp_path / "run"
    proc = _train(
        "simulator=counting",
        "scheduler=ebrl",
        "budget.env_steps=200",
        "num_envs=4",
        "rollout_steps=8",
        f"hydra.run.dir={run}",
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (run / "train.log").read_text()
    assert f"run folder {run}" in text
    assert "update 1:" in text and "env steps/s" in text
    assert "ebrl on counting:" in text
    assert "update 1:" not in proc.stdout  # the console has the bar, not the lines
    assert "Token authentication is enabled" not in proc.stdout + proc.stderr
