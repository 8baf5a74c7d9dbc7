"""The elastic allocator's offline search (the paper's Algorithm 1): split a pool between gen and
train.

Offline: from a :class:`~ebrl.resources.profiler.RateTable`, :func:`allocate` searches the split of
a pool (cores/threads on CPU, SM percent on GPU) between gen and train, and their batch sizes, so
that the pipeline's slowest stage is as fast as possible. For fixed batch sizes gen's throughput
rises with its share ``g`` and train's falls (it gets ``pool - g``), so ``min(gen, train)`` peaks
where the curves cross: a binary search over ``g`` finds it in ``log2(pool)`` steps. Batch sizes
come from the profiled grid (a handful each), so every pair is searched.

The simulators are the pipeline's third stage. Given their rate ``sim_rate`` (the profile's
``sim`` stage), a split is worth at most that much, and among splits that reach it the smallest
generator batch wins (a larger one only makes ready envs wait). When the pool is the simulators'
own CPUs (``Pool.shared_with_sim``: unpinned threads on a CPU machine), units gen and train do not
need are better left to the simulators: the allocator then gives each stage the smallest share that
keeps up with the simulators with ``headroom`` to spare (a binary search on each monotone curve),
and leaves the rest of the pool unused.

When the pool also says how many CPUs the three stages share (``Pool.cores``) and the simulators'
worker count is known, the shared-CPU model (:func:`shared_cpu_rate`) prices every split instead:
each decision costs the simulators ``1 / s`` core-seconds (``s``: one worker's rate on one core),
the generator ``g / gen(g)`` and the learner ``t / train(t)`` (their threads, busy, for the time
the profile says a decision takes), so the CPUs sustain ``cores / (1/s + g/gen(g) + t/train(t))``
decisions/s, and no stage more than its own capacity. There a thread more for gen or train also
takes CPU from the simulators, so the pipeline's rate is not where two monotone curves cross and
the bisection's premise fails; the search evaluates every split, which for a pool of threads is
a few thousand evaluations at most.

The run-time side: ``ebrl.resources.monitors`` (when to search again) and
``ebrl.resources.elastic`` (:class:`~ebrl.resources.elastic.ElasticAllocator`).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ebrl.resources.assign import StageRequest
from ebrl.resources.profiler import RateTable

Curve = Callable[[int], float]


class AllocationError(ValueError):
    """The pool cannot be split, or the profile lacks what the search needs."""


@dataclass(frozen=True)
class Pool:
    """What gen and train split.

    Attributes:
        units: its size: cores (= torch threads) on CPU, 100 for SM percent on one GPU.
        unit: ``threads`` or ``sm_percent`` (must match the profile's share unit).
        min_units: each stage gets at least this many.
        shared_with_sim: the pool is the simulators' own CPUs (unpinned threads on a CPU
            machine): units gen and train do not need are left unused, to the simulators.
        cores: with ``shared_with_sim``, the CPUs gen, train and the simulators share (None:
            unknown; the shared-CPU model needs it).
    """

    units: int
    unit: str = "threads"
    min_units: int = 1
    shared_with_sim: bool = False
    cores: int | None = None

    def __post_init__(self) -> None:
        if self.min_units < 1 or self.units < 2 * self.min_units:
            raise AllocationError(
                f"Pool: {self.units} {self.unit} cannot give gen and train {self.min_units} each"
            )
        if self.cores is not None and self.cores < 1:
            raise AllocationError(f"Pool: cores={self.cores} must be >= 1")


@dataclass(frozen=True)
class Allocation:
    """A split of the pool and the batch sizes, with the throughputs the profile predicts.

    Attributes:
        gen_units: gen's part of the pool (threads / cores, or SM percent).
        train_units: train's part.
        gen_batch: generator batch size.
        train_batch: the learner's profiled size (decisions an update trains on).
        gen_throughput: predicted gen items/s.
        train_throughput: predicted train items/s.
        pool: the pool split.
        evaluations: curve evaluations the search made (its cost).
        sim_throughput: the simulators' rate the search assumed (inf: not modelled; with the
            shared-CPU model, what they reach on the CPU gen and train leave them).
    """

    gen_units: int
    train_units: int
    gen_batch: int
    train_batch: int
    gen_throughput: float
    train_throughput: float
    pool: Pool
    evaluations: int = 0
    sim_throughput: float = math.inf

    @property
    def gen_share(self) -> float:
        """Gen's fraction of the pool, in [0, 1]."""
        return self.gen_units / self.pool.units

    @property
    def throughput(self) -> float:
        """What the pipeline sustains: the slowest stage's throughput."""
        return min(self.gen_throughput, self.train_throughput, self.sim_throughput)

    @property
    def bound(self) -> str:
        """The stage the prediction says sets the pace: ``sim``, ``gen`` or ``train``."""
        rates = {"sim": self.sim_throughput, "gen": self.gen_throughput}
        rates["train"] = self.train_throughput
        return min(rates, key=rates.__getitem__)

    @property
    def unused_units(self) -> int:
        """Units of the pool left to the simulators (``Pool.shared_with_sim``)."""
        return self.pool.units - self.gen_units - self.train_units

    @property
    def imbalance(self) -> float:
        return divergence(self.gen_throughput, self.train_throughput)

    def same_split(self, other: Allocation) -> bool:
        """Same units and batch sizes (nothing to apply)."""
        return (self.gen_units, self.train_units, self.gen_batch, self.train_batch) == (
            other.gen_units,
            other.train_units,
            other.gen_batch,
            other.train_batch,
        )

    def describe(self) -> str:
        out = (
            f"gen {self.gen_units} {self.pool.unit} batch {self.gen_batch} "
            f"({self.gen_throughput:.1f}/s) | train {self.train_units} {self.pool.unit} "
            f"batch {self.train_batch} ({self.train_throughput:.1f}/s)"
        )
        if math.isfinite(self.sim_throughput):
            out += f" | sim {self.sim_throughput:.1f}/s"
        if self.unused_units:
            out += f" | {self.unused_units} {self.pool.unit} left to the simulators"
        return out


