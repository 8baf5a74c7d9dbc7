"""simulator=libero: LIBERO's tasks behind Env / EnvGroup on CPU physics, its config and set-up.

The env tests need LIBERO (``make setup-libero``, which ``make test`` runs first) and are skipped
with the reason when it is missing; the config and ``validate()`` tests run anywhere (the machine
is data). The end-to-end runs (``python -m ebrl.train simulator=libero``) are in test-slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException

from ebrl.config import ConfigError, validate
from ebrl.envs import EnvGroup, reset_seed
from ebrl.envs import libero as lib
from ebrl.hardware import MachineFacts
from ebrl.stages.sim import SimStage
from ebrl.types import ActionChunk

from .conftest import make_cfg

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = lib.local_problem()
needs_libero = pytest.mark.skipif(PROBLEM is not None, reason=f"LIBERO is missing: {PROBLEM}")
#: the Panda's proprioception in LIBERO's robot0_proprio-state
PROPRIO = 39
#: a gripper-open no-op: the arm holds its pose
HOLD = np.array([0, 0, 0, 0, 0, 0, -1.0], dtype=np.float32)

_cache: dict[tuple, lib.LiberoEnv] = {}


def _env(**kw) -> lib.LiberoEnv:
    """One env per configuration for the module: building one costs about a second."""
    key = tuple(sorted(kw.items()))
    if key not in _cache:
        _cache[key] = lib.LiberoEnv(**kw)
    return _cache[key]


@pytest.fixture(scope="module", autouse=True)
def _close_all():
    yield
    for e in _cache.values():
        e.close()
    _cache.clear()


def _chunk(env_ids: list[int], actions: np.ndarray) -> ActionChunk:
    m = len(env_ids)
    return ActionChunk(
        actions=torch.as_tensor(np.broadcast_to(actions, (m, *actions.shape)).copy()),
        logprob=torch.zeros(m),
        value=torch.zeros(m),
        env_ids=torch.tensor(env_ids),
        policy_version=torch.zeros(m, dtype=torch.int64),
    )


# --- config and validate(): no LIBERO needed --------------------------------------------------
def _machine(packages=None, paths=(), env=None) -> MachineFacts:
    folders = {"libero": "/site/libero"} if packages is None else packages
    return MachineFacts(
        where="the test machine",
        cpus=2,
        find_package=MachineFacts.packages(folders),
        path_exists=lambda p: p in set(paths),
        env={} if env is None else env,
    )


SCENES = "/site/libero/libero/assets/scenes"
READY = _machine(paths=[SCENES], env={"LIBERO_CONFIG_PATH": "/cfg"})


@pytest.mark.parametrize(
    ("suite", "steps", "tasks"), [(s, i.max_steps, i.n_tasks) for s, i in lib.SUITES.items()]
)
def test_config_composes_per_suite_and_validates(suite, steps, tasks):
    cfg = make_cfg(
        ["simulator=libero", f"simulator.task={suite}", f"simulator.task_id={tasks - 1}"]
    )
    assert cfg.simulator._target_ == "ebrl.envs.libero.LiberoEnv"
    assert cfg.simulator.max_episode_steps == steps  # the suite's length follows the suite
    run = validate(cfg, machine=READY)
    assert run.simulator.task == suite and run.simulator.task_id == str(tasks - 1)
    pinned = make_cfg(
        ["simulator=libero", f"simulator.task={suite}", "simulator.max_episode_steps=9"]
    )
    assert validate(pinned, machine=READY).simulator.max_episode_steps == 9


def test_wrong_values_fail_naming_the_problem_and_the_fix():
    with pytest.raises(ConfigError, match=r"tasks 0\.\.9.*task_id=all"):
        validate(make_cfg(["simulator=libero", "simulator.task_id=10"]), machine=READY)
    with pytest.raises(ConfigError, match=r"task_id='first'"):
        validate(make_cfg(["simulator=libero", "simulator.task_id=first"]), machine=READY)
    with pytest.raises(ConfigError, match="camera_size=4"):
        cfg = make_cfg(
            ["simulator=libero", "simulator.obs_mode=state_rgb", "simulator.camera_size=4"]
        )
        validate(cfg, machine=READY)
    with pytest.raises(ConfigCompositionException) as e:  # refused at composition, with choices
        make_cfg(["simulator=libero", "simulator.task=libero_100"])
    assert "libero_object" in str(e.value.__cause__) and "simulator.task" in str(e.value.__cause__)
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg(["simulator=libero", "simulator.obs_mode=rgbd"])
    assert "state_rgb" in str(e.value.__cause__)


def test_validate_says_how_to_build_libero_when_it_or_its_assets_are_missing():
    cfg = make_cfg(["simulator=libero"])

    def refused(machine: MachineFacts, *words: str) -> None:
        with pytest.raises(ConfigError) as e:
            validate(cfg, machine=machine)
        for w in ("make setup-libero", *words):
            assert w in str(e.value), f"{w!r} not in: {e.value}"

    refused(_machine(packages={}), "'libero'", "pip install")  # no LIBERO at all
    refused(_machine(paths=[SCENES]), "LIBERO_CONFIG_PATH", "config.yaml")  # never set up
    refused(_machine(env={"LIBERO_CONFIG_PATH": "/cfg"}), "assets are missing", SCENES)
    config = str(lib.default_config_dir() / "config.yaml")  # set up: the config make wrote
    validate(cfg, machine=_machine(paths=[SCENES, config]))
    validate(cfg, machine=MachineFacts(where="a node", cpus=96))  # unknown: not checked


def test_the_adapter_refuses_with_the_make_target_when_libero_is_missing(monkeypatch, tmp_path):
    """What a run would meet without ``make setup-libero`` (simulated: LIBERO made invisible,
    then its config made absent); nothing is imported or built."""
    monkeypatch.setattr(lib, "_find_package", lambda name: None)
    with pytest.raises(RuntimeError, match="make setup-libero") as e:
        lib.LiberoEnv(task="libero_object", task_id=0)
    assert "'libero'" in str(e.value)
    monkeypatch.setattr(lib, "_find_package", lambda name: str(tmp_path / name))
    monkeypatch.delenv("LIBERO_CONFIG_PATH", raising=False)
    monkeypatch.setattr(lib, "default_config_dir", lambda: tmp_path / "nowhere")
    with pytest.raises(RuntimeError, match=r"LIBERO_CONFIG_PATH.*make setup-libero"):
        lib.LiberoEnv(task="libero_object", task_id=0)
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="assets are missing"):
        lib.LiberoEnv(task="libero_object", task_id=0)


def test_tasks_spread_over_envs():
    assert [lib.task_index("all", e, 10) for e in range(12)] == [*range(10), 0, 1]
    assert lib.task_index(3, 7, 10) == lib.task_index("3", 0, 10) == 3
    with pytest.raises(ValueError, match=r"0\.\.89"):
        lib.task_index(90, 0, 90)


# --- LIBERO itself ----------------------------------------------------------------------------
@needs_libero
def test_reset_starts_from_the_suites_fixed_initial_states():
    env = _env(task="libero_object", task_id=0)
    assert env.spec.obs_dim == PROPRIO + 7 * lib.OBJECT_STATE_DIM  # 7 objects, no one-hot
    assert env.spec.action_dim == 7 and env.spec.max_episode_steps == 280
    assert (env.spec.action_low, env.spec.action_high) == (-1.0, 1.0)
    init = np.asarray(env._init)
    assert init.shape[0] == 50
    for seed in (5, 123_457):  # the state the seed picks, set in full
        obs = env.reset(seed)
        state = env.raw_env.get_sim_state()
        np.testing.assert_allclose(state, init[seed % 50], atol=1e-9)
        assert obs.dtype == np.float32 and obs.shape == (env.spec.obs_dim,)
        np.testing.assert_array_equal(env.reset(seed), obs)  # the same seed, the same start
    assert not np.array_equal(env.reset(5), env.reset(6))
    assert not env.check_success()


@needs_libero
def test_sampled_initial_states_follow_the_seed():
    env = _env(task="libero_spatial", task_id=2, init_states="sampled")
    a, b, c = env.reset(7), env.reset(7), env.reset(8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    state = np.random.get_state()[1].copy()
    env.reset(9)  # LIBERO draws placements from numpy's global RNG: ours is left as it was
    np.testing.assert_array_equal(np.random.get_state()[1], state)


@needs_libero
def test_sampled_layouts_start_the_arm_as_the_suites_fixed_states_do():
    """LIBERO's fixed initial states start the arm with robosuite's default joint noise; LIBERO's
    own env turns it off, and sampled layouts then started the arm at one pose every time
    (a start the benchmark never has: policies trained from it did worse on the fixed states)."""
    fixed = _env(task="libero_object", task_id=0)
    sampled = _env(task="libero_object", task_id=0, init_states="sampled")

    def joints(env: lib.LiberoEnv, seeds: range) -> np.ndarray:
        return np.stack([env._reset_raw(s)["robot0_joint_pos"] for s in seeds])

    f, g = joints(fixed, range(40)), joints(sampled, range(40))
    assert f.std(0).min() > 0.01  # the benchmark's states: ~0.02 rad a joint
    assert np.all(g.std(0) > 0.5 * f.std(0)) and np.all(g.std(0) < 2 * f.std(0))
    assert np.abs(g.mean(0) - f.mean(0)).max() < 0.02  # about the same pose
    np.testing.assert_array_equal(joints(sampled, range(3)), joints(sampled, range(3)))


@needs_libero
def test_all_tasks_share_one_layout_with_a_task_one_hot():
    a = _env(task="libero_10", task_id="all", env_id=2)
    b = _env(task="libero_10", task_id="all", env_id=13)
    assert (a.task_index, b.task_index) == (2, 3)
    # libero_10's tasks have 2..8 objects: every env pads to 8, then 10 task slots
    assert a.spec.obs_dim == b.spec.obs_dim == PROPRIO + 8 * lib.OBJECT_STATE_DIM + 10
    hot = PROPRIO + 8 * lib.OBJECT_STATE_DIM
    np.testing.assert_array_equal(a.reset(0)[hot:], np.eye(10, dtype=np.float32)[2])
    np.testing.assert_array_equal(b.reset(0)[hot:], np.eye(10, dtype=np.float32)[3])
    group = EnvGroup([a, b], [2, 13], seed=0)
    assert group.reset().shape == (2, a.spec.obs_dim)
    # the layout names the parts: the task's one-hot indexes the suite's instructions
    layout = a.spec.obs_layout()
    assert layout.names() == ["states", "task"] and layout.size("states") == hot
    assert layout.instructions == b.spec.obs_layout().instructions
    assert len(layout.instructions) == 10 and layout.instructions[2] == a.language
    obs = torch.as_tensor(group.reset())
    assert layout.instructions_of(obs) == [a.language, b.language]


@needs_libero
def test_a_group_steps_a_chunk_and_records_per_env_step_latency():
    env = _env(task="libero_object", task_id=0)
    env.reset(0)
    env.step(HOLD)  # robosuite compiles its controller (numba) at the first step of a process
    group = EnvGroup([env], [4], seed=1)
    stage = SimStage(group)
    first = stage.reset().obs
    rng = np.random.default_rng(0)
    out = stage.step(_chunk([4], rng.uniform(-1, 1, (4, 7)).astype(np.float32)))
    assert out.n_steps.tolist() == [4] and not out.terminated.any() and not out.truncated.any()
    assert out.reward.shape == (1, 4) and float(out.reward.sum()) == 0.0
    assert not torch.equal(out.next_obs[0], first[0])  # the arm moved
    assert int(group.episode_step[0]) == 4
    ((p50, p99, n),) = group.step_latency().values()
    assert n == 4 and 0 < p50 <= p99 < 1.0  # ~10-30 ms a step on this machine
    g = stage.gauges()
    assert set(g) == {
        "sim/env4/step_ms_p50",
        "sim/env4/step_ms_p99",
        "sim/steps_total",
        "sim/step_s_total",
    }
    assert g["sim/steps_total"] == 4 and g["sim/step_s_total"] > 0
    assert g["sim/env4/step_ms_p50"] == pytest.approx(p50 * 1e3)


@needs_libero
def test_an_episode_that_ends_inside_a_chunk_ends_the_chunk():
    env = _env(task="libero_goal", task_id=1, max_episode_steps=3)
    group = EnvGroup([env], [0], seed=2)
    group.reset()
    out = group.step_chunk(_chunk([0], np.tile(HOLD, (5, 1))))
    assert out.n_steps.tolist() == [3]  # the time limit, 2 actions before the chunk's end
    assert out.truncated.tolist() == [True] and out.terminated.tolist() == [False]
    assert out.reward[0, 3:].sum() == 0
    assert (int(group.episode_id[0]), int(group.episode_step[0])) == (1, 0)
    # the next observation is the next episode's start, from that episode's reset seed
    expected = env.reset(reset_seed(2, 0, 1))
    np.testing.assert_array_equal(out.next_obs[0].numpy(), expected)
    assert not np.array_equal(out.final_obs[0].numpy(), expected)


def _place_per_goal(env: lib.LiberoEnv) -> str:
    """Move the object of the task's BDDL goal ``(In <object> <region>)`` into the region's
    parent object, as a successful demonstration would leave it; returns the object's name.
    The state is set through MuJoCo only: LIBERO's own predicate judges it."""
    inner = env.raw_env.env
    ((pred, obj, region),) = inner.parsed_problem["goal_state"]
    assert pred == "in"
    holder = inner.object_sites_dict[region].parent_name
    target = inner.sim.data.body_xpos[inner.obj_body_id[holder]].copy()
    joint = inner.get_object(obj).joints[-1]
    qpos = inner.sim.data.get_joint_qpos(joint).copy()
    qpos[:3] = target + np.array([0.0, 0.0, 0.08])  # just above the basket, upright
    inner.sim.data.set_joint_qpos(joint, qpos)
    inner.sim.forward()
    return obj


