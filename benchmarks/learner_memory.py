"""What a learner rank holds: parameters + optimiser state per rank, DDP vs FSDP.

Two gloo learner ranks on this machine train one PPO update of a policy (the embedded default's
shapes: PushCube's 35-dim observations, 8-dim actions, chunks of 4) on a segment of the counting
env, once with ``learner_strategy=ddp`` and once with ``fsdp``; each rank then counts the bytes of
its policy's parameters and of its Adam state (a shard's local part under FSDP:
:func:`ebrl.runtime.dist_fsdp.held_bytes`). Byte counts, not process memory: the policy is built
whole on every rank before FSDP shards it, so a CPU process's peak RSS does not show the saving.
Under FSDP the leader also keeps the full weights it publishes to the generator replicas (a CPU
copy), printed on a line of its own.

This measures memory, not time: it is safe to run on a busy machine.

Usage: python benchmarks/learner_memory.py [--policy transformer_l] [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp

from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.envs import CountingEnv, EnvGroup
from ebrl.policies import MLPPolicy, Policy, PolicySpec, TransformerPolicy
from ebrl.runtime.dist_fsdp import held_bytes
from ebrl.runtime.dist_group import destroy, free_port, init_group
from ebrl.stages.train import TrainStage
from ebrl.types import Observation, Segment, Transition

SPEC = PolicySpec(obs_dim=35, action_dim=8, chunk_size=4)
POLICIES: dict[str, Callable[[], Policy]] = {
    "mlp": lambda: MLPPolicy(SPEC),
    "transformer_s": lambda: TransformerPolicy(SPEC, "S"),
    "transformer_m": lambda: TransformerPolicy(SPEC, "M"),
    "transformer_l": lambda: TransformerPolicy(SPEC, "L"),
}
MIB = 2**20


def segment(policy: Policy, n_envs: int = 8, t_len: int = 4) -> Segment:
    """A segment of ``n_envs`` counting envs acted in by ``policy`` for ``t_len`` decisions."""
    envs = [CountingEnv(i, obs_dim=SPEC.obs_dim, action_dim=SPEC.action_dim) for i in range(n_envs)]
    group = EnvGroup(envs, list(range(n_envs)), seed=0)
    obs, ids, rows = group.reset(), torch.arange(n_envs), []
    for _ in range(t_len):
        o = Observation(obs=obs, env_ids=ids)
        chunk = policy.act(o)
        rows.append(Transition.join(o, chunk, group.step_chunk(chunk)))
        obs = group.observe()
    return Segment.stack(rows)


def rank_main(rank: int, world: int, port: int, policy: str, strategy: str, out: str) -> None:
    """One learner rank: build, join the group (FSDP shards here), one update, count bytes."""
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every rank builds the same policy and draws the same minibatches
    pol = POLICIES[policy]()
    seg = segment(pol)
    dp = init_group(rank, world, ("127.0.0.1", port), "gloo", timeout_s=120, strategy=strategy)
    try:
        algo = PPO(pol, PPOConfig(update_epochs=1, num_minibatches=2))
        stage = TrainStage(algo, dp=dp, device="cpu")
        stage.train(seg)  # Adam's state exists from the first step on
        held = held_bytes(algo.policy, algo.optimizer)
        published = 0
        if dp.leader and dp.sharded:  # the full weights the leader publishes (CPU)
            published = sum(t.numel() * t.element_size() for t in stage.state().values())
        row = {**held, "published": published}
        Path(out, f"{strategy}_{rank}.json").write_text(json.dumps(row))
    finally:
        destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="transformer_l", choices=sorted(POLICIES))
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    n_params = sum(p.numel() for p in POLICIES[args.policy]().parameters())
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch"])
    with tempfile.TemporaryDirectory() as out:
        for strategy in ("ddp", "fsdp"):
            mp.start_processes(
                rank_main,
                args=(args.ranks, free_port(), args.policy, strategy, out),
                nprocs=args.ranks,
                join=True,
                start_method="forkserver",
            )
        rows = {
            (s, r): json.loads(Path(out, f"{s}_{r}.json").read_text())
            for s in ("ddp", "fsdp")
            for r in range(args.ranks)
        }
    print(
        f"{args.policy}: {n_params:,} parameters (float32), L={args.ranks} gloo ranks, "
        "after one PPO update (Adam)"
    )
    print(f"{'rank':>4} | {'ddp params':>10} {'optimizer':>10} {'total':>10} MiB | "
          f"{'fsdp params':>11} {'optimizer':>10} {'total':>10} MiB | fsdp/ddp")  # fmt: skip
    for r in range(args.ranks):
        d, f = rows["ddp", r], rows["fsdp", r]
        dt, ft = d["params"] + d["optimizer"], f["params"] + f["optimizer"]
        print(
            f"{r:>4} | {d['params'] / MIB:>10.2f} {d['optimizer'] / MIB:>10.2f} {dt / MIB:>10.2f}"
            f"     | {f['params'] / MIB:>11.2f} {f['optimizer'] / MIB:>10.2f} {ft / MIB:>10.2f}"
            f"     | {ft / dt:.3f}"
        )
    lead = rows["fsdp", 0]["published"]
    print(f"fsdp leader's published full weights (CPU copy for the replicas): {lead / MIB:.2f} MiB")


if __name__ == "__main__":
    main()
