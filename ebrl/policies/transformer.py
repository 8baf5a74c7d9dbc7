"""A small VLA-shaped policy: observation tokens + action-query tokens through a transformer.

The flat state observation stands in for a VLA's vision-language tokens: it is cut into
``obs_tokens`` pieces, each embedded by a shared linear layer plus a learned position embedding.
K action tokens follow, a pre-LN encoder mixes all tokens, and a linear head reads one action
mean from each action token. Two decodings, as VLAs have:

- ``autoregressive`` (the default; OpenVLA's shape): action j is generated from the observation
  and actions < j, so generation runs K passes (no KV cache: each pass recomputes its prefix, as a
  cache-less VLA server does) while training scores a whole chunk in one teacher-forced pass with
  a causal mask. Generation then costs a multiple of a training forward pass, as it does for VLAs.
- ``parallel`` (ACT / OpenVLA-OFT): K learned queries, one pass for both.

The log-prob of a chunk is the sum of its actions' conditional Gaussian log-probs either way.
The critic is a separate MLP on the raw observation: value learning from
the shared trunk is unstable at these sizes and the critic is not what we are measuring.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ebrl.policies.base import Policy, PolicySpec
from ebrl.policies.mlp import layer_init, tanh_mlp
from ebrl.types import Extras

#: size name -> (d_model, layers, heads). Chosen from timings on this machine's CPU (one torch
#: thread, K=4, A=8, O=35, autoregressive decoding): one decision of 16 envs costs ~70 ms of
#: PushCube simulation; act() on 16 observations costs ~7 ms (S), ~25 ms (M) and ~65 ms (L: the
#: size where generation costs about as much as simulation, as VLA generation does on GPUs).
#: Training one minibatch of 200 chunks: ~50 ms (S), ~240 ms (M), ~600 ms (L).
SIZES: dict[str, tuple[int, int, int]] = {
    "S": (64, 2, 4),
    "M": (128, 4, 4),
    "L": (192, 6, 6),
}
#: the trunk's parameter dtype by its config name
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


class TransformerPolicy(Policy):
    """Transformer actor over observation and action-query tokens, MLP critic.

    Args:
        spec: observation/action dimensions and chunk size K.
        size: preset ``"S" | "M" | "L"`` (see :data:`SIZES`).
        d_model: override the preset's model width.
        layers: override the preset's encoder depth.
        heads: override the preset's attention heads (must divide d_model).
        obs_tokens: tokens the observation is cut into (zero-padded to a multiple).
        decoding: ``"autoregressive"`` or ``"parallel"`` (see the module docstring).
        log_std_init: initial log standard deviation of every action dimension.
        critic_hidden: width of the critic MLP.
        critic_layers: hidden layers of the critic MLP.
        dtype: ``"fp32"`` or ``"bf16"``: the actor's trunk (embeddings, encoder, action head)
            in bfloat16, as VLAs are served and trained; the critic, the log-std and every
            log-prob stay float32 (PPO's ratios need them exact).
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
        decoding: str = "autoregressive",
        log_std_init: float = -0.5,
        critic_hidden: int = 256,
        critic_layers: int = 3,
        dtype: str = "fp32",
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
        decoding = str(getattr(decoding, "value", decoding))
        if decoding not in ("autoregressive", "parallel"):
            raise ValueError(f"TransformerPolicy: decoding={decoding!r}: autoregressive|parallel")
        self.autoregressive = decoding == "autoregressive" and k > 1
        # autoregressive: token j carries the previous action (a learned start token for j = 0)
        self.prev_action = nn.Linear(a, d)
        self.start = nn.Parameter(torch.randn(d) * 0.02)  # [d]
        s_ = self.obs_tokens
        mask = torch.zeros(s_ + k, s_ + k, dtype=torch.bool)  # True = may not attend
        if self.autoregressive:
            mask[:s_, s_:] = True  # observation tokens never see actions
            mask[s_:, s_:] = torch.triu(torch.ones(k, k, dtype=torch.bool), diagonal=1)
        self.register_buffer("attn_mask", mask, persistent=False)
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
        dtype = str(getattr(dtype, "value", dtype))
        if dtype not in DTYPES:
            raise ValueError(f"TransformerPolicy: dtype={dtype!r}: one of {list(DTYPES)}")
        self.trunk_dtype = DTYPES[dtype]
        for part in (self.obs_embed, self.prev_action, self.encoder, self.action_head):
            part.to(self.trunk_dtype)
        for name in ("obs_pos", "action_queries", "start"):
            getattr(self, name).data = getattr(self, name).data.to(self.trunk_dtype)

    def _tokens(self, obs: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        """Observation tokens + action tokens -> ``[B, S + J, d]``.

        ``prev [B, J - 1, A]``: actions before tokens 1..J-1 (autoregressive); None: all K tokens
        are bare queries (parallel decoding).
        """
        b = obs.shape[0]
        obs = obs.to(self.trunk_dtype)
        x = nn.functional.pad(obs, (0, self.pad))  # [B, S * P]
        x = self.obs_embed(x.view(b, self.obs_tokens, self.token_dim)) + self.obs_pos  # [B, S, d]
        if prev is None:
            q = self.action_queries.unsqueeze(0).expand(b, -1, -1)  # [B, K, d]
        else:
            j = prev.shape[1] + 1
            carry = torch.cat(
                [self.start.expand(b, 1, -1), self.prev_action(prev.to(self.trunk_dtype))], dim=1
            )  # [B, J, d]
            q = self.action_queries[:j].unsqueeze(0) + carry  # [B, J, d]
        return torch.cat([x, q], dim=1)

    def _means(self, obs: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        tokens = self._tokens(obs, prev)  # [B, S + J, d]
        n = tokens.shape[1]
        h = self.encoder(tokens, mask=self.attn_mask[:n, :n])  # [B, S + J, d]
        return self.action_head(h[:, self.obs_tokens :]).float()  # [B, J, A], float32

    def _normal(self, mean: torch.Tensor) -> torch.distributions.Normal:
        k = mean.shape[1]
        return torch.distributions.Normal(mean, self.log_std[:k].exp().expand_as(mean))

    def dist(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor | None = None,
        extras: Extras | None = None,  # none: the observation and the chunk score it
    ) -> torch.distributions.Normal:
        """Gaussian over the chunk; ``obs [B, O]`` -> loc/scale ``[B, K, A]``.

        Autoregressive: the means of action j given ``actions[:, :j]`` (one teacher-forced pass).
        """
        if not self.autoregressive:
            return self._normal(self._means(obs, None))
        if actions is None:
            raise ValueError("autoregressive TransformerPolicy.dist needs the chunk's actions")
        return self._normal(self._means(obs, actions[:, :-1]))

    def decode(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.distributions.Normal:
        """Generate action by action: K passes, each sampling ``mean + std * noise[:, j]``."""
        if not self.autoregressive:
            return self.dist(obs)
        std = self.log_std.exp()  # [K, A]
        actions = obs.new_zeros(obs.shape[0], 0, self.spec.action_dim)  # [B, 0, A]
        means = []
        for j in range(self.spec.chunk_size):
            mean_j = self._means(obs, actions)[:, -1]  # [B, A]
            means.append(mean_j)
            a_j = mean_j + std[j] * noise[:, j]  # [B, A]
            actions = torch.cat([actions, a_j.unsqueeze(1)], dim=1)
        return self._normal(torch.stack(means, dim=1))

    def value(self, obs: torch.Tensor, extras: Extras | None = None) -> torch.Tensor:  # [B]
        """Critic value of ``obs [B, O]`` (``extras``: none needed)."""
        return self.critic(obs).squeeze(-1)
