#!/usr/bin/env bash
# `make demo`: the administrator's path on a real local Kubernetes cluster with
# simulated MetaX nodes (8xC500, 4xN100, 2xC550-sriov):
#   cluster up -> each node's mode: DRA on the nodes DRA_NODES names (`make demo
#   DRA_NODES="vm"`), the device plugin on the rest (metax.gpu.gpu_device_mode)
#   -> ansible-playbook metax.gpu.site (agent images built and pushed,
#   GPU Extensions chart installed with helm, gpu-aware enabled, verified)
#   -> a pod asks for two GPUs (and, with DRA nodes, a pod claims two through DRA)
#   -> the nodes' labels, capacity, ResourceSlice devices and the pods' devices
#   -> Debian's Prometheus scrapes gpu-exporter: one line per GPU and where the
#   metrics are (scripts/demo_metrics.py; Prometheus keeps running).
# Prints each phase's time. The cluster stays up afterwards: `make cluster-down`.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
INVENTORY=docs/examples/local-cluster-inventory.yml
NS=metax-gpu-demo
declare -a TIMINGS=()

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; PHASE=$*; PHASE_START=$SECONDS; }
done_step() { TIMINGS+=("$(printf '%4ds  %s' $((SECONDS - PHASE_START)) "${PHASE}")"); }

# The nodes the inventory names (vm, vm-2, vm-3); without NODES a cluster that is
# down comes back with one node, and verify would miss the other two.
export NODES=${NODES:-8xC500 4xN100 2xC550-sriov}
# The nodes served through DRA (gpu-dra, ResourceSlices; docs/dra.md); the others keep the device plugin.
DRA_NODES=${DRA_NODES:-}
ANSIBLE_COLLECTIONS_PATH=${ANSIBLE_COLLECTIONS_PATH:-$PWD/.build/collections}
export ANSIBLE_COLLECTIONS_PATH

step "1/6 local cluster with simulated MetaX nodes (${NODES})"
scripts/cluster/cluster.sh up
eval "$(scripts/cluster/cluster.sh env)"
# something for the metrics of step 5 to show (set now: gpu-exporter's first reading has it): the
# simulator's mx-smi reports two of vm's GPUs busy until the demo ends
SIM=(env "PYTHONPATH=${PWD}/.build/collections" python -m ansible_collections.metax.gpu.plugins.module_utils.sim)
SIM_VM=$(scripts/cluster/cluster.sh json |
  python -c 'import json,sys; print(next(n["sim_root"] for n in json.load(sys.stdin)["nodes"] if n["name"] == "vm"))')
mapfile -t GPUS < <("${SIM[@]}" status "${SIM_VM}" | python -c 'import json,sys; [print(g["bdf"]) for g in json.load(sys.stdin)["gpus"][:2]]')
"${SIM[@]}" workload "${SIM_VM}" --bdf "${GPUS[0]}" --utilization 0.7 >/dev/null
"${SIM[@]}" workload "${SIM_VM}" --bdf "${GPUS[1]}" --utilization 0.35 >/dev/null
trap '"${SIM[@]}" workload "${SIM_VM}" --clear >/dev/null' EXIT
done_step