def divergence(a: float, b: float) -> float:
    """Relative gap ``(max - min) / max`` in [0, 1] (0 when both are 0)."""
    hi = max(a, b)
    return 0.0 if hi <= 0 else (hi - min(a, b)) / hi


# --- curves -----------------------------------------------------------------------------------
def profile_curve(points: Sequence[tuple[int, float]]) -> Curve:
    """A non-decreasing throughput curve over integer shares from measured ``(share, tput)``.

    Linear between measured shares; proportional to the share below the smallest (no share, no
    throughput); flat above the largest (no evidence it scales further). Measured throughputs are
    made non-decreasing first (running maximum): a stage given more resources can always leave
    them idle, and noise would otherwise break the binary search's premise.
    """
    if not points:
        raise AllocationError("profile_curve: no points")
    pts = sorted(points)
    xs = [float(s) for s, _ in pts]
    ys: list[float] = []
    for _, y in pts:
        ys.append(max(y, ys[-1]) if ys else y)

    # Rounding is monotone, so each formula below is non-decreasing in u; the clamps keep a
    # rounded value from stepping past a measured point (an ulp above or below is enough to
    # break the binary search's premise, which hypothesis found).
    def f(units: int) -> float:
        u = float(units)
        if u <= 0:
            return 0.0
        if u >= xs[-1]:
            return ys[-1]
        if u == xs[0]:
            return ys[0]
        if u < xs[0]:  # here 0 < u < xs[0]
            return min(ys[0], ys[0] * u / xs[0])
        i = bisect.bisect_right(xs, u)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return min(max(y0 + (y1 - y0) * (u - x0) / (x1 - x0), y0), y1)

    return f


# --- the search -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """Result of balancing two curves: gen gets ``gen_units``; ``value`` = min of the two."""

    gen_units: int
    value: float
    gen: float
    train: float
    evaluations: int


