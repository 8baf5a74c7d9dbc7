"""The EBRL engine's schedule, played on the fluid machine: every scheduler is a setting of it.

The roles are the engine's (``ebrl/schedulers/ebrl/*_worker.py``): E env workers, R generator
replicas each acting for a contiguous block of them, one learner (its L ranks as one lane). Each
follows its worker loop's own order of events:

- an env worker steps the units it was sent one after the other (lock step: its share of a
  group, the whole ``Go``; step level: env by env) and reports each unit as it ends; it hands a
  segment to the learner once the ``Go`` that completed it is done;
- a replica picks its next batch with the engine's :func:`~.rules.pick` over the envs it *knows*
  are ready; only when nothing can be picked does it read its inbox (the observations that
  arrived meanwhile, stamped ready as they are read, and the learner's new weights, loaded then),
  or wait for the batching timeout;
- the staleness gate (:func:`~.rules.admits`) holds an env back while the segment its next
  decision lands in would be trained more than k versions after the replica's own;
- the learner trains segment u once every env worker has handed it over, publishes the new
  version, and tells every replica.

The other schedulers are settings of the same engine, as in the code: Async is k >= 1, G = 1 in
lock step; Hybrid is k = 0 with G = 2; the synchronous loop (``ebrl/schedulers/sync.py``) is
k = 0, G = 1 with one env worker holding every env in the driver process (no messages, every
stage alone in turn), and Colocated is that loop with the generator's offload after each rollout
and its reload in the weight sync. ``ebrl.plan`` builds those settings.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ebrl.resources.model.machine import Machine, ModelSpan, StageCall
from ebrl.resources.model.rules import admits, pick, replica_blocks, served_groups, split_groups
from ebrl.resources.model.types import Layout, Prediction, Shape, StageCosts, Workload


def gen_track(r: int) -> str:
    """A replica's lane, named as the engine names it (``wiring.gen_name``)."""
    return "gen" if r == 0 else f"gen{r}"


@dataclass
class Played:
    """One played schedule: the prediction and what produced it.

    Attributes:
        prediction: the figures (steady state: the updates after ``warmup``).
        spans: every stage call, as the engine's timeline records them (model seconds).
        events: the order of the stage calls that decide the schedule, for comparison with the
            engine's: ``("gen", replica, env ids, version, the segment each env's decision
            lands in)``, ``("train", version)``.
        staleness_counts: decisions of the steady state's segments acted i versions behind
            the learner version that trains them, i = 0..k.
        update_end: when each update was published.
        window: the steady state, (start, end) seconds.
    """

    prediction: Prediction
    spans: list[ModelSpan]
    events: list[tuple]
    staleness_counts: list[int]
    update_end: list[float]
    window: tuple[float, float]


class _Sampler:
    """Chunk latencies replayed from the profile's samples: the sum of ``size`` random draws
    (indices drawn from a seeded generator in blocks: a numpy call per unit would cost more
    than the rest of the event)."""

    def __init__(self, samples: tuple[float, ...], seed: int, block: int = 4096) -> None:
        self.samples = [float(x) for x in samples]
        self.same = max(self.samples) == min(self.samples)
        self.rng = np.random.default_rng(seed)
        self.block = block
        self.drawn: list[float] = []  # the block's draws, as latencies
        self.at = 0

    def __call__(self, size: int) -> float:
        if self.same:
            return self.samples[0] * size
        total = 0.0
        for _ in range(size):
            if self.at == len(self.drawn):
                idx = self.rng.integers(0, len(self.samples), self.block).tolist()
                self.drawn = [self.samples[i] for i in idx]
                self.at = 0
            total += self.drawn[self.at]
            self.at += 1
        return total


class _Gate(dict[int, bool]):
    """The staleness gate (:func:`admits`) of every env a replica serves, at the replica's
    policy version: each answer computed once, then read as a dict lookup by :func:`pick`.
    The answer depends on the segment an env's next decision lands in: the engine drops an
    env's answer when that segment changes, and every answer when the version does."""

    def __init__(self, decided: dict[int, int], t: int, k: int) -> None:
        super().__init__()
        self.decided, self.t, self.k, self.version = decided, t, k, 0

    def __missing__(self, e: int) -> bool:
        ok = self[e] = admits(self.decided[e], self.t, self.k, self.version)
        return ok


@dataclass
class _Replica:
    """What one generator replica knows (the engine's ``GenWorker``)."""

    served: set[int]
    groups: list[list[int]]
    gate: _Gate
    ready: OrderedDict[int, float] = field(default_factory=OrderedDict)
    inbox: deque[tuple[str, int]] = field(default_factory=deque)
    carry: list[tuple[str, int]] = field(default_factory=list)  # read, not yet handled
    version: int = 0
    busy: bool = False

    def take(self, version: int) -> None:
        """Act with policy ``version`` from now on."""
        if version != self.version:
            self.version = self.gate.version = version
            self.gate.clear()


