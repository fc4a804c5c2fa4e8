# shellcheck shell=bash
# Shared settings and helpers for scripts/cluster/*. Source it; do not run it.
#
# Everything here can be overridden from the environment; the defaults are the
# contract documented in docs/local-cluster.md.

# ---------------------------------------------------------------- locations
CLUSTER_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "${CLUSTER_SCRIPTS}/../.." && pwd)

# Pinned versions. KUBE_VERSION must exist on the Go module proxy
# (`go list -m -versions k8s.io/kubernetes`).
: "${KUBE_VERSION:=v1.36.3}"

: "${METAX_CACHE_DIR:=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/metax-gpu}"

# Go builds the test infrastructure (never the product). Used: GO if set, else
# the first Go >= 1.26 of PATH, /usr/local/go and the cache; with none,
# ensure_go fetches GO_TOOLCHAIN_VERSION from the Go module proxy (the zip
# `GOTOOLCHAIN=<version>` would fetch) into the cache, checked against the
# pinned SHA-256 below.
: "${GO_TOOLCHAIN_VERSION:=go1.26.8}"
: "${GO_TOOLCHAIN_SHA256_amd64:=30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7}"
: "${GO_TOOLCHAIN_SHA256_arm64:=02b36b6787b3ac767668f630e2998df45a3b1f9ffee08d1bf3ef6487cd658d99}"
go_toolchain_dir() { echo "${METAX_CACHE_DIR}/go-toolchain/${GO_TOOLCHAIN_VERSION}"; }
# go_usable GO: it runs and is Go >= 1.26
go_usable() {
  local v
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  [[ ${v} =~ ^go1\.([0-9]+) ]] && ((BASH_REMATCH[1] >= 26))
}
if [[ -z ${GO:-} ]]; then
  for GO in "$(command -v go 2>/dev/null)" /usr/local/go/bin/go "$(go_toolchain_dir)/bin/go"; do
    [[ -n ${GO} ]] && go_usable "${GO}" && break
  done
  go_usable "${GO}" || GO=$(go_toolchain_dir)/bin/go
fi
# Cluster runtime state (PKI, etcd data, containerd root, logs, PID files).
: "${METAX_CLUSTER_DIR:=/var/lib/metax-gpu-cluster}"
# The simulated MetaX node root carried by the node; agent pods mount it with
# hostPath. Fixed path: tests and charts rely on it.
: "${METAX_SIM_ROOT:=/var/lib/metax-sim/root}"
: "${METAX_SIM_PRESET:=8xC500}"
# Where kubeadm-style files live. Real paths, as on a kubeadm control plane:
# a later issue patches /etc/kubernetes/manifests/kube-scheduler.yaml.
: "${METAX_KUBE_ETC:=/etc/kubernetes}"
: "${METAX_KUBELET_DIR:=/var/lib/kubelet}"

# Loopback ports.
: "${METAX_ETCD_PORT:=2379}"
: "${METAX_ETCD_PEER_PORT:=2380}"
: "${METAX_APISERVER_PORT:=6443}"
: "${METAX_REGISTRY_PORT:=5000}"
: "${METAX_REGISTRY_AUTH_PORT:=5443}"
: "${METAX_KUBELET_PORT:=10250}"

: "${METAX_REGISTRY_USER:=metax}"

export KUBE_VERSION GO METAX_CACHE_DIR METAX_CLUSTER_DIR METAX_SIM_ROOT \
  METAX_SIM_PRESET METAX_KUBE_ETC METAX_KUBELET_DIR

# ---------------------------------------------------------------- derived
go_version() { "${GO}" env GOVERSION 2>/dev/null || echo unknown; }

# Binary cache: keyed by Kubernetes version + Go version.
k8s_bin_dir() { echo "${METAX_CACHE_DIR}/k8s/${KUBE_VERSION}-$(go_version)/bin"; }

# shellcheck disable=SC2034 # used by the scripts that source this file
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)

# ---------------------------------------------------------------- output
_ts() { date +%H:%M:%S; }
log() { printf '[%s] %s\n' "$(_ts)" "$*" >&2; }
warn() { printf '[%s] WARNING: %s\n' "$(_ts)" "$*" >&2; }
die() {
  printf '[%s] ERROR: %s\n' "$(_ts)" "$*" >&2
  exit 1
}

