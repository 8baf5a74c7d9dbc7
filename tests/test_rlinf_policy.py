"""RLinf's model registry behind ebrl's Policy (ebrl.policies.rlinf_policy).

On a CPU fake with RLinf's model contract (tests/rlinf_fakes.py) everywhere; on RLinf's own
``mlp_policy`` where RLinf is installed (``make test-rlinf``: .venv-rlinf).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from ebrl.config import ConfigError, validate
from ebrl.envs.fake import CountingEnv
from ebrl.policies.base import PolicySpec
from ebrl.policies.rlinf_policy import RLinfPolicy
from ebrl.types import Observation

from .conftest import TINY, make_cfg
from .rlinf_fakes import FakeVLAModel

FAKE = "tests.rlinf_fakes.get_model"
SPEC = PolicySpec(obs_dim=4, action_dim=2, chunk_size=2)
HAVE_RLINF = importlib.util.find_spec("rlinf") is not None


def obs(b: int = 5) -> Observation:
    torch.manual_seed(1)
    return Observation(obs=torch.randn(b, 4), env_ids=torch.arange(b))


def test_act_and_evaluate_agree_on_the_chunks_log_prob_and_value():
    """PPO's first ratio is 1 only if the learner scores a chunk as the generator did."""
    p = RLinfPolicy(SPEC, model_type="fake_mlp", registry=FAKE)
    batch = obs()
    chunk = p.act(batch)
    assert chunk.actions.shape == (5, 2, 2) and chunk.logprob.shape == (5,)
    ev = p.evaluate(batch.obs, chunk.actions)
    torch.testing.assert_close(ev.logprob, chunk.logprob)
    torch.testing.assert_close(ev.value, chunk.value)
    assert ev.logprob.requires_grad and ev.entropy.shape == (5,)
    # deterministic: the mean
    a, b = p.act(batch, deterministic=True), p.act(batch, deterministic=True)
    torch.testing.assert_close(a.actions, b.actions)


def test_a_model_built_in_another_precision_keeps_it():
    p = RLinfPolicy(SPEC, model_type="fake_mlp", registry=FAKE, model_cfg={"precision": "bf16"})
    assert p.model.net.weight.dtype == torch.bfloat16
    chunk = p.act(obs())
    assert chunk.actions.dtype == chunk.logprob.dtype == torch.float32
    fp32 = RLinfPolicy(SPEC, model_type="fake_mlp", registry=FAKE)  # ebrl's default
    assert fp32.model.net.weight.dtype == torch.float32


def test_weights_round_trip_into_a_fresh_model():
    src = RLinfPolicy(SPEC, model_type="fake_mlp", registry=FAKE)
    with torch.no_grad():
        for q in src.parameters():
            q.add_(0.3)
    dst = RLinfPolicy(SPEC, model_type="fake_mlp", registry=FAKE)
    dst.set_weights(*src.get_weights())
    assert dst.version == src.version
    torch.testing.assert_close(
        dst.act(obs(), deterministic=True).actions, src.act(obs(), deterministic=True).actions
    )


def test_a_flow_models_chunk_is_scored_with_the_chain_that_sampled_it():
    """openpi's contract: the log-prob is the denoising chain's, so the chunk carries the chain
    and the step indices to the learner (its extras), and scoring needs them."""
    p = RLinfPolicy(SPEC, model_type="fake_flow", registry=FAKE)
    assert p.extra_shapes == {
        "chains": ((4, 4), torch.float32),  # S + 1 = 4 points of K * A = 4 dims
        "denoise_inds": ((3,), torch.int64),
    }
    # the rest of its forward_inputs come from the observation and the chunk
    assert p.from_obs == {"states": "states"} and p.from_chunk == ("action", "model_action")
    batch = obs()
    chunk = p.act(batch)
    assert set(chunk.extras) == {"chains", "denoise_inds"}
    assert chunk.extras["chains"].shape == (5, 4, 4)
    torch.testing.assert_close(chunk.extras["chains"][:, -1], chunk.actions.reshape(5, -1))
    ev = p.evaluate(batch.obs, chunk.actions, chunk.extras)
    torch.testing.assert_close(ev.logprob, chunk.logprob)
    torch.testing.assert_close(ev.value, chunk.value)
    assert ev.logprob.requires_grad
    # another row's chain scores another log-prob: the row order must be kept
    swapped = {k: v.roll(1, dims=0) for k, v in chunk.extras.items()}
    assert not torch.allclose(p.evaluate(batch.obs, chunk.actions, swapped).logprob, ev.logprob)
    with pytest.raises(ValueError, match=r"\['chains', 'denoise_inds'\] from the rollout"):
        p.evaluate(batch.obs, chunk.actions)
    # values: of an observation alone through the rollout call (no gradients), with the
    # chunk's extras through the learner's
    with torch.no_grad():
        torch.testing.assert_close(p.value(batch.obs), chunk.value)
    torch.testing.assert_close(p.value(batch.obs, chunk.extras), chunk.value)
    with pytest.raises(ValueError, match="a value with gradients needs the extras"):
        p.value(batch.obs)


