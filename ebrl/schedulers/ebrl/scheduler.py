"""The EBRL asynchronous pipelined scheduler, driver side (README.md, "What is here").

Three levels, each switchable for the paper's ablation:

1. ``overlap`` (inter-iteration overlap): rollout of segment i+1 runs while the learner trains on
   segment i; the acting policy is at most ``staleness`` (k) versions behind the learner that
   consumes the data. The generator enforces the bound when it picks envs to act for, the learner
   re-checks every segment, and the loss corrects the lag (decoupled PPO). ``overlap=false`` means
   k = 0: the rollout waits for each update.
2. ``pipeline`` (env-group pipelining): each env worker's envs form G = ``env_groups`` groups; while
   one group simulates, another's observations are on the generator. ``pipeline=false``: G = 1.
3. ``step_level`` (step-level orchestration): every env advances on its own. The env worker reports
   each env the moment its chunk is done; the generator acts on the first ``batch_min`` ready envs
   (or whoever is ready after ``batch_timeout_ms``). ``step_level=false``: the generator waits for
   a whole group and the env worker steps a group's chunks together.

With all three off this is a synchronous schedule on the same worker processes, which is what the
throughput benchmark compares EBRL against.

The driver only wires workers, relays reports and merges telemetry: per-step data flows worker to
worker (the ``*_worker.py`` modules). It also runs the resource controller (``control.py``): the
``resources`` group sets the generator's and the learner's threads, cores and the generator's batch
size, and with ``resources.allocator=elastic`` Algorithm 1 re-splits them while the run goes on.
Whatever the workers change (in-process: threads of this process), the driver's affinity and torch
threads are restored when the run ends. What the run does to its GPUs (SM quotas, placement, MPS
or MIG, Algorithm 1's re-splits) is ``gpu.py``'s; replacing dead or re-quota'd workers is
``restarts.py``'s. This module is the engine's top-level flow: the roles and the run's shape,
then :meth:`EBRLScheduler._run` starts and wires the workers (``spawn.py``), relays their
messages into the run's reports (``relay.py``), moves the run to the shapes the controller picks
(``reshape.py``) and always shuts everything down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ebrl.resources.apply import MPS_CONTROL, affinity_guard, threads_guard
from ebrl.resources.controller import RunController
from ebrl.resources.model import Shape, Workload
from ebrl.resources.model import split_groups as env_groups
from ebrl.resources.shape import ShapeChoice
from ebrl.runtime.backend import InProcessBackend, RayBackend
from ebrl.runtime.channel import Inbox, new_authkey, node_ip
from ebrl.runtime.dist import STRATEGIES
from ebrl.runtime.placement_nodes import placement_groups
from ebrl.runtime.slots import ShmSlots, SlotSpec
from ebrl.schedulers.base import IterationReport, RunContext
from ebrl.schedulers.ebrl import control
from ebrl.schedulers.ebrl.gpu import GpuFabric
from ebrl.schedulers.ebrl.heartbeat import stop_workers
from ebrl.schedulers.ebrl.rebind import home_cores
from ebrl.schedulers.ebrl.relay import keep_last_spans, relay
from ebrl.schedulers.ebrl.reshape import reshape
from ebrl.schedulers.ebrl.restarts import Restarts
from ebrl.schedulers.ebrl.spawn import Spawner
from ebrl.schedulers.ebrl.wiring import DRIVER, Roles
from ebrl.schedulers.ebrl.worker import Schedule
from ebrl.utilisation import ray_local_gpus

log = logging.getLogger(__name__)


@dataclass
class EBRLScheduler:
    """Asynchronous pipelined scheduler. Config: ``conf/scheduler/ebrl.yaml``.

    Args:
        backend: ``ray`` (one process per worker) or ``inprocess`` (threads; tests, debugging).
        sim_workers: env worker processes.
        overlap: level 1.
        staleness: k, 0..8 (forced to 0 when ``overlap`` is off).
        pipeline: level 2 (true: G = the run's ``env_groups``; false: G = 1; None: the
            resource controller chooses G, :mod:`ebrl.resources.shape`).
        step_level: level 3 (None: the resource controller chooses).
        batch_min: M of "first M of N" (None: chosen with the step level, or half a group).
        batch_max: the most ready envs one step-level call takes once M are ready (None:
            chosen with the step level, or M: the first M of N; larger: the envs that piled
            up while the generator worked share one call).
        batch_timeout_ms: how long a ready env waits for M to be reached.
        reshape_window: updates each shortlisted shape is measured for in the run itself when
            the shape was searched (the model's choice, the others it predicts within 10% of
            the best, and one group in lock step: :func:`ebrl.resources.shape.shortlist`), one
            after the other after the first update; the run then keeps the fastest. Fewer
            updates and shapes where the trials would take over a quarter of the run
            (:func:`ebrl.resources.allotment.trial_plan`; 0: no trials).
        reshape_on_drift: once the trials are over, a stage whose rate drifts from its level
            (``resources.rebalance_threshold``, 15%, held ``resources.rebalance_patience``
            updates: a tenth of the run's unless set) has the whole shape searched again on
            its scaled costs, and the run moves where another shape wins
            (:class:`ebrl.resources.watch.ShapeWatch`); with ``resources=elastic`` Algorithm 1
            moves the split instead.
        ray_address: ``local`` (a private Ray instance) or a cluster address.
        resources: Ray custom resources per role (``sim``, ``gen``, ``learner``) for placement.
        pin_sim: pin each env worker to a home core (round robin over this process's CPUs).
        rebind: level 3's core rebinding: idle env workers' cores go to straggling ones
            (implies ``pin_sim``; needs ``step_level``).
        max_restarts: env worker and generator processes that may die (a simulator crash,
            the OOM killer) and be replaced during the run, in all; one more stops it with a
            StageError.
        hang_timeout_s: a worker whose heartbeat stops for this long is hung (frozen, or
            stuck holding the GIL): an env worker or a generator is killed and replaced, a
            learner stops the run with a StageError (None: no heartbeats).
        gen_replicas: R, generator replicas; each acts for a contiguous block of the env
            workers with its own copy of the weights (<= ``sim_workers``).
        learner_ranks: L, data-parallel learner ranks (torch.distributed: gloo on CPU, NCCL on
            GPU); every rank trains on its shard of each minibatch (needs ``backend=ray``).
        weight_board: publish the learner's weights on a shared-memory board that every
            replica on its machine reads (off: a pickled state dict per replica per update).
        gen_gpus: the GPU share each replica asks for (0: CPU; < 1: a share of one GPU, an
            MPS quota of that many SMs, or ``resources.gen_sm_pct``, under the MPS daemon the
            run starts or joins on the replica's node); needs ``backend=ray``.
        learner_gpus: the GPU share each learner rank asks for (as ``gen_gpus``; its pinned
            quota is ``resources.train_sm_pct``).
        device: where the roles with a GPU share compute: null (``cuda``), or ``cpu``: a dry
            run of a GPU configuration on a machine whose torch cannot use the GPU (placement,
            Ray's GPU accounting, the MPS daemons and every role's quota as on the GPU node;
            the stages compute on the cores).
        mps_control: the MPS control binary each node runs (found on the node's PATH).
        learner_strategy: ``ddp`` (every learner rank holds the whole policy and optimiser) or
            ``fsdp`` (torch FSDP2 shards parameters, gradients and optimiser state over the
            ranks, ~1/L each; needs ``learner_ranks >= 2`` and ``backend=ray``); the update,
            the published weights and the checkpoint are the same either way.
    """

    backend: str = "ray"
    sim_workers: int = 2
    overlap: bool = True
    staleness: int = 1
    pipeline: bool | None = None
    step_level: bool | None = None
    batch_min: int | None = None
    batch_max: int | None = None
    batch_timeout_ms: float = 5.0
    reshape_window: int = 3
    reshape_on_drift: bool = True
    ray_address: str = "local"
    resources: dict[str, dict[str, float]] | None = None
    pin_sim: bool = False
    rebind: bool = False
    max_restarts: int = 3
    hang_timeout_s: float | None = 120.0
    gen_replicas: int = 1
    learner_ranks: int = 1
    weight_board: bool = True
    gen_gpus: float = 0.0
    learner_gpus: float = 0.0
    learner_strategy: str = "ddp"
    device: str | None = None
    mps_control: str = MPS_CONTROL

    def __post_init__(self) -> None:
        self.shape_choice: ShapeChoice | None = None  # the last run's, when it was searched
        #: the last run's GPUs: quotas, placement, MPS or MIG, re-splits (made new per run)
        self.gpu = self._fabric()
        if self.device not in (None, "cuda", "cpu"):
            raise ValueError(
                f"scheduler.device={self.device!r}: null (the roles with a GPU share compute "
                "on it) or cpu (a dry run of a GPU configuration on the cores)"
            )
        if self.rebind and self.step_level is False:
            raise ValueError("scheduler.rebind needs scheduler.step_level=true (level 3)")
        if self.backend not in ("ray", "inprocess"):
            raise ValueError(f"scheduler.backend={self.backend!r}: choose 'ray' or 'inprocess'")
        if not 0 <= self.staleness <= 8:
            raise ValueError(f"scheduler.staleness={self.staleness}: must be within 0..8")
        if self.sim_workers < 1:
            raise ValueError("scheduler.sim_workers must be >= 1")
        if self.hang_timeout_s is not None and self.hang_timeout_s <= 0:
            raise ValueError(
                f"scheduler.hang_timeout_s={self.hang_timeout_s}: must be > 0 (or null: off)"
            )
        if self.batch_max is not None and self.batch_max < (self.batch_min or 1):
            raise ValueError(
                f"scheduler.batch_max={self.batch_max}: must be >= scheduler.batch_min "
                f"({self.batch_min or 1}), or null"
            )
        if self.reshape_window < 0:
            raise ValueError(f"scheduler.reshape_window={self.reshape_window}: must be >= 0")
        if self.max_restarts < 0:
            raise ValueError(f"scheduler.max_restarts={self.max_restarts}: must be >= 0")
        if self.gen_replicas < 1:
            raise ValueError(f"scheduler.gen_replicas={self.gen_replicas}: must be >= 1")
        if self.learner_ranks < 1:
            raise ValueError(f"scheduler.learner_ranks={self.learner_ranks}: must be >= 1")
        for role in ("gen", "learner"):
            share = getattr(self, f"{role}_gpus")
            if share < 0 or (share > 1 and share != int(share)):
                raise ValueError(
                    f"scheduler.{role}_gpus={share}: a share of one GPU (0 < x <= 1) or a "
                    "whole number of GPUs"
                )
            if share > 0 and self.backend != "ray":
                raise ValueError(
                    f"scheduler.{role}_gpus={share} needs scheduler.backend=ray (Ray places "
                    "stages on GPUs)"
                )
        if self.learner_strategy not in STRATEGIES:
            raise ValueError(
                f"scheduler.learner_strategy={self.learner_strategy!r}: choose one of "
                f"{', '.join(STRATEGIES)}"
            )
        if self.learner_strategy == "fsdp" and (self.backend != "ray" or self.learner_ranks < 2):
            raise ValueError(
                "scheduler.learner_strategy=fsdp shards the policy over the learner ranks, each "
                "a process of its own, so it needs scheduler.learner_ranks>=2 and "
                f"scheduler.backend=ray (got learner_ranks={self.learner_ranks}, "
                f"backend={self.backend}): set both, or use scheduler.learner_strategy=ddp"
            )
        if self.learner_ranks > 1 and self.backend != "ray":
            raise ValueError(
                f"scheduler.learner_ranks={self.learner_ranks} needs scheduler.backend=ray: "
                "each rank is a process of its own (torch.distributed has one group per process)"
            )

    def _fabric(self) -> GpuFabric:
        return GpuFabric(
            self.gen_gpus, self.learner_gpus, self.resources, self.mps_control, self.device
        )

    @property
    def k(self) -> int:
        return self.staleness if self.overlap else 0

    def roles(self, ctx: RunContext) -> Roles:
        n = int(ctx.factory.cfg["num_envs"])
        if self.sim_workers > n:
            raise ValueError(f"scheduler.sim_workers={self.sim_workers} > num_envs={n}")
        return Roles(
            ctx.factory.env_partition(self.sim_workers), self.gen_replicas, self.learner_ranks
        )

    def pinned_shape(self, ctx: RunContext, roles: Roles) -> Shape:
        """The shape without a search: unset levels on (G = the run's ``env_groups``)."""
        n = int(ctx.factory.cfg["num_envs"])
        g = ctx.env_groups if self.pipeline is not False else 1
        g = min(g, min(len(w) for w in roles.sims))
        step = self.step_level is not False
        # first M of N: N is a group's share of one replica
        m = self.batch_min or max(1, math.ceil(n / g / roles.replicas / 2))
        return Shape(g, step, m, self.batch_timeout_ms / 1000, self.batch_max)

    def shape(self, ctx: RunContext, roles: Roles) -> tuple[Shape, ShapeChoice | None]:
        """The run's G, step level and M: searched by the resource controller where a knob is
        unset (None) and the controller applies, else :meth:`pinned_shape`."""
        pinned = self.pinned_shape(ctx, roles)
        free = self.pipeline is None or self.step_level is None
        if not free or not ctx.manage_resources:
            return pinned, None
        if roles.replicas > 1:
            log.info(
                "shape: not searched with %d generator replicas: %s",
                roles.replicas,
                pinned.describe(),
            )
            return pinned, None
        cfg = ctx.factory.cfg
        node = cfg.get("resources") or {}
        work = Workload(
            workers=tuple(tuple(w) for w in roles.sims),
            decisions_per_env=ctx.decisions_per_env,
            staleness=self.k,
            cores=float(len(os.sched_getaffinity(0))),
            chunk_size=int(cfg["chunk_size"]),
        )
        # a generator batch set in the resources group means the step level
        step = True if node.get("gen_batch") is not None else self.step_level
        choice = control.choose_shape(
            ctx.factory,
            work,
            groups=None if self.pipeline is None else pinned.groups,
            step_level=step,
            batch_min=self.batch_min or node.get("gen_batch"),
            timeout_s=self.batch_timeout_ms / 1000,
            run_dir=ctx.run_dir,
            batch_max=self.batch_max,
        )
        return choice.shape, choice

    def plan(self, ctx: RunContext, roles: Roles, slots: SlotSpec, shape: Shape) -> Schedule:
        """The shape of the run every worker shares (resources: :func:`with_resources`)."""
        groups = env_groups(roles.sims, shape.groups)
        return Schedule(
            workers=roles.sims,
            groups=groups,
            decisions_per_env=ctx.decisions_per_env,
            staleness=self.k,
            step_level=shape.step_level,
            batch_min=shape.batch_min,
            batch_timeout_s=shape.batch_timeout_s,
            batch_max=shape.batch_max,
            slots=slots,
            home=home_cores(len(roles.sims), sorted(os.sched_getaffinity(0)))
            if (self.pin_sim or self.rebind)
            else None,
            rebind=self.rebind,
            driver_pid=os.getpid(),
            start_version=ctx.factory.start_version,
            budget=ctx.budget,
            heartbeat_s=min(1.0, self.hang_timeout_s / 10) if self.hang_timeout_s else None,
            ledger=str(ctx.ledger) if ctx.ledger is not None else None,
        )

    def check_resources(self, ctx: RunContext) -> None:
        """Algorithm 1 re-splits one generator and one learner: refuse it with more."""
        node = ctx.factory.cfg.get("resources") or {}
        if node.get("allocator") == "elastic" and (self.gen_replicas > 1 or self.learner_ranks > 1):
            raise ValueError(
                "resources.allocator=elastic re-splits the cores of one generator and one "
                f"learner rank; this run has scheduler.gen_replicas={self.gen_replicas} and "
                f"scheduler.learner_ranks={self.learner_ranks}: use resources.allocator=static, "
                "or 1 of each"
            )

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        # in-process workers are threads of this process: what they set must not outlive the run
        with affinity_guard(), threads_guard():
            yield from self._run(ctx)

    def _run(self, ctx: RunContext) -> Iterator[IterationReport]:
        """Start the roles and wire them (``spawn.py``), relay their reports (``relay.py``);
        always shut everything down."""
        self.check_resources(ctx)
        roles = self.roles(ctx)
        backend = (
            InProcessBackend()
            if self.backend == "inprocess"
            else RayBackend(
                self.ray_address,
                num_gpus=ray_local_gpus(
                    self.ray_address, self.gen_gpus > 0 or self.learner_gpus > 0
                ),
            )
        )
        authkey, host = new_authkey(), node_ip()
        inbox = Inbox(authkey)
        # messages read from the inbox and not handled yet: the run may end at a report that
        # came in one read with later messages (the learner's flush right behind its report)
        unread: deque[Any] = deque()
        slots: ShmSlots | None = None
        handles: list = []
        book: dict[str, Any] = {DRIVER: inbox.address}  # worker name -> inbox address
        res = self.resources or {}
        controller: RunController | None = None
        to_stages: control.StageLinks | None = None  # the controller's links to gen and learner
        try:
            self.gpu = self._fabric()
            self.gpu.set_quotas(
                ctx.factory.cfg,
                self.pinned_shape(ctx, roles).batch_min,
                int(ctx.factory.cfg["num_envs"]) * ctx.decisions_per_env // roles.ranks,
            )
            options = self.gpu.place(roles, backend, ctx.run_dir, placement_groups(ctx.factory.cfg))
            spawner = Spawner(backend, options, res, authkey, host, handles, book)
            # env workers build their envs first: they report the spec the policy is built from
            spec = spawner.sims(roles, ctx.factory)
            n, k = int(ctx.factory.cfg["num_envs"]), int(ctx.factory.cfg["chunk_size"])
            slots = ShmSlots.create(n, spec.obs_dim, k, spec.action_dim)
            factory = ctx.factory.with_spec(spec)
            shape, self.shape_choice = self.shape(dataclasses.replace(ctx, factory=factory), roles)
            trials = None
            if self.shape_choice is not None:
                shape, self.shape_choice, trials = control.start_trials(
                    self.shape_choice, factory.cfg, self.reshape_window, ctx.run_dir
                )
            searched = self.shape_choice  # the first report logs it
            plan = self.plan(ctx, roles, slots.spec, shape)
            controller = control.setup(
                factory,
                len(roles.sims),
                max(len(g) for g in plan.groups),
                ctx.decisions_per_env,
                run_dir=ctx.run_dir,
                managed=ctx.manage_resources,
                choice=self.shape_choice,
                trials=trials,
                watch=self.reshape_on_drift,
            )
            plan = control.with_resources(plan, roles, controller)
            gen_device = self.gpu.device_of("gen")
            gens, learners, board, dist = spawner.stages(
                roles,
                factory,
                gen_device,
                self.gpu.device_of("learner"),
                self.weight_board,
                self.learner_strategy,
            )
            gpu_roles = (gens if self.gen_gpus > 0 else []) + (
                learners if self.learner_gpus > 0 else []
            )
            self.gpu.record_env(gpu_roles, ctx.run_dir)
            spawner.start(roles, board, dist, plan)
            if controller is not None and controller.elastic is not None:
                to_stages = control.StageLinks(book, authkey)
            restarts = Restarts(
                backend, factory, roles, authkey, host, res, options, book, plan,
                self.max_restarts, board, dist, gen_device, controller, to_stages,
            )  # fmt: skip
            if controller is not None:
                controller.connect(
                    send_split=to_stages.send if to_stages is not None else None,
                    send_shape=lambda shape: reshape(shape, restarts),
                    send_quota=lambda new: self.gpu.requota(new, restarts, handles, ctx.run_dir),
                )
                if (sm := self.gpu.sm_resplitter(factory.cfg)) is not None:
                    budget = factory.cfg.get("budget")
                    controller.split_sms(sm, self.gpu.quotas, budget, self.gpu.started)
            yield from relay(
                inbox, handles, ctx, plan, self.gpu, self.hang_timeout_s, controller, restarts,
                unread, searched, on_choice=self._chose,
            )  # fmt: skip
        finally:
            if controller is not None:
                controller.close()
                if controller.choice is not None:  # re-ranked on the refit model at the end
                    self.shape_choice = controller.choice
            if to_stages is not None:
                to_stages.close()
            self._shutdown(inbox, handles, backend, slots, book, authkey, ctx.timeline, unread)
            self.gpu.stop_mps()  # already stopped by _shutdown, unless it failed before

    def _chose(self, choice: ShapeChoice) -> None:
        """The resource controller's shape choice, kept as the run's (the trials, the shape watch
        and the recalibration at the end may change it)."""
        self.shape_choice = choice

    def _shutdown(self, inbox, handles, backend, slots, book, authkey, timeline, unread=()) -> None:
        """Stop every worker (politely, then by force), keep the spans of the messages read
        and not handled (``unread``) and of their last flush, free the slots; never raises."""

        stop_workers((addr for name, addr in book.items() if name != DRIVER), authkey)
        for h in handles:
            try:
                h.stop()
            except Exception as e:  # keep shutting the others down
                log.warning("stopping %s: %s", h.name, e)
        with contextlib.suppress(Exception):  # after its clients, before Ray goes
            self.gpu.stop_mps()
        with contextlib.suppress(Exception):
            keep_last_spans(inbox, timeline, list(unread))
        with contextlib.suppress(Exception):
            backend.shutdown()
        inbox.close()
        if slots is not None:
            slots.close()
