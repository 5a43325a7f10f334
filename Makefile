# The two commands: `make demo` and `make test`. Both set everything up on a fresh machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint proto proto-check unit integration bench bench-compare backends-up backends-down clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,demo,docker,k8s]'
	touch $(STAMP)

venv: $(STAMP)

## demo: a local federation of three hospitals trains a model with FedAvg (mutual TLS)
demo: $(STAMP)
	$(BIN)/python -m atoll.demo

## test: lint, then the whole suite with real backends (Slurm, Docker, Kubernetes)
test: $(STAMP) lint proto-check
	scripts/run_tests.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

proto:
	scripts/gen_proto.sh

proto-check: $(STAMP)
	scripts/gen_proto.sh --check

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

bench: $(STAMP)
	$(BIN)/python -m bench.federation

bench-compare: $(STAMP)
	bash bench/compare/setup_peers.sh
	$(BIN)/python bench/compare/run.py

backends-up:
	scripts/backends/all.sh up

backends-down:
	scripts/backends/all.sh down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
