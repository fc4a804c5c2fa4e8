#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kubectl and kube-proxy for the pinned Kubernetes version from Go modules
# (k8s.io/kubernetes through the Go module proxy), with the machine's Go >= 1.26
# or the pinned toolchain ensure_go fetches (lib.sh).
#
# Result: ${METAX_CACHE_DIR}/k8s/<kube version>-<go version>/bin/<binary>
# A rerun with that directory complete does no build (prints the path only).
# GOCACHE / GOMODCACHE live under ${METAX_CACHE_DIR}/go so a version bump
# rebuilds incrementally.
#
# Usage: build-k8s.sh [--print-dir]
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

ensure_go

GOVER=$(go_version)
BIN_DIR=$(k8s_bin_dir)
VERSION_DIR=$(dirname "${BIN_DIR}")

is_complete() {
  local b
  [[ -f ${VERSION_DIR}/.complete ]] || return 1
  for b in "${KUBE_BINARIES[@]}"; do [[ -x ${BIN_DIR}/${b} ]] || return 1; done
}

if is_complete; then
  [[ ${1:-} == --print-dir ]] && echo "${BIN_DIR}"
  log "Kubernetes ${KUBE_VERSION} binaries cached in ${BIN_DIR} (no build)."
  exit 0
fi

mkdir -p "${METAX_CACHE_DIR}/k8s" "${METAX_CACHE_DIR}/go"
# One Go build at a time on this machine (the build uses every core).
exec 9>"${METAX_CACHE_DIR}/k8s/.build.lock"
if ! flock -n 9; then
  log "another Kubernetes build holds ${METAX_CACHE_DIR}/k8s/.build.lock; waiting for it..."
  flock 9
fi
if is_complete; then # built by the holder of the lock meanwhile
  [[ ${1:-} == --print-dir ]] && echo "${BIN_DIR}"
  exit 0
fi

export GOCACHE=${METAX_CACHE_DIR}/go/build
export GOMODCACHE=${METAX_CACHE_DIR}/go/mod
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
[[ -n ${HOME:-} ]] || export GOPATH=${METAX_CACHE_DIR}/go/path
# Go 1.27 turns the jsonv2 experiment on by default, which breaks the
# kube-openapi vendored by Kubernetes 1.36 (apiserver: "$root has invalid
# property: Extensions"). Harmless on 1.26.
case ${GOVER} in
  go1.26*) ;;
  *) export GOEXPERIMENT=nojsonv2 ;;
esac

WRAP=${METAX_CACHE_DIR}/k8s/wrapper-${KUBE_VERSION}
log "fetching k8s.io/kubernetes@${KUBE_VERSION} go.mod from $("${GO}" env GOPROXY)"
if ! modjson=$(cd "${METAX_CACHE_DIR}/k8s" && "${GO}" mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" 2>&1); then
  printf '%s\n' "${modjson}" >&2
  die "cannot download k8s.io/kubernetes@${KUBE_VERSION} from the Go module proxy ($("${GO}" env GOPROXY)).
  Check network access to proxy.golang.org (or set GOPROXY to a reachable proxy), then rerun.
  Alternatively copy a filled cache (${METAX_CACHE_DIR}/k8s/${KUBE_VERSION}-${GOVER}) from another machine."
fi
gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"${modjson}")
[[ -f ${gomod} ]] || die "go mod download did not report a go.mod for k8s.io/kubernetes@${KUBE_VERSION}"

mkdir -p "${WRAP}"
# Staging modules: every `k8s.io/x => ./staging/src/k8s.io/x` of the upstream
# go.mod becomes `k8s.io/x => k8s.io/x v0.<minor>.<patch>` here.
staging_version=v0.${KUBE_VERSION#v1.}
{
  echo "module metax.local/k8s-build"
  echo
  echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "${gomod}")"
  echo
  echo "require k8s.io/kubernetes ${KUBE_VERSION}"
  echo
  echo "replace ("
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/[a-z0-9-]*$#\t\1 => \1 '"${staging_version}"'#p' "${gomod}"
  echo ")"
} >"${WRAP}/go.mod.new"
grep -q 'k8s.io/api => ' "${WRAP}/go.mod.new" || die "no staging replace lines found in ${gomod}"
if ! cmp -s "${WRAP}/go.mod.new" "${WRAP}/go.mod"; then
  mv "${WRAP}/go.mod.new" "${WRAP}/go.mod"
  rm -f "${WRAP}/go.sum"
else
  rm -f "${WRAP}/go.mod.new"
fi

buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
  ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${buildDate}"
done

TMP_BIN=${VERSION_DIR}/bin.partial
mkdir -p "${TMP_BIN}"
TIMES=${VERSION_DIR}/build-times.txt
: >"${TIMES}.partial"
# a cache made before a binary joined KUBE_BINARIES: keep what it has
for b in "${KUBE_BINARIES[@]}"; do
  if [[ -x ${BIN_DIR}/${b} && ! -e ${TMP_BIN}/${b} ]]; then cp -p "${BIN_DIR}/${b}" "${TMP_BIN}/${b}"; fi
done
if [[ -f ${TIMES} ]]; then cp "${TIMES}" "${TIMES}.partial"; fi
for b in "${KUBE_BINARIES[@]}"; do
  if [[ -x ${TMP_BIN}/${b} ]]; then
    log "${b}: already built in an interrupted run, keeping it"
    continue
  fi
  log "building ${b} ${KUBE_VERSION} with ${GOVER} (GOCACHE=${GOCACHE})"
  t0=$(date +%s)
  if ! (cd "${WRAP}" && "${GO}" build -trimpath -ldflags "${ldflags}" \
    -o "${TMP_BIN}/${b}.tmp" "k8s.io/kubernetes/cmd/${b}"); then
    die "go build of ${b} failed (see above). If it is a download error, check access to the Go module proxy ($("${GO}" env GOPROXY))."
  fi
  mv "${TMP_BIN}/${b}.tmp" "${TMP_BIN}/${b}"
  secs=$(($(date +%s) - t0))
  printf '%s %ss\n' "${b}" "${secs}" | tee -a "${TIMES}.partial" >&2
done
rm -rf "${BIN_DIR}"
mv "${TMP_BIN}" "${BIN_DIR}"
mv "${TIMES}.partial" "${TIMES}"
"${BIN_DIR}/kubectl" version --client >"${VERSION_DIR}/.complete"
log "Kubernetes ${KUBE_VERSION} binaries ready in ${BIN_DIR}"
[[ ${1:-} == --print-dir ]] && echo "${BIN_DIR}"
exit 0
