"""Run real RLinf on an ebrl config, and read its logs back as ebrl metrics.

:class:`RLinfScheduler` is the ``_target_`` of ``conf/scheduler/rlinf_{colocated,hybrid,async}``:
it translates the run (:mod:`baselines.rlinf.translate`), writes the result as an RLinf config,
starts RLinf's own entry point as a subprocess, exactly as RLinf's ``examples/embodiment/
run_embodiment.sh`` / ``run_async.sh`` do::

    python examples/embodiment/train_embodied_agent.py --config-path DIR --config-name NAME
    python examples/embodiment/train_async.py ...          # async (decoupled_actor_critic)

with ``EMBODIED_PATH=<checkout>/examples/embodiment`` (RLinf's configs find their groups through
it), then follows RLinf's TensorBoard log (``runner.logger.log_path/tensorboard``) and yields one
:class:`IterationReport` per RLinf step with its timers renamed to ebrl's (``time/<stage>/...``,
``env/...``, ``pipeline/staleness_*``), so analysis treats both implementations alike. The run
folder gets ``rlinf/launch.json`` with ``implementation: rlinf``.

RLinf's embodied path needs a CUDA GPU (FSDP actor, HF rollout worker), the ``rlinf`` package and
an RLinf checkout (the wheel leaves out ``examples/``, which holds the entry points and configs).
Without any of them :func:`require_rlinf` refuses, naming what is missing; the schema node calls it,
so ``ebrl.config.validate`` refuses before any work starts. A dry run of a Slurm job checks the
node it will get instead (:mod:`baselines.rlinf.dryrun`: :data:`ELSEWHERE`).

RLinf's cluster is the launcher's reservation: ``conf/scheduler/rlinf_*.yaml`` take ``gpus`` and
``nodes`` from ``launcher.gpus_per_node`` and ``launcher.nodes`` (a local run with
``gpus_per_node: 0``: every GPU this machine shows). A Slurm job of several nodes (one task per
node) gets a Ray cluster over them from ``ebrl.runtime.slurm_cluster`` (the scheduler has a
``ray_address``, so ``wants_cluster`` holds): task 0 runs ebrl with ``scheduler.ray_address=auto``
and ``RAY_ADDRESS`` set, which RLinf's ``Cluster`` (``ray.init(address="auto")``) joins.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from baselines.rlinf.translate import MODES, env_steps_per_iteration, translate
from ebrl.schedulers.base import IterationReport, RunContext, StageError

INSTALL = "pip install -c constraints.txt -e '.[rlinf]'"
CHECKOUT = (
    "git clone --branch v0.3 https://github.com/RLinf/RLinf, then set scheduler.repo "
    "(or RLINF_REPO) to it"
)
#: RLinf's entry points, relative to its checkout
ENTRY = {
    "colocated": "examples/embodiment/train_embodied_agent.py",
    "hybrid": "examples/embodiment/train_embodied_agent.py",
    "async": "examples/embodiment/train_async.py",
}


#: what RLinf's launch script exports before it starts (examples/embodiment/run_embodiment.sh,
#: ``${VAR:-egl}``: kept where the caller set them): MuJoCo-based envs (LIBERO, RoboCasa) render
#: headless through EGL
RENDER_ENV = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
#: set while a config is checked for another machine (a dry run of a Slurm job): this machine's
#: GPUs, packages and checkout then say nothing about the node, and :func:`require_rlinf` passes
ELSEWHERE: ContextVar[bool] = ContextVar("rlinf_checked_elsewhere", default=False)


class RLinfUnavailable(RuntimeError):
    """Real RLinf cannot run here; the message names what is missing and how to get it."""


# --- can it run here? -------------------------------------------------------------------------
def checkout(repo: str | None) -> Path | None:
    """The RLinf checkout: ``repo``, else ``$RLINF_REPO``; None if neither is set."""
    path = repo or os.environ.get("RLINF_REPO")
    return Path(path).expanduser().resolve() if path else None


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if torch.cuda.is_available():
        return True, ""
    return False, f"torch {torch.__version__} sees no CUDA GPU"


def missing(repo: str | None) -> list[str]:
    """What real RLinf lacks on this machine (empty: it can launch)."""
    out = []
    ok, why = _cuda()
    if not ok:
        out.append(f"a CUDA GPU ({why}; RLinf's FSDP actor and HF rollout worker need one)")
    if importlib.util.find_spec("rlinf") is None:
        out.append(f"the rlinf package (install it with `{INSTALL}`)")
    path = checkout(repo)
    if path is None:
        out.append(f"an RLinf checkout for its examples/ ({CHECKOUT})")
    elif not (path / ENTRY["colocated"]).is_file():
        out.append(f"an RLinf checkout: {path} has no {ENTRY['colocated']} ({CHECKOUT})")
    return out


def require_rlinf(repo: str | None) -> None:
    """Raise :class:`RLinfUnavailable` unless real RLinf can launch here (passes while
    :data:`ELSEWHERE` is set: the config is checked for another machine)."""
    if ELSEWHERE.get():
        return
    lack = missing(repo)
    if lack:
        raise RLinfUnavailable(
            "real RLinf cannot run on this machine; it needs "
            + "; ".join(lack)
            + ". Where it cannot, the replicas on ebrl's engine reproduce its modes: "
            "scheduler=colocated, scheduler=hybrid or scheduler=async."
        )


# --- RLinf's logs -> ebrl's metrics -----------------------------------------------------------
#: ebrl stage -> RLinf timers, best first. The runners log their own timers as ``time/<name>``
#: and each worker group's as ``time/<env|rollout|actor>/<tag>`` (rlinf/runners/
#: embodied_runner.py, _log_step_metrics; async_ppo_embodied_runner.py, run); the tags come from
#: ``Worker.timer`` in rlinf/workers/{env/env_worker,rollout/hf/huggingface_worker,actor/
#: fsdp_actor_worker}.py.
STAGE_TIMERS: dict[str, tuple[str, ...]] = {
    "sim": ("time/env/env_interact_step", "time/env/interact"),
    "gen": (
        "time/rollout/predict",
        "time/rollout/generate_one_epoch",
        "time/rollout/rollout/generate",
    ),
    "train": ("time/actor/run_training", "time/actor_training"),
    "adv": ("time/cal_adv_and_returns", "time/actor/actor/compute_adv"),
    "sync": (
        "time/sync_weights",
        "time/update_rollout_weights",
        "time/actor/actor/sync_model_to_rollout",
    ),
}
#: RLinf env metric -> ebrl's; ebrl's success is "solved at any step", RLinf's success_once
ENV_METRICS = {
    "env/success_once": "env/success_rate",
    "env/return": "env/return",
    "env/episode_len": "env/episode_len",
}
#: the async actor logs rollout/data_staleness_<d>/ratio: the share of data d versions old
STALENESS_PREFIX, STALENESS_SUFFIX = "rollout/data_staleness_", "/ratio"


def _first(raw: Mapping[str, float], tags: tuple[str, ...]) -> float | None:
    return next((float(raw[t]) for t in tags if t in raw), None)


@dataclass
class MetricMapper:
    """Turns the scalars RLinf logged for one step into ebrl's metric names.

    Per step: ``time/<stage>/step_s`` and cumulative ``time/<stage>/busy_s`` for sim, gen, train
    (training plus advantages, as ebrl's train stage does both) and sync; ``time/wall_s`` and
    ``throughput/env_steps_per_s`` over RLinf's ``time/step`` timer (its startup excluded; under
    ``ebrl.train`` these two are recomputed from the driver's clock); ``env/*``;
    ``pipeline/staleness_mean|max`` (async). Every raw scalar is kept as ``rlinf/<tag>``.

    Args:
        env_steps: environment steps one RLinf step consumes.
    """

    env_steps: int
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    steps_total: int = 0
    wall_s: float = 0.0

    def __call__(self, raw: Mapping[str, float]) -> dict[str, float]:
        out = {f"rlinf/{k}": float(v) for k, v in raw.items()}
        per = {stage: _first(raw, tags) for stage, tags in STAGE_TIMERS.items()}
        if per["adv"] is not None:
            per["train"] = (per["train"] or 0.0) + per.pop("adv")
        per.pop("adv", None)
        for stage, seconds in per.items():
            if seconds is not None:
                self.busy[stage] += seconds
                out[f"time/{stage}/step_s"] = seconds
        for stage, seconds in self.busy.items():
            out[f"time/{stage}/busy_s"] = seconds
        self.steps_total += self.env_steps
        self.wall_s += float(raw.get("time/step", 0.0))
        out["env/steps_total"] = float(self.steps_total)
        out["time/wall_s"] = self.wall_s
        if self.wall_s > 0:
            out["throughput/env_steps_per_s"] = self.steps_total / self.wall_s
        for theirs, ours in ENV_METRICS.items():
            if theirs in raw:
                out[ours] = float(raw[theirs])
        stale = {
            int(k[len(STALENESS_PREFIX) : -len(STALENESS_SUFFIX)]): float(v)
            for k, v in raw.items()
            if k.startswith(STALENESS_PREFIX) and k.endswith(STALENESS_SUFFIX)
        }
        if stale:
            out["pipeline/staleness_mean"] = sum(d * r for d, r in stale.items())
            out["pipeline/staleness_max"] = float(max(d for d, r in stale.items() if r > 0))
        return out


class TensorBoardScalars:
    """Reads the scalars of an RLinf TensorBoard folder, incrementally: ``{step: {tag: value}}``.

    Needs ``tensorboard`` (a dependency of rlinf); the folder may not exist yet.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.acc = None

    def __call__(self) -> dict[int, dict[str, float]]:
        if self.acc is None:
            if not self.folder.is_dir():
                return {}
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            self.acc = EventAccumulator(str(self.folder), size_guidance={"scalars": 0})
        self.acc.Reload()
        steps: dict[int, dict[str, float]] = defaultdict(dict)
        for tag in self.acc.Tags()["scalars"]:
            for ev in self.acc.Scalars(tag):
                steps[int(ev.step)][tag] = float(ev.value)
        return dict(steps)


def follow(
    proc: subprocess.Popen,
    read: Callable[[], dict[int, dict[str, float]]],
    mapper: MetricMapper,
    poll_s: float,
    log: Path,
) -> Iterator[IterationReport]:
    """Yield a report per RLinf step as it completes; raise if RLinf fails.

    A step counts as complete once a later step appears or RLinf has exited: RLinf writes one
    step's scalars in several calls.
    """
    done = 0
    while True:
        exited = proc.poll() is not None
        steps = read()
        order = sorted(steps)
        for step in (order if exited else order[:-1])[done:]:
            yield IterationReport(done, mapper.env_steps, mapper(steps[step]))
            done += 1
        if exited:
            if proc.returncode:
                tail = "".join(log.read_text(errors="replace").splitlines(True)[-40:])
                raise StageError("rlinf", f"exit status {proc.returncode}; {log} ends:\n{tail}")
            return
        time.sleep(poll_s)


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """End RLinf's process group: SIGTERM, then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# --- the scheduler ----------------------------------------------------------------------------
def _out_dir(ctx: RunContext) -> Path:
    """``<run folder>/rlinf``: the run folder ``ebrl.train`` chose (``ctx.run_dir``); driven
    without it, the config's ``run_dir``, else a fresh folder under ``outputs/runs``."""
    base = ctx.run_dir or ctx.factory.cfg.get("run_dir")
    if not base:
        base = Path("outputs/runs") / time.strftime("%Y-%m-%d/%H-%M-%S")
    return (Path(base) / "rlinf").resolve()


def command(repo: Path, mode: str, config: Path) -> tuple[list[str], dict[str, str]]:
    """RLinf's own launch line for ``config`` (a YAML file) and its environment."""
    embodied = repo / "examples" / "embodiment"
    cmd = [
        sys.executable,
        str(repo / ENTRY[mode]),
        "--config-path",
        str(config.parent),
        "--config-name",
        config.stem,
    ]
    env = {**RENDER_ENV, **os.environ}
    env["EMBODIED_PATH"] = str(embodied)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p)
    return cmd, env