def play(
    costs: StageCosts,
    work: Workload,
    shape: Shape,
    layout: Layout | None = None,
    updates: int = 8,
    warmup: int = 2,
    seed: int = 0,
    spans: bool = True,
) -> Played:
    """Play ``updates`` updates of the schedule; the figures are over those after ``warmup``.

    Args:
        spans: keep every stage call as a :class:`ModelSpan` (False: ``Played.spans`` is empty, the
            figures the same).

    Raises:
        RuntimeError: the schedule stalls (nothing left to happen before ``updates`` updates).
    """
    lay = layout or Layout.single(costs, work)
    if len(lay.sims) != len(work.workers):
        raise ValueError(
            f"layout places {len(lay.sims)} env workers, the workload has {len(work.workers)}"
        )
    draw = _Sampler(costs.sim_chunk_s, seed)
    n, t, k = work.num_envs, work.decisions_per_env, work.staleness
    owner = {e: w for w, ids in enumerate(work.workers) for e in ids}
    replica_of = lay.replica_of or replica_blocks(len(work.workers), lay.replicas)
    groups = split_groups(work.workers, shape.groups)
    m = max(1, min(shape.batch_min, n))
    decided = dict.fromkeys(owner, 0)  # chunks acted for
    reps = []
    for r in range(lay.replicas):
        served = {e for e, w in owner.items() if replica_of[w] == r}
        rep = _Replica(served, served_groups(groups, served), _Gate(decided, t, k))
        for g in rep.groups:  # the first observations, group by group
            rep.ready.update((e, 0.0) for e in g)
        reps.append(rep)
    machine = Machine(lay.pools, lay.nominal)
    stepped = dict.fromkeys(owner, 0)  # chunks simulated
    queues: list[deque[tuple[list[int], bool]]] = [deque() for _ in work.workers]
    startable: set[int] = set()  # idle env workers with a unit queued
    working = [False] * len(work.workers)
    parts = [0] * len(work.workers)  # segments each env worker has handed to the learner
    learner = {"version": 0, "busy": False, "parts": 0}
    counts = {"batches": 0, "envs": 0}
    hist: dict[int, list[int]] = {}  # segment -> its decisions by staleness 0..k
    events: list[tuple] = []
    done_at: list[float] = []
    # replicas with something new to look at (a message, a finished call, a batching timeout):
    # the others would pick nothing, so only these are served at an event
    dirty: set[int] = set(range(len(reps)))
    waits: list[tuple[float, int]] = []  # (when, replica): batching timeouts set
    waiting: set[tuple[float, int]] = set()  # the same, to set each once

    # what every job of a worker or a replica asks, made once
    sim_uses = [((p, costs.sim_busy),) for p in lay.sims]
    sim_tracks = [f"sim{w}" for w in range(len(work.workers))]
    gen_loads = lay.gen_loads or ((),) * lay.replicas
    gen_tracks = [gen_track(r) for r in range(lay.replicas)]
    batch_args = [(("batch", b),) for b in range(n + 1)]

    def start_workers() -> None:
        for w in sorted(startable) if len(startable) > 1 else startable:
            unit, _ = current[w] = queues[w].popleft()
            job = sim_jobs[w]
            job.work = draw(len(unit)) + costs.message_s
            job.args = batch_args[len(unit)]
            working[w] = True
            machine.add(job)
        startable.clear()

    def _stepped(w: int) -> Callable[[], None]:
        def fn() -> None:
            working[w] = False
            if queues[w]:
                startable.add(w)
            rep = reps[replica_of[w]]
            dirty.add(replica_of[w])
            unit, last = current[w]
            for e in unit:
                stepped[e] += 1
                if stepped[e] % t == 0:
                    crossed[w] = True
                rep.inbox.append(("ready", e))
            if last and crossed[w]:  # the Go is done: hand over every segment it completed
                crossed[w] = False
                was, parts[w] = parts[w], min(map(stepped.__getitem__, work.workers[w])) // t
                if was == learner["parts"] != parts[w]:  # it may have held the minimum back
                    learner["parts"] = min(parts)

        return fn

    # an env worker steps one unit at a time: its one job object serves every unit in turn
    current: list[tuple[list[int], bool]] = [([], False)] * len(work.workers)
    sim_jobs = [
        StageCall(0.0, sim_uses[w], _stepped(w), "sim", sim_tracks[w])
        for w in range(len(work.workers))
    ]
    # whether one of a worker's envs has ended a segment since the worker last handed one over
    crossed = [False] * len(work.workers)

    def _acted(r: int) -> Callable[[], None]:
        def fn() -> None:
            rep = reps[r]
            rep.busy = False
            dirty.add(r)
            batch = acting[r]
            per_worker: dict[int, list[int]] = {}
            for e in batch:
                decided[e] += 1
                if decided[e] % t == 0:  # a new segment: the gate may answer otherwise
                    rep.gate.pop(e, None)
                per_worker.setdefault(owner[e], []).append(e)
            for w, ids in per_worker.items():  # one Go per env worker
                if shape.step_level:  # env by env, the Go done with the last
                    queues[w].extend([([e], False) for e in ids[:-1]])
                    queues[w].append(([ids[-1]], True))
                else:
                    queues[w].append((ids, True))
                if not working[w]:
                    startable.add(w)

        return fn

    # a replica makes one call at a time: its one gen job object serves every call in turn
    acting: list[list[int]] = [[] for _ in reps]  # the batch of each replica's call
    gen_jobs = [
        StageCall(0.0, lay.gens[r], _acted(r), "gen", gen_tracks[r], (), gen_loads[r])
        for r in range(lay.replicas)
    ]

    def _loaded(r: int, version: int) -> Callable[[], None]:
        def fn() -> None:
            reps[r].busy = False
            dirty.add(r)
            reps[r].take(max(reps[r].version, version))

        return fn

    def _trained() -> None:
        if costs.sync_s > 0:
            version = learner["version"] + 1
            machine.add(
                StageCall(
                    costs.sync_s,
                    lay.learner,
                    _published,
                    "sync",
                    "learner",
                    (("version", version),),
                    lay.learner_loads,
                )
            )
        else:
            _published()

    def _published() -> None:
        learner["busy"] = False
        learner["version"] += 1
        done_at.append(machine.now)
        for r, rep in enumerate(reps):
            rep.inbox.append(("weights", learner["version"]))
            dirty.add(r)

    def read(r: int, msgs: list[tuple[str, int]]) -> None:
        """Handle the messages a recv returned, in order; a load pauses the rest."""
        rep = reps[r]
        for i, (what, x) in enumerate(msgs):
            if what == "ready":
                rep.ready[x] = machine.now
            elif x > rep.version:  # new weights (a version it holds is skipped)
                if costs.load_s > 0:
                    rep.busy, rep.carry = True, msgs[i + 1 :]
                    machine.add(
                        StageCall(
                            costs.load_s,
                            lay.gens[r],
                            _loaded(r, learner["version"]),
                            "load",
                            gen_tracks[r],
                            (("version", x),),
                            gen_loads[r],
                        )
                    )
                    return
                rep.take(learner["version"])  # the board holds the newest

    def serve(r: int) -> None:
        """Replica ``r``'s loop (``GenWorker._loop``) from where it stands, at this instant."""
        rep = reps[r]
        if rep.carry:
            msgs, rep.carry = rep.carry, []
            read(r, msgs)
        while not rep.busy:
            # nothing ready: nothing to pick (the rule returns no batch without a ready env)
            batch = rep.ready and pick(
                rep.ready,
                rep.gate.__getitem__,
                rep.groups,
                shape.step_level,
                m,
                shape.batch_timeout_s,
                machine.now,
                shape.batch_max,
            )
            if batch:
                for e in batch:
                    del rep.ready[e]
                    seg = decided[e] // t
                    row = hist.get(seg)
                    if row is None:
                        row = hist[seg] = [0] * (k + 1)
                    row[seg - rep.version] += 1
                rep.busy = True
                counts["batches"] += 1
                counts["envs"] += len(batch)
                events.append(
                    ("gen", r, tuple(batch), rep.version, tuple([decided[e] // t for e in batch]))
                )
                # the engine's own work: a Ready read per unit the batch came in (one per env
                # at the step level, one per env worker's share in lock step), a Go sent per
                # env worker it acted for
                workers = len(set(map(owner.__getitem__, batch)))
                units = len(batch) if shape.step_level else workers
                secs = costs.gen_s(len(batch), messages=units + workers)
                if costs.offload_s > 0 and _ends_rollout(rep.served, batch, decided, t):
                    secs += costs.offload_s  # the rollout's last call drops the weights
                acting[r] = batch
                job = gen_jobs[r]
                job.work, job.args = secs, batch_args[len(batch)]
                machine.add(job)
                return
            if rep.inbox:
                msgs = list(rep.inbox)
                rep.inbox.clear()
                read(r, msgs)
                continue
            if shape.step_level:  # wait out the oldest eligible env's batching timeout
                gate = rep.gate
                for e in rep.ready:
                    if gate[e]:
                        at = rep.ready[e] + shape.batch_timeout_s
                        if (at, r) not in waiting:  # (a timeout set already fires once)
                            waiting.add((at, r))
                            machine.timer(at)
                            heapq.heappush(waits, (at, r))
                        break
            return

    def schedule() -> None:
        if startable:
            start_workers()
        while waits and waits[0][0] <= machine.now + 1e-12:
            waiting.discard(wait := heapq.heappop(waits))
            dirty.add(wait[1])
        for r in sorted(dirty) if len(dirty) > 1 else dirty:
            if not reps[r].busy:
                serve(r)
        dirty.clear()
        u = learner["version"]
        if not learner["busy"] and learner["parts"] >= u + 1:
            learner["busy"] = True
            events.append(("train", u))
            machine.add(
                StageCall(
                    costs.train_s,
                    lay.learner,
                    _trained,
                    "train",
                    "learner",
                    (("steps", n * t),),
                    lay.learner_loads,
                )
            )

    schedule()
    while len(done_at) < updates:
        if not machine.advance():
            raise RuntimeError(f"the modelled schedule stalled at {shape.describe()}")
        schedule()  # a timer may have fired
    played = _result(machine, costs, work, shape, lay, warmup, done_at, hist, events, counts)
    if spans:
        played.spans = machine.spans
    return played


def _ends_rollout(served: set[int], batch: list[int], decided: dict[int, int], t: int) -> bool:
    """Whether acting for ``batch`` completes the segment of every env the replica serves."""
    acting = set(batch)
    return all((decided[e] + (e in acting)) % t == 0 for e in served)


def _result(
    machine: Machine,
    costs: StageCosts,
    work: Workload,
    shape: Shape,
    lay: Layout,
    warmup: int,
    done_at: list[float],
    hist: dict[int, list[int]],
    events: list[tuple],
    counts: dict[str, int],
) -> Played:
    updates = len(done_at)
    t0 = done_at[warmup - 1] if warmup > 0 else 0.0
    t1 = done_at[-1]
    span = t1 - t0
    steps = (updates - warmup) * work.env_steps_per_update
    lanes = {"sim": len(work.workers), "gen": lay.replicas, "load": lay.replicas}
    busy: dict[str, float] = {}
    # seconds of the finished calls, summed in the order they ended
    done: dict[str, float] = {"gen": 0.0, "train": 0.0}
    for stage, _, start, end, _ in machine.records:
        lo, hi = max(start, t0), min(end, t1)
        if hi > lo:
            busy[stage] = busy.get(stage, 0.0) + hi - lo
        if stage in done:
            done[stage] += end - start
    for j in machine.running:  # a job still running at the last update
        lo = max(j.start, t0)
        if t1 > lo:
            busy[j.kind] = busy.get(j.kind, 0.0) + t1 - lo
    per_update = max(1, updates - warmup)
    # the segments trained in the steady state (segment u is trained by update u + 1)
    steady = [0] * (len(next(iter(hist.values()))) if hist else 1)
    for seg, counts_ in hist.items():
        if warmup <= seg < updates:
            steady = [a + b for a, b in zip(steady, counts_, strict=True)]
    total = max(1, sum(steady))
    now = machine.now
    pred = Prediction(
        shape=shape,
        throughput=steps / span if span > 0 else float("inf"),
        gen_busy=(done["gen"] + _running_s(machine, "gen")) / now / lay.replicas,
        train_busy=(done["train"] + _running_s(machine, "train")) / now,
        mean_batch=counts["envs"] / max(1, counts["batches"]),
        bubble=machine.idle / now,
        update_s=span / per_update,
        staleness=tuple(c / total for c in steady),
        stage_busy={s: b / per_update for s, b in busy.items()},
        stage_util={s: b / (lanes.get(s, 1) * span) for s, b in busy.items()} if span > 0 else {},
    )
    return Played(pred, [], events, steady, done_at, (t0, t1))


def _running_s(machine: Machine, kind: str) -> float:
    """Seconds the running jobs of ``kind`` have run so far (``Machine.busy``'s second part)."""
    return sum(machine.now - j.start for j in machine.running if j.kind == kind)


def simulate(
    costs: StageCosts,
    work: Workload,
    shape: Shape,
    updates: int = 8,
    warmup: int = 2,
    seed: int = 0,
    layout: Layout | None = None,
) -> Prediction:
    """Play ``updates`` updates of the schedule; the figures are over those after ``warmup``."""
    return play(costs, work, shape, layout, updates, warmup, seed, spans=False).prediction
