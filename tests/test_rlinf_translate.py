"""Real-RLinf wrappers: the translation pinned per mode, RLinf's own checks, the launcher's edges.

Runs anywhere. Where ``rlinf`` imports and ``RLINF_REPO`` points at an RLinf v0.3 checkout, the
translations are also composed with RLinf's own configs and checked by its own validator and
placement parser (e.g. ``RLINF_REPO=$CO PYTHONPATH=$CO pytest tests/test_rlinf_translate.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from baselines.rlinf.launch import (
    ENTRY,
    INSTALL,
    MetricMapper,
    RLinfScheduler,
    command,
    follow,
    missing,
)
from baselines.rlinf.translate import (
    TranslationError,
    env_steps_per_iteration,
    translate,
    world_sizes,
)
from ebrl.config import ConfigError, validate
from ebrl.schedulers.base import StageError

from .conftest import make_cfg

#: an ebrl run RLinf can express: ManiSkill PushCube, the 3x256 MLP, one action per decision
RUN = [
    "simulator=pushcube",
    "policy=mlp",
    "chunk_size=1",
    "num_envs=16",
    "rollout_steps=50",
    "seed=3",
    "algo.cfg.num_minibatches=4",
    "budget.iterations=10",
    "tracking.enabled=false",
]


#: the GPUs each option is pinned with below (its gpus follow launcher.gpus_per_node)
MODE_GPUS = {"rlinf_colocated": 1, "rlinf_hybrid": 2, "rlinf_async": 1}


def ebrl_run(scheduler: str = "rlinf_colocated", extra=()) -> dict:
    """The resolved ebrl config as plain containers (what the scheduler receives)."""
    gpus = f"launcher.gpus_per_node={MODE_GPUS[scheduler]}"
    cfg = make_cfg([*RUN, f"scheduler={scheduler}", gpus, *extra])
    return OmegaConf.to_container(cfg, resolve=True)


def rlinf_of(scheduler: str, extra=(), **kw) -> dict:
    """Translate with the scheduler option's own settings (as RLinfScheduler.run does)."""
    run = ebrl_run(scheduler, extra)
    s = run["scheduler"]
    args = {
        "mode": s["mode"],
        "gpus": s["gpus"],
        "nodes": s["nodes"],
        "staleness": s.get("staleness", 1),
        "model": s["model"],
        "env": s["env"],
        "overrides": s["overrides"],
        **kw,
    }
    return translate(run, **args)


# --- the translation, pinned ------------------------------------------------------------------
COLOCATED = {
    "defaults": [
        "env/maniskill_pick_cube@env.train",
        "model/mlp_policy@actor.model",
        "training_backend/fsdp@actor.fsdp_config",
        "weight_syncer/patch_syncer@weight_syncer",
        {"override hydra/job_logging": "stdout"},
        "_self_",
    ],
    "hydra": {
        "run": {"dir": "."},
        "output_subdir": None,
        "searchpath": ["file://${oc.env:EMBODIED_PATH}/config/"],
    },
    "cluster": {"num_nodes": 1, "component_placement": {"actor,env,rollout": "0-0"}},
    "runner": {
        "task_type": "embodied",
        "logger": {
            "log_path": "logs",
            "project_name": "ebrl",
            "experiment_name": "ebrl_rlinf_colocated",
            "logger_backends": ["tensorboard"],
        },
        "max_epochs": 10,
        "max_steps": -1,
        "only_eval": False,
        "val_check_interval": -1,
        "save_interval": -1,
        "resume_dir": None,
        "ckpt_path": None,
    },
    "algorithm": {
        "adv_type": "gae",
        "loss_type": "actor_critic",
        "loss_agg_func": "token-mean",
        "reward_type": "action_level",
        "logprob_type": "action_level",
        "entropy_type": "action_level",
        "group_size": 1,
        "normalize_advantages": True,
        "kl_penalty": "kl",
        "kl_beta": 0.0,
        "entropy_bonus": 0.0,
        "update_epoch": 8,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "clip_ratio_c": 3.0,
        "value_clip": 1.0,
        "huber_delta": 10.0,
        "bootstrap_type": "always",
        "gamma": 0.8,
        "gae_lambda": 0.9,
    },
    "env": {
        "group_name": "EnvGroup",
        "train": {
            "total_num_envs": 16,
            "max_steps_per_rollout_epoch": 50,
            "rollout_epoch": 1,
            "auto_reset": True,
            "ignore_terminations": False,
            "use_fixed_reset_state_ids": False,
            "group_size": 1,
            "seed": 3,
            "enable_offload": True,
            "max_episode_steps": 50,
            "init_params": {"id": "PushCube-v1"},
        },
    },
    "rollout": {
        "group_name": "RolloutGroup",
        "backend": "huggingface",
        "enable_offload": True,
        "pipeline_stage_num": 1,
        "model": {
            "model_path": "${actor.model.model_path}",
            "precision": "${actor.model.precision}",
        },
        "enable_torch_compile": True,
        "enable_cuda_graph": True,
    },
    "actor": {
        "group_name": "ActorGroup",
        "training_backend": "fsdp",
        "micro_batch_size": 200,
        "global_batch_size": 200,
        "seed": 3,
        "enable_offload": True,
        "model": {
            "model_type": "mlp_policy",
            "model_path": "",
            "policy_setup": "panda-qpos",
            "obs_dim": 35,
            "action_dim": 8,
            "num_action_chunks": 1,
            "hidden_dim": 256,
            "precision": "32",
            "add_value_head": True,
            "is_lora": False,
        },
        "optim": {
            "lr": 3e-4,
            "value_lr": 3e-4,
            "adam_beta1": 0.9,
            "adam_beta2": 0.999,
            "adam_eps": 1e-5,
            "weight_decay": 0.0,
            "clip_grad": 0.5,
        },
        "fsdp_config": {
            "strategy": "fsdp",
            "sharding_strategy": "no_shard",
            "mixed_precision": {
                "param_dtype": "${actor.model.precision}",
                "reduce_dtype": "${actor.model.precision}",
                "buffer_dtype": "${actor.model.precision}",
            },
        },
    },
    "reward": {"use_reward_model": False},
    "critic": {"use_critic_model": False},
}


