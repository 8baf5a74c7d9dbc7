"""Who sends what to whom in a run on EBRL's workers: the one place the data flow is wired.

Every schedule built on these workers (EBRL, and the Hybrid and Async baselines, which are EBRL
with levels switched off) has the same roles:

* ``E`` **env workers** ``sim<w>``: one process each, a contiguous block of the run's envs;
* ``R`` **generator replicas** ``gen`` (``gen<r>`` for r >= 1): each acts for the env workers
  :meth:`Roles.replica_of` gives it, with its own copy of the weights and its own policy version;
* a **learner** of ``L`` ranks ``learner`` (``learner<l>`` for l >= 1): rank 0, the leader,
  assembles segments and talks to everyone; every rank trains on every segment, each on its shard
  of every minibatch, gradients summed across ranks (torch.distributed: gloo on CPU, NCCL on GPU).

The traffic, the one copy of this diagram (docs/architecture.md points here); the arrows are
:class:`~ebrl.runtime.channel.Outbox` -> inbox links unless said. Who reacts to each message at
its receiving end is a table: each worker's ``handlers`` (``env_worker.py``, ``gen_worker.py``,
``learner_worker.py``) and the driver's in ``relay`` (``relay.py``)::

    sim w    --Hello, Ready(ids)-->   gen r(w)        observations in the shared slots
    gen r    --Go(ids)-->             sim w           action chunks in the shared slots
    sim w    --Part(index, share)-->  learner         a segment's share of w's envs
    learner  ==broadcast(segment)==>  learner 1..L-1  torch.distributed, not a channel
    learner  --Weights(version)-->    gen r, every r  the weights on the board (shared memory)
    learner  --Report, Owed-->        driver          one update done; a replacement's segment
    any      --Telemetry, Beat, Failed, Applied--> driver
    driver   --Resources--> gen r, learner;  --Lost--> learner;  --Stop--> every worker
    driver   --Reshape--> sim w, gen r                the run's new shape (shape trials, watch)
    driver   --Rewire--> sim w;  --Reconnect--> learner      a dead replica was replaced
    sim w    --Resync, Ready-->       the new gen r   where its envs stand; those waiting

Slots (``ebrl.runtime.slots``) hold one observation and one chunk per env; a worker on another
machine than the driver carries the rows inline in its messages instead. The weight board
(``ebrl.runtime.weight_board``) is written by the leader and read by every replica on the leader's
node; on the other nodes (where the workers' Ray nodes are known) by the leader's broadcast to one
receiver per node (``ebrl.runtime.weight_cast``), which writes that node's board for its
replicas; where nodes are not known, a replica on another machine gets the weights inline in its
:class:`Weights` message.

Backpressure is the staleness gate, not queue sizes: a replica acts for an env only while the
segment that decision lands in will be trained by a learner version at most ``k`` ahead of the
replica's (``GenWorker._eligible``); so the env workers wait for the generator, the generator for
the learner's weights, and the learner for the env workers' parts. Nothing is dropped.

Shutdown: the driver tells every worker ``Stop`` (``heartbeat.stop_workers``: from threads, 2 s
in all), then stops their handles (Ray kills the processes); the leader hands ``None`` to its
followers' broadcast so they leave their loop too. A worker that stops beating is hung
(``heartbeat.py``). A dead env worker or generator replica is replaced (the driver's
``Restarts``, which re-wires with :func:`wire` over the updated address book); a dead learner
rank stops the run with a StageError, its checkpoint resumes it.

:func:`wire` is a pure function from the roles and the workers' inbox addresses to each worker's
:class:`Links`: tests call it directly, workers never look peers up by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ebrl.runtime.channel import Address

#: the name of the driver's inbox in an address book
DRIVER = "driver"


def sim_name(w: int) -> str:
    return f"sim{w}"


def gen_name(r: int) -> str:
    """Replica 0 keeps the single generator's name, so 1-replica runs log as before."""
    return "gen" if r == 0 else f"gen{r}"


def learner_name(rank: int) -> str:
    """Rank 0 (the leader) keeps the single learner's name."""
    return "learner" if rank == 0 else f"learner{rank}"


@dataclass(frozen=True)
class Roles:
    """How many of each role a run has, and which replica serves which env worker.

    Attributes:
        sims: env ids of each env worker.
        replicas: R, generator replicas (each serves a contiguous block of env workers).
        ranks: L, learner ranks.
    """

    sims: list[list[int]]
    replicas: int = 1
    ranks: int = 1

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.ranks < 1:
            raise ValueError(f"roles: replicas={self.replicas}, ranks={self.ranks}: must be >= 1")
        if self.replicas > len(self.sims):
            raise ValueError(
                f"scheduler.gen_replicas={self.replicas} > scheduler.sim_workers="
                f"{len(self.sims)}: every replica serves at least one env worker; "
                "lower gen_replicas or raise sim_workers"
            )

    @property
    def replica_of(self) -> tuple[int, ...]:
        """Env worker -> the replica that acts for it (contiguous blocks of env workers)."""
        blocks = np.array_split(np.arange(len(self.sims)), self.replicas)
        return tuple(int(r) for r, b in enumerate(blocks) for _ in b)

    def served_by(self, r: int) -> list[int]:
        """The env workers replica ``r`` acts for."""
        return [w for w, rr in enumerate(self.replica_of) if rr == r]

    def names(self) -> list[str]:
        return (
            [sim_name(w) for w in range(len(self.sims))]
            + [gen_name(r) for r in range(self.replicas)]
            + [learner_name(i) for i in range(self.ranks)]
        )


