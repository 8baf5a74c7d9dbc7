"""RLinf's env registry behind ebrl's env interface (ebrl.envs.rlinf_env).

On a CPU fake with RLinf's env contract (tests/rlinf_fakes.py) everywhere; on RLinf's own
ManiSkill env where RLinf is installed (``make test-rlinf``: .venv-rlinf).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from ebrl.config import ConfigError, validate
from ebrl.envs.base import EnvGroup, reset_seed
from ebrl.envs.rlinf_env import RLinfEnv

from . import rlinf_fakes
from .conftest import TINY, make_cfg
from .test_envs_fake import chunk

FAKE = "tests.rlinf_fakes.get_env_cls"
FAKE_CFG = {"seed": 0, "auto_reset": True, "episode_len": 3}


def fake_env(env_id: int = 0, **kw) -> RLinfEnv:
    args = dict(env_type="fake", env_cfg=FAKE_CFG, max_episode_steps=50, action_dim=2)
    return RLinfEnv(env_id=env_id, registry=FAKE, **{**args, **kw})


def test_an_rlinf_env_resets_with_ebrls_seed_and_ends_its_episode_inside_a_chunk():
    envs = [fake_env(0), fake_env(1)]
    group = EnvGroup(envs, [0, 1], seed=7)
    obs = group.reset()
    assert obs.shape == (2, rlinf_fakes.OBS_DIM)
    # RLinf's class was built with one env, auto-reset off, and reset with ebrl's seeds
    built = [e.env for e in envs]
    assert all(b.num_envs == 1 and b.auto_reset is False for b in built)
    assert [b.resets[-1][1] for b in built] == [[reset_seed(7, 0, 0)], [reset_seed(7, 1, 0)]]
    # a chunk of 4 into 3-step episodes: env 0 pushes positive (success), env 1 negative
    acts = np.stack([np.ones((4, 2)), -np.ones((4, 2))])
    out = group.step_chunk(chunk([0, 1], acts))
    assert out.n_steps.tolist() == [3, 3]  # stopped where the episode ended, not at K
    assert out.terminated.tolist() == [True, True]
    assert out.success.tolist() == [True, False]
    assert out.reward[:, :3].sum(dim=1).tolist() == [1.0, 0.0]
    # the next episode starts from ebrl's next seed
    group.step_chunk(chunk([0], np.zeros((1, 1, 2))))
    assert built[0].resets[-1][1] == [reset_seed(7, 0, 1)]


def test_actions_are_clipped_to_the_box_and_the_time_limit_is_ebrls_too():
    env = fake_env(env_cfg={**FAKE_CFG, "episode_len": 100}, max_episode_steps=2)
    env.reset(5)
    r = env.step(np.array([9.0, -9.0], dtype=np.float32))
    assert r.obs[2] == pytest.approx(0.0)  # clipped to [1, -1]: the sum stays 0
    assert not r.truncated and env.step(np.zeros(2, np.float32)).truncated
    env.close()
    assert env.env.closed


def test_missing_state_missing_simulator_and_missing_rlinf_are_named():
    with pytest.raises(KeyError, match=r"no .states. entry.*main_images"):
        fake_env(env_type="no_state")
    with pytest.raises(RuntimeError, match=r"robocasa.*install the simulator"):
        fake_env(env_type="needs_sim")
    if importlib.util.find_spec("rlinf") is None:
        with pytest.raises(RuntimeError, match=r"RLinf is not importable.*make test-rlinf"):
            RLinfEnv(env_type="maniskill", env_cfg={}, max_episode_steps=5)


def test_validate_names_rlinf_when_it_is_not_installed():
    cfg = make_cfg(["simulator=rlinf_maniskill"])
    if importlib.util.find_spec("rlinf") is not None:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match=r"'rlinf'.*make test-rlinf"):
            validate(cfg)


FAKE_RUN = [
    *TINY,
    "simulator=rlinf_maniskill",
    "simulator.env_type=fake",
    f"simulator.registry={FAKE}",
    "simulator.package=''",
    "simulator.action_dim=2",
    "+simulator.env_cfg.episode_len=3",
    "tracking.enabled=false",
]


@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_a_run_trains_on_an_rlinf_env(scheduler, tmp_path):
    from ebrl.train import train

    extra = ["scheduler.backend=inprocess"] if scheduler == "ebrl" else []
    cfg = make_cfg([*FAKE_RUN, f"scheduler={scheduler}", *extra], tmp_path)
    summary = train(cfg)
    assert summary.iterations == 3
    # 3 updates x 4 envs x 4 chunks of 2 into 3-step episodes (a chunk of 2, then of 1: the
    # episode ends inside the chunk and the env stops there): 6 steps an env an update
    assert summary.env_steps == 3 * 4 * 6
    assert summary.status == "FINISHED"


needs_rlinf = pytest.mark.skipif(
    importlib.util.find_spec("rlinf") is None or importlib.util.find_spec("mani_skill") is None,
    reason="RLinf and ManiSkill: make test-rlinf (.venv-rlinf)",
)


@needs_rlinf
def test_rlinfs_own_maniskill_env_steps_like_ebrls_adapter():
    """RLinf's ManiskillEnv through the registry, against ebrl's own ManiSkill adapter: the
    same task, seed and actions give the same observations and rewards."""
    from ebrl.envs.maniskill import ManiSkillEnv

    cfg = make_cfg(["simulator=rlinf_maniskill"]).simulator
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(cfg, resolve=True)
    theirs = RLinfEnv(env_type=node["env_type"], env_cfg=node["env_cfg"], max_episode_steps=50)
    ours = ManiSkillEnv(task="PushCube-v1", max_episode_steps=50)
    assert theirs.spec.obs_dim == ours.spec.obs_dim and theirs.spec.action_dim == 8
    np.testing.assert_allclose(theirs.reset(3), ours.reset(3), atol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = rng.uniform(-1, 1, 8).astype(np.float32)
        x, y = theirs.step(a), ours.step(a)
        np.testing.assert_allclose(x.obs, y.obs, atol=1e-5)
        assert x.reward == pytest.approx(y.reward, abs=1e-5)
    theirs.close()
    ours.close()


def test_a_run_no_longer_than_its_warm_up_reports_its_overall_rate(tmp_path):
    """budget.iterations = warmup_iters leaves no steady window: the summary's rate is the
    whole run's, not 0 (seen on a 2-update RLinf run)."""
    from ebrl.train import train

    cfg = make_cfg([*FAKE_RUN, "scheduler=sync", "budget.iterations=1", "warmup_iters=1"], tmp_path)
    s = train(cfg)
    assert s.iterations == 1 and s.throughput_overall > 0
    assert s.throughput_e2e == pytest.approx(s.throughput_overall)


