"""MLP actor-critic over action chunks, initialised like CleanRL's and ManiSkill's PPO agents."""

from __future__ import annotations

import math

import torch
from torch import nn

from ebrl.policies.base import Policy, PolicySpec
from ebrl.types import Extras


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with gain ``std`` and constant bias (CleanRL's ``layer_init``)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def tanh_mlp(in_dim: int, out_dim: int, hidden: int, layers: int, head_std: float) -> nn.Sequential:
    """``layers`` Tanh layers of width ``hidden``, then a linear head with gain ``head_std``."""
    mods: list[nn.Module] = []
    d = in_dim
    for _ in range(layers):
        mods += [layer_init(nn.Linear(d, hidden)), nn.Tanh()]
        d = hidden
    mods.append(layer_init(nn.Linear(d, out_dim), std=head_std))
    return nn.Sequential(*mods)


class MLPPolicy(Policy):
    """Separate actor and critic MLPs; the actor emits the mean of the whole chunk.

    The actor head's small gain (0.01 * sqrt(2)) makes initial chunk means near zero; the log-std
    is a state-independent ``[K, A]`` parameter, as in ManiSkill's PPO baseline.

    Args:
        spec: observation/action dimensions and chunk size K.
        hidden: width of each hidden layer.
        layers: hidden layers per network.
        log_std_init: initial log standard deviation of every action dimension.
    """

    def __init__(
        self, spec: PolicySpec, hidden: int = 256, layers: int = 3, log_std_init: float = -0.5
    ) -> None:
        super().__init__(spec)
        k, a = spec.chunk_size, spec.action_dim
        self.actor = tanh_mlp(spec.obs_dim, k * a, hidden, layers, head_std=0.01 * math.sqrt(2))
        self.critic = tanh_mlp(spec.obs_dim, 1, hidden, layers, head_std=1.0)
        self.log_std = nn.Parameter(torch.full((k, a), float(log_std_init)))  # [K, A]

    def dist(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor | None = None,
        extras: Extras | None = None,  # none: the observation and the chunk score it
    ) -> torch.distributions.Normal:
        """Gaussian over the chunk; ``obs [B, O]`` -> loc/scale ``[B, K, A]``."""
        k, a = self.spec.chunk_size, self.spec.action_dim
        mean = self.actor(obs).view(-1, k, a)  # [B, K, A]
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))

    def value(self, obs: torch.Tensor, extras: Extras | None = None) -> torch.Tensor:  # [B]
        """Critic value of ``obs [B, O]`` (``extras``: none needed)."""
        return self.critic(obs).squeeze(-1)
