"""Learners (decoupled PPO, GRPO) and their pure return/advantage functions."""

from ebrl.algos.grpo import GRPO, GRPOConfig, episode_advantages
from ebrl.algos.loss import decoupled_ppo_loss
from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.algos.returns import chunk_returns, gae, group_relative_advantages

__all__ = [
    "GRPO",
    "PPO",
    "GRPOConfig",
    "PPOConfig",
    "chunk_returns",
    "decoupled_ppo_loss",
    "episode_advantages",
    "gae",
    "group_relative_advantages",
]
