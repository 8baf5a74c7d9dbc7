"""The resource controller on the EBRL driver: built from the run's ``resources`` group, wired to
the workers.

:func:`setup` reads the run's ``resources`` group and returns the run-time controller
(:class:`~ebrl.resources.controller.RunController`) holding the starting split
(:class:`~ebrl.resources.allotment.RunResources`), which the workers apply when they start
(``Schedule.gen_resources`` / ``train_resources``), the shape trials when the shape was searched,
and with ``allocator=elastic`` Algorithm 1 at run time. :class:`StageLinks` carries what it
decides to the generator and the learner (a :class:`Resources` message each; they apply it between
stage calls and acknowledge with :class:`Applied`). :func:`choose_shape` runs the shape search
on probes of the run's own stages.

With the default ``resources`` group (static, unpinned, threads as ``threads.*``) the workers
run exactly as before: their stage's own threads, no pinning, the scheduler's ``batch_min``.

The caller says whether the controller applies and where the run folder is (``RunContext``'s
``manage_resources`` and ``run_dir``, filled by ``ebrl.train``); nothing here guesses either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ebrl.plan.profile import Profile
from ebrl.resources.allotment import (
    ELASTIC,
    ResourceSettings,
    StageResources,
    gen_batch_candidates,
    initial_resources,
    pool_size,
    restrict_train_batch,
    scaled_patience,
    train_minibatch,
    trial_plan,
)
from ebrl.resources.controller import COUNTERS, RunController, elastic_allocator
from ebrl.resources.model import Shape, Workload
from ebrl.resources.profiler import rate_table
from ebrl.resources.shape import (
    Probes,
    ShapeChoice,
    ShapeTrials,
    gen_batches_for,
    measure,
    search,
    shortlist,
    thread_options,
)
from ebrl.resources.topology import Topology, discover_cores
from ebrl.resources.watch import ShapeWatch
from ebrl.runtime.channel import Outbox
from ebrl.schedulers.ebrl.messages import Applied, Resources
from ebrl.stages.profile import gen_stage_fn, ppo_config, profile_for_run, train_stage_fn

if TYPE_CHECKING:
    from ebrl.schedulers.ebrl.wiring import Roles
    from ebrl.schedulers.ebrl.worker import Schedule

log = logging.getLogger(__name__)

__all__ = [
    "COUNTERS",
    "Shape",
    "StageLinks",
    "acknowledge",
    "choose_shape",
    "setup",
    "shape_probes",
    "start_messages",
]


def message(seq: int, res: StageResources) -> Resources:
    """A stage's resources as the message its worker applies."""
    return Resources(seq, res.threads, res.cores, res.batch)


def start_messages(controller: RunController) -> tuple[Resources, Resources]:
    """The generator's and the learner's starting resources (``seq`` 0)."""
    return message(0, controller.resources.gen), message(0, controller.resources.train)


def acknowledge(controller: RunController, msg: Applied) -> None:
    """A worker's :class:`Applied`, to the controller."""
    controller.applied(msg.worker, msg.seq, msg.seconds, msg.threads, msg.cores, msg.batch_min)


class StageLinks:
    """The controller's links to the generator and the learner (``gen``, ``learner``): what it
    decides goes out as :class:`Resources`; a replaced process gets a new link."""

    def __init__(self, peers: Mapping[str, Any], authkey: bytes) -> None:
        self.authkey = authkey
        self.outboxes = {r: Outbox(peers[r], authkey) for r in ("gen", "learner")}

    def send(self, role: str, seq: int, res: StageResources) -> None:
        # a process that died meanwhile gets it once replaced (RunController.replaced)
        with contextlib.suppress(OSError):
            self.outboxes[role].send(message(seq, res))

    def relink(self, role: str, address: Any) -> None:
        with contextlib.suppress(OSError):
            if role in self.outboxes:
                self.outboxes[role].close()
        self.outboxes[role] = Outbox(address, self.authkey)

    def close(self) -> None:
        for o in self.outboxes.values():
            with contextlib.suppress(OSError):  # the worker is gone already
                o.close()
        self.outboxes.clear()


