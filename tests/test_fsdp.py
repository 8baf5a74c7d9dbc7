"""The sharded (FSDP) data-parallel learner: 2 gloo ranks, each holding half the policy, train
exactly like 1 rank.

On the counting env (the samples of ``test_data_parallel``), PPO and GRPO with the MLP, PPO with
the transformer policy: the weights after 5 updates agree between one process and 2 FSDP ranks
to float tolerance, with odd minibatches (some shards empty), dropped samples, masked actions,
gradient clipping by the global norm and the KL early stop; a rank holds about half the
parameter and optimiser bytes; checkpoints are full one-rank checkpoints that a one-rank
learner resumes, and an FSDP learner resumes a one-rank checkpoint; and EBRL on Ray with
``learner_strategy=fsdp`` runs the one-process run, its replicas acting with the weights the
two shards were gathered into (``slow``: ``make test-slow``).
"""

from __future__ import annotations

import copy
import math
import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ebrl.algos.grpo import GRPO, GRPOConfig
from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.policies.transformer import TransformerPolicy
from ebrl.runtime.dist import SOLO, DataParallel
from ebrl.runtime.dist_fsdp import held_bytes, shard_units
from ebrl.runtime.dist_group import destroy, free_port, init_group
from ebrl.schedulers.ebrl import EBRLScheduler
from ebrl.stages.train import TrainStage, load_checkpoint

from .conftest import TINY, make_cfg
from .test_data_parallel import TRAIN_SEED, UPDATES, _collect

WORLD = 2
RESUME_AT = 3  # the round trip: a checkpoint after this many updates, resumed to UPDATES

# name -> (algorithm, policy, its config, segment recipe); decisions = n_envs * t_len
CASES = {
    # 25 decisions in minibatches 9/8/8 (shards 5+4, 4+4), K=3 > some n_steps, ~1/4 dropped
    "ppo_mlp": ("ppo", "mlp", dict(update_epochs=2, num_minibatches=3, target_kl=None,
                                   ent_coef=0.01),
                dict(n_envs=5, t_len=5, k=3, noise=1.0)),
    # 5 decisions in minibatches 2/1/1/1: rank 1's shard of a 1-sample minibatch is empty
    "ppo_mlp_empty_shards": ("ppo", "mlp", dict(update_epochs=1, num_minibatches=4,
                                                target_kl=None),
                             dict(n_envs=5, t_len=1, k=3, noise=1.0)),
    # a large learning rate and a KL cutoff the update reaches mid-way
    "ppo_mlp_kl_stop": ("ppo", "mlp", dict(update_epochs=4, num_minibatches=3, target_kl=2e-3,
                                           lr=3e-2),
                        dict(n_envs=5, t_len=5, k=3, noise=0.0)),
    # groups of 2 envs, the reference KL term (the reference policy is sharded too)
    "grpo_mlp": ("grpo", "mlp", dict(group_size=2, update_epochs=1, num_minibatches=3,
                                     kl_coef=0.1, ent_coef=0.01, target_kl=None),
                 dict(n_envs=6, t_len=8, k=2, noise=1.0, group=2)),
    # the transformer: every encoder block a unit of its own, autoregressive chunks
    "ppo_transformer": ("ppo", "transformer", dict(update_epochs=1, num_minibatches=3,
                                                   target_kl=None),
                        dict(n_envs=5, t_len=5, k=3, noise=1.0)),
    # the transformer in micro-batches of 2: shards of 5 and 4 (3 passes each, one of them
    # empty on neither), gradients accumulated into the shards over the passes
    "ppo_transformer_micro": ("ppo", "transformer", dict(update_epochs=1, num_minibatches=3,
                                                         target_kl=None, micro_batch=2),
                              dict(n_envs=5, t_len=5, k=3, noise=1.0)),
}  # fmt: skip

ALGOS = {"ppo": (PPO, PPOConfig), "grpo": (GRPO, GRPOConfig)}


def _policy(kind: str, k: int) -> nn.Module:
    spec = PolicySpec(4, 2, k)
    if kind == "mlp":
        return MLPPolicy(spec, hidden=16, layers=1)
    return TransformerPolicy(
        spec, d_model=16, layers=2, heads=2, obs_tokens=2, critic_hidden=16, critic_layers=1
    )


def _inputs(name: str) -> dict:
    """The case's initial weights and its UPDATES segments (acted by the initial policy)."""
    _algo, kind, _cfg, seg_kw = CASES[name]
    torch.manual_seed(7)
    pol = _policy(kind, seg_kw["k"])
    segs = [_collect(pol, seed=u, **seg_kw) for u in range(UPDATES)]
    return {"state": copy.deepcopy(pol.state_dict()), "segments": segs}