def _better(a: Split, b: Split) -> Split:
    """The higher minimum; ties: the more balanced, then fewer gen units (deterministic)."""
    ka = (a.value, -divergence(a.gen, a.train), -a.gen_units)
    kb = (b.value, -divergence(b.gen, b.train), -b.gen_units)
    return a if ka >= kb else b


def balance(gen: Curve, train: Curve, units: int, min_units: int = 1) -> Split:
    """Binary-search the split maximising ``min(gen(g), train(units - g))``.

    Requires ``gen`` non-decreasing and ``train`` non-decreasing in their own share (so
    ``train(units - g)`` falls as ``g`` rises). Let ``g*`` be the smallest ``g`` with
    ``gen(g) >= train(units - g)``. Left of it the minimum is ``gen(g) <= gen(g* - 1)``; from it
    on the minimum is ``train(units - g) <= train(units - g*)``; so the best split is ``g* - 1``
    or ``g*``, found with ``O(log units)`` evaluations.
    """
    lo, hi = min_units, units - min_units
    if lo > hi:
        raise AllocationError(f"balance: {units} units cannot give each side {min_units}")
    evals = 0
    cache: dict[int, tuple[float, float]] = {}

    def at(g: int) -> tuple[float, float]:
        nonlocal evals
        if g not in cache:
            evals += 2
            cache[g] = (gen(g), train(units - g))
        return cache[g]

    a, b = lo, hi + 1  # invariant: g* in [a, b]; b = hi + 1 means gen never catches up
    while a < b:
        mid = (a + b) // 2
        fg, ft = at(mid)
        if fg >= ft:
            b = mid
        else:
            a = mid + 1
    best: Split | None = None
    for g in (a - 1, a):
        if lo <= g <= hi:
            fg, ft = at(g)
            cand = Split(g, min(fg, ft), fg, ft, 0)
            best = cand if best is None else _better(cand, best)
    assert best is not None  # a - 1 or a lies in [lo, hi] since a is in [lo, hi + 1]
    return dataclasses.replace(best, evaluations=evals)


def first_at_least(curve: Curve, target: float, lo: int, hi: int) -> tuple[int | None, int]:
    """Smallest ``u`` in ``[lo, hi]`` with ``curve(u) >= target`` on a non-decreasing curve.

    Returns ``(u or None when even hi falls short, evaluations)``: a binary search.
    """
    evals = 0
    if lo > hi:
        return None, evals
    evals += 1
    if curve(hi) < target:
        return None, evals
    a, b = lo, hi  # invariant: curve(b) >= target; the answer is in [a, b]
    while a < b:
        mid = (a + b) // 2
        evals += 1
        if curve(mid) >= target:
            b = mid
        else:
            a = mid + 1
    return a, evals


def _batches(profile: RateTable, stage: str, limit: int | None) -> list[int]:
    have = profile.batch_sizes(stage)
    if not have:
        raise AllocationError(f"allocate: the profile has no '{stage}' points")
    ok = [b for b in have if limit is None or b <= limit]
    if not ok:
        raise AllocationError(
            f"allocate: every profiled {stage} batch size {have} exceeds the limit {limit}"
        )
    return ok


def shared_cpu_rate(
    cores: int,
    sim_per_core: float,
    sim_workers: int,
    gen_units: float,
    gen_rate: float,
    train_units: float,
    train_rate: float,
) -> float:
    """Decisions/s of a pipeline whose simulators, generator and learner share ``cores`` CPUs.

    Per decision the simulators need ``1 / sim_per_core`` core-seconds, the generator
    ``gen_units / gen_rate`` (the cores it keeps busy, for ``1 / gen_rate`` seconds) and the
    learner ``train_units / train_rate``. ``gen_units`` and ``train_units`` are busy cores, not
    threads: the profile's :meth:`~ebrl.resources.profiler.RateTable.busy` (a thread waiting at a
    synchronisation point sleeps), the thread count where it was not measured. The CPUs
    sustain ``cores`` core-seconds per second; the simulators cannot use more than
    ``min(sim_workers, cores)`` cores, and gen and train no more than their profiled capacity.
    """
    if min(cores, sim_per_core, sim_workers, gen_rate, train_rate) <= 0:
        return 0.0
    demand = 1.0 / sim_per_core + gen_units / gen_rate + train_units / train_rate
    return min(cores / demand, sim_per_core * min(sim_workers, cores), gen_rate, train_rate)


