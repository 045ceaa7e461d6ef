# ipvsproxy developer entry points. `make test` sets up everything it needs on a fresh
# Debian machine (apt packages, venv, editable install) and does nothing twice.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
APT_STAMP := $(VENV)/.apt-stamp
PYTEST_ARGS ?=

.PHONY: all setup upstream test test-host test-kernel lint fmt demo bench bench-scaling mutate lock image clean

all: test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(APT_STAMP): lab/install-host-packages.sh | $(VENV)/bin/python
	sh lab/install-host-packages.sh
	touch $@

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e . --group dev
	touch $@

# Upstream etcd, kube-apiserver, kube-controller-manager, kube-proxy and kube-router for the lab,
# built from the Go modules in lab/cluster/upstream/ into a cache outside the repository
# (~/.cache/ipvsproxy-lab, or $$IPVSPROXY_LAB_CACHE): built once, then found there.
upstream: $(STAMP)
	$(PY) -m lab.cluster.upstream

setup: $(APT_STAMP) $(STAMP) upstream

# The whole suite: host tests first, then the kernel-lab tests in one guest boot.
# --lab-no-skips makes any skipped test a failure: where the lab can boot nothing may skip.
test: setup
	$(PY) -m pytest --lab-no-skips $(PYTEST_ARGS)

test-host: setup
	$(PY) -m pytest -m 'not kernel' $(PYTEST_ARGS)

test-kernel: setup
	$(PY) -m pytest --lab-no-skips -m kernel $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

demo: setup
	$(PY) -m lab demo

# Host benchmark; then in the kernel lab ipvsproxy beside kube-proxy (IPVS) and kube-router
# (bench/peers.py, one guest boot: hours at the default 1,000 and 5,000 x 10 with 3 runs) and
# against the C tools (bench/kernel.py, another boot); results under bench-results/.
# BENCH_ARGS=--host-only skips the lab, --no-peers the side-by-side run.
BENCH_ARGS ?=
bench: setup
	$(PY) -m bench $(BENCH_ARGS)

# One endpoint change against cluster size for ipvsproxy, kube-proxy (IPVS) and kube-router;
# the chart goes to docs/bench-scaling.png. About 90 minutes at these sizes; kube-router's
# changes take many minutes each past 1,000 Services (hours at 5,000).
SCALING_SIZES ?= 100x10,250x10,500x10,1000x10
bench-scaling: setup
	$(PY) -m bench --scaling $(SCALING_SIZES)

# Mutation testing of the pure core (mutmut; [tool.mutmut] in pyproject.toml says which modules
# and which host tests): not part of make test nor CI. Results in mutants/, survivors listed
# by `make mutate` at the end; docs/mutation-testing.md says why each known survivor lives.
MUTATE_STAMP := $(VENV)/.mutate-stamp
$(MUTATE_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install -q -e . --group mutate
	touch $@

mutate: setup $(MUTATE_STAMP)
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children $${MUTATE_JOBS:-2} > mutants.log 2>&1 || (tail -40 mutants.log; exit 1)
	$(VENV)/bin/mutmut results

# The image's dependencies, hashed (deploy/Containerfile installs them with --require-hashes):
# deploy/requirements.lock, pyproject.toml's [project] dependencies and theirs, and
# deploy/build-requirements.lock, its [build-system] requires. Resolved for the image's Python,
# bookworm's 3.11: PYTHON must be a 3.11. pip-tools runs from a throwaway venv, never the
# project's. Pins already in a lock are kept; LOCK_ARGS=--upgrade moves every one to the newest.
LOCK_VENV ?= $(or $(TMPDIR),/tmp)/ipvsproxy-lock-venv
PIP_TOOLS ?= pip-tools==7.7.0
LOCK_ARGS ?=
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" PIP_FIND_LINKS= $(LOCK_VENV)/bin/pip-compile -q \
	--generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links $(LOCK_ARGS)
lock:
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) and "PYTHON must be a Python 3.11")'
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q "$(PIP_TOOLS)"
	$(PIP_COMPILE) --output-file deploy/requirements.lock pyproject.toml
	$(PIP_COMPILE) --all-build-deps --only-build-deps --output-file deploy/build-requirements.lock pyproject.toml

# The image, tagged with the package's version (the tag deploy/ names). CONTAINER_TOOL=podman
# works too.
CONTAINER_TOOL ?= docker
VERSION = $(shell $(PYTHON) -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image:
	$(CONTAINER_TOOL) build -f deploy/Containerfile -t ipvsproxy:$(VERSION) .

clean:
	rm -rf $(VENV) mutants mutants.log .pytest_cache .mypy_cache .ruff_cache build *.egg-info
