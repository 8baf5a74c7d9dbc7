"""The decoupled PPO-clip loss and the minibatch SGD loop shared by PPO and GRPO.

Decoupled PPO (Hilton et al. 2022; AReaL and RLinf use it for asynchronous RL) separates three
policies:

* behaviour: the weights that acted (``seg.logprob``), possibly several versions old;
* proximal: the weights at the start of this update, the anchor of the trust region;
* current: the weights being optimised.

The clipped ratio is ``exp(cur - prox)``, so the trust region does not shrink or widen with
staleness; the off-policy correction is the behaviour importance weight
``w = exp(prox - behav)`` multiplying each sample's clipped loss. Samples with ``w`` above
``behave_weight_threshold`` are dropped (weight 0), as in RLinf's
``compute_decoupled_ppo_actor_loss`` and AReaL's ``behav_imp_weight_cap``: truncating them
instead would keep the most off-policy samples at full strength. As there, the loss is still
normalised by the number of samples before dropping, so a dropped sample acts as a zero and does
not inflate the others. With fresh data ``prox == behav``, ``w = 1`` and the loss is
exactly standard PPO-clip.

Ratio granularity (``ClipConfig.ratio_level``). A decision is a chunk of K actions with one
advantage (chunk-level credit assignment, :mod:`ebrl.algos.returns`). The PPO ratio can be taken

* per chunk (``"chunk"``): ``exp(sum_j cur_j - sum_j prox_j)``, one ratio per decision. Its log is
  a sum of K per-action log-ratios, so it moves ~K times faster than a single action's and a
  fixed clip range admits K times less change per action; actions sampled after the episode ended
  inside the chunk (never executed) are in the sum too;
* per action (``"action"``, the default): one ratio per executed action, each clipped on its own
  and weighted by its decision's advantage, averaged over executed actions (as token-level PPO does
  for language models and RLinf's ``logprob_type: action_level``). Actions that never ran are
  masked out. Measured on PushCube-v1 (results/learning/): chunk-level updates at K=4 hit the KL
  cutoff after ~half their epochs and learned worse.

The behaviour weight ``w`` is always the chunk's (the behaviour policy sampled the whole chunk),
``exp(sum_j prox_j - behav)`` over all K actions, as the stored behaviour log-prob is.

Data parallelism (:mod:`ebrl.runtime.dist`): with L learner ranks, each rank takes the loss of its
shard of every minibatch, normalised by the whole minibatch's counts (kept samples or kept executed
actions, minibatch size, advantage mean and std: :func:`loss_normalisers`), so the per-rank
gradients sum to exactly the whole minibatch's gradient of a one-rank run, whether they are summed
whole (DDP) or reduce-scattered into shards (FSDP, with a divide factor of 1).

Micro-batches (``ClipConfig.micro_batch``) use the same arithmetic: a rank's part of a minibatch
is cut into passes of at most that many decisions, each normalised by the whole minibatch's
counts, and their gradients accumulate before the minibatch's one step, so a model whose
minibatch does not fit in one forward pass (a VLA's 2,816 decisions) trains as if it did.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ebrl.policies.base import Policy
from ebrl.runtime.dist import SOLO, DataParallel
from ebrl.types import Extras

Tensor = torch.Tensor
RATIO_LEVELS = ("action", "chunk")


@dataclass(kw_only=True)
class ClipConfig:
    """Settings of the shared PPO-clip update (:func:`sgd_update`), common to PPO and GRPO."""

    lr: float = 3e-4
    """Adam learning rate."""
    lr_decay_steps: int | None = None
    """Decay the learning rate linearly from ``lr`` to 0 over this many env steps trained on
    (CleanRL's anneal_lr; set it to the run's budget); None keeps it constant."""
    adam_eps: float = 1e-5
    """Adam epsilon (CleanRL / ManiSkill value)."""
    clip_coef: float = 0.2
    """PPO ratio clip, on exp(current - proximal)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient (entropy summed over the K*A chunk dimensions)."""
    max_grad_norm: float = 0.5
    """Global gradient norm clip."""
    target_kl: float | None = 0.1
    """Stop the update at the first minibatch whose approx KL exceeds this; None disables."""
    scale_target_kl_with_chunk: bool = True
    """With ratio_level "chunk", multiply target_kl by K: the KL of a chunk's summed log-prob is
    about K times a step's. Ignored with "action" (the KL is then per action already)."""
    ratio_level: str = "action"
    """"action": one clipped ratio per executed action; "chunk": one per decision (module doc)."""
    update_epochs: int = 8
    """Passes over the segment per update."""
    num_minibatches: int = 4
    """Minibatches per pass over the decisions."""
    norm_adv: bool = True
    """Standardise advantages per minibatch."""
    behave_weight_threshold: float | None = 2.0
    """Drop samples with exp(prox - behav) above this (RLinf: default None, 2.0 in its scripts)."""
    dual_clip: float | None = 3.0
    """Dual-clip c > 1 for negative advantages (Ye et al. 2020; RLinf's clip_ratio_c, 3.0)."""
    micro_batch: int | None = None
    """Decisions per forward pass of a learner rank: each minibatch is cut into micro-batches
    of at most this many, their gradients accumulated into the whole minibatch's one step (the
    same update, to float rounding; :func:`sgd_update`). None: sized from the learner's GPU
    memory (:mod:`ebrl.memory`) on a GPU, the whole minibatch in one pass on the CPU."""

    def effective_target_kl(self, chunk_size: int) -> float | None:
        """The KL cutoff actually used for chunks of ``chunk_size`` actions."""
        if self.target_kl is None:
            return None
        if self.ratio_level == "chunk" and self.scale_target_kl_with_chunk:
            return self.target_kl * chunk_size
        return self.target_kl

    def __post_init__(self) -> None:
        check_micro_batch(self.micro_batch)
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(
                f"ratio_level={self.ratio_level!r}: expected one of {', '.join(RATIO_LEVELS)}"
            )


