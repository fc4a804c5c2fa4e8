#!/usr/bin/env bash
# Images of molecule/driver_packages (run as its `dependency` step), built
# locally; nothing is pulled:
#   deb node  ${METAX_BASE_IMAGE} itself (Debian + python3, made by
#             files/images/base/build.sh through scripts/cluster/images.sh)
#   rpm node  FROM that base + Debian's rpm, dpkg off PATH (Containerfile.rpm-node)
#             -> ${METAX_MOLECULE_RPM_IMAGE}
# The rpm image is rebuilt only when its Containerfile or the base changes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/lib.sh
source "${HERE}/../../scripts/cluster/lib.sh"
: "${METAX_MOLECULE_RPM_IMAGE:=localhost/metax-gpu/molecule-rpm-node:bookworm}"

command -v podman >/dev/null || die "podman is missing: run scripts/cluster/packages.sh"
"${REPO_ROOT}/scripts/cluster/images.sh" base

base_id=$(podman image inspect --format '{{.Id}}' "${METAX_BASE_IMAGE}")
key=$( (cat "${HERE}/Containerfile.rpm-node" && echo "${base_id}") | sha256sum | cut -c1-12)
current=$(podman image inspect --format '{{ index .Labels "org.metax-gpu.key" }}' \
  "${METAX_MOLECULE_RPM_IMAGE}" 2>/dev/null || true)
if [[ ${current} == "${key}" ]]; then
  log "rpm node image ${METAX_MOLECULE_RPM_IMAGE} is current (${key})"
  exit 0
fi
ca=()
[[ -s /etc/ssl/certs/ca-certificates.crt ]] && ca=(-v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro)
log "podman build ${METAX_MOLECULE_RPM_IMAGE}"
podman build --quiet --layers=false --network host "${ca[@]}" \
  --build-arg "BASE=${METAX_BASE_IMAGE}" --label "org.metax-gpu.key=${key}" \
  -f "${HERE}/Containerfile.rpm-node" -t "${METAX_MOLECULE_RPM_IMAGE}" "${HERE}" >/dev/null ||
  die "podman build of ${METAX_MOLECULE_RPM_IMAGE} failed (is the Debian mirror reachable?)"
log "rpm node image ${METAX_MOLECULE_RPM_IMAGE} ready"
