"""The weights a run starts from (``init_checkpoint=<file>``): a fresh run, not a resumed one.

Any file of ebrl's that holds a policy state dict under ``"policy"`` starts a run: a behaviour
cloned policy (:func:`save_init_checkpoint`), a run's ``checkpoint.pt`` or one of its weight
snapshots. Only the weights are taken: the learner's version starts at 0, its optimiser, its
random state and its step counters are fresh (``checkpoint.resume`` is what continues a run).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ebrl.policies.base import Policy

#: the key of the file's policy state dict (the learner's checkpoints and snapshots use it too)
POLICY = "policy"


def save_init_checkpoint(path: str | Path, policy: Policy, meta: dict[str, Any]) -> Path:
    """Write ``policy``'s weights as a run's starting point (atomic).

    Args:
        path: the file to write.
        policy: the policy whose state dict is saved (CPU copies).
        meta: what made it (the policy config, chunk size, dims, data), kept under ``"meta"``
            and quoted by the error when a run's policy does not match the weights.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
    tmp = path.with_suffix(path.suffix + ".tmp")
    # plain values only (a config node's enums become their names): torch's weights-only
    # loader, which every run uses, refuses other classes
    plain = json.loads(json.dumps(dict(meta), default=str))
    torch.save({"version": 0, POLICY: state, "meta": plain}, tmp)
    os.replace(tmp, path)
    return path


def load_init_weights(policy: Policy, path: str | Path) -> dict[str, Any]:
    """Load the weights of ``path`` into ``policy`` (its version stays 0); returns the file's
    ``meta`` (``{}`` for a run's checkpoint).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not an ebrl policy file, or its weights do not fit ``policy`` (the message
            lists the parameters that differ and what the file was made with).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"init_checkpoint={path}: no such file; give the path of a behaviour-cloned policy "
            "(python -m ebrl.sft.libero clone) or of a run's checkpoint.pt, or set "
            "init_checkpoint=null to start from a fresh policy"
        )
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or not isinstance(blob.get(POLICY), dict):
        raise ValueError(
            f"init_checkpoint={path}: not an ebrl policy file (no '{POLICY}' state dict); give "
            "a behaviour-cloned policy or a run's checkpoint.pt"
        )
    weights: dict[str, torch.Tensor] = blob[POLICY]
    meta = blob.get("meta") or {}
    own = policy.state_dict()
    missing = sorted(set(own) - set(weights))
    extra = sorted(set(weights) - set(own))
    shapes = [
        f"{k}: file {tuple(weights[k].shape)}, policy {tuple(v.shape)}"
        for k, v in own.items()
        if k in weights and tuple(weights[k].shape) != tuple(v.shape)
    ]
    if missing or extra or shapes:
        made = f" (the file was made with {meta})" if meta else ""
        diff = "; ".join(
            part
            for part in (
                f"missing {missing[:5]}" if missing else "",
                f"unexpected {extra[:5]}" if extra else "",
                ", ".join(shapes[:5]),
            )
            if part
        )
        raise ValueError(
            f"init_checkpoint={path} does not fit this run's policy "
            f"({type(policy).__name__}, chunk_size={policy.spec.chunk_size}, "
            f"obs_dim={policy.spec.obs_dim}, action_dim={policy.spec.action_dim}): {diff}{made}; "
            "run with the policy, chunk_size and simulator it was trained for"
        )
    policy.load_state_dict(weights)
    policy.version = 0
    return dict(meta)
