"""Data-parallel learner ranks (ebrl.runtime.dist): 2 gloo ranks train exactly like 1 rank.

The acceptance check: on the deterministic counting env, the weights after 5 updates agree
between 1 and 2 learner ranks to float tolerance (the same samples, the gradient combined across
ranks), with odd minibatches (unequal shards, some empty), samples dropped by the behaviour
weight threshold and actions masked after episode ends (n_steps < K), so the whole-minibatch
normalisers are exercised; the KL early stop happens at the same minibatch on every rank; and the
one-process path (SOLO) is bit for bit the update as it was before data parallelism.
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

from ebrl.algos import loss as loss_mod
from ebrl.algos.grpo import GRPO, GRPOConfig
from ebrl.algos.loss import decoupled_ppo_loss, loss_normalisers
from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.envs import CountingEnv, EnvGroup
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.runtime.dist import SOLO, DataParallel
from ebrl.runtime.dist_group import destroy, exchange, free_port, init_group, resolve_backend
from ebrl.stages.train import TrainStage, load_checkpoint
from ebrl.types import Observation, Segment, Transition

WORLD = 2
UPDATES = 5
TRAIN_SEED = 1234  # the learner's torch seed (minibatch shuffles): alike on every rank

# name -> (algorithm, its config, segment recipe). Decisions per segment: n_envs * t_len.
CASES = {
    # 25 decisions in minibatches of 9/8/8 (shards 5+4, 4+4); K=3 > some n_steps; ~1/4 dropped
    "ppo_action": ("ppo", dict(update_epochs=2, num_minibatches=3, target_kl=None, ent_coef=0.01),
                   dict(n_envs=5, t_len=5, k=3, noise=1.0)),
    # chunk-level ratios, minibatches 13/12, no dual clip, no advantage normalisation
    "ppo_chunk": ("ppo", dict(update_epochs=2, num_minibatches=2, target_kl=None,
                              ratio_level="chunk", dual_clip=None, norm_adv=False),
                  dict(n_envs=5, t_len=5, k=3, noise=1.0)),
    # 5 decisions in minibatches 2/1/1/1: rank 1's shard of a 1-sample minibatch is empty
    "ppo_empty_shards": ("ppo", dict(update_epochs=2, num_minibatches=4, target_kl=None),
                         dict(n_envs=5, t_len=1, k=3, noise=1.0)),
    # a large learning rate and a KL cutoff the update reaches mid-way
    "ppo_kl_stop": ("ppo", dict(update_epochs=4, num_minibatches=3, target_kl=2e-3, lr=3e-2),
                    dict(n_envs=5, t_len=5, k=3, noise=0.0)),
    # groups of 2 envs, reference KL term, minibatch advantage normalisation, drops
    "grpo": ("grpo", dict(group_size=2, update_epochs=2, num_minibatches=3, kl_coef=0.1,
                          ent_coef=0.01, norm_adv=True, target_kl=None),
             dict(n_envs=6, t_len=8, k=2, noise=1.0, group=2)),
    # ppo_action / grpo in micro-batches of 2 (shards of 5 and 4: 3 passes on each rank)
    "ppo_micro": ("ppo", dict(update_epochs=2, num_minibatches=3, target_kl=None, ent_coef=0.01,
                              micro_batch=2),
                  dict(n_envs=5, t_len=5, k=3, noise=1.0)),
    "grpo_micro": ("grpo", dict(group_size=2, update_epochs=2, num_minibatches=3, kl_coef=0.1,
                                ent_coef=0.01, norm_adv=True, target_kl=None, micro_batch=2),
                   dict(n_envs=6, t_len=8, k=2, noise=1.0, group=2)),
}  # fmt: skip
#: a micro-batched case -> the case it is in one pass per minibatch
WHOLE = {"ppo_micro": "ppo_action", "grpo_micro": "grpo"}

SPEC = {"ppo": (PPO, PPOConfig), "grpo": (GRPO, GRPOConfig)}


def _collect(pol: MLPPolicy, *, n_envs, t_len, k, noise, group=1, seed=0) -> Segment:
    """A segment of CountingEnvs (lengths 3 + id % 4) acted in by ``pol``; behaviour log-probs
    perturbed by ``noise`` standard normals (seeded), so some behaviour weights exceed 2."""
    envs = [CountingEnv(i, obs_dim=4, action_dim=2) for i in range(n_envs)]
    g = EnvGroup(envs, list(range(n_envs)), seed=seed, reset_group_size=group)
    obs, ids, rows = g.reset(), torch.arange(n_envs), []
    for _ in range(t_len):
        o = Observation(obs=obs, env_ids=ids)
        c = pol.act(o)
        rows.append(Transition.join(o, c, g.step_chunk(c)))
        obs = g.observe()
    seg = Segment.stack(rows)
    gen = torch.Generator().manual_seed(seed)
    seg.logprob.add_(noise * torch.randn(seg.logprob.shape, generator=gen))
    return seg


def _inputs(name: str) -> dict:
    """The case's initial weights and its UPDATES segments (acted by the initial policy, so
    later updates train on stale data too)."""
    _algo, _cfg, seg_kw = CASES[name]
    torch.manual_seed(7)
    pol = MLPPolicy(PolicySpec(4, 2, seg_kw["k"]), hidden=16, layers=1)
    segs = [_collect(pol, seed=u, **seg_kw) for u in range(UPDATES)]
    return {"state": copy.deepcopy(pol.state_dict()), "segments": segs}


def _train(name: str, inputs: dict, dp: DataParallel, checkpoint: Path | None = None) -> dict:
    """UPDATES updates of the case's learner through TrainStage; final weights and metrics."""
    algo_name, cfg_kw, seg_kw = CASES[name]
    algo_cls, cfg_cls = SPEC[algo_name]
    pol = MLPPolicy(PolicySpec(4, 2, seg_kw["k"]), hidden=16, layers=1)
    pol.load_state_dict(inputs["state"])
    algo = algo_cls(pol, cfg_cls(**cfg_kw))
    stage = TrainStage(algo, dp=dp, device="cpu", checkpoint=checkpoint)
    torch.manual_seed(TRAIN_SEED)
    metrics = [stage.train(seg) for seg in inputs["segments"]]
    version, weights = stage.weights()
    return {"weights": weights, "metrics": metrics, "version": version}


