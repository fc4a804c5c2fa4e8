#!/usr/bin/env bash
# Build cdi-validate (scripts/cluster/cdi-validate/main.go): the CDI library's
# own validator and device injection, which the CDI spec tests check our
# generated specs with. Test infrastructure, never shipped. Cached by the
# library's version:
#   ${METAX_CACHE_DIR}/cdi-validate/<CDI_VERSION>/bin/cdi-validate
# A rerun with it complete does nothing.
#
# Usage: build-cdi-validate.sh
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

OUT_DIR=$(dirname "$(cdi_validate_bin_dir)")
complete() { [[ -f ${OUT_DIR}/.complete && -x ${OUT_DIR}/bin/cdi-validate ]]; }
if complete; then
  log "cdi-validate (CDI ${CDI_VERSION}) cached (no build)."
  exit 0
fi

ensure_go
go_build_lock
go_build_env

mod=tags.cncf.io/container-device-interface
# A module of our own that requires the pinned library: `go install mod@v`
# would need the proxy's version list.
wrap=${METAX_CACHE_DIR}/cdi-validate/src-${CDI_VERSION}
rm -rf "${wrap}" "${OUT_DIR}"
mkdir -p "${wrap}" "${OUT_DIR}/bin"
cp "${CLUSTER_SCRIPTS}/cdi-validate/main.go" "${wrap}/main.go"
printf 'module metax.local/cdi-validate\n\ngo 1.23\n\nrequire %s %s\n' "${mod}" "${CDI_VERSION}" >"${wrap}/go.mod"
t0=$(date +%s)
log "building cdi-validate with ${mod}@${CDI_VERSION}"
(cd "${wrap}" && "${GO}" mod tidy && "${GO}" build -trimpath -ldflags "-s -w" -o "${OUT_DIR}/bin/cdi-validate.tmp" .) ||
  die "go build of cdi-validate with ${mod}@${CDI_VERSION} failed (see above); the Go module proxy ($("${GO}" env GOPROXY)) serves up to v1.1.1"
mv "${OUT_DIR}/bin/cdi-validate.tmp" "${OUT_DIR}/bin/cdi-validate"
echo "${CDI_VERSION}" >"${OUT_DIR}/.complete"
log "cdi-validate ready: ${OUT_DIR}/bin/cdi-validate ($(($(date +%s) - t0))s)"
