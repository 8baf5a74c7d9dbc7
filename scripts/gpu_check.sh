#!/usr/bin/env bash
# The GPU check in one command, at most 8 minutes on one GPU (H100 or H200, 16 cores, no package
# registry): (a) the GPU tests (tests/gpu, what `make test-gpu` selects); (b) the paper's regime
# in miniature: sync, Colocated, Hybrid, Async and EBRL x 2 seeds on this GPU with MPS SM
# quotas, a VLA-sized policy (policy=transformer_vla: ~300M parameters, bf16), the synthetic
# simulator on the cores (`python -m ebrl.launch gpu_regime`, conf/sweep/gpu_regime.yaml), with
# EBRL / strongest baseline and its interval, the MPS daemon's clients and each GPU role's quota
# while the runs go, and the placement table; (c) a measured stage profile of the same workload
# (python -m ebrl.plan.measure) and the planner's error against those runs; (c2) EBRL with its SM
# quotas unpinned: Algorithm 1's split from that profile, and its re-splits where the stages drift.
#
#   scripts/gpu_check.sh                 on a GPU machine (make gpu-check)
#   GPU_CHECK_DRY=1 scripts/gpu_check.sh on a CPU: every phase, the policy and budgets shrunk
#                                        (conf/sweep/gpu_regime_cpu.yaml), a fake NVML and a fake
#                                        nvidia-cuda-mps-control (tests/) for the MPS phase
#
# Everything goes under $OUT (default outputs/gpu-check/<time>; at most 8 files, as a device
# call brings back): gpu_check.log (all it printed), provenance.json (commit, machine, command,
# seeds, nvidia-smi), report.md and runs.csv (the regime and the planner's error), profile.json,
# plan.json, mps_clients.txt, runs.tar.gz (each run's summary, config, placement, GPU env, log).
# Wheels the machine lacks travel in outputs/gpu-carry/ (`python -m ebrl.gpucheck carry
# --prepare` makes them and checks the 64 MiB limit); they are installed into a private folder.
# Each phase runs under `timeout`; GPU_CHECK_BUDGET_S (default 460; dry 1800) bounds them all.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
DRY=${GPU_CHECK_DRY:-0}
BUDGET=${GPU_CHECK_BUDGET_S:-$([ "$DRY" = "1" ] && echo 1800 || echo 460)}
OUT=${OUT:-outputs/gpu-check/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}
mkdir -p "$WORK"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
status=0
missing=()  # what could not be carried or run
# stopped (SIGTERM, SIGINT): stop each phase's process group (`timeout` leads one), then kill
# what is left of it after 20 s, so that no run, Ray instance or MPS daemon outlives the check
stop() {
  local groups
  groups=$(jobs -p)
  for g in $groups; do kill -TERM -- "-$g" 2>/dev/null || kill -TERM "$g" 2>/dev/null; done
  sleep 20
  for g in $groups; do kill -KILL -- "-$g" 2>/dev/null; done
  exit 143
}
trap stop TERM INT

# seconds for a phase: its own budget, or what is left of the whole one (minus 10 s to pack)
budget() {
  local left=$((BUDGET - (SECONDS - START) - 10))
  if [ "$left" -lt "$1" ]; then echo $((left > 5 ? left : 5)); else echo "$1"; fi
}
phase() { echo; echo "=== $1 (budget $2 s; $((SECONDS - START)) s elapsed)"; }

