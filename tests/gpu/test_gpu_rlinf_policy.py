"""GPU check of RLinf's model adapter (``ebrl.policies.rlinf_policy``, marker ``gpu``).

On the tests' CPU fakes of RLinf's model contract (tests/rlinf_fakes.py): the fakes are tiny,
so the acts/s printed measure the adapter's own cost per call on a GPU (building RLinf's env
observation from the simulator's layout, carrying the extras), not a VLA's. What they pin:
every tensor of a chunk (actions, log-prob, value, the flow chain and prompt tokens carried to
the learner) stays on the GPU, the learner scores the chunk as the rollout did in fp32 and in
bf16, gradients reach the model's parameters there, and the whole engine (EBRL's scheduler,
generator and learner on CUDA) trains the VLA-shaped fake with every behaviour weight 1.

Last run on a GPU 2026-12-04 (one H200, commit 76377db): passed (results/gpu-check/2026-12-04);
the engine test then started its own MPS daemon, which the run now starts itself: not run since.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time

import numpy as np
import pytest
import torch

from ebrl.envs.fake import CountingEnv
from ebrl.policies.base import PolicySpec
from ebrl.policies.rlinf_policy import RLinfPolicy
from ebrl.types import Observation
from tests.conftest import make_cfg
from tests.gpu.test_gpu_mps import REPO, requires_gpu, requires_mps
from tests.test_rlinf_policy import FAKE, counting_vla_envs, fake_run

pytestmark = pytest.mark.gpu


def vla_policy(model_type: str, precision: str) -> tuple[RLinfPolicy, list[CountingEnv]]:
    envs = counting_vla_envs(32)
    layout = envs[0].spec.obs_layout()
    spec = PolicySpec(obs_dim=envs[0].spec.obs_dim, action_dim=2, chunk_size=2, layout=layout)
    p = RLinfPolicy(spec, model_type=model_type, registry=FAKE, model_cfg={"precision": precision})
    return p.to("cuda"), envs


def batch_of(envs: list[CountingEnv], b: int) -> Observation:
    obs = torch.from_numpy(np.stack([env.reset(0) for env in envs[:b]]))
    return Observation(obs=obs.cuda(), env_ids=torch.arange(b, device="cuda"))


@requires_gpu
@pytest.mark.parametrize(("model_type", "precision"), [("fake_vla", "fp32"), ("fake_flow", "bf16")])
def test_the_adapter_acts_scores_and_learns_on_the_gpu(model_type, precision):
    assert torch.cuda.is_available(), "a CUDA build of torch is needed (the venv has a CPU one?)"
    p, envs = vla_policy(model_type, precision)
    batch = batch_of(envs, 8)
    chunk = p.act(batch)
    tensors = {"actions": chunk.actions, "logprob": chunk.logprob, "value": chunk.value}
    for name, t in {**tensors, **chunk.extras}.items():
        assert t.device.type == "cuda", f"{name} left the GPU"
    ev = p.evaluate(batch.obs, chunk.actions, chunk.extras)
    tol = {"atol": 1e-4, "rtol": 1e-4} if precision == "fp32" else {"atol": 0.25, "rtol": 0.02}
    torch.testing.assert_close(ev.logprob, chunk.logprob, **tol)
    torch.testing.assert_close(ev.value, chunk.value, **tol)
    (-(ev.logprob.mean()) + ev.value.pow(2).mean()).backward()
    grads = [q.grad for q in p.parameters() if q.grad is not None]  # of the parts it uses
    assert grads and all(g.device.type == "cuda" for g in grads)

    params = sum(q.numel() for q in p.parameters())
    rates = []
    for b in (1, 8, 32):
        batch = batch_of(envs, b)
        for _ in range(3):
            p.act(batch)
        torch.cuda.synchronize()
        n, t0 = 20, time.perf_counter()
        for _ in range(n):
            p.act(batch)
        torch.cuda.synchronize()
        rates.append(f"batch {b}: {n * b / (time.perf_counter() - t0):,.0f} acts/s")
    print(f"\n{model_type} ({precision}, {params} parameters) on CUDA: " + "; ".join(rates))


@requires_gpu
@requires_mps
def test_ebrl_trains_the_vla_fake_with_generator_and_learner_on_the_gpu(
    tmp_path, monkeypatch, caplog
):
    """Shares of a GPU are placed by Ray (one process per stage), each under its MPS quota of
    the MPS daemon the run starts for itself (GpuFabric.start_mps: a keeper on the node,
    ebrl.resources.mps) and stops at its end."""
    from ebrl.train import train

    vla = ["simulator.tasks=2", "simulator.camera_size=4", "scheduler.staleness=0"]
    gpus = ["scheduler.backend=ray", "scale.gen_gpus=0.5", "scale.learner_gpus=0.5"]
    cfg = make_cfg([*fake_run("ebrl", "fake_vla"), *vla, *gpus], tmp_path)
    # the Ray workers import the fake registry (tests.rlinf_fakes) from this checkout
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), path])))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with caplog.at_level(logging.INFO, logger="ebrl.resources.mps"):
        s = train(cfg)
    said = [r.getMessage() for r in caplog.records]
    assert any("MPS: daemon" in m and "started on" in m for m in said), said
    assert any("MPS: daemons" in m and "stopped" in m for m in said), said
    rows = (tmp_path / "run" / "gpu_env.jsonl").read_text().splitlines()
    pipes = {json.loads(ln)["CUDA_MPS_PIPE_DIRECTORY"] for ln in rows}
    assert len(pipes) == 1 and None not in pipes  # both roles joined the run's daemon
    assert s.status == "FINISHED" and s.iterations == 3
    for r in csv.DictReader((tmp_path / "run" / "metrics.csv").open()):
        assert float(r["train/behave_weight_mean"]) == pytest.approx(1.0, abs=1e-4)
