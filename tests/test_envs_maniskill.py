"""ManiSkillEnv on CPU physics (PushCube-v1, PickCube-v1) and the Vulkan driver lookup."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("mani_skill")

from ebrl.envs import EnvGroup, vulkan
from ebrl.envs.maniskill import ManiSkillEnv
from ebrl.types import ActionChunk

TASKS = ["PushCube-v1", "PickCube-v1"]
_cache: dict[str, ManiSkillEnv] = {}


def _get(task: str) -> ManiSkillEnv:
    """One env per task for the whole module: creating one costs about a second."""
    if task not in _cache:
        _cache[task] = ManiSkillEnv(task=task)
    return _cache[task]


@pytest.fixture(scope="module", params=TASKS)
def env(request) -> ManiSkillEnv:
    return _get(request.param)


@pytest.fixture(scope="module", autouse=True)
def _close_all():
    yield
    for e in _cache.values():
        e.close()
    _cache.clear()


def test_spec_reset_and_step_shapes(env):
    s = env.spec
    assert s.action_dim == 8 and s.max_episode_steps == 50
    assert (s.action_low, s.action_high) == (-1.0, 1.0) and env.action_box_uniform
    obs = env.reset(seed=1)
    assert obs.dtype == np.float32 and obs.shape == (s.obs_dim,)
    r = env.step(np.zeros(s.action_dim, np.float32))
    assert r.obs.dtype == np.float32 and r.obs.shape == (s.obs_dim,)
    assert isinstance(r.reward, float) and 0.0 <= r.reward <= 1.0  # normalized_dense
    assert all(isinstance(x, bool) for x in (r.terminated, r.truncated, r.success))


def test_reset_is_deterministic_in_the_seed(env):
    a, b, c = env.reset(seed=11), env.reset(seed=11), env.reset(seed=12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_actions_are_clipped_to_the_box(env):
    high = np.full(env.spec.action_dim, env.spec.action_high, np.float32)
    env.reset(seed=3)
    clipped = env.step(high).obs
    env.reset(seed=3)
    huge = env.step(high * 100.0).obs
    np.testing.assert_allclose(huge, clipped, atol=1e-6)


def test_episode_ends_within_max_episode_steps(env):
    env.reset(seed=4)
    rng = np.random.default_rng(0)
    steps, r = 0, None
    while steps < env.spec.max_episode_steps:
        r = env.step(rng.uniform(-1, 1, env.spec.action_dim).astype(np.float32))
        steps += 1
        if r.terminated or r.truncated:
            break
    assert r.terminated or r.truncated
    assert r.truncated == (not r.terminated and steps == env.spec.max_episode_steps)


def test_env_group_of_two_steps_a_chunk():
    envs = [_get("PushCube-v1"), ManiSkillEnv(task="PushCube-v1", max_episode_steps=3)]
    try:
        g = EnvGroup(envs, [4, 9], seed=0)
        obs = g.reset()
        assert obs.shape == (2, envs[0].spec.obs_dim) and obs.dtype == torch.float32
        k = 4
        out = g.step_chunk(
            ActionChunk(
                actions=torch.rand(2, k, 8) * 2 - 1,
                logprob=torch.zeros(2),
                value=torch.zeros(2),
                env_ids=torch.tensor([9, 4]),
                policy_version=torch.zeros(2, dtype=torch.int64),
            )
        )
        assert out.env_ids.tolist() == [9, 4]
        assert out.n_steps.tolist() == [3, 4]  # env 9's 3-step time limit cuts its chunk
        assert out.truncated.tolist() == [True, False]
        assert (out.reward[0, 3:] == 0).all() and out.episode_id.tolist() == [0, 0]
        assert not torch.equal(out.final_obs[0], out.next_obs[0])  # reset after the time limit
        assert torch.equal(out.final_obs[1], out.next_obs[1])
    finally:
        envs[1].close()


def test_with_a_camera_it_observes_the_robots_state_and_the_tasks_camera_as_a_vla_does():
    """camera_size > 0: ManiSkill's rgb mode, declared as RLinf's states + main_images with the
    task's instruction; the state is the robot's own (no object pose), in ManiSkill's order."""
    from ebrl.envs.layout import ObsLayout

    cam = ManiSkillEnv(task="PushCube-v1", control_mode="pd_ee_delta_pose", camera_size=16)
    full = ManiSkillEnv(task="PushCube-v1", control_mode="pd_ee_delta_pose")
    try:
        layout = cam.spec.obs_layout()
        assert isinstance(layout, ObsLayout) and full.spec.layout is None
        states, image = layout.fields
        assert (states.name, states.shape) == ("states", (25,))  # qpos 9, qvel 9, tcp pose 7
        assert (image.name, image.shape, image.kind) == ("main_images", (16, 16, 3), "image")
        assert cam.spec.obs_dim == 25 + 16 * 16 * 3 and cam.spec.action_dim == 7
        assert layout.instructions == ("push the cube to the goal region",)
        a, b = cam.reset(seed=3), full.reset(seed=3)
        # the same robot state as the full state's first entries (qpos, qvel)
        np.testing.assert_array_equal(a[:18], b[:18])
        pixels = a[image.start : image.stop]
        assert pixels.min() >= 0.0 and pixels.max() <= 1.0 and pixels.std() > 0.01
        np.testing.assert_array_equal(pixels * 255, np.round(pixels * 255))  # uint8 RGB / 255
        np.testing.assert_array_equal(cam.reset(seed=3), a)
        assert not np.array_equal(cam.reset(seed=4)[image.start :], pixels)  # the cube moved
        push = np.array([0.5, 0, -0.5, 0, 0, 0, 1], np.float32)
        for _ in range(3):
            r = cam.step(push)
        assert r.obs.shape == a.shape and not np.array_equal(r.obs[:25], a[:25])
    finally:
        cam.close()
        full.close()