# --- 0. python, carried wheels, ebrl ------------------------------------------------------------
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
CARRY=outputs/gpu-carry
carried=()
if compgen -G "$CARRY/*.whl" >/dev/null && ! "$PY" -c 'import hydra, omegaconf, ray' 2>/dev/null; then
  # no registry there: the wheels are installed as they are (--no-deps: the image's packages
  # stay), into a folder of their own
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$WORK/site" "$CARRY"/*.whl || { echo "carried wheels: install failed"; status=1; }
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  for w in "$CARRY"/*.whl; do carried+=("$(basename "$w")"); done
fi
# ebrl itself, where it is not installed: its entry points register the baselines' schedulers.
# --no-build-isolation: pip would otherwise fetch setuptools from a registry
if ! "$PY" -c 'import importlib.metadata as m; m.version("ebrl")' 2>/dev/null; then
  echo "installing ebrl into $PY: pip install --no-deps --no-build-isolation -e ."
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || status=1
fi
# one interpreter start for every check (each costs seconds)
for mod in $("$PY" -c 'import importlib.util as u
print(*[m for m in ("hydra", "omegaconf", "ray", "pandas", "scipy", "mlflow") if not u.find_spec(m)])'); do
  missing+=("python package $mod (not here; carry its wheel in $CARRY)")
done
# the runs' record is their summary.json (the report reads it): MLflow off, also where it is
# installed (the GPU machine has none; the check's figures come from the same files either way)
TRACK=(tracking.enabled=false)

if [ "$DRY" = "1" ]; then
  MODE=cpu-dry SWEEP=gpu_regime_cpu EXPERIMENT=gpu_regime_cpu GPU=cpu DEVICE=cpu LEVELS=1,2
  BATCHES=2,4 T_TESTS=60 T_REGIME=900 T_MPS=300 T_PROFILE=300 T_SPLIT=300
  # the fake GPU layer: one H100 seen by NVML, a fake MPS control daemon on PATH (tests/)
  mkdir -p "$WORK/fake/nvml" "$WORK/fake/bin"
  "$PY" - "$WORK/fake" <<'EOF'
import sys
from pathlib import Path
from tests.fake_mps import write_control
from tests.test_gpu_fake import FAKE_NVML
fake = Path(sys.argv[1])
(fake / "nvml" / "pynvml.py").write_text(FAKE_NVML)
write_control(fake / "bin")
EOF
  FAKE_ENV=(PATH="$WORK/fake/bin:$PATH" PYTHONPATH="$WORK/fake/nvml:$PWD:${PYTHONPATH:-}"
    FAKE_NVML_GPUS="NVIDIA H100 80GB HBM3" FAKE_MPS_LOG="$WORK/fake/mps.log")
else
  # ~20 s of set-up, then 110 + 250 + 55 + 15 + 10 = 440 s: 460 s, under 8 min with the call's
  # own start. The regime's runs take ~20 s (sync, Colocated) to ~35 s (Ray) each on 16 cores.
  # The Algorithm 1 run (3c) takes what the others leave, at most 60 s (under 30 s: skipped, said)
  MODE=gpu SWEEP=gpu_regime EXPERIMENT=gpu_regime DEVICE=cuda LEVELS=0.5,1 BATCHES=8,16
  T_TESTS=${TESTS_TIMEOUT:-110} T_REGIME=250 T_MPS=0 T_PROFILE=55 T_SPLIT=60
  FAKE_ENV=()
  GPU=""
  if command -v nvidia-smi >/dev/null; then
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    for g in h200 h100 h20 a100 rtx4090; do  # conf/gpu/ by device name (H200 before H20)
      if echo "$name" | grep -qi "$g"; then GPU=$g; break; fi
    done
    [ -n "$GPU" ] || missing+=("the regime and the profile: no conf/gpu option matches '$name'")
  else
    missing+=("nvidia-smi: no NVIDIA GPU here (GPU_CHECK_DRY=1 runs every phase on the CPU)")
  fi
  command -v nvidia-cuda-mps-control >/dev/null \
    || missing+=("nvidia-cuda-mps-control: the GPU roles time-slice the GPU")
fi
SEEDS=0,1
"$PY" -m ebrl.gpucheck provenance --out "$OUT/provenance.json" --mode "$MODE" \
  --command "GPU_CHECK_DRY=$DRY scripts/gpu_check.sh $*" --seeds "$SEEDS" \
  --carried "${carried[@]}" || status=1

# --- 1. the GPU tests ----------------------------------------------------------------------------
t=$(budget "$T_TESTS"); phase "1. GPU tests: pytest -m gpu tests/gpu" "$t"
# -m gpu replaces the default "not slow and not gpu" selection; -s shows the measured numbers
timeout -k 10 "$t" "$PY" -m pytest -q -s -rs -m gpu -p no:cacheprovider --durations=0 \
  tests/gpu "$@" | tee "$WORK/tests.log" || { echo "GPU tests: failed or over $t s"; status=1; }

# --- 2. the regime in miniature --------------------------------------------------------------------
REGIME=$WORK/regime
# the MPS daemon's clients and each GPU role's quota, listed while each run goes
watch_mps() {  # $1: the runs folder, $2: the pid to outlive; sets $watcher
  env "${FAKE_ENV[@]}" "$PY" -m ebrl.gpucheck watch-mps "$1" --out "$WORK/mps_clients.txt" --while-pid "$2" &
  watcher=$!
}
if [ -n "$GPU" ]; then
  t=$(budget "$T_REGIME"); phase "2. the regime: python -m ebrl.launch $SWEEP" "$t"
  # GPU_CHECK_ARGS: overrides of the sweep (e.g. scheduler=colocated,ebrl: fewer runs)
  read -r -a extra <<<"${GPU_CHECK_ARGS:-}"
  over=(gpu="$GPU" "${TRACK[@]}" "${extra[@]}")
  timeout -k 20 "$t" "$PY" -m ebrl.launch "$SWEEP" --out "$REGIME" "${over[@]}" \
    >"$WORK/regime.log" 2>&1 &
  run=$!
  watch_mps "$REGIME" "$run"
  wait "$run" || { echo "the regime: failed or over $t s (the report uses the runs that finished)"; status=1; }
  wait "$watcher"
  grep -E "^sweep |FINISHED|took|Error|error:" "$WORK/regime.log" | tail -20
fi
if [ "$DRY" = "1" ]; then
  # the dry run's regime computes on the cores with no GPU share; the MPS path runs here: EBRL
  # at the g1 point's GPU shares on the fake GPU layer (scheduler.device=cpu: torch here has
  # no GPU), the fake daemon's servers and clients listed while it goes: 20 updates, not the
  # sweep's 3, so that the run outlives the listing (3 tiny updates ended before it on a quiet
  # machine: "servers none", the daemon already gone)
  t=$(budget "$T_MPS"); phase "2b. MPS on the fake GPU layer: EBRL at gpu=h100, half the GPU per role" "$t"
  env "${FAKE_ENV[@]}" timeout -k 20 "$t" "$PY" -m ebrl.launch "$SWEEP" --out "$WORK/mps" \
    gpu=h100 launcher.gpus_per_node=1 scale.gen_gpus=0.5 scale.learner_gpus=0.5 scheduler=ebrl seed=0 \
    scheduler.device=cpu budget.iterations=20 "${TRACK[@]}" >"$WORK/mps.log" 2>&1 &
  run=$!
  watch_mps "$WORK/mps" "$run"
  wait "$run" || { echo "the MPS run: failed or over $t s (see runs.tar.gz: mps.log)"; status=1; }
  wait "$watcher"
  echo "fake daemon's starts and quits:"; cat "$WORK/fake/mps.log" 2>/dev/null || echo "  none"
fi
if [ ! -s "$WORK/mps_clients.txt" ]; then
  echo "MPS clients: no run's GPU roles were listed"
  if [ "$DRY" = "1" ] || command -v nvidia-cuda-mps-control >/dev/null; then status=1; fi
fi

echo; echo "placement (EBRL's run; ebrl.runtime.placement.describe):"
for p in $(ls -d "$REGIME"/*/ "$WORK"/mps/*/ 2>/dev/null); do
  if [ -f "$p/placement.txt" ] && grep -q "EBRLScheduler" "$p/config.yaml" 2>/dev/null; then
    echo "-- $(basename "$(dirname "$p")")/$(basename "$p")"; cat "$p/placement.txt"
  fi
done

# --- 3. the stage profile and the planner's error -------------------------------------------------
if [ -n "$GPU" ]; then
  t=$(budget "$T_PROFILE"); phase "3. stage profile: python -m ebrl.plan.measure --device $DEVICE" "$t"
  # one process per level (CUDA reads its MPS quota when it starts); the regime's workload
  timeout -k 10 "$t" "$PY" -m ebrl.plan.measure --device "$DEVICE" --levels "$LEVELS" \
    --batches "$BATCHES" --repeats 3 --out "$OUT/profile.json" "+experiment=$EXPERIMENT" \
    "gpu=$GPU" || { echo "the profile: failed or over $t s"; status=1; }
  ebrl_run=$(grep -l "EBRLScheduler" "$REGIME"/*/config.yaml 2>/dev/null | head -1)
  if [ -f "$OUT/profile.json" ] && [ -n "$ebrl_run" ]; then
    t=$(budget 15); phase "3b. the planner on the regime's configuration" "$t"
    read -r -a pargs <<<"$("$PY" -m ebrl.gpucheck plan-args "$(dirname "$ebrl_run")")"
    echo "python -m ebrl.plan --profile profile.json ${pargs[*]}"
    timeout -k 5 "$t" "$PY" -m ebrl.plan --profile "$OUT/profile.json" "${pargs[@]}" \
      --json "$OUT/plan.json" || status=1
  else
    missing+=("the planner's error: no profile or no EBRL run to plan")
  fi
