"""GPU checks of the resource manager: NVML discovery and MPS SM quotas (marker ``gpu``).

Last run on a GPU 2026-12-04 (one H200, commit 76377db): passed; train at 70% vs 30% of the
SMs 2.04x, gen 2.34x (results/gpu-check/2026-12-04). Deselected by the ``gpu`` marker
elsewhere (they would skip without a GPU). Run them with ``scripts/gpu_check.sh`` (a few minutes).

What the quota test does: starts a private MPS control daemon (:class:`MPSDaemon`), plans a
gen-like and a train-like process on GPU 0 with SM quotas of 30% and 70% (then 70% and 30%)
through :func:`make_plan`, launches both with :func:`gpu_stage_env`'s environment, lets them run
together for a fixed time while NVML samples the GPU's utilisation, and compares throughputs.
The train-like workload (large bf16 matmuls, forward and backward) fills every SM it may use, so
its throughput must follow its quota; the gen-like one (small-batch forward passes) is printed,
not asserted: low SM occupancy is exactly why generation tolerates a small quota.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ebrl.resources.apply import MPSDaemon, gpu_stage_env
from ebrl.resources.assign import ShareKind, StageRequest, make_plan
from ebrl.resources.topology import discover

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
RUN_S = 8.0  # measured seconds per pair of processes
MIN_TRAIN_RATIO = 1.3  # train at 70% SMs vs at 30%: ideal 2.3x; well below that still proves it


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver: no GPU
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def _torch_has_cuda() -> bool:
    import torch

    return torch.version.cuda is not None  # a CUDA build; does not initialise CUDA here


requires_gpu = pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU (NVML)")
requires_mps = pytest.mark.skipif(
    shutil.which("nvidia-cuda-mps-control") is None, reason="needs nvidia-cuda-mps-control"
)

WORKLOAD = r"""
import json, os, sys, time
import torch

kind, seconds = sys.argv[1], float(sys.argv[2])
dev = torch.device("cuda")
if kind == "gen":
    # a policy acting on a small batch: forward passes only, modest SM occupancy
    ws = [torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) / 64 for _ in range(4)]
    x = torch.randn(256, 4096, device=dev, dtype=torch.bfloat16)
    batch = 256

    def step():
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return batch
else:
    # a learner's minibatch update: large matmuls forward and backward, every SM busy
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)])
    model = model.to(dev, torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)
    batch = 8192

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()
        return batch

for _ in range(5):
    step()
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()  # "go": both processes start measuring together
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for _ in range(5):
        n += step()
    torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(json.dumps({
    "kind": kind,
    "items_per_s": n / dt,
    "seconds": dt,
    "quota": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
}), flush=True)
"""


class UtilSampler(threading.Thread):
    """Samples NVML's GPU utilisation (%) every 0.1 s until stopped."""

    def __init__(self, index: int) -> None:
        super().__init__(daemon=True)
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.samples: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.1):
            self.samples.append(int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))

    def stop(self) -> float:
        self._stop_event.set()
        self.join()
        self.nvml.nvmlShutdown()
        return sum(self.samples) / max(1, len(self.samples))


def _readline(p: subprocess.Popen, timeout: float) -> str:
    """A line from a child's stdout, or fail after ``timeout`` seconds (CUDA init can hang)."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not out:
        raise TimeoutError(f"no output from pid {p.pid} within {timeout} s")
    return out[0]


def run_pair(mps: MPSDaemon, gen_share: float, train_share: float) -> dict[str, dict]:
    """Launch gen and train with the planned quotas, run them together, return their results."""
    topo = discover()
    plan = make_plan(
        topo,
        [
            StageRequest("gen", gpu_share=gen_share, prefer_gpu=0),
            StageRequest("train", gpu_share=train_share, prefer_gpu=0),
        ],
    )
    procs = {}
    try:
        for p in plan.placements:
            assert p.gpu is not None and p.gpu.kind == ShareKind.mps and p.gpu.gpu == 0
            env = {**os.environ, **gpu_stage_env(p.gpu, mps)}
            procs[p.stage] = subprocess.Popen(
                [sys.executable, "-c", WORKLOAD, p.role, str(RUN_S)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        for name, p in procs.items():
            line = _readline(p, 120)
            assert line.strip() == "ready", f"{name}: {line!r}"
        sampler = UtilSampler(0)
        sampler.start()
        for p in procs.values():
            p.stdin.write("go\n")
            p.stdin.flush()
        results = {name: json.loads(_readline(p, RUN_S + 60)) for name, p in procs.items()}
        util = sampler.stop()
        for p in procs.values():
            p.wait(timeout=30)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    results["nvml"] = {"gpu_util_mean": util}
    print(f"quotas gen {gen_share:.0%} / train {train_share:.0%}: {json.dumps(results)}")
    return results


@requires_gpu
def test_discover_sees_the_gpus():
    topo = discover()
    print(topo.describe())
    assert len(topo.gpus) == _gpu_count()
    for g in topo.gpus:
        assert g.sms > 0, f"SM count unknown for {g.name!r}: add it to SMS_BY_NAME"
        assert g.memory_bytes > 0 and g.uuid.startswith("GPU-")


@requires_gpu
@requires_mps
def test_mps_quotas_change_throughput():
    if not _torch_has_cuda():
        pytest.skip("this torch is a CPU build")
    gpu = discover().gpu(0)
    if gpu.mig_enabled:
        pytest.skip("GPU 0 is in MIG mode: MPS quotas do not apply to the whole GPU")
    assert gpu.mps_supported
    with MPSDaemon() as mps:
        low = run_pair(mps, gen_share=0.7, train_share=0.3)
        high = run_pair(mps, gen_share=0.3, train_share=0.7)
        daemon_pids = set(mps.pids)
    train_ratio = high["train"]["items_per_s"] / low["train"]["items_per_s"]
    gen_ratio = low["gen"]["items_per_s"] / high["gen"]["items_per_s"]
    print(f"train 70% vs 30%: {train_ratio:.2f}x; gen 70% vs 30%: {gen_ratio:.2f}x")
    assert low["train"]["quota"] == "30" and high["train"]["quota"] == "70"
    assert low["nvml"]["gpu_util_mean"] > 0 and high["nvml"]["gpu_util_mean"] > 0
    assert train_ratio > MIN_TRAIN_RATIO, (
        f"train throughput barely follows its SM quota ({train_ratio:.2f}x)"
    )
    # the daemon is gone with the block
    import psutil

    for pid in daemon_pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