@dataclass
class RLinfScheduler:
    """Real RLinf in one of its modes, on the equivalent of an ebrl run.

    Config: ``conf/scheduler/rlinf_{colocated,hybrid,async}.yaml``.

    Args:
        mode: ``colocated``, ``hybrid`` or ``async``.
        gpus: GPUs per node (the yaml: ``launcher.gpus_per_node``); 0: every GPU this machine
            shows (a local run).
        nodes: nodes (``cluster.num_nodes``; the yaml: ``launcher.nodes``).
        staleness: async only: ``algorithm.staleness_threshold`` (1 or 2).
        repo: RLinf v0.3 checkout (None: ``$RLINF_REPO``).
        model: RLinf model config to use instead of translating the policy.
        env: RLinf env config to use instead of translating the simulator.
        overrides: dotted RLinf keys set last.
        poll_s: seconds between reads of RLinf's log.
        ray_address: local: RLinf starts (or joins) the Ray instance of its node, as its own
            scripts do; auto: the job's Ray cluster, whose address is in ``RAY_ADDRESS`` (a Slurm
            job of several nodes sets both: ``ebrl.runtime.slurm_cluster``).
    """

    implementation: ClassVar[str] = "rlinf"

    mode: str
    gpus: int = 1
    nodes: int = 1
    staleness: int = 1
    repo: str | None = None
    model: str | None = None
    env: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    poll_s: float = 5.0
    ray_address: str = "local"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"scheduler.mode={self.mode!r}: choose one of {', '.join(MODES)}")
        if self.gpus < 0 or self.nodes < 1:
            raise ValueError(
                f"scheduler.gpus={self.gpus}, scheduler.nodes={self.nodes}: need gpus >= 0 (0: "
                "every GPU of this machine) and nodes >= 1; they follow launcher.gpus_per_node "
                "and launcher.nodes"
            )
        if self.ray_address not in ("local", "auto"):
            raise ValueError(
                f"scheduler.ray_address={self.ray_address!r}: RLinf joins Ray through "
                "RAY_ADDRESS; choose local or auto (a Slurm job of several nodes sets auto)"
            )
        require_rlinf(self.repo)

    @staticmethod
    def dry_run_check(job: Any, on_slurm: bool) -> Any:
        """What ``ebrl.launch``'s dry run wraps its check of a job of this scheduler in
        (:class:`baselines.rlinf.dryrun.JobCheck`): checked for the node, then translated."""
        from baselines.rlinf.dryrun import JobCheck

        return JobCheck(job, on_slurm)

    def gpus_per_node(self) -> int:
        """``gpus``, or for 0 every GPU this machine shows (a local run, as RLinf's ``all``)."""
        if self.gpus:
            return self.gpus
        import torch

        return torch.cuda.device_count()

    def translate(self, cfg: Mapping[str, Any], log_path: str = "logs") -> dict[str, Any]:
        """RLinf's configuration of the run ``cfg`` (the resolved ebrl config) in this mode."""
        return translate(
            cfg,
            mode=self.mode,
            gpus=self.gpus_per_node(),
            nodes=self.nodes,
            staleness=self.staleness,
            model=self.model,
            env=self.env,
            overrides=self.overrides,
            log_path=log_path,
        )

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        address = os.environ.get("RAY_ADDRESS")
        if self.nodes > 1 and not (self.ray_address == "auto" and address):
            raise RLinfUnavailable(
                f"scheduler.nodes={self.nodes}, but no Ray cluster spans them (ray_address="
                f"{self.ray_address}, RAY_ADDRESS {'set' if address else 'unset'})"
                ": RLinf would wait for the other nodes until the time limit. Launch it as a Slurm "
                "job of one task per node (launcher=slurm launcher.nodes=N "
                "launcher.tasks_per_node=1), which starts that cluster"
            )
        cfg = ctx.factory.cfg
        out = _out_dir(ctx)
        rl = self.translate(cfg, log_path=str(out / "logs"))
        from omegaconf import OmegaConf

        config = out / "config" / f"ebrl_rlinf_{self.mode}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(OmegaConf.to_yaml(OmegaConf.create(rl)))  # interpolations kept
        repo = checkout(self.repo)
        assert repo is not None  # require_rlinf checked it
        cmd, env = command(repo, self.mode, config)
        record = {
            "implementation": self.implementation,
            "mode": self.mode,
            "command": cmd,
            "rlinf_repo": str(repo),
            "rlinf_config": str(config),
        }
        (out / "launch.json").write_text(json.dumps(record, indent=2))
        log = out / "rlinf.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                cmd, cwd=out, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            mapper = MetricMapper(env_steps_per_iteration(rl))
            read = TensorBoardScalars(out / "logs" / "tensorboard")
            yield from follow(proc, read, mapper, self.poll_s, log)
        finally:
            stop(proc)
