"""The paper's VLAs (conf/policy/{pi0,pi05,openvla_oft,gr00t,dreamzero}.yaml) as RLinf 0.3's own
models behind RLinfPolicy: each composes, validate() and the build name what is missing (a GPU,
the package, the checkpoint directory), and on a fake registry each is built with the RLinf
``actor.model`` config its yaml names. Where openpi is importable (.venv-openpi), pi0's and
pi0.5's configs go through ebrl.policies.openpi and RLinf's own openpi config builder, up to the
weights (no model is built).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from ebrl import external
from ebrl.config import ConfigError, VLAPolicyNode, validate
from ebrl.hardware import MachineFacts
from ebrl.policies.base import PolicySpec
from ebrl.policies.rlinf_policy import RLinfPolicy

from . import rlinf_fakes
from .conftest import make_cfg

#: policy -> (RLinf model_type, package, install's --model, checkpoint, chunk, precision)
PAPER = {
    "pi0": (
        "openpi",
        "openpi",
        "openpi",
        "RLinf/RLinf-Pi0-LIBERO-Spatial-Object-Goal-SFT",
        5,
        None,
    ),
    "pi05": ("openpi", "openpi", "openpi", "RLinf/RLinf-Pi05-LIBERO-SFT", 5, None),
    "openvla_oft": (
        "openvla_oft",
        "prismatic",
        "openvla-oft",
        "RLinf/Openvla-oft-SFT-libero10-trajall",
        8,
        "bf16",
    ),
    "gr00t": ("gr00t", "gr00t", "gr00t", "RLinf/RLinf-Gr00t-SFT-Spatial", 5, "bf16"),
    "dreamzero": ("dreamzero", "groot", "dreamzero", "GEAR-Dreams/DreamZero-DROID", 16, "bf16"),
}
BASE = {"mani_skill": "/site/mani_skill", "libero": "/site/libero", "rlinf": "/site/rlinf"}
LIBERO = ["simulator=libero", "simulator.obs_mode=state_rgb", "simulator.obs_layout=rlinf"]
LIBERO_SCENES = "/site/libero/libero/assets/scenes"
HAVE_OPENPI = all(importlib.util.find_spec(m) is not None for m in ("rlinf", "openpi"))


@pytest.fixture(autouse=True)
def _no_checkpoints_folder(monkeypatch):
    """Checkpoints not given unless a test gives them (conftest names /ckpt for the sweeps)."""
    monkeypatch.delenv("EBRL_CHECKPOINTS", raising=False)


def node_machine(policy: str, *, gpu: bool = True, package: bool = True, paths=None):
    pkg = PAPER[policy][1]
    return MachineFacts(
        where="the test node",
        gpus=("NVIDIA H100 80GB HBM3",) * 8 if gpu else (),
        cuda=gpu,
        cpus=96,
        find_package=MachineFacts.packages({**BASE, **({pkg: f"/site/{pkg}"} if package else {})}),
        path_exists=lambda p: p in {LIBERO_SCENES, *(paths or ["/ckpt/m", "/ckpt/tok"])},
        env={"LIBERO_CONFIG_PATH": "/libero"},
    )


def overrides(policy: str, *more: str) -> list[str]:
    """A GPU job of ``policy`` on LIBERO as the VLAs read it (cameras, RLinf's state);
    DreamZero's other checks are reached by clearing its ``untrainable`` (what refuses it
    first: :func:`test_dreamzero_is_refused_for_training`)."""
    out = [f"policy={policy}", "chunk_size=${policy.action_chunk}", "gpu=h100", *more, *LIBERO]
    if policy == "dreamzero":
        out += ["policy.model_cfg.tokenizer_path=/ckpt/tok", "policy.untrainable=''"]
    return out


def test_dreamzero_is_refused_for_training_before_anything_else():
    """RLinf 0.3's DreamZeroPolicy has no training forward: the job is refused at validation,
    on a node that has everything else, naming why and what to run instead."""
    job = ["policy=dreamzero", "chunk_size=16", "gpu=h100"]
    job += ["policy.model_cfg.model_path=/ckpt/m", "policy.model_cfg.tokenizer_path=/ckpt/tok"]
    with pytest.raises(ConfigError) as e:
        validate(make_cfg(job), machine=node_machine("dreamzero"))
    msg = str(e.value)
    assert "policy=dreamzero cannot be trained by ebrl" in msg
    assert "default_forward raises NotImplementedError" in msg and "policy=pi0,gr00t" in msg


def refused(policy: str, on: MachineFacts, *more: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate(make_cfg(overrides(policy, *more)), machine=on)
    return str(e.value)


@pytest.mark.parametrize("policy", sorted(PAPER))
def test_each_paper_policy_composes_as_rlinfs_model(policy):
    model_type, package, _, hub, chunk, precision = PAPER[policy]
    cfg = make_cfg(overrides(policy))
    from omegaconf import OmegaConf

    node = OmegaConf.to_object(cfg.policy)
    assert isinstance(node, VLAPolicyNode)
    assert cfg.policy._target_ == "ebrl.policies.rlinf_policy.RLinfPolicy"
    assert (node.model_type, node.package, node.checkpoint) == (model_type, package, hub)
    assert node.action_chunk == chunk and node.requires_gpu and node.image_size == 224
    assert node.model_cfg["precision"] == precision
    # without EBRL_CHECKPOINTS the checkpoint is not given
    assert cfg.policy.model_cfg.model_path is None


@pytest.mark.parametrize("policy", sorted(PAPER))
def test_each_paper_policy_validates_on_a_gpu_node_with_its_package_and_checkpoint(policy):
    ckpt = "policy.model_cfg.model_path=/ckpt/m"
    validate(make_cfg(overrides(policy, ckpt)), machine=node_machine(policy))


@pytest.mark.parametrize("policy", sorted(PAPER))
def test_each_paper_policy_names_what_is_missing(policy, monkeypatch):
    _, package, model, hub, _, _ = PAPER[policy]
    ckpt = "policy.model_cfg.model_path=/ckpt/m"
    # no GPU: gpu=cpu is refused by name
    with pytest.raises(ConfigError, match=rf"policy={policy} runs only on an NVIDIA GPU"):
        validate(
            make_cfg([o for o in overrides(policy) if not o.startswith("gpu=")]),  # gpu=cpu
            machine=node_machine(policy, gpu=False),
        )
    # no package: RLinf's installer for it
    msg = refused(policy, node_machine(policy, package=False), ckpt)
    assert f"'{package}'" in msg and f"install.sh embodied --model {model}" in msg, msg
    # no checkpoint: which one and how to get it, offline for the job
    msg = refused(policy, node_machine(policy))
    assert f"its checkpoint {hub} is not given" in msg, msg
    assert f"huggingface-cli download {hub} --local-dir" in msg and "EBRL_CHECKPOINTS" in msg
    msg = refused(policy, node_machine(policy), f"policy.model_cfg.model_path={hub}")
    assert "names the hub, not a local directory" in msg, msg
    msg = refused(policy, node_machine(policy, paths=["/ckpt/tok"]), ckpt)
    assert "model_path=/ckpt/m does not exist on the test node" in msg, msg
    # EBRL_CHECKPOINTS gives the directory by the checkpoint's name
    monkeypatch.setenv("EBRL_CHECKPOINTS", "/ckpt")
    tail = hub.rsplit("/", 1)[-1]
    assert make_cfg(overrides(policy)).policy.model_cfg.model_path == f"/ckpt/{tail}"
    validate(
        make_cfg(overrides(policy)),
        machine=node_machine(policy, paths=[f"/ckpt/{tail}", "/ckpt/tok"]),
    )


def test_dreamzero_needs_its_tokenizer_directory_too():
    on = node_machine("dreamzero")
    with pytest.raises(ConfigError, match=r"google/umt5-xxl is not given.*tokenizer_path"):
        validate(
            make_cfg(
                [
                    "policy=dreamzero",
                    "chunk_size=16",
                    "gpu=h100",
                    "policy.model_cfg.model_path=/ckpt/m",
                    "policy.untrainable=''",
                ]
            ),
            machine=on,
        )


def test_openvla_ofts_lora_adapters_are_a_local_directory_too():
    lora = ["policy.model_cfg.is_lora=true", "policy.model_cfg.lora_path=/ckpt/lora"]
    msg = refused(
        "openvla_oft", node_machine("openvla_oft"), "policy.model_cfg.model_path=/ckpt/m", *lora
    )
    assert "lora_path=/ckpt/lora does not exist" in msg, msg


class Recorder:
    """A registry that records RLinf's ``actor.model`` config and builds the fake VLA."""

    def __init__(self) -> None:
        self.cfg: Any = None

    def __call__(self, cfg):
        from omegaconf import OmegaConf

        self.cfg = OmegaConf.to_container(cfg, resolve=True)
        fake = OmegaConf.create({**self.cfg, "model_type": "fake_mlp"})
        return rlinf_fakes.get_model(fake)


