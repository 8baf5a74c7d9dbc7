"""The resource manager of a run: from the ``resources`` config to what each stage runs with.

:func:`initial_resources` turns the run's ``resources`` group into :class:`RunResources`: the
generator's and the learner's torch threads, CPU cores (only with ``resources.pin``) and the
generator's batch size, plus the env workers' home cores. With ``allocator=static`` the split is
the config's (``gen_threads`` / ``train_threads``, or with pinning ``gen_cores`` / ``train_cores``
or a plan over the machine); with ``allocator=elastic`` Algorithm 1 (:func:`allocate`) chooses it
from a profile, and at run time :class:`~ebrl.resources.controller.RunController` re-chooses it.

On a machine without GPUs the pool gen and train split is CPU threads: without pinning, the thread
budget ``gen_threads + train_threads``; with pinning, the cores left after the env workers (each
stage then runs one torch thread per core). That is the CPU analogue of the SM split.

At run time three throughputs are measured per update: the generator's capacity (decisions per
second inside the policy), the rollout's (decisions issued per second of rollout time not held
back by the staleness bound, :class:`~ebrl.resources.meters.RolloutMeter`: the simulators set
it when it runs below the generator's capacity) and the learner's (decisions trained per second
of training).

The simulators are in the allocator's model: the profile has a ``sim`` stage (one env worker's
group stepping chunks on one core, decisions/s) when the run profiles itself, and unpinned the
thread pool is the simulators' own CPUs (``Pool.shared_with_sim`` with the machine's cores), so
every split is priced by the shared-CPU model (:func:`~ebrl.resources.split.shared_cpu_rate`):
a thread gen or train does not need is CPU the simulators get.

Nothing here touches the machine; the scheduler's workers apply what it decides
(:mod:`ebrl.resources.apply`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ebrl.config import AllocatorKind, ResourcesNode
from ebrl.resources.assign import PlanPolicy, StageRequest, cpu_plan, cpu_split, make_plan
from ebrl.resources.profiler import RateTable
from ebrl.resources.split import Allocation, AllocationError, Pool, allocate_with_sims
from ebrl.resources.topology import Topology

log = logging.getLogger(__name__)

STATIC, ELASTIC = "static", "elastic"


@dataclass(frozen=True)
class StageResources:
    """What one gen or train process runs with.

    Attributes:
        threads: torch intra-op threads.
        cores: CPU ids to pin the process to (None: not pinned).
        batch: the generator's batch size, M of "first M of N" (None: the scheduler's; unused
            for train).
    """

    threads: int
    cores: tuple[int, ...] | None = None
    batch: int | None = None

    def describe(self) -> str:
        where = "unpinned" if self.cores is None else f"cores {list(self.cores)}"
        batch = "" if self.batch is None else f", batch {self.batch}"
        return f"{self.threads} threads, {where}{batch}"


@dataclass(frozen=True)
class RunResources:
    """The split a run starts with.

    Attributes:
        gen: the generator's resources.
        train: the learner's resources.
        sim_home: env worker -> the cores it is pinned to (None: as ``scheduler.pin_sim`` says).
        pool: what gen and train split (threads / cores).
        pool_cores: with pinning, the cores gen and train share out (None: unpinned).
        allocation: Algorithm 1's choice (elastic only).
        warnings: compromises the plan made (shared cores on a small machine).
    """

    gen: StageResources
    train: StageResources
    sim_home: dict[int, frozenset[int]] | None = None
    pool: Pool | None = None
    pool_cores: tuple[int, ...] | None = None
    allocation: Allocation | None = None
    warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        lines = [f"gen: {self.gen.describe()}", f"train: {self.train.describe()}"]
        if self.sim_home is not None:
            lines.append(f"sim: { {w: sorted(c) for w, c in self.sim_home.items()} }")
        if self.allocation is not None:
            lines.append(f"allocation: {self.allocation.describe()}")
        return "; ".join(lines + [f"warning: {w}" for w in self.warnings])

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.sim_home is not None:
            d["sim_home"] = {str(w): sorted(c) for w, c in self.sim_home.items()}
        return d


# --- config -----------------------------------------------------------------------------------
class ResourceSettings(ResourcesNode):
    """The ``resources`` group as the manager reads it: :class:`ebrl.config.ResourcesNode`'s
    fields (one definition), built from a resolved config node."""

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> ResourceSettings:
        """From the resolved ``resources`` node (keys this version does not know are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in node.items() if k in names}
        if "allocator" in kw:
            kw["allocator"] = AllocatorKind(getattr(kw["allocator"], "value", kw["allocator"]))
        return cls(**kw)