def setup(
    factory: Any,
    sim_workers: int,
    group_size: int,
    decisions_per_env: int,
    topology: Topology | None = None,
    *,
    run_dir: Path | None = None,
    managed: bool,
    choice: ShapeChoice | None = None,
    trials: ShapeTrials | None = None,
    watch: bool = False,
) -> RunController | None:
    """The run's resource controller from its ``resources`` group, or None where none applies.

    Elastic runs use ``resources.profile`` when given, else profile the run's policy here first
    (a few seconds) and save the profile in the run folder. ``factory`` must know the env spec.

    Args:
        factory: the run's stage factory (its ``cfg`` holds the ``resources`` group).
        sim_workers: env worker processes.
        group_size: envs in the largest env group (the largest generator batch).
        decisions_per_env: T.
        topology: the machine's cores (default: this process's).
        run_dir: the run folder (``RunContext.run_dir``): ``resources.json``, ``profile.json``
            and ``reallocations.jsonl`` go there; None: nothing is written.
        managed: whether the controller applies to this run (``RunContext.manage_resources``);
            False: None is returned, the workers keep their own split (the baselines on EBRL's
            workers).
        choice: the shape search's outcome, when the shape was searched.
        trials: the shortlisted shapes to measure in the run (None: none).
        watch: search the shape again when a stage drifts, once the trials are over
            (:class:`~ebrl.resources.watch.ShapeWatch`; only where the shape was searched
            and Algorithm 1 is off: with ``allocator=elastic`` it moves the split instead).
    """
    if not managed:
        return None
    settings = ResourceSettings.from_config(factory.cfg.get("resources") or {})
    update_s = choice.prediction().update_s if choice is not None else None
    patience = scaled_patience(settings.rebalance_patience, factory.cfg, update_s)
    settings = dataclasses.replace(settings, rebalance_patience=patience)
    if choice is not None and choice.shape.threads is not None:  # the search chose them
        g, t = choice.shape.threads
        settings = dataclasses.replace(settings, gen_threads=g, train_threads=t)
    topo = topology or Topology(tuple(discover_cores()))
    out_dir = Path(run_dir) if run_dir is not None else None
    profile, took = None, 0.0
    if settings.allocator == ELASTIC:
        minibatch = train_minibatch(factory.cfg, decisions_per_env)
        if settings.profile:
            stored = Profile.load(settings.profile)  # its format was checked by ebrl.train
            log.info("allocator profile: %s", settings.profile)
        else:
            units = pool_size(settings, topo, sim_workers)
            t0 = time.perf_counter()
            stored = profile_for_run(
                factory,
                range(1, units),
                gen_batch_candidates(group_size),
                minibatch,
                sim_group=group_size,
            )
            took = time.perf_counter() - t0
            log.info("profiled gen, train and sim in %.1f s (threads 1..%d)", took, units - 1)
            if out_dir is not None:
                stored.save(out_dir / "profile.json")
        # train's points count the decisions of an update: every minibatch of the segment
        samples = minibatch * max(1, ppo_config(factory.cfg).num_minibatches)
        profile = restrict_train_batch(rate_table(stored), samples)
    res = initial_resources(settings, topo, sim_workers, profile, max_gen_batch=group_size)
    log.info("resources (%s): %s", settings.allocator, res.describe())
    elastic = None
    if settings.allocator == ELASTIC:
        assert profile is not None
        elastic = elastic_allocator(profile, res, settings, group_size, sim_workers)
    if out_dir is not None and out_dir.exists():
        info = {"allocator": settings.allocator, **res.to_dict()}
        if profile is not None:
            info["profile_s"] = took
            info["profile"] = settings.profile or str(out_dir / "profile.json")
        (out_dir / "resources.json").write_text(json.dumps(info, indent=1, default=_json) + "\n")
    warmup = int(factory.cfg.get("warmup_iters", 1) or 1)
    watcher = None
    if watch and choice is not None and elastic is None:
        watcher = ShapeWatch(choice, settings.rebalance_threshold, int(patience))
    return RunController(
        res,
        int(factory.cfg["num_envs"]),
        warmup,
        elastic=elastic,
        topology=topo,
        out_dir=out_dir,
        choice=choice,
        trials=trials,
        watch=watcher,
    )


