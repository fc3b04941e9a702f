# capi-libvirt: `make run` to see the provider work, `make test` to prove it. Both install what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export CAPI_LIBVIRT_CACHE ?= $(HOME)/.cache/capi-libvirt

.PHONY: help system-deps venv debian-root trixie-root upstream upstream-control-plane upstream-kubernetes upstream-rest upstream-operator guest-image guest-image-minimal \
	guest-image-node prerequisites manifests lint lint-checks lock lock-check image test test-whole-cluster test-fast bench bench-scale bench-scale-chaos run demo clean \
	release-manifests templates reference docs test-other-pythons

# Each set-up step runs through hack/timed.sh: one line when it starts and when it ends, its output in out/logs/, its
# seconds in out/timing/setup.tsv (the timing report of `make test`, tests/timing_report.py, shows them).
TIMED := hack/timed.sh
# The set-up steps of `make test`, `make run` and `make demo` run side by side where they do not depend on each other
# (the Go builds on the CPU while debootstrap waits on the mirror); at most this many at once.
SETUP_JOBS ?= 4

help:
	@echo "make demo       watch one VM go from a LibvirtMachine to booted and back to nothing (start here)"
	@echo "make run        run the operator (against your cluster, or a local API server + libvirt host)"
	@echo "make test       install everything needed, then run every test tier (unit, integration, e2e; the whole cluster last, alone)"
	@echo "make test-fast  the unit tier only"
	@echo "make test-other-pythons  the unit tier on Python 3.12 and 3.13"
	@echo "make test-whole-cluster  whole clusters from the default and clusterclass flavors, alone (25-40 minutes)"
	@echo "make test-control-plane-rollout  a rollout of a whole cluster's control-plane machine, alone (not in make test)"
	@echo "make manifests  regenerate config/crd from the API models"
	@echo "make templates  regenerate templates/ (the flavors' cluster templates and the ClusterClasses)"
	@echo "make reference  regenerate the book's reference pages from the code"
	@echo "make docs       build the book (docs/book) with mdBook"
	@echo "make release-manifests  write the clusterctl release to out/ (Python only)"
	@echo "make image      build the operator image from the Dockerfile (buildah; no Docker engine needed)"
	@echo "make bench      provisioning speed, idle cost and API traffic at N = 1, 10, 50, against the bare libvirt floor"
	@echo "make bench-scale  the operator's cost per machine at N = 100 to 2,000 over 1 to 100 in-memory hosts"
	@echo "make bench-scale-chaos  2,000 machines over 100 in-memory hosts through 200 operator SIGKILLs: nothing lost"

system-deps:
	@$(TIMED) system-deps hack/install-system-deps.sh

venv: system-deps $(VENV)/.installed

# Installed from the hashed lock (make lock writes it from pyproject.toml's bounds), then the project itself.
$(VENV)/.installed: pyproject.toml requirements-dev.lock | system-deps
	@$(TIMED) venv bash -c '$(PYTHON) -m venv $(VENV) \
	  && $(BIN)/pip install -q --disable-pip-version-check --require-hashes -r requirements-dev.lock \
	  && $(BIN)/pip install -q --disable-pip-version-check --no-deps -e .'
	@touch $@

# requirements.lock (the image's) and requirements-dev.lock (the venv's, with the test extra), hashes included.
# Keeps the pins it can; `make lock UPGRADE=1` moves every pin to the newest release pyproject.toml's bounds allow.
LOCK = $(BIN)/uv pip compile pyproject.toml --quiet --python-version 3.11 --generate-hashes \
	--custom-compile-command "make lock" $(if $(UPGRADE),--upgrade)
lock: venv
	$(LOCK) -o requirements.lock
	$(LOCK) --extra test -o requirements-dev.lock

# Fails when a lock file no longer matches pyproject.toml (a dependency added or a bound moved without `make lock`).
lock-check: venv
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && cp requirements.lock requirements-dev.lock $$tmp/ \
	 && $(LOCK) -o $$tmp/requirements.lock && $(LOCK) --extra test -o $$tmp/requirements-dev.lock \
	 && diff -q requirements.lock $$tmp/requirements.lock && diff -q requirements-dev.lock $$tmp/requirements-dev.lock \
	 || { echo "requirements*.lock are out of date with pyproject.toml: run \`make lock\`"; exit 1; }

