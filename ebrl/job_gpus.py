"""What a sweep's job does with the GPUs it reserves, for the dry run (``ebrl.launch``): its roles
placed on a cluster of the shape its launcher reserves, the line that says what each GPU holds
and how many of the GPUs it asks for it uses (:func:`roles_line`), and why a GPU job is refused
(:func:`gpu_refusal`: GPUs left idle, or the policy on the CPU cores)."""

from __future__ import annotations

from typing import Any

from ebrl.config import LauncherKind
from ebrl.runtime.placement import Placement, PlacementError, gpus_used, place
from ebrl.runtime.placement_asks import colocated_asks, role_asks
from ebrl.runtime.placement_nodes import fake_cluster, placement_groups

#: the override that lets a GPU job through that leaves GPUs idle or computes on the CPU
IDLE_OK = "launcher.allow_idle_gpus"


def _asked(job: dict[str, Any]) -> int:
    """The GPUs a job reserves: nodes x GPUs per node."""
    lau = job.get("launcher") or {}
    return int(lau.get("nodes", 1) or 1) * int(lau.get("gpus_per_node", 0) or 0)


def _placed(job: dict[str, Any]) -> list[Placement]:
    """A job's roles placed as its run places them (``placement_asks.role_asks``, ``place``) on a
    cluster of the shape its launcher reserves (``placement_nodes.fake_cluster``: the nodes a Slurm
    job of that many tasks starts). Node groups are left out: which nodes declare them is
    the cluster's, checked when the run starts."""
    sched, lau = job["scheduler"], job.get("launcher") or {}
    nodes = fake_cluster(
        int(lau.get("nodes", 1) or 1),
        int(lau.get("gpus_per_node", 0) or 0),
        float(lau.get("cpus_per_task") or 1),
    )
    if _colocated_ranks(sched):  # one rank per GPU (a whole one) on a GPU run
        gpus = 0.0 if str((job.get("gpu") or {}).get("name", "cpu")) == "cpu" else 1.0
        asks = colocated_asks(int(sched["ranks"]), gpus)
        return place(asks, nodes, gpu_setting={"colocated": "gpu"})
    keys = {"gen": "scale.gen_gpus", "learner": "scale.learner_gpus"}
    return place(role_asks(sched), nodes, gpu_setting=keys)


def _colocated_ranks(sched: dict[str, Any]) -> bool:
    """A Colocated scheduler node (``baselines/colocated.py``): its ``ranks`` processes hold
    every stage each (``ranks=1``: every stage in the driver)."""
    return "ranks" in sched and "gen_replicas" not in sched


def _per_gpu(placed: list[Placement]) -> str:
    """``per GPU: 1 gen + 1 learner (x8); per node: 32 env workers (x2)``."""
    from collections import Counter

    gpus: dict[tuple[str, int], list[str]] = {}
    sims: Counter[str] = Counter()
    for p in placed:
        for slot in p.gpu_slots:
            gpus.setdefault((p.node.node_id, slot), []).append(p.role)
        if p.role == "sim":
            sims[p.node.node_id] += 1
    held = Counter(
        " + ".join(f"{n} {r}" for r, n in sorted(Counter(rs).items())) for rs in gpus.values()
    )
    parts = [f"{k} (x{n})" for k, n in sorted(held.items())]
    node_sims = Counter(sims.values())
    out = f"per GPU: {', '.join(parts) or 'none'}"
    if not sims:  # Colocated: each rank steps its envs in its own process
        ranks = Counter(p.node.node_id for p in placed if p.role == "colocated")
        node_ranks = Counter(ranks.values())
        return (
            out
            + "; per node: "
            + ", ".join(f"{k} Colocated ranks (x{n})" for k, n in sorted(node_ranks.items()))
        )
    return (
        out
        + "; per node: "
        + ", ".join(f"{k} env workers (x{n})" for k, n in sorted(node_sims.items()))
    )


def _gpus_and_table(job: dict) -> tuple[float, str]:
    """The GPUs a job's placement uses and its per-GPU table ("; ..."), or 0 and why it
    cannot be placed."""
    try:
        placed = _placed(job)
    except PlacementError as e:
        return 0, f"; cannot place: {e}"
    return gpus_used(placed), "; " + _per_gpu(placed)


