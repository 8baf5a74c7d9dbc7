# ebrl: `make run` (the main job) and `make test` set everything up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ebrl-installed
VULKAN := .cache/vulkan/lvp_icd.json
export VK_ICD_FILENAMES ?= $(abspath $(VULKAN))
export PYTHONUNBUFFERED := 1
SEEDS ?= 0,1,2

.PHONY: help setup run test test-slow test-gpu lint format bench-sim bench-learn clean

help:
	@echo "make run        set up, then one short training run on the embedded default"
	@echo "make test       set up, then the default test suite"
	@echo "make test-slow  learning and benchmark checks (minutes to an hour)"
	@echo "make bench-sim  simulator throughput per process"
	@echo "make bench-learn  PPO/GRPO learning curves on PushCube-v1 (SEEDS=$(SEEDS))"
	@echo "make lint       ruff check + format check"

setup: $(STAMP) $(VULKAN)

# The virtual environment: torch's CPU build first (constraints.txt), then the project.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "ebrl needs Python >= 3.11"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,sim]'
	@touch $@

# A CPU Vulkan driver for SAPIEN (ManiSkill3); system packages via apt, the driver project-local.
$(VULKAN):
	scripts/setup_vulkan.sh

run: setup
	$(PY) -m ebrl.train budget.env_steps=60000 tracking.experiment=make-run

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

test-gpu: setup
	$(PY) -m pytest -q -m gpu

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench-sim: setup
	$(PY) benchmarks/sim_throughput.py

bench-learn: setup
	$(PY) benchmarks/learning.py --seeds $(SEEDS)

clean:
	rm -rf outputs .pytest_cache .ruff_cache .hypothesis
