"""validate() refuses, before any work, a config the machine cannot run, and names the fix.

The machine is data (MachineFacts), so these run the same on a laptop and on a GPU node.
"""

from __future__ import annotations

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from ebrl import external
from ebrl.config import ConfigError, validate
from ebrl.hardware import MachineFacts

from .conftest import make_cfg

PKGS = {
    "mani_skill": "/site/mani_skill",
    "libero": "/site/libero",
    "rlinf": "/site/rlinf",
    "robocasa": "/site/robocasa",
}


def machine(gpus=(), cuda=None, packages=PKGS, paths=(), env=None) -> MachineFacts:
    return MachineFacts(
        where="the test machine",
        gpus=tuple(gpus),
        cuda=bool(gpus) if cuda is None else cuda,
        cpus=16,
        find_package=MachineFacts.packages(packages),
        path_exists=lambda p: p in set(paths),
        env=env or {},
    )


CPU = machine()
#: an 8-GPU node with openpi and pi0's checkpoint (policy.model_cfg.model_path=/ckpt/pi0)
H100 = machine(
    gpus=["NVIDIA H100 80GB HBM3"] * 8,
    packages={**PKGS, "openpi": "/site/openpi"},
    paths=["/ckpt/pi0"],
)
# pi0 executes 5 actions per call, from a local checkpoint
GPU = ["gpu=h100", "chunk_size=5", "policy.model_cfg.model_path=/ckpt/pi0"]
#: LIBERO as the VLAs read it: both cameras, RLinf's 8-value state
LIBERO_VLA = ["simulator=libero", "simulator.obs_mode=state_rgb", "simulator.obs_layout=rlinf"]


def refused(overrides, on, *words):
    with pytest.raises(ConfigError) as e:
        validate(make_cfg(overrides), machine=on)
    for w in words:
        assert w in str(e.value), f"{w!r} not in: {e.value}"
    return str(e.value)


def test_cpu_default_runs_on_cpu():
    validate(make_cfg([]), machine=CPU)
    validate(make_cfg(["+experiment=embedded"]), machine=CPU)


def test_gpu_policy_on_cpu_names_the_gpu_options():
    refused(["policy=pi0", "chunk_size=5"], CPU, "policy=pi0", "NVIDIA GPU", "gpu=h100")


@pytest.mark.parametrize("policy", ["pi0", "gr00t", "openvla_oft", "dreamzero"])
def test_every_gpu_policy_refuses_cpu(policy):
    refused([f"policy={policy}", "chunk_size=${policy.action_chunk}"], CPU, f"policy={policy}")


def test_gpu_h100_without_a_gpu_says_use_gpu_cpu():
    refused(["gpu=h100"], CPU, "gpu=h100", "no NVIDIA GPU", "gpu=cpu", "launcher=slurm")


def test_gpu_policy_on_an_h100_node_passes():
    """pi0 on LIBERO as it reads it (both cameras, RLinf's 8-value state)."""
    node = machine(
        gpus=["NVIDIA H100 80GB HBM3"] * 8,
        packages={**PKGS, "openpi": "/site/openpi"},
        paths=["/ckpt/pi0", "/site/libero/libero/assets/scenes"],
        env={"LIBERO_CONFIG_PATH": "/libero"},
    )
    validate(make_cfg(["policy=pi0", *LIBERO_VLA, *GPU]), machine=node)


def test_wrong_gpu_type_names_the_one_present():
    h200 = machine(gpus=["NVIDIA H200"])
    refused(["gpu=h100"], h200, "NVIDIA H200", "conf/gpu/")


def test_gpu_torch_cannot_use_asks_for_cuda_torch():
    refused(["gpu=h100"], machine(gpus=["NVIDIA H100"], cuda=False), "CUDA build of torch")


def test_policy_chunk_must_match_its_action_chunk():
    ckpt = "policy.model_cfg.model_path=/ckpt/pi0"
    refused(["policy=pi0", "gpu=h100", "chunk_size=4", ckpt], H100, "chunk_size=4", "5 actions")


def test_model_too_large_for_the_gpu():
    refused(
        ["policy=dreamzero", "gpu=rtx4090", "chunk_size=32"],
        machine(gpus=["NVIDIA GeForce RTX 4090"]),
        "policy=dreamzero",
        "GiB",
    )


def test_missing_simulator_package_names_the_install():
    no_libero = machine(packages={"mani_skill": "/x"})
    refused(["simulator=libero"], no_libero, "simulator=libero", "'libero'", "pip install")
    refused(["simulator=pushcube"], machine(packages={}), "'mani_skill'", "pip install -e '.[sim]'")


def test_missing_simulator_env_and_assets():
    refused(["simulator=libero"], CPU, "LIBERO_CONFIG_PATH")
    env = {"LIBERO_CONFIG_PATH": "/cfg"}
    refused(["simulator=libero"], machine(env=env), "assets are missing", "/site/libero/libero")
    ok = machine(env=env, paths=["/site/libero/libero/assets/scenes"])
    validate(make_cfg(["simulator=libero"]), machine=ok)
    refused(["simulator=robocasa"], CPU, "download_kitchen_assets")
    # RoboCasa runs through RLinf's class: RLinf first, then RoboCasa itself
    refused(["simulator=robocasa"], machine(packages={}), "'rlinf'", "make test-rlinf")
    no_sim = machine(packages={"rlinf": "/site/rlinf"})
    refused(["simulator=robocasa"], no_sim, "'robocasa'", "github.com/robocasa/robocasa")
    assets = ["/site/robocasa/models/assets/objects/objaverse"]
    validate(make_cfg(["simulator=robocasa"]), machine=machine(paths=assets))