def _stage(name: str, inputs: dict, dp: DataParallel, checkpoint: Path | None = None,
           resume: Path | None = None) -> TrainStage:  # fmt: skip
    """The case's learner as a learner rank builds it: the full policy and optimiser, a
    checkpoint loaded into them (as StageFactory.train does), then joined to ``dp``."""
    algo_name, kind, cfg_kw, seg_kw = CASES[name]
    algo_cls, cfg_cls = ALGOS[algo_name]
    pol = _policy(kind, seg_kw["k"])
    pol.load_state_dict(inputs["state"])
    algo = algo_cls(pol, cfg_cls(**cfg_kw))
    ckpt = load_checkpoint(resume) if resume is not None else None
    if ckpt is not None:
        algo.policy.set_weights(int(ckpt["version"]), ckpt["policy"])
        algo.optimizer.load_state_dict(ckpt["optimizer"])
    stage = TrainStage(algo, device="cpu", checkpoint=checkpoint)
    if dp is not SOLO:
        stage.join(dp)  # the learner worker's order: built and loaded, then sharded
    torch.manual_seed(TRAIN_SEED)
    if ckpt is not None:  # the minibatch stream continues where the checkpoint left it
        torch.set_rng_state(ckpt["torch_rng"])
        stage.trained_env_steps = int(ckpt["trained_env_steps"])
    return stage


def _train(name: str, inputs: dict, dp: DataParallel, updates: range = range(UPDATES),
           **kw) -> dict:  # fmt: skip
    """Updates ``updates`` of the case; the weights published after it and its metrics."""
    stage = _stage(name, inputs, dp, **kw)
    metrics = [stage.train(inputs["segments"][u]) for u in updates]
    out: dict = {"metrics": metrics, "version": stage.version}
    if dp.leader:
        out["version"], out["weights"] = stage.weights()
    else:
        with pytest.raises(RuntimeError, match="holds shards only"):
            stage.weights()
    algo = stage.algo
    out["held"] = held_bytes(algo.policy, algo.optimizer)
    out["units"] = [n for n, m in algo.policy.named_modules() if isinstance(m, FSDPModule)]
    out["dtensors"] = all(isinstance(p, DTensor) for p in algo.policy.parameters())
    ref = getattr(algo, "reference", None)
    out["ref_sharded"] = ref is not None and isinstance(ref, FSDPModule)
    return out


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    folder = Path(out)
    inputs = torch.load(folder / "inputs.pt", weights_only=False)
    dp = init_group(rank, world, ("127.0.0.1", port), "gloo", timeout_s=60, strategy="fsdp")
    try:
        res = {name: _train(name, inputs[name], dp) for name in CASES}
        # a checkpoint after RESUME_AT updates; every rank is given a file, the leader writes
        res["_ckpt"] = _train("ppo_mlp", inputs["ppo_mlp"], dp, range(RESUME_AT),
                              checkpoint=folder / f"fsdp_ckpt_rank{rank}.pt")  # fmt: skip
        # resume a one-rank learner's checkpoint (written by the test process) on 2 shards
        res["_resumed"] = _train("ppo_mlp", inputs["ppo_mlp"], dp, range(RESUME_AT, UPDATES),
                                 resume=folder / "solo_ckpt.pt")  # fmt: skip
        torch.save(res, folder / f"rank{rank}.pt")
    finally:
        destroy()