@needs_libero
def test_success_comes_from_the_tasks_own_goal_predicate():
    """No demonstration actions ship with the packages, only their initial states: the goal
    state (object in the basket) is set on the simulator, and LIBERO's predicate ends the
    episode inside the chunk: terminated, success, reward 1 at that step."""
    env = _env(task="libero_object", task_id=0)
    group = EnvGroup([env], [0], seed=3)
    group.reset()
    assert not env.check_success()
    out = group.step_one(0, np.tile(HOLD, (4, 1)))  # not placed: 4 steps, nothing happens
    assert out.n_steps.tolist() == [4] and not out.success.any()
    obj = _place_per_goal(env)
    assert obj == "alphabet_soup_1" and env.check_success()
    out = group.step_one(0, np.tile(HOLD, (4, 1)))
    assert out.n_steps.tolist() == [1] and out.terminated.tolist() == [True]
    assert out.success.tolist() == [True] and out.reward[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert (int(group.episode_id[0]), int(group.episode_step[0])) == (1, 0)


@needs_libero
def test_cameras_render_on_the_cpu_into_the_flat_observation():
    s = 32
    env = _env(task="libero_object", task_id=0, obs_mode="state_rgb", camera_size=s)
    state = PROPRIO + 7 * lib.OBJECT_STATE_DIM
    assert env.spec.obs_dim == state + 2 * s * s * 3
    obs = env.reset(0)
    np.testing.assert_array_equal(obs[:state], _env(task="libero_object", task_id=0).reset(0))
    images = obs[state:].reshape(2, s, s, 3)
    assert images.min() >= 0.0 and images.max() <= 1.0
    for img in images:  # a real picture: many distinct values, not a blank frame
        assert img.std() > 0.02 and len(np.unique(img)) > 50
    assert not np.array_equal(images[0], images[1])  # agentview and the wrist camera
    # the layout's views: the state, then each camera as uint8 pixels; this task's instruction
    layout = env.spec.obs_layout()
    assert layout.names() == ["states", "main_images", "wrist_images"]
    batch = torch.from_numpy(obs[None])
    np.testing.assert_array_equal(layout.view(batch, "states")[0].numpy(), obs[:state])
    for c, name in enumerate(("main_images", "wrist_images")):
        pixels = layout.view(batch, name)
        assert pixels.dtype == torch.uint8 and pixels.shape == (1, s, s, 3)
        np.testing.assert_array_equal(pixels[0].numpy(), np.round(images[c] * 255).astype(np.uint8))
    assert layout.instructions_of(batch) == [env.language]
    r = env.step(HOLD)
    assert r.obs.shape == obs.shape and not r.terminated
    other = "osmesa" if os.environ.get("MUJOCO_GL") == "egl" else "egl"
    with pytest.raises(RuntimeError, match=f"render_backend={other}.*MUJOCO_GL"):
        lib.LiberoEnv(task="libero_object", task_id=0, obs_mode="state_rgb", render_backend=other)


# --- end to end: python -m ebrl.train simulator=libero ----------------------------------------
TINY = [
    "simulator=libero",
    "simulator.task=libero_object",
    "simulator.max_episode_steps=12",  # episodes end during the run, some inside a chunk
    "policy.hidden=32",
    "policy.layers=1",
    "num_envs=2",
    "env_groups=2",
    "chunk_size=5",
    "rollout_steps=10",
    "budget.iterations=3",
    "budget.env_steps=100000",
    "warmup_iters=1",
    "progress=false",
    "threads.train=1",
    "algo.cfg.update_epochs=1",
    "algo.cfg.num_minibatches=1",
]


def train_in_a_process(overrides: list[str], tmp_path: Path) -> dict:
    """``python -m ebrl.train <overrides>`` in a process of its own; its summary.json."""
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *overrides,
        f"run_dir={tmp_path / 'run'}",
        f"tracking.store={tmp_path / 'mlflow'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",  # not a folder in the repository's outputs/
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "run" / "summary.json").read_text())


