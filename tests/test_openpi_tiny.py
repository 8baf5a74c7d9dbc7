"""The paper's pi0 through RLinf's registry (``rlinf.models.get_model``, model_type ``openpi``)
behind ebrl's RLinfPolicy, tiny, offline, on the CPU (ebrl.policies.openpi).

Skipped unless RLinf and rlinf-openpi are importable: ``make test-openpi`` builds .venv-openpi
and runs this file there.
Where they are missing (the main venv), one test checks that ``policy=pi0_tiny`` is refused
by name at validation.
"""

from __future__ import annotations

import csv
import importlib.util

import numpy as np
import pytest
import torch

from ebrl.policies.base import PolicySpec
from ebrl.types import Observation

from .conftest import TINY, make_cfg

HAVE_OPENPI = all(importlib.util.find_spec(m) is not None for m in ("rlinf", "openpi"))
needs_openpi = pytest.mark.skipif(
    not HAVE_OPENPI, reason="RLinf + rlinf-openpi: make test-openpi (.venv-openpi)"
)
HAVE_MANISKILL = importlib.util.find_spec("mani_skill") is not None

#: the counting simulator shaped for pi0_maniskill's transforms: 7 actions, a camera, 2 tasks
SIM = ["simulator=counting", "simulator.obs_dim=5", "simulator.action_dim=7"]
VLA = ["simulator.tasks=2", "simulator.camera_size=8"]


@pytest.mark.skipif(HAVE_OPENPI, reason="openpi is importable here")
def test_without_openpi_pi0_tiny_is_refused_by_name():
    from ebrl.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"policy=pi0_tiny needs .*'openpi'.*make test-openpi"):
        validate(make_cfg([*SIM, "policy=pi0_tiny"]))


def policy_node() -> dict:
    from omegaconf import OmegaConf

    cfg = make_cfg(["policy=pi0_tiny"])
    return OmegaConf.to_container(cfg.policy, resolve=True)


def build(spec: PolicySpec, **model_cfg):
    from ebrl.policies.rlinf_policy import RLinfPolicy

    node = policy_node()
    node["model_cfg"] = {**node["model_cfg"], **model_cfg}
    node.pop("_target_")
    torch.manual_seed(0)
    return RLinfPolicy(spec, **node)


def vla_batch(n: int = 4):
    from ebrl.envs.fake import CountingEnv

    envs = [CountingEnv(e, obs_dim=5, action_dim=7, tasks=2, camera_size=8) for e in range(n)]
    spec = PolicySpec(
        obs_dim=envs[0].spec.obs_dim, action_dim=7, chunk_size=2, layout=envs[0].spec.obs_layout()
    )
    obs = torch.from_numpy(np.stack([env.reset(0) for env in envs]))
    return spec, Observation(obs=obs, env_ids=torch.arange(n))


@needs_openpi
def test_rlinfs_pi0_acts_and_scores_each_chunk_with_its_chain():
    spec, batch = vla_batch()
    p = build(spec)
    assert type(p.model).__name__ == "OpenPi0ForRLActionPrediction"
    n_params = sum(q.numel() for q in p.model.parameters())
    assert n_params < 15e6, n_params  # the two 257,152-token embeddings are most of it
    # the image and the state are rebuilt from the observation; the denoising chain, its step
    # indices and the tokenised prompt are carried
    assert p.from_obs == {"observation/image": "main_images", "observation/state": "states"}
    assert {"chains", "denoise_inds", "tokenized_prompt", "tokenized_prompt_mask"} <= set(
        p.extra_shapes
    )
    chunk = p.act(batch)
    assert chunk.actions.shape == (4, 2, 7) and chunk.logprob.shape == (4,)
    # each row's prompt is its own env's instruction (tasks 0, 1, 0, 1)
    tokens = chunk.extras["tokenized_prompt"]
    assert torch.equal(tokens[0], tokens[2]) and not torch.equal(tokens[0], tokens[1])
    ev = p.evaluate(batch.obs, chunk.actions, chunk.extras)
    torch.testing.assert_close(ev.logprob, chunk.logprob)
    assert ev.logprob.requires_grad
    # a gradient step moves the model (the action expert and the VLM alike)
    loss = -(ev.logprob.mean() + ev.value.mean())
    loss.backward()
    grads = {n: q.grad for n, q in p.model.named_parameters() if q.grad is not None}
    assert any("gemma_expert" in n for n in grads) and any("language_model" in n for n in grads)


