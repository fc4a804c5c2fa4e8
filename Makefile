# metax.gpu -- developer entry points. `make test` is what CI runs.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# The repository root is the collection root; Python and Ansible find it as
# ansible_collections/metax/gpu through this symlink tree.
COLLECTIONS := .build/collections
COLLECTION_LINK := $(COLLECTIONS)/ansible_collections/metax/gpu
export PYTHONPATH := $(CURDIR)/$(COLLECTIONS)$(if $(PYTHONPATH),:$(PYTHONPATH))
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/$(COLLECTIONS)
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv test unit sanity lint demo cluster-up cluster-status cluster-down clean

help:
	@echo "make test            venv + every test, sanity check and lint (what CI runs)"
	@echo "make demo            the demo on a local cluster with three simulated MetaX nodes"
	@echo "make unit            unit tests only (fast)"
	@echo "make sanity | lint   ansible-test sanity | ansible-lint + yamllint"
	@echo "make cluster-up | cluster-status | cluster-down   local Kubernetes cluster"
	@echo "make cluster-up NODES=\"8xC500 4xN100 2xC550-sriov\"   ... with several GPU nodes"

$(BIN)/.installed: requirements/*.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements/test.txt
	touch $@

$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../../.. $@

venv: $(BIN)/.installed $(COLLECTION_LINK)

test: venv
	scripts/run-tests.sh all

unit: venv
	scripts/run-tests.sh unit

sanity: venv
	scripts/run-tests.sh sanity

lint: venv
	scripts/run-tests.sh lint

# NODES="8xC500 4xN100 2xC550-sriov": one simulated GPU node per preset (default:
# one 8xC500 node, or the running cluster's nodes)
cluster-up: venv
	$(if $(NODES),NODES="$(NODES)") scripts/cluster/cluster.sh up

cluster-status: venv
	scripts/cluster/cluster.sh status

cluster-down:
	scripts/cluster/cluster.sh down

demo: venv
	scripts/demo.sh

clean:
	rm -rf $(VENV) .build tests/output .pytest_cache .hypothesis
