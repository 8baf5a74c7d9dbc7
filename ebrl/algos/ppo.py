"""Decoupled PPO over action chunks (one decision = one transition).

Defaults are ManiSkill's PPO baseline, which reached ~99% success on PushCube-v1 on this machine
(see the reference note). Decoupling (behaviour / proximal / current policy) makes the same update
correct for stale data from asynchronous schedulers; see :mod:`ebrl.algos.loss`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ebrl.algos.loss import (
    ClipConfig,
    FlatBatch,
    behaviour_stats,
    explained_variance,
    row_slices,
    sgd_update,
)
from ebrl.algos.optim import anneal_lr, count_update, optimizer_to
from ebrl.algos.returns import chunk_returns, gae
from ebrl.policies.base import Policy
from ebrl.runtime.dist import SOLO, DataParallel
from ebrl.types import Segment


@dataclass(kw_only=True)
class PPOConfig(ClipConfig):
    """PPO hyperparameters (ManiSkill PPO baseline defaults); the update's own in ClipConfig."""

    gamma: float = 0.8
    """Per-step discount; a decision of n steps is discounted by gamma**n."""
    gae_lambda: float = 0.9
    """GAE lambda, applied once per decision."""
    vf_coef: float = 0.5
    """Value loss coefficient; value loss is 0.5 * (V - returns)^2, unclipped."""
    bootstrap_at_done: bool = True
    """Bootstrap V(final_obs) on termination too (ManiSkill's 'always'); truncation always does."""
    critic_warmup_updates: int = 0
    """The first this many updates train the critic only, the actor and its log-std held: from a
    warm-started actor (``init_checkpoint``) with a fresh critic, the actor's first steps then
    follow advantages of a critic fitted to the clone's own returns, not a random critic's
    noise. Counted in the optimiser's state, so a resumed run does not warm up again."""

    def __post_init__(self) -> None:
        super().__post_init__()
        w = self.critic_warmup_updates
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(
                f"algo.cfg.critic_warmup_updates={w!r}: the updates that train the critic only "
                "must be an integer >= 0 (0: none)"
            )
        if w and self.vf_coef == 0.0:
            raise ValueError(
                f"algo.cfg.critic_warmup_updates={w} with algo.cfg.vf_coef=0: a warm-up trains "
                "the critic only, and vf_coef 0 trains no critic; set vf_coef > 0 or "
                "critic_warmup_updates=0"
            )


class PPO:
    """Decoupled PPO learner: ``update(segment) -> metrics``.

    Args:
        policy: the policy to train in place; its ``version`` is bumped after every update.
        cfg: hyperparameters.
        dp: this learner's rank of a data-parallel group (:mod:`ebrl.runtime.dist`; every rank
            updates on the same whole segment); the default is one process. The attribute
            ``dp`` may be set later (TrainStage does).
    """

    def __init__(
        self, policy: Policy, cfg: PPOConfig | Mapping[str, Any], dp: DataParallel = SOLO
    ) -> None:
        self.policy = policy
        # a plain mapping comes from configs that crossed a process boundary as containers
        self.cfg = cfg if isinstance(cfg, PPOConfig) else PPOConfig(**cfg)
        cfg = self.cfg
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.dp = dp
        #: decisions per forward pass (``cfg.micro_batch``; TrainStage sizes it on a GPU)
        self.micro_batch = cfg.micro_batch

    def to(self, device: torch.device | str) -> PPO:
        """Move the policy and the optimiser state to ``device``."""
        self.policy.to(device)
        optimizer_to(self.optimizer, device)
        return self

    def update(self, seg: Segment) -> dict[str, float]:
        """One PPO update on a segment; returns ``train/*`` and ``pipeline/*`` metrics."""
        cfg, policy = self.cfg, self.policy
        device = next(policy.parameters()).device
        seg = seg.to(device)
        t_len, n = seg.shape
        version = policy.version
        staleness = seg.staleness(version).float()  # [T, N]

        flat_obs = seg.obs.flatten(0, 1)  # [T*N, O]
        flat_actions = seg.actions.flatten(0, 1)  # [T*N, K, A]
        extras = seg.flat_extras()  # name -> [T*N, ...]
        flat_final = seg.final_obs.flatten(0, 1)  # [T*N, O]
        values, next_values, proxes = [], [], []
        with torch.no_grad():
            # The current critic, not the behaviour values: with stale data the acting critic's
            # values are old, and the proximal weights are what the update starts from. In
            # micro-batches, as the update's passes: a segment is several minibatches
            for s in row_slices(t_len * n, self.micro_batch):
                ex = {k: v[s] for k, v in extras.items()}
                values.append(policy.value(flat_obs[s], ex))  # [s]
                next_values.append(policy.value(flat_final[s]))  # [s]
                d = policy.dist(flat_obs[s], flat_actions[s], ex)
                proxes.append(d.log_prob(flat_actions[s]).sum(dim=2))  # [s, K]
        value = torch.cat(values).view(t_len, n)  # [T, N]
        next_value = torch.cat(next_values).view(t_len, n)  # [T, N]
        prox = torch.cat(proxes)  # [T*N, K]

        ret, discount = chunk_returns(seg.reward, seg.n_steps, cfg.gamma)  # [T, N] each
        done = seg.terminated | seg.truncated  # [T, N]
        # Mid-episode and truncated decisions always bootstrap; terminal ones only if configured.
        bootstrap = ~seg.terminated | cfg.bootstrap_at_done  # [T, N]
        adv, returns = gae(ret, discount, value, next_value, done, bootstrap, cfg.gae_lambda)

        behav = seg.logprob.flatten()  # [T*N], whole chunks
        batch = FlatBatch(
            obs=flat_obs,
            actions=flat_actions,
            behav_logprob=behav,
            prox_logprob=prox,
            advantages=adv.flatten(),
            returns=returns.flatten(),
            n_steps=seg.n_steps.flatten(),
            extras=extras,
        )
        w_mean, dropped = behaviour_stats(prox, behav, cfg.behave_weight_threshold)
        lr = anneal_lr(self.optimizer, cfg, seg.num_steps)
        warming = count_update(self.optimizer) < cfg.critic_warmup_updates
        stats = sgd_update(
            policy,
            self.optimizer,
            batch,
            cfg,
            target_kl=cfg.effective_target_kl(policy.spec.chunk_size),
            vf_coef=cfg.vf_coef,
            dp=self.dp,
            micro_batch=self.micro_batch,
            train_actor=not warming,
        )
        policy.version += 1
        return {
            "train/policy_loss": stats["policy_loss"],
            "train/value_loss": stats["value_loss"],
            "train/entropy": stats["entropy"],
            "train/approx_kl": stats["approx_kl"],
            "train/clipfrac": stats["clipfrac"],
            "train/behave_weight_mean": w_mean,
            "train/behave_dropped_frac": dropped,
            "train/explained_variance": explained_variance(value.flatten(), returns.flatten()),
            "train/epochs_run": stats["epochs_run"],
            "train/lr": lr,
            "train/critic_only": float(warming),
            "pipeline/staleness_mean": float(staleness.mean()),
            "pipeline/staleness_max": float(staleness.max()),
        }