@dataclass(slots=True)
class PolicyLoss:
    """The clipped policy loss of a minibatch and its diagnostics."""

    loss: Tensor  # [] scalar, with gradients through the current log-probs
    approx_kl: float  # KL(prox || cur) estimate, ((r - 1) - log r).mean() (Schulman's k3)
    clipfrac: float  # fraction of samples whose ratio left [1 - clip, 1 + clip]
    behave_weight_mean: float  # mean behaviour weight over kept samples
    behave_dropped_frac: float  # fraction of samples dropped by the threshold


def decoupled_ppo_loss(
    logprob: Tensor,
    prox_logprob: Tensor,
    behav_logprob: Tensor,
    advantages: Tensor,
    *,
    clip_coef: float,
    behave_weight_threshold: float | None,
    dual_clip: float | None,
    mask: Tensor | None = None,
    loss_denom: float | None = None,
    stat_denom: int | None = None,
) -> PolicyLoss:
    """Decoupled PPO-clip loss with behaviour weighting and optional dual clip.

    Ratios are per chunk when ``logprob`` is ``[B]`` and per action when it is ``[B, K]``.

    Args:
        logprob: ``[B]`` or ``[B, K]`` current log-probs (with gradients).
        prox_logprob: same shape, proximal log-probs (weights at the start of the update).
        behav_logprob: ``[B]`` behaviour log-probs of the whole chunks (the weights that acted).
        advantages: ``[B]``.
        clip_coef: PPO ratio clip.
        behave_weight_threshold: drop samples with ``exp(prox - behav)`` above this; None keeps
            every sample.
        dual_clip: for negative advantages, cap the loss at ``dual_clip * |A|`` (Ye et al. 2020)
            so a huge ratio on a bad action cannot dominate the gradient; None disables it.
        mask: ``[B, K]`` bool, per-action ratios only: which actions count (those executed).
        loss_denom: for a shard of a larger minibatch (data parallelism): that minibatch's loss
            normaliser, its number of kept samples (per action: kept executed actions), from
            :func:`loss_normalisers`. None: this batch's own.
        stat_denom: likewise the minibatch's count of ratios in ``approx_kl`` and ``clipfrac``.
            With both given, ``loss``, ``approx_kl`` and ``clipfrac`` are this shard's shares:
            summed over the shards they are the whole minibatch's values.

    Returns:
        The loss (mean over the kept samples, as RLinf v0.3's ``masked_mean`` over its behaviour
        mask does in ``compute_decoupled_ppo_actor_loss``; per action: over kept, unmasked
        actions) and diagnostics.
    """
    per_action = logprob.dim() == 2
    prox_logprob = prox_logprob.detach()
    log_ratio = logprob - prox_logprob  # [B] or [B, K]
    ratio = log_ratio.exp()
    adv = advantages[:, None] if per_action else advantages  # broadcast over K
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    pg = torch.maximum(pg1, pg2)  # pessimistic bound
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        # -A * c is positive when A < 0: the loss (= -objective) may not exceed c * |A|.
        capped = torch.minimum(pg, -adv * dual_clip)
        pg = torch.where(adv < 0, capped, pg)

    with torch.no_grad():
        prox_chunk = prox_logprob.sum(dim=1) if per_action else prox_logprob  # [B]
        weight = (prox_chunk - behav_logprob.detach()).exp()  # [B] behaviour weight
        if behave_weight_threshold is not None:
            keep = weight <= behave_weight_threshold  # [B] bool
        else:
            keep = torch.ones_like(weight, dtype=torch.bool)
        weight = torch.where(keep, weight, torch.zeros_like(weight))  # [B]
        n_keep = int(keep.sum())
        if per_action:
            m = mask if mask is not None else torch.ones_like(ratio, dtype=torch.bool)  # [B, K]
            elem_w = weight[:, None] * m  # [B, K]
            denom = float((keep[:, None] & m).sum())
            counted = m
        else:
            elem_w = weight  # [B]
            denom = float(n_keep)
            counted = torch.ones_like(ratio, dtype=torch.bool)
        n_counted = int(counted.sum())
        if loss_denom is not None:
            denom = loss_denom
        if stat_denom is not None:
            n_counted = stat_denom
        if n_counted:
            approx_kl = float((((ratio - 1.0) - log_ratio) * counted).sum()) / n_counted
            clipfrac = float((((ratio - 1.0).abs() > clip_coef) & counted).sum()) / n_counted
        else:
            approx_kl = clipfrac = 0.0
    b = max(advantages.numel(), 1)
    return PolicyLoss(
        loss=(pg * elem_w).sum() / max(denom, 1.0),
        approx_kl=approx_kl,
        clipfrac=clipfrac,
        behave_weight_mean=float(weight.sum()) / n_keep if n_keep else 0.0,
        behave_dropped_frac=1.0 - n_keep / b,
    )


