"""A placement in Ray's terms and in the role's own process: the actor options that put a
worker on its node with its GPU share and MPS SM quota (:func:`ray_options`), the planned GPUs
a GPU role's process takes before CUDA starts (:func:`pin_planned_gpus`), and what each role's
process runs with, read inside it (:func:`record_role_env`).

The placements are :func:`ebrl.runtime.placement.place`'s. The driver side calls
:func:`ray_options` and :func:`record_role_env` (``ebrl.schedulers.ebrl.gpu``'s ``GpuFabric``,
``baselines/colocated_ranks.py``); each GPU role's process calls :func:`pin_planned_gpus` first
thing (``ebrl.schedulers.ebrl.worker``, the Colocated ranks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ebrl.runtime.placement import Placement

#: Ray's switch that leaves ``CUDA_VISIBLE_DEVICES`` of an actor's process to the process
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
#: the node-local GPU slots a GPU role was planned on (:func:`ray_options`)
SLOTS_VAR = "EBRL_GPU_SLOTS"


def pin_planned_gpus(environ: Any = None) -> str | None:
    """In a GPU role's process, before CUDA starts: make its planned GPU slots (``EBRL_GPU_SLOTS``,
    set by :func:`ray_options`) its ``CUDA_VISIBLE_DEVICES``. Slot ``i`` is the ``i``-th device
    the node was started with (the ``CUDA_VISIBLE_DEVICES`` the process inherits from its Ray
    node, e.g. a Slurm job's GPUs), or device ``i`` where the node names none.

    Returns:
        the devices it set; None where no slots were planned (a worker without a GPU, a run
        without Ray).

    Raises:
        RuntimeError: a planned slot the node has no device for.
    """
    import os

    env = os.environ if environ is None else environ
    slots = env.get(SLOTS_VAR)
    if not slots:
        return None
    node = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    chosen = []
    for s in slots.split(","):
        i = int(s)
        if node and i >= len(node):
            raise RuntimeError(
                f"this worker was planned on GPU slot {i}, but its Ray node was started with "
                f"CUDA_VISIBLE_DEVICES={','.join(node)} ({len(node)} GPU(s)): start the node "
                "with --num-gpus matching the devices it sees"
            )
        chosen.append(node[i] if node else str(i))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    return env["CUDA_VISIBLE_DEVICES"]


def ray_options(
    p: Placement,
    *,
    mps: bool = True,
    mps_pipe: str | Path | None = None,
    sm_pct: int | None = None,
) -> dict[str, Any]:
    """Ray actor options for ``p``: merge them over ``RayBackend.spawn``'s defaults
    (``spawn(..., options=ray_options(p))``).

    * ``scheduling_strategy``: a hard affinity to the placement's node.
    * ``num_gpus``: the ask (Ray counts the share); ``num_cpus``: the placement's (0 by
      default).
    * for a GPU role: its planned slots (``EBRL_GPU_SLOTS``) and Ray told not to set
      ``CUDA_VISIBLE_DEVICES``: the process takes its planned GPUs (:func:`pin_planned_gpus`),
      since Ray would pack shares in the order actors are created.
    * ``resources``: the ask's custom resources.
    * ``runtime_env.env_vars``: the MPS SM quota ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
      (``sm_pct``, else the share in percent for a share below one GPU; it takes effect
      where an MPS daemon serves the GPU, without one CUDA ignores it), plus
      ``CUDA_MPS_PIPE_DIRECTORY`` when ``mps_pipe`` is given. Ray merges an actor's
      ``env_vars`` with the job's (``RayBackend``'s ``VK_ICD_FILENAMES`` ... stay).

    Args:
        mps: set the MPS quota.
        mps_pipe: the pipe directory of the MPS daemon serving the node
            (``ebrl.resources.mps.ClusterMPS.pipes``).
        sm_pct: the role's SM quota in percent (``ebrl.resources.sharing.quotas``; None: the
            share's own, :attr:`Ask.mps_percent`).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    a = p.ask
    opts: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=p.node.node_id, soft=False),
        "num_gpus": float(a.gpus),
        "num_cpus": float(p.num_cpus),
    }
    if a.resources:
        opts["resources"] = dict(a.resources)
    env: dict[str, str] = {}
    if a.gpus > 0 and p.gpu_slots:
        # Ray hands out fractional shares in the order actors are created (two replicas made
        # before the ranks share GPU 0), not as planned: the role's process takes its planned
        # GPUs itself (pin_planned_gpus) and Ray leaves CUDA_VISIBLE_DEVICES alone
        env[SLOTS_VAR] = ",".join(str(s) for s in p.gpu_slots)
        env[NOSET_CUDA] = "1"
    quota = sm_pct if sm_pct is not None and a.gpus > 0 else a.mps_percent
    if mps and quota is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(quota)
        if mps_pipe is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps_pipe)
    if env:
        opts["runtime_env"] = {"env_vars": env}
    return opts


#: the variables a GPU role's process reports (:func:`record_role_env`)
GPU_ENV = (
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_VISIBLE_DEVICES",
)


def _role_env(_instance: Any) -> dict[str, Any]:
    """Run inside a role's actor process: its pid, node and sharing variables."""
    import os
    import socket

    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        **{k: os.environ.get(k) for k in GPU_ENV},
    }


def record_role_env(actor: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """What a role's process runs with (:data:`GPU_ENV`, its pid and host), read inside it."""
    import ray

    return ray.get(actor.__ray_call__.remote(_role_env), timeout=timeout_s)
