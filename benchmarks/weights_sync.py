"""Publishing weights to R generator replicas on one machine: pickle through channels vs the board.

The learner publishes new weights after every update. Today it sends each replica the pickled
state dict through the run's channels (:mod:`ebrl.runtime.channel`); with the weight board
(:mod:`ebrl.runtime.weight_board`) it copies them once into shared memory and sends each replica
only the version, and each replica copies them into its own policy. Both paths are timed per update
on the project's policies (MLP 3x256, transformer S/M/L) with the embedded default's shapes
(PushCube: 35-dim observations, 8-dim actions, chunks of 4), for R = 1, 2, 4 replicas, each a
separate (spawned) process with one torch thread, as a generator replica is:

- ``learner ms``: time the learner spends before it can go on training (a: ``get_weights`` plus
  one pickle and send per replica; b: ``publish`` plus one small send per replica);
- ``loaded ms``: from the start until every replica acknowledged that the version sits in its
  policy (a: unpickle + ``set_weights``; b: ``read(into=policy.state_dict())``).

Medians over ``--updates`` updates (fewer, but at least 5, once a row has taken ``--row-seconds``:
the whole run stays near a minute on a busy machine; column ``n``) after 3 warm-up updates, the two
paths interleaved update by update. With more replicas than cores the replicas share them (this
prints the core count).

Usage: python benchmarks/weights_sync.py [--updates 20] [--row-seconds 2.5] [--replicas 1,2,4]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable

import torch

from ebrl.policies import MLPPolicy, Policy, PolicySpec, TransformerPolicy
from ebrl.runtime.channel import Address, Inbox, Outbox, new_authkey
from ebrl.runtime.weight_board import BoardReader, WeightBoard

SPEC = PolicySpec(obs_dim=35, action_dim=8, chunk_size=4)
POLICIES: dict[str, Callable[[], Policy]] = {
    "mlp": lambda: MLPPolicy(SPEC),
    "transformer_s": lambda: TransformerPolicy(SPEC, "S"),
    "transformer_m": lambda: TransformerPolicy(SPEC, "M"),
    "transformer_l": lambda: TransformerPolicy(SPEC, "L"),
}


def replica(rid: int, authkey: bytes, learner: Address, addresses: mp.Queue) -> None:
    """One generator replica: loads every version it is told about, then acknowledges it."""
    torch.set_num_threads(1)
    policies = {name: make() for name, make in POLICIES.items()}
    states = {name: p.state_dict() for name, p in policies.items()}  # share the parameters
    readers: dict[str, BoardReader] = {}
    inbox = Inbox(authkey)
    addresses.put((rid, inbox.address))
    ack = Outbox(learner, authkey)
    while True:
        for msg in inbox.recv():
            kind, name = msg[0], msg[1]
            if kind == "stop":
                for r in readers.values():
                    r.close()
                ack.close()
                inbox.close()
                return
            if kind == "open":
                readers[name] = BoardReader(msg[2])
                continue
            if kind == "pickle":
                policies[name].set_weights(msg[2], msg[3])
            else:  # "board": the board may already hold a newer version; that one is loaded
                version, _ = readers[name].read(into=states[name])
                policies[name].version = version
            ack.send((rid, policies[name].version))


def wait_acks(inbox: Inbox, n: int, version: int) -> None:
    got = 0
    while got < n:
        got += sum(1 for _, v in inbox.recv(timeout=30) if v >= version)


def bench(
    name: str, outs: list[Outbox], inbox: Inbox, updates: int, budget: float
) -> dict[str, list[float]]:
    """Time both paths to the replicas behind ``outs``, interleaved update by update."""
    torch.manual_seed(0)
    policy = POLICIES[name]()
    board = WeightBoard.create(policy.state_dict(), os.getpid())
    for o in outs:
        o.send(("open", name, board.spec))
    times: dict[str, list[float]] = {k: [] for k in ("p_learner", "p_loaded", "b_learner")}
    times |= {"b_loaded": [], "b_publish": []}
    t_row = time.perf_counter()
    try:
        for u in range(3 + updates):
            if u >= 8 and time.perf_counter() - t_row > budget:
                break
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(1e-3)  # an "update"
            policy.version += 1
            # (a) pickle of the state dict to every replica
            t0 = time.perf_counter()
            v, w = policy.get_weights()
            for o in outs:
                o.send(("pickle", name, v, w))
            t1 = time.perf_counter()
            wait_acks(inbox, len(outs), v)
            t2 = time.perf_counter()
            policy.version += 1
            # (b) the board, then the version to every replica
            t3 = time.perf_counter()
            pub = board.publish(policy.version, policy.state_dict())
            for o in outs:
                o.send(("board", name, policy.version))
            t4 = time.perf_counter()
            wait_acks(inbox, len(outs), policy.version)
            t5 = time.perf_counter()
            if u >= 3:
                for k, dt in zip(times, (t1 - t0, t2 - t0, t4 - t3, t5 - t3, pub)):
                    times[k].append(dt * 1e3)
    finally:
        board.close()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--updates", type=int, default=20, help="timed updates per row (at most)")
    p.add_argument(
        "--row-seconds", type=float, default=2.5, help="stop a row after this (>= 5 updates)"
    )
    p.add_argument("--replicas", default="1,2,4", help="comma-separated replica counts")
    args = p.parse_args()
    counts = sorted({int(r) for r in args.replicas.split(",")})
    torch.set_num_threads(1)
    t_start = time.perf_counter()

    authkey = new_authkey()
    inbox = Inbox(authkey)
    ctx = mp.get_context("spawn")
    addresses = ctx.Queue()
    procs = [
        ctx.Process(target=replica, args=(i, authkey, inbox.address, addresses), daemon=True)
        for i in range(max(counts))
    ]
    for pr in procs:
        pr.start()
    by_id = dict(addresses.get(timeout=120) for _ in procs)
    outs = [Outbox(by_id[i], authkey) for i in range(len(procs))]

    print(
        f"weights sync, {os.cpu_count()} cores, torch {torch.__version__} (1 thread per process), "
        f"median of n updates; (a) pickle via Outbox/Inbox, (b) weight board"
    )
    head = (
        f"{'policy':<14}{'MB':>7}{'R':>3}{'n':>4} | {'a learner':>10}{'b learner':>10}{'ratio':>7}"
        f" | {'a loaded':>9}{'b loaded':>9}{'ratio':>7} | {'b publish':>10}"
    )
    print(head)
    print("-" * len(head))
    med = statistics.median
    for name, make in POLICIES.items():
        mb = sum(t.numel() * t.element_size() for t in make().state_dict().values()) / 2**20
        for r in counts:
            t = bench(name, outs[:r], inbox, args.updates, args.row_seconds)
            pl, bl, pd, bd = (med(t[k]) for k in ("p_learner", "b_learner", "p_loaded", "b_loaded"))
            print(
                f"{name:<14}{mb:>7.2f}{r:>3}{len(t['b_publish']):>4}"
                f" | {pl:>10.2f}{bl:>10.2f}{pl / bl:>7.1f}"
                f" | {pd:>9.2f}{bd:>9.2f}{pd / bd:>7.1f} | {med(t['b_publish']):>10.2f}"
            )
    print("(times in ms; ratio = pickle / board, > 1: the board is faster)")

    for o in outs:
        o.send(("stop", ""))
        o.close()
    for pr in procs:
        pr.join(30)
    inbox.close()
    print(f"total {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