fi

# --- 3c. Algorithm 1 on the GPU: the split chosen from the measured profile, re-split on drift ------
# EBRL with its SM quotas unpinned and resources.gpu_profile the profile just measured: Algorithm
# 1 chooses the starting split (MLflow param gpu/split=algorithm1, the run's log) and re-splits
# it where the stages drift (the log's "GPU re-split" lines, gpu_resplits.jsonl); the run says
# which happened
# (dry: the fake GPU layer, the planner's shipped GPU profile, the stages on the cores)
if [ "$DRY" = "1" ]; then
  SPLIT=(gpu=h100 launcher.gpus_per_node=1 scale.gen_gpus=0.5 scale.learner_gpus=0.5 scheduler.device=cpu
    resources.gpu_profile=conf/plan/example_gpu_profile.json budget.iterations=6)
else
  SPLIT=("gpu=$GPU" "resources.gpu_profile=$OUT/profile.json" budget.iterations=12)
fi
if [ -n "$GPU" ] && [ -f "$OUT/profile.json" ]; then
  t=$(budget "$T_SPLIT"); phase "3c. Algorithm 1 from the measured profile: EBRL, SM quotas unpinned" "$t"
  if [ "$t" -ge 30 ]; then
    env "${FAKE_ENV[@]}" timeout -k 10 "$t" "$PY" -m ebrl.train "+experiment=$EXPERIMENT" \
      scheduler=ebrl seed=0 resources.gen_sm_pct=null resources.train_sm_pct=null \
      "${SPLIT[@]}" "${TRACK[@]}" \
      "hydra.run.dir=$WORK/resplit" >"$WORK/resplit.log" 2>&1 \
      || { echo "the Algorithm 1 run: failed or over $t s (runs.tar.gz: resplit.log)"; status=1; }
    grep -hE "Algorithm 1|GPU re-split|SM split|quota" "$WORK/resplit.log" | tail -8
    if [ -s "$WORK/resplit/gpu_resplits.jsonl" ]; then
      echo "re-splits (gpu_resplits.jsonl):"; cat "$WORK/resplit/gpu_resplits.jsonl"
    else
      echo "no re-split in this run: the stages kept within the drift threshold of the profile"
    fi
  else
    missing+=("the Algorithm 1 run: $t s left of the budget")
  fi
