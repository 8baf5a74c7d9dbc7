"""What an update keeps in the optimiser's state, so a checkpoint (which saves the optimiser)
carries it: the env steps trained on (the learning rate's decay, :func:`anneal_lr`) and the updates
made (a critic warm-up, :func:`count_update`); and the state moved with the parameters
(:func:`optimizer_to`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ebrl.algos.loss import ClipConfig


def anneal_lr(optimizer: torch.optim.Optimizer, cfg: ClipConfig, steps: int) -> float:
    """Set the optimiser's learning rate for an update after ``steps`` env steps of training and
    count the steps where the optimiser's state (checkpointed with it) keeps them.

    Returns:
        The learning rate set.
    """
    group = optimizer.param_groups[0]
    done = int(group.get("ebrl_env_steps", 0))  # saved and restored by torch's state_dict
    lr = cfg.lr
    if cfg.lr_decay_steps:
        lr = cfg.lr * max(0.0, 1.0 - done / cfg.lr_decay_steps)
    for g in optimizer.param_groups:
        g["lr"] = lr
        g["ebrl_env_steps"] = done + steps
    return lr


def count_update(optimizer: torch.optim.Optimizer) -> int:
    """Count one more update in the optimiser's state (checkpointed with it, like
    :func:`anneal_lr`'s env steps); returns the updates made before this one."""
    group = optimizer.param_groups[0]
    done = int(group.get("ebrl_updates", 0))
    for g in optimizer.param_groups:
        g["ebrl_updates"] = done + 1
    return done


def optimizer_to(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move an optimiser's state tensors to ``device`` (after its parameters were moved), as
    ``load_state_dict`` places them; Adam's ``step`` counters stay where they are."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value):
                state[key] = value.to(device)
