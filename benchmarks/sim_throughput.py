"""Simulator throughput in one process, and what EnvGroup's chunked stepping adds on top.

Usage: ``python benchmarks/sim_throughput.py [--seconds 2.5] [--no-maniskill] [--no-libero]
[--libero-suites libero_object,...] [--libero-cameras 128] [--libero-seconds 10]``

Part 1: env steps per second of a single env instance stepped with random actions (resetting at
episode ends), per simulator, with the step latency's P50 and P99 (each ``env.step`` timed).
LIBERO rows (when ``make setup-libero`` has run): task 0 of each suite, state observations and,
unless ``--libero-cameras 0``, the two cameras rendered on the CPU at that size; each is warmed up
first (robosuite compiles its controller at a process's first step) and measured for
``--libero-seconds``. Part 2: the same work through :class:`EnvGroup.step_chunk` (N envs, chunks
of K actions) against raw ``env.step`` on the same envs, as a time ratio per step; ratio 1.0 means
the group costs nothing beyond the simulator.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ebrl.envs import CountingEnv, Env, EnvGroup, SyntheticCostEnv
from ebrl.types import ActionChunk

NUM_ACTIONS = 4096  # pre-drawn random actions, cycled, so RNG cost stays out of the timings


def raw_rate(
    env: Env,
    seconds: float,
    seed: int = 0,
    latencies: list[float] | None = None,
    check_every: int = 64,
    warmup: int = 0,
) -> float:
    """Env steps per second of ``env.step`` alone, with a reset at each episode end.

    ``latencies``: each step's duration (seconds) is appended; ``check_every``: steps between
    looks at the deadline (few for slow simulators); ``warmup``: untimed steps first.
    """
    rng = np.random.default_rng(seed)
    s = env.spec
    acts = rng.uniform(s.action_low, s.action_high, (NUM_ACTIONS, s.action_dim)).astype(np.float32)
    env.reset(seed)
    for i in range(warmup):
        env.step(acts[i % NUM_ACTIONS])
    if warmup:
        env.reset(seed)
    lat = latencies if latencies is not None else []
    clock = time.perf_counter
    n, episodes = 0, 1
    t0 = clock()
    deadline = t0 + seconds
    while True:
        for _ in range(check_every):
            t = clock()
            r = env.step(acts[n % NUM_ACTIONS])
            lat.append(clock() - t)
            n += 1
            if r.terminated or r.truncated:
                env.reset(seed + episodes)
                episodes += 1
        if clock() >= deadline:
            return n / (clock() - t0)


def group_rate(envs: list[Env], k: int, seconds: float, seed: int = 0) -> float:
    """Env steps per second through ``EnvGroup.step_chunk`` on all envs, chunks of ``k``."""
    s = envs[0].spec
    g = EnvGroup(envs, list(range(len(envs))), seed=seed)
    g.reset()
    m = len(envs)
    gen = torch.Generator().manual_seed(seed)
    chunks = [
        ActionChunk(
            actions=torch.rand(m, k, s.action_dim, generator=gen) * (s.action_high - s.action_low)
            + s.action_low,
            logprob=torch.zeros(m),
            value=torch.zeros(m),
            env_ids=g.env_ids.clone(),
            policy_version=torch.zeros(m, dtype=torch.int64),
        )
        for _ in range(16)
    ]
    n, i = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += int(g.step_chunk(chunks[i % len(chunks)]).n_steps.sum())
        i += 1
    return n / (time.perf_counter() - t0)


@dataclass(frozen=True)
class Row:
    """How to measure one simulator: its maker, seconds, deadline checks, warm-up steps."""

    make: Callable[[], Env]
    seconds: float | None = None  # None: --seconds
    check_every: int = 64
    warmup: int = 0


def libero_rows(suites: list[str], camera_size: int, seconds: float) -> dict[str, Row]:
    """LIBERO's rows: task 0 of each suite, state only, then with the two cameras."""
    from ebrl.envs.libero import LiberoEnv

    rows: dict[str, Row] = {}
    for suite in suites:
        rows[f"LIBERO {suite}"] = Row(
            lambda suite=suite: LiberoEnv(task=suite, task_id=0), seconds, 8, warmup=8
        )
    for suite in suites if camera_size else []:
        rows[f"LIBERO {suite} 2x{camera_size}px"] = Row(
            lambda suite=suite: LiberoEnv(
                task=suite, task_id=0, obs_mode="state_rgb", camera_size=camera_size
            ),
            seconds,
            1,
            warmup=3,
        )
    return rows