def _grad_sum_check(dp: DataParallel) -> dict:
    """sum_grads on hand-made gradients: rank r's is r + 1; None on rank 0 only / everywhere."""
    a, b, c = (nn.Parameter(torch.zeros(3)) for _ in range(3))
    a.grad = torch.full((3,), float(dp.rank + 1))
    if dp.rank > 0:
        b.grad = torch.ones(3)
    dp.sum_grads([a, b, c])
    return {"a": a.grad.clone(), "b": b.grad.clone(), "c": c.grad}


def _rng_mismatch(dp: DataParallel, inputs: dict) -> str:
    """Ranks whose torch random states differ are stopped, all of them, at the first shuffle."""
    pol = MLPPolicy(PolicySpec(4, 2, 3), hidden=16, layers=1)
    algo = PPO(pol, PPOConfig(update_epochs=1, num_minibatches=2), dp=dp)
    torch.manual_seed(TRAIN_SEED + dp.rank)
    try:
        algo.update(inputs["segments"][0])
    except RuntimeError as e:
        return str(e)
    return "no error"


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    inputs = torch.load(Path(out) / "inputs.pt", weights_only=False)
    dp = init_group(rank, world, ("127.0.0.1", port), "gloo", timeout_s=60)
    try:
        res = {name: _train(name, inputs[name], dp) for name in CASES}
        ckpt = Path(out) / f"ckpt_rank{rank}.pt"
        res["_ckpt"] = _train("ppo_action", inputs["ppo_action"], dp, checkpoint=ckpt)
        res["_grads"] = _grad_sum_check(dp)
        res["_rng"] = _rng_mismatch(dp, inputs["ppo_action"])
        res["_min"] = dp.min_int(5 + 3 * dp.rank)  # the micro-batch the ranks agree on
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        destroy()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every case trained by 1 rank (this process, SOLO) and by 2 gloo ranks (spawned)."""
    out = tmp_path_factory.mktemp("dp")
    inputs = {name: _inputs(name) for name in CASES}
    torch.save(inputs, out / "inputs.pt")  # a file, not tensors shared through fds
    port = free_port("127.0.0.1")
    # forkserver with torch preloaded: the ranks start in seconds, not one torch import each
    # (spawn), and never inherit this process's OpenMP state (fork)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", __name__])
    mp.start_processes(
        _rank_main,
        args=(WORLD, port, str(out)),
        nprocs=WORLD,
        join=True,
        start_method="forkserver",
    )
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    solo = {name: _train(name, inputs[name], SOLO) for name in CASES}
    return {"solo": solo, "ranks": ranks, "out": out, "inputs": inputs}


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7)


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_train_like_one(runs, name):
    solo, (r0, r1) = runs["solo"][name], (r[name] for r in runs["ranks"])
    # the ranks hold the very same learner and report the very same metrics...
    _same(r0, r1)
    # ...and it is the one-rank learner, to float tolerance (measured: within 1e-7; a naive
    # average of per-shard means is off by 1e-4 to 1e-2)
    assert r0["version"] == solo["version"] == UPDATES
    for k, w in solo["weights"].items():
        assert w.device.type == "cpu"
        torch.testing.assert_close(
            r0["weights"][k], w, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}"
        )
    for u, (m2, m1) in enumerate(zip(r0["metrics"], solo["metrics"])):
        assert m2.keys() == m1.keys()
        assert m2["train/epochs_run"] == m1["train/epochs_run"], u
        bad = {k: (m2[k], m1[k]) for k in m1 if not _close(m2[k], m1[k])}
        assert not bad, f"update {u}: {bad}"


def test_cases_exercise_the_global_normalisers(runs):
    """The workload really drops samples, masks actions and weights shards unequally."""
    m = runs["solo"]["ppo_action"]["metrics"]
    assert all(0.05 < x["train/behave_dropped_frac"] < 0.6 for x in m)
    seg = runs["inputs"]["ppo_action"]["segments"][0]
    assert bool((seg.n_steps < 3).any())  # actions after an episode's end are masked
    g = runs["solo"]["grpo"]["metrics"]
    assert all(x["train/grpo_groups"] >= 2 and x["train/ref_kl"] > 0 for x in g[1:])


def test_kl_early_stop_at_the_same_minibatch(runs):
    solo = [m["train/epochs_run"] for m in runs["solo"]["ppo_kl_stop"]["metrics"]]
    per_rank = [[m["train/epochs_run"] for m in r["ppo_kl_stop"]["metrics"]] for r in runs["ranks"]]
    assert per_rank[0] == per_rank[1] == solo
    assert any(0 < e < 4 for e in solo)  # the cutoff stopped some update part-way
    kl = [[m["train/approx_kl"] for m in r["ppo_kl_stop"]["metrics"]] for r in runs["ranks"]]
    assert kl[0] == kl[1]  # the global KL: the same number on every rank


def test_only_the_leader_checkpoints(runs):
    out = runs["out"]
    assert not (out / "ckpt_rank1.pt").exists()
    ckpt = load_checkpoint(out / "ckpt_rank0.pt")
    assert ckpt is not None and ckpt["version"] == UPDATES
    for k, w in runs["ranks"][0]["_ckpt"]["weights"].items():
        assert torch.equal(ckpt["policy"][k], w)


def test_sum_grads_one_buffer_and_missing_grads(runs):
    for r in runs["ranks"]:
        g = r["_grads"]
        assert torch.equal(g["a"], torch.full((3,), 3.0))  # 1 + 2
        assert torch.equal(g["b"], torch.ones(3))  # rank 0 had none: zeros + ones
        assert g["c"] is None  # nobody had one: stays None, the optimiser skips it


def test_ranks_agree_on_the_smallest_micro_batch(runs):
    assert [r["_min"] for r in runs["ranks"]] == [5, 5]


def test_ranks_with_different_random_states_are_stopped(runs):
    for r in runs["ranks"]:
        assert "disagree on the minibatch permutation" in r["_rng"]


# --- the one-process path ----------------------------------------------------------------------
def _sgd_update_before_dp(
    policy, optimizer, batch, cfg, *, target_kl, vf_coef, extra_loss=None, dp=SOLO
):
    """ebrl.algos.loss.sgd_update as it was before data parallelism (verbatim but for ``dp`` and
    the extra loss's third argument): the SOLO path must reproduce it bit for bit."""
    assert dp is SOLO
    sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clipfrac": 0.0, "extra": 0.0}
    n_applied = 0
    approx_kl = 0.0
    n = len(batch)
    params = [p for p in policy.parameters() if p.requires_grad]
    stop = False
    for _ in range(cfg.update_epochs if n else 0):
        perm = torch.randperm(n, device=batch.obs.device)  # [B]
        for idx in torch.tensor_split(perm, cfg.num_minibatches):
            if idx.numel() == 0:
                continue
            d = policy.dist(batch.obs[idx], batch.actions[idx])  # loc/scale [b, K, A]
            logprob = d.log_prob(batch.actions[idx]).sum(dim=2)  # [b, K]
            prox = batch.prox_logprob[idx]  # [b, K]
            entropy = d.entropy().sum(dim=(1, 2))  # [b]
            adv = batch.advantages[idx]  # [b]
            if cfg.norm_adv and adv.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            mask = None
            if cfg.ratio_level == "chunk":
                logprob, prox = logprob.sum(dim=1), prox.sum(dim=1)  # [b]
            elif batch.n_steps is not None:
                k = logprob.shape[1]
                mask = torch.arange(k, device=adv.device)[None, :] < batch.n_steps[idx][:, None]
            pl = decoupled_ppo_loss(
                logprob,
                prox,
                batch.behav_logprob[idx],
                adv,
                clip_coef=cfg.clip_coef,
                behave_weight_threshold=cfg.behave_weight_threshold,
                dual_clip=cfg.dual_clip,
                mask=mask,
            )
            approx_kl = pl.approx_kl
            if target_kl is not None and pl.approx_kl > target_kl:
                stop = True
                break
            loss = pl.loss - cfg.ent_coef * entropy.mean()
            v_loss = torch.zeros(())
            if vf_coef != 0.0:
                v = policy.value(batch.obs[idx])  # [b]
                v_loss = 0.5 * ((v - batch.returns[idx]) ** 2).mean()
                loss = loss + vf_coef * v_loss
            if extra_loss is not None:
                extra, extra_log = extra_loss(d, idx, torch.mean)
                loss = loss + extra
                sums["extra"] += extra_log
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            n_applied += 1
            sums["policy_loss"] += pl.loss.item()
            sums["value_loss"] += v_loss.item()
            sums["entropy"] += entropy.mean().item()
            sums["clipfrac"] += pl.clipfrac
        if stop:
            break
    denom = max(n_applied, 1)
    return {
        "policy_loss": sums["policy_loss"] / denom,
        "value_loss": sums["value_loss"] / denom,
        "entropy": sums["entropy"] / denom,
        "clipfrac": sums["clipfrac"] / denom,
        "extra_loss": sums["extra"] / denom,
        "approx_kl": approx_kl,
        "epochs_run": n_applied / cfg.num_minibatches,
    }


def _same(a: dict, b: dict) -> None:
    for k, w in a["weights"].items():
        assert torch.equal(w, b["weights"][k]), k
    for ma, mb in zip(a["metrics"], b["metrics"]):
        assert ma.keys() == mb.keys()
        for k in ma:
            assert ma[k] == mb[k] or (math.isnan(ma[k]) and math.isnan(mb[k])), k


def _before_micro_batches(*args, micro_batch=None, train_actor=True, **kwargs):
    """:func:`_sgd_update_before_dp` called as the learner calls sgd_update now (one pass, the
    actor trained: these cases have no critic warm-up)."""
    assert micro_batch is None and train_actor
    return _sgd_update_before_dp(*args, **kwargs)


@pytest.mark.parametrize("micro, whole", list(WHOLE.items()))
def test_micro_batched_ranks_train_like_one_rank_in_one_pass(runs, micro, whole):
    """2 ranks, each cutting its shard into micro-batches: the one-rank whole-minibatch update."""
    solo = runs["solo"][whole]
    for r in runs["ranks"]:
        for k, w in solo["weights"].items():
            torch.testing.assert_close(r[micro]["weights"][k], w, rtol=1e-5, atol=1e-6)
        for m2, m1 in zip(r[micro]["metrics"], solo["metrics"]):
            bad = {k: (m2[k], m1[k]) for k in m1 if not _close(m2[k], m1[k])}
            assert not bad


@pytest.mark.parametrize("name", [n for n in CASES if n not in WHOLE])
def test_solo_is_the_update_before_data_parallelism(runs, name, monkeypatch):
    ref_algo = {"ppo": "ebrl.algos.ppo.sgd_update", "grpo": "ebrl.algos.grpo.sgd_update"}
    with monkeypatch.context() as m:
        m.setattr(ref_algo[CASES[name][0]], _before_micro_batches)
        before = _train(name, runs["inputs"][name], SOLO)
    _same(runs["solo"][name], before)


def test_one_rank_group_is_solo(runs):
    dp = init_group(0, 1, ("127.0.0.1", free_port()), "gloo", timeout_s=30)
    try:
        assert dp.world == 1 and dp.leader and dp.shard(torch.arange(5)).tolist() == [0, 1, 2, 3, 4]
        one = _train("ppo_action", runs["inputs"]["ppo_action"], dp)
    finally:
        destroy()
    _same(runs["solo"]["ppo_action"], one)


# --- pieces -------------------------------------------------------------------------------------
def test_shards_cover_the_minibatch():
    idx = torch.randperm(9)
    parts = [DataParallel(r, 2).shard(idx) for r in range(2)]
    assert [p.numel() for p in parts] == [5, 4]
    assert torch.equal(torch.cat(parts), idx)
    assert DataParallel(1, 2).shard(torch.tensor([3])).numel() == 0
    assert SOLO.shard(idx) is idx and SOLO.sum_floats([1.5]) == [1.5]


def test_shard_losses_sum_to_the_minibatch_loss():
    """decoupled_ppo_loss with the minibatch's normalisers: shard losses, KLs and clip fractions
    sum to the whole minibatch's (per action, with masked actions and dropped samples)."""
    gen = torch.Generator().manual_seed(0)
    b, k = 9, 3
    prox = torch.randn(b, k, generator=gen)
    cur = (prox + 0.3 * torch.randn(b, k, generator=gen)).requires_grad_(True)
    behav = prox.sum(1) + torch.randn(b, generator=gen)
    adv = torch.randn(b, generator=gen)
    mask = torch.arange(k)[None, :] < torch.randint(1, k + 1, (b,), generator=gen)[:, None]
    kw = dict(clip_coef=0.2, behave_weight_threshold=2.0, dual_clip=3.0)
    full = decoupled_ppo_loss(cur, prox, behav, adv, mask=mask, **kw)
    denoms = loss_normalisers(prox, behav, behave_weight_threshold=2.0, mask=mask)
    assert 0 < full.behave_dropped_frac < 1 and not bool(mask.all())
    parts = [
        decoupled_ppo_loss(
            cur[s], prox[s], behav[s], adv[s], mask=mask[s], loss_denom=denoms[0],
            stat_denom=denoms[1], **kw,
        )
        for s in (slice(0, 5), slice(5, 9))
    ]  # fmt: skip
    torch.testing.assert_close(sum(p.loss for p in parts), full.loss)
    assert sum(p.approx_kl for p in parts) == pytest.approx(full.approx_kl, rel=1e-5)
    assert sum(p.clipfrac for p in parts) == pytest.approx(full.clipfrac, rel=1e-6)
    # naive: each shard normalised by its own counts, then averaged: not the minibatch loss
    naive = [decoupled_ppo_loss(cur[s], prox[s], behav[s], adv[s], mask=mask[s], **kw)
             for s in (slice(0, 5), slice(5, 9))]  # fmt: skip
    assert abs(float((sum(p.loss for p in naive) / 2 - full.loss).detach())) > 1e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CUDA-less host")
def test_nccl_without_cuda_is_refused():
    with pytest.raises(RuntimeError, match="gloo"):
        resolve_backend("nccl")
    with pytest.raises(RuntimeError, match="gloo"):
        init_group(0, 1, ("127.0.0.1", free_port()), "nccl")
    assert resolve_backend("auto", "cpu") == "gloo"
    with pytest.raises(ValueError):
        resolve_backend("mpi")


def test_ranks_sharing_a_gpu_reduce_through_gloo_since_nccl_refuses_them():
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), MPS quotas or not: learner
    ranks given shares of one GPU fall back to gloo under "auto"; "nccl" asked for by name is
    refused with the fix."""
    assert resolve_backend("auto", "cuda", shares_gpu=True) == "gloo"
    with pytest.raises(RuntimeError, match="another rank computes on this rank's GPU"):
        resolve_backend("nccl", "cuda", shares_gpu=True)


def test_ranks_exchange_values_through_the_rendezvous_store():
    import datetime
    import threading

    import torch.distributed as tdist

    port = free_port()
    stores = [None, None]

    def open_store(rank: int) -> None:
        stores[rank] = tdist.TCPStore(
            "127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=30)
        )

    threads = [threading.Thread(target=open_store, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen: dict[int, list[str]] = {}
    threads = [
        threading.Thread(
            target=lambda r: seen.__setitem__(r, exchange(stores[r], r, 2, "gpu", f"host/{r}")),
            args=(r,),
        )
        for r in (1, 0)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {0: ["host/0", "host/1"], 1: ["host/0", "host/1"]}


def test_train_stage_refuses_dp_for_an_algorithm_without_it():
    class Plain:
        policy = MLPPolicy(PolicySpec(4, 2, 2), hidden=4, layers=1)

        def update(self, seg):
            return {}

    with pytest.raises(TypeError, match="dp"):
        TrainStage(Plain(), dp=DataParallel(0, 2))
    assert loss_mod.sgd_update.__kwdefaults__["dp"] is SOLO