def run_updates(cfg: Mapping[str, Any], default: int = 200, update_s: float | None = None) -> int:
    """The run's updates: the first of its budgets to end it. ``budget.iterations``; its
    env-step budget over the env steps of one update; its ``budget.minutes`` over
    ``update_s``, the seconds an update is expected to take (the shape search's prediction;
    without one a minutes budget cannot be turned into updates and is left out). ``default``
    when no budget gives a count."""
    budget = cfg.get("budget") or {}
    per_update = int(cfg.get("num_envs", 1)) * max(1, int(cfg.get("rollout_steps", 1)))
    limits: list[int] = []
    if budget.get("iterations"):
        limits.append(int(budget["iterations"]))
    if budget.get("env_steps"):
        limits.append(math.ceil(int(budget["env_steps"]) / max(1, per_update)))
    if budget.get("minutes") and update_s is not None and update_s > 0:
        limits.append(max(1, int(60 * float(budget["minutes"]) / update_s)))
    return min(limits, default=default)


def scaled_patience(
    patience: int | None, cfg: Mapping[str, Any], update_s: float | None = None
) -> int:
    """Updates a divergence must last before the split is searched again: ``patience`` when
    set, else a tenth of the run's updates (:func:`run_updates`, ``update_s`` its expected
    seconds an update), between 2 and 20, so that a drift can fire in a 10-update CPU sweep as
    in a 10-hour cluster run."""
    if patience is not None:
        return int(patience)
    return max(2, min(20, run_updates(cfg, update_s=update_s) // 10))


#: the share of a run's updates its shape trials may take, with the updates that settle
TRIAL_SHARE = 0.25


def trial_plan(
    window: int,
    cfg: Mapping[str, Any],
    shapes: int,
    settle: int = 1,
    update_s: float | None = None,
) -> tuple[int, int]:
    """How many of ``shapes`` shortlisted shapes a run measures, and for how many updates each:
    ``window`` updates at most, and all of it (each shape after the first also ``settle``
    updates after its move) within a quarter of the run's updates (:func:`run_updates`, with
    ``update_s`` the expected seconds of an update for a minutes budget): a 10-update run
    measures its first shape only, a 40-update run three of them for 2 updates. The first
    shape (the one the run starts with) is measured at least once."""
    budget = int(run_updates(cfg, update_s=update_s) * TRIAL_SHARE)
    n = max(1, shapes)
    while n > 1 and n + settle * (n - 1) > budget:
        n -= 1
    each = max(1, min(window, (budget - settle * (n - 1)) // n))
    return n, each


def gen_batch_candidates(group_size: int) -> tuple[int, ...]:
    """Generator batch sizes worth profiling: a quarter, half and all of an env group."""
    g = max(1, group_size)
    return tuple(sorted({max(1, g // 4), max(1, g // 2), g}))


def _pinned_layout(
    topo: Topology, s: ResourceSettings, sim_workers: int, gen_share: float
) -> tuple[dict[int, frozenset[int]], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple]:
    """Cores of the env workers and of gen and train, and the pool gen and train split.

    With no core counts given, :func:`cpu_plan` lays the machine out (env workers first, one
    core each, when at least two cores remain; else they may use every core). With counts,
    :func:`make_plan` places them (sharing cores, with a warning, when they do not fit).
    """
    if s.sim_cores is None and s.gen_cores is None and s.train_cores is None:
        plan = cpu_plan(topo, gen_share, sim_workers)
    else:
        per_sim = max(1, (s.sim_cores or sim_workers) // sim_workers)
        reqs = [
            StageRequest("sim", processes=sim_workers, cores_per_process=per_sim, threads=1),
            StageRequest("gen", cores_per_process=s.gen_cores or s.gen_threads),
            StageRequest("train", cores_per_process=s.train_cores or s.train_threads),
        ]
        plan = make_plan(topo, reqs, PlanPolicy(allow_core_sharing=True))
    home = {p.rank: frozenset(p.cores) for p in plan.stage("sim")}
    gen, train = plan.stage("gen")[0].cores, plan.stage("train")[0].cores
    pool = tuple(sorted(set(gen) | set(train)))
    return home, pool, gen, train, plan.warnings


def pool_size(settings: ResourceSettings, topology: Topology, sim_workers: int) -> int:
    """Units gen and train split: the thread budget unpinned, else the cores left to them."""
    if not settings.pin:
        return settings.gen_threads + settings.train_threads
    return len(_pinned_layout(topology, settings, sim_workers, 0.5)[1])


def initial_resources(
    settings: ResourceSettings,
    topology: Topology,
    sim_workers: int,
    profile: RateTable | None = None,
    max_gen_batch: int | None = None,
) -> RunResources:
    """The split a run starts with (see the module docstring).

    Args:
        settings: the ``resources`` group.
        topology: this machine (only its cores matter here).
        sim_workers: env worker processes.
        profile: gen and train throughput curves in threads; required for ``elastic``.
        max_gen_batch: largest usable generator batch (an env group's size).

    Raises:
        AllocationError: elastic without a profile, or a pool that cannot be split.
    """
    s = settings
    elastic = s.allocator == ELASTIC
    if elastic and profile is None:
        raise AllocationError("resources.allocator=elastic needs a profile")
    static_share = s.gen_threads / (s.gen_threads + s.train_threads)
    if not s.pin:
        if not elastic:
            return RunResources(
                StageResources(s.gen_threads, None, s.gen_batch), StageResources(s.train_threads)
            )
        pool = Pool(
            s.gen_threads + s.train_threads, shared_with_sim=True, cores=len(topology.cores)
        )
        alloc = _allocate(profile, pool, s, sim_workers, max_gen_batch)
        return RunResources(
            StageResources(alloc.gen_units, None, alloc.gen_batch),
            StageResources(alloc.train_units),
            pool=pool,
            allocation=alloc,
        )
    home, pool_cores, gen, train, warnings = _pinned_layout(topology, s, sim_workers, static_share)
    if not elastic:
        return RunResources(
            StageResources(s.gen_threads, gen, s.gen_batch),
            StageResources(s.train_threads, train),
            sim_home=home,
            pool_cores=pool_cores,
            warnings=warnings,
        )
    if len(pool_cores) < 2:
        raise AllocationError(
            f"resources.pin=true with allocator=elastic: gen and train share "
            f"{len(pool_cores)} core {list(pool_cores)}, nothing to split; give them more cores "
            "(resources.gen_cores/train_cores) or set resources.pin=false"
        )
    pool = Pool(len(pool_cores))
    alloc = _allocate(profile, pool, s, sim_workers, max_gen_batch)
    gen_res, train_res = split_resources(alloc, pool_cores, topology)
    return RunResources(gen_res, train_res, home, pool, pool_cores, alloc, warnings)


def _allocate(
    profile: RateTable | None,
    pool: Pool,
    s: ResourceSettings,
    sim_workers: int,
    max_gen_batch: int | None,
) -> Allocation:
    """Algorithm 1 for a run: its simulators (env workers of ``max_gen_batch`` envs, from the
    profile's ``sim`` stage) in the model, headroom the rebalance threshold."""
    assert profile is not None  # initial_resources refuses elastic without one
    return allocate_with_sims(
        profile, pool, sim_workers, max_gen_batch, max_gen_batch, headroom=s.rebalance_threshold
    )


def split_resources(
    alloc: Allocation, pool_cores: Sequence[int] | None, topology: Topology | None = None
) -> tuple[StageResources, StageResources]:
    """Gen's and train's resources for an allocation: its units as threads, and with pinning
    as that many cores of the pool (:func:`cpu_split`, node by node)."""
    if pool_cores is None:
        return (
            StageResources(alloc.gen_units, None, alloc.gen_batch),
            StageResources(alloc.train_units),
        )
    if topology is None:
        raise AllocationError("split_resources: pinning needs the topology")
    gen, train = cpu_split(topology, alloc.gen_units / alloc.pool.units, pool_cores)
    return (
        StageResources(len(gen), gen, alloc.gen_batch),
        StageResources(len(train), train),
    )


def restrict_train_batch(profile: RateTable, samples: int) -> RateTable:
    """Keep only the train points at the profiled size nearest the run's decisions per update.

    The learner's minibatch is an algorithm setting (it changes the updates, not just their
    speed), so the allocator takes it as given rather than choosing it.
    """
    have = profile.batch_sizes("train")
    if not have:
        raise AllocationError("the profile has no 'train' points")
    best = min(have, key=lambda b: (abs(b - samples), b))
    pts = [p for p in profile.points if p.stage != "train" or p.batch_size == best]
    return dataclasses.replace(profile, points=pts)


def train_minibatch(cfg: Mapping[str, Any], decisions_per_env: int) -> int:
    """The learner's minibatch in decisions: a segment's ``num_envs x T`` over the minibatches."""
    algo = cfg["algo"].get("cfg", {}) or {}
    per_segment = int(cfg["num_envs"]) * decisions_per_env
    return max(1, per_segment // max(1, int(algo.get("num_minibatches", 1))))
