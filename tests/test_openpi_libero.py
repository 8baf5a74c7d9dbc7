"""The paper's pi0 (RLinf's openpi model, tiny) trained on LIBERO with cameras, on the CPU, end
to end through ``ebrl.train``: LIBERO's two cameras and RLinf's 8-value state
(``obs_mode=state_rgb``, ``obs_layout=rlinf``), each env's instruction tokenised, 2 PPO updates.

Skipped unless RLinf, rlinf-openpi and LIBERO are all importable (``make test-openpi`` builds
.venv-openpi; ``scripts/setup_libero.sh <its python>`` adds LIBERO to it).
"""

from __future__ import annotations

import csv
import importlib.util
import time

import numpy as np
import pytest

from .conftest import TINY, make_cfg

HAVE_OPENPI = all(importlib.util.find_spec(m) is not None for m in ("rlinf", "openpi"))


def _libero_problem() -> str | None:
    from ebrl.envs.libero import local_problem

    return local_problem()


pytestmark = [
    pytest.mark.skipif(not HAVE_OPENPI, reason="RLinf + rlinf-openpi: make test-openpi"),
    pytest.mark.skipif(
        HAVE_OPENPI and _libero_problem() is not None, reason=str(_libero_problem())
    ),
    pytest.mark.slow,
]

#: LIBERO-Spatial's tasks spread over the envs, as the VLAs read it, small cameras (pi0's
#: transforms resize them to 224), 8-step episodes: a segment of 4 chunks of 2 per env
LIBERO_RGB = [
    "simulator=libero",
    "simulator.task_id=all",
    "simulator.obs_mode=state_rgb",
    "simulator.obs_layout=rlinf",
    "simulator.camera_size=32",
    "simulator.max_episode_steps=8",
]


def run(tmp_path, scheduler: str = "sync") -> list[str]:
    keep = ("policy.", "simulator=", "budget.iterations")
    return [
        *(o for o in TINY if not o.startswith(keep)),
        *LIBERO_RGB,
        "policy=pi0_tiny",
        "tracking.enabled=false",
        "budget.iterations=2",
        f"scheduler={scheduler}",
    ]


def test_pi0_reads_both_cameras_the_state_and_the_instruction(tmp_path):
    """RLinf's openpi processor gets LIBERO's main and wrist images, the 8-value state and
    each env's task description; the learner rebuilds its image inputs from the observation."""
    from ebrl.envs.libero import LiberoEnv
    from ebrl.stages.factory import StageFactory

    cfg = make_cfg(run(tmp_path), tmp_path)
    env = LiberoEnv(task="libero_spatial", obs_mode="state_rgb", obs_layout="rlinf", camera_size=32)
    try:
        policy = StageFactory.from_config(cfg).with_spec(env.spec).policy()
        obs = env.reset(0)
    finally:
        env.close()
    import torch

    env_obs = policy.env_obs(torch.as_tensor(obs)[None])
    assert env_obs["main_images"].shape == (1, 32, 32, 3)
    assert env_obs["wrist_images"].shape == (1, 32, 32, 3)
    assert env_obs["states"].shape == (1, 8)
    assert env_obs["task_descriptions"] == [env.language]
    assert "main_images" in policy.from_obs.values()


def test_ppo_trains_pi0_on_libero_with_cameras_for_2_updates(tmp_path, record_property):
    from ebrl.train import train

    t0 = time.perf_counter()
    s = train(make_cfg(run(tmp_path), tmp_path))
    took = time.perf_counter() - t0
    record_property("train_s", round(took, 1))
    print(f"pi0_tiny on LIBERO state_rgb, 2 updates (sync): {took:.1f} s")
    assert s.status == "FINISHED" and s.iterations == 2
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert len(rows) == 2
    for r in rows:  # fresh data: the learner scores each decision as the generator did
        assert float(r["train/behave_weight_mean"]) == pytest.approx(1.0, abs=1e-3)
        assert np.isfinite(float(r["train/policy_loss"]))
