#!/usr/bin/env bash
# Run COMMAND with a local cluster of its own beside the machine's: in private
# mount, network and PID namespaces where /etc, /var/lib, /var/log and /run
# are copy-on-write overlays of the machine's (the cluster's own paths start
# empty there), so every path, port, address, bridge, netns, iptables chain
# and process that cluster.sh uses is the sandbox's alone, and nothing the
# sandbox writes or removes reaches the machine. Shared with the machine:
# podman's storage (bound back in: the agent images are built there once),
# the build cache, /tmp, the checkout, and the cgroup tree, where the
# sandbox's kubelets use their own prefix (METAX_CGROUP_PREFIX), which the
# machine's cluster does not match.
#
# Usage: scripts/cluster/sandbox.sh NAME COMMAND [ARG...]
#   NAME     [a-z0-9]+; the overlays' upper layers live in
#            $METAX_SANDBOX_DIR/NAME (default /var/tmp/metax-gpu-sandbox),
#            made afresh at each start and removed at the end: a sandbox's
#            cluster lives as long as COMMAND and no longer
#   COMMAND  runs under a bash that is PID 1 of the new PID namespace and reaps
#            what the cluster's processes leave; when COMMAND exits, every
#            process left in the namespace is killed with it
# Environment inside: METAX_SANDBOX=NAME (tests/integration/conftest.py keys its
# logs and leases by it), METAX_CGROUP_PREFIX=metax-sandbox-NAME-.
# No route leads out of the sandbox's network namespace: what the deps phase
# fetches, and the agent images, are made before, on the machine.
# Needs root. A second command for the same NAME waits for the first.
set -euo pipefail

# the overlaid trees; in them, the cluster's own paths start empty: those `up` creates and `down` removes,
# and its state, as tests/localcluster/settings.py defines them (standard library: the machine's python3)
OVERLAYS=(/etc /var/lib /var/log /run)
mapfile -t FRESH < <(PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)/tests" python3 -c 'import os
from localcluster.settings import from_env
s = from_env(os.environ)
print("\n".join(s.tracked_paths() + (s.state_dir,)))')
((${#FRESH[@]})) || { echo "sandbox.sh: tests/localcluster/settings.py named no path" >&2; exit 2; }
# podman's storage and run state: the machine's own, not copies
SHARED=(/var/lib/containers /run/containers /run/libpod)

die() { echo "sandbox.sh: $*" >&2; exit 2; }

inside() {   # NAME DIR COMMAND...: in the new namespaces (private propagation: nothing reaches the machine)
  local name=$1 dir=$2 tree layer path
  shift 2
  ip link set lo up
  for path in "${SHARED[@]}"; do
    [ -d "${path}" ] || continue
    mkdir -p "${dir}/hold${path}"
    mount --rbind "${path}" "${dir}/hold${path}"
  done
  local opaque=() under
  for path in "${FRESH[@]}"; do
    under=
    for tree in "${OVERLAYS[@]}"; do
      [[ ${path} == "${tree}"/* ]] && under=${tree} && opaque+=("${dir}/layers${tree}/upper${path#"${tree}"}")
    done
    # a path outside the overlays would be bound over the machine's own directory
    [ -n "${under}" ] || die "${path} is not under ${OVERLAYS[*]}: the sandbox cannot keep it private"
  done
  mkdir -p "${opaque[@]}"
  # an opaque directory in an upper layer hides whatever the machine has there
  python3 -c 'import os, sys
for path in sys.argv[1:]:
    os.setxattr(path, "trusted.overlay.opaque", b"y")' "${opaque[@]}"
  for tree in "${OVERLAYS[@]}"; do
    layer=${dir}/layers${tree}
    mkdir -p "${layer}/upper" "${layer}/work"
    mount -t overlay "sandbox-${name}" -o "lowerdir=${tree},upperdir=${layer}/upper,workdir=${layer}/work" "${tree}"
  done
  # and each of the cluster's paths a directory of a real file system (containerd's overlayfs snapshots
  # cannot have their upper layers on an overlay); a `down` that unmounts one uncovers the empty
  # opaque directory of the layer, not the machine's
  for path in "${FRESH[@]}"; do
    mkdir -p "${dir}/data${path}"
    mount --bind "${dir}/data${path}" "${path}"
  done
  for path in "${SHARED[@]}"; do
    [ -d "${dir}/hold${path}" ] || continue
    mkdir -p "${path}"
    mount --move "${dir}/hold${path}" "${path}"
  done
  export METAX_SANDBOX=${name} METAX_CGROUP_PREFIX=metax-sandbox-${name}-
  # not exec: PID 1 is what orphans are reparented to, and bash reaps them while it waits
  "$@" &
  local child=$! rc=0
  trap 'kill -TERM "${child}" 2>/dev/null' TERM INT HUP
  wait "${child}" || rc=$?
  # a trapped signal ends the first wait early: wait for COMMAND itself
  while kill -0 "${child}" 2>/dev/null; do wait "${child}" || rc=$?; done
  return "${rc}"
}

remove_cgroups() {   # NAME: what the sandbox's kubelets made, once nothing runs in it
  local cg
  for cg in /sys/fs/cgroup/*/metax-sandbox-"$1"-*; do
    [ -d "${cg}" ] && find "${cg}" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  return 0
}

if [ "${1:-}" = --inside ]; then
  shift
  inside "$@"
  exit
fi

(($# >= 2)) || die "usage: $0 NAME COMMAND [ARG...]"
name=$1
shift
[[ ${name} =~ ^[a-z0-9]+$ ]] || die "NAME must be [a-z0-9]+, got '${name}'"
((EUID == 0)) || die "needs root (private mount, network and PID namespaces)"
base=${METAX_SANDBOX_DIR:-/var/tmp/metax-gpu-sandbox}
dir=${base}/${name}
mkdir -p "${base}"
exec 8>"${dir}.lock"
if ! flock -n 8; then
  echo "sandbox.sh: sandbox ${name} is in use by another command; waiting" >&2
  flock 8
fi
# a sandbox killed before its end left its layers and cgroups; nothing runs in them any more
rm -rf "${dir}"
remove_cgroups "${name}"
mkdir -p "${dir}"
rc=0
unshare --mount --net --pid --fork --mount-proc --propagation private -- "$0" --inside "${name}" "${dir}" "$@" || rc=$?
# the namespaces are gone with their last process: their mounts, links and processes with them
rm -rf "${dir}"
remove_cgroups "${name}"
exit "${rc}"
