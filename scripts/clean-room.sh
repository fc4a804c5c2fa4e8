#!/usr/bin/env bash
# `make clean-room`: the README's two commands from a fresh Debian 12 root, as
# CI runs them (CI=true), and the result and the time of each part.
#
# Inside a privileged podman container of a freshly debootstrapped bookworm
# holding only the README's prerequisites (Python 3.11, make, git) and a clean
# clone of this checkout's HEAD (commit first: uncommitted changes are not in
# it): `scripts/run-tests.sh room`, i.e. the deps phase, the venv, the unit
# tests, the integration tests that need no cluster (Molecule on podman
# containers), ansible-test sanity and the linters.
# Then on the machine itself, from a second clean clone, after its own deps
# phase: the tests marked `cluster` and `make demo`. Two runs of the cluster
# inside the container failed where the machine passes (docs/development.md
# says how); kind's nodes-in-containers is what would move it inside.
# The only things taken from this machine into the container:
#   - the Go-built binaries' cache (Kubernetes, containerd, helm), mounted, so
#     that a run does not rebuild Kubernetes for 10 minutes;
#   - the machine's environment, not the project's: its CA bundle (HTTPS to
#     the package registries goes through a proxy with its own CA) and its
#     Debian mirror.
#
# Usage: scripts/clean-room.sh [COMMAND...]   default: "scripts/run-tests.sh room"
#   METAX_CLEAN_ROOM_CLUSTER=0: skip the cluster part on the machine
# Logs: tests/output/clean-room/*.log; summary: .../summary.txt
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
require_root

