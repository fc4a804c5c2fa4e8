#!/usr/bin/env bash
# `make demo`: a real local Kubernetes cluster with a simulated 8 x C500 MetaX
# node; gpu-device and gpu-label run as pods from images built from this
# collection; a pod asks for two GPUs and gets the allocator's pair; a GPU
# fails and comes back. The cluster stays up afterwards: `make cluster-down`.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
export METAX_SIM_PRESET=${METAX_SIM_PRESET:-8xC500}
GPU=metax-tech.com/gpu
NS=metax-gpu-demo

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
gpu_resources() {
  kubectl get node "$METAX_NODE_NAME" -o jsonpath="capacity={.status.capacity.metax-tech\.com/gpu} allocatable={.status.allocatable.metax-tech\.com/gpu}"
}
wait_allocatable() {   # value, seconds
  local want=$1 deadline=$((SECONDS + $2))
  until [ "$(kubectl get node "$METAX_NODE_NAME" -o jsonpath='{.status.allocatable.metax-tech\.com/gpu}')" = "$want" ]; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "allocatable did not reach $want" >&2; return 1; }
    sleep 1
  done
}
sim() { python -m ansible_collections.metax.gpu.plugins.module_utils.sim "$@"; }

step "1/7 local cluster with a simulated $METAX_SIM_PRESET node"
scripts/cluster/cluster.sh up
eval "$(scripts/cluster/cluster.sh env)"

step "2/7 what the node has, seen by the metax.gpu.gpu_facts module"
ANSIBLE_LOAD_CALLBACK_PLUGINS=true ANSIBLE_STDOUT_CALLBACK=ansible.posix.json ANSIBLE_LOCALHOST_WARNING=false \
  ANSIBLE_INVENTORY_UNPARSED_WARNING=false ansible localhost -m metax.gpu.gpu_facts -a "host_root=$METAX_SIM_ROOT" |
  python -c '
import json, sys
f = json.load(sys.stdin)["plays"][0]["tasks"][0]["hosts"]["localhost"]["ansible_facts"]["metax_gpu"]
print("GPUs: %d x %s, driver %s" % (f["gpu_count"], f["gpus"][0]["product"], f["driver"]["version"]))
for g in f["topology"]["link_groups"]:
    print("  %s group: GPUs %s" % (g["kind"], g["gpus"]))'

step "3/7 agent images (built from this collection, pushed to $METAX_REGISTRY)"
images=$(files/images/agent/build.sh)
echo "$images"
image_of() { sed -n "s/^$1=//p" <<<"$images"; }

step "4/7 gpu-device and gpu-label as DaemonSets"
for manifest in files/demo/agents/*.yaml; do
  sed -e "s|@IMAGE_GPU_DEVICE@|$(image_of gpu-device)|" -e "s|@IMAGE_GPU_LABEL@|$(image_of gpu-label)|" \
      -e "s|@SIM_ROOT@|$METAX_SIM_ROOT|" -e "s|@SIM_PARENT@|$(dirname "$METAX_SIM_ROOT")|" "$manifest"
done | kubectl apply -f -
kubectl -n "$NS" rollout status daemonset/gpu-device --timeout=300s
kubectl -n "$NS" rollout status daemonset/gpu-label --timeout=300s
wait_allocatable 8 60

step "5/7 the node: resources, labels, topology annotations"
gpu_resources; echo
kubectl get node "$METAX_NODE_NAME" -o json | python -c '
import json, sys
node = json.load(sys.stdin)
for key, value in sorted(node["metadata"]["labels"].items()):
    if key.startswith("metax-tech.com/"):
        print("  label %s=%s" % (key, value))
ann = node["metadata"].get("annotations", {})
for key in ("metax-tech.com/gpu.topology.scores", "metax-tech.com/gpu.topology.losses"):
    print("  %s: %s" % (key, ann.get(key)))'

step "6/7 a pod asks for $GPU: 2"
kubectl -n "$NS" delete pod two-gpus --ignore-not-found --wait=true >/dev/null
sed -e "s|@IMAGE_BASE@|$METAX_REGISTRY_BASE_IMAGE|" files/demo/workload.yaml | kubectl apply -f -
kubectl -n "$NS" wait pod/two-gpus --for=jsonpath='{.status.phase}'=Succeeded --timeout=120s
kubectl -n "$NS" logs two-gpus

step "7/7 GPU 5 falls off the bus: allocatable drops, capacity stays; then it recovers"
sim fail "$METAX_SIM_ROOT" --gpu 5
wait_allocatable 7 30 && gpu_resources && echo
sim recover "$METAX_SIM_ROOT" --gpu 5
wait_allocatable 8 30 && gpu_resources && echo

# shellcheck disable=SC2016  # printed for the reader to run, not expanded here
printf '\nDemo done. The cluster keeps running: eval "$(scripts/cluster/cluster.sh env)"; kubectl get pods -A\n'
printf 'Stop it with: make cluster-down\n'
