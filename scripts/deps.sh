#!/usr/bin/env bash
# The `deps` phase: install everything of requirements/system.txt that is
# missing, before any test, cluster, image build or benchmark needs it.
# Debian packages (apt-get), Go-built binaries (cached by version) and the
# locally built base image. Idempotent; about a second when all is present.
# Prints what it installed; on failure, names what is missing and the command
# that installs it by hand.
#
# Usage: scripts/deps.sh [--check]   (--check: report what is missing, exit 1 if any)
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
LIST=${METAX_SYSTEM_DEPS:-${REPO_ROOT}/requirements/system.txt}
CHECK=${1:-}
t0=${SECONDS}
installed=()
missing=0   # --check: what is missing

fail() {   # what, how to do it by hand
  die "deps: $1 could not be installed.
  By hand: $2
  (the list: ${LIST})"
}

# ---- Debian packages
if ! "${CLUSTER_SCRIPTS}/packages.sh" --check >/dev/null; then
  if [[ ${CHECK} == --check ]]; then
    "${CLUSTER_SCRIPTS}/packages.sh" --check || missing=1
  else
    "${CLUSTER_SCRIPTS}/packages.sh" || fail "Debian packages" \
      "apt-get update && apt-get install -y $(system_deps deb "${LIST}" | xargs)"
    installed+=("Debian packages")
  fi
fi

# ---- Go-built binaries: each build script is a no-op when its cache is complete
go_present() {   # NAME: its cached binaries are complete (no Go needed to tell)
  case $1 in
    helm) [[ -f $(dirname "$(helm_bin_dir)")/.complete && -f $(helm_plugins_dir)/diff/.complete ]] ;;
    k8s) [[ -f $(dirname "$(k8s_bin_dir)")/.complete ]] ;;
    containerd) [[ -f $(dirname "$(containerd_bin_dir)")/.complete ]] ;;
    cdi-validate) [[ -f $(dirname "$(cdi_validate_bin_dir)")/.complete ]] ;;
    kwok) [[ -f $(dirname "$(kwok_bin_dir)")/.complete ]] ;;
    *) die "deps: unknown go entry '$1' in ${LIST}" ;;
  esac
}
while read -r name; do
  go_present "${name}" && continue
  if [[ ${CHECK} == --check ]]; then
    echo "missing Go build: ${name} (scripts/cluster/build-${name}.sh)"
    missing=1
    continue
  fi
  log "deps: building ${name} from Go modules (cached by version under ${METAX_CACHE_DIR})"
  "${CLUSTER_SCRIPTS}/build-${name}.sh" >&2 || fail "the Go build '${name}'" \
    "scripts/cluster/build-${name}.sh (needs Go >= 1.26 or access to the Go module proxy)"
  go_present "${name}" || fail "the Go build '${name}'" "scripts/cluster/build-${name}.sh"
  installed+=("${name} (Go build)")
done < <(system_deps go "${LIST}")

# ---- Go module sources that tests read (not built): module@<version rule>
gomod_version() {   # MODULE: k8s.io staging modules follow Kubernetes (v1.36.3 -> v0.36.3)
  case $1 in
    k8s.io/*) echo "v0.${KUBE_VERSION#v1.}" ;;
    *) die "deps: no version rule for the gomod entry '$1' in ${LIST}" ;;
  esac
}
while read -r mod; do
  ver=$(gomod_version "${mod}")
  [[ -d ${METAX_CACHE_DIR}/go/mod/${mod}@${ver} ]] && continue
  if [[ ${CHECK} == --check ]]; then
    echo "missing Go module source: ${mod}@${ver}"
    missing=1
    continue
  fi
  ensure_go
  (go_build_env && cd "${METAX_CACHE_DIR}/go" && "${GO}" mod download "${mod}@${ver}") >&2 ||
    fail "the Go module ${mod}@${ver}" "GOMODCACHE=${METAX_CACHE_DIR}/go/mod go mod download ${mod}@${ver}"
  installed+=("${mod}@${ver} (Go module source)")
done < <(system_deps gomod "${LIST}")

# ---- locally built images
while read -r name; do
  if [[ ${CHECK} == --check ]]; then
    podman image exists "${METAX_BASE_IMAGE}" 2>/dev/null || { echo "missing image: ${name}"; missing=1; }
    continue
  fi
  case ${name} in
    base) podman image exists "${METAX_BASE_IMAGE}" 2>/dev/null && continue ;;
    *) die "deps: unknown image entry '${name}' in ${LIST}" ;;
  esac
  "${CLUSTER_SCRIPTS}/images.sh" "${name}" >&2 || fail "the image '${name}'" "scripts/cluster/images.sh ${name}"
  installed+=("${name} image")
done < <(system_deps image "${LIST}")

if [[ ${CHECK} == --check ]]; then
  exit "${missing}"
elif ((${#installed[@]})); then
  printf -v joined '%s, ' "${installed[@]}"
  log "deps: installed ${joined%, } in $((SECONDS - t0)) s"
else
  log "deps: everything in requirements/system.txt is present ($((SECONDS - t0)) s)"
fi
