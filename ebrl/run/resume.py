"""Where an attempt of a run starts: from nothing, or from the learner's checkpoint and the
driver's ``progress.json`` in the run folder (an earlier attempt stopped by a signal, a
preemption or a dead driver)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ebrl import ledger
from ebrl.config import ConfigError, RunConfig
from ebrl.stages.train import load_checkpoint

log = logging.getLogger("ebrl")


@dataclass
class Progress:
    """What the driver needs to continue a run: written after every logged update."""

    mlflow_run_id: str | None = None
    #: fingerprint of the config that made this progress (a run folder resumes only its own run)
    config_hash: str = ""
    iterations: int = 0
    env_steps: int = 0
    wall_s: float = 0.0
    time_to_80: float | None = None
    steps_to_80: int | None = None
    success_hist: list[float] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Progress | None:
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    def spent(self) -> tuple[int, float, int]:
        """(env steps, seconds, updates) so far, as :func:`ebrl.run.metrics.budget_spent`
        takes them."""
        return self.env_steps, self.wall_s, self.iterations


def config_hash(cfg: DictConfig) -> str:
    """Fingerprint of what a run computes: the resolved config without where it writes, its
    budget (a resumed run may be given more) and display settings."""
    c = OmegaConf.to_container(cfg, resolve=True)
    for k in ("run_dir", "budget", "progress", "tracking"):
        c.pop(k, None)  # type: ignore[union-attr]
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resume(run: RunConfig, run_dir: Path, fingerprint: str) -> tuple[Progress, int, int]:
    """Where this attempt starts: (progress, the learner's version, updates never logged).

    The learner's checkpoint is the truth: it holds the weights, the version (one per update)
    and the env steps trained on. ``progress.json`` (written by the driver after logging each
    update) adds what only the driver knows (the MLflow run, wall-clock, success history). The
    two differ when the driver stopped between the learner's save and its own log of an update
    (a signal, a dead driver): that update's env steps count, its metrics were never logged
    (returned as the third value, logged as ``fault/unlogged_updates``). A fresh run (no
    progress, no checkpoint, or ``checkpoint.resume=false``) starts from nothing and removes
    what an earlier run left in the folder.
    """
    ckpt_path, prog_path = run_dir / "checkpoint.pt", run_dir / "progress.json"
    prog = Progress.load(prog_path) if run.checkpoint.resume else None
    if prog is not None and prog.config_hash != fingerprint:
        raise ConfigError(
            f"run folder {run_dir} holds progress of a run with a different config; "
            "resuming it would mix two runs: choose another run_dir, delete that folder, or "
            "set checkpoint.resume=false to start over in it"
        )
    ckpt = load_checkpoint(ckpt_path) if prog is not None else None
    if prog is None or ckpt is None:
        for p in (ckpt_path, prog_path, run_dir / "metrics.jsonl"):
            p.unlink(missing_ok=True)
        shutil.rmtree(run_dir / ledger.LEDGER, ignore_errors=True)
        return Progress(config_hash=fingerprint), 0, 0
    version = int(ckpt["version"])
    unlogged = 0
    if "trained_env_steps" in ckpt:  # checkpoints from before it: the progress file counts
        unlogged = version - prog.iterations
        if unlogged < 0:
            log.warning(
                "the checkpoint (update %d) is %d update(s) behind the last logged one "
                "(checkpoint.every_iters=%d): those updates are trained again, and MLflow "
                "holds their first metrics at the env steps they were logged at",
                version,
                -unlogged,
                run.checkpoint.every_iters,
            )
            unlogged = 0
        elif unlogged > 0:
            log.warning(
                "%d update(s) were trained and checkpointed but never logged (the driver "
                "stopped first): their env steps count, their metrics are lost",
                unlogged,
            )
        prog.iterations, prog.env_steps = version, int(ckpt["trained_env_steps"])
    log.info(
        "resuming from %s at update %d (%d env steps)", run_dir, prog.iterations, prog.env_steps
    )
    return prog, version, unlogged
