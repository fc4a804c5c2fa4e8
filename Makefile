# metax.gpu -- developer entry points. `make test` is what CI runs.
SHELL := /bin/bash
# Debian's python3.11 where there is one (requirements/system.txt installs its venv module): built
# with profile-guided optimisation and a static libpython, it runs a no-op site playbook with 22 %
# less CPU than a Python that pyenv built (docs/development.md, the venv phase). Any python3.11 otherwise.
PYTHON ?= $(or $(wildcard /usr/bin/python3.11),python3.11)
VENV ?= .venv
BIN := $(VENV)/bin
# The repository root is the collection root; Python and Ansible find it as
# ansible_collections/metax/gpu through this symlink tree.
COLLECTIONS := .build/collections
COLLECTION_LINK := $(COLLECTIONS)/ansible_collections/metax/gpu
export PYTHONPATH := $(CURDIR)/$(COLLECTIONS)$(if $(PYTHONPATH),:$(PYTHONPATH))
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/$(COLLECTIONS)
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help deps venv test unit sanity lint demo clean-room cluster-up cluster-status cluster-down clean \
	bench-scale scale-up scale-down

help:
	@echo "make test            deps + venv + every test, sanity check and lint (what CI runs)"
	@echo "make deps            install what requirements/system.txt lists (Debian packages, Go builds, images)"
	@echo "make clean-room      make test + make demo from a fresh Debian 12 root (CI=true): the cluster part on the machine"
	@echo "make demo            the demo on a local cluster with three simulated MetaX nodes"
	@echo "make demo DRA_NODES=\"vm\"   ... with those nodes served through DRA (docs/dra.md)"
	@echo "make unit            unit tests only (fast)"
	@echo "make sanity | lint   ansible-test sanity | ansible-lint + yamllint"
	@echo "make cluster-up | cluster-status | cluster-down   local Kubernetes cluster"
	@echo "make cluster-up NODES=\"8xC500 4xN100 2xC550-sriov\"   ... with several GPU nodes"
	@echo "make bench-scale     the scale benchmarks (kwok fake GPU nodes, SCALE_SIZES=500,1000,2000) on the running cluster"
	@echo "make scale-up SCALE_NODES=N | scale-down   the scale profile alone (docs/scale.md)"

$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../../.. $@

# .venv links to a venv in the build cache, kept by interpreter, requirements and week
# (scripts/venv.sh): a fresh clone reuses what this machine made before.
venv: $(COLLECTION_LINK)
	PYTHON=$(PYTHON) VENV=$(VENV) scripts/venv.sh

# Everything outside the venv, first (python3-venv included, so before venv).
deps:
	scripts/deps.sh

# run-tests.sh runs the deps and venv phases itself, first, and times them.
test:
	scripts/run-tests.sh all

unit:
	scripts/run-tests.sh unit

sanity:
	scripts/run-tests.sh sanity

lint:
	scripts/run-tests.sh lint

clean-room:
	scripts/clean-room.sh

# NODES="8xC500 4xN100 2xC550-sriov": one simulated GPU node per preset (default:
# one 8xC500 node, or the running cluster's nodes)
cluster-up: deps venv
	$(if $(NODES),NODES="$(NODES)") scripts/cluster/cluster.sh up

cluster-status: venv
	scripts/cluster/cluster.sh status

cluster-down:
	scripts/cluster/cluster.sh down

# The scale profile (docs/scale.md): kwok + fake GPU nodes on the running
# cluster. Every run holds the cluster lock: 2,000 nodes load the apiserver.
SCALE_SIZES ?= 500,1000,2000
SCALE_NODES ?= 200
# The driver-config benchmark runs every node's stand-in driver-manager in one
# process on this machine's cores: 500 did not finish a round (docs/scale.md).
SCALE_CONFIG_SIZES ?= 100,200,500
SCALE_ENV := flock -o /tmp/metax-cluster.lock env PYTHONPATH=$(CURDIR)/$(COLLECTIONS):$(CURDIR)/tests
bench-scale: deps venv
	$(SCALE_ENV) $(BIN)/python benchmarks/scale_gpu_aware.py --sizes $(SCALE_SIZES)
	$(SCALE_ENV) $(BIN)/python benchmarks/scale_agent_writes.py
	$(SCALE_ENV) $(BIN)/python benchmarks/scale_driver_plan.py --sizes $(SCALE_SIZES)
	flock -o /tmp/metax-heavy.lock env PYTHONPATH=$(CURDIR)/$(COLLECTIONS) $(BIN)/python benchmarks/scale_operator.py --sizes $(SCALE_SIZES)
	flock -o /tmp/metax-heavy.lock env PYTHONPATH=$(CURDIR)/$(COLLECTIONS) $(BIN)/python benchmarks/scale_driver_config.py --sizes $(SCALE_CONFIG_SIZES)

scale-up: deps venv
	$(SCALE_ENV) $(BIN)/python -m scale.profile up $(SCALE_NODES)

scale-down: venv
	$(SCALE_ENV) $(BIN)/python -m scale.profile down

# DRA_NODES="vm": those nodes in DRA mode (gpu-dra, ResourceSlices), the rest on the device plugin
demo: deps venv
	$(if $(DRA_NODES),DRA_NODES="$(DRA_NODES)") scripts/demo.sh

clean:
	rm -rf $(VENV) .build tests/output .pytest_cache .hypothesis