# The upstream programs (hack/build-upstream.sh), in three steps side by side from the start: the Kubernetes commands
# with what the node image needs besides (etcd among them), the rest, and the Cluster API Operator. Each waits on the
# network (module downloads) and links on one core at times; beside each other they keep both cores busy, and the
# set-up ends when all of its CPU work is done whatever the order. `upstream-control-plane` is only what
# `make run`/`make demo` use.
upstream: upstream-kubernetes upstream-rest upstream-operator

upstream-rest: system-deps
	@$(TIMED) upstream-rest hack/build-upstream.sh rest

upstream-operator: system-deps
	@$(TIMED) upstream-operator hack/build-upstream.sh operator

upstream-kubernetes: system-deps
	@$(TIMED) upstream-kubernetes hack/build-upstream.sh kubernetes

upstream-control-plane: system-deps
	@$(TIMED) upstream-control-plane hack/build-upstream.sh control-plane

# The bookworm minbase root (hack/debian-root.sh, cached) the guest images and the operator image's base stand-in start
# from: debootstrapped once, before them, rather than by each beside the others.
debian-root: system-deps
	@$(TIMED) debian-root hack/debian-root.sh

# Both flavors: the minimal image, and the Kubernetes node image (it carries the kubelet and kubeadm of `upstream`).
guest-image: guest-image-minimal guest-image-node

guest-image-minimal: debian-root
	@$(TIMED) guest-image-minimal hack/build-guest-image.sh minimal

guest-image-node: debian-root upstream-kubernetes
	@$(TIMED) guest-image-node hack/build-guest-image.sh node

# The operator image from the Dockerfile, with buildah (no Docker engine); the base image is a local stand-in when no
# registry serves it (hack/make-base-image.sh). Tagged as config/manager names it; prints the reference and size.
image: debian-root
	@$(TIMED) image hack/build-image.sh

# Debian 13's libvirt and QEMU, in a root file system the newer-libvirt test host runs its daemons from (cached).
trixie-root: venv
	@$(TIMED) trixie-root $(BIN)/python -m devenv.trixie_root

prerequisites: venv upstream guest-image image trixie-root

manifests: venv
	$(BIN)/capi-libvirt manifests --dir config/crd

# v + the package version (pyproject.toml); the manager image in config/manager carries the same tag.
RELEASE_VERSION ?= v$(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)

# Needs Python only (no apt, Go or root): a venv of its own with the API models' two libraries, pinned and hashed as
# requirements.lock pins them.
RELEASE_VENV := .venv-release
RELEASE_PACKAGES := annotated-types pydantic pydantic-core pyyaml typing-extensions typing-inspection
$(RELEASE_VENV)/.installed: requirements.lock
	$(PYTHON) -m venv $(RELEASE_VENV)
	awk -v want=" $(RELEASE_PACKAGES) " '/^[a-z]/ { split($$1, p, "=="); keep = index(want, " " p[1] " ") > 0 } keep' \
	  requirements.lock > $(RELEASE_VENV)/requirements.txt
	$(RELEASE_VENV)/bin/pip install -q --disable-pip-version-check --no-deps --require-hashes \
	  -r $(RELEASE_VENV)/requirements.txt
	@touch $@

release-manifests: $(RELEASE_VENV)/.installed
	PYTHONPATH=src $(RELEASE_VENV)/bin/python -m capi_libvirt.api.release write --out out --version $(RELEASE_VERSION)

# The cluster templates of every flavor and the ClusterClasses, committed under templates/ (a unit test checks them).
templates: $(RELEASE_VENV)/.installed
	PYTHONPATH=src $(RELEASE_VENV)/bin/python -m capi_libvirt.api.release templates --dir templates

# The book's reference pages (docs/book/src/reference), generated from the code (a unit test checks them).
reference: venv
	$(BIN)/python hack/reference.py

# The book as HTML in docs/book/book/, with mdBook from crates.io (built once into the cache with the machine's cargo).
MDBOOK_VERSION := 0.4.52
MDBOOK := $(CAPI_LIBVIRT_CACHE)/mdbook-$(MDBOOK_VERSION)/bin/mdbook
$(MDBOOK):
	cargo install mdbook --version $(MDBOOK_VERSION) --locked --no-default-features --features search \
	  --root $(CAPI_LIBVIRT_CACHE)/mdbook-$(MDBOOK_VERSION)

docs: reference $(MDBOOK)
	$(MDBOOK) build docs/book
	@echo "the book: docs/book/book/index.html"