def _clip_norms(monkeypatch) -> list[float]:
    """Record the gradient norms the one-process update clips (it must clip, for the test of the
    global norm over shards to mean something)."""
    norms: list[float] = []
    clip = nn.utils.clip_grad_norm_

    def spy(params, max_norm, *a, **kw):
        norms.append(float(clip(params, max_norm, *a, **kw)))
        return torch.tensor(norms[-1])

    monkeypatch.setattr(nn.utils, "clip_grad_norm_", spy)
    return norms


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every case trained by 1 process (SOLO) and by 2 FSDP gloo ranks (spawned)."""
    out = tmp_path_factory.mktemp("fsdp")
    inputs = {name: _inputs(name) for name in CASES}
    torch.save(inputs, out / "inputs.pt")  # a file, not tensors shared through fds
    # the one-rank checkpoint the ranks resume from
    _train("ppo_mlp", inputs["ppo_mlp"], SOLO, range(RESUME_AT), checkpoint=out / "solo_ckpt.pt")
    port = free_port("127.0.0.1")
    # forkserver with torch preloaded (as test_data_parallel): the ranks start in seconds
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", __name__])
    mp.start_processes(
        _rank_main, args=(WORLD, port, str(out)), nprocs=WORLD, join=True,
        start_method="forkserver",
    )  # fmt: skip
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: tiny matrices, where more threads only contend
    try:
        with pytest.MonkeyPatch.context() as m:
            norms = _clip_norms(m)
            solo = {name: _train(name, inputs[name], SOLO) for name in CASES}
    finally:
        torch.set_num_threads(threads)
    return {"solo": solo, "ranks": ranks, "out": out, "inputs": inputs, "norms": norms}


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7)


def _same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, w in b.items():
        assert a[k].device.type == "cpu" and a[k].shape == w.shape
        torch.testing.assert_close(a[k], w, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("name", list(CASES))
def test_two_fsdp_ranks_train_like_one(runs, name):
    solo, (r0, r1) = runs["solo"][name], (r[name] for r in runs["ranks"])
    assert r0["version"] == r1["version"] == solo["version"] == UPDATES
    # the leader publishes the full weights (gathered from both shards): the one-rank learner's
    _same_weights(r0["weights"], solo["weights"])
    for u, (m0, m1, ms) in enumerate(zip(r0["metrics"], r1["metrics"], solo["metrics"])):
        assert m0 == m1 or all(_close(m0[k], m1[k]) for k in m0), u  # the same metrics
        assert m0.keys() == ms.keys()
        assert m0["train/epochs_run"] == ms["train/epochs_run"], u
        bad = {k: (m0[k], ms[k]) for k in ms if not _close(m0[k], ms[k])}
        assert not bad, f"update {u}: {bad}"
    # and it was sharded while it trained
    assert r0["dtensors"] and r1["dtensors"]
    if CASES[name][0] == "grpo":
        assert r0["ref_sharded"] and r1["ref_sharded"]


def test_micro_batched_fsdp_ranks_train_like_one_rank_in_one_pass(runs):
    """FSDP ranks accumulating micro-batches into their shards: the one-rank whole-minibatch
    update."""
    solo = runs["solo"]["ppo_transformer"]
    r0 = runs["ranks"][0]["ppo_transformer_micro"]  # the leader: the gathered full weights
    _same_weights(r0["weights"], solo["weights"])
    for m0, ms in zip(r0["metrics"], solo["metrics"]):
        bad = {k: (m0[k], ms[k]) for k in ms if not _close(m0[k], ms[k])}
        assert not bad


def test_the_update_clips_and_stops_early(runs):
    """The cases exercise the global-norm clip and the KL early stop at the same minibatch."""
    assert max(runs["norms"]) > PPOConfig().max_grad_norm
    solo = [m["train/epochs_run"] for m in runs["solo"]["ppo_mlp_kl_stop"]["metrics"]]
    assert any(0 < e < 4 for e in solo)  # the cutoff stopped some update part-way
    for r in runs["ranks"]:
        assert [m["train/epochs_run"] for m in r["ppo_mlp_kl_stop"]["metrics"]] == solo


@pytest.mark.parametrize("name", ["ppo_mlp", "ppo_transformer"])
def test_a_rank_holds_half_the_policy_and_optimiser(runs, name):
    full = runs["solo"][name]["held"]
    held = [r[name]["held"] for r in runs["ranks"]]
    # the shards partition the whole (dim 0 over the ranks, uneven by at most a row each)
    assert sum(h["params"] for h in held) == full["params"]
    # ...and the optimiser's moments with them; Adam's step counters (a scalar per parameter)
    # are on every rank
    assert full["optimizer"] <= sum(h["optimizer"] for h in held) <= 1.02 * full["optimizer"]
    for key in ("params", "optimizer"):
        for h in held:
            assert 0.4 * full[key] < h[key] < 0.6 * full[key], (key, h, full)


def test_units_follow_the_rule(runs):
    """The transformer's blocks are units of their own and the root takes the rest; the MLP
    is one unit."""
    assert runs["ranks"][0]["ppo_mlp"]["units"] == [""]
    assert runs["ranks"][0]["ppo_transformer"]["units"] == [
        "", "encoder.layers.0", "encoder.layers.1"
    ]  # fmt: skip
    tf = _policy("transformer", 3)
    assert shard_units(tf) == list(tf.encoder.layers)
    assert shard_units(_policy("mlp", 3)) == []


def test_the_checkpoint_is_a_one_rank_checkpoint(runs):
    """Written by the FSDP leader alone: the full policy and the full optimiser state, in the
    layout a one-rank learner writes, with the values a one-rank learner reaches."""
    out = runs["out"]
    assert not (out / "fsdp_ckpt_rank1.pt").exists()
    fsdp, solo = load_checkpoint(out / "fsdp_ckpt_rank0.pt"), load_checkpoint(out / "solo_ckpt.pt")
    assert fsdp.keys() == solo.keys() and fsdp["version"] == solo["version"] == RESUME_AT
    assert fsdp["trained_env_steps"] == solo["trained_env_steps"]
    _same_weights(fsdp["policy"], solo["policy"])
    assert fsdp["optimizer"]["param_groups"] == solo["optimizer"]["param_groups"]
    assert fsdp["optimizer"]["state"].keys() == solo["optimizer"]["state"].keys()
    for i, s in solo["optimizer"]["state"].items():
        f = fsdp["optimizer"]["state"][i]
        assert f.keys() == s.keys()
        for k, v in s.items():
            assert type(f[k]) is torch.Tensor and f[k].shape == v.shape  # no DTensor, whole
            torch.testing.assert_close(f[k], v, rtol=1e-5, atol=1e-7)
    assert torch.equal(fsdp["torch_rng"], solo["torch_rng"])


def test_resume_across_strategies(runs):
    """A one-rank learner resumes the FSDP checkpoint, FSDP ranks resume a one-rank one: both
    end where an uninterrupted one-rank run ends (the optimiser's moments and step counts and
    the minibatch stream carried over)."""
    inputs, out = runs["inputs"]["ppo_mlp"], runs["out"]
    whole = runs["solo"]["ppo_mlp"]["weights"]
    solo = _train("ppo_mlp", inputs, SOLO, range(RESUME_AT, UPDATES),
                  resume=out / "fsdp_ckpt_rank0.pt")  # fmt: skip
    _same_weights(solo["weights"], whole)
    _same_weights(runs["ranks"][0]["_resumed"]["weights"], whole)
    # a resume that dropped the optimiser state would not: the check has teeth
    ckpt = load_checkpoint(out / "solo_ckpt.pt")
    ckpt["optimizer"]["state"] = {}
    torch.save(ckpt, out / "no_moments.pt")
    fresh = _train("ppo_mlp", inputs, SOLO, range(RESUME_AT, UPDATES), resume=out / "no_moments.pt")
    assert any(not torch.allclose(fresh["weights"][k], w, atol=1e-5) for k, w in whole.items())


# --- configuration ------------------------------------------------------------------------------
def test_fsdp_needs_ray_and_two_ranks():
    with pytest.raises(ValueError, match=r"learner_strategy=fsdp .*learner_ranks>=2.*ddp"):
        EBRLScheduler(learner_strategy="fsdp")  # one rank: nothing to shard over
    with pytest.raises(ValueError, match=r"learner_strategy=fsdp .*backend=ray.*inprocess"):
        EBRLScheduler(backend="inprocess", learner_ranks=1, learner_strategy="fsdp")
    with pytest.raises(ValueError, match=r"learner_strategy='zero3': choose one of ddp, fsdp"):
        EBRLScheduler(learner_strategy="zero3")
    with pytest.raises(ValueError, match="nothing to shard"):
        DataParallel(0, 1, strategy="fsdp")
    EBRLScheduler(learner_ranks=2, learner_strategy="fsdp")  # accepted


def test_config_validation_refuses_fsdp_on_one_rank():
    """The key is in the scheduler's schema (derived from the dataclass): a bad setting fails
    when the config is validated, in the scheduler's words."""
    from ebrl.config import ConfigError, validate

    base = [*TINY, "scheduler=ebrl", "tracking.enabled=false"]
    with pytest.raises(ConfigError, match=r"learner_strategy=fsdp"):
        validate(make_cfg([*base, "scheduler.learner_strategy=fsdp"]))
    run = validate(make_cfg([*base, "scheduler.learner_strategy=fsdp", "scale.learner_ranks=2"]))
    assert run.scheduler.learner_strategy == "fsdp"


