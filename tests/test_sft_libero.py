"""The scripted LIBERO-Object expert and the SFT commands on LIBERO itself (slow: each builds
LIBERO tasks; skipped with the reason where LIBERO is missing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ebrl.envs import libero as lib

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = lib.local_problem()
needs_libero = pytest.mark.skipif(PROBLEM is not None, reason=f"LIBERO is missing: {PROBLEM}")


@pytest.mark.slow
@needs_libero
def test_the_expert_puts_the_soup_in_the_basket_from_a_fixed_initial_state():
    from ebrl.sft.expert import PickPlaceExpert
    from ebrl.sft.libero import expert_episode

    env = lib.LiberoEnv(task="libero_object", task_id="all", env_id=0)
    try:
        expert = PickPlaceExpert(env)
        assert (expert.target, expert.basket) == ("alphabet_soup_1", "basket_1")
        ep = expert_episode(env, expert, seed=0)
        assert ep.success and len(ep.actions) < env.max_episode_steps
        assert ep.obs.shape == (len(ep.actions), env.spec.obs_dim)
        assert np.abs(ep.actions).max() <= 1.0  # the controller's box
        assert env.check_success()
    finally:
        env.close()


@pytest.mark.slow
@needs_libero
def test_collect_clone_eval_end_to_end_on_one_task(tmp_path):
    over = ["simulator.task_id=6", "policy=mlp", "policy.hidden=32", "chunk_size=8"]
    for cmd in (
        ["collect", "--episodes", "1", "--workers", "1"],
        ["clone", "--epochs", "3"],
        ["eval", "--states", "1", "--workers", "1"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "ebrl.sft.libero", *cmd, "--out", str(tmp_path), *over],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    demos = json.loads((tmp_path / "demos.json").read_text())
    assert demos["init_states"] == "sampled" and demos["tasks"]["6"]["seeds"] == [601000]
    assert demos["simulator"]["init_states"] == "sampled"  # what the episodes ran under
    assert demos["kept_episodes"] == demos["successes"] >= 1
    ckpt = torch.load(tmp_path / "policy.pt", weights_only=True)
    assert ckpt["version"] == 0 and ckpt["meta"]["chunk_size"] == 8
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["tasks"]["6"]["seeds"] == [0] and result["episodes"] == 1
