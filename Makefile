# The two commands: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast soak lint bench chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "==> installing onward and its dependencies into $(VENV) (first run only: a few minutes)"
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,otel]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

# PYTEST_ARGS narrows the run, e.g. make test PYTEST_ARGS="tests/integration -x";
# PYTEST_WORKERS sets the parallelism (pytest-xdist; every test has its own database).
# DURATIONS: how many of the slowest tests to list at the end (0 lists all).
# --dist worksteal: a worker that runs out of tests takes half of another's queue. Under
# xdist's default (load), the first worker is handed the first eighth of the collection
# at once (144 of 1,152 tests: every acceptance test, most of the suite's time) and keeps
# it; the other ran the remaining 1,008 short tests, then sat idle for ~400 s while the
# first ran the acceptance tier alone.
# 3 workers against 2 on 18 acceptance tests (same window, loaded machine): 116 and 121 s
# against 139 and 109 s, each test ~30% slower: no clear gain, so CI keeps 2.
PYTEST_WORKERS ?= 2
DURATIONS ?= 20
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=$(DURATIONS) \
	    $(if $(PYTEST_ARGS),$(PYTEST_ARGS),tests)

# unit and integration tiers only: no onward processes started, under two minutes (quiet
# machine: 969 tests in 72 s on the embedded servers with 3 workers, 122 s with 2; these
# tiers wait on PostgreSQL more than they compute, so a third worker pays on 2 cores)
FAST_WORKERS ?= 3
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(FAST_WORKERS) --dist worksteal tests/unit tests/integration

# the step protocol as a state machine, long (tests/model; in `make test` it runs a short
# profile): SOAK_EXAMPLES / SOAK_STEPS size it, the failures it finds are printed shrunk
SOAK_EXAMPLES ?= 1500
SOAK_STEPS ?= 60
soak: $(STAMP)
	ONWARD_MODEL_PROFILE=model-soak ONWARD_MODEL_EXAMPLES=$(SOAK_EXAMPLES) \
	ONWARD_MODEL_STEPS=$(SOAK_STEPS) $(BIN)/python -m pytest tests/model -p no:cacheprovider \
	    -o timeout=0 -s $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check ledger tasks workers console examples bench tests harness
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/steps.py

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos

clean:
	-$(BIN)/onward embedded down
	rm -rf $(VENV) .onward