# --- vectorised: one RLinf instance for a worker's envs (RLinf's GPU envs) ---------------------
def vec_group(ids=(0, 1, 2), **kw):
    from ebrl.envs.rlinf_env import RLinfVecEnvGroup

    args = dict(env_type="fake", env_cfg=FAKE_CFG, max_episode_steps=50, action_dim=2)
    return RLinfVecEnvGroup(env_ids=list(ids), seed=7, registry=FAKE, **{**args, **kw})


def test_a_vectorised_instance_steps_its_envs_together_and_each_ends_where_it_ends():
    g = vec_group()
    inst = g.env
    assert inst.num_envs == 3 and inst.auto_reset is False
    assert inst.resets[-1] == ([0, 1, 2], [reset_seed(7, e, 0) for e in (0, 1, 2)])
    obs = g.reset()
    assert obs.shape == (3, rlinf_fakes.OBS_DIM)
    # env 0 and 2 end after 3 steps, env 1 after 4 (episode_len + i % 2); chunks of 4
    acts = np.stack([np.ones((4, 2)), -np.ones((4, 2)), np.ones((4, 2))])
    out = g.step_chunk(chunk([0, 1, 2], acts))
    assert inst.steps == 4  # one call per action, for every env
    assert out.n_steps.tolist() == [3, 4, 3]  # each stops where its episode ended
    assert out.terminated.tolist() == [True, True, True]
    assert out.success.tolist() == [True, False, True]
    assert out.reward[0, 3] == 0 and out.reward[:, :3].sum().item() == 2.0  # nothing after the end
    # the ended envs were reset together, each with ebrl's seed for its next episode
    assert inst.resets[-1] == ([0, 1, 2], [reset_seed(7, e, 1) for e in (0, 1, 2)])
    assert g.episode_id.tolist() == [1, 1, 1]
    np.testing.assert_allclose(out.next_obs[:, 1].numpy(), 0.0)  # fresh episodes
    assert set(g.step_latency()) == {0, 1, 2}


