"""Returns and advantages for chunk-level credit assignment; pure torch functions, time-major.

One decision is one transition (see :mod:`ebrl.types`): its reward is the discounted sum of the
per-step rewards of the actions actually executed, and its discount to the next decision is
``gamma ** n_steps``. GAE then runs over decisions exactly as it does over single steps, with the
per-decision discount in place of ``gamma``.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def chunk_returns(reward: Tensor, n_steps: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """Discounted reward of each decision and its discount to the next decision.

    Args:
        reward: ``[T, N, K]`` per-step rewards of each chunk (zero after the chunk ended early).
        n_steps: ``[T, N]`` int, actions actually executed, 1..K.
        gamma: per-step discount factor.

    Returns:
        ``(R, discount)``, both ``[T, N]``: ``R = sum_{j < n} gamma^j r_j`` and
        ``discount = gamma ** n``.
    """
    k = reward.shape[-1]
    j = torch.arange(k, device=reward.device)  # [K]
    powers = torch.full((k,), gamma, dtype=reward.dtype, device=reward.device).pow(j)  # [K]
    # Mask by n_steps even though adapters zero the tail: a stray reward after an episode ended
    # belongs to the next episode and must not leak into this decision.
    live = j < n_steps.unsqueeze(-1)  # [T, N, K] bool
    ret = (reward * powers * live).sum(dim=-1)  # [T, N]
    discount = torch.full_like(ret, gamma).pow(n_steps.to(ret.dtype))  # [T, N]
    return ret, discount


def gae(
    ret: Tensor,
    discount: Tensor,
    value: Tensor,
    next_value: Tensor,
    done: Tensor,
    bootstrap: Tensor,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over decisions.

    ``delta_t = R_t + discount_t * bootstrap_t * next_value_t - V_t`` and
    ``A_t = delta_t + discount_t * lam * (1 - done_t) * A_{t+1}`` with ``A_T = 0``: the segment's
    last decision relies on ``next_value`` alone, so no value of the row after the segment is
    needed. ``next_value_t`` is the value of the observation reached after decision t, before any
    reset (``final_obs``), so it is also the right bootstrap at an episode end.

    Args:
        ret: ``[T, N]`` decision rewards (see :func:`chunk_returns`).
        discount: ``[T, N]`` decision discounts, ``gamma ** n_steps``.
        value: ``[T, N]`` V(obs_t).
        next_value: ``[T, N]`` V(final_obs_t).
        done: ``[T, N]`` bool, the episode ended inside decision t (terminated or truncated).
        bootstrap: ``[T, N]`` bool, whether to bootstrap from ``next_value_t``. Always on
            truncation and mid-episode; on termination only if the algorithm says so.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, both ``[T, N]``; ``returns = advantages + value``.
    """
    t_len = ret.shape[0]
    not_done = (~done).to(ret.dtype)  # [T, N]
    delta = ret + discount * bootstrap.to(ret.dtype) * next_value - value  # [T, N]
    adv = torch.zeros_like(ret)  # [T, N]
    last = torch.zeros_like(ret[0])  # [N], A_{t+1}
    for t in reversed(range(t_len)):
        last = delta[t] + discount[t] * lam * not_done[t] * last
        adv[t] = last
    return adv, adv + value


def group_relative_advantages(
    episode_return: Tensor, group_key: Tensor, eps: float = 1e-6, min_group: int = 2
) -> tuple[Tensor, Tensor]:
    """GRPO advantages: each episode's return standardised within its group.

    ``A = (R - mean_group) / (std_group + eps)`` with the sample standard deviation (Bessel's
    correction, as ``torch.std`` in TRL's and verl's GRPO). Groups with fewer than ``min_group``
    episodes have no baseline and are dropped. A group whose returns are all equal gets A = 0:
    it stays valid but carries no signal.

    Args:
        episode_return: ``[E]`` float, return (or success) of each complete episode.
        group_key: ``[E]`` or ``[E, D]`` int, episodes with equal keys form a group.
        eps: added to the group std.
        min_group: smallest group that keeps its episodes.

    Returns:
        ``(advantages, valid)``: ``[E]`` float (0 where invalid) and ``[E]`` bool.
    """
    e = episode_return.shape[0]
    if e == 0:
        return episode_return.clone(), torch.zeros(0, dtype=torch.bool, device=group_key.device)
    _, inv = torch.unique(group_key, dim=0, return_inverse=True)  # inv: [E] group index
    g = int(inv.max()) + 1
    x = episode_return.to(torch.float64)  # [E], float64 so sums of squares stay exact enough
    count = torch.zeros(g, dtype=x.dtype, device=x.device).index_add_(0, inv, torch.ones_like(x))
    mean = torch.zeros_like(count).index_add_(0, inv, x) / count  # [G]
    sq = torch.zeros_like(count).index_add_(0, inv, (x - mean[inv]) ** 2)  # [G]
    std = (sq / (count - 1).clamp(min=1)).sqrt()  # [G], sample std
    valid = count[inv] >= min_group  # [E]
    adv = (x - mean[inv]) / (std[inv] + eps)  # [E]
    adv = torch.where(valid, adv, torch.zeros_like(adv))
    return adv.to(episode_return.dtype), valid
