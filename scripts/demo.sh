#!/usr/bin/env bash
# `make demo`: the administrator's path on a real local Kubernetes cluster with
# simulated MetaX nodes (8xC500, 4xN100, 2xC550-sriov):
#   cluster up -> ansible-playbook metax.gpu.site (agent images built and pushed,
#   GPU Extensions chart installed with helm, gpu-aware enabled, verified)
#   -> a pod asks for two GPUs -> the nodes' labels, capacity and the pod's devices
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

step "1/5 local cluster with simulated MetaX nodes (${NODES})"
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

step "2/5 ansible-playbook metax.gpu.site (images, push, helm install, gpu-aware, verify)"
ANSIBLE_COLLECTIONS_PATH=${ANSIBLE_COLLECTIONS_PATH:-$PWD/.build/collections} \
  ansible-playbook -i "${INVENTORY}" -e "metax_gpu_kubeconfig=${KUBECONFIG}" metax.gpu.site
done_step

step "3/5 a pod asks for metax-tech.com/gpu: 2"
kubectl create namespace "${NS}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "${NS}" delete pod two-gpus --ignore-not-found --wait=true >/dev/null
sed -e "s|@IMAGE_BASE@|${METAX_REGISTRY_BASE_IMAGE}|" files/demo/workload.yaml | kubectl apply -f -
kubectl -n "${NS}" wait pod/two-gpus --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s
echo "placed on node $(kubectl -n "${NS}" get pod two-gpus -o jsonpath='{.spec.nodeName}'); it saw:"
kubectl -n "${NS}" logs two-gpus
done_step

step "4/5 the nodes: labels, capacity and allocatable of metax-tech.com/gpu"
kubectl get nodes -o json | python -c '
import json, sys
for node in json.load(sys.stdin)["items"]:
    meta, status = node["metadata"], node["status"]
    print("%s: capacity=%s allocatable=%s" % (meta["name"], status["capacity"].get("metax-tech.com/gpu"),
                                               status["allocatable"].get("metax-tech.com/gpu")))
    for key, value in sorted(meta.get("labels", {}).items()):
        if key.startswith("metax-tech.com/"):
            print("    %s=%s" % (key, value))'
done_step

step "5/5 GPU metrics: Prometheus scrapes gpu-exporter on every node"
python scripts/demo_metrics.py
done_step

printf '\nPhase timings:\n'
printf '  %s\n' "${TIMINGS[@]}"
# shellcheck disable=SC2016  # printed for the reader to run, not expanded here
printf '\nDemo done. The cluster keeps running: eval "$(scripts/cluster/cluster.sh env)"; kubectl get pods -A\n'
printf 'Remove the GPU Extensions: ansible-playbook -i %s metax.gpu.uninstall\n' "${INVENTORY}"
printf 'Stop the cluster with: make cluster-down\n'