def test_a_vectorised_instance_resets_only_the_envs_that_ended():
    g = vec_group(env_cfg={**FAKE_CFG, "episode_len": 2})  # env 0 ends at 2 steps, env 1 at 3
    g.reset()
    out = g.step_chunk(chunk([0, 1, 2], np.zeros((3, 2, 2))))
    assert out.n_steps.tolist() == [2, 2, 2] and out.done.tolist() == [True, False, True]
    assert g.env.resets[-1] == ([0, 2], [reset_seed(7, 0, 1), reset_seed(7, 2, 1)])  # 1 goes on
    assert g.episode_step.tolist() == [0, 2, 0]


def test_a_vectorised_instance_refuses_partial_chunks_and_the_step_level_by_name():
    g = vec_group()
    g.reset()
    with pytest.raises(RuntimeError, match=r"every env of the worker \(3\).*pipeline=false"):
        g.step_chunk(chunk([0, 1], np.zeros((2, 2, 2))))
    with pytest.raises(RuntimeError, match="step_level=false"):
        g.step_one(0, np.zeros((2, 2), np.float32))


def test_a_class_that_resets_by_env_index_resets_only_the_envs_that_ended():
    """RoboCasa's reset takes the envs to reset (no seed): the others go on."""
    g = vec_group(env_type="env_idx", env_cfg={**FAKE_CFG, "episode_len": 2})
    g.reset()
    out = g.step_chunk(chunk([0, 1, 2], np.zeros((3, 2, 2))))
    assert out.done.tolist() == [True, False, True] and not out.truncated.any()
    assert g.env.resets[-1] == ([0, 2], [])
    assert g.episode_id.tolist() == [1, 0, 1] and g.episode_step.tolist() == [0, 2, 0]


# --- RLinf's chunk contract (BEHAVIOR): chunk_step and a reset of every env ------------------
def chunk_group(**kw):
    return vec_group(env_type="behavior", step_mode="chunk", **kw)


def test_the_chunk_contract_steps_a_whole_chunk_in_one_call_and_ends_episodes_at_its_end():
    g = chunk_group(env_cfg={**FAKE_CFG, "episode_len": 2})  # env 0, 2 end at step 2; 1 at 3
    inst = g.env
    assert inst.cfg.total_num_envs == 3  # BEHAVIOR sizes its subprocess pool from it
    g.reset()
    acts = np.stack([np.ones((4, 2)), -np.ones((4, 2)), np.ones((4, 2))])
    out = g.step_chunk(chunk([0, 1, 2], acts))
    assert inst.chunk_steps == 1  # one chunk_step, no step
    assert out.n_steps.tolist() == [4, 4, 4]  # RLinf reports the ends at the chunk's last column
    assert out.terminated.tolist() == [True, True, True]
    assert out.success.tolist() == [True, False, True]  # from infos["episode"]["success_once"]
    assert out.reward.sum(dim=1).tolist() == [1.0, 0.0, 1.0]
    assert g.episode_id.tolist() == [1, 1, 1] and g.episode_step.tolist() == [0, 0, 0]
    assert len(g.step_latency()[0]) == 3


def test_a_reset_of_every_env_cuts_the_episodes_still_running_and_says_so():
    """BEHAVIOR's reset resets every env: an env whose episode had not ended is truncated then
    (not left running on with a silently new start)."""
    g = chunk_group(env_cfg={**FAKE_CFG, "episode_len": 2})
    g.reset()
    out = g.step_chunk(chunk([0, 1, 2], np.zeros((3, 2, 2))))  # env 1 needs 3 steps
    assert out.terminated.tolist() == [True, False, True]
    assert out.truncated.tolist() == [False, True, False]
    assert g.env.resets[-1] == ([0, 1, 2], [])
    assert g.episode_id.tolist() == [1, 1, 1] and g.episode_step.tolist() == [0, 0, 0]
    np.testing.assert_allclose(out.next_obs[:, 1].numpy(), 0.0)  # every env starts afresh


def test_the_chunk_contracts_time_limit_ends_an_episode_at_the_chunk_that_reaches_it():
    g = chunk_group(env_cfg={**FAKE_CFG, "episode_len": 100}, max_episode_steps=6)
    g.reset()
    first = g.step_chunk(chunk([0, 1, 2], np.zeros((3, 4, 2))))
    assert not first.done.any()
    second = g.step_chunk(chunk([0, 1, 2], np.zeros((3, 4, 2))))  # steps 5-8 pass the limit
    assert second.truncated.all() and not second.terminated.any()