def roles_line(job: dict[str, Any]) -> str:
    """What a job's scheduler places, per role, and how many of the GPUs it asks Slurm for
    that uses (its roles placed on a cluster of the job's shape, :func:`_placed`): env
    workers, generator replicas x GPU share, learner ranks x GPU share, what each GPU holds.

    A scheduler without roles (sync: every stage in the driver process) uses at most one
    device; Colocated places its ranks (one per GPU at a scale point, each with its share of
    the envs, a generator and a learner rank); a real RLinf launch places its own components."""
    sched = job.get("scheduler") or {}
    lau = job.get("launcher") or {}
    asked = _asked(job)
    groups = placement_groups(job)
    pinned = "; node groups: " + ", ".join(f"{r} on {g}" for r, g in groups.items())
    pinned = pinned if groups else ""
    if _colocated_ranks(sched) and int(sched["ranks"]) > 1:
        n = int(sched["ranks"])
        envs = int(job.get("num_envs") or 0)
        used, where = _gpus_and_table(job)
        line = (
            f"roles: {n} Colocated ranks, each {envs // n} envs + a generator + a learner rank, "
            f"in turn; GPUs used {used} of {asked} asked"
        )
        return line + where + _cluster_note(lau, sched) + pinned
    if "gen_replicas" not in sched:
        kind = str(sched.get("_target_", "?")).rsplit(".", 1)[-1]
        on_gpu = str((job.get("gpu") or {}).get("name", "cpu")) != "cpu"
        used = min(asked, 1) if on_gpu else 0
        line = f"roles: {kind} runs every stage in one process; GPUs used {used} of {asked} asked"
        return line + _cluster_note(lau, sched) + pinned
    r, ll = int(sched["gen_replicas"]), int(sched["learner_ranks"])
    gg, lg = float(sched["gen_gpus"]), float(sched["learner_gpus"])
    used, where = _gpus_and_table(job)
    line = (
        f"roles: {sched['sim_workers']} env workers, {r} gen replica(s) x {gg:g} GPU, "
        f"{ll} learner rank(s) x {lg:g} GPU; GPUs used {used:g} of {asked} asked"
    )
    if asked and used < asked:
        line += " (set scheduler.gen_replicas/learner_ranks/gen_gpus/learner_gpus to use all)"
    return line + where + _cluster_note(lau, sched) + pinned


def gpu_refusal(job: dict[str, Any]) -> str | None:
    """Why the dry run refuses a GPU job (one that reserves GPUs): it would leave some idle,
    or compute its policy on the CPU cores; None when it uses every GPU it reserves, or
    ``launcher.allow_idle_gpus`` (:data:`IDLE_OK`) says to let it through."""
    asked = _asked(job)
    if not asked or (job.get("launcher") or {}).get("allow_idle_gpus"):
        return None
    sched = job.get("scheduler") or {}
    ok = f"or set {IDLE_OK}=true to run it so anyway"
    if str((job.get("gpu") or {}).get("name", "cpu")) == "cpu":
        return (
            f"reserves {asked} GPU(s) but gpu=cpu: the policy would compute on the CPU cores; "
            f"set gpu=<the GPU type> (conf/gpu/), or launcher.gpus_per_node=0, {ok}"
        )
    if _colocated_ranks(sched) and int(sched["ranks"]) > 1:
        try:
            used = gpus_used(_placed(job))
        except PlacementError as e:
            return f"its Colocated ranks do not fit the {asked} GPU(s) it reserves: {e}"
        if used < asked:
            return (
                f"its {sched['ranks']} Colocated ranks use {used} of the {asked} GPUs it "
                f"reserves: one rank per GPU (scheduler.ranks, from scale.learner_ranks: "
                f"+axis/scale=g{asked}), {ok}"
            )
        return None
    if "gen_replicas" not in sched:
        if asked == 1:
            return None
        kind = str(sched.get("_target_", "?")).rsplit(".", 1)[-1]
        fix = (
            f"run a Colocated rank per GPU (scheduler=colocated scheduler.ranks={asked}, or "
            f"+axis/scale=g{asked})"
            if _colocated_ranks(sched)
            else "give it one GPU (launcher.nodes=1 launcher.gpus_per_node=1)"
        )
        return (
            f"{kind} runs every stage in one process: it would compute on 1 GPU of the {asked} "
            f"this job reserves, a weakened baseline; {fix}, {ok}"
        )
    if not (float(sched.get("gen_gpus") or 0) or float(sched.get("learner_gpus") or 0)):
        return (
            f"reserves {asked} GPU(s) but the generator and the learner ask for no GPU share "
            "(scale.gen_gpus = scale.learner_gpus = 0): the policy would compute on the CPU "
            f"cores; pick a scale point with the job's GPUs (+axis/scale=g{asked}), {ok}"
        )
    try:
        used = gpus_used(_placed(job))
    except PlacementError as e:
        return f"its roles do not fit the {asked} GPU(s) it reserves: {e}"
    if used < asked:
        return (
            f"its roles use {used} of the {asked} GPUs it reserves ({roles_line(job)}): give "
            "every GPU a replica and a learner rank (scale.gen_replicas, scale.learner_ranks, "
            f"or +axis/scale=g{asked}), {ok}"
        )
    return None


def _cluster_note(lau: dict[str, Any], sched: dict[str, Any]) -> str:
    """A Slurm job of several tasks: the Ray cluster it starts over its nodes, or why none
    (``ebrl.runtime.slurm_cluster``); "" for a job of one task."""
    from ebrl.runtime.slurm_cluster import describe_job

    if lau.get("kind") != LauncherKind.slurm:
        return ""
    n, per = int(lau.get("nodes", 1) or 1), int(lau.get("tasks_per_node", 1) or 1)
    note = describe_job(n, per, sched)
    return f"; {note}" if note else ""