@pytest.mark.parametrize("policy", sorted(PAPER))
def test_on_a_fake_registry_each_is_built_with_rlinfs_config(policy, monkeypatch):
    """RLinfPolicy checks the machine first (here a fake GPU node with the package and the
    checkpoint), then hands RLinf's registry the yaml's actor.model node with ebrl's dims."""
    from omegaconf import OmegaConf

    model_type, _, _, _, chunk, precision = PAPER[policy]
    cfg = make_cfg(overrides(policy, "policy.model_cfg.model_path=/ckpt/m"))
    node = OmegaConf.to_container(cfg.policy, resolve=True)
    node.pop("_target_")
    rec = Recorder()
    node["registry"] = rec
    spec = PolicySpec(obs_dim=4, action_dim=7, chunk_size=chunk)
    monkeypatch.setattr(external, "local_machine", lambda: node_machine(policy))
    p = RLinfPolicy(spec, **node)
    got = rec.cfg
    assert got["model_type"] == model_type and got["precision"] == precision
    assert got["num_action_chunks"] == chunk and got["action_dim"] == 7
    assert got["model_path"] == "/ckpt/m" and got["add_value_head"] is True
    assert got["is_lora"] is False
    if policy in ("pi0", "pi05", "openvla_oft"):
        assert got["lora_rank"] == 32  # RLinf's default rank, for is_lora=true
    if model_type == "openpi":
        want = {"pi0": "pi0_libero", "pi05": "pi05_libero"}[policy]
        assert got["openpi"]["config_name"] == want and got["sizes"] is None
        assert "action_horizon" not in got["openpi"]  # the checkpoint's own horizon
    if policy == "openvla_oft":
        assert got["image_size"] == [224, 224] and got["unnorm_key"] == "libero_10_no_noops"
    if policy == "gr00t":
        assert got["embodiment_tag"] == "libero_franka" and got["rl_head_config"]["add_value_head"]
    if policy == "dreamzero":
        assert got["tokenizer_path"] == "/ckpt/tok" and got["embodiment_tag"] == "libero_sim"
    want_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert next(p.model.parameters()).dtype == want_dtype
    # and the same build without the checkpoint never reaches the registry
    node["model_cfg"]["model_path"] = None
    rec.cfg = None
    with pytest.raises(external.UnavailableHere, match="is not given"):
        RLinfPolicy(spec, **node)
    assert rec.cfg is None