def test_the_chunk_mode_needs_a_class_with_chunk_step_and_a_vectorised_node():
    with pytest.raises(RuntimeError, match="has no chunk_step; use step_mode=step"):
        vec_group(env_type="env_idx", step_mode="chunk")
    with pytest.raises(ValueError, match="step_mode='bulk': choose step or chunk"):
        vec_group(step_mode="bulk")
    with pytest.raises(ConfigError, match=r"set simulator\.vectorized=true too"):
        validate(make_cfg([*FAKE_RUN, "simulator.step_mode=chunk"]))


VEC_RUN = [*FAKE_RUN, "simulator.vectorized=true"]
CHUNK_RUN = [
    *FAKE_RUN,
    "simulator.vectorized=true",
    "simulator.step_mode=chunk",
    "simulator.env_type=behavior",
]


def test_validate_asks_for_whole_worker_chunks_with_a_vectorised_simulator():
    with pytest.raises(
        ConfigError, match=r"set scheduler.pipeline=false scheduler.step_level=false"
    ):
        validate(make_cfg([*VEC_RUN, "scheduler=ebrl"]))
    with pytest.raises(ConfigError, match="Hybrid pipelines two env groups"):
        validate(make_cfg([*VEC_RUN, "scheduler=hybrid"]))
    validate(
        make_cfg(
            [*VEC_RUN, "scheduler=ebrl", "scheduler.pipeline=false", "scheduler.step_level=false"]
        )
    )


@pytest.mark.parametrize("form", ["vectorized", "chunk"])
@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_a_run_trains_on_a_vectorised_rlinf_env(scheduler, form, tmp_path):
    from ebrl.train import train

    extra = {
        "sync": [],
        "ebrl": [
            "scheduler.backend=inprocess",
            "scheduler.pipeline=false",
            "scheduler.step_level=false",
        ],
    }[scheduler]
    run = VEC_RUN if form == "vectorized" else CHUNK_RUN
    s = train(make_cfg([*run, f"scheduler={scheduler}", *extra], tmp_path))
    assert s.status == "FINISHED" and s.iterations == 3
    assert s.env_steps > 0


@needs_rlinf
def test_rlinfs_own_maniskill_env_as_a_vectorised_group_of_one():
    """The vectorised path on RLinf's real ManiSkill env (CPU physics holds one env per
    instance, so N = 1 here; on a GPU the same code steps N envs per call)."""
    from omegaconf import OmegaConf

    from ebrl.envs.base import EnvGroup
    from ebrl.envs.maniskill import ManiSkillEnv
    from ebrl.envs.rlinf_env import RLinfVecEnvGroup

    node = OmegaConf.to_container(make_cfg(["simulator=rlinf_maniskill"]).simulator, resolve=True)
    node.pop("_target_")
    node.pop("vectorized")
    theirs = RLinfVecEnvGroup(env_ids=[0], seed=3, **node)
    ours = EnvGroup([ManiSkillEnv(task="PushCube-v1", max_episode_steps=50)], [0], seed=3)
    np.testing.assert_allclose(theirs.reset().numpy(), ours.reset().numpy(), atol=1e-6)
    acts = np.random.default_rng(0).uniform(-1, 1, (1, 4, 8))
    x, y = theirs.step_chunk(chunk([0], acts)), ours.step_chunk(chunk([0], acts))
    np.testing.assert_allclose(x.next_obs.numpy(), y.next_obs.numpy(), atol=1e-5)
    np.testing.assert_allclose(x.reward.numpy(), y.reward.numpy(), atol=1e-5)
    theirs.close()
    ours.close()


def test_simulator_behavior_as_shipped_trains_through_the_adapter_on_a_fake(tmp_path):
    """conf/simulator/behavior.yaml as a user types it (vectorised, RLinf's chunk contract, its
    env_cfg), with only what the fake cannot be swapped: the registry (BEHAVIOR's contract on
    CPU), no GPU or OmniGibson, and the fake's action size."""
    from ebrl.train import train

    cfg = make_cfg(
        [
            *TINY,
            "simulator=behavior",
            f"simulator.registry={FAKE}",
            "simulator.requires_gpu=false",
            "simulator.requires_rt_cores=false",
            "simulator.package=''",
            "simulator.sim_package=null",
            "simulator.env_vars=[]",
            "simulator.action_dim=2",
            "+simulator.env_cfg.episode_len=3",
            "scheduler=sync",
            "eval.episodes=6",
            "tracking.enabled=false",
        ],
        tmp_path,
    )
    s = train(cfg)
    assert s.status == "FINISHED" and s.env_steps > 0
    # evaluated as it trains: one instance, whole chunks (the fake has no per-action step)
    assert s.eval_episodes == 6 and 0.0 <= s.eval_success_rate <= 1.0
