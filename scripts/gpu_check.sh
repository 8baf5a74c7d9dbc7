#!/usr/bin/env bash
# GPU checks in one command (a few minutes; < 8 min on one H200): NVML discovery, MPS SM quotas
# changing a train-like and a gen-like workload's throughput, and the scaled-out engine (2 NCCL
# learner ranks and 2 generator replicas sharing the GPU under MPS quotas, ManiSkill env workers
# on the other cores, throughput per role printed) (tests/gpu, marker `gpu`); then a stage
# profile for the capacity planner (ebrl-plan-profile/1, python -m ebrl.plan.measure: the
# embedded workload's policy acting and training on the GPU at MPS shares 0.25, 0.5 and 1, the
# weights moved off and onto it, PushCube stepped env by env on a core) and the planner's answer
# from it for the paper's scale points (docs/plan-profile.md); then pi0 at its real size, random
# weights, acting and updating on the GPU where RLinf and openpi are installed
# (benchmarks/vla_pi0.py --size full: never run on a GPU yet; run tiny on the CPU).
#
# Last run 2026-12-04 on one H200 (commit 76377db, the machine's torch 2.11.0+cu130, the
# synthetic simulator: ManiSkill was not installed there): 6 passed in 108 s, profile and plans
# written (results/gpu-check/2026-12-04/README.md). On a CPU-only machine the tests skip and
# the profile step is not reached (no nvidia-smi). Needs a CUDA build of torch, the NVIDIA
# driver and nvidia-cuda-mps-control. Extra arguments go to pytest (e.g. -k discover).
# PLAN_OUT sets where the profile and the plan go (default outputs/plan/gpu-<time>/);
# PLAN_PROFILE=0 skips them.
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's venv (make setup); else the python3 on PATH (a machine whose image has a CUDA
# torch), where ebrl is installed if it is not yet. The install works with no package registry:
# --no-deps (the image's packages stay), --no-build-isolation (pip would otherwise fetch the
# build backend, setuptools, into a fresh environment; the image's own is used)
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c 'import importlib.metadata as m; m.version("ebrl")' 2>/dev/null; then
  echo "installing ebrl into $PY: pip install --no-deps --no-build-isolation -e ."
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
fi
# the embedded simulator (PushCube) where ManiSkill is installed, else the synthetic one
SIM=${SIM:-$("$PY" -c 'import importlib.util as u; print("pushcube" if u.find_spec("mani_skill") else "synthetic")')}
echo "python: $PY; simulator for the profile: $SIM"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L
else
  echo "nvidia-smi not found: the GPU tests will skip"
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA build:", torch.version.cuda)'
# -m gpu replaces the default "not slow and not gpu" selection; -s shows the measured numbers
status=0
timeout "${TESTS_TIMEOUT:-330}" "$PY" -m pytest -q -s -rs -m gpu -p no:cacheprovider --durations=0 \
  tests/gpu "$@" || status=$?

if [ "${PLAN_PROFILE:-1}" = "1" ] && command -v nvidia-smi >/dev/null; then
  DIR=${PLAN_OUT:-outputs/plan/gpu-$(date -u +%Y%m%d-%H%M%S)}
  mkdir -p "$DIR"
  # ~1-2 min: one process per share (CUDA reads its MPS quota at start), 5 timed calls each
  timeout 200 "$PY" -m ebrl.plan.measure --device cuda --levels 0.25,0.5,1 \
    --batches 1,4,16,64 --out "$DIR/profile.json" +experiment=embedded "simulator=$SIM" || status=$?
  if [ -f "$DIR/profile.json" ]; then
    # the embedded workload's episodes (PushCube: 50 steps) at the scale points' env counts
    for g in g1 g4 g16; do
      timeout 60 "$PY" -m ebrl.plan --profile "$DIR/profile.json" --machine "scale/$g" \
        --set decisions_per_env=12 episode_steps=50 --json "$DIR/plan-$g.json" || status=$?
    done
    echo "profile and plans in $DIR"
  fi
fi

