"""The run's shape (env groups G, step level, M, the generator's and the learner's threads),
chosen from a short profile of its own stages.

``measure`` times this run's simulator env by env, its generator at a few batch sizes and one
learner update, at each thread count the run may give them (about three seconds on the
embedded default); ``search`` plays every candidate shape at every thread split through the
schedule model (``ebrl.resources.model``) on those costs and keeps the fastest, unless a simpler
shape (fewer groups, lock step, fewer threads) is within 2% of it. Where the step costs are
uniform and the simulators keep every core busy, that is one group in lock step (the Async
schedule); where the simulators wait or their step latency has a tail, pipelining and the step
level pay, and the search takes them. A thread that does not make its stage faster alone is not
given: on a machine the simulators fill, it only takes cores from them.

The layer knows stages only through the callables it is given: it does not import the policies,
the algorithms or the env groups.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ebrl.resources.apply import affinity_guard, set_threads, threads_guard
from ebrl.resources.model import (
    CostTable,
    Prediction,
    Shape,
    Split,
    StageCosts,
    Workload,
    candidates,
    choose,
    costs_for,
    fit_cores,
    rank,
    splits_of,
    thread_options,  # noqa: F401 (the measured thread counts: control.py reads it from here)
    with_threads,
)

log = logging.getLogger(__name__)

#: step one env's chunk: env index -> None (the sampler times it)
StepOne = Callable[[int], None]
#: one generator call on a batch of this many envs
GenCall = Callable[[int], None]


@dataclass(frozen=True)
class Probes:
    """The run's stages as the shape search times them.

    The generator's and the learner's calls run on this process's torch threads, which
    :func:`measure` sets for each thread count it times (a call must not change them).

    Attributes:
        sim_envs: envs of one env worker, ready to step.
        step_one: steps env ``i`` (0 <= i < sim_envs) through one chunk.
        gen_call: one generator call on a batch of ``b`` envs.
        train_update: one whole learner update (every epoch of one segment).
        close: releases what the probes built.
        train_warm: the learner's warm-up before it is timed (None: a whole update; one
            minibatch step is enough to allocate and fill the caches).
    """

    sim_envs: int
    step_one: StepOne
    gen_call: GenCall
    train_update: Callable[[], None]
    close: Callable[[], None] = lambda: None
    train_warm: Callable[[], None] | None = None


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall, CPU) seconds of one call (CPU: this process, all threads)."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def measure(
    probes: Probes,
    gen_batches: Sequence[int],
    sim_rounds: int = 3,
    gen_repeats: int = 3,
    sim_budget_s: float = 0.25,
    sim_samples: int = 256,
    gen_threads: Sequence[int] = (1,),
    train_threads: Sequence[int] = (1,),
) -> tuple[dict[Split, StageCosts], float]:
    """The stage costs of ``probes`` at every (gen, train) thread split of ``gen_threads`` x
    ``train_threads`` (fewest threads first), and the seconds it took to measure them.

    Each stage gets one untimed warm-up call (the generator and the learner one at each thread
    count). The simulator steps every env ``sim_rounds`` times, and more rounds while it stays
    under ``sim_budget_s`` and ``sim_samples`` chunks (a cheap simulator's tail needs many
    samples to show). The generator's cost per call is fitted as ``fixed + per_env * batch``
    over ``gen_batches`` (least squares on the median of ``gen_repeats`` calls each).
    """
    t0 = time.perf_counter()
    with threads_guard(), affinity_guard():
        try:
            probes.step_one(0)
            walls: list[float] = []
            cpus: list[float] = []
            rounds = 0
            while rounds < sim_rounds or (
                sum(walls) < sim_budget_s and len(walls) + probes.sim_envs <= sim_samples
            ):
                for i in range(probes.sim_envs):
                    w, c = _timed(lambda i=i: probes.step_one(i))
                    walls.append(w)
                    cpus.append(c)
                rounds += 1
            gens = {g: _measure_gen(probes, gen_batches, gen_repeats, g) for g in gen_threads}
            trains = {t: _measure_train(probes, t) for t in train_threads}
        finally:
            probes.close()
    sim = dict(sim_chunk_s=tuple(walls), sim_busy=min(1.0, sum(cpus) / sum(walls)))
    table = {
        (g, t): StageCosts(**sim, **gens[g], **trains[t])
        for g, t in splits_of(list(gens), list(trains))
    }
    return table, time.perf_counter() - t0


def _measure_gen(
    probes: Probes, gen_batches: Sequence[int], repeats: int, threads: int
) -> dict[str, float]:
    """The generator's cost fields at ``threads``."""
    set_threads(threads)
    batches = sorted({max(1, int(b)) for b in gen_batches})
    per_call, wall, cpu = [], 0.0, 0.0
    for b in batches:
        probes.gen_call(b)
        runs = [_timed(lambda b=b: probes.gen_call(b)) for _ in range(repeats)]
        per_call.append(float(np.median([w for w, _ in runs])))
        wall += sum(w for w, _ in runs)
        cpu += sum(c for _, c in runs)
    if len(batches) > 1:
        slope, fixed = np.polyfit(np.array(batches, float), np.array(per_call), 1)
        slope, fixed = max(0.0, float(slope)), max(0.0, float(fixed))
    else:
        slope, fixed = per_call[0] / batches[0], 0.0
    busy = cpu / wall if wall > 0 else 1.0
    return {"gen_fixed_s": fixed, "gen_per_env_s": slope, "gen_busy": busy}


