"""What runs only on GPU clusters: the paper's VLA policies' preconditions; RLinf's registries.

``conf/policy/{pi0,pi05,gr00t,openvla_oft,dreamzero}.yaml`` are the paper's policies built by
RLinf's own model code (``ebrl.policies.rlinf_policy.RLinfPolicy``, ``vla_policy_schema``), so
sweeps over them compose, validate and dry-run anywhere. Building one never pretends: without a
GPU, its package or its checkpoint directory, :func:`vla_preflight` raises
:class:`UnavailableHere` naming what is missing and the fix before RLinf builds anything.
``ebrl.config.validate`` catches the same cases earlier, before any work starts. (The paper's
simulators have adapters: LIBERO its own, ``ebrl.envs.libero``; RoboCasa and BEHAVIOR RLinf's
classes, ``ebrl.envs.rlinf_env``.)

:func:`rlinf_entry` resolves RLinf's registry functions for both adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


#: the folder under which ``${ebrl.checkpoint:<hub id>}`` finds a checkpoint, by the id's last
#: part (``$EBRL_CHECKPOINTS/RLinf-Pi0-LIBERO-Spatial-Object-Goal-SFT``)
CHECKPOINTS_ENV = "EBRL_CHECKPOINTS"


def checkpoint_dir(hub_id: str) -> str | None:
    """``${ebrl.checkpoint:<hub id>}``: where the checkpoint ``hub_id`` was downloaded to,
    ``$EBRL_CHECKPOINTS/<its last part>``; None (not given) when EBRL_CHECKPOINTS is unset."""
    import os

    root = os.environ.get(CHECKPOINTS_ENV)
    if not root or not hub_id:
        return None
    return os.path.join(root, str(hub_id).rstrip("/").rsplit("/", 1)[-1])


def _get(node: Any, key: str, default: Any = None) -> Any:
    return node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)


def local_dirs(node: Any) -> dict[str, str]:
    """The directories a VLA node reads: ``model_cfg`` key -> the hub id it is downloaded from
    (``model_path`` its ``checkpoint``, then ``more_checkpoints``, then ``lora_path`` when LoRA
    adapters are loaded)."""
    out = {"model_path": str(_get(node, "checkpoint", "") or "")}
    out.update({str(k): str(v) for k, v in (_get(node, "more_checkpoints") or {}).items()})
    cfg = _get(node, "model_cfg") or {}
    if _get(cfg, "is_lora") and _get(cfg, "lora_path"):
        out["lora_path"] = str(_get(node, "lora_checkpoint", "") or "its LoRA adapters")
    return out


def checkpoint_problem(
    node: Any, path_exists: Callable[[str], bool] | None, where: str = "this machine"
) -> str | None:
    """What is wrong with a VLA node's checkpoint directories (None: nothing, or nothing that
    can be told without seeing the machine): not given, a hub id or URL instead of a directory,
    or (where ``path_exists`` is known) absent. Jobs never download from the hub."""
    name = _get(node, "name", "?")
    cfg = _get(node, "model_cfg") or {}
    for key, hub in local_dirs(node).items():
        value = _get(cfg, key)
        tail = hub.rstrip("/").rsplit("/", 1)[-1]
        fetch = (
            f"download it where there is internet (huggingface-cli download {hub} --local-dir "
            f"$EBRL_CHECKPOINTS/{tail}) and set {CHECKPOINTS_ENV} to the folder that holds it, "
            f"or policy.model_cfg.{key}=<that directory>; jobs never download from the hub"
        )
        if not value:
            return (
                f"policy={name}: its checkpoint {hub} is not given (policy.model_cfg.{key} is "
                f"null): {fetch}"
            )
        value = str(value)
        if "://" in value or value == hub:
            return (
                f"policy={name}: policy.model_cfg.{key}={value} names the hub, not a local "
                f"directory: {fetch}"
            )
        if path_exists is not None and not path_exists(value):
            return (
                f"policy={name}: policy.model_cfg.{key}={value} does not exist on {where}: {fetch}"
            )
    return None


def vla_preflight(node: Mapping[str, Any]) -> None:
    """What a GPU-only VLA node needs, checked on this machine before RLinf builds anything
    (``ebrl.config.validate`` checks the same earlier): a usable GPU, its package, its
    checkpoint directories.

    Raises:
        UnavailableHere: naming what is missing and the fix.
    """
    machine = local_machine()
    name = node.get("name", "?")
    if node.get("requires_gpu") and not machine.cuda:
        raise UnavailableHere(
            f"policy={name} ({float(node.get('params_b') or 0):g}B parameters) runs only on an "
            f"NVIDIA GPU and {machine.where} has none usable (torch.cuda.is_available() is "
            "False): use policy=transformer_l (the VLA-shaped stand-in) on CPU, or run this "
            "sweep on a GPU cluster (python -m ebrl.launch --dry-run <sweep>_full)"
        )
    package = node.get("package")
    if package and machine.find_package is not None and machine.find_package(package) is None:
        raise UnavailableHere(
            f"policy={name} needs the Python package '{package}': "
            f"{node.get('install') or 'install it'}"
        )
    problem = checkpoint_problem(node, machine.path_exists, machine.where)
    if problem is not None:
        raise UnavailableHere(problem)
