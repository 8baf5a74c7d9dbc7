"""Behaviour cloning of ebrl's own policies on demonstrations, chunk by chunk.

A demonstration set is a flat table of decisions: per env step the observation ``[O]`` the
policy would have seen, the action ``[A]`` the demonstrator took and its episode's index. The
target of step ``t`` is the chunk the demonstrator took from it, ``actions[t : t + K]`` within
the episode, its last action repeated past the episode's end (the expert holds still there).

Cloning fits the mean of the policy's chunk Gaussian (its ``dist``; an autoregressive policy is
teacher-forced on the chunk, as PPO scores one) by mean squared error; the critic is left as
initialised. Then the log-std is set to the log of the residual's root mean square per chunk
position and action dimension, clipped to ``[min_std, max_std]``: the Gaussian that best
explains the demonstrations given the mean, so PPO starts by exploring about where the cloned
mean is unsure, no wider.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ebrl.policies.base import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CloneConfig:
    """Optimisation of the cloned mean, and the bounds of the log-std set after it."""

    epochs: int = 200
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    min_std: float = 0.05
    max_std: float = 0.5
    seed: int = 0
    #: torch threads while training
    threads: int = 1


def chunk_targets(actions: np.ndarray, episode: np.ndarray, k: int) -> np.ndarray:
    """The chunk of ``k`` actions the demonstrator took from each step: ``[N, A]`` -> ``[N, K, A]``.

    Rows of one episode are contiguous and in step order (``episode`` ``[N]`` their index);
    past an episode's last step its last action is repeated.

    Raises:
        ValueError: the rows of an episode are not contiguous, or shapes disagree.
    """
    actions = np.asarray(actions, dtype=np.float32)
    episode = np.asarray(episode)
    n = actions.shape[0]
    if episode.shape != (n,):
        raise ValueError(f"chunk_targets: episode {episode.shape} does not index {n} actions")
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]])
    if len(np.unique(episode)) != len(starts):
        raise ValueError("chunk_targets: an episode's rows are not contiguous")
    ends = np.r_[starts[1:], n]  # exclusive end of each row's episode
    last = np.repeat(ends - 1, ends - starts)  # [N] index of the episode's last step
    idx = np.minimum(np.arange(n)[:, None] + np.arange(k)[None, :], last[:, None])  # [N, K]
    return actions[idx]


def clone(
    policy: Policy, obs: np.ndarray, chunks: np.ndarray, cfg: CloneConfig | None = None
) -> dict[str, float]:
    """Fit ``policy``'s chunk mean to ``chunks`` ``[N, K, A]`` from ``obs`` ``[N, O]``, then
    set its log-std (see the module). The policy's version is left at 0.

    Returns:
        ``bc/mse`` (the last epoch's), ``bc/mse_first`` (the first's), ``bc/std_mean``,
        ``bc/seconds``, ``bc/epochs`` and ``bc/samples``.

    Raises:
        ValueError: shapes that do not fit the policy's spec, or a policy without a ``log_std``
            parameter of shape ``[K, A]``.
    """
    cfg = cfg or CloneConfig()
    spec = policy.spec
    n = obs.shape[0]
    if obs.shape != (n, spec.obs_dim) or chunks.shape != (n, spec.chunk_size, spec.action_dim):
        raise ValueError(
            f"clone: observations {obs.shape} and chunks {chunks.shape} do not fit the policy "
            f"(obs_dim={spec.obs_dim}, chunk_size={spec.chunk_size}, "
            f"action_dim={spec.action_dim}); demonstrations and policy must come from the "
            "same simulator settings and chunk_size"
        )
    log_std = getattr(policy, "log_std", None)
    if not isinstance(log_std, torch.nn.Parameter) or tuple(log_std.shape) != (
        spec.chunk_size,
        spec.action_dim,
    ):
        raise ValueError(
            f"clone: {type(policy).__name__} has no log_std parameter [K, A]; behaviour cloning "
            "sets the Gaussian's scale there (ebrl's mlp and transformer policies have one)"
        )
    t0 = time.perf_counter()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, cfg.threads))
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.as_tensor(obs, dtype=torch.float32)
    y = torch.as_tensor(chunks, dtype=torch.float32)
    params = [p for name, p in policy.named_parameters() if name != "log_std"]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = cfg.epochs * math.ceil(n / cfg.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps))
    policy.train()
    first = last = float("nan")
    try:
        for epoch in range(cfg.epochs):
            perm = torch.randperm(n, generator=gen)
            total = 0.0
            for at in range(0, n, cfg.batch_size):
                rows = perm[at : at + cfg.batch_size]
                mean = policy.dist(x[rows], y[rows]).mean  # [b, K, A]
                loss = torch.nn.functional.mse_loss(mean, y[rows])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                total += float(loss.detach()) * len(rows)
            last = total / n
            if epoch == 0:
                first = last
            if epoch % max(1, cfg.epochs // 10) == 0 or epoch == cfg.epochs - 1:
                log.info("bc epoch %d/%d: mse %.5f", epoch + 1, cfg.epochs, last)
        policy.eval()
        with torch.no_grad():
            sq = torch.zeros(spec.chunk_size, spec.action_dim)
            for at in range(0, n, cfg.batch_size):
                mean = policy.dist(x[at : at + cfg.batch_size], y[at : at + cfg.batch_size]).mean
                sq += ((mean - y[at : at + cfg.batch_size]) ** 2).sum(0)
            std = (sq / n).sqrt().clamp(cfg.min_std, cfg.max_std)  # [K, A]
            log_std.copy_(std.log())
    finally:
        torch.set_num_threads(prev_threads)
    policy.version = 0
    return {
        "bc/mse": last,
        "bc/mse_first": first,
        "bc/std_mean": float(std.mean()),
        "bc/seconds": time.perf_counter() - t0,
        "bc/epochs": float(cfg.epochs),
        "bc/samples": float(n),
    }
