"""Simulator throughput in one process, and what EnvGroup's chunked stepping adds on top.

Usage: ``python benchmarks/sim_throughput.py [--seconds 2.5] [--no-maniskill]``

Part 1: env steps per second of a single env instance stepped with random actions (resetting at
episode ends), per simulator. Part 2: the same work through :class:`EnvGroup.step_chunk`
(N envs, chunks of K actions) against raw ``env.step`` on the same envs, as a time ratio per step;
ratio 1.0 means the group costs nothing beyond the simulator.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from ebrl.envs import CountingEnv, Env, EnvGroup, SyntheticCostEnv
from ebrl.types import ActionChunk

NUM_ACTIONS = 4096  # pre-drawn random actions, cycled, so RNG cost stays out of the timings


def raw_rate(env: Env, seconds: float, seed: int = 0) -> float:
    """Env steps per second of ``env.step`` alone, with a reset at each episode end."""
    rng = np.random.default_rng(seed)
    s = env.spec
    acts = rng.uniform(s.action_low, s.action_high, (NUM_ACTIONS, s.action_dim)).astype(np.float32)
    env.reset(seed)
    n, episodes = 0, 1
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(64):  # check the clock every 64 steps only
            r = env.step(acts[n % NUM_ACTIONS])
            n += 1
            if r.terminated or r.truncated:
                env.reset(seed + episodes)
                episodes += 1
        if time.perf_counter() >= deadline:
            return n / (time.perf_counter() - t0)


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
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (ManiSkill uses torch; 1 = one core per process)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.torch_threads)
    sims = simulators(not args.no_maniskill)
    print(f"torch threads: {torch.get_num_threads()}, {args.seconds:.1f} s per row\n")

    print(f"{'simulator':<24}{'steps/s':>10}{'us/step':>10}")
    for name, make in sims.items():
        env = make()
        rate = raw_rate(env, args.seconds)
        env.close()
        print(f"{name:<24}{rate:>10.0f}{1e6 / rate:>10.1f}")

    print("\nEnvGroup.step_chunk vs raw env.step on the same envs (time per step; ratio > 1 is")
    print("the group's overhead)")
    print(f"{'simulator':<24}{'N x K':>8}{'raw/s':>10}{'group/s':>10}{'ratio':>8}")
    cases = [("CountingEnv", 8, 8), ("Synthetic burn 1.2ms", 2, 8)]
    if not args.no_maniskill:
        cases.append(("ManiSkill PushCube-v1", 2, 8))
    for name, n, k in cases:
        envs = [sims[name]() for _ in range(n)]
        # Raw: the same envs stepped one after another, total steps over total time.
        raw = n / sum(1.0 / raw_rate(e, args.seconds / n, seed=i) for i, e in enumerate(envs))
        grp = group_rate(envs, k, args.seconds)
        for e in envs:
            e.close()
        print(f"{name:<24}{f'{n} x {k}':>8}{raw:>10.0f}{grp:>10.0f}{raw / grp:>8.3f}")


if __name__ == "__main__":
    main()