def simulators(with_maniskill: bool) -> dict[str, Callable[[], Env]]:
    sims: dict[str, Callable[[], Env]] = {
        "CountingEnv": lambda: CountingEnv(1),
        "Synthetic burn 1.2ms": lambda: SyntheticCostEnv(step_cost_ms=1.2, cost_mode="burn"),
        "Synthetic sleep 1.2ms": lambda: SyntheticCostEnv(step_cost_ms=1.2, cost_mode="sleep"),
    }
    if with_maniskill:
        from ebrl.envs.maniskill import ManiSkillEnv

        sims["ManiSkill PushCube-v1"] = lambda: ManiSkillEnv(task="PushCube-v1")
        sims["ManiSkill PickCube-v1"] = lambda: ManiSkillEnv(task="PickCube-v1")
    return sims


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.5, help="measuring time per row")
    p.add_argument("--no-maniskill", action="store_true", help="skip the ManiSkill rows")
    p.add_argument("--no-libero", action="store_true", help="skip the LIBERO rows")
    p.add_argument(
        "--libero-suites",
        default="libero_spatial,libero_object,libero_goal,libero_10,libero_90",
        help="LIBERO suites to measure (task 0 of each)",
    )
    p.add_argument(
        "--libero-cameras",
        type=int,
        default=128,
        help="camera size of the LIBERO rows with cameras (0: no camera rows)",
    )
    p.add_argument(
        "--libero-seconds", type=float, default=10.0, help="measuring time per LIBERO row"
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (ManiSkill uses torch; 1 = one core per process)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.torch_threads)
    sims = simulators(not args.no_maniskill)
    rows = {name: Row(make) for name, make in sims.items()}
    libero = None
    if not args.no_libero:
        from ebrl.envs.libero import local_problem

        if (problem := local_problem()) is None:
            suites = [x for x in args.libero_suites.split(",") if x]
            libero = libero_rows(suites, args.libero_cameras, args.libero_seconds)
            rows.update(libero)
        else:
            print(f"LIBERO rows skipped: {problem}\n")
    print(f"torch threads: {torch.get_num_threads()}, {args.seconds:.1f} s per row\n")

    w = max(24, *(len(n) + 2 for n in rows))
    print(f"{'simulator':<{w}}{'steps/s':>10}{'us/step':>10}{'P50 ms':>10}{'P99 ms':>10}")
    for name, row in rows.items():
        env = row.make()
        lat: list[float] = []
        rate = raw_rate(
            env,
            row.seconds or args.seconds,
            latencies=lat,
            check_every=row.check_every,
            warmup=row.warmup,
        )
        env.close()
        p50, p99 = np.percentile(lat, (50, 99)) * 1e3
        print(f"{name:<{w}}{rate:>10.1f}{1e6 / rate:>10.1f}{p50:>10.3f}{p99:>10.3f}")

    print("\nEnvGroup.step_chunk vs raw env.step on the same envs (time per step; ratio > 1 is")
    print("the group's overhead)")
    print(f"{'simulator':<{w}}{'N x K':>8}{'raw/s':>10}{'group/s':>10}{'ratio':>8}")
    cases = [("CountingEnv", 8, 8), ("Synthetic burn 1.2ms", 2, 8)]
    if not args.no_maniskill:
        cases.append(("ManiSkill PushCube-v1", 2, 8))
    state_rows = [n for n in libero or {} if "px" not in n]
    if state_rows:  # the first suite's state row: chunks of 8 as OpenVLA-OFT executes
        cases.append((state_rows[0], 2, 8))
    for name, n, k in cases:
        row = rows[name]
        envs = [row.make() for _ in range(n)]
        # Raw: the same envs stepped one after another, total steps over total time.
        raw = n / sum(
            1.0 / raw_rate(e, args.seconds / n, seed=i, check_every=row.check_every)
            for i, e in enumerate(envs)
        )
        grp = group_rate(envs, k, args.seconds)
        for e in envs:
            e.close()
        print(f"{name:<{w}}{f'{n} x {k}':>8}{raw:>10.0f}{grp:>10.0f}{raw / grp:>8.3f}")


if __name__ == "__main__":
    main()
