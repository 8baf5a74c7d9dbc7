"""Resource plans: which cores and which share of which GPU each stage process gets (pure).

:func:`make_plan` turns a :class:`~ebrl.resources.topology.Topology` and one
:class:`StageRequest` per stage into a :class:`ResourcePlan`: per process, its CPU cores
(NUMA-local to its GPU when it has one), its GPU share and the torch thread count and batch size
it should run with. GPU shares, in order of preference:

* a whole GPU, when a process asks for all of one;
* an MPS SM quota (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) where MPS is usable; a quota is a cap on
  the SMs a process may use, not a reservation, so quotas on one GPU never add up beyond 100%;
* a MIG instance on a GPU in MIG mode (the only way to share such a GPU: in MIG mode a CUDA
  process can only open MIG devices), the smallest free instance with at least the SMs asked for;
* plain time-slicing, recorded as a warning: nothing enforces the share.

A plan never puts two processes on one core unless :attr:`PlanPolicy.allow_core_sharing`, and
never gives out more than 100% of a GPU's SMs; when a request cannot fit, :class:`PlanError` says
which stage, what it asked for and what is free.

On a machine without a GPU the same split is one of cores and torch intra-op threads between gen
and train (:func:`cpu_split`, :func:`cpu_plan`): the CPU analogue of an SM split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal

from ebrl.resources.topology import Gpu, MigInstance, Topology

Role = Literal["sim", "gen", "train"]
ROLES: tuple[str, ...] = ("sim", "gen", "train")


class PlanError(ValueError):
    """A request that does not fit; the message names the stage, its ask and what is free."""


class ShareKind(StrEnum):
    whole = "whole"  # the process has the GPU to itself
    mps = "mps"  # an MPS SM quota on a shared GPU
    mig = "mig"  # a MIG instance
    timeslice = "timeslice"  # shared without enforcement (no MPS, no MIG)


@dataclass(frozen=True)
class GpuShare:
    """A process's part of one GPU.

    Attributes:
        kind: how the share is enforced.
        gpu: NVML index of the physical GPU.
        gpu_uuid: its ``GPU-...`` uuid ("" when unknown).
        fraction: of the GPU's SMs this process may use (a cap under MPS).
        sm_percent: the same as an integer percentage: the MPS quota for ``mps``.
        sms: SMs that corresponds to (0 when the GPU's SM count is unknown).
        mig_uuid: the MIG device for ``mig``.
    """

    kind: ShareKind
    gpu: int
    gpu_uuid: str
    fraction: float
    sm_percent: int
    sms: int
    mig_uuid: str | None = None


@dataclass(frozen=True)
class StageRequest:
    """What one stage asks for.

    Attributes:
        role: ``sim``, ``gen`` or ``train``.
        processes: processes of this stage.
        cores_per_process: CPU cores each process gets.
        gpu_share: fraction of one GPU's SMs per process (None: CPU only; 1.0: a whole GPU).
        batch_size: the batch size each process should use (passed through to the plan).
        prefer_gpu: try this GPU first (others are tried after it).
        name: distinguishes two requests of one role (default: the role).
        threads: torch intra-op threads per process (default: its cores; 1 for sim, whose
            processes step simulators and should not spread torch over cores).
    """

    role: Role
    processes: int = 1
    cores_per_process: int = 1
    gpu_share: float | None = None
    batch_size: int | None = None
    prefer_gpu: int | None = None
    name: str = ""
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise PlanError(f"StageRequest: role={self.role!r} is not one of {ROLES}")
        if not self.name:
            object.__setattr__(self, "name", self.role)
        if self.processes < 1 or self.cores_per_process < 1:
            raise PlanError(
                f"stage '{self.name}': processes={self.processes} and "
                f"cores_per_process={self.cores_per_process} must both be >= 1"
            )
        if self.gpu_share is not None and not 0.0 < self.gpu_share <= 1.0:
            raise PlanError(f"stage '{self.name}': gpu_share={self.gpu_share} must be in (0, 1]")
        if self.batch_size is not None and self.batch_size < 1:
            raise PlanError(f"stage '{self.name}': batch_size={self.batch_size} must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise PlanError(f"stage '{self.name}': threads={self.threads} must be >= 1")


@dataclass(frozen=True)
class PlanPolicy:
    """How strictly a plan packs.

    Attributes:
        allow_core_sharing: when cores run out, put further processes on the least loaded cores
            instead of raising (the only option on a 2-core machine with 4 stage processes).
        use_mps: use MPS quotas where MPS is usable (off: time-slicing on shared GPUs).
        strict_numa: raise instead of warning when a GPU process's cores cannot all sit on its
            GPU's NUMA node.
        spread_smt: give out one thread per physical core before any SMT sibling (compute-bound
            stages gain little from a sibling and lose when two processes share a core).
    """

    allow_core_sharing: bool = False
    use_mps: bool = True
    strict_numa: bool = False
    spread_smt: bool = True


@dataclass(frozen=True)
class StagePlacement:
    """Where one stage process runs and how.

    Attributes:
        stage: the request's name.
        role: its role.
        rank: process index within the stage.
        cores: CPU ids to pin it to.
        numa: NUMA node its cores (mostly) sit on.
        gpu: its GPU share (None: CPU only).
        threads: torch intra-op threads.
        batch_size: batch size to run with (None: the stage's own default).
    """

    stage: str
    role: str
    rank: int
    cores: tuple[int, ...]
    numa: int | None
    gpu: GpuShare | None
    threads: int
    batch_size: int | None


@dataclass(frozen=True)
class ResourcePlan:
    """Every stage process's placement, plus what the planner had to compromise on.

    Attributes:
        placements: in request order, then by rank.
        warnings: compromises (time-slicing, cores off the GPU's NUMA node, shared cores).
        all_cores: the cores the plan drew from.
    """

    placements: tuple[StagePlacement, ...]
    warnings: tuple[str, ...] = ()
    all_cores: tuple[int, ...] = field(default=())

    def stage(self, name: str) -> tuple[StagePlacement, ...]:
        """The placements of one stage (by request name), by rank."""
        out = tuple(p for p in self.placements if p.stage == name)
        if not out:
            names = sorted({p.stage for p in self.placements})
            raise KeyError(f"no stage '{name}' in this plan (stages: {names})")
        return out

    def core_load(self) -> dict[int, int]:
        """Processes pinned to each core (0 for a free core)."""
        load = dict.fromkeys(self.all_cores, 0)
        for p in self.placements:
            for c in p.cores:
                load[c] = load.get(c, 0) + 1
        return load

    def free_cores(self) -> tuple[int, ...]:
        return tuple(c for c, n in self.core_load().items() if n == 0)

    def gpu_percent(self) -> dict[int, int]:
        """SM percentage handed out per GPU (MIG instances count as their SM fraction)."""
        out: dict[int, int] = {}
        for p in self.placements:
            if p.gpu is not None:
                out[p.gpu.gpu] = out.get(p.gpu.gpu, 0) + p.gpu.sm_percent
        return out

    def describe(self) -> str:
        """A table a person can read in a log."""
        lines = []
        for p in self.placements:
            g = "-"
            if p.gpu is not None:
                g = f"GPU{p.gpu.gpu} {p.gpu.kind} {p.gpu.sm_percent}%"
                if p.gpu.mig_uuid:
                    g += f" {p.gpu.mig_uuid}"
            lines.append(
                f"{p.stage}[{p.rank}] cores={_fmt_cores(p.cores)} numa={p.numa} gpu={g} "
                f"threads={p.threads} batch={p.batch_size}"
            )
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- planning ---------------------------------------------------------------------------------
def _fmt_cores(cores: Sequence[int]) -> str:
    """``[0-3,8]``: compact like the kernel's CPU lists."""
    s = sorted(set(cores))
    parts, i = [], 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return "[" + ",".join(parts) + "]"


class _State:
    """What is taken so far while a plan is being built."""

    def __init__(self, topo: Topology, policy: PlanPolicy) -> None:
        self.topo = topo
        self.policy = policy
        self.users: dict[int, int] = dict.fromkeys(topo.core_ids, 0)
        self.gpu_pct: dict[int, int] = {g.index: 0 for g in topo.gpus}
        self.mig_used: set[str] = set()
        self.warnings: list[str] = []
        self.sib = {c.id: c.siblings for c in topo.cores}
        self.numa = {c.id: c.numa for c in topo.cores}

    # -- GPUs -----------------------------------------------------------------------------------
    def free_gpu_text(self) -> str:
        parts = []
        for g in self.topo.gpus:
            if g.mig_enabled:
                free = [m for m in g.mig_instances if m.uuid not in self.mig_used]
                sms = ",".join(str(m.sms) for m in free) or "none"
                parts.append(f"GPU{g.index}: MIG instances free with SMs [{sms}] of {g.sms}")
            else:
                parts.append(f"GPU{g.index}: {100 - self.gpu_pct[g.index]}% of SMs free")
        return "; ".join(parts)

    def take_gpu(self, req: StageRequest, rank: int) -> GpuShare:
        share = float(req.gpu_share)  # type: ignore[arg-type]
        who = f"stage '{req.name}' process {rank} of {req.processes}"
        if not self.topo.gpus:
            raise PlanError(
                f"{who} asks for {share:.0%} of a GPU, but this machine has no GPUs "
                "(CPU-only: split cores between gen and train with cpu_split/cpu_plan)"
            )
        order = list(self.topo.gpus)
        if req.prefer_gpu is not None:
            pref = [g for g in order if g.index == req.prefer_gpu]
            if not pref:
                raise PlanError(
                    f"{who} prefers GPU {req.prefer_gpu}, which does not exist "
                    f"(GPUs: {[g.index for g in order]})"
                )
            order = pref + [g for g in order if g.index != req.prefer_gpu]
        for g in order:
            got = self._mig(g, share) if g.mig_enabled else self._sm_share(g, share, who)
            if got is not None:
                return got
        raise PlanError(
            f"{who} asks for {share:.0%} of one GPU's SMs"
            + (f" (prefers GPU {req.prefer_gpu})" if req.prefer_gpu is not None else "")
            + f", and no GPU has that free: {self.free_gpu_text()}"
        )

    def _sm_share(self, g: Gpu, share: float, who: str) -> GpuShare | None:
        # integer percentages: the MPS quota's own unit, and no float rounding in the accounting
        pct = min(100, max(1, round(share * 100)))
        if self.gpu_pct[g.index] + pct > 100:
            return None
        self.gpu_pct[g.index] += pct
        if pct == 100:
            kind = ShareKind.whole
        elif g.mps_supported and self.policy.use_mps:
            kind = ShareKind.mps
        else:
            kind = ShareKind.timeslice
            why = "MPS is disabled by policy" if g.mps_supported else "MPS is not usable"
            self.warnings.append(
                f"{who}: {pct}% of GPU{g.index} by plain time-slicing ({why}, MIG is off): "
                "the share is not enforced"
            )
        return GpuShare(kind, g.index, g.uuid, pct / 100, pct, round(g.sms * pct / 100))

    def _mig(self, g: Gpu, share: float) -> GpuShare | None:
        need = share * g.sms
        free = [m for m in g.mig_instances if m.uuid not in self.mig_used and m.sms >= need - 1e-9]
        if not free:
            return None
        best: MigInstance = min(free, key=lambda m: m.sms)  # best fit keeps big ones for later
        self.mig_used.add(best.uuid)
        frac = best.sms / g.sms if g.sms else share
        pct = max(1, round(frac * 100))
        self.gpu_pct[g.index] += pct
        return GpuShare(ShareKind.mig, g.index, g.uuid, frac, pct, best.sms, best.uuid)

    # -- cores ----------------------------------------------------------------------------------
    def _node_rank(self, numa: int | None) -> dict[int, int]:
        """Order of preference of NUMA nodes: the GPU's node first, else the emptiest node."""
        nodes = self.topo.numa_nodes
        free = {n: sum(1 for c in self.topo.cores_on(n) if self.users[c] == 0) for n in nodes}
        if numa is not None and numa in nodes:
            ordered = [numa, *sorted((n for n in nodes if n != numa), key=lambda n: -free[n])]
        else:
            ordered = sorted(nodes, key=lambda n: (-free[n], n))
        return {n: i for i, n in enumerate(ordered)}

    def take_cores(self, req: StageRequest, rank: int, numa: int | None) -> tuple[int, ...]:
        need = req.cores_per_process
        rank_of = self._node_rank(numa)
        chosen: list[int] = []
        while len(chosen) < need:
            free = [c for c in self.users if self.users[c] == 0 and c not in chosen]
            if not free:
                break

            def key(c: int) -> tuple[int, int, int]:
                busy_sibling = any(
                    s != c and (self.users.get(s, 0) > 0 or s in chosen) for s in self.sib[c]
                )
                smt = int(busy_sibling) if self.policy.spread_smt else 0
                return (rank_of[self.numa[c]], smt, c)

            chosen.append(min(free, key=key))
        if len(chosen) < need:
            if not self.policy.allow_core_sharing:
                self._core_error(req, rank, numa, chosen)
            # share the least loaded cores, nearest node first
            rest = sorted(
                (c for c in self.users if c not in chosen),
                key=lambda c: (self.users[c], rank_of[self.numa[c]], c),
            )
            extra = rest[: need - len(chosen)]
            if len(chosen) + len(extra) < need:
                self._core_error(req, rank, numa, chosen)
            chosen += extra
            self.warnings.append(
                f"stage '{req.name}' process {rank}: shares cores {_fmt_cores(extra)} with "
                "other processes"
            )
        for c in chosen:
            self.users[c] += 1
        if numa is not None:
            off = [c for c in chosen if self.numa[c] != numa]
            if off:
                msg = (
                    f"stage '{req.name}' process {rank}: {len(off)} of {need} cores "
                    f"{_fmt_cores(off)} are off NUMA node {numa}, where its GPU is"
                )
                if self.policy.strict_numa:
                    raise PlanError(msg + " (PlanPolicy.strict_numa)")
                self.warnings.append(msg)
        return tuple(sorted(chosen))

    def _core_error(self, req: StageRequest, rank: int, numa: int | None, got: list[int]) -> None:
        free = [c for c in self.users if self.users[c] == 0]
        total = len(self.users)
        where = f" (NUMA node {numa} preferred, local to its GPU)" if numa is not None else ""
        if req.cores_per_process > total:
            free_text = f"the machine allows only {total} cores {_fmt_cores(self.users)}"
        else:
            free_text = f"{len(free)} of {total} allowed cores are free {_fmt_cores(free)}"
        raise PlanError(
            f"stage '{req.name}' process {rank} of {req.processes} asks for "
            f"{req.cores_per_process} cores{where}; {free_text}. Ask for fewer cores or "
            "set PlanPolicy(allow_core_sharing=True)"
        )


def make_plan(
    topology: Topology, requests: Sequence[StageRequest], policy: PlanPolicy | None = None
) -> ResourcePlan:
    """Place every process of every request on the machine.

    GPU stages are placed first, so their cores can be taken from their GPU's NUMA node before
    CPU-only stages (sim) take what is left; within each group, in the order given.

    Raises:
        PlanError: a request that does not fit, naming the stage, its ask and what is free;
            or two requests with one name.
    """
    policy = policy or PlanPolicy()
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise PlanError(f"make_plan: stage names must be unique, got {names}; set name=")
    if not topology.cores:
        raise PlanError("make_plan: the topology has no cores this process may use")
    state = _State(topology, policy)
    order = [r for r in requests if r.gpu_share is not None] + [
        r for r in requests if r.gpu_share is None
    ]
    by_stage: dict[str, list[StagePlacement]] = {}
    for req in order:
        for rank in range(req.processes):
            share = state.take_gpu(req, rank) if req.gpu_share is not None else None
            numa = topology.gpu(share.gpu).numa if share is not None else None
            cores = state.take_cores(req, rank, numa)
            node = numa if numa is not None else topology.core(cores[0]).numa
            threads = req.threads or (1 if req.role == "sim" else len(cores))
            by_stage.setdefault(req.name, []).append(
                StagePlacement(
                    req.name, req.role, rank, cores, node, share, threads, req.batch_size
                )
            )
    placements = tuple(p for r in requests for p in by_stage[r.name])
    return ResourcePlan(placements, tuple(state.warnings), topology.core_ids)


# --- CPU-only machines ------------------------------------------------------------------------
def _core_order(topology: Topology, pool: Sequence[int] | None) -> list[int]:
    ids = list(topology.core_ids) if pool is None else list(pool)
    unknown = set(ids) - set(topology.core_ids)
    if unknown:
        raise PlanError(f"cpu_split: cores {sorted(unknown)} are not in the topology")
    # node by node, SMT siblings next to each other: a contiguous cut keeps each side compact
    return sorted(ids, key=lambda c: (topology.core(c).numa, topology.core(c).siblings[0], c))


def cpu_split(
    topology: Topology, gen_share: float, pool: Sequence[int] | None = None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split cores between gen and train: the CPU analogue of an SM split.

    Gen takes ``round(gen_share * n)`` cores, clamped so each side has at least one; with a
    single core both sides get it (nothing to split).

    Args:
        topology: the machine.
        gen_share: gen's fraction of the pool, in [0, 1].
        pool: the cores to split (default: all; pass the cores left after sim).

    Returns:
        (gen cores, train cores); use their lengths as ``threads.gen`` / ``threads.train``.
    """
    if not 0.0 <= gen_share <= 1.0:
        raise PlanError(f"cpu_split: gen_share={gen_share} must be in [0, 1]")
    ids = _core_order(topology, pool)
    if not ids:
        raise PlanError("cpu_split: no cores to split")
    if len(ids) == 1:
        return tuple(ids), tuple(ids)
    n_gen = min(len(ids) - 1, max(1, round(gen_share * len(ids))))
    return tuple(sorted(ids[:n_gen])), tuple(sorted(ids[n_gen:]))


def cpu_plan(
    topology: Topology,
    gen_share: float,
    sim_processes: int,
    sim_cores_per_process: int = 1,
    gen_batch: int | None = None,
    train_batch: int | None = None,
) -> ResourcePlan:
    """A whole plan for a machine without GPUs: sim processes, then gen and train.

    Sim processes get their own cores when at least two cores remain for gen and train after
    them; otherwise (a small machine) every process may use every core and the plan says so in a
    warning, since pinning four processes to two cores only adds contention.

    Args:
        topology: the machine.
        gen_share: gen's fraction of the cores left after sim (an allocator's split).
        sim_processes: env worker processes.
        sim_cores_per_process: cores per env worker.
        gen_batch: generator batch size to record in the plan.
        train_batch: learner minibatch size to record in the plan.
    """
    n = len(topology.cores)
    sim_need = sim_processes * sim_cores_per_process
    warnings: list[str] = []
    placements: list[StagePlacement] = []
    if n - sim_need >= 2:
        ordered = _core_order(topology, None)
        sim_cores, pool = ordered[:sim_need], ordered[sim_need:]
        for r in range(sim_processes):
            cores = tuple(sim_cores[r * sim_cores_per_process : (r + 1) * sim_cores_per_process])
            placements.append(
                StagePlacement("sim", "sim", r, cores, topology.core(cores[0]).numa, None, 1, None)
            )
    else:
        pool = list(topology.core_ids)
        warnings.append(
            f"{n} cores for {sim_processes} sim processes plus gen and train: no room to "
            "pin them apart; every sim process may use every core"
        )
        placements += [
            StagePlacement("sim", "sim", r, tuple(pool), topology.cores[0].numa, None, 1, None)
            for r in range(sim_processes)
        ]
    gen, train = cpu_split(topology, gen_share, pool)
    if gen == train:
        warnings.append("a single core for gen and train: they share it")
    for name, cores, batch in (("gen", gen, gen_batch), ("train", train, train_batch)):
        node = topology.core(cores[0]).numa
        placements.append(StagePlacement(name, name, 0, cores, node, None, len(cores), batch))
    return ResourcePlan(tuple(placements), tuple(warnings), topology.core_ids)
