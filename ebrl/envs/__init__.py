"""Simulators behind one interface (:class:`Env`) and the chunked env group that steps them.

``ManiSkillEnv`` and ``LiberoEnv`` are imported lazily (on first attribute access) so that importing
``ebrl.envs`` never needs ManiSkill, SAPIEN, a Vulkan driver, LIBERO or MuJoCo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ebrl.envs.base import Env, EnvGroup, EnvSpec, StepResult, reset_seed
from ebrl.envs.fake import CountingEnv
from ebrl.envs.synthetic import SyntheticCostEnv
from ebrl.envs.vulkan import ensure_vulkan

if TYPE_CHECKING:
    from ebrl.envs.libero import LiberoEnv
    from ebrl.envs.maniskill import ManiSkillEnv

__all__ = [
    "CountingEnv",
    "Env",
    "EnvGroup",
    "EnvSpec",
    "LiberoEnv",
    "ManiSkillEnv",
    "StepResult",
    "SyntheticCostEnv",
    "ensure_vulkan",
    "reset_seed",
]


def __getattr__(name: str) -> Any:
    if name == "ManiSkillEnv":
        from ebrl.envs.maniskill import ManiSkillEnv

        return ManiSkillEnv
    if name == "LiberoEnv":
        from ebrl.envs.libero import LiberoEnv

        return LiberoEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
