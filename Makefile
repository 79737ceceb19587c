# Two commands on a fresh Debian machine: `make demo` and `make test`.
# Everything they need (Debian packages, the virtualenv, npm packages) is installed here.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# pytest arguments, e.g. `make test PYTEST_ARGS="-k magics -x"`
PYTEST_ARGS ?=

.PHONY: all install system-deps demo test lint format bench clean

all: install

system-deps:
	@scripts/install-system-deps.sh

$(VENV)/.installed: pyproject.toml
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e ".[test]"
	@touch $@

install: system-deps $(VENV)/.installed

demo: install
	$(BIN)/python examples/run_demo.py

lint: $(VENV)/.installed
	$(BIN)/ruff check .

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format jupyter_cloudtik tests benchmarks

test: install lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python benchmarks/cluster_up.py
	$(BIN)/python benchmarks/placement.py --baseline-instances 100

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache test-artifacts