def diff(a: dict, b: dict, prefix: str = "") -> dict[str, tuple]:
    """Leaves that differ between two nested dicts: ``{dotted key: (a, b)}``."""
    out: dict[str, tuple] = {}
    for k in a.keys() | b.keys():
        x, y, key = a.get(k), b.get(k), f"{prefix}{k}"
        if isinstance(x, dict) and isinstance(y, dict):
            out.update(diff(x, y, key + "."))
        elif x != y:
            out[key] = (x, y)
    return out


def test_colocated_translation():
    assert rlinf_of("rlinf_colocated") == COLOCATED


def test_hybrid_translation_differs_from_colocated_only_in_placement_and_stages():
    # rlinf_hybrid.yaml: 2 GPUs; env on one, rollout on the other, actor on both
    assert diff(COLOCATED, rlinf_of("rlinf_hybrid")) == {
        "cluster.component_placement.actor,env,rollout": ("0-0", None),
        "cluster.component_placement.env": (None, "0-0"),
        "cluster.component_placement.rollout": (None, "1-1"),
        "cluster.component_placement.actor": (None, "0-1"),
        "rollout.pipeline_stage_num": (1, 2),
        "runner.logger.experiment_name": ("ebrl_rlinf_colocated", "ebrl_rlinf_hybrid"),
        "actor.micro_batch_size": (200, 100),  # the global batch over 2 actor processes
    }


def test_async_translation_is_decoupled_ppo_without_offload():
    assert diff(COLOCATED, rlinf_of("rlinf_async")) == {
        "algorithm.loss_type": ("actor_critic", "decoupled_actor_critic"),
        "algorithm.staleness_threshold": (None, 1),
        "algorithm.behave_weight_threshold": (None, 2.0),
        "env.train.enable_offload": (True, False),
        "rollout.enable_offload": (True, False),
        "rollout.recompute_logprobs": (None, False),
        "actor.enable_offload": (True, False),
        "runner.logger.experiment_name": ("ebrl_rlinf_colocated", "ebrl_rlinf_async"),
    }


@pytest.mark.parametrize(
    "mode, gpus, placement",
    [
        ("colocated", 8, {"actor,env,rollout": "0-7"}),
        ("hybrid", 8, {"env": "0-3", "rollout": "4-7", "actor": "0-7"}),
        ("async", 1, {"actor,env,rollout": "0-0"}),
        ("async", 8, {"env,rollout": "0-3", "actor": "4-7"}),
    ],
)
def test_placement_per_mode(mode, gpus, placement):
    rl = translate(ebrl_run(), mode=mode, gpus=gpus, staleness=2)
    assert rl["cluster"]["component_placement"] == placement
    ws = world_sizes(placement)
    assert rl["actor"]["micro_batch_size"] * ws["actor"] == rl["actor"]["global_batch_size"]


def test_model_env_and_overrides():
    rl = rlinf_of(
        "rlinf_colocated",
        ["chunk_size=5", "rollout_steps=80"],
        model="openvla_oft",
        overrides={"actor.model.model_path": "/ckpt", "runner.save_interval": 40},
    )
    assert "model/openvla_oft@actor.model" in rl["defaults"]
    assert rl["actor"]["model"] == {
        "num_action_chunks": 5,
        "add_value_head": True,
        "model_path": "/ckpt",
    }
    assert rl["runner"]["save_interval"] == 40
    assert rl["env"]["train"]["max_steps_per_rollout_epoch"] == 80
    assert env_steps_per_iteration(rl) == 16 * 80
    run = ebrl_run(extra=["simulator=synthetic"])
    path = {"actor.model.model_path": "/ckpt"}
    rl = translate(run, mode="colocated", env="libero_10", model="openvla_oft", overrides=path)
    assert rl["defaults"][:2] == ["env/libero_10@env.train", "model/openvla_oft@actor.model"]
    assert "init_params" not in rl["env"]["train"]
    with pytest.raises(TranslationError, match=r"scheduler\.model"):
        translate(run, mode="colocated", env="libero_10")


