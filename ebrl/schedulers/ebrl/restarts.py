"""Replacing the worker processes of a running EBRL run: a dead env worker or generator
replica (a simulator crash, the OOM killer, a hung process killed), and a generator replica
restarted on purpose with a new SM quota (:meth:`Restarts.requota`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ebrl.resources.controller import RunController
from ebrl.runtime.channel import Outbox
from ebrl.schedulers.base import StageError
from ebrl.schedulers.ebrl import control
from ebrl.schedulers.ebrl.env_worker import EnvWorker
from ebrl.schedulers.ebrl.gen_worker import GenWorker
from ebrl.schedulers.ebrl.messages import Lost, Owed, Reconnect, Rewire
from ebrl.schedulers.ebrl.wiring import (
    Links,
    Roles,
    gen_name,
    learner_name,
    nodes_of,
    sim_name,
    wire,
)
from ebrl.schedulers.ebrl.worker import Schedule

log = logging.getLogger(__name__)


class Restarts:
    """Replaces env worker and generator processes that die while the run goes on (at most
    ``limit`` in all).

    An env worker's death is answered in two steps, neither of which stops the other workers:
    the learner is asked which segment it still needs of that worker (:class:`Lost` ->
    :class:`Owed`), then a new process with the same envs is started there. Its envs reset; the
    decisions its predecessor had taken since that segment are lost (the generator counts them:
    ``fault/lost_decisions``) and never trained on.

    A generator replica's death is answered at once: a new replica (its ``epoch`` one higher)
    takes the newest weights from the board, its env workers are rewired to it
    (:class:`Rewire`: each tells it where its envs stand and hands over those waiting for an
    action; chunks the dead one sent and they had not read are dropped,
    ``fault/gen_dropped_chunks``), and the leader sends it the weights (:class:`Reconnect`).
    No env resets and no transition is lost: the env workers hold every decision taken.

    A dead learner rank holds state no other process has, and stops the run with a StageError
    (its checkpoint resumes it).
    """

    def __init__(
        self,
        backend: Any,
        factory: Any,
        roles: Roles,
        authkey: bytes,
        host: str,
        resources: dict[str, dict[str, float]],
        options: dict[str, dict],
        book: dict[str, Any],
        plan: Schedule,
        limit: int,
        board: Any,
        dist: tuple[str, int] | None,
        gen_device: str,
        controller: RunController | None,
        to_stages: control.StageLinks | None = None,
    ) -> None:
        self.backend, self.factory, self.roles = backend, factory, roles
        self.authkey, self.host, self.resources = authkey, host, resources
        self.options, self.book = options, book
        self.plan, self.limit = plan, limit
        self.board, self.dist, self.gen_device, self.controller = (
            board,
            dist,
            gen_device,
            controller,
        )
        self.to_stages = to_stages
        self.sims = self.gens = 0  # replaced so far
        self.epochs: dict[int, int] = {}  # replica -> its current incarnation
        self.dead: list[Any] = []  # handles of dead processes (never polled again)

    @staticmethod
    def replaceable(handle: Any) -> bool:
        return handle.name.startswith(("sim", "gen"))

    def died(self, handle: Any, why: str, handles: list) -> None:
        done = self.sims + self.gens
        if done >= self.limit:
            raise StageError(
                handle.name,
                f"{why}; {done} worker(s) already replaced during this run "
                f"(scheduler.max_restarts={self.limit}): stopping. The checkpoint resumes it",
            )
        self.dead.append(handle)
        log.warning("%s: %s; replacing it (%d/%d)", handle.name, why, done + 1, self.limit)
        if handle.name.startswith("gen"):
            self.gens += 1
            self._replace_gen(handle.name, handles)
            return
        self.sims += 1
        out = Outbox(self._links()[handle.name].learner, self.authkey)
        out.send(Lost(int(handle.name.removeprefix("sim"))))
        out.close()

    def _links(self) -> dict[str, Links]:
        """Everyone's links from the address book as it is now (replacements included)."""
        return wire(self.roles, self.book, self.board, self.dist, nodes_of(self.options))

    def _spawn(self, name: str, role: str, cls: type, *args: Any) -> Any:
        placed = _soft(self.options.get(name))
        return self.backend.spawn(
            name, cls, *args, resources=None if placed else self.resources.get(role),
            options=placed,
        )  # fmt: skip

    def replace(self, owed: Owed, handles: list) -> None:
        """An env worker's replacement, once the learner said which segment it owes."""
        w = owed.worker
        name = sim_name(w)  # with its predecessor's links (same gen, same learner)
        h = self._spawn(
            name, "sim", EnvWorker, w, self.roles.sims[w], self.factory, self.authkey, self.host,
            owed.index, self.sims,
        )  # fmt: skip
        self.book[name], _ = h.open()
        handles.append(h)
        h.start(self._links()[name], self.plan)
        log.warning("sim%d: replaced; it continues at segment %d", w, owed.index)

    def requota(
        self, name: str, quota: int, handles: list, opened: Callable[[Any], None] | None = None
    ) -> Any:
        """Replace the live generator replica ``name`` by one whose process runs with SM quota
        ``quota`` (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: CUDA reads it when the process makes
        its context, so a new process it must be). The replacement is the one a dead replica
        gets (:meth:`_replace_gen`): the newest weights from the board, its env workers rewired
        to it, no env reset, no transition lost. It is not a fault: ``max_restarts`` is not
        spent. ``opened``: as for :meth:`_replace_gen`. Returns the new handle."""
        old = next(h for h in handles if h.name == name and h not in self.dead)
        opts = dict(self.options.get(name) or {})
        runtime_env = dict(opts.get("runtime_env") or {})
        env = dict(runtime_env.get("env_vars") or {})
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(quota))
        self.options[name] = {**opts, "runtime_env": {**runtime_env, "env_vars": env}}
        self.dead.append(old)
        old.kill()
        self._replace_gen(name, handles, opened)
        return handles[-1]

    def _replace_gen(
        self, name: str, handles: list, opened: Callable[[Any], None] | None = None
    ) -> None:
        """A new generator replica ``name``; ``opened`` is called with its handle once its
        process is up, before it runs its loop (a call on it then would queue behind that)."""
        r = 0 if name == gen_name(0) else int(name.removeprefix("gen"))
        epoch = self.epochs[r] = self.epochs.get(r, 0) + 1
        h = self._spawn(
            name, "gen", GenWorker, self.factory, self.authkey, self.host, r, self.gen_device,
            epoch,
        )  # fmt: skip
        self.book[name] = h.open()
        handles.append(h)
        if opened is not None:
            opened(h)
        links = self._links()
        h.start(links[name], self.plan)
        for w in self.roles.served_by(r):  # a dead env worker's replacement says Hello itself
            with contextlib.suppress(OSError):
                out = Outbox(self.book[sim_name(w)], self.authkey, retries=5)
                out.send(Rewire(self.book[name], epoch))
                out.close()
        address, via_board = links[learner_name(0)].gens[r]
        out = Outbox(self.book[learner_name(0)], self.authkey)
        out.send(Reconnect(r, address, via_board))
        out.close()
        if self.controller is not None and r == 0:
            if self.to_stages is not None:
                self.to_stages.relink(name, self.book[name])
            self.controller.replaced(name)
        log.warning("%s: replaced (incarnation %d); its env workers rewired to it", name, epoch)


def _soft(options: dict | None) -> dict | None:
    """A replacement's placement: its predecessor's node if that node is still there, else
    any (the process may have died with its node)."""
    strategy = (options or {}).get("scheduling_strategy")
    if strategy is None or not hasattr(strategy, "node_id"):
        return options
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {
        **options,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(strategy.node_id, soft=True),
    }
