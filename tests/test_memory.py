"""Device memory per role (ebrl.memory): the activation model calibrated on the CPU against the
bytes autograd saves, the dry run's estimate per role against the GPU type's memory with the
micro-batch that makes the learner fit, and the learner's own sizing from its device's memory.
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch

from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.launch.cli import main
from ebrl.memory import (
    USABLE,
    Block,
    GiB,
    fit_micro_batch,
    measure_saved_bytes,
    transformer_policy_architecture,
)
from ebrl.policies import PolicySpec, TransformerPolicy
from ebrl.stages.train import TrainStage

from .test_data_parallel import _collect


def _per_decision(pol, spec, small=16, large=48) -> float:
    """Measured activation bytes per decision: the difference of two batch sizes (what does not
    grow with the batch cancels)."""

    def saved(b: int) -> int:
        torch.manual_seed(0)
        obs = torch.randn(b, spec.obs_dim)
        actions = torch.randn(b, spec.chunk_size, spec.action_dim)
        return measure_saved_bytes(pol, obs, actions)

    return (saved(large) - saved(small)) / (large - small)


@pytest.mark.parametrize("size", ["S", "M", "L"])
@pytest.mark.parametrize("decoding", ["autoregressive", "parallel"])
def test_the_activation_model_matches_the_saved_bytes_of_the_transformer(size, decoding):
    spec = PolicySpec(35, 8, 4)
    pol = TransformerPolicy(spec, size, decoding=decoding)
    measured = _per_decision(pol, spec)
    model = transformer_policy_architecture(pol)
    # within 10%, never below: a micro-batch sized by it does not overrun (measured: +2% at L
    # to +7% at S, the encoder's softmax statistics and biases the model leaves out or rounds up)
    assert measured <= model <= 1.10 * measured, (measured, model)


def test_the_measure_grows_with_the_batch_and_leaves_no_gradient():
    spec = PolicySpec(35, 8, 4)
    pol = TransformerPolicy(spec, "S")
    assert _per_decision(pol, spec) > 50_000  # 2 layers x 12 tokens x ~1k floats
    assert all(p.grad is None for p in pol.parameters())


def test_the_pi0_expert_is_gemma_300m():
    from ebrl.memory import ARCHITECTURES

    node = {"model_cfg": {"openpi": {"num_images_in_input": 2, "num_steps": 4}}}
    pi0 = ARCHITECTURES["pi0"](node)
    assert 0.28e9 < pi0.trainable < 0.33e9  # openpi's "300M action expert"
    assert pi0.passes == 4
    # per decision: the expert's 4 passes over 51 tokens attending to 563 keys, bf16
    assert 200 * 2**20 < pi0.activation_bytes() < 600 * 2**20


@pytest.mark.parametrize(
    "free, per, decisions, want",
    [(10_000, 100, 2816, 100), (10_000, 100, 50, 50), (50, 100, 2816, 1), (-5, 100, 7, 1)],
)
def test_fit_micro_batch(free, per, decisions, want):
    assert fit_micro_batch(free, per, decisions) == want


def test_block_counts():
    b = Block(2, 8, 32, 2, 1, 4, tokens=3, keys=5, gated=True, eager=True)
    assert b.params() == 2 * (8 * 4 * (2 * 2 + 2 * 1) + 3 * 8 * 32 + 2 * 8)
    per_token = (4 * 8 + 2 * 2 * 4 + 2 * 1 * 4 + 4 * 32) * 2 + 2 * 5 * (4 + 2)
    assert b.saved_bytes(2) == 2 * 3 * per_token


def _dry_run(*overrides: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        argv = ["--dry-run", "headline_full", "seed=0"]
        assert main([*argv, *overrides]) == 0
    return out.getvalue()


def test_the_dry_run_gives_each_roles_memory_for_pi0_on_an_h100():
    text = _dry_run(
        "policy=pi0",
        "simulator=libero_vla",
        "gpu=h100",
        "scheduler=colocated,ebrl",
        "scale.gen_gpus=0.5",
        "scale.learner_gpus=0.5",
    )
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("memory, ")]
    assert len(lines) == 3, text  # colocated: its learner; ebrl: its replica and its learner
    colocated, gen, learner = lines
    # 256 envs x 44 decisions / 4 minibatches: 2,816 decisions a minibatch, cut to fit; the 8
    # learner ranks of each (one per GPU, conf/experiment/cluster.yaml) take 352 each
    assert "learner rank (x8)" in colocated
    for line, per in ((colocated, 352), (learner, 352)):
        assert f"of {per} per minibatch" in line and "DOES NOT FIT" not in line
        micro = int(line.split("micro-batch ")[1].split()[0])
        assert 1 < micro < per
    assert "one h100, beside the generator's copy" in colocated
    assert "gen replica: weights 6.1 GiB" in gen and "0.5 of one h100" in gen
    # half the GPU for the learner: a smaller micro-batch than colocated's whole GPU
    m_col = int(colocated.split("micro-batch ")[1].split()[0])
    m_half = int(learner.split("micro-batch ")[1].split()[0])
    assert m_half < m_col
    # the total fits the usable memory: 0.9 of 79.6 GiB, halved
    total, usable = learner.split("total ")[1].split(" GiB")[0].split(" of ")
    assert float(total) <= float(usable) == pytest.approx(USABLE * 79.6 / 2, abs=0.1)


def test_the_dry_run_keeps_a_set_micro_batch_and_says_when_it_does_not_fit():
    text = _dry_run(
        "policy=pi0", "simulator=libero_vla", "gpu=h100", "scheduler=colocated",
        "algo.cfg.micro_batch=2816",
    )  # fmt: skip
    (line,) = [ln for ln in text.splitlines() if "memory, learner" in ln]
    # a Colocated rank (one per GPU) computes 2816 / 8 = 352 decisions of each minibatch
    assert "micro-batch 2816 (of 352" in line and "DOES NOT FIT" in line
    assert "learner_strategy=fsdp" in line


def test_a_learner_sizes_its_micro_batch_from_free_memory():
    """TrainStage.fit_micro_batch, the GPU learner's first-update sizing, given the free
    memory (the CPU here): the activations measured on two decisions against what is free less
    the gradients and moments still to come and the 10% kept back."""
    torch.manual_seed(3)
    spec = PolicySpec(4, 2, 3)
    pol = TransformerPolicy(spec, d_model=16, layers=1, heads=2, obs_tokens=2)
    seg = _collect(pol, n_envs=6, t_len=4, k=3, noise=0.0)
    stage = TrainStage(PPO(pol, PPOConfig(num_minibatches=2)), device="cpu")
    assert stage.algo.micro_batch is None  # on the CPU: the whole minibatch, one pass
    obs, actions = seg.obs.flatten(0, 1)[:2], seg.actions.flatten(0, 1)[:2]
    per = -(-measure_saved_bytes(pol, obs, actions) // 2)
    pending = 3 * sum(p.numel() * p.element_size() for p in pol.parameters())
    total = 1 * GiB
    kept = math.ceil((1 - USABLE) * total)
    assert stage.fit_micro_batch(seg, free=kept + pending + 5 * per, total=total) == 5
    assert stage.fit_micro_batch(seg, free=kept + pending + per // 2, total=total) == 1
    assert stage.fit_micro_batch(seg, free=100 * GiB, total=total) == 12  # 24 / 2 minibatches