@pytest.mark.parametrize(
    "extra, kw, words",
    [
        ([], {"mode": "hybrid", "gpus": 1}, "hybrid needs >= 2 GPUs"),
        ([], {"mode": "async", "staleness": 3}, "staleness=3"),
        ([], {"mode": "pipelined"}, "mode='pipelined'"),
        (["simulator=synthetic"], {}, "not translated to RLinf"),
        (["policy=transformer_s"], {}, "RLinf has no counterpart"),
        (["policy.hidden=64"], {}, "fixed 3x256"),
        (["chunk_size=4", "rollout_steps=48"], {}, "one action per decision"),
        (["simulator.task=StackCube-v1"], {}, "obs_dim"),
        (["simulator.control_mode=pd_ee_delta_pose"], {}, "control_mode"),
        (["num_envs=15"], {"mode": "hybrid", "gpus": 2}, "num_envs=15"),
        (["algo.cfg.num_minibatches=7"], {}, "num_minibatches=7"),
        (["algo=grpo", "algo.cfg.group_size=2"], {}, "only algo=ppo"),
    ],
)
def test_what_rlinf_cannot_express_is_refused_by_name(extra, kw, words):
    with pytest.raises(TranslationError, match=words):
        translate(ebrl_run(extra=extra), **{"mode": "colocated", **kw})


def test_written_config_keeps_rlinfs_interpolations():
    rl = rlinf_of("rlinf_hybrid")
    text = OmegaConf.to_yaml(OmegaConf.create(rl))
    assert "${oc.env:EMBODIED_PATH}" in text and "${actor.model.precision}" in text
    assert OmegaConf.to_container(OmegaConf.create(text)) == rl


# --- RLinf as RLinf 0.3 runs it (issue 46) ----------------------------------------------------
VLAS = ("pi0", "gr00t", "openvla_oft")
#: the checkpoint folder each VLA's model_path resolves to under $EBRL_CHECKPOINTS
CHECKPOINTS = {
    "pi0": "RLinf-Pi0-LIBERO-Spatial-Object-Goal-SFT",
    "gr00t": "RLinf-Gr00t-SFT-Spatial",
    "openvla_oft": "Openvla-oft-SFT-libero10-trajall",
}


def full_size_job(policy: str, simulator: str, scheduler: str) -> dict:
    """One job of ``headline_full`` (8 H100s on one node, 256 envs, the suite's episode),
    resolved as its node composes it."""
    cfg = make_cfg(
        [
            *("+sweep=headline_full", f"policy={policy}", f"simulator={simulator}", "gpu=h100"),
            *(f"scheduler={scheduler}", "seed=0"),
        ]
    )
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture
def checkpoints(tmp_path, monkeypatch):
    """$EBRL_CHECKPOINTS: where the VLAs' model paths resolve."""
    monkeypatch.setenv("EBRL_CHECKPOINTS", str(tmp_path / "ckpt"))
    return tmp_path / "ckpt"


def translate_job(job: dict, **kw) -> dict:
    """Translate ``job`` with its own scheduler settings (as RLinfScheduler.translate does)."""
    s = job["scheduler"]
    args = {"mode": s["mode"], "gpus": s["gpus"], "nodes": s["nodes"], "model": s["model"]}
    args |= {"env": s["env"], "overrides": s["overrides"], "staleness": s.get("staleness", 1)}
    return translate(job, **(args | kw))


@pytest.mark.parametrize(
    "policy, compiled, graphs",
    [("pi0", True, False), ("gr00t", False, False), ("openvla_oft", False, False)],
)
def test_compile_and_cuda_graphs_only_where_rlinf_03_has_them(
    policy, compiled, graphs, checkpoints
):
    # RLinf 0.3: enable_torch_compile in mlp_policy, cnn_policy and openpi's classes only,
    # capture_cuda_graph in mlp_policy and cnn_policy only; the base class raises at start
    run = ebrl_run(extra=[f"policy={policy}", "chunk_size=${policy.action_chunk}"])
    rl = translate(run, mode="colocated", env="libero_spatial")
    assert rl["rollout"]["enable_torch_compile"] is compiled
    assert rl["rollout"]["enable_cuda_graph"] is graphs
    mlp = rlinf_of("rlinf_colocated")["rollout"]
    assert mlp["enable_torch_compile"] and mlp["enable_cuda_graph"]  # as maniskill_ppo_mlp.yaml
    with pytest.raises(TranslationError, match=r"enable_cuda_graph=true.*no such path"):
        translate(
            run,
            mode="colocated",
            env="libero_spatial",
            overrides={"rollout.enable_cuda_graph": True},
        )


