"""The algo group's nodes (``conf/algo/``): each holds its algorithm's own config dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

from ebrl.algos.grpo import GRPOConfig
from ebrl.algos.ppo import PPOConfig


@dataclass
class PPONode:
    _target_: str = "ebrl.algos.ppo.PPO"
    #: PPO's hyperparameters (ebrl.algos.ppo.PPOConfig)
    cfg: PPOConfig = field(default_factory=PPOConfig)


@dataclass
class GRPONode:
    _target_: str = "ebrl.algos.grpo.GRPO"
    #: GRPO's hyperparameters (ebrl.algos.grpo.GRPOConfig)
    cfg: GRPOConfig = field(default_factory=GRPOConfig)
