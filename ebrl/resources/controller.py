"""The resource controller while the run goes: one object on the driver, fed every event it acts on.

:class:`RunController` holds the run's resources (the starting split), the shape trials
(:class:`~ebrl.resources.shape.ShapeTrials`: the shortlisted shapes measured in the run, the
fastest kept) and Algorithm 1 at run time (:class:`~ebrl.resources.elastic.ElasticAllocator`).
The driver hands it:

- each update's report (:meth:`report`): the trials advance and may move the run to another
  shape; once they are over, the stages' measured rates go to the shape watch
  (:class:`~ebrl.resources.watch.ShapeWatch`: a stage that drifts has the whole shape searched
  again) or to Algorithm 1, which may decide a new gen/train split; it returns the
  ``resource/*`` and ``shape/*`` metrics of the update;
- the generator's rollout counters, out of its telemetry (:meth:`gauges`);
- each stage's acknowledgement of a split (:meth:`applied`): once both stages applied a
  reallocation, its cost (the stages' own seconds applying it) and latency (decision to the last
  acknowledgement: a stage takes it between calls) are logged, counted in the metrics and
  appended to ``reallocations.jsonl`` in the run folder. A firing whose search keeps the split is
  appended too (``changed: false``), so the file shows every time the trigger fired;
- a replaced process (:meth:`replaced`): its counters start again, and it gets the split in force.

Where a GPU is shared under MPS and Algorithm 1 chose its SM split (:meth:`split_sms`), the same
report feeds Algorithm 1 over the SMs (:class:`~ebrl.resources.sharing.SMResplitter`), weighed
against the run's time left (:class:`Pace`); a re-split is recorded in ``gpu_resplits.jsonl``,
the ``gpu/*`` metrics and an MLflow param (:meth:`unlogged_params`).

What it decides goes out through three callables the driver connects (:meth:`connect`): a shape
for every replica and env worker, a stage's resources for the generator or the learner, new SM
quotas for the roles (the GPU fabric restarts what must restart and says what is in force). It
knows nothing else of the engine, and changes nothing on the machine itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebrl.resources.allotment import ResourceSettings, RunResources, StageResources, split_resources
from ebrl.resources.elastic import ElasticAllocator, Reallocation
from ebrl.resources.meters import Pace, RolloutMeter, SimMeter
from ebrl.resources.model import Shape
from ebrl.resources.monitors import DivergenceMonitor
from ebrl.resources.profiler import RateTable
from ebrl.resources.shape import ShapeChoice, ShapeTrials, recalibrate, rerank
from ebrl.resources.sharing import Resplit, SMResplitter
from ebrl.resources.split import Allocation, AllocationError
from ebrl.resources.topology import Topology
from ebrl.resources.watch import ShapeMove, ShapeWatch

log = logging.getLogger(__name__)

#: generator gauges the controller reads (cumulative), kept out of the run's metrics
COUNTERS = (
    "resource/gen_clock",
    "resource/gen_decisions",
    "resource/gen_blocked_env_s",
    "resource/gen_busy_s",
)

#: a stage's resources to send: (role: "gen" | "learner", seq, resources)
SendSplit = Callable[[str, int, StageResources], None]
#: a shape to run from now on, for every replica and env worker
SendShape = Callable[[Shape], None]
#: SM quotas to put in force (role -> percent); returns the quotas in force once it is done
SendQuota = Callable[[dict[str, int]], dict[str, int]]


def elastic_allocator(
    profile: RateTable,
    current: RunResources,
    settings: ResourceSettings,
    max_gen_batch: int | None = None,
    sim_workers: int = 0,
) -> ElasticAllocator:
    """Algorithm 1 for a run: its profile (train restricted to the run's minibatch), starting
    from the run's allocation; fires on a divergence past ``rebalance_threshold`` held
    ``rebalance_patience`` updates (set, or scaled to the run by the caller)."""
    if current.allocation is None or current.pool is None:
        raise AllocationError("elastic allocator: the run's resources carry no allocation")
    if settings.rebalance_patience is None:
        raise AllocationError("elastic allocator: rebalance_patience must be set (scaled_patience)")
    allocator = ElasticAllocator(
        profile,
        current.pool,
        DivergenceMonitor(settings.rebalance_threshold, int(settings.rebalance_patience)),
        max_gen_batch=max_gen_batch,
        sim_workers=sim_workers,
        sim_batch=max_gen_batch,
        headroom=settings.rebalance_threshold,
    )
    allocator.current = current.allocation
    return allocator


@dataclass
class _Pending:
    realloc: Reallocation
    gen: StageResources
    train: StageResources
    decided: float
    waiting: set[str] = field(default_factory=lambda: {"gen", "learner"})
    work_s: float = 0.0  # the acknowledging stages' own seconds applying it, summed


@dataclass(frozen=True)
class Acknowledged:
    """What a stage last reported it runs with."""

    threads: int
    cores: tuple[int, ...]
    batch_min: int | None


class RunController:
    """The resource controller at run time (see the module's docstring).

    Args:
        resources: the run's starting split (with ``allocator=elastic``, its ``allocation`` and
            ``pool`` are required).
        num_envs: envs of the run (for the rollout meter).
        warmup: updates before rates are fed to Algorithm 1 (start-up is not steady).
        elastic: Algorithm 1 (None: a static split).
        topology: for re-pinning a new split (needed when ``resources.pool_cores`` is set).
        out_dir: the run folder: ``reallocations.jsonl`` and ``shape.json`` (None: log only).
        choice: the shape search's outcome, when the shape was searched.
        trials: the shortlisted shapes to measure in the run (None: none).
        watch: the shape searched again on a stage's drift once the trials are over (None:
            the shape stays; with Algorithm 1 it is the split that moves).
        clock: wall clock of acknowledgements (injectable for tests).
    """

    def __init__(
        self,
        resources: RunResources,
        num_envs: int,
        warmup: int = 1,
        *,
        elastic: ElasticAllocator | None = None,
        topology: Topology | None = None,
        out_dir: Path | None = None,
        choice: ShapeChoice | None = None,
        trials: ShapeTrials | None = None,
        watch: ShapeWatch | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if trials is not None and choice is None:
            raise ValueError("RunController: shape trials need the shape search's choice")
        if watch is not None and elastic is not None:
            raise ValueError("RunController: the shape watch and Algorithm 1 would both move")
        self.resources = resources
        self.meter = RolloutMeter(num_envs)
        self.warmup = max(1, warmup)
        self.elastic = elastic
        self.topology = topology
        self.out_dir = out_dir
        self.choice, self.trials, self.watch = choice, trials, watch
        self.clock = clock
        self.shape_moves = 0
        self.shape_kept = 0
        self.moved: tuple[ShapeMove, float] | None = None  # a move waiting for its next report
        self.sim_meter = SimMeter()
        self.counters: dict[str, float] = {}
        self.gen_last: tuple[float, float] | None = None  # (decisions, busy seconds)
        self.seen: dict[str, Acknowledged] = {}
        self.gen, self.train = resources.gen, resources.train
        self.sent: dict[str, tuple[int, StageResources]] = {}  # the last split sent per role
        self.seq = 0
        self.pending: dict[int, _Pending] = {}
        self.applied_count = 0
        self.unchanged = 0
        self.last = {k: math.nan for k in ("cost", "latency", "gen", "train", "rollout")}
        self.send_split: SendSplit = lambda role, seq, res: None
        self.send_shape: SendShape = lambda shape: None
        self.send_quota: SendQuota | None = None
        # Algorithm 1 over a shared GPU's SMs (split_sms): the policy (its history: the
        # re-splits applied), the quotas in force, the run's pace, the MLflow params not logged
        self.sm: SMResplitter | None = None
        self.sm_quotas: dict[str, int] = {}
        self.pace: Pace | None = None
        self._unlogged: dict[str, str] = {}

    # -- wiring --------------------------------------------------------------------------------
    def connect(
        self,
        send_split: SendSplit | None = None,
        send_shape: SendShape | None = None,
        send_quota: SendQuota | None = None,
    ):
        """Where decisions go once the workers are up."""
        if send_split is not None:
            self.send_split = send_split
        if send_shape is not None:
            self.send_shape = send_shape
        if send_quota is not None:
            self.send_quota = send_quota

    def split_sms(
        self,
        resplitter: SMResplitter,
        quotas: Mapping[str, int | None],
        budget: Mapping[str, Any] | None,
        started: float,
    ) -> None:
        """Algorithm 1 over a shared GPU's SMs from now on: ``resplitter`` fed each update's
        capacities, from ``quotas`` (role -> percent in force), a re-split weighed against the
        time ``budget`` leaves (the run's ``budget`` node; minutes from ``started``, on
        ``time.perf_counter``'s clock)."""
        self.sm = resplitter
        self.sm_quotas = {k: int(v) for k, v in quotas.items() if v is not None}
        self.pace = Pace(budget, started)

    def replaced(self, role: str) -> None:
        """``role``'s process was replaced: its rollout counters start again from zero, and it
        gets the split in force (it started with the run's starting split)."""
        self.meter.last = None
        self.gen_last = None
        for k in COUNTERS:
            self.counters.pop(k, None)
        self.sim_meter.last = None
        if self.watch is not None:  # a new process's rates start a level of their own
            self.watch.restart(self.watch.shape)
        if role in self.sent:
            self.send_split(role, *self.sent[role])

    # -- events --------------------------------------------------------------------------------
    def gauges(self, gauges: dict[str, float]) -> None:
        """Take the generator's rollout counters out of a telemetry message's gauges."""
        for k in COUNTERS:
            if k in gauges:
                self.counters[k] = gauges.pop(k)

    def applied(
        self,
        worker: str,
        seq: int,
        seconds: float,
        threads: int,
        cores: tuple[int, ...] = (),
        batch_min: int | None = None,
    ) -> Reallocation | None:
        """A stage's acknowledgement of split ``seq`` (0: the starting one) and what it runs
        with now; the completed record once both stages applied a reallocation."""
        self.seen[worker] = Acknowledged(threads, tuple(cores), batch_min)
        p = self.pending.get(seq) if seq > 0 else None
        if p is None:
            return None
        if worker in p.waiting:
            p.work_s += max(0.0, float(seconds))
        p.waiting.discard(worker)
        if p.waiting:
            return None
        del self.pending[seq]
        latency = self.clock() - p.decided
        assert self.elastic is not None
        done = self.elastic.applied(p.realloc, p.work_s, latency)
        self.applied_count += 1
        self.last["cost"], self.last["latency"] = p.work_s, latency
        self._record(done, p, applied=True)
        log.info(
            "reallocation %d at update %s in force %.3f s after the decision (%.4f s applying): "
            "%s | gen %s | train %s",
            seq, done.step, latency, p.work_s, done.cause, p.gen.describe(), p.train.describe(),
        )  # fmt: skip
        return done

    def report(
        self, iteration: int, env_steps: int, metrics: Mapping[str, float], at: float | None = None
    ) -> dict[str, float]:
        """Update ``iteration`` arrived (at ``at``, default now) with ``env_steps``: the shape
        trials advance, Algorithm 1 observes once they are over (while they run, the shape
        changes under it: its monitors would take the trials' own moves for a drift); the
        metrics to add to the update's."""
        trying = self.trials is not None and not self.trials.done
        now = time.monotonic() if at is None else at
        out = self._shape(env_steps, now)
        rollout, gen_cap = self._rates()
        train = metrics.get("resource/train_per_s_update")
        if rollout is not None:
            out["resource/rollout_per_s_update"] = rollout
        if gen_cap is not None:
            out["resource/gen_per_s_update"] = gen_cap
        sim = self.sim_meter.update(metrics)
        if sim is not None:
            out["resource/sim_steps_per_s_update"] = sim
        if self.watch is not None:
            if self.moved is not None:  # the previous update's move is in force by now
                self._record_move(*self.moved, latency=now - self.moved[1])
                self.moved = None
            if iteration >= self.warmup and not trying:
                rates = {"sim": sim, "gen": gen_cap, "train": train}
                move = self.watch.observe(rates, iteration)
                if move is not None:
                    self._moved(move, now)
            out.update(self.watch_metrics())
        if self.elastic is not None:
            ready = (
                iteration >= self.warmup
                and rollout is not None
                and train is not None
                and not trying
            )
            if ready:
                gen = gen_cap if gen_cap is not None else rollout
                self.rebalance(gen, float(train), iteration, rollout)
            out.update(self.elastic_metrics())
        if self.sm is not None and self.send_quota is not None:
            gen = gen_cap if gen_cap is not None else rollout
            ready = iteration >= self.warmup and not trying and None not in (gen, train)
            out.update(self._resplit_sms(iteration, env_steps, gen, train, ready))
        for role, key in (("gen", "gen"), ("learner", "train")):
            a = self.seen.get(role)
            if a is not None:
                out[f"resource/{key}_threads"] = float(a.threads)
                out[f"resource/{key}_cores"] = float(len(a.cores))
        g = self.seen.get("gen")
        if g is not None and g.batch_min is not None:
            out["resource/gen_batch"] = float(g.batch_min)
        return out

    def rebalance(
        self, gen: float, train: float, step: int, rollout: float | None = None
    ) -> tuple[int, StageResources, StageResources] | None:
        """Algorithm 1's step on one update's measured capacities (the generator's, the
        learner's, the rollout's): ``(seq, gen, train)`` when it decided a new split (sent), else
        None (a firing that kept the split is recorded)."""
        assert self.elastic is not None, "rebalance needs allocator=elastic"
        self.last["gen"], self.last["train"] = gen, train
        self.last["rollout"] = math.nan if rollout is None else rollout
        r = self.elastic.observe(gen, train, step=step, sim_throughput=rollout)
        if r is None:
            return None
        if not r.changed:  # the trigger fired, the search kept the split: recorded, nothing to do
            self.unchanged += 1
            self._record(r, _Pending(r, self.gen, self.train, self.clock()), applied=False)
            return None
        gen_res, train_res = split_resources(r.new, self.resources.pool_cores, self.topology)
        self.seq += 1
        self.pending[self.seq] = _Pending(r, gen_res, train_res, self.clock())
        self.gen, self.train = gen_res, train_res
        for role, res in (("gen", gen_res), ("learner", train_res)):
            self.sent[role] = (self.seq, res)
            self.send_split(role, self.seq, res)
        return self.seq, gen_res, train_res

    def close(self) -> None:
        """Record reallocations decided but not acknowledged by both stages before the end
        (and a shape move no report came after); re-rank every candidate shape on the model the
        trials refit (:func:`~ebrl.resources.shape.rerank`, left out of the run: it decides
        nothing there) and save ``shape.json`` again."""
        for p in self.pending.values():
            self._record(p.realloc, p, applied=False)
        self.pending.clear()
        if self.moved is not None:
            self._record_move(self.moved[0], self.moved[1], latency=None)
            self.moved = None
        if self.choice is not None:  # rerank: unchanged without a recalibration
            try:
                done = rerank(self.choice)
            except Exception as e:  # bookkeeping: never hide why the run ended, nor fail it
                log.warning("shape: re-ranking on the refit model failed (%s); shape.json "
                            "keeps the measured shapes' predictions", e)  # fmt: skip
                return
            if done is not self.choice:
                self.choice = done
                if self.out_dir is not None:
                    self.choice.save(self.out_dir)

    def unlogged_params(self) -> dict[str, str]:
        """The MLflow params decided since the last call (each GPU re-split), once each."""
        out, self._unlogged = self._unlogged, {}
        return out

    def watch_metrics(self) -> dict[str, float]:
        """The shape watch's gauges: the drift and its streak, the moves and the firings that
        kept the shape, the last firing's search seconds."""
        assert self.watch is not None
        w, last = self.watch, self.watch.moves[-1] if self.watch.moves else None
        return {
            "shape/drift": w.monitor.last,
            "shape/drift_streak": float(w.monitor.streak),
            "shape/moves": float(self.shape_moves),
            "shape/kept_on_drift": float(self.shape_kept),
            "shape/move_search_s": last.search_s if last is not None else math.nan,
        }

    # -- metrics -------------------------------------------------------------------------------
    def elastic_metrics(self) -> dict[str, float]:
        """Algorithm 1's gauges for the run's metrics (and MLflow)."""
        assert self.elastic is not None
        a = self.elastic
        return {
            "resource/reallocations": float(self.applied_count),
            "resource/rebalances_unchanged": float(self.unchanged),
            "resource/realloc_cost_s": self.last["cost"],
            "resource/realloc_latency_s": self.last["latency"],
            "resource/rollout_per_s": self.last["rollout"],
            "resource/gen_per_s": self.last["gen"],
            "resource/train_per_s": self.last["train"],
            "resource/divergence": a.monitor.last,
            "resource/divergent_streak": float(a.monitor.streak),
            "resource/drift": a.drift.last,
            "resource/drift_streak": float(a.drift.streak),
        }

    # -- internals -----------------------------------------------------------------------------
    def _moved(self, move: ShapeMove, at: float) -> None:
        """The watch fired: a new shape goes out (recorded at the next report, when it is in
        force), a kept one is recorded now."""
        if not move.changed:
            self.shape_kept += 1
            log.info("shape: drift at update %d, kept %s: %s", move.step, move.old.describe(),
                     move.cause)  # fmt: skip
            self._record_move(move, at, latency=0.0)
            return
        self.shape_moves += 1
        log.info(
            "shape: drift at update %d: %s; %s -> %s (predicted %.0f -> %.0f env steps/s, "
            "search %.2f s)",
            move.step, move.cause, move.old.describe(), move.new.describe(),
            move.predicted_old, move.predicted_new, move.search_s,
        )  # fmt: skip
        self.send_shape(move.new)
        self.moved = (move, at)

    def _record_move(self, move: ShapeMove, at: float, latency: float | None) -> None:
        """A shape move (or a firing that kept it) in ``reallocations.jsonl``; ``latency``:
        decision to the next report (None: the run ended first)."""
        if self.out_dir is None:
            return
        row = {**move.to_dict(), "applied": move.changed and latency is not None,
               "apply_latency_s": latency}  # fmt: skip
        self._append("reallocations.jsonl", row)

    def _shape(self, env_steps: int, at: float) -> dict[str, float]:
        """The trials' step: move on when they say, and once at their end refit the model to the
        shape kept (its metrics; ``shape.json`` rewritten)."""
        trials, choice = self.trials, self.choice
        if trials is None or choice is None or trials.done:
            return {}
        move = trials.add(at, env_steps)
        if move is not None:
            self.send_shape(move)
        if not trials.done:
            return {}
        rec = recalibrate(choice, trials.trials, trials.seconds)
        self.choice = dataclasses.replace(choice, recalibration=rec)
        if self.watch is not None:  # watched from the shape kept, on the refit model
            model = {p.shape: p.throughput for p in rec.ranked}
            measured = {
                t.shape: t.rate / model[t.shape]
                for t in rec.trials
                if t.updates > 0 and model.get(t.shape, 0.0) > 0
            }
            self.watch.restart(rec.after, rec.cores, measured)
        if self.out_dir is not None:
            self.choice.save(self.out_dir)
        return rec.metrics()

    def _resplit_sms(
        self, iteration: int, env_steps: int, gen: Any, train: Any, ready: bool
    ) -> dict[str, float]:
        """Algorithm 1's step over the SMs on one update's capacities (``ready``: past the
        warm-up and the trials, both measured); where it chose another split, the new quotas go
        out (:attr:`send_quota`) and the re-split is recorded. The update's ``gpu/*`` metrics:
        the quotas in force, the re-splits so far, the last one's seconds from decision to
        effect."""
        assert self.sm is not None and self.send_quota is not None
        out: dict[str, float] = {}
        if ready:
            assert self.pace is not None
            left = self.pace.seconds_left(iteration, env_steps, time.perf_counter())
            r = self.sm.observe(float(gen), float(train), iteration, left)
            out["gpu/resplits_declined"] = float(len(self.sm.declined))
            if r is not None:
                in_force = self.send_quota(dict(r.new))
                seconds = time.perf_counter() - r.decided_at
                self.sm.applied(seconds)  # what the next re-split must save to be worth it
                self.sm_quotas.update(in_force)
                self._record_resplit(r, in_force, seconds)
                out["gpu/resplit_s"] = seconds
                for role, key in (("gen", "gen"), ("learner", "train")):
                    out[f"gpu/resplit_{key}_sm_pct_old"] = float(r.old[role])
                    out[f"gpu/resplit_{key}_sm_pct_new"] = float(r.new[role])
        return {
            "gpu/gen_sm_pct": float(self.sm_quotas.get("gen") or 0),
            "gpu/train_sm_pct": float(self.sm_quotas.get("learner") or 0),
            "gpu/resplits": float(len(self.sm.history)),  # every re-split it chose is applied
            **out,
        }

    def _record_resplit(self, r: Resplit, in_force: dict[str, int], seconds: float) -> None:
        """A GPU re-split in the log, ``gpu_resplits.jsonl`` and an MLflow param."""
        assert self.sm is not None
        n = len(self.sm.history)
        said = f"{r.describe()}; in force in {seconds:.2f} s"
        log.info("GPU re-split %d at %s (%s)", n, said, r.cause)
        self._unlogged[f"gpu/resplit{n}"] = said
        if self.out_dir is None:
            return
        row = {
            "resplit": n,
            "step": r.step,
            "stage": r.stage,
            "old": r.old,
            "new": r.new,
            "applied": in_force,
            "seconds_to_effect": seconds,
            "cause": r.cause,
        }
        self._append("gpu_resplits.jsonl", row)

    def _append(self, name: str, row: dict[str, Any]) -> None:
        """One JSON line appended to the run folder's ``name`` (the caller checked it has one)."""
        assert self.out_dir is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with (self.out_dir / name).open("a") as f:
            f.write(json.dumps(row) + "\n")

    def _rates(self) -> tuple[float | None, float | None]:
        """The rollout's capacity and the generator's (decisions per busy second) since the last
        update, from the generator's counters (None: not measured)."""
        c = self.counters
        if not all(k in c for k in COUNTERS):
            return None, None
        rollout = self.meter.update(
            c["resource/gen_clock"], c["resource/gen_decisions"], c["resource/gen_blocked_env_s"]
        )
        now = (c["resource/gen_decisions"], c["resource/gen_busy_s"])
        prev, self.gen_last = self.gen_last, now
        gen_cap = None
        if prev is not None and now[1] - prev[1] > 0 and now[0] >= prev[0]:
            gen_cap = (now[0] - prev[0]) / (now[1] - prev[1])
        return rollout, gen_cap

    def _record(self, r: Reallocation, p: _Pending, applied: bool) -> None:
        if self.out_dir is None or self.elastic is None:
            return
        row = {
            "step": r.step,
            "changed": r.changed,
            "applied": applied,
            "cause": r.cause,
            "measured_gen": r.measured_gen,
            "measured_train": r.measured_train,
            "measured_sim": None if math.isnan(r.measured_sim) else r.measured_sim,
            "old": _alloc_dict(r.old),
            "new": _alloc_dict(r.new),
            "gen": dataclasses.asdict(p.gen),
            "train": dataclasses.asdict(p.train),
            "search_s": r.search_s,
            "apply_cost_s": r.apply_cost_s,
            "apply_latency_s": r.apply_latency_s,
            "decided_at": r.decided_at,
        }
        self._append("reallocations.jsonl", row)


def _alloc_dict(a: Allocation) -> dict[str, Any]:
    return {
        "gen_units": a.gen_units,
        "train_units": a.train_units,
        "gen_batch": a.gen_batch,
        "train_batch": a.train_batch,
        "gen_throughput": a.gen_throughput,
        "train_throughput": a.train_throughput,
        "sim_throughput": a.sim_throughput if math.isfinite(a.sim_throughput) else None,
        "unused_units": a.unused_units,
        "unit": a.pool.unit,
    }
