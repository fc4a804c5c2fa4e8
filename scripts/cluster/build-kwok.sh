#!/usr/bin/env bash
# Build kwok (sigs.k8s.io/kwok: the Kubernetes project's fake-node
# simulator) from Go modules, cached by version:
#   ${METAX_CACHE_DIR}/kwok/<KWOK_VERSION>/bin/kwok
#   ${METAX_CACHE_DIR}/kwok/<KWOK_VERSION>/stages/*.yaml
# The scale profile (tests/localcluster/kwok.py, `make bench-scale`) runs it
# as the controller that keeps the fake GPU nodes Ready and their pods
# Running. Test infrastructure, never shipped. A rerun with it complete does
# nothing.
#
# Usage: build-kwok.sh
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

OUT_DIR=$(dirname "$(kwok_bin_dir)")
# kwok's own stage definitions (kustomize/stage in its module): the nodes
# initialised Ready with a Lease heartbeat, pods Running at once, deleted pods
# removed. kwok has no built-in stages: tests/localcluster/kwok.py joins these
# into its --config.
STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)
complete() {
  [[ -f ${OUT_DIR}/.complete && -x ${OUT_DIR}/bin/kwok ]] || return 1
  local s
  for s in "${STAGES[@]}"; do [[ -f ${OUT_DIR}/stages/$(basename "${s}") ]] || return 1; done
}
if complete; then
  log "kwok ${KWOK_VERSION} cached (no build)."
  exit 0
fi

ensure_go
go_build_lock
go_build_env

mod=sigs.k8s.io/kwok
tmp=$(mktemp -d "${METAX_CACHE_DIR}/go/.install.XXXXXX")
rm -rf "${OUT_DIR}"
t0=$(date +%s)
log "building ${mod}/cmd/kwok@${KWOK_VERSION}"
# kwok's go.mod has no replace directives, so `go install pkg@version` works
# (an explicit version needs no version list from the proxy).
if ! GOBIN=${tmp} "${GO}" install -trimpath \
  -ldflags "-s -w" "${mod}/cmd/kwok@${KWOK_VERSION}"; then
  rm -rf "${tmp}"
  die "go install ${mod}/cmd/kwok@${KWOK_VERSION} failed (see above); the Go module proxy ($("${GO}" env GOPROXY)) serves up to v0.8.0"
fi
mkdir -p "${OUT_DIR}/bin"
mv "${tmp}/kwok" "${OUT_DIR}/bin/kwok"
rm -rf "${tmp}"
mkdir -p "${OUT_DIR}/stages"
for s in "${STAGES[@]}"; do
  src=${GOMODCACHE}/${mod}@${KWOK_VERSION}/kustomize/stage/${s}
  [[ -f ${src} ]] || die "kwok ${KWOK_VERSION}: stage ${s} not found in ${GOMODCACHE}/${mod}@${KWOK_VERSION}"
  cp "${src}" "${OUT_DIR}/stages/"
done
"${OUT_DIR}/bin/kwok" --version >"${OUT_DIR}/.complete" 2>&1 || echo "${KWOK_VERSION}" >"${OUT_DIR}/.complete"
log "kwok ready: ${OUT_DIR}/bin/kwok ($(($(date +%s) - t0))s)"
