"""SFT then RL on LIBERO-Object: a scripted expert's demonstrations, behaviour cloning, the
checkpoint PPO starts from. The commands (each takes ebrl's config overrides after its options,
as ``python -m ebrl.train`` does; ``simulator=libero simulator.task=libero_object`` come first)::

    python -m ebrl.sft.libero expert --states 10 --out <dir>      # expert on the fixed states
    python -m ebrl.sft.libero collect --episodes 20 --out <dir>   # demos from sampled layouts
    python -m ebrl.sft.libero clone --out <dir> policy=mlp chunk_size=8
    python -m ebrl.sft.libero eval --states 10 --out <dir> policy=mlp chunk_size=8
    python -m ebrl.sft.libero all ...                             # the four, in turn

then ``python -m ebrl.train simulator=libero simulator.task=libero_object
simulator.init_states=sampled policy=mlp chunk_size=8 init_checkpoint=<dir>/policy.pt``.

Train and evaluate on different starts: demonstrations come from LIBERO's placement sampler
(``init_states=sampled``, seeds recorded), never from the suite's fixed initial states, which
the expert's and the cloned policy's success are measured on (``init_states=suite``: state ``i``
is reset seed ``i``, the first ``--states`` of the 50 per task). Files in ``<dir>``:
``expert.json``, ``demos.npz`` (``obs [N, O]``, ``actions [N, A]``, ``episode [N]``, ``task
[N]``) with ``demos.json`` (its provenance), ``policy.pt`` (the weights ``init_checkpoint``
loads) with ``clone.json``, ``eval.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from ebrl.sft.bc import CloneConfig, chunk_targets, clone
from ebrl.sft.checkpoint import load_init_weights, save_init_checkpoint
from ebrl.sft.expert import ExpertParams, PickPlaceExpert
from ebrl.types import Observation

log = logging.getLogger("ebrl.sft.libero")

#: the simulator these commands run, before the caller's overrides
BASE = ["simulator=libero", "simulator.task=libero_object"]
#: reset seeds of the demonstrations: task t's episode e is seed + SEED_STRIDE * t + e
SEED_STRIDE = 100_000


def compose_run(overrides: Sequence[str]) -> DictConfig:
    """ebrl's run config as ``python -m ebrl.train <BASE> <overrides>`` composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ebrl.config import register
    from ebrl.train import CONF_DIR

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*BASE, *overrides])


def tasks_of(cfg: DictConfig) -> list[int]:
    """The tasks the run trains on: all the suite's (``task_id=all``) or its one."""
    from ebrl.envs.libero import suite_info, task_index

    n = suite_info(cfg.simulator.task).n_tasks
    if str(cfg.simulator.task_id).strip() == "all":
        return list(range(n))
    return [task_index(cfg.simulator.task_id, 0, n)]


def make_env(cfg: DictConfig, task: int, init_states: str) -> Any:
    """The run's simulator as env ``task`` would get it (so with ``task_id=all`` it runs task
    ``task`` and its observation has the run's layout), starting from ``init_states``."""
    return instantiate(cfg.simulator, env_id=task, init_states=init_states)


def git_state() -> str:
    from ebrl.tracking.provenance import git_commit

    return git_commit()


# --- episodes ---------------------------------------------------------------------------------
@dataclass
class Episode:
    obs: np.ndarray  # [T, O] float32: what the policy sees before each action
    actions: np.ndarray  # [T, A] float32
    success: bool


def expert_episode(env: Any, expert: PickPlaceExpert, seed: int) -> Episode:
    """One episode of the expert from reset seed ``seed``, to success or the time limit."""
    obs = env.reset(seed)
    expert.reset()
    rows, acts = [], []
    while True:
        a = expert.act()
        rows.append(obs)
        acts.append(a.astype(np.float32))
        r = env.step(a)
        obs = r.obs
        if r.terminated or r.truncated:
            return Episode(np.stack(rows), np.stack(acts), bool(r.success))


