"""What a VLA reads, checked before any work: ``validate()`` (and so the dry run, which validates
every job) refuses a policy and simulator whose observation or action contract does not match
(camera images, the state's size, the action size, the instructions), naming the key to set;
the shipped full-size sweeps set what their VLAs read.

Each policy declares what it reads (``policy.reads``, conf/policy/*.yaml) and each simulator
node what it gives with its settings (``gives()``, ebrl/config/simulators.py), beside the
components.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ebrl.config import ConfigError, target_machine, validate
from ebrl.envs import libero
from ebrl.launch import cli
from ebrl.launch.sweep import expand, plan, sweep_names

from .conftest import make_cfg

#: the paper's trainable VLAs (DreamZero is refused as untrainable before its contract)
VLAS = ("pi0", "pi05", "gr00t", "openvla_oft")
#: a VLA's GPU job on a Slurm node (its checkpoint under conftest's EBRL_CHECKPOINTS)
GPU = ["gpu=h100", "launcher=slurm", "launcher.gpus_per_node=8"]
GPU += ["chunk_size=${policy.action_chunk}"]
#: LIBERO as the VLAs' checkpoints read it
LIBERO_VLA = ["simulator=libero", "simulator.obs_mode=state_rgb", "simulator.obs_layout=rlinf"]
FULL_SWEEPS = sorted(s for s in sweep_names() if s.endswith("_full"))


def check(overrides: list[str]) -> None:
    cfg = make_cfg(overrides)
    from omegaconf import OmegaConf

    validate(cfg, machine=target_machine(OmegaConf.to_object(cfg)))


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        check(overrides)
    return str(e.value)


@pytest.mark.parametrize("policy", VLAS)
def test_a_vla_on_libero_without_cameras_is_refused_naming_obs_mode(policy):
    """LIBERO's default obs_mode=state gives no image: RLinf's observation processors index
    main_images (and wrist_images) at the first rollout, a KeyError on the node."""
    msg = refusal([f"policy={policy}", "simulator=libero", *GPU])
    assert f"policy={policy} reads the camera images" in msg
    assert "simulator=libero gives no camera images" in msg
    assert "simulator.obs_mode=state_rgb" in msg


@pytest.mark.parametrize("policy", ["pi0", "pi05", "gr00t"])
def test_a_vla_reading_the_8_value_state_is_refused_ebrls_libero_state(policy):
    """pi0_libero's norm stats (and GR00T's LIBERO converter) read 8 values; ebrl's LIBERO
    state is 39 proprioception values + 14 per object."""
    msg = refusal([f"policy={policy}", "simulator=libero", "simulator.obs_mode=state_rgb", *GPU])
    assert "reads a state of 8 values" in msg
    assert "39 proprioception values + 14 per object" in msg
    assert "simulator.obs_layout=rlinf" in msg


@pytest.mark.parametrize("policy", VLAS)
def test_every_vla_passes_on_libero_with_cameras_and_rlinfs_state(policy):
    check([f"policy={policy}", *LIBERO_VLA, *GPU])


def test_openvla_oft_reads_no_state_so_ebrls_libero_state_passes():
    check(["policy=openvla_oft", "simulator=libero", "simulator.obs_mode=state_rgb", *GPU])


@pytest.mark.parametrize("policy", VLAS)
def test_robocasa_through_rlinfs_env_gives_a_vla_no_camera(policy):
    """ebrl's adapter of RLinf's envs passes the flat state only."""
    msg = refusal([f"policy={policy}", "simulator=robocasa", *GPU])
    assert "simulator=robocasa gives no camera images" in msg
    assert "ebrl.envs.rlinf_env" in msg and "simulator.obs_mode=state_rgb" in msg


def test_robocasas_12_actions_are_refused_for_a_7_action_checkpoint():
    """Past the images (a policy that reads none, as a test stand-in), the action size."""
    msg = refusal(["policy=openvla_oft", "policy.reads.images=[]", "simulator=robocasa", *GPU])
    assert "policy=openvla_oft outputs 7 actions per step" in msg
    assert "simulator=robocasa takes 12" in msg


def test_ebrls_own_policies_read_the_flat_vector_and_pass_anywhere():
    check(["policy=transformer_l", "simulator=counting"])
    check(["policy=mlp", "simulator=counting"])


def test_the_dry_run_refuses_the_pair_per_job_naming_the_key(capsys):
    code = cli.main(
        ["--dry-run", "headline_full", "policy=pi0", "simulator.obs_mode=state", "seed=0"]
    )
    out = capsys.readouterr().out
    assert code == 1 and "fail validation" in out
    assert "policy=pi0 reads the camera images" in out and "simulator.obs_mode=state_rgb" in out


@pytest.mark.parametrize("sweep", FULL_SWEEPS)
def test_each_full_sweep_sets_what_its_vlas_read(sweep):
    """One job per policy of each shipped full-size sweep: what the contract depends on."""
    from omegaconf import OmegaConf

    _, jobs = expand(sweep, [])
    by_policy: dict[str, list[str]] = {}
    for job in jobs:
        policy = next((o for o in job if o.startswith("policy=")), "")
        by_policy.setdefault(policy, job)
    for job in by_policy.values():
        cfg = make_cfg([f"+sweep={sweep}", *job])
        run = OmegaConf.to_object(cfg)
        assert cfg.simulator.obs_mode == "state_rgb" and cfg.simulator.obs_layout == "rlinf"
        validate(cfg, machine=target_machine(run))


@pytest.mark.slow
@pytest.mark.parametrize("sweep", FULL_SWEEPS)
def test_every_job_of_every_full_sweep_passes_the_dry_run(sweep):
    """Every job, through the dry run (validate per job against its Slurm node): none refused,
    none leaving a GPU it reserves idle (Colocated, one process, is on one GPU or not in it)."""
    p = plan(sweep, [])
    assert p.n_jobs > 0 and not p.errors, [msg for _, msg in p.errors][:3]


# --- the LIBERO adapter's RLinf layout --------------------------------------------------------
def test_quat2axisangle_is_robosuites():
    half = math.pi / 4  # a rotation of pi/2 about z
    q = np.array([0.0, 0.0, math.sin(half), math.cos(half)])
    assert np.allclose(libero.quat2axisangle(q), [0.0, 0.0, math.pi / 2])
    assert np.allclose(libero.quat2axisangle(np.array([0.0, 0.0, 0.0, 1.0])), 0.0)


def test_libero_gives_rlinfs_observation_under_obs_layout_rlinf():
    """The 8-value state from the raw observation (eef position, axis-angle, gripper), the
    two cameras rotated 180 degrees, as RLinf's LIBERO env gives them to its checkpoints."""
    if libero.local_problem() is not None:
        pytest.skip(libero.local_problem())
    s = 16
    env = libero.LiberoEnv(
        task="libero_spatial", task_id=0, obs_mode="state_rgb", camera_size=s, obs_layout="rlinf"
    )
    try:
        raw = env.raw_env.env._get_observations(force_update=True)
        obs = env._to_obs(raw)
        layout = env.spec.layout
        assert layout.size("states") == libero.RLINF_STATE_DIM
        assert [f.name for f in layout.fields] == ["states", "main_images", "wrist_images"]
        want = np.concatenate(
            [
                raw["robot0_eef_pos"],
                libero.quat2axisangle(raw["robot0_eef_quat"]),
                raw["robot0_gripper_qpos"],
            ]
        )
        assert np.allclose(obs[:8], want, atol=1e-6)
        main = layout.get("main_images")
        img = obs[main.start : main.stop].reshape(s, s, 3)
        assert np.allclose(img * 255.0, raw["agentview_image"][::-1, ::-1], atol=1e-3)
        assert env.spec.obs_dim == 8 + 2 * s * s * 3 and env.spec.action_dim == libero.ACTION_DIM
    finally:
        env.close()
