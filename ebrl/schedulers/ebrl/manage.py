"""The resource manager on the EBRL driver: the starting split and run-time reallocations.

:func:`setup` reads the run's ``resources`` group and returns a :class:`ResourceDriver` holding
the starting split (:class:`~ebrl.resources.manager.RunResources`), which the workers apply when
they start (``Plan.gen_resources`` / ``train_resources``). With ``allocator=elastic`` it also
holds a :class:`~ebrl.resources.manager.Rebalancer`: after every update the driver feeds it the
rollout's and the learner's measured throughputs, sends a new split to the generator and the
learner when it decides one (a :class:`Resources` message each; they apply it between stage
calls and acknowledge with :class:`Applied`), and records every reallocation with its cause and
cost in ``reallocations.jsonl`` in the run folder and in the run's ``resource/*`` metrics.

With the default ``resources`` group (static, unpinned, threads as ``threads.*``) the workers
run exactly as before: their stage's own threads, no pinning, the scheduler's ``batch_min``.

The caller says whether the manager applies and where the run folder is (``RunContext``'s
``manage_resources`` and ``run_dir``, filled by ``ebrl.train``); nothing here guesses either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ebrl.resources.manager import (
    ELASTIC,
    Rebalancer,
    ResourceSettings,
    RolloutMeter,
    RunResources,
    StageResources,
    gen_batch_candidates,
    initial_resources,
    pool_size,
    ppo_config,
    profile_for_run,
    restrict_train_batch,
    scaled_patience,
    train_minibatch,
)
from ebrl.resources.model import Shape, Workload
from ebrl.resources.profiler import Profile
from ebrl.resources.shape import Probes, ShapeChoice, gen_batches_for, measure, search
from ebrl.resources.topology import Topology, discover_cores
from ebrl.runtime.channel import Outbox
from ebrl.schedulers.ebrl.messages import Applied, Resources

log = logging.getLogger(__name__)

#: generator gauges the driver reads and keeps out of the run's metrics
COUNTERS = (
    "resource/gen_clock",
    "resource/gen_decisions",
    "resource/gen_blocked_env_s",
    "resource/gen_busy_s",
)


def _message(seq: int, res: StageResources) -> Resources:
    return Resources(seq, res.threads, res.cores, res.batch)


class ResourceDriver:
    """Driver-side state of the resource manager for one run.

    Args:
        resources: the starting split.
        rebalancer: Algorithm 1 at run time (None: a static split).
        num_envs: envs of the run (for the rollout meter).
        warmup: updates before throughputs are fed to the rebalancer (start-up is not steady).
    """

    def __init__(
        self,
        resources: RunResources,
        rebalancer: Rebalancer | None,
        num_envs: int,
        warmup: int = 1,
    ) -> None:
        self.resources = resources
        self.rebalancer = rebalancer
        self.meter = RolloutMeter(num_envs)
        self.gen_last: tuple[float, float] | None = None  # (decisions, busy seconds)
        self.warmup = max(1, warmup)
        self.counters: dict[str, float] = {}
        self.outboxes: dict[str, Outbox] = {}
        self.sent: dict[str, Resources] = {}  # the last reallocation sent to each stage
        self.seen: dict[str, Applied] = {}

    def start_messages(self) -> tuple[Resources, Resources]:
        """The generator's and the learner's starting resources (``seq`` 0)."""
        return _message(0, self.resources.gen), _message(0, self.resources.train)

    def connect(self, peers: Mapping[str, Any], authkey: bytes) -> None:
        """Links to the generator and the learner, for reallocations."""
        if self.rebalancer is not None:
            self.outboxes = {r: Outbox(peers[r], authkey) for r in ("gen", "learner")}

    def replaced(self, role: str, address: Any, authkey: bytes) -> None:
        """``role``'s process was replaced: its rollout counters start again from zero, and it
        gets the split in force (it started with the run's starting split)."""
        self.meter.last = None
        self.gen_last = None
        for k in COUNTERS:
            self.counters.pop(k, None)
        if self.rebalancer is None:
            return
        with contextlib.suppress(OSError):
            if role in self.outboxes:
                self.outboxes[role].close()
        self.outboxes[role] = Outbox(address, authkey)
        if role in self.sent:
            self.outboxes[role].send(self.sent[role])

    def gauges(self, gauges: dict[str, float]) -> None:
        """Take the generator's rollout counters out of a telemetry message's gauges."""
        for k in COUNTERS:
            if k in gauges:
                self.counters[k] = gauges.pop(k)

    def applied(self, msg: Applied) -> None:
        self.seen[msg.worker] = msg
        if self.rebalancer is not None and msg.seq > 0:
            self.rebalancer.applied(msg.worker, msg.seq, msg.seconds)

    def report(self, iteration: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """One update arrived: measure, maybe reallocate; the ``resource/*`` metrics to add."""
        out: dict[str, float] = {}
        c = self.counters
        rollout = gen_cap = None
        if all(k in c for k in COUNTERS):
            rollout = self.meter.update(
                c["resource/gen_clock"],
                c["resource/gen_decisions"],
                c["resource/gen_blocked_env_s"],
            )
            now = (c["resource/gen_decisions"], c["resource/gen_busy_s"])
            prev, self.gen_last = self.gen_last, now
            if prev is not None and now[1] - prev[1] > 0 and now[0] >= prev[0]:
                gen_cap = (now[0] - prev[0]) / (now[1] - prev[1])
        train = metrics.get("resource/train_per_s_update")
        if rollout is not None:
            out["resource/rollout_per_s_update"] = rollout
        if gen_cap is not None:
            out["resource/gen_per_s_update"] = gen_cap
        if (
            self.rebalancer is not None
            and iteration >= self.warmup
            and rollout is not None
            and train is not None
        ):
            decision = self.rebalancer.observe(
                gen_cap if gen_cap is not None else rollout, float(train), iteration, rollout
            )
            if decision is not None:
                seq, gen, train_res = decision
                for role, res in (("gen", gen), ("learner", train_res)):
                    self.sent[role] = _message(seq, res)
                    # a generator that died meanwhile gets it from replaced()
                    with contextlib.suppress(OSError):
                        self.outboxes[role].send(self.sent[role])
        if self.rebalancer is not None:
            out.update(self.rebalancer.metrics())
        for role, key in (("gen", "gen"), ("learner", "train")):
            a = self.seen.get(role)
            if a is not None:
                out[f"resource/{key}_threads"] = float(a.threads)
                out[f"resource/{key}_cores"] = float(len(a.cores))
        gen = self.seen.get("gen")
        if gen is not None and gen.batch_min is not None:
            out["resource/gen_batch"] = float(gen.batch_min)
        return out

    def close(self) -> None:
        if self.rebalancer is not None:
            self.rebalancer.close()
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
) -> ResourceDriver | None:
    """The run's resource manager from its ``resources`` group, or None where none applies.

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
        managed: whether the manager applies to this run (``RunContext.manage_resources``);
            False: None is returned, the workers keep their own split (the baselines on EBRL's
            workers).
    """
    node = factory.cfg.get("resources")
    if node is None or not managed:
        return None
    settings = ResourceSettings.from_config(node)
    patience = scaled_patience(settings.rebalance_patience, factory.cfg)
    settings = dataclasses.replace(settings, rebalance_patience=patience)
    topo = topology or Topology(tuple(discover_cores()))
    out_dir = Path(run_dir) if run_dir is not None else None
    profile = None
    if settings.allocator == ELASTIC:
        minibatch = train_minibatch(factory.cfg, decisions_per_env)
        if settings.profile:
            profile = Profile.load(settings.profile)
            log.info("allocator profile: %s", settings.profile)
        else:
            units = pool_size(settings, topo, sim_workers)
            profile = profile_for_run(
                factory,
                range(1, units),
                gen_batch_candidates(group_size),
                minibatch,
                sim_group=group_size,
            )
            took = sum(profile.duration_s.values())
            log.info("profiled gen and train in %.1f s (threads 1..%d)", took, units - 1)
            if out_dir is not None:
                profile.save(out_dir / "profile.json")
        profile = restrict_train_batch(profile, minibatch)
    res = initial_resources(settings, topo, sim_workers, profile, max_gen_batch=group_size)
    log.info("resources (%s): %s", settings.allocator, res.describe())
    rebalancer = None
    if settings.allocator == ELASTIC:
        assert profile is not None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
        rebalancer = Rebalancer(
            profile,
            res,
            settings,
            topo,
            out_dir,
            max_gen_batch=group_size,
            sim_workers=sim_workers,
        )
    if out_dir is not None and out_dir.exists():
        info = {"allocator": settings.allocator, **res.to_dict()}
        if profile is not None:
            info["profile_s"] = sum(profile.duration_s.values())
            info["profile"] = settings.profile or str(out_dir / "profile.json")
        (out_dir / "resources.json").write_text(json.dumps(info, indent=1, default=_json) + "\n")
    warmup = int(factory.cfg.get("warmup_iters", 1) or 1)
    return ResourceDriver(res, rebalancer, int(factory.cfg["num_envs"]), warmup)


def _json(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


# --- the run's shape --------------------------------------------------------------------------
def shape_probes(
    factory: Any, sim_envs: int, decisions_per_env: int, gen_threads: int, train_threads: int
) -> Probes:
    """The run's own stages as :func:`ebrl.resources.shape.measure` times them: ``sim_envs``
    envs of one env worker, a fresh copy of the run's policy acting on ``gen_threads``, and one
    learner update (every epoch and minibatch of a segment) on ``train_threads``."""
    import numpy as np

    from ebrl.resources.profiler import gen_stage_fn, train_stage_fn

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
            calls[batch] = make_gen(gen_threads, batch)
        calls[batch]()

    minibatch = train_minibatch(cfg, decisions_per_env)
    train = train_stage_fn(factory.policy(), ppo)(train_threads, minibatch)
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
    time it took."""
    node = factory.cfg.get("resources") or {}
    settings = ResourceSettings.from_config(node)
    probes = shape_probes(
        factory,
        max(len(w) for w in work.workers),
        work.decisions_per_env,
        int(settings.gen_threads),
        int(settings.train_threads),
    )
    costs, took = measure(probes, gen_batches_for(work))
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


__all__ = ["ResourceDriver", "Shape", "choose_shape", "setup", "shape_probes"]
