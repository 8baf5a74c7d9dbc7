"""Shared fixtures: small composed configs written to tmp_path, Hydra state reset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from ebrl.config import register
from ebrl.train import CONF_DIR

register()


def make_cfg(overrides: list[str] | None = None, tmp_path: Path | None = None):
    """Compose ``conf/config.yaml`` with overrides, outside any Hydra app."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        ov = list(overrides or [])
        if tmp_path is not None:
            ov += [f"run_dir={tmp_path / 'run'}", f"tracking.store={tmp_path / 'mlflow'}"]
        return compose(config_name="config", overrides=ov)


def context(cfg):
    """The validated run of ``cfg`` and a scheduler's run context built from it (here rather
    than in a test module so that tests/gpu, which must import without dev-only packages such
    as hypothesis, shares it)."""
    from ebrl.config import validate
    from ebrl.schedulers.base import RunContext
    from ebrl.stages.factory import StageFactory
    from ebrl.timeline import Timeline

    run = validate(cfg)
    ctx = RunContext(
        factory=StageFactory.from_config(cfg),
        decisions_per_env=run.decisions_per_env,
        env_groups=run.env_groups,
        timeline=Timeline(),
    )
    return run, ctx


TINY = [
    "simulator=counting",
    "policy.hidden=16",
    "policy.layers=1",
    "num_envs=4",
    "env_groups=2",
    "chunk_size=2",
    "rollout_steps=8",
    "budget.iterations=3",
    "budget.env_steps=100000",
    "warmup_iters=1",
    "progress=false",
    "threads.train=1",
    "algo.cfg.update_epochs=1",
    "algo.cfg.num_minibatches=1",
]


@pytest.fixture
def tiny_cfg(tmp_path):
    return lambda extra=(): make_cfg(TINY + list(extra), tmp_path)


@pytest.fixture(scope="session", autouse=True)
def _checkpoints_folder():
    """The paper's VLAs (conf/policy/pi0.yaml ...) read their checkpoints from local
    directories, ``$EBRL_CHECKPOINTS/<name>`` unless given: the full-size sweeps' jobs name
    them under /ckpt (a Slurm node's paths are not checked from here). Tests of a missing
    checkpoint unset it (tests/test_vla_configs.py)."""
    old = os.environ.get("EBRL_CHECKPOINTS")
    os.environ["EBRL_CHECKPOINTS"] = "/ckpt"
    yield
    if old is None:
        os.environ.pop("EBRL_CHECKPOINTS", None)
    else:
        os.environ["EBRL_CHECKPOINTS"] = old