@pytest.mark.parametrize("policy", VLAS)
def test_the_vlas_checkpoint_is_rlinfs_model_path(policy, checkpoints, monkeypatch):
    run = ebrl_run(extra=[f"policy={policy}", "chunk_size=${policy.action_chunk}"])
    rl = translate(run, mode="colocated", env="libero_spatial")
    assert rl["actor"]["model"]["model_path"] == str(checkpoints / CHECKPOINTS[policy])
    assert rl["rollout"]["model"]["model_path"] == "${actor.model.model_path}"  # the same
    monkeypatch.delenv("EBRL_CHECKPOINTS")  # no checkpoint: RLinf's placeholder would stay
    run = ebrl_run(extra=[f"policy={policy}", "chunk_size=${policy.action_chunk}"])
    with pytest.raises(TranslationError, match=r"placeholder path.*policy\.model_cfg\.model_path"):
        translate(run, mode="colocated", env="libero_spatial")


#: the largest micro-batch RLinf 0.3's own configs give these models (libero_*_ppo_openpi,
#: libero_*_ppo_gr00t: 128; libero_*_grpo_openvlaoft: 32)
RLINF_MICRO = {"pi0": 128, "gr00t": 128, "openvla_oft": 32}


@pytest.mark.parametrize("policy", VLAS)
@pytest.mark.parametrize("scheduler", ["rlinf_colocated", "rlinf_hybrid", "rlinf_async"])
def test_micro_batches_stay_within_rlinfs_own(policy, scheduler, checkpoints):
    job = full_size_job(policy, "libero_vla", scheduler)
    rl = translate_job(job, env="libero_spatial")
    actors = world_sizes(rl["cluster"]["component_placement"])["actor"]
    gb, mb = rl["actor"]["global_batch_size"], rl["actor"]["micro_batch_size"]
    assert gb % (mb * actors) == 0  # RLinf's FSDP validator
    assert mb <= RLINF_MICRO[policy]
    assert mb * 4 > min(RLINF_MICRO[policy], gb // actors)  # not a needlessly small divisor


def test_micro_batch_pinned_at_headline_full_size(checkpoints):
    # pi0: 256 envs x 44 decisions / 4 minibatches = 2,816 per minibatch over 8 actor processes:
    # 352 each, in micro-batches of 88 (the largest divisor of 352 up to RLinf's 128)
    rl = translate_job(full_size_job("pi0", "libero_vla", "rlinf_colocated"))
    assert (rl["actor"]["global_batch_size"], rl["actor"]["micro_batch_size"]) == (2816, 88)
    over = {"actor.micro_batch_size": 100}
    with pytest.raises(TranslationError, match=r"micro_batch_size=100 x 8 .* divides 352"):
        translate_job(full_size_job("pi0", "libero_vla", "rlinf_colocated"), overrides=over)


@pytest.mark.parametrize("scheduler", ["rlinf_colocated", "rlinf_hybrid", "rlinf_async"])
def test_the_cluster_follows_the_launchers_reservation(scheduler):
    from ebrl.runtime.slurm_cluster import describe_job, wants_cluster

    extra = ["launcher=slurm", "launcher.nodes=2", "launcher.gpus_per_node=4", "gpu=h100"]
    run = ebrl_run(scheduler, extra)
    sched = run["scheduler"]
    assert (sched["gpus"], sched["nodes"]) == (4, 2)
    rl = rlinf_of(scheduler, extra)
    assert rl["cluster"]["num_nodes"] == 2
    ranks = [r for spans in rl["cluster"]["component_placement"].values() for r in spans.split("-")]
    assert (min(map(int, ranks)), max(map(int, ranks))) == (0, 7)  # all 8 GPUs of the 2 nodes
    # a Slurm job of 2 nodes builds a Ray cluster over them for the scheduler (task 0 joins it)
    assert wants_cluster(sched)
    assert "starts a Ray cluster over its 2 nodes" in describe_job(2, 1, sched)


def test_several_nodes_need_the_jobs_ray_cluster(monkeypatch, tmp_path):
    import baselines.rlinf.launch as launch
    from ebrl.schedulers.base import RunContext
    from ebrl.stages.factory import StageFactory
    from ebrl.timeline import Timeline

    monkeypatch.setattr(launch, "require_rlinf", lambda repo: None)
    stand_in = [sys.executable, "-c", "print('rlinf stand-in')"]
    monkeypatch.setattr(launch, "command", lambda repo, mode, config: (stand_in, dict(os.environ)))
    monkeypatch.setattr(launch, "TensorBoardScalars", lambda folder: lambda: {0: {"time/step": 1}})
    cfg = make_cfg([*RUN, "scheduler=rlinf_colocated"], tmp_path)
    ctx = RunContext(StageFactory.from_config(cfg), 50, 2, Timeline())
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    alone = RLinfScheduler(mode="colocated", gpus=4, nodes=2, repo=str(tmp_path), poll_s=0.01)
    with pytest.raises(RuntimeError, match="nodes=2, but no Ray cluster spans them"):
        list(alone.run(ctx))
    assert not (tmp_path / "run" / "rlinf" / "launch.json").exists()  # refused before launching
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # what task 0 of a Slurm job has
    joined = RLinfScheduler(
        mode="colocated", gpus=4, nodes=2, repo=str(tmp_path), poll_s=0.01, ray_address="auto"
    )
    assert len(list(joined.run(ctx))) == 1
    written = OmegaConf.load(tmp_path / "run" / "rlinf" / "config" / "ebrl_rlinf_colocated.yaml")
    assert written.cluster.num_nodes == 2


@pytest.mark.parametrize("policy", VLAS)
def test_robocasa_pairs_are_refused_by_action_size(policy, checkpoints):
    # RLinf's RoboCasa env drives PandaOmron with 12-d actions; the VLAs as configured emit 7
    job = full_size_job(policy, "robocasa", "rlinf_colocated")
    with pytest.raises(
        TranslationError,
        match=r"emits 7-d actions, RLinf's env/robocasa\S* "
        r"takes 12-d",
    ):
        translate_job(job)


# --- RLinf's own checks (where rlinf and a checkout are present) ------------------------------
def _fake_cluster(gpus: int, nodes: int = 1):
    """``nodes`` nodes with ``gpus`` accelerators each, built from RLinf's own node types."""
    from rlinf.scheduler.cluster.node import NodeGroupInfo, NodeInfo
    from rlinf.scheduler.hardware import Accelerator, HardwareInfo, HardwareResource

    gpu = Accelerator.HW_TYPE
    group = NodeGroupInfo(
        label=NodeGroupInfo.DEFAULT_GROUP_LABEL,
        nodes=[
            NodeInfo(
                node_labels=[],
                node_rank=rank,
                ray_id=f"node{rank}",
                node_ip=f"127.0.0.{rank + 1}",
                num_cpus=16,
                python_interpreter_path=sys.executable,
                default_env_vars={},
                env_vars={},
                hardware_resources=[
                    HardwareResource(
                        type=gpu, infos=[HardwareInfo(type=gpu, model="NV_GPU:Fake")] * gpus
                    )
                ],
            )
            for rank in range(nodes)
        ],
    )

    class FakeCluster:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def get_node_group(self, label=None):
            return group

    return FakeCluster


MODES_GPUS = [("rlinf_colocated", 1), ("rlinf_hybrid", 2), ("rlinf_hybrid", 4), ("rlinf_async", 1)]


@pytest.mark.parametrize("scheduler, gpus", MODES_GPUS)
def test_rlinf_placement_parser_agrees(scheduler, gpus):
    pytest.importorskip("rlinf")
    from rlinf.utils.placement import HybridComponentPlacement

    rl = rlinf_of(scheduler, gpus=gpus)
    placement = HybridComponentPlacement(OmegaConf.create(rl), _fake_cluster(gpus)())
    expected = world_sizes(rl["cluster"]["component_placement"])
    assert {c: placement.get_world_size(c) for c in expected} == expected


@pytest.mark.parametrize("scheduler, gpus", MODES_GPUS)
def test_rlinf_composes_and_validates_it(scheduler, gpus, tmp_path, monkeypatch):
    repo = os.environ.get("RLINF_REPO")
    if not repo or not (Path(repo) / "examples/embodiment/config").is_dir():
        pytest.skip("RLINF_REPO does not point at an RLinf checkout")
    rlinf_config = pytest.importorskip("rlinf.config")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    rl = rlinf_of(scheduler, gpus=gpus)
    (tmp_path / "ebrl.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(rl)))
    monkeypatch.setenv("EMBODIED_PATH", str(Path(repo) / "examples/embodiment"))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.1"):
        cfg = compose(config_name="ebrl")
    GlobalHydra.instance().clear()
    monkeypatch.setattr(rlinf_config, "Cluster", _fake_cluster(gpus))
    # what RLinf's entry points run: validate_cfg (embodied, FSDP, batch checks), then resolve
    cfg = rlinf_config.validate_cfg(cfg)
    OmegaConf.to_container(cfg, resolve=True)
    assert cfg.env.train.init_params.id == "PushCube-v1"
    assert cfg.env.train.init_params.control_mode == "pd_joint_delta_pos"
    assert cfg.actor.model.model_type == "mlp_policy" and cfg.actor.model.obs_dim == 35


def _rlinf_checkout() -> str:
    """``$RLINF_REPO`` with rlinf importable; else the test is skipped."""
    repo = os.environ.get("RLINF_REPO")
    if not repo or not (Path(repo) / "examples/embodiment/config").is_dir():
        pytest.skip("RLINF_REPO does not point at an RLinf checkout")
    pytest.importorskip("rlinf")
    return repo


def _rlinf_validate(rl: dict, tmp_path: Path, monkeypatch, gpus: int, nodes: int = 1):
    """Compose ``rl`` with RLinf's own configs and run RLinf's validate_cfg on it (its entry
    points' first step) with ``nodes`` x ``gpus`` fake GPUs."""
    repo = _rlinf_checkout()
    rlinf_config = pytest.importorskip("rlinf.config")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    (tmp_path / "ebrl.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(rl)))
    monkeypatch.setenv("EMBODIED_PATH", str(Path(repo) / "examples/embodiment"))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.1"):
        cfg = compose(config_name="ebrl")
    GlobalHydra.instance().clear()
    monkeypatch.setattr(rlinf_config, "Cluster", _fake_cluster(gpus, nodes))
    cfg = rlinf_config.validate_cfg(cfg)
    OmegaConf.to_container(cfg, resolve=True)
    return cfg


def test_compile_and_graph_tables_are_rlinfs_own():
    """TORCH_COMPILE and CUDA_GRAPH are the model packages of RLinf's checkout whose classes
    define enable_torch_compile / capture_cuda_graph (the base class's raise)."""
    import ast

    from baselines.rlinf.translate import CUDA_GRAPH, TORCH_COMPILE

    root = Path(_rlinf_checkout()) / "rlinf" / "models" / "embodiment"
    found: dict[str, set[str]] = {"enable_torch_compile": set(), "capture_cuda_graph": set()}
    for path in root.rglob("*.py"):
        if path.parent == root:  # base_policy.py: the NotImplementedError defaults
            continue
        package = path.relative_to(root).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in found:
                found[node.name].add(package)
    assert found == {"enable_torch_compile": TORCH_COMPILE, "capture_cuda_graph": CUDA_GRAPH}


def test_micro_batch_table_is_rlinfs_own():
    """Each model type's micro-batch cap is one RLinf's own configs of that model use, and no
    more than their largest."""
    import yaml

    from baselines.rlinf.translate import MICRO_BATCH, MODEL_TYPES

    used: dict[str, set[int]] = {}
    for path in (Path(_rlinf_checkout()) / "examples/embodiment/config").glob("*.yaml"):
        cfg = yaml.safe_load(path.read_text()) or {}
        models = [d for d in cfg.get("defaults", []) if str(d).endswith("@actor.model")]
        micro = (cfg.get("actor") or {}).get("micro_batch_size")
        if len(models) == 1 and micro is not None:
            name = models[0].split("/", 1)[1].split("@")[0]
            used.setdefault(MODEL_TYPES[name], set()).add(int(micro))
    for model_type, cap in MICRO_BATCH.items():
        assert cap in used[model_type] and cap <= max(used[model_type]), (model_type, cap)


@pytest.mark.parametrize("policy", VLAS)
@pytest.mark.parametrize("scheduler", ["rlinf_colocated", "rlinf_hybrid", "rlinf_async"])
def test_rlinf_validates_the_full_size_pairs(policy, scheduler, checkpoints, tmp_path, monkeypatch):
    """Every policy x RLinf mode of the full-size sweeps on LIBERO (RoboCasa's pairs are refused
    by action size: test_robocasa_pairs_are_refused_by_action_size), through RLinf 0.3's own
    composition, placement parser and validator on 8 GPUs."""
    _rlinf_checkout()
    rl = translate_job(full_size_job(policy, "libero_vla", scheduler))
    cfg = _rlinf_validate(rl, tmp_path, monkeypatch, gpus=8)
    from rlinf.utils.placement import HybridComponentPlacement

    place = HybridComponentPlacement(cfg, _fake_cluster(8)())
    ws = world_sizes(rl["cluster"]["component_placement"])
    assert {c: place.get_world_size(c) for c in ws} == ws
    assert cfg.env.train.env_type == "libero" and cfg.env.train.task_suite_name == "libero_spatial"
    assert cfg.actor.model.model_path == str(checkpoints / CHECKPOINTS[policy])
    assert cfg.rollout.model.model_path == cfg.actor.model.model_path
    assert cfg.actor.global_batch_size % (cfg.actor.micro_batch_size * ws["actor"]) == 0


@pytest.mark.parametrize("scheduler", ["rlinf_colocated", "rlinf_hybrid", "rlinf_async"])
def test_rlinf_places_a_two_node_reservation(scheduler, tmp_path, monkeypatch):
    _rlinf_checkout()
    extra = ["launcher=slurm", "launcher.nodes=2", "launcher.gpus_per_node=4", "gpu=h100"]
    rl = rlinf_of(scheduler, extra)
    cfg = _rlinf_validate(rl, tmp_path, monkeypatch, gpus=4, nodes=2)
    assert cfg.cluster.num_nodes == 2


# --- the launcher -----------------------------------------------------------------------------
cannot_launch = pytest.mark.skipif(not missing(None), reason="this machine can run real RLinf")


@cannot_launch
@pytest.mark.parametrize("scheduler", ["rlinf_colocated", "rlinf_hybrid", "rlinf_async"])
def test_launchers_refuse_here_before_any_work(scheduler, tmp_path):
    from ebrl.train import train

    cfg = make_cfg([*RUN, f"scheduler={scheduler}"], tmp_path)
    with pytest.raises(ConfigError, match="real RLinf cannot run") as e:
        validate(cfg)
    assert all(need in str(e.value) for need in missing(None))  # what, and how to get it
    assert "scheduler=colocated" in str(e.value)
    if find_spec("rlinf") is None:
        assert INSTALL in str(e.value)
    with pytest.raises(ConfigError):
        train(cfg)
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow").exists()
    with pytest.raises(RuntimeError, match="real RLinf cannot run"):
        RLinfScheduler(mode=scheduler.removeprefix("rlinf_"))


def test_command_is_rlinfs_own_entry_point(tmp_path):
    cmd, env = command(tmp_path / "RLinf", "async", tmp_path / "cfg" / "ebrl_rlinf_async.yaml")
    assert cmd[1:] == [
        str(tmp_path / "RLinf" / ENTRY["async"]),
        "--config-path",
        str(tmp_path / "cfg"),
        "--config-name",
        "ebrl_rlinf_async",
    ]
    assert env["EMBODIED_PATH"] == str(tmp_path / "RLinf" / "examples" / "embodiment")
    assert ENTRY["colocated"] == ENTRY["hybrid"] == "examples/embodiment/train_embodied_agent.py"


def test_command_exports_rlinfs_rendering_env(tmp_path, monkeypatch):
    # as examples/embodiment/run_embodiment.sh: MUJOCO_GL=${MUJOCO_GL:-egl}, same for PyOpenGL
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    _, env = command(tmp_path, "colocated", tmp_path / "c.yaml")
    assert (env["MUJOCO_GL"], env["PYOPENGL_PLATFORM"]) == ("egl", "egl")
    monkeypatch.setenv("MUJOCO_GL", "osmesa")  # the caller's choice stays
    assert command(tmp_path, "colocated", tmp_path / "c.yaml")[1]["MUJOCO_GL"] == "osmesa"


def test_dry_run_translates_every_rlinf_job(checkpoints):
    """``python -m ebrl.launch --dry-run headline_full scheduler=rlinf_*``: each job is checked
    for the Slurm node it gets (not this CPU machine), translated, and its GPUs and micro-batch
    printed, or refused with the translation's reason."""
    from ebrl.launch.preview import describe
    from ebrl.launch.sweep import plan

    axes = ["scheduler=rlinf_colocated,rlinf_hybrid,rlinf_async", "policy=pi0"]
    p = plan("headline_full", [*axes, "simulator=libero_vla,robocasa", "gpu=h100", "seed=0"])
    jobs = {j.index: j for a in p.arrays for j in a.jobs}
    refused = dict((j.index, msg) for j, msg in p.errors)
    assert len(jobs) + len(refused) == 6
    libero = [i for i, j in jobs.items() if "simulator=libero_vla" in j.overrides]
    assert sorted(libero) == sorted(jobs) and len(libero) == 3  # every LIBERO job translated
    for i in libero:
        assert "1 node(s) x 8 GPU(s) = 8 GPUs" in p.roles[i]
        assert "micro-batch 88 (" in p.roles[i]  # 352 or 704 per actor process: 88 divides both
    # RoboCasa: refused before any work, with the reason: validate()'s contract check finds
    # no camera for the VLA first (the translation's action sizes: the test above)
    assert len(refused) == 3
    assert all("gives no camera images" in msg for msg in refused.values())
    text = describe(p, dry_run=True)
    assert "RLinf hybrid: 1 node(s) x 8 GPU(s)" in text and "torch.compile on" in text


@cannot_launch
def test_dry_run_of_a_local_rlinf_job_checks_this_machine():
    """A job on the local launcher runs here: the dry run refuses it as the run would, and
    leaves no check of another machine behind."""
    from baselines.rlinf.launch import ELSEWHERE
    from ebrl.launch.sweep import plan

    p = plan(
        "headline", ["scheduler=rlinf_colocated", "policy=mlp", "simulator=pushcube", "seed=0"]
    )
    assert p.n_jobs == 0 and len(p.errors) == 1
    assert "real RLinf cannot run on this machine" in p.errors[0][1]
    assert ELSEWHERE.get() is False


def test_rlinf_timers_become_ebrl_metrics():
    m = MetricMapper(env_steps=800)
    step = {
        "time/step": 2.0,
        "time/sync_weights": 0.1,
        "time/cal_adv_and_returns": 0.05,
        "time/env/env_interact_step": 0.7,
        "time/env/interact": 1.4,
        "time/rollout/predict": 0.3,
        "time/actor/run_training": 0.5,
        "env/success_once": 0.25,
        "rollout/data_staleness_0/ratio": 0.75,
        "rollout/data_staleness_1/ratio": 0.25,
    }
    first, second = m(step), m(step)
    assert first["time/sim/step_s"] == 0.7 and first["time/gen/step_s"] == 0.3
    assert first["time/train/step_s"] == pytest.approx(0.55)  # training + advantages
    assert first["time/sync/step_s"] == 0.1
    assert second["time/sim/busy_s"] == pytest.approx(1.4)
    assert second["env/steps_total"] == 1600 and second["time/wall_s"] == 4.0
    assert second["throughput/env_steps_per_s"] == pytest.approx(400.0)
    assert first["env/success_rate"] == 0.25
    assert first["pipeline/staleness_mean"] == 0.25 and first["pipeline/staleness_max"] == 1
    assert first["rlinf/time/env/interact"] == 1.4  # nothing is lost


class FakeProc:
    """Exits after ``polls`` polls with ``rc``."""

    def __init__(self, polls: int, rc: int = 0) -> None:
        self.polls, self.returncode = polls, None
        self.rc = rc

    def poll(self):
        self.polls -= 1
        if self.polls < 0:
            self.returncode = self.rc
        return self.returncode


def test_follow_yields_complete_steps_then_the_last(tmp_path):
    logged = [{0: {"time/step": 1.0}, 1: {"time/step": 1.0}}] * 2 + [
        {0: {"time/step": 1.0}, 1: {"time/step": 1.0}, 2: {"time/step": 1.0}}
    ]
    reads = iter(logged)
    reports = list(follow(FakeProc(2), lambda: next(reads), MetricMapper(10), 0.0, tmp_path))
    assert [r.iteration for r in reports] == [0, 1, 2]
    assert [r.metrics["env/steps_total"] for r in reports] == [10, 20, 30]


def test_follow_names_rlinf_when_it_fails(tmp_path):
    log = tmp_path / "rlinf.log"
    log.write_text("starting\nAssertionError: env.train.total_num_envs\n")
    with pytest.raises(
        StageError, match=r"(?s)stage .rlinf. failed: exit status 1.*total_num_envs"
    ):
        list(follow(FakeProc(0, rc=1), dict, MetricMapper(10), 0.0, log))


def test_rlinf_process_group_is_stopped(tmp_path):
    from baselines.rlinf.launch import stop

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    stop(proc, grace_s=5)
    assert proc.returncode is not None


def test_run_writes_rlinfs_config_launches_it_and_reports_its_steps(monkeypatch, tmp_path):
    """The wiring, with a stand-in for RLinf's process and its TensorBoard log."""
    import json

    import baselines.rlinf.launch as launch
    from ebrl.schedulers.base import RunContext
    from ebrl.stages.factory import StageFactory
    from ebrl.timeline import Timeline

    monkeypatch.setattr(launch, "require_rlinf", lambda repo: None)
    stand_in = [sys.executable, "-c", "print('rlinf stand-in')"]
    monkeypatch.setattr(launch, "command", lambda repo, mode, config: (stand_in, dict(os.environ)))
    steps = {0: {"time/step": 2.0, "time/env/env_interact_step": 0.5}, 1: {"time/step": 2.0}}
    monkeypatch.setattr(launch, "TensorBoardScalars", lambda folder: lambda: steps)
    cfg = make_cfg([*RUN, "scheduler=rlinf_hybrid"], tmp_path)
    ctx = RunContext(StageFactory.from_config(cfg), 50, 2, Timeline())
    sched = RLinfScheduler(mode="hybrid", gpus=2, repo=str(tmp_path), poll_s=0.01)

    reports = list(sched.run(ctx))
    assert [r.env_steps for r in reports] == [16 * 50] * 2
    assert reports[0].metrics["time/sim/busy_s"] == 0.5
    assert reports[1].metrics["throughput/env_steps_per_s"] == 16 * 50 * 2 / 4.0
    out = tmp_path / "run" / "rlinf"
    assert json.loads((out / "launch.json").read_text())["implementation"] == "rlinf"
    written = OmegaConf.load(out / "config" / "ebrl_rlinf_hybrid.yaml")
    assert written.rollout.pipeline_stage_num == 2
    assert written.runner.logger.log_path == str(out / "logs")
    assert "rlinf stand-in" in (out / "rlinf.log").read_text()
