"""Measure a stage profile (``ebrl-plan-profile/1``) of a run's own stages on this machine.

::

    python -m ebrl.plan.measure --out profile.json --device cuda --levels 0.25,0.5,1 \\
        +experiment=embedded
    python -m ebrl.plan.measure --out profile.json --device cpu --levels 1,2 +experiment=embedded

Without ``--device`` it measures the GPU where torch sees one and the CPU otherwise; without
``--levels``, GPU shares 0.25, 0.5 and 1 (an MPS quota each) or 1 and 2 CPU threads.

Each device level is measured in a process of its own, as the engine runs a stage: a GPU share
is an MPS SM quota, which CUDA reads when it starts (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` under
a private MPS daemon, ``ebrl.resources.apply``; a share of 1 is the whole GPU); a CPU level is
that many torch threads. In it: the policy acting on batches of random observations (the
generator's call), one learner update (every epoch and minibatch of PPO) on segments of
random decisions of the run's size and of a smaller one, and moving the weights (the leader's
copy off the device to publish, a replica's load onto it). The simulator is stepped env by env
on one core in this process (its chunk latencies are the samples the model replays).

``scripts/gpu_check.sh`` runs it on a GPU machine: last 2026-12-04 on one H200 (commit 76377db;
the profile is results/gpu-check/2026-12-04/profile.json). ``tests/test_plan.py`` runs the CPU
path for real and the GPU orchestration on fakes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ebrl.plan.profile import Point, Profile, StageProfile, SyncCosts

#: runs a child measurement: (argv, extra environment) -> its stdout
Runner = Callable[[list[str], Mapping[str, str]], str]


def timed(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> tuple[float, float]:
    """The median wall seconds of ``repeats`` calls of ``fn`` after one untimed warm-up, and the
    cores the calls kept busy (this process's CPU seconds per wall second)."""
    fn()
    sync()
    walls = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        fn()
        sync()
        walls.append(time.perf_counter() - t)
    busy = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    return float(np.median(walls)), float(busy)


def compose(overrides: Sequence[str]) -> Any:
    """The run's config, as ``python -m ebrl.train <overrides>`` would compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ebrl.config import register
    from ebrl.plan.machine import CONF

    register()  # the typed groups' schemas (ebrl.train does this before Hydra composes)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def measure_level(
    overrides: Sequence[str],
    device: str,
    level: float,
    batches: Sequence[int],
    samples: Sequence[int],
    repeats: int = 5,
) -> dict[str, Any]:
    """One device level's calls (a child process's work): generation per batch, an update per
    segment size, the weights' publish and load. The CPU level sets the torch threads."""
    import torch

    from ebrl.algos.loss import FlatBatch, sgd_update
    from ebrl.stages.factory import StageFactory
    from ebrl.stages.profile import ppo_config, sampled_batch
    from ebrl.types import Observation

    if device == "cpu":
        torch.set_num_threads(int(level))
    cfg = compose(overrides)
    factory = StageFactory.from_config(cfg)
    env = factory.make_env(0, probe=True)
    factory = factory.with_spec(env.spec)
    close = getattr(env, "close", None)
    if close is not None:
        close()
    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    policy = factory.policy().to(dev).eval()
    obs_dim = policy.spec.obs_dim
    gen = []
    for b in batches:
        obs = Observation(obs=torch.randn(b, obs_dim, device=dev), env_ids=torch.arange(b))
        with torch.no_grad():
            secs, busy = timed(lambda obs=obs: policy.act(obs), repeats, sync)
        gen.append({"batch": int(b), "seconds": secs, "busy": busy})
    ppo = ppo_config(factory.cfg)
    one = dataclasses.replace(ppo, update_epochs=1, num_minibatches=1)
    learner = factory.policy().to(dev).train()
    opt = torch.optim.Adam(learner.parameters(), lr=ppo.lr, eps=ppo.adam_eps)
    g = torch.Generator().manual_seed(0)
    train = []
    for n in samples:
        mb = max(1, n // max(1, ppo.num_minibatches))
        data = sampled_batch(learner, mb, g, dev)

        def update(data: FlatBatch = data) -> None:  # every epoch and minibatch of one segment
            for _ in range(max(1, ppo.update_epochs * ppo.num_minibatches)):
                sgd_update(learner, opt, data, one, target_kl=None, vf_coef=ppo.vf_coef)

        secs, busy = timed(update, max(1, repeats // 2), sync)
        train.append({"samples": int(n), "seconds": secs, "busy": busy})
    state = {name: t.detach() for name, t in learner.state_dict().items()}
    nbytes = int(sum(t.numel() * t.element_size() for t in state.values()))
    held: dict[str, Any] = {}

    def publish() -> None:  # the leader's copy off the device (the board's source)
        held["cpu"] = {name: t.to("cpu", copy=True) for name, t in state.items()}

    publish_s, _ = timed(publish, repeats, sync)
    load_s, _ = timed(lambda: policy.load_state_dict(held["cpu"], strict=False), repeats, sync)
    return {
        "device": device,
        "level": level,
        "gen": gen,
        "train": train,
        "publish_s": publish_s,
        "load_s": load_s,
        "state_bytes": nbytes,
    }


def sim_samples(
    overrides: Sequence[str], envs: int, budget_s: float = 3.0
) -> tuple[list[float], float]:
    """Chunk latencies of ``envs`` envs stepped env by env on this process's core (at least
    three rounds, more while within ``budget_s``), and the cores a stepping env keeps busy."""
    from ebrl.envs.base import EnvGroup
    from ebrl.stages.factory import StageFactory

    cfg = compose(overrides)
    factory = StageFactory.from_config(cfg)
    ids = list(range(envs))
    group = EnvGroup([factory.make_env(i, probe=True) for i in ids], ids, seed=int(cfg.seed))
    try:
        group.reset()
        spec = group.spec
        rng = np.random.default_rng(0)
        chunk = int(cfg.chunk_size)
        walls: list[float] = []
        cpu, wall = 0.0, 0.0
        rounds = 0
        while rounds < 3 or sum(walls) < budget_s:
            for i in ids:
                acts = rng.uniform(spec.action_low, spec.action_high, (chunk, spec.action_dim))
                c, t = time.process_time(), time.perf_counter()
                group.step_one(i, acts.astype(np.float32))
                walls.append(time.perf_counter() - t)
                cpu += time.process_time() - c
            rounds += 1
            if rounds >= 50:
                break
        wall = sum(walls)
    finally:
        group.close()
    return walls, min(1.0, cpu / max(wall, 1e-9))


def level_env(device: str, level: float, mps_pipe: str | None) -> dict[str, str]:
    """The environment a level's process starts with: an MPS SM quota for a GPU share below 1
    (``gpu_stage_env``'s variables), nothing for a whole GPU or a CPU level."""
    if device != "cuda" or level >= 1:
        return (
            {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
            if device == "cuda"
            else {}
        )
    from ebrl.resources.apply import gpu_stage_env
    from ebrl.resources.assign import GpuShare, ShareKind

    if mps_pipe is None:
        raise RuntimeError(
            f"a GPU share of {level} needs the MPS daemon (nvidia-cuda-mps-control): measure "
            "only share 1 (--levels 1) on a GPU without MPS"
        )
    pct = max(1, min(99, round(100 * level)))
    share = GpuShare(ShareKind.mps, 0, "", level, pct, 0)
    return gpu_stage_env(share, mps_pipe)


def subprocess_runner(argv: list[str], env: Mapping[str, str]) -> str:
    """Run a child measurement in a fresh process (CUDA reads its quota at start)."""
    done = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def assemble(
    levels: Sequence[Mapping[str, Any]],
    chunk_s: Sequence[float],
    sim_busy: float,
    chunk_size: int,
    episode_steps: int | None,
    source: str,
) -> Profile:
    """The profile from each level's measurements and the simulator's samples."""
    gen, train = [], []
    for rec in levels:
        where = (
            {"share": float(rec["level"])}
            if rec["device"] == "cuda"
            else {"threads": int(rec["level"])}
        )
        gen += [
            Point(int(g["batch"]), float(g["seconds"]), busy=float(g["busy"]), **where)
            for g in rec["gen"]
        ]
        train += [
            Point(int(t["samples"]), float(t["seconds"]), busy=float(t["busy"]), **where)
            for t in rec["train"]
        ]
    top = max(levels, key=lambda r: float(r["level"]))  # the weights move at the whole device
    return Profile(
        chunk_s=tuple(float(x) for x in chunk_s),
        sim_busy=float(sim_busy),
        gen=StageProfile(tuple(gen), "batch"),
        train=StageProfile(tuple(train), "samples"),
        sync=SyncCosts(
            publish_s=float(top["publish_s"]),
            load_s=float(top["load_s"]),
            # Colocated drops the generator's weights and reloads them: a load each way
            offload_s=float(top["load_s"]),
            reload_s=float(top["load_s"]),
            state_bytes=float(top["state_bytes"]),
        ),
        chunk_size=chunk_size,
        episode_steps=episode_steps,
        param_bytes=float(top["state_bytes"]),
        allreduces=1,
        illustrative=False,
        source=source,
    )


def measure_profile(
    overrides: Sequence[str],
    device: str,
    levels: Sequence[float],
    batches: Sequence[int],
    samples: Sequence[int],
    sim_envs: int = 8,
    repeats: int = 5,
    runner: Runner = subprocess_runner,
    mps_pipe: str | None = None,
    sims: Callable[[Sequence[str], int], tuple[list[float], float]] = sim_samples,
) -> Profile:
    """Every level in a child process of its own, the simulator here; the profile."""
    records = []
    for level in levels:
        argv = [
            sys.executable,
            "-m",
            "ebrl.plan.measure",
            "--child",
            "--device",
            device,
            "--levels",
            str(level),
            "--batches",
            ",".join(map(str, batches)),
            "--samples",
            ",".join(map(str, samples)),
            "--repeats",
            str(repeats),
            *overrides,
        ]
        out = runner(argv, level_env(device, level, mps_pipe))
        line = next((x for x in reversed(out.strip().splitlines()) if x.startswith("{")), None)
        if line is None:
            raise RuntimeError(f"level {level}: no measurement in the child's output:\n{out}")
        records.append(json.loads(line))
    chunk, busy = sims(overrides, sim_envs)
    cfg = compose(overrides)
    sim = cfg.simulator
    episode = sim.get("max_episode_steps") or sim.get("episode_len")
    from ebrl.tracking.provenance import git_commit, machine

    source = (
        f"measured by python -m ebrl.plan.measure on {machine()} at commit {git_commit()}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: device {device}, levels "
        f"{', '.join(map(str, levels))}; overrides {' '.join(overrides) or '(none)'}"
    )
    return assemble(
        records, chunk, busy, int(cfg.chunk_size), int(episode) if episode else None, source
    )


#: the levels measured unless ``--levels`` is given: GPU shares, or CPU thread counts
DEFAULT_LEVELS = {"cuda": "0.25,0.5,1", "cpu": "1,2"}


def cuda_available() -> bool:
    """Whether torch can use a GPU here (the default ``--device``)."""
    import torch

    return bool(torch.cuda.is_available())


def parse_levels(device: str, text: str) -> list[float]:
    """``--levels`` as numbers; on the CPU they are torch thread counts, whole and >= 1.

    Raises:
        ValueError: naming the value and what the device takes.
    """
    try:
        levels = [float(x) for x in text.split(",")]
    except ValueError:
        levels = []
    if device == "cpu" and all(lv >= 1 and lv == int(lv) for lv in levels) and levels:
        return levels
    if device == "cuda" and all(0 < lv <= 1 for lv in levels) and levels:
        return levels
    takes = (
        "torch thread counts: whole numbers >= 1 (e.g. --levels 1,2)"
        if device == "cpu"
        else "GPU shares in (0, 1] (e.g. --levels 0.25,0.5,1)"
    )
    raise ValueError(f"--levels {text}: on --device {device} the levels are {takes}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ebrl.plan.measure", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", type=Path, help="the profile file to write")
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), help="default: cuda where torch sees a GPU, else cpu"
    )
    ap.add_argument(
        "--levels",
        help="GPU shares (default 0.25,0.5,1), or CPU thread counts (default 1,2)",
    )
    ap.add_argument("--batches", default="1,4,16,64", help="generator batch sizes")
    ap.add_argument(
        "--samples",
        default="",
        help="decisions per update (default: the run's num_envs x T, and a quarter of it)",
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sim-envs", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run to profile")
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if cuda_available() else "cpu"
    try:
        levels = parse_levels(args.device, args.levels or DEFAULT_LEVELS[args.device])
    except ValueError as e:
        ap.error(str(e))
    batches = [int(x) for x in args.batches.split(",")]
    if args.samples:
        samples = [int(x) for x in args.samples.split(",")]
    else:
        cfg = compose(args.overrides)
        full = int(cfg.num_envs) * max(1, int(cfg.rollout_steps) // int(cfg.chunk_size))
        samples = sorted({max(1, full // 4), full})
    if args.child:
        rec = measure_level(args.overrides, args.device, levels[0], batches, samples, args.repeats)
        print(json.dumps(rec), flush=True)
        return 0
    if args.out is None:
        ap.error("--out is required")
    mps = None
    if args.device == "cuda" and any(lv < 1 for lv in levels):
        from ebrl.resources.apply import MPS_CONTROL, MPSDaemon

        if shutil.which(MPS_CONTROL) is None:
            raise SystemExit(f"{MPS_CONTROL} not found: shares below 1 need MPS (--levels 1)")
        mps = MPSDaemon()
    if mps is not None:
        with mps:
            prof = measure_profile(
                args.overrides,
                args.device,
                levels,
                batches,
                samples,
                args.sim_envs,
                args.repeats,
                mps_pipe=str(mps.pipe_dir),
            )
    else:
        prof = measure_profile(
            args.overrides, args.device, levels, batches, samples, args.sim_envs, args.repeats
        )
    prof.save(args.out)
    print(f"wrote {args.out}: {prof.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