def test_behavior_needs_an_rtx_gpu():
    refused(["simulator=behavior"], CPU, "simulator=behavior", "NVIDIA GPU")
    refused(["simulator=behavior", "gpu=h100"], H100, "RT cores")


def test_behavior_needs_omnigibson_and_its_data_and_whole_worker_chunks():
    rtx = ["NVIDIA GeForce RTX 4090"]
    on = machine(gpus=rtx, env={"OMNIGIBSON_DATA_PATH": "/data"})
    refused(["simulator=behavior", "gpu=rtx4090"], on, "'omnigibson'", "setup.sh")
    pkgs = {**PKGS, "omnigibson": "/site/omnigibson"}
    refused(["simulator=behavior", "gpu=rtx4090"], machine(gpus=rtx, packages=pkgs), "OMNIGIBSON")
    ready = machine(gpus=rtx, packages=pkgs, env={"OMNIGIBSON_DATA_PATH": "/data"})
    validate(make_cfg(["simulator=behavior", "gpu=rtx4090", "scheduler=async"]), machine=ready)
    refused(
        ["simulator=behavior", "gpu=rtx4090", "scheduler=ebrl"],
        ready,
        "scheduler.pipeline=false scheduler.step_level=false",
    )


def test_unknown_packages_are_not_checked():
    """A cluster node seen from a laptop: packages unknown, only the hardware is checked."""
    node = MachineFacts(where="a node", gpus=("NVIDIA H100",), cuda=True, cpus=96)
    validate(make_cfg(["policy=pi0", *LIBERO_VLA, *GPU]), machine=node)


def test_launcher_and_resources_values():
    refused(["launcher=slurm", "launcher.gpus_per_node=1"], CPU, "gpu=cpu")
    refused(["policy=pi0", "launcher=slurm", *GPU], H100, "gpus_per_node=0")
    refused(["resources.pin=true", "resources.gen_cores=12", "resources.train_cores=8"], CPU, "20")
    refused(["resources.gen_sm_pct=50"], CPU, "needs a GPU")


def test_gpu_shares_on_a_machine_without_a_gpu_are_refused_naming_the_scale_keys():
    """The run's own Ray instance gets the GPUs NVML shows: none here, so the roles' shares
    could not be placed (issue 42)."""
    refused(["scheduler=ebrl", "+axis/scale=g1"], CPU, "GPU shares", "scale.gen_gpus=0")
    # joining a cluster: its nodes have the GPUs, not this machine
    validate(make_cfg(["scheduler=ebrl", "+axis/scale=g1", "scheduler.ray_address=auto"]), CPU)


def test_a_gpu_config_dry_runs_on_the_cores_where_torch_cannot_use_the_gpu():
    """scheduler.device=cpu: NVML sees the GPU, torch cannot (a CPU build): the GPU path runs,
    the stages compute on the cores; without it the run names that option."""
    cpu_torch = machine(gpus=["NVIDIA H100 80GB HBM3"], cuda=False)
    g1 = ["scheduler=ebrl", "+axis/scale=g1", "gpu=h100"]
    refused(g1, cpu_torch, "CUDA build of torch", "scheduler.device=cpu")
    validate(make_cfg([*g1, "scheduler.device=cpu"]), machine=cpu_torch)


def build_error(node) -> BaseException:
    """What building ``node`` raises (Hydra wraps it; the cause is the target's own error)."""
    with pytest.raises(InstantiationException) as e:
        instantiate(node, spec=None)
    assert e.value.__cause__ is not None
    return e.value.__cause__


def test_gpu_policy_target_raises_clearly_on_cpu(monkeypatch):
    monkeypatch.setattr(external, "local_machine", lambda: CPU)
    err = build_error(make_cfg(["policy=pi0", "chunk_size=5"]).policy)
    assert isinstance(err, external.UnavailableHere)
    assert "policy=pi0" in str(err) and "NVIDIA GPU" in str(err)
    assert "policy=transformer_l" in str(err)


def test_gpu_policy_target_never_pretends_on_a_gpu(monkeypatch):
    """On a GPU, the build names the package, then the checkpoint, before RLinf builds
    anything (with both, RLinf's registry builds it: tests/test_vla_configs.py)."""
    monkeypatch.delenv("EBRL_CHECKPOINTS", raising=False)
    cfg = make_cfg(["policy=pi0", "chunk_size=5"])
    monkeypatch.setattr(external, "local_machine", lambda: machine(gpus=["NVIDIA H100"]))
    err = build_error(cfg.policy)
    assert isinstance(err, external.UnavailableHere) and "'openpi'" in str(err)
    assert "install.sh embodied --model openpi" in str(err)
    gpu_with_pkg = machine(gpus=["NVIDIA H100"], packages={"openpi": "/x"})
    monkeypatch.setattr(external, "local_machine", lambda: gpu_with_pkg)
    err = build_error(cfg.policy)
    assert isinstance(err, external.UnavailableHere)
    assert "RLinf/RLinf-Pi0-LIBERO-Spatial-Object-Goal-SFT is not given" in str(err)


def test_the_paper_simulators_build_through_rlinfs_classes_and_say_what_is_missing():
    """RoboCasa and BEHAVIOR are RLinf's own classes behind ebrl's adapter: building one
    without a GPU, RLinf or the simulator package names what is missing."""
    robocasa = make_cfg(["simulator=robocasa"]).simulator
    assert robocasa._target_ == "ebrl.envs.rlinf_env.RLinfEnv" and robocasa.env_type == "robocasa"
    err = build_error(robocasa)
    assert "'robocasa'" in str(err) and "github.com/robocasa/robocasa" in str(err)
    behavior = make_cfg(["simulator=behavior"]).simulator
    assert behavior.vectorized and behavior.step_mode == "chunk"
    err = build_error(behavior)
    assert "simulator=behavior runs only on an NVIDIA GPU" in str(err)