# The run's own MPS daemon, seen from outside while a run goes (issue 42): the headline's GPU
# scale point (generator and learner at half the GPU each) on this GPU, 20 updates; once its
# roles are up, the daemon's servers and their clients (nvidia-cuda-mps-control's
# get_server_list / get_client_list) and the quota and pipe every GPU role runs with (the run's
# gpu_env.jsonl); the daemon must be gone once the run ends. MPS_RUN=0 skips it.
if [ "${MPS_RUN:-1}" = "1" ] && command -v nvidia-smi >/dev/null \
  && command -v nvidia-cuda-mps-control >/dev/null; then
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  gpu=""
  for g in h200 h100 h20 a100 rtx4090; do  # conf/gpu/ by device name (H200 before H20)
    if echo "$name" | grep -qi "$g"; then gpu=$g; break; fi
  done
  if [ -z "$gpu" ]; then
    echo "MPS run: skipped: no conf/gpu/ option matches '$name'"
  else
    RUN=${PLAN_OUT:-outputs/plan/gpu-$(date -u +%Y%m%d-%H%M%S)}/mps-run
    mkdir -p "$RUN"
    timeout 300 "$PY" -m ebrl.train scheduler=ebrl +axis/scale=g1 "gpu=$gpu" "simulator=$SIM" \
      num_envs=16 budget.iterations=20 "run_dir=$RUN/run" \
      "tracking.store=$RUN/mlflow" >"$RUN/train.log" 2>&1 &
    train=$!
    for _ in $(seq 240); do  # the roles are up once they have written their environments
      [ -s "$RUN/run/gpu_env.jsonl" ] && break
      kill -0 "$train" 2>/dev/null || break
      sleep 1
    done
    if [ -s "$RUN/run/gpu_env.jsonl" ]; then
      sleep 10  # the roles' first CUDA calls: each client connects when it makes its context
      pipe=$("$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["CUDA_MPS_PIPE_DIRECTORY"] or "")' "$RUN/run/gpu_env.jsonl")
      echo "MPS run: the GPU roles' sharing variables:"; cat "$RUN/run/gpu_env.jsonl"
      if [ -n "$pipe" ]; then
        servers=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe nvidia-cuda-mps-control)
        echo "MPS run: servers of the daemon at $pipe: ${servers:-none}"
        for s in $servers; do
          echo "  server $s: clients $(echo "get_client_list $s" \
            | CUDA_MPS_PIPE_DIRECTORY=$pipe nvidia-cuda-mps-control | tr '\n' ' ')"
        done
      else
        echo "MPS run: the roles have no MPS pipe (time-sliced; see $RUN/train.log)"; status=1
      fi
    else
      echo "MPS run: the roles never started (see $RUN/train.log)"; status=1
    fi
    wait "$train" || status=$?
    if [ -n "${pipe:-}" ] && [ -d "$pipe" ]; then
      echo "MPS run: the daemon's pipe $pipe outlived the run"; status=1
    fi
    grep -E "MPS: |time-slice" "$RUN/train.log" || true
  fi
fi

# pi0 at its real size (3.3B, random weights: no checkpoint here) through RLinf's model code
# behind ebrl's RLinfPolicy on the GPU: acts/s, a learner step and an AdamW update at batches
# 1, 8, 32, peak memory (~1-3 min, most of it building on the CPU). Needs RLinf and
# rlinf-openpi importable by $PY (make test-openpi's venv: PY=.venv-openpi/bin/python).
if command -v nvidia-smi >/dev/null; then
  if "$PY" -c 'import rlinf, openpi' 2>/dev/null; then
    DIR=${PLAN_OUT:-outputs/plan/gpu-$(date -u +%Y%m%d-%H%M%S)}
    mkdir -p "$DIR"
    timeout "${PI0_TIMEOUT:-240}" "$PY" benchmarks/vla_pi0.py --size full --device cuda \
      --batches 1,8,32 --seconds 3 --threads 8 --json "$DIR/pi0-full.json" || status=$?
  else
    echo "pi0 at full size: skipped: $PY cannot import rlinf and openpi (make test-openpi," \
      "then PY=.venv-openpi/bin/python with a CUDA build of torch there)"
  fi
fi
exit "$status"