def loss_normalisers(
    prox_logprob: Tensor,
    behav_logprob: Tensor,
    *,
    behave_weight_threshold: float | None,
    mask: Tensor | None = None,
) -> tuple[float, int]:
    """The normalisers :func:`decoupled_ppo_loss` uses on a (whole) minibatch: ``(loss_denom,
    stat_denom)``, i.e. (kept samples, or kept executed actions per action; ratios counted in
    approx_kl and clipfrac). Needs no forward pass: only proximal and behaviour log-probs.

    Args: as :func:`decoupled_ppo_loss`'s (``prox_logprob`` ``[B]`` or ``[B, K]``).
    """
    with torch.no_grad():
        per_action = prox_logprob.dim() == 2
        prox_chunk = prox_logprob.sum(dim=1) if per_action else prox_logprob  # [B]
        weight = (prox_chunk - behav_logprob).exp()  # [B]
        if behave_weight_threshold is not None:
            keep = weight <= behave_weight_threshold  # [B] bool
        else:
            keep = torch.ones_like(weight, dtype=torch.bool)
        if not per_action:
            return float(keep.sum()), int(prox_logprob.numel())
        m = mask if mask is not None else torch.ones_like(prox_logprob, dtype=torch.bool)
        return float((keep[:, None] & m).sum()), int(m.sum())


@dataclass(slots=True)
class FlatBatch:
    """Decisions flattened to one batch dimension for minibatch SGD."""

    obs: Tensor  # [B, O]
    actions: Tensor  # [B, K, A]
    behav_logprob: Tensor  # [B], the whole chunk's
    prox_logprob: Tensor  # [B, K], per action (summed over A)
    advantages: Tensor  # [B]
    returns: Tensor  # [B], value targets (unused when vf_coef == 0)
    n_steps: Tensor | None = None  # [B] int64, actions executed (None: all K)
    extras: Extras = field(default_factory=dict)  # name -> [B, ...], the policy's (ebrl.types)

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    def extras_of(self, idx: Tensor) -> Extras:
        """The rows ``idx`` of every extra."""
        return {k: v[idx] for k, v in self.extras.items()}


#: extra loss term on a minibatch: (current distribution, indices, mean) -> (loss [], log value).
#: ``mean`` reduces a per-sample ``[b]`` tensor to the minibatch mean; under data parallelism the
#: indices are this rank's shard and ``mean`` its share of the whole minibatch's mean (the sum
#: over the shard divided by the minibatch's size), so the term and its logged value sum over the
#: ranks to a one-rank run's.
ExtraLoss = Callable[
    [torch.distributions.Normal, Tensor, Callable[[Tensor], Tensor]], tuple[Tensor, float]
]