def _json(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


# --- the run's shape --------------------------------------------------------------------------
def searched_threads(settings: ResourceSettings) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The generator's and the learner's thread counts the shape search weighs: up to the
    configured ones with the static, unpinned split; only those where the elastic allocator
    (Algorithm 1) or pinned cores decide the threads."""
    g, t = int(settings.gen_threads), int(settings.train_threads)
    if settings.allocator == ELASTIC or settings.pin:
        return (g,), (t,)
    return thread_options(g), thread_options(t)


def shape_probes(factory: Any, sim_envs: int, decisions_per_env: int) -> Probes:
    """The run's own stages as :func:`ebrl.resources.shape.measure` times them: ``sim_envs``
    envs of one env worker, a fresh copy of the run's policy acting, and one learner update
    (every epoch and minibatch of a segment), each on the torch threads ``measure`` sets."""
    import numpy as np
    import torch

    cfg = factory.cfg
    ppo = ppo_config(cfg)
    ids = list(range(sim_envs))
    group = factory.group(ids, probe=True)
    group.reset()
    spec = group.spec
    chunk = int(cfg["chunk_size"])
    rng = np.random.default_rng(0)

    def step_one(i: int) -> None:
        acts = rng.uniform(spec.action_low, spec.action_high, (chunk, spec.action_dim))
        group.step_one(i, acts.astype(np.float32))

    make_gen = gen_stage_fn(factory.policy())
    calls: dict[int, Any] = {}

    def gen_call(batch: int) -> None:
        if batch not in calls:
            calls[batch] = make_gen(torch.get_num_threads(), batch)
        calls[batch]()

    minibatch = train_minibatch(cfg, decisions_per_env)
    train = train_stage_fn(factory.policy(), ppo)(torch.get_num_threads(), minibatch)
    steps = max(1, ppo.update_epochs * ppo.num_minibatches)

    def train_update() -> None:
        for _ in range(steps):
            train()

    return Probes(sim_envs, step_one, gen_call, train_update, close=group.close, train_warm=train)


def choose_shape(
    factory: Any,
    work: Workload,
    groups: int | None,
    step_level: bool | None,
    batch_min: int | None,
    timeout_s: float,
    run_dir: Path | None,
    batch_max: int | None = None,
) -> ShapeChoice:
    """Measure the run's stages and choose its shape (pinned knobs, not None, are kept):
    ``shape.json`` in the run folder records the costs, every candidate's prediction and the
    time it took.

    The threads ``resources.gen_threads`` / ``train_threads`` (``threads.*``) are the most each
    stage may get: with the static split, unpinned, the search weighs every split up to them
    (:func:`searched_threads`); the elastic allocator and pinned cores set their own.
    """
    node = factory.cfg.get("resources") or {}
    settings = ResourceSettings.from_config(node)
    probes = shape_probes(factory, max(len(w) for w in work.workers), work.decisions_per_env)
    gen_threads, train_threads = searched_threads(settings)
    costs, took = measure(
        probes, gen_batches_for(work), gen_threads=gen_threads, train_threads=train_threads
    )
    choice = search(
        costs,
        work,
        None if groups is None else [groups],
        step_level,
        batch_min,
        timeout_s,
        measure_s=took,
        batch_max=batch_max,
    )
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        choice.save(Path(run_dir))
    return choice


def start_trials(
    choice: ShapeChoice, cfg: Any, reshape_window: int, run_dir: Path | None
) -> tuple[Shape, ShapeChoice, ShapeTrials | None]:
    """The shape the run starts with, its choice and the trials that measure the
    shortlist (:func:`shortlist`, as many as :func:`trial_plan` fits; None when
    ``scheduler.reshape_window`` is 0). A run that will measure one shape only starts with the
    simplest the model cannot tell from the best (:meth:`ShapeChoice.unmeasured`)."""
    n = 0
    if reshape_window > 0:
        n, _ = trial_plan(
            reshape_window,
            cfg,
            len(shortlist(choice)),
            update_s=choice.prediction().update_s,
        )
    if n < 2:
        settled = choice.unmeasured()
        if settled is not choice and run_dir is not None:
            settled.save(run_dir)  # shape.json says what the run started with
        choice = settled
    if n == 0:
        return choice.shape, choice, None
    short = shortlist(choice)
    n, each = trial_plan(reshape_window, cfg, len(short), update_s=choice.prediction().update_s)
    return choice.shape, choice, ShapeTrials(short[:n], skip=1, updates=each)


def with_resources(plan: Schedule, roles: Roles, controller: RunController | None) -> Schedule:
    """The plan with the resource controller's starting split (each replica its share of the
    generator's threads and cores)."""
    if controller is None:
        return plan
    gen, train = start_messages(controller)
    home = controller.resources.sim_home
    return dataclasses.replace(
        plan,
        home=home if home is not None else plan.home,
        gen_resources=per_replica(gen, roles.replicas),
        train_resources=train,
    )


def per_replica(msg: Resources, parts: int) -> tuple[Resources, ...]:
    """``msg``'s threads, cores and batch size shared by ``parts`` replicas (each at least one
    thread; cores in contiguous blocks, shared when there are fewer cores than replicas)."""
    if parts == 1:
        return (msg,)
    cores: list[tuple[int, ...] | None] = [msg.cores] * parts
    if msg.cores is not None and len(msg.cores) >= parts:
        cores = [tuple(int(c) for c in b) for b in np.array_split(sorted(msg.cores), parts)]
    batch = None if msg.batch_min is None else max(1, math.ceil(msg.batch_min / parts))
    return tuple(
        Resources(msg.seq, max(1, msg.threads // parts), cores[r], batch) for r in range(parts)
    )
