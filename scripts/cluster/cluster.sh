#!/usr/bin/env bash
# The local Kubernetes cluster of metax.gpu (tests, CI, demo): etcd,
# kube-apiserver, kube-controller-manager as host processes; one or more
# simulated GPU nodes, each a kubelet + containerd 2 (+ runc) + kube-proxy in
# its own network and mount namespace with its own simulated MetaX root; the
# first node carries the static-pod kube-scheduler; two registries.
#
# Usage: [NODES="8xC500 4xN100 ..."] cluster.sh up | down | status | env | json | inventory
#          | restart-kubelet [NODE] | podman-env | plan
#   up      idempotent; builds/installs what is missing first; NODES: one
#           preset per node (default: the running cluster's nodes, else one 8xC500 node)
#   down    stops only what `up` started (PID files), unmounts, removes what it
#           added (files, CNI, iptables chains, cgroups); always safe to run
#   status  components, kubeconfig, registries, nodes; exit 0 when all run
#   env     shell exports for using the cluster: eval "$(cluster.sh env)"
#   json    the same as JSON with the node list (used by tests/integration/conftest.py)
#   inventory  an Ansible YAML inventory of the running cluster
#   podman-env  CONTAINERS_CONF/CONTAINERS_REGISTRIES_CONF exports (no cluster needed)
#   plan    the node table `up` makes of NODES: "INDEX NAME PRESET" per line
#
# Everything is done by the Python package tests/localcluster (one module per
# component; docs/local-cluster.md). This entry point only resolves what
# lib.sh knows -- the Go version that keys the Kubernetes build, the cached
# binaries, the project's python, the podman configuration -- and passes it on.
# The package is standard library only: the machine's python3 runs it before
# the venv exists.
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

case ${1:-} in
  up | down | status | env | json | inventory | restart-kubelet | podman-env | plan | compare) ;;
  *)
    echo "usage: $0 up|down|status|restart-kubelet [NODE]|env|json|inventory|podman-env|plan" >&2
    exit 2
    ;;
esac

mkdir -p "${METAX_CACHE_DIR}"
# the simulator runs in the project's python with the collection importable
ensure_collection_path
METAX_LC_REPO=${REPO_ROOT}
METAX_LC_PYTHON=$(project_python)
METAX_LC_KUBE_BIN=$(k8s_bin_dir)
METAX_LC_CONTAINERD_BIN=$(containerd_bin_dir)
METAX_LC_HELM_BIN=$(helm_bin_dir)
METAX_LC_HELM_PLUGINS=$(helm_plugins_dir)
export METAX_LC_REPO METAX_LC_PYTHON METAX_LC_KUBE_BIN METAX_LC_CONTAINERD_BIN METAX_LC_HELM_BIN \
  METAX_LC_HELM_PLUGINS
# containerd finds its shim on PATH
export PATH=${METAX_LC_CONTAINERD_BIN}:${PATH}
PYTHONPATH=${REPO_ROOT}/tests${PYTHONPATH:+:${PYTHONPATH}} exec python3 -m localcluster "$@"
