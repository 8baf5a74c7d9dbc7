"""GRPO: group-relative advantages over episodes that share an initial state; no critic.

Grouping contract: envs with equal ``env_id // group_size`` start their e-th episodes from the
same seeded initial state (``EnvGroup(reset_group_size=group_size)``), so an episode's group key
is ``(env_id // group_size, episode_id)``. Each complete episode in a segment gets
``A = (R - mean_group) / (std_group + eps)``, assigned to all its decisions; the rest of the
segment (episode tails cut by the segment boundary, singleton groups) is masked out.

An episode is complete when the segment holds both its first and last decision. Its last decision
is a done; its first follows a done in the same segment, or is the first row of the segment with
``episode_step == 0`` (the data contract says how far into its episode every decision is), so a
tail cut from the previous segment is never scored with a partial return.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ebrl.algos.loss import (
    ClipConfig,
    FlatBatch,
    behaviour_stats,
    row_slices,
    sgd_update,
)
from ebrl.algos.optim import anneal_lr, optimizer_to
from ebrl.algos.returns import group_relative_advantages
from ebrl.policies.base import Policy
from ebrl.runtime.dist import SOLO, DataParallel
from ebrl.types import Segment

Tensor = torch.Tensor
log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class GRPOConfig(ClipConfig):
    """GRPO hyperparameters; the PPO-clip update's own are in :class:`ClipConfig`."""

    group_size: int = 4
    """Envs per group; must equal EnvGroup's reset_group_size."""
    reward: str = "return"
    """Episode score: "return" (undiscounted sum of per-step rewards) or "success" (0/1)."""
    adv_eps: float = 1e-6
    """Added to the group std."""
    kl_coef: float = 0.0
    """Penalty on KL(current || reference), reference = weights at construction; 0 = KL-free."""
    norm_adv: bool = False
    """Re-standardise advantages per minibatch (off: group normalisation already did it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # A plain str, not Literal: Hydra/OmegaConf structured configs reject Literal annotations.
        if self.reward not in ("return", "success"):
            raise ValueError(
                f"GRPOConfig.reward must be 'return' or 'success', got {self.reward!r}"
            )
        if self.group_size < 1:
            raise ValueError(f"GRPOConfig.group_size must be >= 1, got {self.group_size}")


@dataclass(slots=True)
class EpisodeAdvantages:
    """Per-decision GRPO advantages of a segment."""

    advantages: Tensor  # [T, N] float32, 0 where masked
    mask: Tensor  # [T, N] bool, decision belongs to a complete episode of a kept group
    num_groups: int  # groups with >= 2 complete episodes


def episode_advantages(
    seg: Segment,
    first_is_start: Tensor,
    group_size: int,
    reward: str = "return",
    eps: float = 1e-6,
) -> EpisodeAdvantages:
    """Group-relative advantages of the complete episodes of a segment.

    Args:
        seg: the segment.
        first_is_start: ``[N]`` bool, row 0 of column i is the first decision of its episode.
        group_size: envs per reset group.
        reward: ``"return"`` (undiscounted sum of per-step rewards) or ``"success"``.
        eps: added to the group std.
    """
    t_len, n = seg.shape
    done = (seg.terminated | seg.truncated).cpu()  # [T, N]
    live = torch.arange(seg.reward.shape[-1]) < seg.n_steps.cpu().unsqueeze(-1)  # [T, N, K]
    step_sum = (seg.reward.cpu() * live).sum(-1)  # [T, N], undiscounted per decision
    success = seg.success.cpu()  # [T, N]
    ep_id = seg.episode_id.cpu()  # [T, N]
    env_ids = seg.env_ids.cpu()  # [N]

    spans: list[tuple[int, int, int]] = []  # (column, first row, last row) of complete episodes
    scores: list[float] = []
    keys: list[tuple[int, int]] = []
    for i in range(n):
        start, fresh = 0, bool(first_is_start[i])
        for t in range(t_len):
            if not done[t, i]:
                continue
            if fresh:
                if ep_id[start, i] != ep_id[t, i]:
                    raise ValueError(
                        f"GRPO: env {int(env_ids[i])} changes episode id inside an episode "
                        f"(rows {start}..{t}); episode_id must be constant until a done"
                    )
                if reward == "success":
                    score = float(success[start : t + 1, i].any())
                else:
                    score = float(step_sum[start : t + 1, i].sum())
                spans.append((i, start, t))
                scores.append(score)
                keys.append((int(env_ids[i]) // group_size, int(ep_id[t, i])))
            start, fresh = t + 1, True

    adv = torch.zeros(t_len, n)  # [T, N]
    mask = torch.zeros(t_len, n, dtype=torch.bool)  # [T, N]
    if not spans:
        return EpisodeAdvantages(adv, mask, 0)
    key_t = torch.tensor(keys, dtype=torch.int64)  # [E, 2]
    ep_adv, valid = group_relative_advantages(torch.tensor(scores), key_t, eps)  # [E], [E]
    for (i, a, b), v, ok in zip(spans, ep_adv.tolist(), valid.tolist()):
        if ok:
            adv[a : b + 1, i] = v
            mask[a : b + 1, i] = True
    num_groups = int(torch.unique(key_t[valid], dim=0).shape[0]) if bool(valid.any()) else 0
    return EpisodeAdvantages(adv, mask, num_groups)


class GRPO:
    """Critic-free learner with group-relative advantages: ``update(segment) -> metrics``.

    Row 0 of a segment starts an episode where ``seg.episode_step[0] == 0``; episodes cut by a
    segment boundary are left out of the loss (see the module docstring).

    Args:
        policy: the policy to train in place; its critic is never trained.
        cfg: hyperparameters.
        dp: this learner's rank of a data-parallel group (:mod:`ebrl.runtime.dist`; every rank
            updates on the same whole segment); the default is one process. The attribute
            ``dp`` may be set later (TrainStage does).
    """

    def __init__(
        self, policy: Policy, cfg: GRPOConfig | Mapping[str, Any], dp: DataParallel = SOLO
    ) -> None:
        self.policy = policy
        # a plain mapping comes from configs that crossed a process boundary as containers
        self.cfg = cfg if isinstance(cfg, GRPOConfig) else GRPOConfig(**cfg)
        cfg = self.cfg
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.dp = dp
        #: decisions per forward pass (``cfg.micro_batch``; TrainStage sizes it on a GPU)
        self.micro_batch = cfg.micro_batch
        self.reference: Policy | None = None
        self._warned_empty = False
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(policy).requires_grad_(False)

    def to(self, device: torch.device | str) -> GRPO:
        """Move the policy, the reference policy and the optimiser state to ``device``."""
        self.policy.to(device)
        if self.reference is not None:
            self.reference.to(device)
        optimizer_to(self.optimizer, device)
        return self

    def _ref_kl(self, batch: FlatBatch):
        """Extra-loss closure: kl_coef * KL(current || reference), exact for Gaussians; the mean
        over the minibatch is ``mean``'s (a rank's share of it under data parallelism)."""

        def fn(d: torch.distributions.Normal, idx: Tensor, mean) -> tuple[Tensor, float]:
            with torch.no_grad():
                ref = self.reference.dist(  # loc/scale [b, K, A]
                    batch.obs[idx], batch.actions[idx], batch.extras_of(idx)
                )
            kl = mean(torch.distributions.kl_divergence(d, ref).sum(dim=(1, 2)))  # []
            return self.cfg.kl_coef * kl, kl.item()

        return fn

    def _nothing_to_learn(self, seg: Segment, staleness: Tensor) -> dict[str, float]:
        """The update of a segment with no complete episode in a group: no gradient step (the
        version still advances, as every update's does), NaN losses, ``grpo_valid_frac`` 0,
        and a warning the first time, naming the fix."""
        if not self._warned_empty:
            self._warned_empty = True
            t_len, n = seg.shape
            log.warning(
                "GRPO: no complete episode in a group in this segment (%d decisions x %d envs), "
                "so this update learns nothing. GRPO scores whole episodes: give a segment room "
                "for one (rollout_steps x chunk_size >= the simulator's max_episode_steps), and "
                "group_size >= 2 envs per reset group",
                t_len,
                n,
            )
        self.policy.version += 1
        nan = math.nan
        return {
            "train/policy_loss": nan,
            "train/value_loss": 0.0,
            "train/entropy": nan,
            "train/approx_kl": nan,
            "train/clipfrac": nan,
            "train/behave_weight_mean": nan,
            "train/behave_dropped_frac": nan,
            "train/explained_variance": nan,
            "train/epochs_run": 0.0,
            "train/lr": float(self.optimizer.param_groups[0]["lr"]),
            "train/ref_kl": nan,
            "train/grpo_valid_frac": 0.0,
            "train/grpo_groups": 0.0,
            "pipeline/staleness_mean": float(staleness.mean()),
            "pipeline/staleness_max": float(staleness.max()),
        }

    def update(self, seg: Segment) -> dict[str, float]:
        """One GRPO update on a segment; returns ``train/*`` and ``pipeline/*`` metrics (a
        segment with no complete episode in a group: :meth:`_nothing_to_learn`)."""
        cfg, policy = self.cfg, self.policy
        device = next(policy.parameters()).device
        version = policy.version
        staleness = seg.staleness(version).float()  # [T, N]
        ea = episode_advantages(
            seg, seg.episode_step[0] == 0, cfg.group_size, cfg.reward, cfg.adv_eps
        )

        if not bool(ea.mask.any()):
            return self._nothing_to_learn(seg, staleness)
        seg = seg.to(device)
        mask = ea.mask.flatten().to(device)  # [T*N]
        obs = seg.obs.flatten(0, 1)[mask]  # [B, O], valid decisions only
        actions = seg.actions.flatten(0, 1)[mask]  # [B, K, A]
        extras = {k: v[mask] for k, v in seg.flat_extras().items()}  # name -> [B, ...]
        with torch.no_grad():  # in micro-batches, as the update's passes
            prox = torch.cat(
                [
                    policy.dist(obs[s], actions[s], {k: v[s] for k, v in extras.items()})
                    .log_prob(actions[s])
                    .sum(dim=2)
                    for s in row_slices(len(obs), self.micro_batch)
                ]
            )  # [B, K]
        behav = seg.logprob.flatten()[mask]  # [B]
        batch = FlatBatch(
            obs=obs,
            actions=actions,
            behav_logprob=behav,
            prox_logprob=prox,
            advantages=ea.advantages.flatten().to(device)[mask],
            returns=torch.zeros_like(behav),  # no critic
            n_steps=seg.n_steps.flatten()[mask],
            extras=extras,
        )
        w_mean, dropped = behaviour_stats(prox, behav, cfg.behave_weight_threshold)
        lr = anneal_lr(self.optimizer, cfg, seg.num_steps)
        stats = sgd_update(
            policy,
            self.optimizer,
            batch,
            cfg,
            target_kl=cfg.effective_target_kl(policy.spec.chunk_size),
            vf_coef=0.0,
            extra_loss=self._ref_kl(batch) if self.reference is not None else None,
            dp=self.dp,
            micro_batch=self.micro_batch,
        )
        policy.version += 1
        return {
            "train/policy_loss": stats["policy_loss"],
            "train/value_loss": 0.0,
            "train/entropy": stats["entropy"],
            "train/approx_kl": stats["approx_kl"],
            "train/clipfrac": stats["clipfrac"],
            "train/behave_weight_mean": w_mean,
            "train/behave_dropped_frac": dropped,
            "train/explained_variance": math.nan,  # no critic is trained
            "train/epochs_run": stats["epochs_run"],
            "train/lr": lr,
            "train/ref_kl": stats["extra_loss"],
            "train/grpo_valid_frac": float(ea.mask.float().mean()),
            "train/grpo_groups": float(ea.num_groups),
            "pipeline/staleness_mean": float(staleness.mean()),
            "pipeline/staleness_max": float(staleness.max()),
        }