def _measure_train(probes: Probes, threads: int) -> dict[str, float]:
    """The learner's cost fields at ``threads``."""
    set_threads(threads)
    (probes.train_warm or probes.train_update)()
    wall, cpu = _timed(probes.train_update)
    return {"train_s": wall, "train_busy": cpu / wall if wall > 0 else 1.0}


#: shapes the run measures in situ: the model's choice, the others it predicts within this
#: share of the best, and the simplest candidate (one group in lock step, the Async schedule)
TRIAL_BAND = 0.10
#: at most this many shapes are measured in situ
TRIAL_MAX = 3


@dataclass(frozen=True)
class ShapeChoice:
    """What the search chose, from what, and what it cost.

    Attributes:
        shape: the choice.
        ranked: every candidate's prediction, best first.
        costs: the stage costs measured at start: one set, or a table by thread split when
            the threads were searched (the candidates carry their split).
        measure_s: seconds the profile took; search_s: the search.
        work: the workload the search played (its ``cores``: the cores the run was given).
        shapes: the candidates, simplest first (what :func:`recalibrate` weighs again).
        recalibration: what the run itself measured later (:func:`recalibrate`), if it has.
        searched: the search's own choice, where :meth:`unmeasured` set another in its place.
    """

    shape: Shape
    ranked: tuple[Prediction, ...]
    costs: StageCosts | CostTable
    measure_s: float
    search_s: float
    work: Workload | None = None
    shapes: tuple[Shape, ...] = ()
    recalibration: Recalibration | None = None
    searched: Shape | None = None

    def unmeasured(self, band: float = TRIAL_BAND) -> ShapeChoice:
        """The choice for a run that will measure no shape against another (too short for a
        second trial, or trials off): the simplest candidate the model predicts within
        ``band`` of the best. A gain inside the model's own error that the run cannot check
        is not worth the risk; the search's 2% margin is for a run whose trials check it."""
        best = self.ranked[0].throughput
        rate = {p.shape: p.throughput for p in self.ranked}
        for s in self.shapes:
            if rate.get(s, 0.0) >= best * (1 - band):
                if s == self.shape:
                    return self
                log.info(
                    "shape: the run measures one shape: %s (predicted %.0f), not %s (%.0f), "
                    "within the model's %.0f%% band",
                    s.describe(), rate[s], self.shape.describe(), self.predicted(), band * 100,
                )  # fmt: skip
                return dataclasses.replace(self, shape=s, searched=self.shape)
        return self

    def describe(self) -> str:
        best, ours = self.ranked[0].throughput, self.predicted()
        return (
            f"{self.shape.describe()} (predicted {ours:.0f} env steps/s, best {best:.0f}; "
            f"profile {self.measure_s:.1f} s, search {self.search_s:.2f} s)"
        )

    def chosen_costs(self) -> StageCosts:
        """The stage costs of the chosen shape (at its thread split)."""
        return costs_for(self.costs, self.shape)

    def to_dict(self) -> dict[str, Any]:
        table = {} if isinstance(self.costs, StageCosts) else self.costs
        return {
            "shape": self.shape.to_dict(),
            **({"searched": self.searched.to_dict()} if self.searched is not None else {}),
            "profile_s": self.measure_s,
            "search_s": self.search_s,
            "costs": _costs_dict(self.chosen_costs()),
            **(
                {"costs_by_threads": {f"{g}+{t}": _costs_dict(c) for (g, t), c in table.items()}}
                if table
                else {}
            ),
            "predictions": [
                {
                    **p.shape.to_dict(),
                    "throughput": p.throughput,
                    "gen_busy": p.gen_busy,
                    "train_busy": p.train_busy,
                    "mean_batch": p.mean_batch,
                    "bubble": p.bubble,
                }
                for p in self.ranked
            ],
            **({"recalibration": self.recalibration.to_dict()} if self.recalibration else {}),
        }

    def prediction(self) -> Prediction:
        """The chosen shape's prediction (its ``update_s`` turns a minutes budget into
        updates: :func:`ebrl.resources.allotment.run_updates`)."""
        return next(p for p in self.ranked if p.shape == self.shape)

    def predicted(self) -> float:
        """The chosen shape's predicted env steps per second."""
        return self.prediction().throughput

    def metrics(self) -> dict[str, float]:
        """MLflow metrics of the search: its cost and its prediction."""
        return {
            "shape/profile_s": self.measure_s,
            "shape/search_s": self.search_s,
            "shape/predicted_env_steps_per_s": self.predicted(),
        }

    def params(self) -> dict[str, Any]:
        """MLflow params of the choice."""
        threads = self.shape.threads
        return {
            "shape/env_groups": self.shape.groups,
            "shape/step_level": self.shape.step_level,
            "shape/batch_min": self.shape.batch_min if self.shape.step_level else "none",
            "shape/batch_max": self.shape.cap if self.shape.step_level else "none",
            "shape/gen_threads": threads[0] if threads else "run's",
            "shape/train_threads": threads[1] if threads else "run's",
        }

    def save(self, run_dir: Path) -> Path:
        path = Path(run_dir) / "shape.json"
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def _costs_dict(c: StageCosts) -> dict[str, float]:
    return {
        "sim_chunk_mean_s": c.sim_mean_s,
        "sim_tail_p99_over_mean": c.tail,
        "sim_busy": c.sim_busy,
        "gen_fixed_s": c.gen_fixed_s,
        "gen_per_env_s": c.gen_per_env_s,
        "gen_busy": c.gen_busy,
        "train_s": c.train_s,
        "train_busy": c.train_busy,
        "message_s": c.message_s,
    }


