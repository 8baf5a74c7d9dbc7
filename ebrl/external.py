"""Stand-ins for what runs only on GPU clusters: the paper's VLA policies; RLinf's registries.

``conf/policy/{pi0,gr00t,openvla_oft,dreamzero}.yaml`` describe the paper's policies (model size,
action chunk, the package they need), so sweeps over them compose, validate and dry-run anywhere.
Building one never pretends: without a GPU or its package it raises :class:`UnavailableHere`
naming what is missing; with both, it says that these runs go through RLinf (the system EBRL
extends) rather than ebrl's in-process engine. ``ebrl.config.validate`` catches the same cases
earlier, before any work starts. (The paper's simulators have adapters: LIBERO its own,
``ebrl.envs.libero``; RoboCasa and BEHAVIOR RLinf's classes, ``ebrl.envs.rlinf_env``.)

:func:`rlinf_entry` resolves RLinf's registry functions for both adapters.
"""

from __future__ import annotations

from typing import Any

from ebrl.hardware import local_machine


class UnavailableHere(RuntimeError):
    """A policy or simulator this machine cannot build; the message says what to change."""


def rlinf_entry(override: Any, module: str, name: str, what: str, instead: str) -> Any:
    """One of RLinf's registry functions (``rlinf.models.get_model``, ``rlinf.envs.get_env_cls``),
    or the one ``override`` names (a callable, or a dotted path: the tests' CPU fakes).

    Raises:
        RuntimeError: RLinf is not importable; the message names ``what`` needed it, where to
            get RLinf and what to use ``instead``.
    """
    if callable(override):
        return override
    if override:
        from hydra.utils import get_method

        return get_method(override)
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise RuntimeError(
            f"{what} through RLinf's registry: RLinf is not importable here ({e}). "
            "`make test-rlinf` builds .venv-rlinf with the rlinf extra (~3.4 GB); run from that "
            f"interpreter, or use {instead}"
        ) from e


def _no_adapter(name: str, rlinf_name: str) -> NotImplementedError:
    why = (
        "ebrl's adapter over RLinf's model registry (ebrl.policies.rlinf_policy; "
        "policy=rlinf_mlp) gives a model the simulator's state, cameras and instruction and "
        "carries what its rollout hands its learner (forward_inputs), but this VLA is not "
        "configured through it yet (its checkpoint, input transforms and the state vector it "
        "was trained on)"
    )
    return NotImplementedError(
        f"policy={name}: {why}; the paper's GPU runs launch RLinf with the equivalent "
        f"configuration (RLinf name {rlinf_name!r}). On CPU use policy=transformer_l and "
        "simulator=pushcube."
    )


class GPUPolicy:
    """A GPU-only VLA (pi0, GR00T, OpenVLA-OFT, DreamZero): constructing it raises.

    Args:
        name: the policy option (``policy=<name>``).
        params_b: parameters, billions.
        package: import name of the package that implements it.
        install: how to install that package.
        rlinf_model: RLinf's model name for it.
        **info: the rest of the node (description, action chunk, ...) and the stage's ``spec``.
    """

    def __init__(
        self,
        *,
        name: str,
        params_b: float,
        package: str,
        install: str = "",
        rlinf_model: str = "",
        **info: Any,
    ) -> None:
        machine = local_machine()
        if not machine.cuda:
            raise UnavailableHere(
                f"policy={name} ({params_b:g}B parameters) runs only on an NVIDIA GPU and "
                f"{machine.where} has none usable (torch.cuda.is_available() is False): "
                "use policy=transformer_l (the VLA-shaped stand-in) on CPU, or run this sweep on "
                "a GPU cluster (python -m ebrl.launch --dry-run <sweep>_full)"
            )
        if machine.find_package is not None and machine.find_package(package) is None:
            raise UnavailableHere(
                f"policy={name} needs the Python package '{package}': {install or 'install it'}"
            )
        raise _no_adapter(name, rlinf_model)