def test_a_camera_is_checked_at_validation(tmp_path):
    from ebrl.config import ConfigError, validate

    from .conftest import make_cfg

    with pytest.raises(ConfigError, match=r"simulator.camera_size=4: 0 .* or 8..1024"):
        validate(make_cfg(["simulator=pushcube_rgb", "simulator.camera_size=4"], tmp_path))
    with pytest.raises(ConfigError, match=r"simulator.task=PlugCharger-v1 with a camera .*instr"):
        validate(make_cfg(["simulator=pushcube_rgb", "simulator.task=PlugCharger-v1"], tmp_path))
    ok = ["simulator=pushcube_rgb", "simulator.task=PlugCharger-v1", "simulator.instruction=plug"]
    validate(make_cfg(ok, tmp_path))
    with pytest.raises(ValueError, match="no instruction ebrl knows"):
        ManiSkillEnv(task="PlugCharger-v1", camera_size=8)


def test_unknown_task_names_known_ones():
    with pytest.raises(ValueError, match=r"Unknown ManiSkill task 'PushCub-v1'.*PushCube-v1"):
        ManiSkillEnv(task="PushCub-v1")


def test_task_needing_assets_fails_fast_without_prompt(monkeypatch):
    from mani_skill.utils import assets

    if assets.is_data_source_downloaded("ycb"):
        pytest.skip("YCB assets are downloaded here")
    monkeypatch.delenv("MS_SKIP_ASSET_DOWNLOAD_PROMPT", raising=False)
    with pytest.raises(RuntimeError, match=r"PickSingleYCB-v1.*download_asset"):
        ManiSkillEnv(task="PickSingleYCB-v1")


# --- Vulkan driver lookup ----------------------------------------------------------------------
def _icd(path):
    path.write_text(json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": "x"}}))
    return path


def test_vulkan_keeps_an_existing_setting(monkeypatch, tmp_path):
    f = _icd(tmp_path / "mine.json")
    monkeypatch.setenv("VK_ICD_FILENAMES", str(f))
    assert vulkan.ensure_vulkan() == str(f)


def test_vulkan_falls_back_to_ebrl_dir_then_repo_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VK_ICD_FILENAMES", str(tmp_path / "gone.json"))  # stale: replaced
    d = tmp_path / "drv"
    d.mkdir()
    f = _icd(d / "lvp_icd.json")
    monkeypatch.setenv("EBRL_VULKAN_DIR", str(d))
    assert vulkan.ensure_vulkan() == str(f)
    assert os.environ["VK_ICD_FILENAMES"] == str(f)
    monkeypatch.delenv("EBRL_VULKAN_DIR")
    monkeypatch.delenv("VK_ICD_FILENAMES")
    root = tmp_path / "repo"
    (root / ".cache" / "vulkan").mkdir(parents=True)
    g = _icd(root / ".cache" / "vulkan" / "lvp_icd.json")
    monkeypatch.setattr(vulkan, "_REPO_ROOT", root)
    assert vulkan.ensure_vulkan() == str(g)


def test_vulkan_missing_driver_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    monkeypatch.delenv("EBRL_VULKAN_DIR", raising=False)
    monkeypatch.setattr(vulkan, "_REPO_ROOT", tmp_path)
    with pytest.raises(RuntimeError, match=r"make setup.*setup_vulkan\.sh.*VK_ICD_FILENAMES"):
        vulkan.ensure_vulkan()