def sgd_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: FlatBatch,
    cfg: ClipConfig,
    *,
    target_kl: float | None,
    vf_coef: float,
    extra_loss: ExtraLoss | None = None,
    dp: DataParallel = SOLO,
    micro_batch: int | None = None,
    train_actor: bool = True,
) -> dict[str, float]:
    """Epochs of shuffled minibatch SGD on the decoupled PPO loss, with KL early stopping.

    ``train_actor`` False (a critic warm-up): only the value loss is back-propagated, so the
    actor's parameters get no gradient and keep their weights (their policy loss and KL are
    still measured and returned; the KL is then 0 and never stops the update).

    Like ManiSkill's PPO baseline, a minibatch whose approx KL exceeds ``target_kl`` is not
    applied and ends the whole update. With ``vf_coef == 0`` the critic is not evaluated at all.

    Data parallelism (``dp`` with ``world > 1``): every rank passes the same ``batch`` (the
    whole segment), weights, optimiser and torch RNG state; each evaluates its
    :meth:`~ebrl.runtime.dist.DataParallel.shard` of every minibatch with the whole minibatch's
    normalisers, the gradients are summed over the ranks (one flat buffer per minibatch), and
    every rank clips and steps identically. The approx KL of the stop test (and the clip
    fraction) is the whole minibatch's (a second, tiny collective), so all ranks stop at the same
    minibatch; the returned metrics are the whole minibatches', as in a one-rank run. Each
    epoch's permutation is checked to agree across the ranks (a third, per epoch). With an FSDP
    group (``dp.sharded``: the policy's parameters are shards,
    :func:`ebrl.runtime.dist_fsdp.shard_module`) FSDP's backward sums the gradients into each rank's
    shard instead of the flat buffer, the clip uses the global norm over all shards and each
    rank steps its shard: the same update. With
    :data:`~ebrl.runtime.dist.SOLO` (the default) nothing is communicated and the update is
    exactly the one-process update.

    Micro-batches (``micro_batch``: at most this many decisions per forward pass on a rank; None:
    the rank's whole part of the minibatch in one pass): each minibatch's part on this rank is
    cut into :func:`micro_batches`, each pass takes its share of the whole minibatch's loss (the
    normalisers, advantage statistics and means of the data-parallel shards above, so nothing is
    averaged per micro-batch), and the gradients accumulate over the passes before the one step:
    the update of the whole minibatch, to float rounding, holding one micro-batch's activations
    at a time. The KL stop test and the logged metrics are the whole minibatch's.

    Returns:
        Metrics without prefix: policy_loss, value_loss, entropy, approx_kl (last minibatch
        seen), clipfrac, epochs_run (applied minibatches / num_minibatches), extra_loss.
    """
    sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clipfrac": 0.0, "extra": 0.0}
    n_applied = 0
    approx_kl = 0.0
    n = len(batch)
    # what is clipped is what the optimiser steps: the policy's parameters (PPO and GRPO build
    # it on them, in order). Not ``policy.parameters()``: under FSDP that yields the gathered
    # full parameters while a unit is unsharded (after a no_grad forward), whose gradients FSDP
    # moves into the shards the optimiser holds
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    solo = dp.world == 1
    stop = False
    for _ in range(cfg.update_epochs if n else 0):
        perm = torch.randperm(n, device=batch.obs.device)  # [B], the same on every rank
        dp.check_same(perm, "the minibatch permutation")  # no-op for SOLO
        for idx in torch.tensor_split(perm, cfg.num_minibatches):
            if idx.numel() == 0:
                continue
            b = idx.numel()
            adv_mb = batch.advantages[idx]  # [b], the whole minibatch's
            sidx = dp.shard(idx)  # [b_r], this rank's part (all of it for SOLO)
            parts = micro_batches(sidx, b, dp.world, micro_batch)
            norm = None
            if not solo or len(parts) > 1:  # each pass a share of the whole minibatch's loss
                loss_denom, stat_denom = _minibatch_normalisers(batch, idx, cfg)
                norm = (loss_denom, stat_denom, functools.partial(_share_of_mean, n=b))
            adv_stats = None
            if cfg.norm_adv and b > 1:  # statistics of the whole minibatch
                adv_stats = (adv_mb.mean(), adv_mb.std())
            # forward and backward pass by pass, the gradients accumulating: the graph of one
            # micro-batch is all that is ever held. The KL stop test needs the whole
            # minibatch's KL, known after the last pass; a stopped minibatch's gradients are
            # thrown away, so it is not applied, as before
            optimizer.zero_grad(set_to_none=True)
            got = _Shares()
            for part in parts:
                _micro_pass(
                    policy, batch, part, cfg, got, norm, adv_stats, vf_coef, extra_loss, train_actor
                )
            kl, clipfrac = got.kl, got.clipfrac
            if not solo:  # the whole minibatch's: every rank takes the same stop decision
                kl, clipfrac = dp.sum_floats([kl, clipfrac])
            approx_kl = kl
            if target_kl is not None and kl > target_kl:
                optimizer.zero_grad(set_to_none=True)
                stop = True
                break
            if not dp.sharded:  # FSDP's backward already reduce-scattered the summed shards
                dp.sum_grads(params)  # no-op for SOLO
            # sharded (DTensor) gradients: torch reduces the shards' norms to the global norm
            nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            n_applied += 1
            sums["policy_loss"] += got.policy_loss
            sums["value_loss"] += got.value_loss
            sums["entropy"] += got.entropy
            sums["extra"] += got.extra
            sums["clipfrac"] += clipfrac
        if stop:
            break
    if not solo:  # this rank's shares -> the whole minibatches' (clipfrac is already)
        keys = ("policy_loss", "value_loss", "entropy", "extra")
        sums.update(zip(keys, dp.sum_floats([sums[k] for k in keys])))
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