def policy_episode(env: Any, policy: Any, seed: int) -> tuple[bool, int]:
    """One episode of ``policy`` acting with its chunk's mean, each chunk open loop (as ebrl
    trains and evaluates); returns (success, env steps)."""
    obs = env.reset(seed)
    steps = 0
    while True:
        with torch.no_grad():
            chunk = policy.act(
                Observation(obs=torch.from_numpy(obs[None]), env_ids=torch.zeros(1).long()),
                deterministic=True,
            )
        for a in chunk.actions[0].numpy():
            r = env.step(a)
            steps += 1
            obs = r.obs
            if r.terminated or r.truncated:
                return bool(r.success), steps


def _task_episodes(
    kind: str, cfg_yaml: str, task: int, seeds: list[int], checkpoint: str | None
) -> tuple[dict[str, Any], list[Episode]]:
    """Every episode of one task (a worker process's share): ``kind`` is ``expert`` (the
    expert, its successful episodes returned as demonstrations) or ``policy`` (the policy of
    ``checkpoint``); from the fixed initial states unless ``seeds`` are of sampled layouts
    (``expert`` with demonstrations: ``collect``)."""
    from omegaconf import OmegaConf

    from ebrl.stages.factory import StageFactory

    cfg = OmegaConf.create(cfg_yaml)
    init_states = str(cfg.simulator.init_states)
    t0 = time.perf_counter()
    env = make_env(cfg, task, init_states)
    built = time.perf_counter() - t0
    kept: list[Episode] = []
    results: list[tuple[bool, int]] = []
    try:
        if kind == "expert":
            expert = PickPlaceExpert(env)
            for seed in seeds:
                ep = expert_episode(env, expert, seed)
                results.append((ep.success, len(ep.actions)))
                if ep.success:
                    kept.append(ep)
        else:
            torch.set_num_threads(1)
            factory = StageFactory.from_config(cfg)
            policy = factory.with_spec(env.spec).policy()
            load_init_weights(policy, str(checkpoint))
            policy.eval()
            results = [policy_episode(env, policy, seed) for seed in seeds]
    finally:
        env.close()
    wins = sum(ok for ok, _ in results)
    summary = {
        "name": env.task_name,
        "episodes": len(results),
        "successes": wins,
        "success_rate": wins / max(1, len(results)),
        "mean_steps": float(np.mean([n for _, n in results])) if results else 0.0,
        "seconds": time.perf_counter() - t0,
        "build_seconds": built,
        "seeds": list(seeds),
        "per_seed": [ok for ok, _ in results],
    }
    return summary, kept


def _per_task(
    cfg: DictConfig,
    kind: str,
    init_states: str,
    seeds: Callable[[int], list[int]],
    workers: int,
    partial: Path,
    checkpoint: Path | None = None,
) -> tuple[dict[str, Any], list[tuple[int, Episode]]]:
    """Every task's episodes on ``workers`` processes (a task each at a time); per task the
    successes, steps and seconds, and the suite's total. ``partial`` holds the tasks done so
    far while it runs."""
    from omegaconf import OmegaConf, open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.simulator.init_states = init_states
    cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    out: dict[str, Any] = {"tasks": {}}
    kept: list[tuple[int, Episode]] = []
    ctx = multiprocessing.get_context("spawn")  # LIBERO's GL and MuJoCo state: a fresh process
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=ctx) as pool:
        jobs = {
            pool.submit(
                _task_episodes, kind, cfg_yaml, task, seeds(task), checkpoint and str(checkpoint)
            ): task
            for task in tasks_of(cfg)
        }
        for job in as_completed(jobs):
            task = jobs[job]
            summary, episodes = job.result()
            out["tasks"][str(task)] = summary
            kept += [(task, ep) for ep in episodes]
            log.info(
                "task %d (%s): %d/%d in %.0f s",
                task,
                summary["name"],
                summary["successes"],
                summary["episodes"],
                summary["seconds"],
            )
            _write_json(partial, {"partial": True, **out})
    out["tasks"] = dict(sorted(out["tasks"].items(), key=lambda kv: int(kv[0])))
    kept.sort(key=lambda te: te[0])
    total = sum(t["episodes"] for t in out["tasks"].values())
    wins = sum(t["successes"] for t in out["tasks"].values())
    out.update(episodes=total, successes=wins, success_rate=wins / max(1, total))
    return out, kept