# Phase timing: phase_start NAME ... phase_end; phase_report prints all.
PHASE_NAMES=()
PHASE_SECS=()
_PHASE_NAME=""
_PHASE_T0=0
phase_start() {
  phase_end
  _PHASE_NAME=$1
  _PHASE_T0=$(date +%s)
  log "== ${_PHASE_NAME}"
}
phase_end() {
  if [[ -n ${_PHASE_NAME} ]]; then
    PHASE_NAMES+=("${_PHASE_NAME}")
    PHASE_SECS+=($(($(date +%s) - _PHASE_T0)))
    _PHASE_NAME=""
  fi
}
phase_report() {
  phase_end
  local i total=0
  ((${#PHASE_NAMES[@]})) || return 0
  printf '\nPhase timings (%s):\n' "${1:-cluster}" >&2
  for i in "${!PHASE_NAMES[@]}"; do
    printf '  %-38s %5ss\n' "${PHASE_NAMES[$i]}" "${PHASE_SECS[$i]}" >&2
    total=$((total + PHASE_SECS[i]))
  done
  printf '  %-38s %5ss\n' "total" "${total}" >&2
}

# system_deps KIND FILE: the NAMEs of FILE's KIND entries (requirements/system.txt)
system_deps() {
  awk -v kind="$1" '{ sub(/#.*/, "") } $1 == kind && NF >= 2 { print $2 }' "$2"
}

require_root() {
  [[ ${EUID} -eq 0 ]] || die "this must run as root (it starts kubelet/containerd, mounts and writes ${METAX_KUBE_ETC})."
}

# ---------------------------------------------------------------- containers
# podman/buildah/skopeo: project configuration through environment variables
# only (see scripts/cluster/containers/*.conf); global config is untouched.
export CONTAINERS_CONF=${CONTAINERS_CONF:-${CLUSTER_SCRIPTS}/containers/containers.conf}
export CONTAINERS_REGISTRIES_CONF=${CONTAINERS_REGISTRIES_CONF:-${CLUSTER_SCRIPTS}/containers/registries.conf}

# Image names (contract: docs/local-cluster.md).
: "${METAX_REGISTRY:=127.0.0.1:${METAX_REGISTRY_PORT}}"
: "${METAX_REGISTRY_AUTH:=127.0.0.1:${METAX_REGISTRY_AUTH_PORT}}"
: "${METAX_PAUSE_IMAGE:=${METAX_REGISTRY}/metax-gpu/pause:3.10}"
: "${METAX_SCHEDULER_IMAGE:=${METAX_REGISTRY}/metax-gpu/kube-scheduler:${KUBE_VERSION}}"
: "${METAX_BASE_IMAGE:=localhost/metax-gpu/base:bookworm}"
: "${METAX_BASE_SUITE:=bookworm}"
export METAX_REGISTRY METAX_REGISTRY_AUTH METAX_PAUSE_IMAGE METAX_SCHEDULER_IMAGE METAX_BASE_IMAGE

# ---------------------------------------------------------------- python
# The collection is importable as ansible_collections.metax.gpu through the
# symlink tree `make venv` creates; create it when run outside make.
METAX_COLLECTIONS=${REPO_ROOT}/.build/collections
ensure_collection_path() {
  local link=${METAX_COLLECTIONS}/ansible_collections/metax/gpu
  if [[ ! -e ${link} ]]; then
    mkdir -p "$(dirname "${link}")"
    ln -sfn ../../../.. "${link}"
  fi
  case ":${PYTHONPATH:-}:" in
    *":${METAX_COLLECTIONS}:"*) ;;
    *) export PYTHONPATH=${METAX_COLLECTIONS}${PYTHONPATH:+:${PYTHONPATH}} ;;
  esac
}
project_python() {
  if [[ -x ${REPO_ROOT}/.venv/bin/python ]]; then
    echo "${REPO_ROOT}/.venv/bin/python"
  else
    command -v python3
  fi
}

# Port owner, e.g. `users:(("etcd",pid=123,fd=7))`; empty when free.
port_owner() {
  ss -Hltnp "( sport = :$1 )" 2>/dev/null | sed -n 's/.*users:\(.*\)$/\1/p' | head -n1
}
port_in_use() { [[ -n $(ss -Hltn "( sport = :$1 )" 2>/dev/null) ]]; }

# ---------------------------------------------------------------- go builds
# Helm, helm-diff and containerd, pinned like Kubernetes (each must exist on
# the Go module proxy; the proxy is a filtered mirror, list versions first).
: "${HELM_VERSION:=v3.22.0}"
: "${HELM_DIFF_VERSION:=v3.9.14}"
: "${CONTAINERD_VERSION:=v2.4.2}"
# The CDI library the spec tests validate with (build-cdi-validate.sh).
: "${CDI_VERSION:=v1.1.1}"
# kwok: the scale profile's fake-node controller (v0.8.0 is the newest the
# module proxy serves).
: "${KWOK_VERSION:=v0.8.0}"
export HELM_VERSION HELM_DIFF_VERSION CONTAINERD_VERSION CDI_VERSION KWOK_VERSION

# Cache layout (contract: docs/local-cluster.md; other tools look for helm at
# helm_bin_dir/helm).
helm_bin_dir() { echo "${METAX_CACHE_DIR}/helm/${HELM_VERSION}/bin"; }
# A HELM_PLUGINS directory holding only the diff plugin.
helm_plugins_dir() { echo "${METAX_CACHE_DIR}/helm-diff/${HELM_DIFF_VERSION}/plugins"; }
containerd_bin_dir() { echo "${METAX_CACHE_DIR}/containerd/${CONTAINERD_VERSION}/bin"; }
cdi_validate_bin_dir() { echo "${METAX_CACHE_DIR}/cdi-validate/${CDI_VERSION}/bin"; }
kwok_bin_dir() { echo "${METAX_CACHE_DIR}/kwok/${KWOK_VERSION}/bin"; }

# ensure_go: GO is a usable Go, fetching the pinned toolchain when GO is its
# (not yet present) cache path. A GO the caller chose is never replaced.
ensure_go() {
  go_usable "${GO}" && return 0
  [[ ${GO} == "$(go_toolchain_dir)/bin/go" ]] ||
    die "GO=${GO} is not a usable Go >= 1.26 ($("${GO}" env GOVERSION 2>/dev/null || echo 'it does not run')).
  Unset GO to let the scripts fetch ${GO_TOOLCHAIN_VERSION} from the Go module proxy."
  local arch sha proxy=https://proxy.golang.org p url dir tmp
  case $(uname -m) in
    x86_64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "no pinned Go toolchain for $(uname -m): install Go >= 1.26 and set GO=/path/to/go" ;;
  esac
  sha=GO_TOOLCHAIN_SHA256_${arch}
  sha=${!sha}
  # the first HTTP(S) entry of GOPROXY, as the go command would try it (often unset)
  local goproxy=${GOPROXY:-}
  for p in ${goproxy//[,|]/ }; do
    [[ ${p} == http://* || ${p} == https://* ]] && proxy=${p} && break
  done
  url=${proxy%/}/golang.org/toolchain/@v/v0.0.1-${GO_TOOLCHAIN_VERSION}.linux-${arch}.zip
  dir=$(go_toolchain_dir)
  log "no Go >= 1.26 found; fetching ${GO_TOOLCHAIN_VERSION} (linux-${arch}) from ${url}"
  mkdir -p "$(dirname "${dir}")"
  tmp=$(mktemp -d "${dir}.XXXXXX")
  if ! curl -fsSL --retry 3 -o "${tmp}/go.zip" "${url}"; then
    rm -rf "${tmp}"
    die "cannot download ${url}: install Go >= 1.26 and set GO=/path/to/go, or point GOPROXY at a reachable proxy"
  fi
  if [[ $(sha256sum "${tmp}/go.zip" | cut -d' ' -f1) != "${sha}" ]]; then
    rm -rf "${tmp}"
    die "${url}: SHA-256 differs from the pinned GO_TOOLCHAIN_SHA256_${arch}; not using it"
  fi
  # a module zip: every path starts with golang.org/toolchain@<version>/
  python3 - "${tmp}/go.zip" "${tmp}/go" <<'EOP'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        rel = info.filename.split("/", 2)[-1] if "/" in info.filename else ""
        if not rel or info.is_dir() or rel.startswith("/") or ".." in rel.split("/"):
            continue
        dest = os.path.join(sys.argv[2], rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(info) as src, open(dest, "wb") as out:
            out.write(src.read())
        os.chmod(dest, (info.external_attr >> 16) & 0o777 or 0o644)
EOP
  rm -f "${tmp}/go.zip"
  # another script may have fetched it meanwhile
  if ! go_usable "${GO}"; then
    rm -rf "${dir}"
    mv "${tmp}/go" "${dir}"
  fi
  rm -rf "${tmp}"
  go_usable "${GO}" || die "${GO}: the fetched toolchain does not run"
  log "using $("${GO}" env GOVERSION) from ${dir}"
}

# Go environment shared by every build script: one module and build cache.
go_build_env() {
  export GOCACHE=${METAX_CACHE_DIR}/go/build
  export GOMODCACHE=${METAX_CACHE_DIR}/go/mod
  export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
  [[ -n ${HOME:-} ]] || export GOPATH=${METAX_CACHE_DIR}/go/path
  mkdir -p "${METAX_CACHE_DIR}/go"
}

# One Go build at a time on this machine (a build uses every core). Takes the
# lock on fd 9 and keeps it until the calling script exits.
go_build_lock() {
  mkdir -p "${METAX_CACHE_DIR}/k8s"
  exec 9>"${METAX_CACHE_DIR}/k8s/.build.lock"
  if ! flock -n 9; then
    log "another Go build holds ${METAX_CACHE_DIR}/k8s/.build.lock; waiting for it..."
    flock 9
  fi
}

# publish_payload LOCAL REF PUSH SAVE_DIR ARCHIVE: a payload image built as
# LOCAL is pushed to REF (PUSH=1) and, with a SAVE_DIR, written as the
# docker-archive SAVE_DIR/ARCHIVE.tar for the offline bundle (the agent_images
# role's agent_images_payloads). The driver and MACA payload builders share it.
publish_payload() {
  local local_ref=$1 ref=$2 push=$3 save=$4 archive=$5
  if ((push)); then
    podman push --quiet --tls-verify=false "${local_ref}" "docker://${ref}" || die "cannot push ${ref}"
  fi
  if [[ -n ${save} ]]; then
    rm -f "${save}/${archive}.tar"
    podman save --quiet --format docker-archive -o "${save}/${archive}.tar" "${local_ref}" \
      || die "cannot save ${local_ref}"
  fi
}
