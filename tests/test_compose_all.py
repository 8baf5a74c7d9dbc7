"""Every experiment and every sweep composes, and every value of every sweep axis validates.

A sweep's jobs are validated against the machine that will run them: this CPU machine's kind
(packages unknown, so not checked) for local launchers, the gpu group's node for Slurm. Each
value of each axis is checked in at least one job (a covering subset, not the full product).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ebrl.config import LauncherKind, target_machine, validate
from ebrl.hardware import MachineFacts
from ebrl.launch.sweep import expand, sweep_names

from .conftest import make_cfg

CONF = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
SWEEPS = sweep_names()
#: the paper's tables and figures: each has a CPU-size sweep and a full one (<name>_full)
PAPER = ["headline", "scaling", "convergence", "staleness", "ablation", "grpo"]
#: sweeps that measure one run's traces (utilisation, step latency, trajectory length): one seed
#: by design, each figure a single run's time series; every comparison sweep has 3 or more
TRACE_SWEEPS = {"motivation", "motivation_full"}
#: sweeps run within one GPU check's 8 minutes (scripts/gpu_check.sh): 2 seeds
GPU_CHECK_SWEEPS = {"gpu_regime", "gpu_regime_cpu"}
CPU_MACHINE = MachineFacts(where="a 2-core CPU machine", cpus=2)


def _machine(cfg):
    run = OmegaConf.to_object(cfg)
    if run.launcher.kind == LauncherKind.slurm:
        return target_machine(run)
    if run.gpu.device_name is not None:  # a local sweep for one GPU (the GPU check's machine)
        name = f"NVIDIA {run.gpu.device_name}"
        return MachineFacts(where=f"one {name}", gpus=(name,), cuda=True, cpus=16)
    return CPU_MACHINE


def _missing_option(override: str) -> str | None:
    """``group=option`` naming a group option that has no yaml yet (another issue's), else None."""
    key, value = override.split("=", 1)
    group = key.lstrip("+~")
    if not (CONF / group).is_dir() or "." in group:
        return None
    return None if (CONF / group / f"{value}.yaml").exists() else override


def test_lists_are_complete():
    assert {"embedded", *PAPER} <= set(EXPERIMENTS)
    for name in PAPER:
        assert name in SWEEPS and f"{name}_full" in SWEEPS


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_validates(name):
    cfg = make_cfg([f"+experiment={name}"])
    validate(cfg, machine=_machine(cfg))


def test_embedded_is_the_cpu_default_workload():
    cfg = make_cfg(["+experiment=embedded"])
    assert cfg.simulator.task == "PushCube-v1" and cfg.policy.size == "L"
    assert cfg.chunk_size == 4 and cfg.gpu.name == "cpu"
    assert cfg.algo.cfg.update_epochs == 2 and cfg.algo.cfg.num_minibatches == 2


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_composes_and_every_axis_value_validates(name):
    base, jobs = expand(name, [])
    assert base.hydra.sweeper.params, f"sweep {name} has no hydra.sweeper.params"
    assert str(base.hydra.mode) == "RunMode.MULTIRUN"
    seeds = {o for j in jobs for o in j if o.startswith("seed=")}
    least = 1 if name in TRACE_SWEEPS else 5 if name.startswith("headline") else 3
    least = 2 if name in GPU_CHECK_SWEEPS else least
    assert len(seeds) >= least, f"{name}: seeds {seeds}"
    assert len(jobs) == len({tuple(j) for j in jobs})
    # a covering subset: for each axis value, the first job that has it
    cover: dict[tuple[str, ...], None] = {}
    for value in dict.fromkeys(o for j in jobs for o in j if not o.startswith("seed=")):
        cover.setdefault(tuple(next(j for j in jobs if value in j)), None)
    missing: set[str] = set()
    for job in cover:
        absent = [m for m in map(_missing_option, job) if m]
        if absent:  # say so, below: another engineer's option not written yet
            missing.update(absent)
            continue
        cfg = make_cfg([f"+sweep={name}", *job])
        validate(cfg, machine=_machine(cfg))
    if missing:
        pytest.skip(f"sweep {name} names group options not present yet: {sorted(missing)}")


def test_full_sweeps_run_on_slurm_with_gpus_and_cpu_sweeps_here():
    for name in PAPER:
        cpu = make_cfg([f"+sweep={name}"])
        full = make_cfg([f"+sweep={name}_full"])
        assert cpu.launcher.kind == "local" and cpu.gpu.name == "cpu"
        assert full.launcher.kind == "slurm" and full.launcher.gpus_per_node >= 1
        assert full.gpu.name != "cpu" and full.policy.requires_gpu
        assert full.chunk_size == full.policy.action_chunk