@pytest.mark.skipif(not HAVE_OPENPI, reason="RLinf + rlinf-openpi: make test-openpi (.venv-openpi)")
@pytest.mark.parametrize("policy", ["pi0", "pi05"])
def test_openpis_real_config_is_accepted_by_rlinfs_builder_and_nothing_is_written(
    policy, tmp_path, monkeypatch
):
    """pi0 / pi0.5 at their real sizes: ebrl.policies.openpi reads the checkpoint as it is
    (refusing one without its norm stats, writing nothing), and RLinf's own openpi config
    builder takes the node it hands RLinf's registry, up to loading weights."""
    import rlinf.models
    from omegaconf import OmegaConf
    from rlinf.models.embodiment.openpi.dataconfig import get_openpi_config
    from rlinf.models.embodiment.openpi.openpi_action_model import OpenPi0Config

    from ebrl.policies import openpi

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = make_cfg(overrides(policy, f"policy.model_cfg.model_path={ckpt}"))
    node = OmegaConf.to_container(cfg.policy.model_cfg, resolve=True)
    node.update(model_type="openpi", obs_dim=8, action_dim=7, num_action_chunks=5)
    seen: dict[str, Any] = {}
    monkeypatch.setattr(rlinf.models, "get_model", lambda c: seen.setdefault("cfg", c))
    with pytest.raises(FileNotFoundError, match="no norm stats"):
        openpi.get_model(OmegaConf.create(node))
    assert list(ckpt.iterdir()) == []  # a real checkpoint is never written to
    stats = ckpt / openpi.asset_id(node["openpi"]["config_name"], str(ckpt)) / "norm_stats.json"
    stats.parent.mkdir(parents=True)
    stats.write_text("{}")
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="PaliGemma tokenizer"):
        openpi.get_model(OmegaConf.create(node))
    tok = tmp_path / "cache" / openpi.TOKENIZER
    tok.parent.mkdir(parents=True)
    tok.write_bytes(b"")
    openpi.get_model(OmegaConf.create(node))
    got = seen["cfg"]
    assert got.openpi.config_name == {"pi0": "pi0_libero", "pi05": "pi05_libero"}[policy]
    assert stats.read_text() == "{}" and sorted(p.name for p in ckpt.iterdir()) == [
        "physical-intelligence"
    ]
    # RLinf's builder, as its get_model starts: openpi's config, then the node's overrides
    train = get_openpi_config(got.openpi.config_name, model_path=got.model_path)
    model = OpenPi0Config(**train.model.__dict__)
    for key, val in got.openpi.items():
        model.__dict__[key] = val
    assert model.action_chunk == 5 and model.action_env_dim == 7
    assert model.action_horizon == {"pi0": 50, "pi05": 10}[policy]
    assert model.pi05 == (policy == "pi05")
    assert (model.paligemma_variant, model.action_expert_variant) == ("gemma_2b", "gemma_300m")
    assert model.add_value_head and model.train_expert_only