lint: venv lock-check
	@$(TIMED) lint $(MAKE) --no-print-directory lint-checks

lint-checks:
	$(BIN)/ruff check src tests bench devenv hack/reference.py
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

# Set-up (side by side, SETUP_JOBS at once) and lint, then every tier. pytest runs on PYTEST_WORKERS processes
# (pytest-xdist; tests/conftest.py keeps the guest-booting modules on one of them, so at most two guests boot at once
# on 2 cores). Then the whole cluster, alone, in a pytest process of its own: its control-plane VM takes most of the
# 2 cores under TCG, so nothing else may run beside it, not even the first run's shared beds, which live as long as
# the process that made them (docs/book/src/development/tiers.md). Both run even if the first fails, and `make test` fails if either
# did. At the end it prints where the time went, for both runs; out/timing/report.md has all of it. The other
# Pythons' run (hack/other-pythons.sh: no guest, its own libvirt hosts and API servers) goes beside the first run,
# which leaves about a third of the 2 cores idle (tests wait on guests and timers), at a lower priority, so the
# guests and the first run's API servers keep what they need.
PYTEST_WORKERS ?= 2
OTHER_PYTHONS_NICE ?= 5
WHOLE_CLUSTER_TEST := tests/e2e/test_whole_cluster.py
CONTROL_PLANE_ROLLOUT_TEST := tests/e2e/test_control_plane_rollout.py
test:
	@$(TIMED) --reset
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) prerequisites lint
	@export CAPI_LIBVIRT_SETUP_STARTED=$$(cat $${CAPI_LIBVIRT_TIMING_DIR:-out/timing}/setup-started); failed=0; \
	set -x; nice -n $(OTHER_PYTHONS_NICE) $(TIMED) other-pythons hack/other-pythons.sh & others=$$!; \
	$(BIN)/pytest -n $(PYTEST_WORKERS) --ignore=$(WHOLE_CLUSTER_TEST) --ignore=$(CONTROL_PLANE_ROLLOUT_TEST) tests || failed=1; \
	wait $$others || failed=1; \
	CAPI_LIBVIRT_TIMING_APPEND=1 $(BIN)/pytest -s $(WHOLE_CLUSTER_TEST) || failed=1; \
	exit $$failed

# The unit tier on Python 3.12 and 3.13 (pyenv's builds; a venv of each from the same lock). `make test` runs it beside
# its first pytest run.
test-other-pythons: system-deps
	@$(TIMED) other-pythons hack/other-pythons.sh

test-whole-cluster: prerequisites
	$(BIN)/pytest -s $(WHOLE_CLUSTER_TEST)

# Not part of `make test`: two control-plane VMs at once under TCG on 2 cores (docs/book/src/topics/whole-cluster.md).
test-control-plane-rollout: prerequisites
	$(BIN)/pytest -s $(CONTROL_PLANE_ROLLOUT_TEST)

test-fast: venv
	$(BIN)/pytest -m unit tests

# Not part of `make test` (about 25 minutes); results and plot in bench/results/. BENCH_ARGS: see `python -m bench -h`.
bench: prerequisites
	$(BIN)/python -m bench $(BENCH_ARGS)

# The real operator and API server, N machines over H in-memory hosts (N = 100, 500, 2,000; H = 1, 10, 100); not part
# of `make test`, which runs a small round of it. BENCH_SCALE_ARGS: see `python -m bench.scale -h`.
bench-scale: venv upstream-control-plane
	$(BIN)/python -m bench.scale $(BENCH_SCALE_ARGS)

# The chaos test's faults at that size (2,000 machines over 100 hosts, 200 operator SIGKILLs, two API server restarts,
# deletes mid-create); not part of `make test`, which runs a small one. CHAOS_ARGS: see `python -m bench.scale_chaos -h`.
bench-scale-chaos: venv upstream-control-plane
	$(BIN)/python -m bench.scale_chaos $(CHAOS_ARGS)

# Only what they use: the venv, etcd, kube-apiserver and kubeadm, Cluster API's CRDs, the minimal guest image.
DEV_PREREQUISITES := venv upstream-control-plane guest-image-minimal
run:
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) $(DEV_PREREQUISITES)
	$(BIN)/python -m devenv run

demo:
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) $(DEV_PREREQUISITES)
	$(BIN)/python -m devenv demo

clean:
	rm -rf $(VENV) .pytest_cache