@needs_openpi
def test_full_sizes_are_pi0s_own_architecture():
    """``sizes: full`` (the GPU check's random-weight pi0) is openpi's gemma_2b and gemma_300m
    and PaliGemma-3B's SigLIP tower as openpi configures it: the real model's shapes."""
    import dataclasses
    import inspect

    import openpi.models.gemma as gemma
    import openpi.models_pytorch.gemma_pytorch as gemma_pytorch
    from transformers.models.auto import CONFIG_MAPPING

    from ebrl.policies import openpi

    for part, variant in (("vlm", "gemma_2b"), ("expert", "gemma_300m")):
        real = dataclasses.asdict(gemma.get_config(variant))
        assert {k: real[k] for k in openpi.FULL[part]} == openpi.FULL[part], variant
    # PaliGemma's own SigLIP, except its MLP width, which openpi's PyTorch model sets itself
    vision = CONFIG_MAPPING["paligemma"]().vision_config
    want = {k: v for k, v in openpi.FULL["vision"].items() if k != "intermediate_size"}
    assert {k: getattr(vision, k) for k in want} == want
    assert vision.image_size == 224
    source = inspect.getsource(gemma_pytorch.PaliGemmaWithExpertModel.__init__)
    width = openpi.FULL["vision"]["intermediate_size"]
    assert f"vision_config.intermediate_size = {width}" in source


@needs_openpi
def test_sizes_by_name_and_an_unknown_name_refused():
    spec, _ = vla_batch(2)
    p = build(spec, sizes="tiny")
    assert sum(q.numel() for q in p.model.parameters()) < 15e6
    with pytest.raises(
        ValueError, match=r"openpi sizes 'huge' unknown: name one of \['full', 'tiny'\]"
    ):
        build(spec, sizes="huge")


@needs_openpi
def test_its_values_are_rlinfs_at_rollout_and_at_the_trained_step():
    """RLinf's pi0 (non-joint log-probs) values a rollout by the mean of its value head over the
    denoising steps, and the learner by the value at the one step whose log-prob it trains: they
    agree with one denoising step, not in general (RLinf's design, kept)."""
    spec, batch = vla_batch()
    node = policy_node()["model_cfg"]["openpi"]
    for steps in (1, 2):
        p = build(spec, openpi={**node, "num_steps": steps})
        chunk = p.act(batch)
        ev = p.evaluate(batch.obs, chunk.actions, chunk.extras)
        torch.testing.assert_close(ev.logprob, chunk.logprob)
        same = torch.allclose(ev.value, chunk.value, atol=1e-5)
        assert same == (steps == 1), (steps, ev.value, chunk.value)


@needs_openpi
def test_a_checkpoint_in_rlinfs_format_builds_the_same_model(tmp_path):
    """RLinf's builder loads <model_path>/model_state_dict/full_weights.pt (its own checkpoint
    layout), then casts PaliGemma and the expert to bf16 (all but openpi's fp32 list) whatever
    the precision asked, as RLinf v0.3 always does; ebrl then runs the model in fp32."""
    from ebrl.policies.openpi import ASSET_ID, write_assets

    spec, batch = vla_batch()
    src = build(spec)
    with torch.no_grad():
        for q in src.model.parameters():
            q.add_(0.01 * torch.randn_like(q))
    ckpt = tmp_path / "ckpt"
    (ckpt / "model_state_dict").mkdir(parents=True)
    torch.save(src.model.state_dict(), ckpt / "model_state_dict" / "full_weights.pt")
    write_assets(ckpt, tmp_path / "home")
    assert (ckpt / ASSET_ID / "norm_stats.json").exists()
    dst = build(spec, model_path=str(ckpt))
    rounded = 0
    for n, q in dst.model.state_dict().items():
        want = src.model.state_dict()[n]
        if n.startswith("paligemma_with_expert.") and not torch.equal(q, want):
            want, rounded = want.to(torch.bfloat16).float(), rounded + 1  # RLinf's cast
        torch.testing.assert_close(q, want, rtol=0, atol=0, msg=n)
    assert rounded > 0
    # the same weights act alike (a fresh build from the state_dict: exact)
    fresh = build(spec)
    fresh.load_state_dict(src.state_dict())
    torch.manual_seed(1)
    a = src.act(batch, deterministic=True)
    torch.manual_seed(1)
    b = fresh.act(batch, deterministic=True)
    torch.testing.assert_close(a.actions, b.actions)