ROOT_IMAGE=${METAX_CLEAN_ROOM_IMAGE:-localhost/metax-gpu/clean-room:bookworm}
OUT=${REPO_ROOT}/tests/output/clean-room
NAME=metax-clean-room-$$
mkdir -p "${OUT}"
commands=("$@")
((${#commands[@]})) || commands=("scripts/run-tests.sh room")
CLUSTER_PART=${METAX_CLEAN_ROOM_CLUSTER:-1}
# the cluster part brings up the machine's one cluster: refuse before anything runs
if ((CLUSTER_PART)) && [[ -d ${METAX_CLUSTER_DIR} ]]; then
  die "a local cluster is up on this machine (${METAX_CLUSTER_DIR}): make cluster-down first, or METAX_CLEAN_ROOM_CLUSTER=0"
fi

command -v podman >/dev/null || "${REPO_ROOT}/scripts/deps.sh"
# the fresh root: minbase + the README's prerequisites, nothing else
METAX_BASE_IMAGE=${ROOT_IMAGE} METAX_BASE_INCLUDE=python3,make,git \
  "${REPO_ROOT}/files/images/base/build.sh"

mounts=(-v "${REPO_ROOT}:/src:ro" -v "${OUT}:/out")
for d in "k8s" "containerd" "helm" "helm-diff"; do   # the Go-built binaries, by version
  [[ -d ${METAX_CACHE_DIR}/${d} ]] && mounts+=(-v "${METAX_CACHE_DIR}/${d}:/root/.cache/metax-gpu/${d}")
done
[[ -s /etc/ssl/certs/ca-certificates.crt ]] && mounts+=(-v /etc/ssl/certs/ca-certificates.crt:/run/machine-ca.crt:ro)

# Inside: the machine's CA into the trust store (ca-certificates, installed by
# the deps phase, keeps it), a clean clone, then each command with CI=true.
inside=$(cat <<'EOS'
set -u
if [ -s /run/machine-ca.crt ]; then
  mkdir -p /usr/local/share/ca-certificates /etc/ssl/certs
  cp /run/machine-ca.crt /usr/local/share/ca-certificates/machine-ca.crt
  cp /run/machine-ca.crt /etc/ssl/certs/ca-certificates.crt
fi
git clone -q /src /work/metax && cd /work/metax || exit 90
exec >>/out/summary.txt 2>&1
echo "clean clone of $(git rev-parse --short HEAD); python $(python3 --version 2>&1); $(make --version | head -n1); $(git --version)"
i=0
for cmd in "$@"; do
  i=$((i + 1))
  log=/out/inside-$(echo "${cmd}" | tr -c 'a-z0-9\n' '-' | sed 's/^make-//; s/^scripts-//').log
  t0=$(date +%s)
  CI=true bash -c "${cmd}" >"${log}" 2>&1
  rc=$?
  echo "${cmd}: exit ${rc} in $(( $(date +%s) - t0 )) s (log: tests/output/clean-room/$(basename "${log}"))"
  grep -E '^tests: [0-9]+ passed' "${log}" | tail -n1 | sed 's/^/    /'
done
EOS
)
log "clean room: ${ROOT_IMAGE}, running: ${commands[*]}"
t0=${SECONDS}
# The cluster's state (containerd's overlay snapshots) must not sit on the
# container's own overlay root: the kernel refuses overlay upper dirs there.
STATE_DIR=${METAX_CLEAN_ROOM_STATE:-/var/lib/metax-gpu-clean-room}
rm -rf "${STATE_DIR}"
mkdir -p "${STATE_DIR}/cluster" "${STATE_DIR}/kubelet"
: >"${OUT}/summary.txt"
# --cgroupns=host + /sys/fs/cgroup: the kubelets need the cgroup tree; their
# own prefix keeps them apart from a cluster on this machine. The ulimits: runc
# cannot raise rlimits above these here (LOCAL-CLUSTER-NOTES). Detached, and
# waited for: the result is what the container wrote, whatever happens to
# this client.
podman run -d --name "${NAME}" --privileged --network bridge --cgroupns=host \
  -v /sys/fs/cgroup:/sys/fs/cgroup --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
  -v "${STATE_DIR}/cluster:/var/lib/metax-gpu-cluster" -v "${STATE_DIR}/kubelet:/var/lib/kubelet" \
  -e METAX_CGROUP_PREFIX=metax-cleanroom- -e PIP_DEFAULT_TIMEOUT=180 \
  "${mounts[@]}" "${ROOT_IMAGE}" bash -c "${inside}" clean-room "${commands[@]}" >/dev/null
trap 'podman rm -f "${NAME}" >/dev/null 2>&1 || true' EXIT
tail -n +1 -F "${OUT}/summary.txt" 2>/dev/null &
follower=$!
podman wait "${NAME}" >/dev/null || true
sleep 1
kill "${follower}" 2>/dev/null || true
echo "clean room, inside the container: $((SECONDS - t0)) s" | tee -a "${OUT}/summary.txt"

# The cluster part, on the machine: a clean clone of the same HEAD, its own
# deps phase first (run-tests.sh does that), then the cluster tests and the demo.
if ((CLUSTER_PART)); then
  outside=${METAX_CLEAN_ROOM_OUTSIDE:-/var/tmp/metax-gpu-clean-room-outside}
  rm -rf "${outside}"
  git clone -q "${REPO_ROOT}" "${outside}"
  t1=${SECONDS}
  for cmd in "scripts/run-tests.sh integration" "make demo"; do
    clog=${OUT}/outside-$(echo "${cmd}" | tr -c 'a-z0-9\n' '-' | sed 's/^make-//; s/^scripts-//').log
    t=${SECONDS}
    (cd "${outside}" && CI=true bash -c "${cmd}") >"${clog}" 2>&1
    crc=$?
    echo "on the machine, ${cmd}: exit ${crc} in $((SECONDS - t)) s (log: tests/output/clean-room/$(basename "${clog}"))" |
      tee -a "${OUT}/summary.txt"
    grep -E '^tests: [0-9]+ passed' "${clog}" | tail -n1 | sed 's/^/    /' | tee -a "${OUT}/summary.txt"
  done
  echo "clean room, cluster part on the machine: $((SECONDS - t1)) s" | tee -a "${OUT}/summary.txt"
fi
echo "clean room: $((SECONDS - t0)) s in all" | tee -a "${OUT}/summary.txt"
rc=0
# every command must have exited 0
grep -q ': exit [1-9]' "${OUT}/summary.txt" && rc=1
[[ $(grep -c ': exit 0 in' "${OUT}/summary.txt") -eq $((${#commands[@]} + 2 * CLUSTER_PART)) ]] || rc=1
exit "${rc}"