@dataclass(frozen=True)
class Links:
    """What one worker sends to: every address it needs, nothing looked up by name.

    Attributes:
        driver: the driver's inbox (reports, telemetry, heartbeats, failures).
        gen: env worker: the replica it sends Hello/Ready to.
        learner: env worker: the leader it sends its parts to.
        envs: replica: env worker -> inbox, for the env workers it serves.
        gens: leader: every replica's inbox, with whether it reads the weight board.
        rank: learner: its rank; world: the learner's ranks.
        dist: learner: the leader's (host, port) for torch.distributed's rendezvous (None: 1 rank).
        board: replica: the weight board it reads: the leader's (a ``BoardSpec``), or on
            another node its node's (a ``NodeBoard``, which the collective fills); None:
            weights come inline.
        cast: leader: the node receivers it broadcasts the weights to after every update
            (a ``CastSpec``; None: no replica on another node, or weights inline).
    """

    driver: Address
    gen: Address | None = None
    learner: Address | None = None
    envs: dict[int, Address] = field(default_factory=dict)
    gens: tuple[tuple[Address, bool], ...] = ()
    rank: int = 0
    world: int = 1
    dist: tuple[str, int] | None = None
    board: Any = None
    cast: Any = None


def nodes_of(options: dict[str, dict]) -> dict[str, str]:
    """Worker name -> the Ray node it was placed on (the node id of its actor options'
    node affinity); workers without one (in-process, unplaced) are left out."""
    out = {}
    for name, opts in options.items():
        node = getattr((opts or {}).get("scheduling_strategy"), "node_id", None)
        if node:
            out[name] = str(node)
    return out


def same_machine(a: Address, b: Address) -> bool:
    """Whether two inboxes are on one machine: workers on the driver's advertise 127.0.0.1."""
    return a[0] == b[0]


def wire(
    roles: Roles,
    inboxes: dict[str, Address],
    board: Any = None,
    dist: tuple[str, int] | None = None,
    nodes: dict[str, str] | None = None,
) -> dict[str, Links]:
    """Every worker's links.

    Weights: a replica on the leader's node reads the leader's board. Where the workers' nodes
    are known (``nodes``) and the board can be broadcast (its spec's ``cast_at``), the replicas
    on the other nodes read their node's board, which the first replica of each node (its
    receiver) fills from the leader's broadcast (``ebrl.runtime.weight_cast``); otherwise a replica
    on another machine gets the weights inline.

    Args:
        roles: the run's roles.
        inboxes: worker name (and ``DRIVER``) -> inbox address.
        board: the leader's weight board spec (None: weights travel inline to every replica).
        dist: the leader's rendezvous address for a learner of more than one rank.
        nodes: worker name -> its Ray node (:func:`nodes_of`); None: nodes unknown (machines
            are told apart by the inboxes' addresses).
    """
    from ebrl.runtime.weight_cast import CastSpec, NodeBoard

    driver = inboxes[DRIVER]
    leader = inboxes[learner_name(0)]
    replica_of = roles.replica_of
    out: dict[str, Links] = {}
    for w in range(len(roles.sims)):
        out[sim_name(w)] = Links(driver, gen=inboxes[gen_name(replica_of[w])], learner=leader)
    nodes = nodes or {}
    home = nodes.get(learner_name(0))
    castable = board is not None and getattr(board, "cast_at", None) is not None
    remote: dict[str, list[int]] = {}  # node -> its replicas, for nodes other than the leader's
    for r in range(roles.replicas):
        node = nodes.get(gen_name(r))
        if castable and home is not None and node is not None and node != home:
            remote.setdefault(node, []).append(r)
    cast = CastSpec(board.cast_at, len(remote)) if remote else None
    node_board: dict[int, NodeBoard] = {}
    for j, replicas in enumerate(remote.values(), start=1):
        for r in replicas:
            node_board[r] = NodeBoard(cast, j, board, receiver=r == replicas[0])
    gens = []
    for r in range(roles.replicas):
        addr = inboxes[gen_name(r)]
        envs = {w: inboxes[sim_name(w)] for w in roles.served_by(r)}
        if r in node_board:
            gens.append((addr, True))
            out[gen_name(r)] = Links(driver, envs=envs, board=node_board[r])
            continue
        local = board is not None and (
            nodes.get(gen_name(r)) == home if home is not None and castable
            else same_machine(addr, leader)
        )  # fmt: skip
        gens.append((addr, local))
        out[gen_name(r)] = Links(driver, envs=envs, board=board if local else None)
    for rank in range(roles.ranks):
        out[learner_name(rank)] = Links(
            driver,
            gens=tuple(gens) if rank == 0 else (),
            rank=rank,
            world=roles.ranks,
            dist=dist if roles.ranks > 1 else None,
            cast=cast if rank == 0 else None,
        )
    return out


def weight_routes(roles: Roles, links: dict[str, Links]) -> str:
    """How each replica gets the learner's weights, in one line (the driver logs it)."""
    parts = []
    for r in range(roles.replicas):
        board = links[gen_name(r)].board
        if board is None:
            how = "inline"
        elif hasattr(board, "receiver"):  # a NodeBoard
            role = "receiver" if board.receiver else "reads"
            how = f"collective (node {board.node}'s board, {role})"
        else:
            how = "the leader's board"
        parts.append(f"{gen_name(r)}: {how}")
    cast = links[learner_name(0)].cast
    head = f"broadcast to {cast.receivers} node receiver(s); " if cast is not None else ""
    return "weights: " + head + "; ".join(parts)
