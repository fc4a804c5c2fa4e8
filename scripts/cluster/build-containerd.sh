#!/usr/bin/env bash
# Build containerd 2.x (containerd, containerd-shim-runc-v2, ctr) from Go
# modules, cached by version:
#   ${METAX_CACHE_DIR}/containerd/<CONTAINERD_VERSION>/bin/{containerd,containerd-shim-runc-v2,ctr}
# Debian's containerd is 1.6 (no CDI; kubelet 1.37 drops 1.x). runc stays
# Debian's. A rerun with the directory complete does nothing.
#
# Usage: build-containerd.sh
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

ensure_go

BIN_DIR=$(containerd_bin_dir)
VERSION_DIR=$(dirname "${BIN_DIR}")
BINARIES=(containerd containerd-shim-runc-v2 ctr)

is_complete() {
  local b
  [[ -f ${VERSION_DIR}/.complete ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x ${BIN_DIR}/${b} ]] || return 1; done
}
if is_complete; then
  log "containerd ${CONTAINERD_VERSION} cached in ${BIN_DIR} (no build)."
  exit 0
fi
go_build_lock
is_complete && exit 0
go_build_env

mod=github.com/containerd/containerd/v2
WRAP=${METAX_CACHE_DIR}/containerd/wrapper-${CONTAINERD_VERSION}
mkdir -p "${WRAP}"
if [[ ! -f ${WRAP}/go.mod ]]; then
  printf 'module metax.local/containerd-build\n\ngo 1.24\n\nrequire %s %s\n' "${mod}" "${CONTAINERD_VERSION}" >"${WRAP}/go.mod"
fi
ldflags="-s -w -X ${mod}/version.Version=${CONTAINERD_VERSION} -X ${mod}/version.Revision=metax-gpu-build"
rm -rf "${VERSION_DIR}/bin.partial"
mkdir -p "${VERSION_DIR}/bin.partial"
for b in "${BINARIES[@]}"; do
  t0=$(date +%s)
  log "building ${b} ${CONTAINERD_VERSION}"
  if ! (cd "${WRAP}" && "${GO}" build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "${ldflags}" \
    -o "${VERSION_DIR}/bin.partial/${b}" "${mod}/cmd/${b}"); then
    die "go build of ${b} ${CONTAINERD_VERSION} failed (see above); check that the Go module proxy ($("${GO}" env GOPROXY)) serves ${mod}@${CONTAINERD_VERSION}"
  fi
  log "${b}: $(($(date +%s) - t0))s"
done
rm -rf "${BIN_DIR}"
mv "${VERSION_DIR}/bin.partial" "${BIN_DIR}"
"${BIN_DIR}/containerd" --version >"${VERSION_DIR}/.complete"
log "containerd ready: $(cat "${VERSION_DIR}/.complete")"
