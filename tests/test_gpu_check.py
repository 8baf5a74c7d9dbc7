"""The GPU check (scripts/gpu_check.sh, ebrl.gpucheck) on this CPU machine.

What it runs on a GPU is pinned here through its shipped configs (conf/sweep/gpu_regime.yaml,
policy=transformer_vla); the whole script runs in its dry mode (``GPU_CHECK_DRY=1``: every phase
on the cores, the policy and the budgets shrunk by conf/sweep/gpu_regime_cpu.yaml, the fake NVML
and the fake ``nvidia-cuda-mps-control`` of tests/) and must print and write what the GPU run
does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import psutil
import pytest
import torch
from hydra.utils import instantiate

from ebrl.gpucheck import CARRY_LIMIT, carry_lines, plan_args
from ebrl.launch.check import compose_config
from ebrl.launch.sweep import expand
from ebrl.policies.base import PolicySpec
from ebrl.policies.transformer import TransformerPolicy

ROOT = Path(__file__).resolve().parents[1]
SCHEDULERS = {"sync", "colocated", "hybrid", "async", "ebrl"}


def jobs(sweep: str, *overrides: str) -> list[dict[str, str]]:
    _, lists = expand(sweep, list(overrides))
    return [dict(o.split("=", 1) for o in job) for job in lists]


def test_the_regime_sweep_is_the_five_schedulers_by_two_seeds_at_the_g1_point():
    got = jobs("gpu_regime", "gpu=h200")
    assert {(j["scheduler"], j["seed"]) for j in got} == {
        (s, str(seed)) for s in SCHEDULERS for seed in (0, 1)
    }
    assert [j["seed"] for j in got] == ["0"] * 5 + ["1"] * 5  # each seed's five runs together
    assert {j["gpu"] for j in got} == {"h200"}  # the command line names this machine's GPU
    cfg = compose_config(["+sweep=gpu_regime", *(f"{k}={v}" for k, v in got[-1].items())])
    assert (cfg.scale.gen_gpus, cfg.scale.learner_gpus) == (0.5, 0.5)  # MPS quotas, g1
    assert cfg.scale.sim_workers == 8 and cfg.num_envs == 32
    assert cfg.simulator._target_.endswith("SyntheticCostEnv")  # on the cores
    assert (cfg.policy.d_model, cfg.policy.layers, cfg.policy.dtype) == (1024, 24, "bf16")


def test_the_cpu_sweep_is_the_same_runs_with_the_policy_and_budget_shrunk():
    gpu, cpu = jobs("gpu_regime"), jobs("gpu_regime_cpu")
    key = [(j["scheduler"], j["seed"]) for j in gpu]
    assert [(j["scheduler"], j["seed"]) for j in cpu] == key
    cfg = compose_config(["+sweep=gpu_regime_cpu", *(f"{k}={v}" for k, v in cpu[0].items())])
    assert cfg.gpu.name == "cpu" and cfg.scale.gen_gpus == 0 and cfg.scale.learner_gpus == 0
    assert cfg.policy.d_model == 64 and cfg.policy.dtype == "bf16"  # the same class, in bf16
    assert cfg.budget.iterations == 3


def test_the_vla_policy_has_hundreds_of_millions_of_parameters_its_trunk_in_bf16():
    cfg = compose_config(["policy=transformer_vla"])
    with torch.device("meta"):  # its size, without allocating 1.2 GB here
        policy = instantiate(cfg.policy, _partial_=True)(spec=PolicySpec(35, 8, 4))
    n = sum(p.numel() for p in policy.parameters())
    assert 250e6 < n < 400e6, n
    dtypes = {name: p.dtype for name, p in policy.named_parameters()}
    assert dtypes["encoder.layers.0.linear1.weight"] == torch.bfloat16
    assert dtypes["action_head.weight"] == torch.bfloat16
    assert dtypes["log_std"] == torch.float32
    assert all(d == torch.float32 for k, d in dtypes.items() if k.startswith("critic."))


def test_a_bf16_trunk_acts_and_scores_in_float32_and_learns():
    cfg = compose_config(["+experiment=gpu_regime_cpu"])
    torch.manual_seed(0)
    policy = instantiate(cfg.policy, _partial_=True)(spec=PolicySpec(35, 8, 4))
    obs = torch.randn(6, 35)
    noise = torch.randn(6, 4, 8)
    with torch.no_grad():
        d = policy.decode(obs, noise)
    assert d.loc.dtype == torch.float32
    actions = d.loc + d.scale * noise
    logp = policy.dist(obs, actions).log_prob(actions).sum()
    assert logp.dtype == torch.float32 and torch.isfinite(logp)
    logp.backward()
    grad = policy.encoder.layers[0].linear1.weight.grad
    assert grad is not None and grad.dtype == torch.bfloat16 and torch.isfinite(grad).all()


def test_an_unknown_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"dtype='fp16'.*fp32.*bf16"):
        TransformerPolicy(PolicySpec(35, 8, 4), "S", dtype="fp16")


def test_plan_args_plan_the_configuration_the_regime_ran(tmp_path):
    from omegaconf import OmegaConf

    cfg = compose_config(["+experiment=gpu_regime", "gpu=h100", "scheduler=ebrl"])
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    args = plan_args(tmp_path)
    assert args[:2] == ["--machine", "scale/g1"] and "gpu=h100" in args
    sets = dict(a.split("=", 1) for a in args[args.index("--set") + 1 :])
    assert sets["num_envs"] == "32" and sets["decisions_per_env"] == "12"  # 50 // 4
    assert sets["gen_gpus"] == "0.5" and sets["learner_gpus"] == "0.5"
    assert sets["sim_workers"] == "8"


def test_the_carry_check_counts_the_tree_and_each_carried_file_against_64_mib(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("outputs/\n")
    (tmp_path / "a.py").write_bytes(b"x" * 1000)
    carry = tmp_path / "outputs" / "gpu-carry"
    carry.mkdir(parents=True)
    (carry / "w.whl").write_bytes(b"y" * 3 * 2**20)
    lines, total = carry_lines(tmp_path, [carry])
    assert total == 1000 + len("outputs/\n") + 3 * 2**20  # the ignored folder counted once
    assert any("w.whl: 3.00 MiB" in ln for ln in lines) and lines[-1].endswith("fits")
    (carry / "big.whl").write_bytes(b"z" * (CARRY_LIMIT - 2 * 2**20))
    lines, _ = carry_lines(tmp_path, [carry])
    assert lines[-1].endswith("OVER the limit")


@pytest.mark.slow  # every phase, 5 runs (3 with Ray): 171 s here, 10-11 min under heavy load
@pytest.mark.timeout(1600)
def test_the_dry_run_runs_every_phase_and_prints_what_the_gpu_run_must(tmp_path):
    """The sweep narrowed to Colocated and EBRL (GPU_CHECK_ARGS) to save minutes: the full
    sweep's ten jobs are pinned above, and the script treats every job alike."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "OUT"))}
    env.update(GPU_CHECK_DRY="1", OUT=str(out), PYTHONPATH=str(ROOT), PY=sys.executable)
    env["GPU_CHECK_ARGS"] = "scheduler=colocated,ebrl"
    p = subprocess.Popen(
        [str(ROOT / "scripts" / "gpu_check.sh")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        said, _ = p.communicate(timeout=1500)
    finally:
        if p.poll() is None:  # over time: the script stops its phases (its trap), then the rest
            family = psutil.Process(p.pid).children(recursive=True)
            p.terminate()
            _, alive = psutil.wait_procs([psutil.Process(p.pid), *family], timeout=40)
            for proc in alive:
                proc.kill()
    assert p.returncode == 0, said[-4000:]
    assert sorted(f.name for f in out.iterdir()) == [
        "gpu_check.log",
        "mps_clients.txt",
        "plan.json",
        "profile.json",
        "provenance.json",
        "report.md",
        "runs.csv",
        "runs.tar.gz",
    ]
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["mode"] == "cpu-dry" and prov["seeds"] == "0,1" and prov["commit"]
    assert "nvidia-smi" in prov and "machine" in prov
    # (a) the GPU tests ran (and skipped here: no GPU)
    assert "1. GPU tests" in said and "skipped" in said
    # (b) the runs (2 schedulers x 2 seeds), EBRL / the strongest baseline with its interval
    rows = (out / "runs.csv").read_text().splitlines()[1:]
    assert len(rows) == 4 and all(",FINISHED," in r for r in rows)
    (ratio,) = [ln for ln in said.splitlines() if ln.startswith("EBRL / strongest baseline (")]
    assert "[" in ratio and "interval" in ratio and "n=2 seeds" in ratio
    # the MPS clients and each GPU role's quota, during the run on the fake GPU layer
    mps = (out / "mps_clients.txt").read_text()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in mps and "role gen:" in mps
    assert "role learner:" in mps
    # the fake daemon started and quit; asked while the run went, it named itself as its server
    (start,) = [ln.split() for ln in said.splitlines() if ln.startswith("start ")]
    assert f"quit {start[2]}" in said
    assert f"daemon at {start[2]}: servers {start[1]}" in mps
    # the placement tables: the regime's EBRL runs and the fake GPU's (gpu 0.5, mps 50)
    assert said.count("role     index  node") == 3
    # (c) the profile, the plan and the planner's error against the runs
    assert json.loads((out / "profile.json").read_text())["format"] == "ebrl-plan-profile/1"
    assert "planner's |error|: median" in said
    assert "=== not carried or not run:" in said and "=== done in" in said
    with tarfile.open(out / "runs.tar.gz") as tar:
        names = tar.getnames()
    # (c2) Algorithm 1: its split from the profile (dry: the planner's shipped GPU profile, the
    # stages on the cores, so they drift from it and it re-splits)
    assert "GPU split (Algorithm 1 on conf/plan/example_gpu_profile.json" in said
    assert "GPU re-split 1 at update" in said and '"seconds_to_effect"' in said
    assert sum(n.endswith("summary.json") for n in names) == 6  # 4 + the MPS and Algorithm 1 runs
    assert any(n.endswith("gpu_resplits.jsonl") for n in names)
    assert any(n.endswith("gpu_env.jsonl") for n in names)