def search(
    costs: StageCosts | CostTable,
    work: Workload,
    groups: Sequence[int] | None,
    step_level: bool | None,
    batch_min: int | None,
    timeout_s: float,
    measure_s: float = 0.0,
    batch_max: int | None = None,
) -> ShapeChoice:
    """Choose among the candidate shapes; a pinned knob (not None) is not searched. Given a
    table of costs by thread split (:func:`measure`) with more than one split, every shape is
    weighed at each split (fewest threads first: the simpler of two equals); with one, the
    threads are the run's own and the shapes carry none."""
    t0 = time.perf_counter()
    shapes = candidates(
        work,
        groups=groups,
        step_level=(False, True) if step_level is None else (step_level,),
        batch_min=batch_min,
        timeout_s=timeout_s,
        batch_max=batch_max,
    )
    if not isinstance(costs, StageCosts):
        if len(costs) == 1:
            costs = next(iter(costs.values()))
        else:
            shapes = with_threads(shapes, list(costs))
    shape, ranked = choose(costs, work, shapes)
    took = time.perf_counter() - t0
    choice = ShapeChoice(shape, tuple(ranked), costs, measure_s, took, work, tuple(shapes))
    log.info("shape: %s", choice.describe())
    return choice


def gen_batches_for(work: Workload) -> list[int]:
    """Generator batch sizes to time: every M and group size a candidate could call with."""
    sizes = {1, work.num_envs}
    for s in candidates(work):
        sizes.add(s.batch_min)
        sizes.add(math.ceil(work.num_envs / s.groups))
    return sorted(sizes)


