"""One interface for every policy: act on a batch of observations, emit an action chunk.

Policies are Gaussian over the whole chunk: ``actions [B, K, A]`` with a log-prob summed over
the K*A dimensions. Actions live in the env's box; the policy samples unbounded and the env
adapters clip (as ManiSkill's PPO baseline does), so the log-prob is of the unclipped sample.

A policy whose chunk cannot be scored from the observation and the chunk alone (a flow-matching
VLA scores the denoising chain that produced it) returns what else it needs as the chunk's
``extras`` (:class:`~ebrl.types.ActionChunk`); the learner hands them back to :meth:`Policy.dist`
and :meth:`Policy.evaluate` row for row. ebrl's own policies have none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ebrl.envs.layout import ObsLayout
from ebrl.types import ActionChunk, Extras, Observation


@dataclass(frozen=True, slots=True)
class PolicySpec:
    obs_dim: int
    action_dim: int
    chunk_size: int  # K
    #: the observation's parts (the simulator's; None: one ``states`` field of ``obs_dim``)
    layout: ObsLayout | None = None

    def obs_layout(self) -> ObsLayout:
        return self.layout or ObsLayout.flat(self.obs_dim)


@dataclass(slots=True)
class Evaluation:
    logprob: torch.Tensor  # [B] float32
    entropy: torch.Tensor  # [B] float32
    value: torch.Tensor  # [B] float32


class Policy(nn.Module):
    """Base class: subclasses implement :meth:`dist` and :meth:`value`.

    ``version`` counts weight updates; the generator stamps it on every chunk it emits.
    """

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__()
        self.spec = spec
        self.version = 0

    # -- to implement ---------------------------------------------------------------------------
    def dist(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor | None = None,
        extras: Extras | None = None,
    ) -> torch.distributions.Normal:
        """Per-dimension Gaussian over the chunk: loc/scale ``[B, K, A]``.

        ``actions [B, K, A]``: the chunk being scored. Policies that decode a chunk action by
        action (autoregressive) need it to condition action j on actions < j (teacher forcing);
        others ignore it. ``extras`` (name -> ``[B, ...]``): what :meth:`act` returned beside
        those chunks, for policies that need it to score them; others ignore it.
        """
        raise NotImplementedError

    def decode(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.distributions.Normal:
        """Generate: the chunk's Gaussian, sampling as it goes where a policy decodes action by
        action. The default is one pass (parallel decoding); ``noise [B, K, A]`` draws the sample
        ``mean + std * noise`` that :meth:`act` returns."""
        return self.dist(obs)

    def value(self, obs: torch.Tensor, extras: Extras | None = None) -> torch.Tensor:  # [B]
        """Critic value of ``obs [B, O]``. ``extras``: those of the chunk decided on ``obs``
        where there is one (the learner's value loss; a model whose value reads them), None
        for an observation alone (after a chunk)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------
    @torch.no_grad()
    def act(
        self,
        batch: Observation,
        deterministic: bool = False,
        noise: torch.Tensor | None = None,
    ) -> ActionChunk:
        """Sample an action chunk per observation (the generator's call).

        Args:
            batch: observations ``[B, O]``.
            deterministic: act with the mean.
            noise: standard-normal draws ``[B, K, A]`` to sample with (``mean + std * noise``);
                lets the caller make each env's samples independent of how envs were batched.
        """
        if noise is None:
            noise = torch.randn(
                batch.obs.shape[0],
                self.spec.chunk_size,
                self.spec.action_dim,
                device=batch.obs.device,
            )  # [B, K, A]
        if deterministic:
            noise = torch.zeros_like(noise)
        d = self.decode(batch.obs, noise)
        a = d.mean + d.stddev * noise
        return ActionChunk(
            actions=a,
            logprob=d.log_prob(a).sum(dim=(1, 2)),
            value=self.value(batch.obs),
            env_ids=batch.env_ids,
            policy_version=torch.full_like(batch.env_ids, self.version),
        )

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, extras: Extras | None = None
    ) -> Evaluation:
        """Log-prob, entropy and value of given chunks, with gradients (the learner's call);
        ``extras`` as :meth:`dist` takes them."""
        d = self.dist(obs, actions, extras)
        return Evaluation(
            logprob=d.log_prob(actions).sum(dim=(1, 2)),
            entropy=d.entropy().sum(dim=(1, 2)),
            value=self.value(obs, extras),
        )

    def get_weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, a detached CPU copy of the state dict)."""
        return self.version, {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}

    def set_weights(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        self.load_state_dict(weights)
        self.version = version
