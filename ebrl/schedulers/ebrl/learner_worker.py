"""The learner's ranks: the leader assembles segments, trains, publishes the weights, reports.

Rank 0 collects each env worker's :class:`Part` of a segment, checks the staleness bound
(:class:`StalenessError`), hands the segment to the other ranks, trains, publishes the new weights
to every generator replica (the shared-memory board, or inline) and sends the driver a
:class:`Report`. It also answers the driver about replaced workers (:class:`Lost`,
:class:`Reconnect`). The shared machinery is the :class:`~ebrl.schedulers.ebrl.worker.Worker`
base (``worker.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import ClassVar

import torch

from ebrl.rollout import EpisodeStats
from ebrl.runtime.channel import Address, Outbox
from ebrl.runtime.dist_group import destroy, free_port, init_group
from ebrl.runtime.weight_board import BoardSpec, WeightBoard
from ebrl.runtime.weight_cast import cast_address
from ebrl.schedulers.ebrl.messages import Lost, Owed, Part, Reconnect, Report, Resources, Weights
from ebrl.schedulers.ebrl.wiring import Links, learner_name
from ebrl.schedulers.ebrl.worker import Worker
from ebrl.stages.factory import StageFactory
from ebrl.types import Segment


class StalenessError(RuntimeError):
    """A segment held data older than the bound allows (a scheduler bug, never tolerated)."""


class LearnerWorker(Worker):
    """One rank of the learner. Rank 0, the leader, assembles segments from the env workers'
    parts, hands each to the other ranks, trains, publishes the weights to every replica and
    reports; ranks >= 1 train on what the leader hands them (every rank trains on its shard of
    each minibatch; the gradients are summed across ranks, ``ebrl.runtime.dist``). Under FSDP
    the ranks gather the full weights together after every update, and the leader publishes them.

    Args:
        rank: this rank (0: the leader).
        world: L, the learner's ranks.
        board: leader only: publish the weights on a shared-memory board (replicas on this
            machine read it; a replica elsewhere gets them inline). False: always inline.
        owner_pid: the driver's pid, which the board is named for.
        device: where the stage trains.
        strategy: ``ddp`` or ``fsdp`` (:mod:`ebrl.runtime.dist`), for ``world > 1``.
    """

    name = "learner"
    #: the leader's (the other ranks take segments from its broadcast, and None to stop)
    handlers: ClassVar[dict[type, str]] = {
        Part: "_part",  # an env worker's share of a segment
        Lost: "_lost",  # an env worker died: which segment its replacement owes (driver)
        Reconnect: "_reconnect",  # a replaced replica (driver)
        Resources: "apply_resources",  # threads, cores (driver)
    }

    def __init__(
        self,
        factory: StageFactory,
        authkey: bytes,
        driver_host: str,
        rank: int = 0,
        world: int = 1,
        board: bool = True,
        owner_pid: int = 0,
        device: str = "cpu",
        strategy: str = "ddp",
    ) -> None:
        super().__init__(factory, authkey, driver_host)
        self.rank, self.world = rank, world
        self.strategy = strategy
        self.name = learner_name(rank)
        self.use_board = board and rank == 0
        self.owner_pid = owner_pid or os.getpid()
        self.board: WeightBoard | None = None
        #: replicas sent the whole state inline (the others get it whole next time)
        self._sent_whole: set[int] = set()
        self.dp = None
        self.device = device

    def open(self) -> tuple[Address, tuple[str, int] | None, BoardSpec | None]:
        """Build the stage; return the inbox, and for the leader the rendezvous address of a
        learner of several ranks and the weight board's spec (None where there is none)."""
        self.stage = self.factory.train(device=self.device)
        address = self._open_inbox()
        lead = self.rank == 0 and self.world > 1
        # asked once: on a node with several interfaces a second answer could name another, and
        # the ranks' rendezvous and the weights' broadcast must advertise the same address
        cast = cast_address() if lead or self.use_board else None
        dist = None
        if lead:
            # where the other ranks reach it: this node's address as other nodes see it (the
            # inbox of a leader on the driver's machine advertises 127.0.0.1), on its own port
            host = cast[0] if cast is not None else address[0]
            dist = (host, free_port(host))
        if self.use_board:
            # named for the driver's pid (its orphan watchdog sweeps it) when on its machine
            owner = os.getpid() if self.inline else self.owner_pid
            # after the first publish, only what an update changes is copied onto it
            self.board = WeightBoard.create(self._state(), owner, self.stage.changing(), cast)
        return address, dist, self.board.spec if self.board is not None else None

    def _state(self) -> dict[str, torch.Tensor]:
        """The full weights to publish (under FSDP the leader's copy gathered after each
        update; before sharding, at ``open``, the whole policy's own)."""
        return self.stage.state()

    def _connect(self, links: Links) -> None:
        # replica -> (its inbox, whether it reads the board); None while a dead one is replaced
        self.gens: list[tuple[Outbox | None, bool]] = [
            (Outbox(a, self.authkey), via_board) for a, via_board in links.gens
        ]
        self._check_version()
        if links.world > 1:
            assert links.dist is not None
            device = next(self.stage.algo.policy.parameters()).device
            self.dp = init_group(
                links.rank, links.world, links.dist, device=device, strategy=self.strategy
            )
            self.stage.join(self.dp)  # FSDP: every rank keeps its shards of the loaded state
        if links.cast is not None and self.board is not None:  # replicas on other nodes
            self.board.cast_to(links.cast, next(self.stage.algo.policy.parameters()).device)
        if self.plan.train_resources is not None:
            self.apply_resources(self.plan.train_resources)

    def _close(self) -> None:
        if self.dp is not None:
            destroy()
            self.dp = None
        if self.board is not None:
            self.board.close()

    def _loop(self) -> None:
        if self.rank == 0:
            self._lead()
        else:
            self._follow()

    def _hand_on(self, seg: Segment | None) -> Segment | None:
        """Leader: give ``seg`` (None: stop) to the other ranks; others: receive it."""
        if self.dp is None:
            return seg
        box = [seg]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def _follow(self) -> None:
        tl = self.timeline
        while True:
            seg = self._hand_on(None)
            if seg is None:
                return
            with tl.span("train", self.name, steps=seg.num_steps):
                self.stage.train(seg)
            self.flush()

    def _publish(self) -> None:
        """The new weights to every replica: on the board for those on this machine (one copy
        in all), inline for the others."""
        with self.timeline.span("sync", self.name):
            if self.board is not None:
                self.publish_s += self.board.publish(self.stage.version, self._state())
            inline: dict = {}  # the state dicts, built once if a replica needs them inline
            for r in range(len(self.gens)):
                self._send_weights(r, inline)

    def _send_weights(self, r: int, inline: dict) -> None:
        """The current version to replica ``r``; a replica whose process is gone is skipped
        until the driver replaces it (:class:`Reconnect`). Inline, a replica gets the whole
        state once, then the tensors an update changes (``inline``: those built so far)."""
        out, via_board = self.gens[r]
        if out is None:
            return
        version = self.stage.version
        board = via_board and self.board is not None
        if board:
            msg = Weights(version, None)
        else:
            whole = r not in self._sent_whole
            if whole not in inline:
                inline[whole] = self.stage.weights(changing_only=not whole)[1]
            msg = Weights(version, inline[whole])
        try:
            out.send(msg)
        except OSError:
            self.gens[r] = (None, via_board)
            return
        if not board:
            self._sent_whole.add(r)

    def _part(self, m: Part) -> None:
        self.parts.setdefault(m.index, {})[m.worker] = m

    def _lost(self, m: Lost) -> None:
        """Its replacement starts at the first segment the leader misses its part of."""
        owed = self.segment
        while m.worker in self.parts.get(owed, {}):
            owed += 1
        self.driver.send(Owed(m.worker, owed))

    def _reconnect(self, m: Reconnect) -> None:
        """A replaced replica: the weights now, the whole state (a new process)."""
        with contextlib.suppress(OSError):
            if (old := self.gens[m.replica][0]) is not None:
                old.close()
        self.gens[m.replica] = (Outbox(m.address, self.authkey), m.via_board)
        self._sent_whole.discard(m.replica)
        self._send_weights(m.replica, {})

    def _lead(self) -> None:
        plan, tl = self.plan, self.timeline
        n_workers = len(plan.workers)
        # segment index -> env worker -> its part; the next segment to train
        parts: dict[int, dict[int, Part]] = {}
        self.parts, self.segment = parts, 0
        self.publish_s = 0.0
        while True:
            if self._handle(self.inbox.recv(timeout=None)):
                self._hand_on(None)  # the other ranks leave their loop too
                return
            while len(parts.get(self.segment, {})) == n_workers and not plan.budget.spent(
                self.stage.version, self.stage.trained_env_steps
            ):
                got = parts.pop(self.segment)
                seg = Segment.cat_envs([got[w].segment for w in range(n_workers)])
                stale = int((self.stage.version - seg.policy_version).max())
                if stale > plan.staleness:
                    raise StalenessError(
                        f"segment {self.segment} holds data {stale} versions old; "
                        f"the bound is {plan.staleness}"
                    )
                t0 = time.perf_counter()
                with tl.span("train", self.name, steps=seg.num_steps):
                    self._hand_on(seg)
                    metrics = self.stage.train(seg)
                # the learner's throughput for the allocator: decisions trained per second
                t_len, n_envs = seg.shape
                metrics["resource/train_per_s_update"] = (
                    t_len * n_envs / max(time.perf_counter() - t0, 1e-9)
                )
                self._publish()
                metrics["pipeline/weights_publish_s"] = self.publish_s / (self.segment + 1)
                if self.board is not None:
                    metrics.update(self.board.cast_metrics())
                if self.dp is not None:  # the ranks' backend: 1 NCCL, 0 gloo
                    metrics["train/dist_nccl"] = float(self.dp.backend == "nccl")
                metrics.update(EpisodeStats.merge([got[w].episodes for w in range(n_workers)]))
                self.driver.send(Report(self.segment, seg.num_steps, metrics))
                self.flush(force=True)
                self.segment += 1
