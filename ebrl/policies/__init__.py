"""Policies: one interface (:class:`Policy`), an MLP baseline and a VLA-shaped transformer."""

from ebrl.policies.base import Evaluation, Policy, PolicySpec
from ebrl.policies.mlp import MLPPolicy
from ebrl.policies.transformer import TransformerPolicy

__all__ = ["Evaluation", "MLPPolicy", "Policy", "PolicySpec", "TransformerPolicy"]