def sim_rate(profile: RateTable, workers: int, batch: int | None = None) -> float | None:
    """The simulators' decisions/s: ``workers`` times one worker's profiled rate (None: the
    profile has no ``sim`` stage, or no workers). ``batch``: the worker's env group size (the
    profiled size nearest it; default the largest profiled)."""
    sizes = profile.batch_sizes("sim")
    if not sizes or workers < 1:
        return None
    b = max(sizes) if batch is None else min(sizes, key=lambda x: (abs(x - batch), x))
    return workers * max(y for _, y in profile.curve("sim", b))


def allocate(
    profile: RateTable,
    pool: Pool,
    max_gen_batch: int | None = None,
    max_train_batch: int | None = None,
    search: Callable[[Curve, Curve, int, int], Split] = balance,
    *,
    sim_rate: float | None = None,
    headroom: float = 0.15,
    sufficient: Callable[[Curve, float, int, int], tuple[int | None, int]] = first_at_least,
    sim_workers: int | None = None,
) -> Allocation:
    """Algorithm 1: the split and batch sizes that maximise the pipeline's slowest stage.

    Args:
        profile: gen and train throughput curves, in the pool's unit.
        pool: what is split.
        max_gen_batch: largest usable generator batch (e.g. envs per group).
        max_train_batch: largest usable train size (decisions an update trains on).
        search: :func:`balance` (binary search) or :func:`balance_brute_force`.
        sim_rate: the simulators' decisions/s (:func:`sim_rate`; None: not modelled). A split is
            worth at most this much.
        headroom: with ``pool.shared_with_sim``, the smallest shares are sized to keep up with
            ``sim_rate * (1 + headroom)`` (measurement noise, episodes of varying length).
        sufficient: :func:`first_at_least` (binary search) or its brute-force reference.
        sim_workers: the simulators' processes; with ``pool.shared_with_sim``, ``pool.cores``
            and ``sim_rate``, every split is priced by :func:`shared_cpu_rate` (``search`` and
            ``sufficient`` are then unused).

    For each pair of batch sizes the candidates are the balanced split of the whole pool and,
    on a pool shared with the simulators, the smallest shares that keep up with them. The winner
    has the highest predicted pipeline throughput; ties go to fewer units used (more CPU for the
    simulators), then to the smaller batches (same throughput, less waiting), then to the more
    balanced split.
    """
    if profile.share_unit != pool.unit:
        raise AllocationError(
            f"allocate: profile shares are {profile.share_unit}, the pool is {pool.unit}"
        )
    if sim_rate is not None and not sim_rate > 0:
        raise AllocationError(f"allocate: sim_rate={sim_rate} must be positive")
    cap = math.inf if sim_rate is None else float(sim_rate)
    best: tuple[tuple, Allocation] | None = None
    evals = 0

    def consider(g: int, t: int, bg: int, bt: int, fg: float, ft: float) -> None:
        nonlocal best
        value = min(fg, ft, cap)
        key = (value, -(g + t), -bg, -bt, -divergence(fg, ft), -g)
        if best is None or key > best[0]:
            best = (key, Allocation(g, t, bg, bt, fg, ft, pool, sim_throughput=cap))

    lo, hi = pool.min_units, pool.units - pool.min_units
    if pool.shared_with_sim and pool.cores and math.isfinite(cap) and sim_workers:
        per_core = cap / sim_workers
        for bg in _batches(profile, "gen", max_gen_batch):
            gen = profile_curve(profile.curve("gen", bg))
            for bt in _batches(profile, "train", max_train_batch):
                train = profile_curve(profile.curve("train", bt))
                for g in range(lo, hi + 1):
                    fg = gen(g)
                    for t in range(pool.min_units, pool.units - g + 1):
                        ft = train(t)
                        evals += 2
                        rate = shared_cpu_rate(
                            pool.cores,
                            per_core,
                            sim_workers,
                            profile.busy("gen", g, bg),
                            fg,
                            profile.busy("train", t, bt),
                            ft,
                        )
                        key = (rate, -(g + t), -bg, -bt, -divergence(fg, ft), -g)
                        if best is None or key > best[0]:
                            a = Allocation(g, t, bg, bt, fg, ft, pool, sim_throughput=rate)
                            best = (key, a)
        assert best is not None
        return dataclasses.replace(best[1], evaluations=evals)
    for bg in _batches(profile, "gen", max_gen_batch):
        gen = profile_curve(profile.curve("gen", bg))
        for bt in _batches(profile, "train", max_train_batch):
            train = profile_curve(profile.curve("train", bt))
            s = search(gen, train, pool.units, pool.min_units)
            evals += s.evaluations
            consider(s.gen_units, pool.units - s.gen_units, bg, bt, s.gen, s.train)
            if pool.shared_with_sim and math.isfinite(cap):
                target = cap * (1.0 + headroom)
                g, n = sufficient(gen, target, lo, hi)
                evals += n
                if g is None:
                    continue
                t, n = sufficient(train, target, pool.min_units, pool.units - g)
                evals += n
                if t is not None:
                    evals += 2
                    consider(g, t, bg, bt, gen(g), train(t))
    assert best is not None
    return dataclasses.replace(best[1], evaluations=evals)


