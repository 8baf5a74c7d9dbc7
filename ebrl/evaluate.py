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

Which starts: a simulator with fixed initial states (LIBERO: the suite's 50 per task, the
standard evaluation) is evaluated on them by default (``eval.init_states=auto`` or ``fixed``),
whatever the run trained from, so a run that trained on sampled layouts
(``simulator.init_states=sampled``) reports success on states it never trained from: task ``t``
plays its fixed states ``0, 1, ...`` in order, the episodes split evenly over the tasks.
``eval.init_states=train`` evaluates on the run's own simulator settings, from the evaluation
seed stream. A simulator whose env id picks its task (LIBERO's ``task_id=all``) is evaluated on
every task, the episodes split evenly over them (:func:`episode_plan`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ebrl.config.run import EvalInitStates
from ebrl.envs.base import reset_seed
from ebrl.stages.factory import StageFactory
from ebrl.types import Observation

#: reset-group offset that keeps evaluation's initial states apart from training's
#: (training uses reset groups ``env_id // group_size`` < num_envs)
EVAL_STREAM = 1 << 30
#: eval.init_states: auto (fixed where the simulator has fixed initial states), fixed, train
INIT_STATES = tuple(m.value for m in EvalInitStates)
#: the simulator's value of ``init_states`` that selects its fixed initial states (LIBERO's)
FIXED = "suite"


@dataclass(frozen=True, slots=True)
class Cohort:
    """Episodes that run on envs of one kind: ``env_ids`` (one env per id, stepped together)
    and the reset seed of each episode, in order."""

    env_ids: tuple[int, ...]
    seeds: tuple[int, ...]
    task: int | None = None  # the task these envs run, where the env id picks one


@dataclass(frozen=True, slots=True)
class EpisodePlan:
    """What :func:`evaluate` runs: simulator overrides (``init_states``) and the cohorts."""

    simulator: dict[str, Any]
    cohorts: tuple[Cohort, ...]
    fixed: bool

    @property
    def episodes(self) -> int:
        return sum(len(c.seeds) for c in self.cohorts)


def _tasks(sim: Mapping[str, Any]) -> int | None:
    """How many tasks the envs of ``sim`` spread over by env id (LIBERO's ``task_id=all``:
    env ``i`` runs task ``i mod n``), or None where the env id picks no task."""
    if str(sim.get("task_id", "")).strip() != "all" or "task" not in sim:
        return None
    from ebrl.envs.libero import SUITES

    suite = str(getattr(sim["task"], "value", sim["task"]))
    return SUITES[suite].n_tasks if suite in SUITES else None


def _split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` counts differing by at most one, larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def episode_plan(
    cfg: Mapping[str, Any], episodes: int, num_envs: int, init_states: str = "auto"
) -> EpisodePlan:
    """The episodes :func:`evaluate` runs for the run config ``cfg`` (the module docstring).

    Raises:
        ValueError: an unknown ``init_states``; ``fixed`` for a simulator without fixed initial
            states; more episodes per task than the fixed states there are.
    """
    mode = str(getattr(init_states, "value", init_states))
    if mode not in INIT_STATES:
        raise ValueError(f"eval.init_states={mode!r}: choose one of {', '.join(INIT_STATES)}")
    sim = cfg["simulator"]
    has_fixed = "init_states" in sim  # the simulator's own key (LIBERO's: suite | sampled)
    if mode == "fixed" and not has_fixed:
        raise ValueError(
            f"eval.init_states=fixed: simulator {sim.get('_target_')} has no fixed initial "
            "states (no simulator.init_states); set eval.init_states=auto or train"
        )
    fixed = has_fixed and mode != "train"
    seed = int(cfg["seed"])
    n_tasks = _tasks(sim)
    per = _split(episodes, n_tasks) if n_tasks else [episodes]
    if fixed:
        from ebrl.envs.libero import FIXED_STATES

        if max(per) > FIXED_STATES:
            raise ValueError(
                f"eval.episodes={episodes} asks {max(per)} episodes of a task on fixed initial "
                f"states, and a task has {FIXED_STATES}: set eval.episodes <= "
                f"{FIXED_STATES * len(per)} (or eval.init_states=train)"
            )
    cohorts = []
    e = 0  # global episode index: the evaluation seed stream
    for t, n in enumerate(per):
        if n == 0:
            continue
        if fixed:  # fixed state i is reset seed i (the adapter picks state seed mod 50)
            seeds = tuple(range(n))
        else:
            seeds = tuple(reset_seed(seed, EVAL_STREAM + e + i, 0) for i in range(n))
        e += n
        m = max(1, min(num_envs, n))
        if n_tasks:  # env id t + n * j runs task t
            cohorts.append(Cohort(tuple(t + n_tasks * j for j in range(m)), seeds, t))
        else:
            cohorts.append(Cohort(tuple(range(m)), seeds))
    return EpisodePlan({"init_states": FIXED} if fixed else {}, tuple(cohorts), fixed)


@dataclass(frozen=True, slots=True)
class EvalResult:
    episodes: int
    successes: int
    mean_return: float
    mean_length: float  # env steps per episode
    policy_version: int
    deterministic: bool
    seconds: float
    #: whether the episodes started from the simulator's fixed initial states
    fixed_states: bool = False
    #: task -> (successes, episodes), where the env id picks the task (LIBERO's task_id=all)
    per_task: Mapping[int, tuple[int, int]] | None = None

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
    init_states: str = "auto",
) -> EvalResult:
    """Run ``episodes`` episodes of the policy with ``weights = (version, state_dict)``.

    The episodes are :func:`episode_plan`'s: off the fixed initial states where the simulator
    has them (``init_states`` auto or fixed), else episode ``e`` from reset seed
    ``reset_seed(run seed, EVAL_STREAM + e, 0)``; either way the same episodes for every
    scheduler, seed for seed, and none of them a training episode's start. Each cohort (a task)
    runs on up to ``num_envs`` envs stepped together.
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
    plan = episode_plan(factory.cfg, episodes, num_envs, init_states)
    if plan.simulator:
        cfg = dict(factory.cfg)
        cfg["simulator"] = {**cfg["simulator"], **plan.simulator}
        factory = replace(factory, cfg=cfg)
    try:
        policy = None
        successes, returns, lengths = 0, [], []
        per_task: dict[int, tuple[int, int]] = {}
        gen = torch.Generator().manual_seed(int(factory.cfg["seed"]))
        for cohort in plan.cohorts:
            envs = [factory.make_env(i) for i in cohort.env_ids]
            try:
                if policy is None:
                    policy = factory.with_spec(envs[0].spec).policy()
                    policy.set_weights(*weights)
                    policy.eval()
                res = _run_cohort(envs, policy, cohort.seeds, deterministic, gen)
            finally:
                for env in envs:
                    env.close()
            wins = sum(ok for ok, _, _ in res)
            successes += wins
            returns += [r for _, r, _ in res]
            lengths += [n for _, _, n in res]
            if cohort.task is not None:
                per_task[cohort.task] = (wins, len(res))
        return EvalResult(
            episodes=len(returns),
            successes=successes,
            mean_return=float(np.mean(returns)),
            mean_length=float(np.mean(lengths)),
            policy_version=int(weights[0]),
            deterministic=deterministic,
            seconds=time.perf_counter() - t0,
            fixed_states=plan.fixed,
            per_task=per_task,
        )
    finally:
        torch.set_num_threads(prev_threads)


def _run_cohort(
    envs: list[Any],
    policy: Any,
    seeds: tuple[int, ...],
    deterministic: bool,
    gen: torch.Generator,
) -> list[tuple[bool, float, int]]:
    """Play one episode per seed on ``envs`` (an env takes the next seed when its episode
    ends); (success, return, env steps) per episode, in the order they ended."""
    spec = envs[0].spec
    k = policy.spec.chunk_size
    obs = np.zeros((len(envs), spec.obs_dim), dtype=np.float32)
    live: dict[int, list[float]] = {}  # env index -> [return, length]
    queue = list(seeds)
    out: list[tuple[bool, float, int]] = []

    def start(i: int) -> None:
        obs[i] = envs[i].reset(queue.pop(0))
        live[i] = [0.0, 0.0]

    for i in range(min(len(envs), len(queue))):
        start(i)
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
                    out.append((bool(r.success), live[i][0], int(live[i][1])))
                    del live[i]
                    if queue:
                        start(i)
                    break
    return out


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
