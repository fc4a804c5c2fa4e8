#!/usr/bin/env bash
# Build the driver payload image driver-image:<version> from the project's own
# files (no download): the simulated driver packages of that version, as the
# driver module's tests and the driver_packages Molecule scenario make them
# (sim.pkgtool.make_package: metax-driver_<v>_amd64.deb, metax-driver-<v>-1.x86_64.rpm,
# metax-driver-<v>-x86_64.run), and push it to the local registry.
#
# Usage: files/images/driver-payload/build.sh VERSION [--no-push] [--save DIR]
#        --save DIR also writes the image as the docker-archive DIR/driver-image-VERSION.tar,
#        for the offline bundle (the agent_images role's agent_images_payloads).
# Prints: driver-image=REGISTRY/metax-gpu/driver-image:VERSION (stdout).
# Environment: METAX_REGISTRY, METAX_AGENT_REPO_PREFIX, METAX_BASE_IMAGE (scripts/cluster/lib.sh);
# METAX_PAYLOAD_BROKEN: package kinds (e.g. "deb") whose driver loads but never
# comes up (sim.pkgtool's broken package), for the rolling upgrade's rollback tests.
# METAX_PAYLOAD_DRIVER_VERSION: the kernel driver the payload installs, when it is not VERSION
# (MetaX's payload 2.29.0.13 installs 2.12.13): declared in /payload/metax-driver.version.
# METAX_PAYLOAD_LAYOUTS: the layouts in the image (default "deb rpm run"; "prebuilt" makes
# /payload the tree MetaX's own driver image ships: lib/modules/<release>/.../metax.ko, usr/bin/mx-smi).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/lib.sh
source "${HERE}/../../../scripts/cluster/lib.sh"

VERSION=${1:-}
[[ ${VERSION} =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "usage: $0 VERSION [--no-push] [--save DIR]  (VERSION like 2.14.3)"
shift
push=1
save=""
while (($#)); do
  case $1 in
    --no-push) push=0 ;;
    --save) save=${2:-} && shift && [[ -d ${save} ]] || die "--save needs an existing directory" ;;
    *) die "usage: $0 VERSION [--no-push] [--save DIR]" ;;
  esac
  shift
done
PREFIX=${METAX_AGENT_REPO_PREFIX:-${METAX_REGISTRY}/metax-gpu}
LOCAL=localhost/metax-gpu/driver-image:${VERSION}
REF=${PREFIX}/driver-image:${VERSION}

if ! podman image exists "${METAX_BASE_IMAGE}"; then
  "${REPO_ROOT}/files/images/base/build.sh" >&2
fi
ctx=$(mktemp -d)
trap 'rm -rf "${ctx}"' EXIT
cp "${HERE}/Containerfile" "${ctx}/Containerfile"
# the packages, one directory per kind, written by the collection's own code
PYTHONPATH="${REPO_ROOT}/.build/collections" python3 - "${ctx}/payload" "${VERSION}" "${METAX_PAYLOAD_BROKEN:-}" \
  "${METAX_PAYLOAD_DRIVER_VERSION:-}" "${METAX_PAYLOAD_LAYOUTS:-deb rpm run}" <<'PY'
import sys

from ansible_collections.metax.gpu.plugins.module_utils.sim import pkgtool

root, version, broken, driver, layouts = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4], sys.argv[5].split()
pkgtool.make_payload(root, version, driver or None, layouts=layouts, broken=broken)
PY
nice podman build --quiet --layers --build-arg "BASE=${METAX_BASE_IMAGE}" --build-arg "VERSION=${VERSION}" \
  -t "${LOCAL}" "${ctx}" >/dev/null || die "podman build of ${LOCAL} failed"
publish_payload "${LOCAL}" "${REF}" "${push}" "${save}" "driver-image-${VERSION}"
echo "driver-image=${REF}"
