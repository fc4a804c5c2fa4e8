#!/usr/bin/env bash
# Debian base image with python3, made without any registry:
#   debootstrap --variant=minbase <suite> <dir> <mirror from apt's sources>
#   tar -C <dir> -c . | podman import - localhost/metax-gpu/base:<suite>
#
# The rootfs tarball is cached under ${METAX_CACHE_DIR}/images keyed by suite,
# package list and ISO week, so reruns only `podman import` (seconds), and
# nothing at all when the image in podman's store already carries that key.
#
# Usage: files/images/base/build.sh            (uses METAX_BASE_IMAGE, METAX_BASE_SUITE)
# Agent images: FROM localhost/metax-gpu/base:bookworm, then
#   python3 -m venv /opt/venv && /opt/venv/bin/pip install ...
# (for HTTPS through the machine's proxy mount the host CA bundle for the
# build: -v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro and set
# PIP_CERT=/run/host-ca.crt; do not bake it into the image).
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/../../../scripts/cluster/lib.sh"

SUITE=${METAX_BASE_SUITE}
IMAGE=${METAX_BASE_IMAGE}
# (METAX_BASE_INCLUDE: scripts/clean-room.sh makes its root with only the README's prerequisites)
INCLUDE=${METAX_BASE_INCLUDE:-python3,python3-venv,ca-certificates}
CACHE=${METAX_CACHE_DIR}/images
mkdir -p "${CACHE}"

# The Debian mirror: METAX_DEBIAN_MIRROR, else the first http(s) URI that apt's
# sources use for the Debian archive (deb822 .sources or one-line lists).
debian_mirror() {
  if [[ -n ${METAX_DEBIAN_MIRROR:-} ]]; then
    echo "${METAX_DEBIAN_MIRROR}"
    return
  fi
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f ${f} ]] || continue
    uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) {print $i; exit}}' "${f}")
    [[ -n ${uri} ]] && { echo "${uri%/}"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f ${f} ]] || continue
    uri=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) {print $i; exit}}' "${f}")
    [[ -n ${uri} ]] && { echo "${uri%/}"; return; }
  done
  echo "http://deb.debian.org/debian"
}

include_key="${SUITE}-$(echo "${INCLUDE}" | sha256sum | cut -c1-8)"
key="${include_key}-$(date +%G-W%V)"
tarball=${CACHE}/debootstrap-${key}.tar

# Already in podman's store with this rootfs?
current=$(podman image inspect --format '{{ index .Labels "org.metax-gpu.rootfs" }}' "${IMAGE}" 2>/dev/null || true)
if [[ ${current} == "${key}" ]]; then
  log "base image ${IMAGE} is current (${key})"
  exit 0
fi

if [[ ! -s ${tarball} ]]; then
  command -v debootstrap >/dev/null || die "debootstrap is missing: run scripts/cluster/packages.sh (or apt-get install debootstrap)"
  mirror=$(debian_mirror)
  work=$(mktemp -d "${CACHE}/rootfs.XXXXXX")
  trap 'rm -rf "${work}"' EXIT
  log "debootstrap ${SUITE} (minbase + ${INCLUDE}) from ${mirror}"
  if ! debootstrap --variant=minbase --include="${INCLUDE}" "${SUITE}" "${work}/root" "${mirror}" \
    >"${work}/debootstrap.log" 2>&1; then
    tail -n 20 "${work}/debootstrap.log" >&2
    [[ -f ${work}/root/debootstrap/debootstrap.log ]] && tail -n 20 "${work}/root/debootstrap/debootstrap.log" >&2
    die "debootstrap failed (mirror ${mirror}). Set METAX_DEBIAN_MIRROR to a reachable Debian mirror."
  fi
  # Smaller image: no package caches or lists (run apt-get update before installing).
  rm -rf "${work}"/root/var/cache/apt/archives/*.deb "${work}"/root/var/lib/apt/lists/* \
    "${work}"/root/var/log/* "${work}"/root/debootstrap
  tar --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -C "${work}/root" -cf "${tarball}.partial" .
  mv "${tarball}.partial" "${tarball}"
  # Older weeks' tarballs of the same package list are superseded.
  find "${CACHE}" -maxdepth 1 -name "debootstrap-${include_key}-*.tar" ! -name "$(basename "${tarball}")" -delete
  log "rootfs cached: ${tarball} ($(du -h "${tarball}" | cut -f1))"
fi

log "podman import ${tarball} -> ${IMAGE}"
podman import --quiet \
  --change 'CMD ["/bin/bash"]' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "LABEL org.metax-gpu.rootfs=${key}" \
  --message "debootstrap ${SUITE} minbase + ${INCLUDE}" \
  "${tarball}" "${IMAGE}" >/dev/null
log "base image ${IMAGE} ready"