def allocate_with_sims(
    profile: RateTable,
    pool: Pool,
    sim_workers: int,
    sim_batch: int | None = None,
    max_gen_batch: int | None = None,
    max_train_batch: int | None = None,
    headroom: float = 0.15,
) -> Allocation:
    """:func:`allocate` with the simulators' rate read from the profile's ``sim`` stage
    (:func:`sim_rate` of ``sim_workers`` workers of ``sim_batch`` envs; none there: not
    modelled)."""
    return allocate(
        profile,
        pool,
        max_gen_batch,
        max_train_batch,
        sim_rate=sim_rate(profile, sim_workers, sim_batch),
        headroom=headroom,
        sim_workers=sim_workers or None,
    )


def predict(profile: RateTable, stage: str, units: int, batch: int) -> float:
    """The profile's throughput for a stage at any share (interpolated) and a profiled batch."""
    return profile_curve(profile.curve(stage, batch))(units)


def stage_requests(
    alloc: Allocation,
    gen_cores: int = 1,
    train_cores: int = 1,
    prefer_gpu: int | None = None,
) -> list[StageRequest]:
    """The gen and train requests for :func:`~ebrl.resources.assign.make_plan`.

    On a threads pool, each stage gets its units as cores (and threads); on an SM-percent pool,
    its units as ``gpu_share`` on one GPU with ``gen_cores`` / ``train_cores`` CPU cores.
    """
    if alloc.pool.unit == "sm_percent":
        return [
            StageRequest(
                "gen",
                cores_per_process=gen_cores,
                gpu_share=alloc.gen_units / 100,
                batch_size=alloc.gen_batch,
                prefer_gpu=prefer_gpu,
            ),
            StageRequest(
                "train",
                cores_per_process=train_cores,
                gpu_share=alloc.train_units / 100,
                batch_size=alloc.train_batch,
                prefer_gpu=prefer_gpu,
            ),
        ]
    return [
        StageRequest("gen", cores_per_process=alloc.gen_units, batch_size=alloc.gen_batch),
        StageRequest("train", cores_per_process=alloc.train_units, batch_size=alloc.train_batch),
    ]
