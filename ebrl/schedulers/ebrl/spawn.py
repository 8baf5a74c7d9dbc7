"""Starting a run's workers on EBRL's engine: each role spawned on the backend where the GPU
fabric placed it (``gpu.py``), opened (its inbox address written into the run's address book),
then wired (:func:`~ebrl.schedulers.ebrl.wiring.wire`) and started with the run's
:class:`~ebrl.schedulers.ebrl.worker.Schedule`.

The engine (``scheduler.py``) starts them in steps because the run's shape is chosen in
between: the env workers first (they build their envs and report the spec the policy is built
from), then the generator replicas and the learner ranks, then every worker's links. A worker
replaced while the run goes on is started by ``restarts.py``, into the same address book.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ebrl.envs.base import EnvSpec
from ebrl.runtime.backend import Backend, Handle
from ebrl.runtime.weight_board import BoardSpec
from ebrl.schedulers.ebrl.env_worker import EnvWorker
from ebrl.schedulers.ebrl.gen_worker import GenWorker
from ebrl.schedulers.ebrl.learner_worker import LearnerWorker
from ebrl.schedulers.ebrl.wiring import (
    Roles,
    gen_name,
    learner_name,
    nodes_of,
    sim_name,
    weight_routes,
    wire,
)
from ebrl.schedulers.ebrl.worker import Schedule
from ebrl.stages.factory import StageFactory

log = logging.getLogger(__name__)


class Spawner:
    """Spawns, opens, wires and starts one run's workers.

    Every handle it spawns is appended to ``handles`` and every inbox address it opens is
    written to ``book`` (worker name -> inbox address): both are the engine's, which shuts them
    down however far the start got.

    Args:
        backend: where the workers run (Ray actors or threads).
        options: each worker's placement (Ray actor options), by name (``GpuFabric.place``).
        resources: Ray custom resources per role, for a worker without a placement.
        authkey: the run's channel key; host: the driver's address.
    """

    def __init__(
        self,
        backend: Backend,
        options: dict[str, dict],
        resources: dict[str, dict[str, float]],
        authkey: bytes,
        host: str,
        handles: list[Handle],
        book: dict[str, Any],
    ) -> None:
        self.backend, self.options, self.resources = backend, options, resources
        self.authkey, self.host = authkey, host
        self.handles, self.book = handles, book

    def spawn(self, name: str, role: str, cls: type, *args: Any) -> Handle:
        placed = self.options.get(name)  # it carries the role's custom resources
        h = self.backend.spawn(
            name, cls, *args, resources=None if placed else self.resources.get(role), options=placed
        )
        self.handles.append(h)
        return h

    def sims(self, roles: Roles, factory: StageFactory) -> EnvSpec:
        """Start the env workers and open them: they build their envs first, and report the
        spec the policy is built from."""
        sims = [
            self.spawn(sim_name(w), "sim", EnvWorker, w, ids, factory, self.authkey, self.host)
            for w, ids in enumerate(roles.sims)
        ]
        for h in sims:
            self.book[h.name], spec = h.open()
        return spec

    def stages(
        self,
        roles: Roles,
        factory: StageFactory,
        gen_device: str,
        learner_device: str,
        weight_board: bool,
        strategy: str,
    ) -> tuple[list[Handle], list[Handle], BoardSpec | None, tuple[str, int] | None]:
        """Start the generator replicas and the learner ranks (every one spawned before any is
        opened); return their handles, the leader's weight board and its rendezvous address."""
        first = (factory, self.authkey, self.host)  # every worker's first arguments
        gens = [
            self.spawn(gen_name(r), "gen", GenWorker, *first, r, gen_device)
            for r in range(roles.replicas)
        ]
        learners = []
        for rank in range(roles.ranks):
            args = (rank, roles.ranks, weight_board, os.getpid(), learner_device, strategy)
            learners.append(self.spawn(learner_name(rank), "learner", LearnerWorker, *first, *args))
        for h in gens:
            self.book[h.name] = h.open()
        opened = [h.open() for h in learners]  # (inbox, rendezvous, board spec) each
        for h, (address, _, _) in zip(learners, opened, strict=True):
            self.book[h.name] = address
        _, dist, board = opened[0]  # the leader's
        return gens, learners, board, dist

    def start(
        self,
        roles: Roles,
        board: BoardSpec | None,
        dist: tuple[str, int] | None,
        plan: Schedule,
    ) -> None:
        """Wire every worker spawned (``wiring.wire``, over the nodes they were placed on) and
        start it with the run's schedule."""
        links = wire(roles, self.book, board, dist, nodes_of(self.options))
        log.info("%s", weight_routes(roles, links))
        for h in self.handles:
            h.start(links[h.name], plan)