# --- the commands -----------------------------------------------------------------------------
def cmd_expert(cfg: DictConfig, out: Path, states: int, workers: int) -> dict[str, Any]:
    """The expert's success on the suite's first ``states`` fixed initial states per task."""
    t0 = time.perf_counter()
    res, _ = _per_task(
        cfg, "expert", "suite", lambda t: list(range(states)), workers, out / "expert.json"
    )
    res.update(
        what="scripted expert on the fixed initial states (init_states=suite, state i = seed i)",
        states_per_task=states,
        expert=asdict(ExpertParams()),
        commit=git_state(),
        seconds=time.perf_counter() - t0,
    )
    _write_json(out / "expert.json", res)
    return res


def cmd_collect(
    cfg: DictConfig, out: Path, episodes: int, seed: int, workers: int
) -> dict[str, Any]:
    """``episodes`` expert episodes per task from sampled layouts; the successful ones are the
    demonstrations (``demos.npz``), their provenance ``demos.json``."""
    t0 = time.perf_counter()
    res, kept = _per_task(
        cfg,
        "expert",
        "sampled",
        lambda t: [seed + SEED_STRIDE * t + e for e in range(episodes)],
        workers,
        out / "demos.json",
    )
    if not kept:
        raise RuntimeError("collect: the expert succeeded in no episode; no demonstrations")
    obs = np.concatenate([ep.obs for _, ep in kept]).astype(np.float32)
    actions = np.concatenate([ep.actions for _, ep in kept]).astype(np.float32)
    episode = np.concatenate([np.full(len(ep.actions), i) for i, (_, ep) in enumerate(kept)])
    task = np.concatenate([np.full(len(ep.actions), t) for t, ep in kept])
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "demos.npz", obs=obs, actions=actions, episode=episode, task=task)
    res.update(
        what="scripted expert demonstrations from LIBERO's sampled layouts (init_states="
        "sampled); the successful episodes are kept, none from the fixed initial states",
        init_states="sampled",
        seed=seed,
        seed_rule=f"task t, episode e: reset seed {seed} + {SEED_STRIDE} * t + e",
        kept_episodes=len(kept),
        steps=len(actions),
        obs_dim=int(obs.shape[1]),
        action_dim=int(actions.shape[1]),
        # the settings the episodes ran under (the run's, from sampled layouts)
        simulator={**_simulator(cfg), "init_states": "sampled"},
        expert=asdict(ExpertParams()),
        commit=git_state(),
        seconds=time.perf_counter() - t0,
    )
    _write_json(out / "demos.json", res)
    return res


