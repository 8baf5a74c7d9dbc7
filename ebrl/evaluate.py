"""Evaluation of a trained policy: whole episodes on fresh envs, acting with the chunk's mean.

The training success rate (``env/success_rate``) is measured on the episodes the stochastic
behaviour policy happened to finish during an update, under whatever staleness the scheduler
allowed; it lags and understates what the learned policy does. :func:`evaluate` answers the
question papers report: run ``episodes`` complete episodes of the final weights, deterministic by
default (the Gaussian's mean, as ManiSkill's PPO baseline evaluates), from initial states drawn
from a seed stream no training episode uses, and count the successes.

Each env executes its chunk open loop, K actions or until its episode ends, exactly as in
training. Runs in the calling process, on ``threads`` torch threads. A vectorised simulator
(RLinf's GPU envs, BEHAVIOR: one instance steps all envs together) is evaluated as it trains:
one instance of ``num_envs`` envs, every chunk for all of them, its resets on the evaluation
stream, the first ``episodes`` episodes to end counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ebrl.envs.base import reset_seed
from ebrl.stages.factory import StageFactory
from ebrl.types import Observation

#: reset-group offset that keeps evaluation's initial states apart from training's
#: (training uses reset groups ``env_id // group_size`` < num_envs)
EVAL_STREAM = 1 << 30


@dataclass(frozen=True, slots=True)
class EvalResult:
    episodes: int
    successes: int
    mean_return: float
    mean_length: float  # env steps per episode
    policy_version: int
    deterministic: bool
    seconds: float

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else float("nan")


def evaluate(
    factory: StageFactory,
    weights: tuple[int, dict[str, torch.Tensor]],
    *,
    episodes: int,
    num_envs: int = 8,
    deterministic: bool = True,
    threads: int = 1,
) -> EvalResult:
    """Run ``episodes`` episodes of the policy with ``weights = (version, state_dict)``.

    Episode ``e`` runs on env ``e % num_envs`` from reset seed
    ``reset_seed(run seed, EVAL_STREAM + e, 0)``: the same episodes for every scheduler, seed for
    seed, and none of them a training episode's start.
    """
    if episodes < 1:
        raise ValueError(f"evaluate: episodes={episodes}, need at least 1")
    t0 = time.perf_counter()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    num_envs = max(1, min(num_envs, episodes))
    if factory.cfg["simulator"].get("vectorized"):
        try:
            return _evaluate_vectorized(factory, weights, episodes, num_envs, deterministic, t0)
        finally:
            torch.set_num_threads(prev_threads)
    envs = [factory.make_env(i) for i in range(num_envs)]
    try:
        spec = envs[0].spec
        policy = factory.with_spec(spec).policy()
        policy.set_weights(*weights)
        policy.eval()
        seed = int(factory.cfg["seed"])
        k = policy.spec.chunk_size
        next_episode = 0
        obs = np.zeros((num_envs, spec.obs_dim), dtype=np.float32)
        live: dict[int, list[float]] = {}  # env index -> [return, length]

        def start(i: int) -> None:
            nonlocal next_episode
            obs[i] = envs[i].reset(reset_seed(seed, EVAL_STREAM + next_episode, 0))
            live[i] = [0.0, 0.0]
            next_episode += 1

        for i in range(num_envs):
            start(i)
        successes, returns, lengths = 0, [], []
        gen = torch.Generator().manual_seed(seed)
        while live:
            idx = sorted(live)
            ids = torch.tensor(idx, dtype=torch.int64)
            noise = torch.randn(len(idx), k, spec.action_dim, generator=gen)  # [B, K, A]
            chunk = policy.act(
                Observation(obs=torch.from_numpy(obs[idx]), env_ids=ids),
                deterministic=deterministic,
                noise=noise,
            )
            actions = chunk.actions.numpy()  # [B, K, A]
            for row, i in enumerate(idx):
                for j in range(k):
                    r = envs[i].step(actions[row, j])
                    live[i][0] += r.reward
                    live[i][1] += 1
                    obs[i] = r.obs
                    if r.terminated or r.truncated:
                        successes += int(r.success)
                        returns.append(live[i][0])
                        lengths.append(live[i][1])
                        del live[i]
                        if next_episode < episodes:
                            start(i)
                        break
        return EvalResult(
            episodes=len(returns),
            successes=successes,
            mean_return=float(np.mean(returns)),
            mean_length=float(np.mean(lengths)),
            policy_version=int(weights[0]),
            deterministic=deterministic,
            seconds=time.perf_counter() - t0,
        )
    finally:
        for env in envs:
            env.close()
        torch.set_num_threads(prev_threads)


def _evaluate_vectorized(
    factory: StageFactory,
    weights: tuple[int, dict[str, torch.Tensor]],
    episodes: int,
    num_envs: int,
    deterministic: bool,
    t0: float,
) -> EvalResult:
    """:func:`evaluate` on one vectorised instance (the module docstring)."""
    group = factory.group(list(range(num_envs)), stream=EVAL_STREAM)
    try:
        spec = group.spec
        policy = factory.with_spec(spec).policy()
        policy.set_weights(*weights)
        policy.eval()
        k = policy.spec.chunk_size
        gen = torch.Generator().manual_seed(int(factory.cfg["seed"]))
        obs, ids = group.reset(), group.env_ids
        ret, length = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)
        successes, returns, lengths = 0, [], []
        while len(returns) < episodes:
            noise = torch.randn(num_envs, k, spec.action_dim, generator=gen)  # [N, K, A]
            chunk = policy.act(
                Observation(obs=obs, env_ids=ids), deterministic=deterministic, noise=noise
            )
            out = group.step_chunk(chunk)
            for i in range(num_envs):
                n = int(out.n_steps[i])
                ret[i] += float(out.reward[i, :n].sum())
                length[i] += n
                if bool(out.terminated[i]) or bool(out.truncated[i]):
                    if len(returns) < episodes:
                        successes += int(bool(out.success[i]))
                        returns.append(ret[i])
                        lengths.append(length[i])
                    ret[i], length[i] = 0.0, 0
            obs = out.next_obs
        return EvalResult(
            episodes=len(returns),
            successes=successes,
            mean_return=float(np.mean(returns)),
            mean_length=float(np.mean(lengths)),
            policy_version=int(weights[0]),
            deterministic=deterministic,
            seconds=time.perf_counter() - t0,
        )
    finally:
        group.close()
