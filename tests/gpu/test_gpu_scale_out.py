"""GPU check of the scaled-out engine (marker ``gpu``): 2 learner ranks and 2 generator replicas
sharing one GPU under MPS SM quotas, ManiSkill env workers on the other cores.

Last run on a GPU 2026-12-04 (one H200, commit 76377db, the synthetic simulator): passed, 421
env steps/s over 6 updates (results/gpu-check/2026-12-04). Deselected by the ``gpu`` marker
elsewhere. Run it with ``scripts/gpu_check.sh -k scale_out``.

What it does: starts a private MPS control daemon, puts its pipe directory in the driver's
environment (the Ray backend hands it on to every actor), runs EBRL on PushCube-v1 with the
VLA-shaped transformer (``policy=transformer_m``), ``learner_ranks=2`` at ``learner_gpus=0.3``
each (an MPS quota of 30% of the SMs), ``gen_replicas=2`` at ``gen_gpus=0.2`` each, and env
workers on the cores left (14 of 16 on the H200 machine). Then it prints each role's busy
fraction and throughput and checks that every role ran: both ranks trained every segment (two
ranks on one GPU reduce through gloo: NCCL refuses them, ``ebrl.runtime.dist_group``), both replicas
acted, and the shares became MPS quotas of 20% and 30%. Where ManiSkill is not installed the
env workers run the synthetic simulator instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time

import pytest

from ebrl.resources.apply import MPSDaemon
from tests.conftest import context, make_cfg
from tests.gpu.test_gpu_mps import requires_gpu

pytestmark = pytest.mark.gpu


UPDATES = 6
#: ManiSkill where it is installed; else the synthetic simulator (its chunks cost CPU time alike)
SIM = "pushcube" if importlib.util.find_spec("mani_skill") else "synthetic"


@requires_gpu
@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="needs MPS")
def test_two_ranks_and_two_replicas_share_the_gpu_under_mps_quotas(monkeypatch):
    import torch

    from ebrl.schedulers.ebrl import EBRLScheduler

    assert torch.cuda.is_available(), "a CUDA build of torch is needed (the venv has a CPU one?)"
    cores = len(os.sched_getaffinity(0))
    sims = max(2, cores - 2)  # the learner ranks and replicas mostly wait on the GPU
    cfg = make_cfg(
        [
            f"simulator={SIM}",
            "policy=transformer_m",
            f"num_envs={4 * sims}",
            "env_groups=2",
            "chunk_size=4",
            "scheduler=ebrl",
            "tracking.enabled=false",
            f"budget.iterations={UPDATES}",
            "progress=false",
        ]
    )
    sched = EBRLScheduler(
        backend="ray",
        sim_workers=sims,
        gen_replicas=2,
        learner_ranks=2,
        gen_gpus=0.2,
        learner_gpus=0.3,
    )
    with MPSDaemon() as mps:
        for k, v in mps.env().items():
            monkeypatch.setenv(k, v)
        _, ctx = context(cfg)
        t0 = time.perf_counter()
        gen = sched.run(ctx)
        try:
            reports = [next(gen) for _ in range(UPDATES)]
        finally:
            gen.close()
        wall = time.perf_counter() - t0
    print(f"\nsimulator={SIM}")
    print(
        "\n".join(
            f"{p.ask.role:8s} {p.ask.index}: node {p.node.short}, gpu {p.ask.gpus}, "
            f"mps {p.ask.mps_percent}"
            for p in sched.gpu.placed
        )
    )
    steps = sum(r.env_steps for r in reports)
    print(f"{UPDATES} updates, {steps} env steps in {wall:.1f} s: {steps / wall:.0f} env steps/s")
    busy: dict[str, float] = {}
    for s in ctx.timeline.spans:
        busy[s.track] = busy.get(s.track, 0.0) + (s.end - s.start)
    for track in sorted(busy):
        print(f"  {track:10s} busy {busy[track] / wall:6.1%}")
    last = reports[-1].metrics
    for k in ("pipeline/weights_publish_s", "pipeline/weights_load_s_mean"):
        print(f"  {k} = {last[k] * 1000:.2f} ms")
    trained = {s.track for s in ctx.timeline.spans if s.stage == "train"}
    acted = {s.track for s in ctx.timeline.spans if s.stage == "gen"}
    assert trained == {"learner", "learner1"}
    assert acted == {"gen", "gen1"}
    assert {p.ask.mps_percent for p in sched.gpu.placed if p.ask.role != "sim"} == {20, 30}