def counting_vla_envs(n: int = 3) -> list[CountingEnv]:
    """CountingEnv with a state of 5, a one-hot over 2 tasks and a 4 x 4 image."""
    return [CountingEnv(e, obs_dim=5, tasks=2, camera_size=4) for e in range(n)]


def test_a_vla_is_shown_the_simulators_state_images_and_instructions_by_its_layout():
    envs = counting_vla_envs()
    layout = envs[0].spec.obs_layout()
    spec = PolicySpec(obs_dim=envs[0].spec.obs_dim, action_dim=2, chunk_size=2, layout=layout)
    p = RLinfPolicy(spec, model_type="fake_vla", registry=FAKE)
    assert p.model.velocity.in_features == 5 + 4 + 1  # the state's size, not the vector's
    # the camera is rebuilt from the observation under the model's name for it, not carried
    assert p.from_obs == {"states": "states", "observation/image": "main_images"}
    assert p.from_chunk == ("action", "model_action")
    assert set(p.extra_shapes) == {"chains", "denoise_inds", "tokenized_prompt"}
    batch = Observation(
        obs=torch.from_numpy(np.stack([env.reset(0) for env in envs])), env_ids=torch.arange(3)
    )
    FakeVLAModel.seen.clear()
    chunk = p.act(batch)
    # env e at step 0: pixel 16 e, instruction of task e % 2
    assert FakeVLAModel.seen == [
        (0.0, 0.0, 0, "count task 0"),
        (1.0, 0.0, 16, "count task 1"),
        (2.0, 0.0, 32, "count task 0"),
    ]
    ev = p.evaluate(batch.obs, chunk.actions, chunk.extras)
    torch.testing.assert_close(ev.logprob, chunk.logprob)
    torch.testing.assert_close(ev.value, chunk.value)  # the image and the prompt rebuilt
    with torch.no_grad():
        torch.testing.assert_close(p.value(batch.obs), chunk.value)


def test_a_models_one_entropy_per_decision_is_spread_over_the_chunk():
    """openpi's default_forward gives entropy [B, 1] (its mean over the chunk's dimensions):
    each dimension gets it, in the learner's distribution and its evaluation alike."""
    from ebrl.policies.rlinf_policy import ScoredChunk

    actions = torch.zeros(3, 2, 2)
    scored = ScoredChunk(actions, torch.zeros(3, 2, 2), torch.tensor([[1.0], [2.0], [3.0]]))
    assert scored.entropy().shape == (3, 2, 2)
    assert torch.equal(scored.entropy().sum(dim=(1, 2)), torch.tensor([4.0, 8.0, 12.0]))
    with pytest.raises(RuntimeError, match="one score per action dimension or one per decision"):
        ScoredChunk(actions, torch.zeros(3, 2, 2), torch.zeros(3, 3))


def test_models_it_cannot_train_are_refused_by_name():
    with pytest.raises(RuntimeError, match=r"forward_inputs\['prompt'\] is not a tensor"):
        RLinfPolicy(SPEC, model_type="list_inputs", registry=FAKE)
    with pytest.raises(RuntimeError, match=r"shape \(2, 1, 2\).*chunk_size"):
        RLinfPolicy(SPEC, model_type="one_action", registry=FAKE)
    with pytest.raises(RuntimeError, match="no model type 'nope'"):
        RLinfPolicy(SPEC, model_type="nope", registry=FAKE)
    if not HAVE_RLINF:
        with pytest.raises(RuntimeError, match=r"RLinf is not importable.*make test-rlinf"):
            RLinfPolicy(SPEC, model_type="mlp_policy")
        with pytest.raises(ConfigError, match=r"policy=rlinf_mlp needs.*'rlinf'.*test-rlinf"):
            validate(make_cfg(["policy=rlinf_mlp", "chunk_size=1"]))


RUN = [
    *(o for o in TINY if not o.startswith("policy.")),
    "policy=rlinf_mlp",
    "tracking.enabled=false",
]


def fake_run(scheduler: str, model: str = "fake_mlp") -> list[str]:
    extra = ["scheduler.backend=inprocess"] if scheduler == "ebrl" else []
    return [
        *RUN,
        f"policy.model_type={model}",
        f"policy.registry={FAKE}",
        "policy.package=''",
        f"scheduler={scheduler}",
        *extra,
    ]


@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_ppo_trains_an_rlinf_model_under_sync_and_ebrl(scheduler, tmp_path):
    from ebrl.stages.train import load_checkpoint
    from ebrl.train import train

    s = train(make_cfg(fake_run(scheduler), tmp_path))
    assert s.status == "FINISHED" and s.iterations == 3
    # the checkpoint holds the model's own state_dict; a fresh model loads it
    ckpt = load_checkpoint(next((tmp_path / "run").rglob("*.pt")))
    assert ckpt["version"] >= 1 and "model.net.weight" in ckpt["policy"]
    fresh = RLinfPolicy(SPEC, model_type="fake_mlp", registry=FAKE)
    before = fresh.model.net.weight.clone()
    fresh.load_state_dict(ckpt["policy"])
    assert not torch.equal(before, fresh.model.net.weight)


