"""A small VLA-shaped policy: observation tokens + action-query tokens through a transformer.

The flat state observation stands in for a VLA's vision-language tokens: it is cut into
``obs_tokens`` pieces, each embedded by a shared linear layer plus a learned position embedding.
K learned action-query tokens are appended, a pre-LN encoder mixes all tokens, and a linear
action-chunk head reads one action mean from each query's output (as ACT / OpenVLA-OFT style
parallel decoding does). The critic is a separate MLP on the raw observation: value learning from
the shared trunk is unstable at these sizes and the critic is not what we are measuring.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ebrl.policies.base import Policy, PolicySpec
from ebrl.policies.mlp import layer_init, tanh_mlp

#: size name -> (d_model, layers, heads). Chosen from act() timings on this machine's CPU (one
#: torch thread, K=4, A=8, O=35): one decision of 16 envs costs ~75 ms of PushCube simulation, and
#: act() on 16 observations costs ~1.5 ms (S, 2% of sim), ~7 ms (M, 10%), ~68 ms (L, ~90%: the
#: size where generation costs about as much as simulation). d=256 x 6 layers sits between M and L
#: (~27 ms); use the explicit overrides for it.
SIZES: dict[str, tuple[int, int, int]] = {
    "S": (64, 2, 4),
    "M": (128, 4, 4),
    "L": (384, 8, 6),
}


class TransformerPolicy(Policy):
    """Transformer actor over observation and action-query tokens, MLP critic.

    Args:
        spec: observation/action dimensions and chunk size K.
        size: preset ``"S" | "M" | "L"`` (see :data:`SIZES`).
        d_model: override the preset's model width.
        layers: override the preset's encoder depth.
        heads: override the preset's attention heads (must divide d_model).
        obs_tokens: tokens the observation is cut into (zero-padded to a multiple).
        log_std_init: initial log standard deviation of every action dimension.
        critic_hidden: width of the critic MLP.
        critic_layers: hidden layers of the critic MLP.
    """

    def __init__(
        self,
        spec: PolicySpec,
        size: str = "S",
        *,
        d_model: int | None = None,
        layers: int | None = None,
        heads: int | None = None,
        obs_tokens: int = 8,
        log_std_init: float = -0.5,
        critic_hidden: int = 256,
        critic_layers: int = 3,
    ) -> None:
        super().__init__(spec)
        size = str(getattr(size, "value", size))  # accept a str Enum member from a config schema
        if size not in SIZES:
            raise ValueError(f"TransformerPolicy: size must be one of {list(SIZES)}, got {size!r}")
        d0, l0, h0 = SIZES[size]
        d, n_layers, n_heads = d_model or d0, layers or l0, heads or h0
        if d % n_heads:
            raise ValueError(f"TransformerPolicy: heads ({n_heads}) must divide d_model ({d})")
        k, a = spec.chunk_size, spec.action_dim
        self.obs_tokens = max(1, min(obs_tokens, spec.obs_dim))
        self.token_dim = math.ceil(spec.obs_dim / self.obs_tokens)  # P, features per obs token
        self.pad = self.obs_tokens * self.token_dim - spec.obs_dim

        self.obs_embed = nn.Linear(self.token_dim, d)
        self.obs_pos = nn.Parameter(torch.randn(self.obs_tokens, d) * 0.02)  # [S, d]
        self.action_queries = nn.Parameter(torch.randn(k, d) * 0.02)  # [K, d]
        layer = nn.TransformerEncoderLayer(
            d_model=d,
            nhead=n_heads,
            dim_feedforward=4 * d,
            dropout=0.0,  # RL: dropout would make act() and evaluate() disagree on log-probs
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        # Pre-LN leaves the residual stream unnormalised: a final LayerNorm before the head.
        self.encoder = nn.TransformerEncoder(
            layer, n_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False
        )
        # Small head so initial chunk means are near zero (|mean| ~0.01), exactly like the MLP's.
        # Not N(0, 0.01) per weight: the final LayerNorm feeds unit-scale features, so that
        # gives means of ~0.01 * sqrt(d), 0.06 (S) to 0.17 (L), shared across observations.
        self.action_head = layer_init(nn.Linear(d, a), std=0.01 * math.sqrt(2))
        self.critic = tanh_mlp(spec.obs_dim, 1, critic_hidden, critic_layers, head_std=1.0)
        self.log_std = nn.Parameter(torch.full((k, a), float(log_std_init)))  # [K, A]
        self.d_model, self.num_layers, self.num_heads = d, n_layers, n_heads

    def _tokens(self, obs: torch.Tensor) -> torch.Tensor:  # [B, S + K, d]
        b = obs.shape[0]
        x = nn.functional.pad(obs, (0, self.pad))  # [B, S * P]
        x = self.obs_embed(x.view(b, self.obs_tokens, self.token_dim)) + self.obs_pos  # [B, S, d]
        q = self.action_queries.unsqueeze(0).expand(b, -1, -1)  # [B, K, d]
        return torch.cat([x, q], dim=1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        """Gaussian over the chunk; ``obs [B, O]`` -> loc/scale ``[B, K, A]``."""
        k = self.spec.chunk_size
        h = self.encoder(self._tokens(obs))  # [B, S + K, d]
        mean = self.action_head(h[:, -k:])  # [B, K, A]
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))

    def value(self, obs: torch.Tensor) -> torch.Tensor:  # [B]
        """Critic value of ``obs [B, O]``."""
        return self.critic(obs).squeeze(-1)
