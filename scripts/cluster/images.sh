#!/usr/bin/env bash
# Images of the local cluster, all built here (nothing is pulled from the
# internet), cached under ${METAX_CACHE_DIR}/images:
#   pause      static C binary (files/images/pause/pause.c) wrapped as an OCI
#              image by scripts/cluster/oci_image.py   -> ${METAX_PAUSE_IMAGE}
#   scheduler  FROM scratch + the kube-scheduler binary (podman build of
#              files/images/kube-scheduler/Containerfile) -> ${METAX_SCHEDULER_IMAGE}
#   base       Debian + python3 by debootstrap + podman import
#              (files/images/base/build.sh)                 -> ${METAX_BASE_IMAGE}
#
# Usage: images.sh build              build what is missing (no registry needed)
#        images.sh push               push pause, scheduler and base to ${METAX_REGISTRY}
#        images.sh archive pause|scheduler   print the OCI archive path (after build)
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

CACHE=${METAX_CACHE_DIR}/images
mkdir -p "${CACHE}"
PAUSE_SRC=${REPO_ROOT}/files/images/pause/pause.c
SCHED_CTX=${REPO_ROOT}/files/images/kube-scheduler

pause_archive() {
  local key
  key=$( (cat "${PAUSE_SRC}" "${CLUSTER_SCRIPTS}/oci_image.py" && echo "${METAX_PAUSE_IMAGE}") | sha256sum | cut -c1-12)
  echo "${CACHE}/pause-${key}.oci.tar"
}

scheduler_binary() { echo "$(k8s_bin_dir)/kube-scheduler"; }
scheduler_archive() {
  local sum
  sum=$(sha256sum "$(scheduler_binary)" | cut -c1-12)
  echo "${CACHE}/kube-scheduler-${KUBE_VERSION}-${sum}.oci.tar"
}

build_pause() {
  local out tmp
  out=$(pause_archive)
  if [[ -s ${out} ]]; then
    log "pause image cached: ${out}"
    return
  fi
  command -v gcc >/dev/null || die "gcc is missing (needed for the pause binary): run scripts/cluster/packages.sh"
  tmp=$(mktemp -d)
  gcc -static -Os -Wall -o "${tmp}/pause" "${PAUSE_SRC}" ||
    die "cannot build a static pause binary (is libc6-dev installed? run scripts/cluster/packages.sh)"
  strip "${tmp}/pause" 2>/dev/null || true
  python3 "${CLUSTER_SCRIPTS}/oci_image.py" --ref "${METAX_PAUSE_IMAGE}" --out "${out}" \
    --entrypoint /pause --file "${tmp}/pause:/pause:0755" \
    --label "org.opencontainers.image.title=pause" >/dev/null
  rm -rf "${tmp}"
  find "${CACHE}" -maxdepth 1 -name 'pause-*.oci.tar' ! -name "$(basename "${out}")" -delete
  log "pause image built: ${out}"
}

build_scheduler() {
  local bin out sum current ctx
  bin=$(scheduler_binary)
  [[ -x ${bin} ]] || die "${bin} is missing: run scripts/cluster/build-k8s.sh first"
  out=$(scheduler_archive)
  sum=$(sha256sum "${bin}" | cut -c1-12)
  current=$(podman image inspect --format '{{ index .Labels "org.metax-gpu.binary" }}' \
    "${METAX_SCHEDULER_IMAGE}" 2>/dev/null || true)
  if [[ ${current} != "${sum}" ]]; then
    ctx=$(mktemp -d)
    cp "${bin}" "${ctx}/kube-scheduler"
    log "podman build ${METAX_SCHEDULER_IMAGE}"
    podman build --quiet --layers=false --network host -f "${SCHED_CTX}/Containerfile" \
      --build-arg "KUBE_VERSION=${KUBE_VERSION}" --label "org.metax-gpu.binary=${sum}" \
      -t "${METAX_SCHEDULER_IMAGE}" "${ctx}" >/dev/null ||
      die "podman build of the kube-scheduler image failed"
    rm -rf "${ctx}"
    rm -f "${out}"
  fi
  if [[ ! -s ${out} ]]; then
    podman save --quiet --format oci-archive -o "${out}.partial" "${METAX_SCHEDULER_IMAGE}"
    mv "${out}.partial" "${out}"
    find "${CACHE}" -maxdepth 1 -name 'kube-scheduler-*.oci.tar' ! -name "$(basename "${out}")" -delete
  fi
  log "kube-scheduler image ready: ${METAX_SCHEDULER_IMAGE}"
}

push_all() {
  local reg_base=${METAX_REGISTRY}/metax-gpu/base:${METAX_BASE_SUITE}
  curl -fsS "http://${METAX_REGISTRY}/v2/" >/dev/null ||
    die "registry ${METAX_REGISTRY} is not answering: run scripts/cluster/cluster.sh up"
  skopeo copy --quiet --dest-tls-verify=false "oci-archive:$(pause_archive)" "docker://${METAX_PAUSE_IMAGE}"
  podman push --quiet --tls-verify=false "${METAX_SCHEDULER_IMAGE}"
  podman push --quiet --tls-verify=false "${METAX_BASE_IMAGE}" "docker://${reg_base}"
  log "pushed ${METAX_PAUSE_IMAGE}, ${METAX_SCHEDULER_IMAGE}, ${reg_base}"
}

case ${1:-} in
  build)
    build_pause
    "${REPO_ROOT}/files/images/base/build.sh"
    build_scheduler
    ;;
  pause) build_pause ;;
  base) "${REPO_ROOT}/files/images/base/build.sh" ;;
  scheduler) build_scheduler ;;
  push) push_all ;;
  archive)
    case ${2:-} in
      pause) pause_archive ;;
      scheduler) scheduler_archive ;;
      *) die "usage: $0 archive pause|scheduler" ;;
    esac
    ;;
  *) die "usage: $0 build|pause|base|scheduler|push|archive NAME" ;;
esac
