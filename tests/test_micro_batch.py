"""Micro-batches with gradient accumulation (``algo.cfg.micro_batch``): a learner cuts every
minibatch into forward passes of at most that many decisions, and the update is the whole
minibatch's, to float rounding.

On the counting env's segments (those of ``test_data_parallel``: odd minibatches, dropped
samples, actions masked after an episode's end, stale behaviour log-probs), PPO per action and per
chunk, PPO hitting its KL stop mid-update, and GRPO with its reference KL and minibatch advantage
normalisation end with the same weights and the same metrics at every micro-batch size as with
one pass; no forward pass of the policy sees more decisions than the micro-batch; a bad value is
refused by name.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from ebrl.algos.grpo import GRPO, GRPOConfig
from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.config import ConfigError, validate
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.policies.transformer import TransformerPolicy
from ebrl.stages.train import TrainStage

from .conftest import make_cfg
from .test_data_parallel import _collect

UPDATES = 3
SEED = 99

# name -> (algorithm, policy, config, segment recipe); decisions per segment = n_envs * t_len
CASES = {
    # 25 decisions, minibatches 9/8/8, value loss and entropy bonus, ~1/4 samples dropped
    "ppo_action": ("ppo", "mlp", dict(update_epochs=2, num_minibatches=3, target_kl=None,
                                      ent_coef=0.01),
                   dict(n_envs=5, t_len=5, k=3, noise=1.0)),
    # chunk-level ratios, no dual clip, advantages not normalised
    "ppo_chunk": ("ppo", "mlp", dict(update_epochs=2, num_minibatches=2, target_kl=None,
                                     ratio_level="chunk", dual_clip=None, norm_adv=False),
                  dict(n_envs=5, t_len=5, k=3, noise=1.0)),
    # the KL stop reached mid-update: it must be the whole minibatch's KL that stops it
    "ppo_kl_stop": ("ppo", "mlp", dict(update_epochs=4, num_minibatches=3, target_kl=2e-3,
                                       lr=3e-2),
                    dict(n_envs=5, t_len=5, k=3, noise=0.0)),
    # the transformer policy: attention over the tokens of each decision, no cross-row mixing
    "ppo_transformer": ("ppo", "transformer", dict(update_epochs=1, num_minibatches=2,
                                                   target_kl=None, ent_coef=0.01),
                        dict(n_envs=5, t_len=4, k=3, noise=1.0)),
    # groups of 2 envs, reference KL term, minibatch advantage normalisation, drops
    "grpo": ("grpo", "mlp", dict(group_size=2, update_epochs=2, num_minibatches=3, kl_coef=0.1,
                                 ent_coef=0.01, norm_adv=True, target_kl=None),
             dict(n_envs=6, t_len=8, k=2, noise=1.0, group=2)),
}  # fmt: skip

ALGOS = {"ppo": (PPO, PPOConfig), "grpo": (GRPO, GRPOConfig)}


def _policy(kind: str, k: int):
    torch.manual_seed(7)
    if kind == "mlp":
        return MLPPolicy(PolicySpec(4, 2, k), hidden=16, layers=1)
    return TransformerPolicy(PolicySpec(4, 2, k), d_model=16, layers=1, heads=2, obs_tokens=2)


@pytest.fixture(scope="module")
def segments() -> dict:
    out = {}
    for name, (_algo, kind, _cfg, seg_kw) in CASES.items():
        pol = _policy(kind, seg_kw["k"])
        out[name] = [_collect(pol, seed=u, **seg_kw) for u in range(UPDATES)]
    return out


def _train(name: str, segs: list, micro_batch: int | None, record: list | None = None) -> dict:
    """UPDATES updates through TrainStage with ``algo.cfg.micro_batch = micro_batch``; with
    ``record``, the batch size of every forward pass of the policy is appended to it."""
    algo_name, kind, cfg_kw, seg_kw = CASES[name]
    algo_cls, cfg_cls = ALGOS[algo_name]
    pol = _policy(kind, seg_kw["k"])
    algo = algo_cls(pol, cfg_cls(**cfg_kw, micro_batch=micro_batch))
    if record is not None:
        for method in ("dist", "value"):
            inner = getattr(pol, method)

            def spy(obs, *a, _inner=inner, **kw):
                record.append(int(obs.shape[0]))
                return _inner(obs, *a, **kw)

            setattr(pol, method, spy)
    stage = TrainStage(algo, device="cpu")
    torch.manual_seed(SEED)
    metrics = [stage.train(seg) for seg in copy.deepcopy(segs)]
    return {"weights": stage.weights()[1], "metrics": metrics}


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("micro_batch", [1, 2, 3, 5])
def test_micro_batches_make_the_whole_minibatch_update(segments, name, micro_batch):
    whole = _train(name, segments[name], None)
    micro = _train(name, segments[name], micro_batch)
    for key, w in whole["weights"].items():
        torch.testing.assert_close(
            micro["weights"][key], w, rtol=1e-5, atol=1e-6, msg=lambda m, k=key: f"{k}: {m}"
        )
    for u, (mm, mw) in enumerate(zip(micro["metrics"], whole["metrics"])):
        assert mm.keys() == mw.keys()
        assert mm["train/epochs_run"] == mw["train/epochs_run"], u
        bad = {k: (mm[k], mw[k]) for k in mw if not _close(mm[k], mw[k])}
        assert not bad, f"update {u}: {bad}"


def test_the_cases_train_and_stop(segments):
    """The comparison is not vacuous: the weights move, and the KL case stops mid-update."""
    start = _policy("mlp", 3).state_dict()
    whole = _train("ppo_action", segments["ppo_action"], None)
    assert any(not torch.equal(whole["weights"][k], v) for k, v in start.items())
    stopped = _train("ppo_kl_stop", segments["ppo_kl_stop"], None)["metrics"]
    assert any(0 < m["train/epochs_run"] < 4 for m in stopped)


@pytest.mark.parametrize("name", ["ppo_action", "grpo"])
def test_no_forward_pass_is_larger_than_the_micro_batch(segments, name):
    seen: list[int] = []
    _train(name, segments[name], 3, record=seen)
    assert seen and max(seen) == 3
    whole: list[int] = []
    _train(name, segments[name], None, record=whole)
    assert max(whole) > 3  # one pass per minibatch (and per segment, for the proximal terms)


def test_ranks_make_as_many_passes_as_the_largest_shard():
    """FSDP's passes are collectives: both ranks of a 9-decision minibatch (shards 5 and 4)
    make 3 passes of at most 2."""
    from ebrl.algos.loss import micro_batches

    idx = torch.arange(9)
    shards = torch.tensor_split(idx, 2)
    parts = [micro_batches(s, 9, 2, 2) for s in shards]
    assert [len(p) for p in parts] == [3, 3]
    assert max(len(x) for p in parts for x in p) == 2
    assert torch.equal(torch.cat([x for p in parts for x in p]), idx)
    assert micro_batches(idx, 9, 1, None) == (idx,)


@pytest.mark.parametrize("value", [0, -4, 2.5])
def test_a_bad_micro_batch_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"algo\.cfg\.micro_batch=.*integer >= 1"):
        PPOConfig(micro_batch=value)
    with pytest.raises(ValueError, match=r"algo\.cfg\.micro_batch"):
        GRPOConfig(micro_batch=value)


def test_the_config_key_composes_and_is_checked():
    cfg = make_cfg(["algo.cfg.micro_batch=64"])
    assert cfg.algo.cfg.micro_batch == 64
    assert make_cfg([]).algo.cfg.micro_batch is None
    with pytest.raises((ConfigError, ValueError), match=r"algo\.cfg\.micro_batch=0"):
        validate(make_cfg(["algo.cfg.micro_batch=0"]))
