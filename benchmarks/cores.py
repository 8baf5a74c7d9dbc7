"""How many cores does this machine really give two compute-bound processes?

The schedule model (``ebrl/resources/model/``) shares cores as an operating system would: two
jobs on two cores each run at full speed. On virtual machines two vCPUs may be hardware threads
of one physical core, or share caches and memory bandwidth, and then two jobs slow each other
down although each has "its own" core. This benchmark measures it for three kinds of work, each
alone and then as two processes at once, and prints the effective cores:

    effective cores = 2 x (work per second of one process, with the other running)
                        / (work per second of one process alone)

- ``matmul``: single-threaded torch matrix products (what a policy's forward and backward do);
- ``policy``: the embedded default's VLA-shaped transformer acting on a batch of 8, 1 thread;
- ``python``: a pure-Python loop (the engine's own glue).

The two processes run side by side for ``--seconds`` each, repeated ``--repeats`` times,
alternating with runs alone, so a slow drift of a shared machine hits both alike.

Usage: python benchmarks/cores.py [--seconds 3] [--repeats 3] [--kinds matmul,policy,python]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import provenance  # noqa: E402


def _work(kind: str):
    """A callable doing one unit of ``kind`` work."""
    if kind == "python":

        def spin() -> None:
            s = 0
            for i in range(20_000):
                s += i * i % 7

        return spin
    import torch

    torch.set_num_threads(1)
    if kind == "matmul":
        a = torch.randn(256, 256)

        def matmul() -> None:
            a @ a

        return matmul
    if kind == "policy":
        from ebrl.policies.base import PolicySpec
        from ebrl.policies.transformer import TransformerPolicy
        from ebrl.types import Observation

        policy = TransformerPolicy(
            spec=PolicySpec(obs_dim=35, action_dim=8, chunk_size=4), size="L"
        )
        obs = Observation(obs=torch.randn(8, 35), env_ids=torch.arange(8))

        def act() -> None:
            with torch.no_grad():
                policy.act(obs)

        return act
    raise ValueError(f"unknown kind {kind!r}: matmul, policy or python")


def _rate(kind: str, seconds: float, start: float, out) -> None:
    """Units of ``kind`` per second over ``seconds``, starting at wall time ``start``."""
    fn = _work(kind)
    fn()  # warm up
    while time.time() < start:
        time.sleep(0.001)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    out.put(n / (time.perf_counter() - t0))


def rates(kind: str, procs: int, seconds: float) -> list[float]:
    """Each of ``procs`` processes' rate, run at once (spawned: no state shared)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 4.0  # every process built its work and waits
    ps = [ctx.Process(target=_rate, args=(kind, seconds, start, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    got = [q.get(timeout=seconds + 120) for _ in ps]
    for p in ps:
        p.join()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", default="matmul,policy,python")
    ap.add_argument("--out", type=Path, default=None, help="write table.md here")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    lines = [
        f"| work | alone, units/s | 2 at once, units/s each | effective cores (of {cpus}) |",
        "|---|---|---|---|",
    ]
    for kind in args.kinds.split(","):
        alone, pair = [], []
        for _ in range(args.repeats):
            alone += rates(kind, 1, args.seconds)
            pair += rates(kind, 2, args.seconds)
        a, p = float(np.median(alone)), float(np.median(pair))
        eff = 2 * p / a
        lines.append(f"| {kind} | {a:.1f} | {p:.1f} | {eff:.2f} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        prov = provenance([], seconds=args.seconds, repeats=args.repeats, kinds=args.kinds)
        (args.out / "table.md").write_text(
            f"# Effective cores\n\n{table}\n\n```json\n{json.dumps(prov, indent=2)}\n```\n"
        )


if __name__ == "__main__":
    main()