def shortlist(
    choice: ShapeChoice, band: float = TRIAL_BAND, most: int = TRIAL_MAX
) -> tuple[Shape, ...]:
    """The shapes the run measures itself, in the order it runs them: the model's choice (what
    it starts with), then the simplest candidate, so that a schedule the search contains (one
    group in lock step is the Async schedule) is never lost to a model's error, then the others
    predicted within ``band`` of the best, best first. At most ``most`` shapes: a shorter run
    measures fewer (:func:`ebrl.resources.allotment.trial_plan`), the first ones."""
    best = choice.ranked[0].throughput
    simplest = choice.shapes[0] if choice.shapes else choice.shape
    out = list(dict.fromkeys([choice.shape, simplest]))
    for p in choice.ranked:
        if p.shape not in out and p.throughput >= best * (1 - band):
            out.append(p.shape)
    return tuple(out[: max(1, most)])


@dataclass
class Trial:
    """One shape measured in the run: the updates it ran, their seconds and env steps."""

    shape: Shape
    updates: int = 0
    seconds: float = 0.0
    env_steps: int = 0

    @property
    def rate(self) -> float:
        """Env steps per second (0 before its first update)."""
        return self.env_steps / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.shape.to_dict(),
            "updates": self.updates,
            "seconds": self.seconds,
            "env_steps": self.env_steps,
            "env_steps_per_s": self.rate,
        }


class ShapeTrials:
    """Successive in-situ measurement of the shortlisted shapes: each runs ``updates`` updates
    (after ``skip`` start-up ones), measured from the times the updates' reports arrive; then
    the run keeps the fastest. The model ranks shapes from a solo profile of each stage; this is
    what the run itself makes of them, contention and all.

    With overlap, the interval between two reports is the time between two segments' last
    decisions, which began a training step earlier: the first interval after a move mixes the
    old shape and the new one, so ``settle`` updates after each move are not counted.

    Args:
        shapes: the shortlist (:func:`shortlist`); the run is running the first.
        skip: updates not measured (start-up is not steady).
        updates: updates each shape is measured for.
        settle: updates after a move that are not measured.
    """

    def __init__(
        self, shapes: Sequence[Shape], skip: int = 1, updates: int = 1, settle: int = 1
    ) -> None:
        if not shapes:
            raise ValueError("ShapeTrials: no shape to measure")
        self.trials = [Trial(s) for s in shapes]
        self.skip, self.updates, self.settle = max(1, skip), max(1, updates), max(0, settle)
        self.settling = 0  # updates still to let pass before the running trial is measured
        self.seen = 0
        self.current = 0  # index of the trial running now
        self.last: float | None = None  # when the last report arrived
        self.started: float | None = None  # when the first trial began to be measured
        self.ended: float | None = None
        self.winner: Trial | None = None

    @property
    def done(self) -> bool:
        return self.winner is not None

    @property
    def seconds(self) -> float:
        """How long the trials ran (0 until they end)."""
        if self.ended is None or self.started is None:
            return 0.0
        return self.ended - self.started

    def add(self, at: float, env_steps: int) -> Shape | None:
        """An update's report arrived at ``at`` (seconds) with ``env_steps``. Returns the shape
        to run from now on when it changes (the next trial, or the winner), else None."""
        self.seen += 1
        if self.done:
            return None
        if self.seen <= self.skip:
            self.last = self.started = at
            return None
        assert self.last is not None
        if self.settling:
            self.settling -= 1
            self.last = at
            return None
        t = self.trials[self.current]
        t.updates += 1
        t.seconds += at - self.last
        t.env_steps += int(env_steps)
        self.last = at
        if t.updates < self.updates:
            return None
        if self.current + 1 < len(self.trials):
            self.current += 1
            self.settling = self.settle
            return self.trials[self.current].shape
        self.ended = at
        self.winner = max(self.trials, key=lambda x: x.rate)  # the first of equals
        return self.winner.shape if self.winner is not t else None