fi

# --- 4. the report ----------------------------------------------------------------------------------
phase "4. report: EBRL / strongest baseline, the planner's error" "$(budget 10)"
if [ -d "$REGIME" ]; then
  timeout -k 5 "$(budget 10)" "$PY" -m ebrl.gpucheck report "$REGIME" --plan "$OUT/plan.json" \
    --out "$OUT/report.md" || status=1
fi
[ -f "$WORK/mps_clients.txt" ] && cp "$WORK/mps_clients.txt" "$OUT/"
# each run's small files (no checkpoints, no timelines: they would not come back)
(cd "$WORK" && find . \( -name summary.json -o -name config.yaml -o -name placement.txt \
  -o -name gpu_env.jsonl -o -name train.log -o -name shape.json -o -name resources.json \
  -o -name gpu_resplits.jsonl \) \
  -not -path "./site/*" -print0 | tar -czf "$OUT/runs.tar.gz" --null -T - \
  $(ls regime.log mps.log tests.log resplit.log 2>/dev/null)) || status=1

echo; echo "=== not carried or not run:"
if [ "${#missing[@]}" -eq 0 ]; then echo "  nothing"; fi
for m in "${missing[@]}"; do echo "  - $m"; done
echo "=== done in $((SECONDS - START)) s (budget $BUDGET s), status $status; files in $OUT:"
ls "$OUT"
[ -n "${GPU_CHECK_WORK:-}" ] || rm -rf "$WORK"
exit "$status"
