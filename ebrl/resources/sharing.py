"""How the roles of a run share a GPU's SMs: decisions only, no side effects.

A role with a share below one GPU (``scheduler.gen_gpus`` / ``learner_gpus``) shares that GPU
with other roles. Its SM quota (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) is
``resources.gen_sm_pct`` / ``train_sm_pct`` where pinned, else its GPU share in percent. The
quota holds only under an MPS control daemon on the role's node (``ebrl.resources.mps`` starts
or joins one); where none can serve, the roles time-slice the GPU, and the run says so once and
records it (:data:`TAG`).

What changes the machine (the daemons, the roles' environments) is in ``ebrl.resources.mps``
and ``ebrl.runtime.placement``; this module says what they should be and refuses what cannot be.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

#: the run parameter (MLflow) that says how the run's GPUs were shared
TAG = "gpu/sharing"
#: the resources keys that pin a role's SM quota, by role
QUOTA_KEYS = {"gen": "resources.gen_sm_pct", "learner": "resources.train_sm_pct"}
#: the scheduler keys that set a role's GPU share (the scale node feeds them)
SHARE_KEYS = {"gen": "scheduler.gen_gpus", "learner": "scheduler.learner_gpus"}


class Sharing(StrEnum):
    """How a run's roles used their GPUs."""

    #: SM quotas under an MPS daemon on every node with a shared GPU
    mps = "mps"
    #: MIG instances
    mig = "mig"
    #: shared GPUs without MPS or MIG: kernels take turns, the shares are not enforced
    time_sliced = "time-sliced"
    #: every GPU role has whole GPUs: nothing shared
    whole = "whole"


def is_share(gpus: float) -> bool:
    """A GPU ask below one GPU: the role shares its GPU."""
    return 0 < gpus < 1


def quotas(
    gen_gpus: float,
    learner_gpus: float,
    gen_sm_pct: int | None = None,
    train_sm_pct: int | None = None,
) -> dict[str, int | None]:
    """Each role's SM quota in percent: pinned where the resources group sets it, else the
    role's GPU share (``round(100 * share)``, 1..99) for a share below one GPU; None for a role
    with whole GPUs or none (no quota: it has its GPUs to itself)."""
    out: dict[str, int | None] = {}
    for role, share, pinned in (
        ("gen", gen_gpus, gen_sm_pct),
        ("learner", learner_gpus, train_sm_pct),
    ):
        if share <= 0:
            out[role] = None
        elif pinned is not None:
            out[role] = int(pinned)
        elif is_share(share):
            out[role] = max(1, min(99, round(100 * share)))
        else:
            out[role] = None
    return out


def check_quotas(
    gen_gpus: float,
    learner_gpus: float,
    gen_sm_pct: int | None = None,
    train_sm_pct: int | None = None,
) -> None:
    """Refuse SM quotas a run cannot honour, before any work starts.

    Raises:
        ValueError: a quota outside (0, 100]; a quota pinned for a role that asks no GPU; a
            generator and a learner that share one GPU (each asks a share, both fit on one GPU,
            so placement packs them together) with quotas past 100%. The message names the key
            and the fix.
    """
    shares = {"gen": gen_gpus, "learner": learner_gpus}
    pinned = {"gen": gen_sm_pct, "learner": train_sm_pct}
    for role, pct in pinned.items():
        if pct is None:
            continue
        key = QUOTA_KEYS[role]
        if not 0 < pct <= 100:
            raise ValueError(f"{key}={pct}: an SM quota is a percent in (0, 100]; or null")
        if shares[role] <= 0:
            raise ValueError(
                f"{key}={pct}, but {SHARE_KEYS[role]}=0: that role computes on the CPU cores "
                f"and has no SMs to cap; give it a GPU share (scale.{role}_gpus=0.5), or leave "
                f"{key} null"
            )
    got = quotas(gen_gpus, learner_gpus, gen_sm_pct, train_sm_pct)
    together = is_share(gen_gpus) and is_share(learner_gpus) and gen_gpus + learner_gpus <= 1
    total = (got["gen"] or 0) + (got["learner"] or 0)
    if together and total > 100:
        raise ValueError(
            f"{QUOTA_KEYS['gen']}={got['gen']} + {QUOTA_KEYS['learner']}={got['learner']} = "
            f"{total}% of one GPU's SMs, and the generator and the learner share one GPU "
            f"({SHARE_KEYS['gen']}={gen_gpus:g}, {SHARE_KEYS['learner']}={learner_gpus:g}): "
            "lower them to at most 100 together"
        )


def over_subscribed(per_gpu: Mapping[tuple[str, int], Iterable[tuple[str, int]]]) -> list[str]:
    """The GPUs whose roles' quotas sum past 100%, described (empty: none).

    Args:
        per_gpu: (node, GPU slot) -> the (worker, quota) of each role placed on it.
    """
    out = []
    for (node, slot), roles in sorted(per_gpu.items()):
        roles = list(roles)
        total = sum(q for _, q in roles)
        if total > 100:
            who = ", ".join(f"{w} {q}%" for w, q in roles)
            out.append(f"GPU {slot} of node {node}: {who} = {total}%")
    return out


def time_sliced_warning(why: str, gen_gpus: float, learner_gpus: float) -> str:
    """The one warning of a run whose shared GPUs are time-sliced: why, and what to install or
    enable."""
    return (
        f"GPU shares below one GPU (scheduler.gen_gpus={gen_gpus:g}, "
        f"learner_gpus={learner_gpus:g}) become SM quotas only under an MPS daemon, and {why}; "
        "the roles time-slice the GPU (kernels take turns, the shares are not enforced). "
        "Install the NVIDIA driver's MPS tools (nvidia-cuda-mps-control on PATH on every GPU "
        "node) or enable MIG (nvidia-smi -mig 1), or give each role whole GPUs"
    )