@dataclass(frozen=True)
class Recalibration:
    """What the run measured of the shortlisted shapes, and the model held against it.

    Attributes:
        measured: env steps per second of the shape the run keeps (the fastest measured).
        predicted: what the start-up model predicted for the shape it started with.
        cores: the machine's effective cores that make the model predict ``measured`` for
            the kept shape (:func:`ebrl.resources.model.fit_cores`), below the cores it was
            given where the solo profile misses contention.
        ranked: predictions at those cores, best first: of the measured shapes while the run
            runs, of every candidate once :func:`rerank` has run (at the run's end).
        before: the shape the run started with; after: the one it runs from now on.
        seconds: what refitting cost in the run (the driver's CPU, once).
        trials: every shortlisted shape as the run measured it, in the order they ran.
        trial_s: the seconds the trials took (the shapes' updates, start to end).
        rerank_s: what re-ranking every candidate cost (None: not done yet).
    """

    measured: float
    predicted: float
    cores: float
    ranked: tuple[Prediction, ...]
    before: Shape
    after: Shape
    seconds: float
    trials: tuple[Trial, ...] = ()
    trial_s: float = 0.0
    rerank_s: float | None = None

    @property
    def changed(self) -> bool:
        return self.after != self.before

    def describe(self) -> str:
        move = f"-> {self.after.describe()}" if self.changed else "kept"
        tried = "; ".join(f"{t.shape.describe()} {t.rate:.0f}" for t in self.trials)
        return (
            f"measured in the run: {tried} env steps/s; {move}; model refit "
            f"{self.cores:.2f} effective cores (predicted {self.predicted:.0f} for "
            f"{self.before.describe()}; {self.seconds:.2f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured": self.measured,
            "predicted": self.predicted,
            "cores_effective": self.cores,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "seconds": self.seconds,
            "trial_s": self.trial_s,
            "rerank_s": self.rerank_s,
            "trials": [t.to_dict() for t in self.trials],
            "predictions": [{**p.shape.to_dict(), "throughput": p.throughput} for p in self.ranked],
        }

    def metrics(self) -> dict[str, float]:
        a = self.after
        return {
            "shape/cores_effective": self.cores,
            "shape/measured_env_steps_per_s": self.measured,
            "shape/reshaped": float(self.changed),
            "shape/recalibrate_s": self.seconds,
            "shape/trials": float(len(self.trials)),
            "shape/trial_s": self.trial_s,
            "shape/final_env_groups": float(a.groups),
            "shape/final_step_level": float(a.step_level),
            "shape/final_batch_min": float(a.batch_min if a.step_level else 0),
            **(
                {
                    "shape/final_gen_threads": float(a.threads[0]),
                    "shape/final_train_threads": float(a.threads[1]),
                }
                if a.threads
                else {}
            ),
        }


def recalibrate(
    choice: ShapeChoice, trials: Sequence[Trial], trial_s: float = 0.0
) -> Recalibration:
    """The run keeps the fastest shape it measured; the model is refit to that rate (one number:
    the machine's effective cores) and predicts each measured shape there (what the shape watch
    corrects its model with).

    Re-ranking every candidate at the refit cores (what the log, the planner and ``shape.json``
    read: how far the solo profile was from the run) is left to :func:`rerank` at the run's end:
    it decides nothing in the run, and on a machine the stages fill its CPU (about four times
    the refit's) would come out of theirs."""
    t0 = time.perf_counter()
    assert choice.work is not None, "a ShapeChoice made by search() carries its workload"
    measured = [t for t in trials if t.updates > 0]
    if not measured:
        raise ValueError("recalibrate: no shape was measured")
    best = max(measured, key=lambda t: t.rate)
    cores = fit_cores(choice.costs, choice.work, best.shape, best.rate)  # at its own split
    work = dataclasses.replace(choice.work, cores=cores)
    ranked = rank(choice.costs, work, list(dict.fromkeys(t.shape for t in measured)))
    rec = Recalibration(
        best.rate, choice.predicted(), cores, tuple(ranked), choice.shape, best.shape,
        time.perf_counter() - t0, tuple(trials), trial_s,
    )  # fmt: skip
    log.info("shape: %s", rec.describe())
    return rec


def rerank(choice: ShapeChoice) -> ShapeChoice:
    """``choice`` with its recalibration's ``ranked`` holding every candidate's prediction at
    the refit cores (and what that took, ``rerank_s``); unchanged without a recalibration or
    once done."""
    rec = choice.recalibration
    if rec is None or rec.rerank_s is not None:
        return choice
    t0 = time.perf_counter()
    assert choice.work is not None, "a ShapeChoice made by search() carries its workload"
    work = dataclasses.replace(choice.work, cores=rec.cores)
    ranked = rank(choice.costs, work, choice.shapes or (choice.shape,))
    done = dataclasses.replace(rec, ranked=tuple(ranked), rerank_s=time.perf_counter() - t0)
    return dataclasses.replace(choice, recalibration=done)