def cmd_clone(cfg: DictConfig, out: Path, demos: Path, bc: CloneConfig) -> dict[str, Any]:
    """Behaviour-clone the run's policy on ``demos``; ``policy.pt`` is its checkpoint."""
    from ebrl.stages.factory import StageFactory

    data = np.load(demos)
    factory = StageFactory.from_config(cfg)
    env = make_env(cfg, tasks_of(cfg)[0], "sampled")  # for the spec only
    try:
        spec = env.spec
    finally:
        env.close()
    policy = factory.with_spec(spec).policy()
    if data["obs"].shape[1] != spec.obs_dim:
        raise ValueError(
            f"clone: {demos} holds observations of {data['obs'].shape[1]} values, this run's "
            f"simulator gives {spec.obs_dim}: collect with the same simulator overrides"
        )
    chunks = chunk_targets(data["actions"], data["episode"], policy.spec.chunk_size)
    metrics = clone(policy, data["obs"], chunks, bc)
    meta = {
        "policy": dict(factory.cfg["policy"]),
        "chunk_size": policy.spec.chunk_size,
        "obs_dim": spec.obs_dim,
        "action_dim": spec.action_dim,
        "simulator": _simulator(cfg),
        "demos": str(demos),
        "commit": git_state(),
    }
    save_init_checkpoint(out / "policy.pt", policy, meta)
    res = {**meta, **metrics, "clone": asdict(bc)}
    _write_json(out / "clone.json", res)
    log.info(
        "cloned: mse %.5f (first epoch %.5f), std %.3f",
        metrics["bc/mse"],
        metrics["bc/mse_first"],
        metrics["bc/std_mean"],
    )
    return res


def cmd_eval(
    cfg: DictConfig, out: Path, checkpoint: Path, states: int, workers: int
) -> dict[str, Any]:
    """The policy of ``checkpoint`` on the first ``states`` fixed initial states per task."""
    t0 = time.perf_counter()
    res, _ = _per_task(
        cfg,
        "policy",
        "suite",
        lambda t: list(range(states)),
        workers,
        out / "eval.json",
        checkpoint=checkpoint,
    )
    res.update(
        what="cloned policy, chunk mean, on the fixed initial states (init_states=suite, "
        "state i = seed i)",
        checkpoint=str(checkpoint),
        states_per_task=states,
        commit=git_state(),
        seconds=time.perf_counter() - t0,
    )
    _write_json(out / "eval.json", res)
    return res


def _simulator(cfg: DictConfig) -> dict[str, Any]:
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(cfg.simulator, resolve=True)
    return {k: v for k, v in node.items() if k != "_target_"}  # type: ignore[union-attr]


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    log.info("wrote %s", path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ebrl.sft.libero",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=["expert", "collect", "clone", "eval", "all"])
    ap.add_argument("--out", type=Path, default=Path("outputs/sft/libero_object"))
    ap.add_argument(
        "--states", type=int, default=10, help="fixed initial states per task to measure on (of 50)"
    )
    ap.add_argument(
        "--episodes",
        type=int,
        default=20,
        help="expert episodes per task from sampled layouts (collect)",
    )
    ap.add_argument("--seed", type=int, default=1000, help="first reset seed of collect")
    ap.add_argument("--demos", type=Path, default=None, help="default: <out>/demos.npz")
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: <out>/policy.pt")
    ap.add_argument("--epochs", type=int, default=CloneConfig.epochs)
    ap.add_argument("--batch-size", type=int, default=CloneConfig.batch_size)
    ap.add_argument("--lr", type=float, default=CloneConfig.lr)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of clone")
    ap.add_argument("--workers", type=int, default=2, help="processes, a task each at a time")
    ap.add_argument("overrides", nargs="*", help="ebrl config overrides (policy=mlp ...)")
    args = ap.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = compose_run(args.overrides)
    out: Path = args.out
    demos = args.demos or out / "demos.npz"
    ckpt = args.checkpoint or out / "policy.pt"
    bc = CloneConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=int(cfg.seed),
        threads=args.threads,
    )
    timings: dict[str, float] = {}
    for step in ("expert", "collect", "clone", "eval"):
        if args.command not in (step, "all"):
            continue
        t0 = time.perf_counter()
        if step == "expert":
            cmd_expert(cfg, out, args.states, args.workers)
        elif step == "collect":
            cmd_collect(cfg, out, args.episodes, args.seed, args.workers)
        elif step == "clone":
            cmd_clone(cfg, out, demos, bc)
        else:
            cmd_eval(cfg, out, ckpt, args.states, args.workers)
        timings[step] = time.perf_counter() - t0
    if args.command == "all":
        _write_json(out / "timings.json", timings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