@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_ppo_scores_every_decision_with_its_own_chain(scheduler, tmp_path):
    """Through the whole engine (EBRL's: slots, messages, env workers, segments from several
    env workers) each decision reaches the learner with the chain that sampled it: with fresh
    data (k = 0) the learner's first scores equal the generator's, so every behaviour weight is
    1. A chain of another decision would score another log-prob."""
    import csv

    from ebrl.train import train

    fresh = ["scheduler.staleness=0"] if scheduler == "ebrl" else []
    s = train(make_cfg([*fake_run(scheduler, "fake_flow"), *fresh], tmp_path))
    assert s.status == "FINISHED" and s.iterations == 3
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert len(rows) == 3
    for r in rows:
        assert float(r["train/behave_weight_mean"]) == pytest.approx(1.0, abs=1e-4)
        assert float(r["train/behave_dropped_frac"]) == 0.0


@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_ppo_trains_a_vla_on_each_envs_images_and_instruction(scheduler, tmp_path):
    """A VLA-shaped observation (state, task one-hot, camera) through the whole engine: the
    model sees each env's own image and instruction at every step, and the learner scores each
    decision as the generator did (image rebuilt from the observation, prompt tokens and chain
    carried as extras)."""
    import csv

    from ebrl.train import train

    FakeVLAModel.seen.clear()
    vla = ["simulator.tasks=2", "simulator.camera_size=4"]
    fresh = ["scheduler.staleness=0"] if scheduler == "ebrl" else []
    s = train(make_cfg([*fake_run(scheduler, "fake_vla"), *vla, *fresh], tmp_path))
    assert s.status == "FINISHED" and s.iterations == 3
    for r in csv.DictReader((tmp_path / "run" / "metrics.csv").open()):
        assert float(r["train/behave_weight_mean"]) == pytest.approx(1.0, abs=1e-4)
    # rows of the run's envs (the profiler's and the build's random observations aside)
    shown = [r for r in FakeVLAModel.seen if r[0] in (0.0, 1.0, 2.0, 3.0)]
    assert len(shown) >= 4 * 8 * 3  # every decision of 3 updates of 4 envs x 8
    for e, t, pixel, instruction in shown:
        assert pixel == (16 * int(e) + int(t)) % 256
        assert instruction == f"count task {int(e) % 2}"


def test_grpo_trains_an_rlinf_model_and_its_reference_kl_is_refused_by_name(tmp_path):
    from ebrl.train import train

    grpo = ["algo=grpo", "algo.cfg.group_size=2"]
    s = train(make_cfg([*fake_run("sync"), *grpo], tmp_path))
    assert s.status == "FINISHED" and s.iterations == 3
    # a flow model's chains go through GRPO's mask of valid decisions
    s = train(make_cfg([*fake_run("ebrl", "fake_flow"), *grpo], tmp_path / "flow"))
    assert s.status == "FINISHED" and s.iterations == 3
    with pytest.raises(
        ConfigError, match=r"kl_coef=0.1 with policy=rlinf_mlp.*set algo.cfg.kl_coef=0"
    ):
        validate(make_cfg([*fake_run("sync"), *grpo, "algo.cfg.kl_coef=0.1"]))


needs_rlinf = pytest.mark.skipif(not HAVE_RLINF, reason="RLinf: make test-rlinf (.venv-rlinf)")


@needs_rlinf
def test_rlinfs_own_mlp_policy_acts_and_scores_alike():
    spec = PolicySpec(obs_dim=4, action_dim=2, chunk_size=1)
    p = RLinfPolicy(spec, model_type="mlp_policy", model_cfg={"add_value_head": True})
    assert type(p.model).__name__ == "MLPPolicy"
    batch = obs()
    chunk = p.act(batch)
    ev = p.evaluate(batch.obs, chunk.actions)
    torch.testing.assert_close(ev.logprob, chunk.logprob)
    torch.testing.assert_close(ev.value, chunk.value)


@needs_rlinf
@pytest.mark.parametrize("scheduler", ["sync", "ebrl"])
def test_ppo_trains_rlinfs_own_mlp_policy(scheduler, tmp_path):
    from ebrl.train import train

    extra = ["scheduler.backend=inprocess"] if scheduler == "ebrl" else []
    cfg = make_cfg(
        [
            *[o for o in RUN if o != "chunk_size=2"],
            "chunk_size=1",
            f"scheduler={scheduler}",
            *extra,
        ],
        tmp_path,
    )
    s = train(cfg)
    assert s.status == "FINISHED" and s.iterations == 3
