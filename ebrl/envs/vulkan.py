"""Point the Vulkan loader at a driver SAPIEN accepts, before ManiSkill creates its first env.

SAPIEN creates a Vulkan device even for state observations on CPU physics, so a machine without a
GPU needs a CPU Vulkan driver (Mesa >= 24 lavapipe; older lavapipe is rejected). The repository's
``scripts/setup_vulkan.sh`` installs one project-locally and writes an ICD file; this module finds
that file and exports ``VK_ICD_FILENAMES`` for the current process (the loader reads it when the
first Vulkan instance is created, so setting it in ``os.environ`` before ``gym.make`` suffices).
"""

from __future__ import annotations

import os
from pathlib import Path

_ICD_NAME = "lvp_icd.json"
#: repository root: ebrl/envs/vulkan.py -> parents[2]
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _candidates() -> list[Path]:
    """ICD files to try, most explicit first."""
    out = []
    if d := os.environ.get("EBRL_VULKAN_DIR"):
        out.append(Path(d).expanduser() / _ICD_NAME)
    out.append(_REPO_ROOT / ".cache" / "vulkan" / _ICD_NAME)
    return out


def ensure_vulkan() -> str:
    """Make sure ``VK_ICD_FILENAMES`` names an existing Vulkan ICD file; return its value.

    Keeps a ``VK_ICD_FILENAMES`` that is already set and points at existing file(s); otherwise
    uses ``$EBRL_VULKAN_DIR/lvp_icd.json`` or ``<repo root>/.cache/vulkan/lvp_icd.json``.

    Raises:
        RuntimeError: no usable ICD file was found; the message says how to install one.
    """
    current = os.environ.get("VK_ICD_FILENAMES", "")
    # The loader accepts a path list; keep the user's choice only if every entry exists, since a
    # stale path makes SAPIEN fail later with an opaque "ErrorIncompatibleDriver".
    if current and all(Path(p).is_file() for p in current.split(os.pathsep) if p):
        return current
    tried = _candidates()
    for icd in tried:
        if icd.is_file():
            os.environ["VK_ICD_FILENAMES"] = str(icd)
            return str(icd)
    stale = f" (VK_ICD_FILENAMES={current!r} names no existing file)" if current else ""
    raise RuntimeError(
        "ManiSkill/SAPIEN needs a Vulkan driver even for state observations, and none was found"
        f"{stale}. Looked for: {', '.join(str(p) for p in tried)}. Fix: run `make setup` or "
        "`scripts/setup_vulkan.sh` in the repository (installs Mesa lavapipe into .cache/vulkan), "
        "or set EBRL_VULKAN_DIR to a folder holding lvp_icd.json, or set VK_ICD_FILENAMES to the "
        "ICD json of a Vulkan driver new enough for SAPIEN (a GPU driver, or Mesa >= 24 lavapipe)."
    )
