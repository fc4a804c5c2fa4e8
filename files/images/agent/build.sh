#!/usr/bin/env bash
# Build the metax.gpu agent images (one Containerfile stage each over shared
# layers) and push them to the local registry, tagged with a hash of their
# build context and the base image ID. Which images there are and what the
# context holds is context.py's, beside this file (the agent_images role reads
# it too). Nothing is built or pushed when the registry already has that tag.
#
# Usage: files/images/agent/build.sh [--force] [--no-push]
#        files/images/agent/build.sh --print     the references, without building
# Prints one line per image: NAME=REGISTRY/metax-gpu/NAME:TAG (stdout).
# Environment: METAX_REGISTRY (default 127.0.0.1:5000), METAX_AGENT_REPO_PREFIX
# (default ${METAX_REGISTRY}/metax-gpu), METAX_BASE_IMAGE (scripts/cluster/lib.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/lib.sh
source "${HERE}/../../../scripts/cluster/lib.sh"

PYTHON=$(project_python)
CONTEXT=(nice "${PYTHON}" "${HERE}/context.py" --root "${REPO_ROOT}")
mapfile -t NAMES < <("${CONTEXT[@]}" names)
((${#NAMES[@]})) || die "context.py names printed no image"
HELM_BIN=$(helm_bin_dir)/helm
PREFIX=${METAX_AGENT_REPO_PREFIX:-${METAX_REGISTRY}/metax-gpu}
LOCAL=localhost/metax-gpu
CA_BUNDLE=${METAX_HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

force=0 push=1 print_only=0
for arg in "$@"; do
  case ${arg} in
    --force) force=1 ;;
    --no-push) push=0 ;;
    --print) print_only=1 ;;
    *) die "usage: $0 [--force] [--no-push] | --print" ;;
  esac
done

ensure_base() {
  if ! podman image exists "${METAX_BASE_IMAGE}"; then
    log "base image ${METAX_BASE_IMAGE} missing: building it"
    "${REPO_ROOT}/files/images/base/build.sh" >&2
  fi
}

content_tag() {
  local base_id
  base_id=$(podman image inspect --format '{{.Id}}' "${METAX_BASE_IMAGE}" 2>/dev/null || echo "no-base")
  "${CONTEXT[@]}" tag --helm "${HELM_BIN}" --base-id "${base_id}"
}

in_registry() { skopeo inspect --tls-verify=false --raw "docker://$1" >/dev/null 2>&1; }

print_refs() {
  local name
  for name in "${NAMES[@]}"; do echo "${name}=${PREFIX}/${name}:$1"; done
}

main() {
  ensure_base
  [[ -x ${HELM_BIN} ]] || die "${HELM_BIN} is missing (the operator-controller image carries it): run scripts/deps.sh"
  local tag
  tag=$(content_tag)
  if ((print_only)); then
    print_refs "${tag}"
    return
  fi
  mkdir -p "${METAX_CACHE_DIR}"
  exec 9>"${METAX_CACHE_DIR}/agent-image.lock"
  flock 9
  local missing=0 name
  for name in "${NAMES[@]}"; do
    if ((!push)) || ((force)) || ! in_registry "${PREFIX}/${name}:${tag}"; then missing=1; fi
  done
  if ((!missing)); then
    log "agent image ${tag} is in ${METAX_REGISTRY} already"
    print_refs "${tag}"
    return
  fi
  local version
  version=$(awk '$1 == "version:" {print $2; exit}' "${REPO_ROOT}/galaxy.yml")
  if ((force)) || ! podman image exists "${LOCAL}/operator-controller:${tag}"; then
    local ctx
    ctx=$(mktemp -d)
    trap 'rm -rf "${ctx}"' RETURN
    "${CONTEXT[@]}" assemble --helm "${HELM_BIN}" "${ctx}"
    local mount=()
    [[ -s ${CA_BUNDLE} ]] && mount=(-v "${CA_BUNDLE}:/run/host-ca.crt:ro")
    for name in "${NAMES[@]}"; do
      log "podman build --target ${name} ${LOCAL}/${name}:${tag}"
      nice podman build --quiet --layers --network host "${mount[@]}" --target "${name}" \
        --build-arg "BASE=${METAX_BASE_IMAGE}" --build-arg "CONTENT=${tag}" --build-arg "VERSION=${version}" \
        -f "${ctx}/Containerfile" -t "${LOCAL}/${name}:${tag}" "${ctx}" >/dev/null ||
        die "podman build of the ${name} image failed"
      # keep only the current local tag
      podman images --format '{{.Repository}}:{{.Tag}}' "${LOCAL}/${name}" | grep -vxF "${LOCAL}/${name}:${tag}" |
        xargs -r podman rmi --force >/dev/null 2>&1 || true
    done
  fi
  if ((push)); then
    curl -fsS --max-time 5 "http://${METAX_REGISTRY}/v2/" >/dev/null ||
      die "registry ${METAX_REGISTRY} is not answering: run scripts/cluster/cluster.sh up"
    for name in "${NAMES[@]}"; do
      podman push --quiet --tls-verify=false "${LOCAL}/${name}:${tag}" "docker://${PREFIX}/${name}:${tag}" ||
        die "cannot push ${PREFIX}/${name}:${tag}"
    done
    log "pushed ${PREFIX}/{$(IFS=,; echo "${NAMES[*]}")}:${tag}"
  fi
  print_refs "${tag}"
}

main