def run(scheduler: str, extra: list[str] = (), sim: list[str] = (*SIM, *VLA)) -> list[str]:
    more = ["scheduler.backend=inprocess", "scheduler.staleness=0"] if scheduler == "ebrl" else []
    return [
        *(o for o in TINY if not o.startswith(("policy.", "simulator=", "budget.iterations"))),
        *sim,
        "policy=pi0_tiny",
        "tracking.enabled=false",
        "budget.iterations=2",
        f"scheduler={scheduler}",
        *more,
        *extra,
    ]


@needs_openpi
@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_ppo_trains_rlinfs_pi0_under_sync_and_ebrl(scheduler, tmp_path):
    from ebrl.policies.rlinf_policy import RLinfPolicy
    from ebrl.stages.train import load_checkpoint
    from ebrl.train import train

    s = train(make_cfg(run(scheduler), tmp_path))
    assert s.status == "FINISHED" and s.iterations == 2
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert len(rows) == 2
    for r in rows:  # fresh data: the learner scores each decision as the generator did
        assert float(r["train/behave_weight_mean"]) == pytest.approx(1.0, abs=1e-3)
    # ebrl's checkpoint holds the model's own state_dict; a fresh pi0 loads it
    ckpt = load_checkpoint(next((tmp_path / "run").rglob("*.pt")))
    assert ckpt["version"] >= 1
    spec, _ = vla_batch()
    fresh = build(spec)
    assert isinstance(fresh, RLinfPolicy)
    key = next(k for k in ckpt["policy"] if k.endswith("action_out_proj.weight"))
    before = fresh.state_dict()[key].clone()
    fresh.load_state_dict(ckpt["policy"])
    assert not torch.equal(before, fresh.state_dict()[key])


@needs_openpi
def test_grpo_trains_rlinfs_pi0(tmp_path):
    from ebrl.train import train

    grpo = ["algo=grpo", "algo.cfg.group_size=2", "algo.cfg.kl_coef=0"]
    s = train(make_cfg(run("sync", grpo), tmp_path))
    assert s.status == "FINISHED" and s.iterations == 2


#: ManiSkill's PushCube as a VLA sees it (conf/simulator/pushcube_rgb.yaml), a small camera and
#: episodes of 8 steps: a segment (8 chunks of 2) holds whole episodes, which GRPO scores
PUSHCUBE_RGB = [
    "simulator=pushcube_rgb",
    "simulator.camera_size=32",
    "simulator.max_episode_steps=8",
]


@needs_openpi
@pytest.mark.skipif(not HAVE_MANISKILL, reason="ManiSkill: the sim extra")
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_pi0_trains_on_maniskill_camera_observations(algo, scheduler, tmp_path):
    """The robot's state and the rendered camera of PushCube, read by RLinf's pi0_maniskill
    transforms (image resized to 224, state padded to 32), its instruction tokenised; 2 updates
    of PPO and of GRPO under each scheduler, with the behaviour weight 1 on fresh data."""
    from ebrl.train import train

    grpo = ["algo=grpo", "algo.cfg.group_size=2", "algo.cfg.kl_coef=0"] if algo == "grpo" else []
    s = train(make_cfg(run(scheduler, grpo, sim=PUSHCUBE_RGB), tmp_path))
    assert s.status == "FINISHED" and s.iterations == 2
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert len(rows) == 2
    for r in rows:
        assert float(r["train/behave_weight_mean"]) == pytest.approx(1.0, abs=1e-3)
        assert np.isfinite(float(r["train/policy_loss"]))
        if algo == "grpo":
            assert float(r["train/grpo_groups"]) >= 1