@needs_libero
@pytest.mark.slow
@pytest.mark.parametrize(
    "scheduler",
    [
        ["scheduler=sync"],
        # the shape pinned (no start-up profile): two env workers, env by env
        [
            "scheduler=ebrl",
            "scheduler.backend=inprocess",
            "scheduler.pipeline=true",
            "scheduler.step_level=true",
            "scheduler.batch_min=1",
        ],
    ],
    ids=["sync", "ebrl-inprocess"],
)
def test_training_on_libero_end_to_end(scheduler, tmp_path):
    summary = train_in_a_process([*TINY, *scheduler], tmp_path)
    assert summary["status"] == "FINISHED" and summary["iterations"] == 3
    assert summary["simulator"].startswith("libero")
    # 3 updates x 2 envs x 2 decisions of up to 5 steps; the 12-step episodes end 2 steps into
    # every third chunk, so fewer than 60 steps were taken
    assert 12 <= summary["env_steps"] < 3 * 2 * 10
    assert summary["stage_busy_s"]["sim"] > 0


@needs_libero
@pytest.mark.slow
def test_a_vla_trains_on_libero_cameras_and_instruction(tmp_path):
    """A VLA-shaped model with RLinf's contract (tests/rlinf_fakes.py: FakeVLAModel: the two
    cameras as uint8, the instruction tokenised, a denoising chain) trains on LIBERO's rendered
    observations; every decision is scored as the generator scored it."""
    import csv

    vla = [
        *(o for o in TINY if not o.startswith("policy.")),
        "simulator.obs_mode=state_rgb",
        "simulator.camera_size=8",
        "policy=rlinf_mlp",
        "policy.model_type=fake_vla",
        "policy.registry=tests.rlinf_fakes.get_model",
        "policy.package=''",
        "scheduler=sync",
    ]
    summary = train_in_a_process(vla, tmp_path)
    assert summary["status"] == "FINISHED" and summary["iterations"] == 3
    for r in csv.DictReader((tmp_path / "run" / "metrics.csv").open()):
        assert float(r["train/behave_weight_mean"]) == pytest.approx(1.0, abs=1e-4)