# --- the engine ---------------------------------------------------------------------------------
@pytest.mark.slow  # Ray and four worker processes: ~40-80 s on 2 cores
def test_ebrl_on_ray_with_an_fsdp_learner_runs_the_one_process_run():
    """2 FSDP learner ranks on Ray, lock step (k = 0: every decision of segment u is acted by
    version u): the returns, losses and KL of every update are the one-process run's, and the
    replica acted with the weights the leader gathered from the shards and published."""
    from .test_scale_out import LOCKSTEP, cfg8, run, same

    # a large step and two epochs: the weights move visibly within every update
    cfg = cfg8(["algo.cfg.lr=0.01", "algo.cfg.update_epochs=2"])
    one, _ = run(cfg, EBRLScheduler(backend="inprocess", sim_workers=1, **LOCKSTEP))
    sched = EBRLScheduler(
        backend="ray", sim_workers=1, learner_ranks=2, learner_strategy="fsdp", **LOCKSTEP
    )
    sharded, ctx = run(cfg, sched)
    same(one, sharded)
    assert len(sharded) == 3
    trained = {s.track for s in ctx.timeline.spans if s.stage == "train"}
    assert trained == {"learner", "learner1"}  # both ranks trained
    for r in sharded:
        assert r.metrics["train/approx_kl"] > 1e-4  # the update moved the weights...
        # ...and the next segment was acted by them: behaviour = proximal log-probs
        assert r.metrics["train/behave_weight_mean"] == pytest.approx(1.0, abs=1e-5)
