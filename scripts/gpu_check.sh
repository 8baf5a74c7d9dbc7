#!/usr/bin/env bash
# GPU checks in one command (a few minutes; < 8 min on one H200): NVML discovery, MPS SM quotas
# changing a train-like and a gen-like workload's throughput, and the scaled-out engine (2 NCCL
# learner ranks and 2 generator replicas sharing the GPU under MPS quotas, ManiSkill env workers
# on the other cores, throughput per role printed) (tests/gpu, marker `gpu`).
#
# Not yet run on a GPU machine: written on a CPU-only one, where these tests are skipped.
# Needs a CUDA build of torch in the venv, the NVIDIA driver and nvidia-cuda-mps-control.
# Extra arguments go to pytest (e.g. -k discover).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L
else
  echo "nvidia-smi not found: the GPU tests will skip"
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA build:", torch.version.cuda)'
# -m gpu replaces the default "not slow and not gpu" selection; -s shows the measured numbers
exec "$PY" -m pytest -q -s -rs -m gpu -p no:cacheprovider tests/gpu "$@"