def row_slices(n: int, micro_batch: int | None) -> list[slice]:
    """``n`` rows in consecutive slices of at most ``micro_batch`` (None: one slice): the
    passes of a no-grad forward over a whole segment (the proximal log-probs, the values)."""
    if micro_batch is None or n <= micro_batch:
        return [slice(0, n)]
    return [slice(i, min(i + micro_batch, n)) for i in range(0, n, micro_batch)]


def micro_batches(
    idx: Tensor, minibatch: int, world: int, micro_batch: int | None
) -> tuple[Tensor, ...]:
    """This rank's part ``idx`` of a minibatch of ``minibatch`` decisions, cut into the passes
    :func:`sgd_update` makes: parts of at most ``micro_batch`` decisions (None: one pass).

    Every rank of a group of ``world`` makes the same number of passes, that of the largest
    shard (a rank's last parts may be empty): under FSDP each pass is a collective (its
    all-gathers and reduce-scatters), so a rank with one pass fewer would leave the others
    waiting.
    """
    if micro_batch is None:
        return (idx,)
    check_micro_batch(micro_batch)
    largest = -(-minibatch // world)  # ceil: the largest shard's size (DataParallel.shard)
    return torch.tensor_split(idx, max(1, -(-largest // micro_batch)))


def check_micro_batch(micro_batch: int | None) -> None:
    """Raise ValueError, naming the key and the fix, unless ``micro_batch`` is None or >= 1."""
    if micro_batch is not None and (
        isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1
    ):
        raise ValueError(
            f"algo.cfg.micro_batch={micro_batch!r}: the decisions per forward pass of the "
            "learner must be an integer >= 1; or null to size it from the learner's GPU memory "
            "(ebrl.memory), the whole minibatch in one pass on the CPU"
        )


@dataclass(slots=True)
class _Shares:
    """A minibatch's losses and statistics, summed over this rank's micro-batches (each pass
    adds its share of the whole minibatch's value)."""

    policy_loss: float = 0.0
    value_loss: float = 0.0
    entropy: float = 0.0
    extra: float = 0.0
    kl: float = 0.0
    clipfrac: float = 0.0


def _micro_pass(
    policy: Policy,
    batch: FlatBatch,
    sidx: Tensor,
    cfg: ClipConfig,
    got: _Shares,
    norm: tuple[float, int, Callable[[Tensor], Tensor]] | None,
    adv_stats: tuple[Tensor, Tensor] | None,
    vf_coef: float,
    extra_loss: ExtraLoss | None,
    train_actor: bool = True,
) -> None:
    """Forward and backward of the decisions ``sidx`` (a micro-batch of this rank's part of a
    minibatch), the gradients added to the parameters' and the losses to ``got``.

    ``norm``: (loss denominator, statistics denominator, mean) of the whole minibatch, for a
    pass that is a share of it; None for a pass over the whole minibatch (its own).
    ``adv_stats``: the whole minibatch's advantage mean and std (None: no normalisation).
    """
    loss_denom = stat_denom = None
    mean: Callable[[Tensor], Tensor] = torch.mean
    if norm is not None:
        loss_denom, stat_denom, mean = norm
    adv = batch.advantages[sidx]  # [b]
    if adv_stats is not None:
        adv = (adv - adv_stats[0]) / (adv_stats[1] + 1e-8)
    obs, actions = batch.obs[sidx], batch.actions[sidx]
    d = policy.dist(obs, actions, batch.extras_of(sidx))  # loc/scale [b, K, A]
    logprob = d.log_prob(actions).sum(dim=2)  # [b, K]
    prox = batch.prox_logprob[sidx]  # [b, K]
    entropy = d.entropy().sum(dim=(1, 2))  # [b]
    mask = None
    if cfg.ratio_level == "chunk":
        logprob, prox = logprob.sum(dim=1), prox.sum(dim=1)  # [b]
    elif batch.n_steps is not None:
        k = logprob.shape[1]
        mask = torch.arange(k, device=adv.device)[None, :] < batch.n_steps[sidx][:, None]
    pl = decoupled_ppo_loss(
        logprob,
        prox,
        batch.behav_logprob[sidx],
        adv,
        clip_coef=cfg.clip_coef,
        behave_weight_threshold=cfg.behave_weight_threshold,
        dual_clip=cfg.dual_clip,
        mask=mask,
        loss_denom=loss_denom,
        stat_denom=stat_denom,
    )
    ent = mean(entropy)
    # a critic warm-up back-propagates the value loss alone: the actor gets no gradient
    loss = pl.loss - cfg.ent_coef * ent if train_actor else torch.zeros(())
    v_loss = torch.zeros(())
    if vf_coef != 0.0:
        v = policy.value(obs, batch.extras_of(sidx))  # [b]
        v_loss = 0.5 * mean((v - batch.returns[sidx]) ** 2)
        loss = loss + vf_coef * v_loss
    if extra_loss is not None:
        extra, extra_log = extra_loss(d, sidx, mean)
        if train_actor:
            loss = loss + extra
        got.extra += extra_log
    loss.backward()
    got.policy_loss += pl.loss.item()
    got.value_loss += v_loss.item()
    got.entropy += ent.item()
    got.kl += pl.approx_kl
    got.clipfrac += pl.clipfrac


def _share_of_mean(x: Tensor, n: int) -> Tensor:
    """A shard's share of the mean over a minibatch of ``n``: ``x.sum() / n``."""
    return x.sum() / n


def _minibatch_normalisers(batch: FlatBatch, idx: Tensor, cfg: ClipConfig) -> tuple[float, int]:
    """:func:`loss_normalisers` of the whole minibatch ``idx`` as :func:`sgd_update` forms it."""
    prox = batch.prox_logprob[idx]  # [b, K]
    mask = None
    if cfg.ratio_level == "chunk":
        prox = prox.sum(dim=1)  # [b]
    elif batch.n_steps is not None:
        k = prox.shape[1]
        mask = torch.arange(k, device=prox.device)[None, :] < batch.n_steps[idx][:, None]
    return loss_normalisers(
        prox,
        batch.behav_logprob[idx],
        behave_weight_threshold=cfg.behave_weight_threshold,
        mask=mask,
    )


def behaviour_stats(
    prox_logprob: Tensor, behav_logprob: Tensor, threshold: float | None
) -> tuple[float, float]:
    """(mean behaviour weight over kept samples, dropped fraction) over a whole batch; chunk
    log-probs ``[B]`` (per-action ``[B, K]`` proximal log-probs are summed)."""
    if prox_logprob.dim() == 2:
        prox_logprob = prox_logprob.sum(dim=1)  # [B]
    w = (prox_logprob - behav_logprob).exp()  # [B]
    keep = w <= threshold if threshold is not None else torch.ones_like(w, dtype=torch.bool)
    n_keep = int(keep.sum())
    mean = float(w[keep].mean()) if n_keep else math.nan
    return mean, (1.0 - n_keep / w.numel()) if w.numel() else 0.0


def explained_variance(pred: Tensor, target: Tensor) -> float:
    """``1 - Var(target - pred) / Var(target)``; NaN when the target is constant."""
    var_y = float(target.var()) if target.numel() > 1 else 0.0
    if var_y == 0.0:
        return math.nan
    return 1.0 - float((target - pred).var()) / var_y
