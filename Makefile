# Two commands on a fresh Debian machine: `make demo` and `make test`.
# Everything they need (Debian packages, the virtualenv, npm packages) is installed here.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# pytest arguments, e.g. `make test PYTEST_ARGS="-k magics -x"`
PYTEST_ARGS ?=
# four workers on the 2 cores by default: most tests wait (on Slurm, A-REX, browsers,
# emulated boots), the CPUs were busy 35-50% of a 2-worker run; tests/conftest.py groups
# what must not run beside itself and hands out the longest units first.
# `make test PYTEST_WORKERS=` runs the suite in one process
PYTEST_WORKERS ?= -n 4 --dist loadscope

# the JupyterLab side panel (TypeScript in labextension/, built into jupyter_cloudtik/labextension)
JLPM      := PATH=$(abspath $(BIN)):$$PATH jlpm
LAB_DEPS  := labextension/node_modules/.installed
LAB_BUILT := jupyter_cloudtik/labextension/static/style.js
LAB_SRC   := $(shell find labextension/src labextension/style labextension/schema -type f 2>/dev/null) \
             labextension/package.json labextension/tsconfig.json

.PHONY: all install system-deps demo lab test lint format bench clean labextension js-test doc-images

all: install

system-deps:
	@scripts/install-system-deps.sh

$(VENV)/.installed: pyproject.toml emulators/pyproject.toml
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e ".[test]" -e emulators
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/jupyter labextension develop --overwrite . >/dev/null
	@touch $@

$(LAB_DEPS): labextension/package.json labextension/yarn.lock | $(VENV)/.lab-installed
	cd labextension && $(JLPM) install
	@touch $@

$(LAB_BUILT): $(LAB_SRC) | $(LAB_DEPS)
	cd labextension && $(JLPM) build:prod

# rebuild the side panel after TypeScript changes (the venv links to the build)
labextension: $(LAB_DEPS) $(LAB_BUILT)

# unit tests of the panel's model code (vitest)
js-test: $(LAB_DEPS)
	cd labextension && $(JLPM) test

# configurable-http-proxy (npm) for the real JupyterHub of the hub sidekick's tests
CHP := $(VENV)/hub-proxy/node_modules/.bin/configurable-http-proxy
$(CHP): | $(VENV)/.installed
	npm install --silent --no-audit --no-fund --prefix $(VENV)/hub-proxy configurable-http-proxy@4.6.3

# the egress proxy's own environment: mitmproxy pins versions (cryptography<44.1, h11<=0.14,
# tornado<=6.4.2) that the project's environment cannot take (docs/hub-egress.md)
EGRESS_VENV := $(VENV)/egress-proxy
EGRESS_MITMPROXY ?= mitmproxy==11.0.2
$(EGRESS_VENV)/.installed: | $(VENV)/.installed
	@test -d $(EGRESS_VENV) || $(PYTHON) -m venv $(EGRESS_VENV)
	$(EGRESS_VENV)/bin/python -m pip install --quiet "$(EGRESS_MITMPROXY)"
	@touch $@

install: system-deps $(VENV)/.installed $(CHP) $(EGRESS_VENV)/.installed

# the demo runs a notebook on the embedded local provider: the package (no side panel
# build: SKIP_JUPYTER_BUILDER), a kernel and nbclient; no Debian packages beyond a venv
DEMO_PKGS := ipykernel nbclient nbformat
$(VENV)/.demo-installed: pyproject.toml emulators/pyproject.toml
	@scripts/install-system-deps.sh demo
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	SKIP_JUPYTER_BUILDER=1 $(PIP) install --quiet -e . -e emulators $(DEMO_PKGS)
	@touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/python examples/run_demo.py

# JupyterLab with the side panel, for the browser after the demo (make test installs it too)
$(VENV)/.lab-installed: $(VENV)/.demo-installed
	@scripts/install-system-deps.sh lab
	SKIP_JUPYTER_BUILDER=1 $(PIP) install --quiet jupyterlab
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/jupyter labextension develop --overwrite . >/dev/null
	@touch $@

lab: $(VENV)/.lab-installed labextension
	$(BIN)/jupyter lab examples/

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/lint-imports

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format jupyter_cloudtik tests benchmarks

# --durations=20: every run ends with its 20 slowest tests (where the suite's time goes)
test: install lint labextension js-test
	$(BIN)/python -m pytest $(PYTEST_WORKERS) --durations=20 $(PYTEST_ARGS)

# the README's and docs' screenshots (docs/images/*.png), taken by the browser tests that
# check what they show, in Chromium
doc-images: install labextension
	CLOUDTIK_DOC_IMAGES=1 $(BIN)/python -m pytest -p no:randomly \
	  tests/server/test_panel_charts_browser.py tests/server/test_readme_in_lab.py \
	  tests/hpc/test_hpc_kernel_lab.py

bench: install
	$(BIN)/python benchmarks/cluster_up.py
	$(BIN)/python benchmarks/hpc_submit.py
	$(BIN)/python benchmarks/api_latency.py
	$(BIN)/python benchmarks/placement.py --baseline-instances 100
	$(BIN)/python benchmarks/storage_copy.py
	$(BIN)/python benchmarks/gateway_up.py
	$(BIN)/python benchmarks/huaweicloud_up.py
	$(BIN)/python benchmarks/egress_proxy.py
	$(BIN)/python benchmarks/hub_load.py
	$(BIN)/python benchmarks/adaptive.py
	$(BIN)/python benchmarks/slurm_up.py
	$(BIN)/python benchmarks/spark_up.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache test-artifacts \
	  labextension/node_modules labextension/lib jupyter_cloudtik/labextension
