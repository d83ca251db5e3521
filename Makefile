# Thin wrappers: the logic lives in vllm_fleet (Python) and the playbooks.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin

export PATH := $(BIN):$(PATH)
export CONTAINERS_CONF := $(CURDIR)/lab/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.collections
export VLLM_FLEET_CACHE ?= /var/cache/vllm-fleet

.PHONY: help venv collections prepare lab lab-down lint unit molecule e2e e2e-all chaos attack matrix test test-all bench bench-check bench-router bench-upgrade bench-hash drift clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

venv: $(VENV)/.installed ## controller venv with the pinned tools (pyproject.toml [controller])
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade 'pip>=24'
	$(BIN)/pip install --quiet -e '.[controller]'
	touch $@

prepare: venv ## build what the lab needs: podman, image, wheelhouses, model mirror, secrets (cached)
	$(BIN)/python -m vllm_fleet.lab prepare --timings .lab/timings-prepare.json

LAB_ENGINE_CPUS ?= 0
lab: prepare ## bring up the lab fleet and run site.yml against it (LAB_ENGINE_CPUS=0.5: slowed engines)
	$(BIN)/ansible-playbook lab/lab.yml -e lab_engine_cpus=$(LAB_ENGINE_CPUS)
	$(BIN)/ansible-playbook site.yml

drift: venv ## site.yml --check --diff against the inventory: per-host changes; exit 2 on drift
	$(BIN)/vllm-fleet drift

lab-down: collections ## remove the lab's containers and network (nothing else)
	$(BIN)/ansible-playbook lab/lab.yml -e lab_state=absent

collections: venv ## the containers.podman collection, unpacked offline from the ansible wheel
	$(BIN)/python -m vllm_fleet.lab prepare --only collection

lint: collections ## yamllint, ansible-lint (production profile), ruff
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

unit: venv ## unit tests of the vllm_fleet package, on every core (installs the fixtures' host tools first)
	$(BIN)/python -m vllm_fleet.lab prepare --only host-packages promtool
	$(BIN)/pytest -n auto --durations=15 tests/unit

molecule: prepare ## every role's Molecule scenario (real systemd containers, real engines)
	$(BIN)/python -m tests.molecule_runner

e2e: prepare ## the lab end to end: fresh lab, site.yml, idempotence, secrets; fault and change matrices last (one row per mechanism)
	$(BIN)/pytest --durations=40 -m "not full" tests/lab

e2e-all: prepare ## e2e with every row of the fault and change matrices
	$(BIN)/pytest --durations=60 tests/lab

chaos: prepare ## the fault matrix alone, on a fresh lab (VLLM_FLEET_LAB_REUSE=1: the running one)
	$(BIN)/pytest tests/lab/test_chaos_lab.py

attack: prepare ## the attack matrix alone: a rogue host and the engine's user try the fleet, a revoked key is tried (VLLM_FLEET_LAB_REUSE=1: the running lab)
	$(BIN)/pytest tests/lab/test_attack_lab.py tests/lab/test_exposure_lab.py \
		tests/lab/test_change_matrix_lab.py::test_a_hosts_control_key_revoked_under_load

matrix: prepare ## the change matrix alone, every row (VLLM_FLEET_LAB_REUSE=1: on the running lab)
	$(BIN)/pytest tests/lab/test_change_matrix_lab.py

test: venv ## what CI runs: lint, unit, Molecule, the lab (every mechanism once); time per layer
	$(BIN)/python -m tests.suite test

test-all: venv ## every row of every matrix; time per layer
	$(BIN)/python -m tests.suite test-all

bench: prepare ## lab bring-up time by phase and the re-run's fraction; then bench-router
	$(BIN)/python bench/lab_bringup.py
	$(BIN)/python bench/plugin_preload_bench.py
	$(BIN)/python bench/verify_names_bench.py
	$(MAKE) bench-router
	$(MAKE) bench-upgrade

bench-check: venv ## make test-all's last layer, on the lab e2e-all leaves up: each bench's own checks, quick sizes
	$(BIN)/python bench/kv_planner_accuracy.py
	$(BIN)/python bench/hash_bench.py --gib 0.1
	$(BIN)/python bench/router_bench.py --questions 6
	$(BIN)/python bench/upgrade_bench.py
	$(BIN)/python bench/connection_bench.py --rounds 2 --tasks 12
	$(BIN)/python bench/plugin_preload_bench.py --rounds 2 --tasks 12
	$(BIN)/python bench/verify_names_bench.py --names 2 --rounds 2

bench-router: venv ## on the lab: router overhead; prefix-cache hits per policy vs ideal
	$(BIN)/python bench/router_bench.py

bench-upgrade: venv ## on the lab: a rolling upgrade under load (failed requests, engines serving)
	$(BIN)/python bench/upgrade_bench.py

BENCH_HASH_GIB ?= 4
bench-hash: venv ## sha256 verify vs sha256sum, stamped re-verify (BENCH_HASH_GIB=4, data in the cache)
	$(BIN)/python bench/hash_bench.py --gib $(BENCH_HASH_GIB)

clean: lab-down ## remove the lab and the controller venv (caches stay in $(VLLM_FLEET_CACHE))
	rm -rf $(VENV) .collections