step "2/6 each node's mode: DRA on ${DRA_NODES:-no node}, the device plugin on the others"
mapfile -t CLUSTER_NODES < <(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
for node in ${DRA_NODES}; do
  [[ " ${CLUSTER_NODES[*]} " == *" ${node} "* ]] || {
    echo "DRA_NODES names ${node}, not a node of the cluster (${CLUSTER_NODES[*]})" >&2
    exit 2
  }
done
# metax.gpu.gpu_device_mode: a no-op on a node in its mode; a switch (a node an earlier demo left
# in the other mode) holds the node, evicts the demo's pods and never has both serving it
for node in "${CLUSTER_NODES[@]}"; do
  mode=device-plugin
  [[ " ${DRA_NODES} " == *" ${node} "* ]] && mode=dra
  ansible -i "${INVENTORY}" localhost -o -m metax.gpu.gpu_device_mode \
    -a "node_name=${node} mode=${mode} evict=true evict_timeout=120 kubeconfig=${KUBECONFIG}"
done
done_step

step "3/6 ansible-playbook metax.gpu.site (images, push, helm install, gpu-aware, verify)"
SITE_VARS=(-e "metax_gpu_kubeconfig=${KUBECONFIG}")
if [[ -n ${DRA_NODES} ]]; then
  # the Extensions chart's gpu-dra and DeviceClasses (gpu-dra runs only on the nodes labelled dra)
  SITE_VARS+=(-e '{"gpu_extensions_extra_values": {"dra": {"enabled": true, "healthyInterval": 2}}}')
fi
ansible-playbook -i "${INVENTORY}" "${SITE_VARS[@]}" metax.gpu.site
done_step

step "4/6 a pod asks for metax-tech.com/gpu: 2"
kubectl create namespace "${NS}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "${NS}" delete pod two-gpus --ignore-not-found --wait=true >/dev/null
sed -e "s|@IMAGE_BASE@|${METAX_REGISTRY_BASE_IMAGE}|" files/demo/workload.yaml | kubectl apply -f -
kubectl -n "${NS}" wait pod/two-gpus --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s
echo "placed on node $(kubectl -n "${NS}" get pod two-gpus -o jsonpath='{.spec.nodeName}'); it saw:"
kubectl -n "${NS}" logs two-gpus
if [[ -n ${DRA_NODES} ]]; then
  DRA_NODE=${DRA_NODES%% *}
  echo "and a pod on ${DRA_NODE} claims two GPUs of one MetaXLink group through DRA:"
  kubectl -n "${NS}" delete pod dra-two-gpus --ignore-not-found --wait=true >/dev/null
  sed -e "s|@IMAGE_BASE@|${METAX_REGISTRY_BASE_IMAGE}|" -e "s|@NODE@|${DRA_NODE}|" files/demo/dra-workload.yaml |
    kubectl apply -f -
  kubectl -n "${NS}" wait pod/dra-two-gpus --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s
  kubectl -n "${NS}" logs dra-two-gpus
fi
done_step

step "5/6 the nodes: mode, labels, metax-tech.com/gpu and ResourceSlice devices"
kubectl get resourceslices -o json >"${TMPDIR:-/tmp}/metax-demo-slices.json" 2>/dev/null ||
  echo '{"items": []}' >"${TMPDIR:-/tmp}/metax-demo-slices.json"
kubectl get nodes -o json | SLICES="${TMPDIR:-/tmp}/metax-demo-slices.json" PYTHONPATH="${PWD}/.build/collections" python -c '
import json, os, sys
from ansible_collections.metax.gpu.plugins.module_utils.dra.switch import mode_of, serving
slices = json.load(open(os.environ["SLICES"]))["items"]
for node in json.load(sys.stdin)["items"]:
    meta, status = node["metadata"], node["status"]
    now = serving(node, slices)
    print("%s: mode=%s served by %s: capacity=%s allocatable=%s, DRA devices=%d" % (
        meta["name"], mode_of(node), now.by, status["capacity"].get("metax-tech.com/gpu"),
        status["allocatable"].get("metax-tech.com/gpu"), now.dra))
    for key, value in sorted(meta.get("labels", {}).items()):
        if key.startswith("metax-tech.com/"):
            print("    %s=%s" % (key, value))'
done_step

step "6/6 GPU metrics: Prometheus scrapes gpu-exporter on every node"
python scripts/demo_metrics.py
done_step

printf '\nPhase timings:\n'
printf '  %s\n' "${TIMINGS[@]}"
# shellcheck disable=SC2016  # printed for the reader to run, not expanded here
printf '\nDemo done. The cluster keeps running: eval "$(scripts/cluster/cluster.sh env)"; kubectl get pods -A\n'
printf 'Remove the GPU Extensions: ansible-playbook -i %s metax.gpu.uninstall\n' "${INVENTORY}"
printf 'Stop the cluster with: make cluster-down\n'
