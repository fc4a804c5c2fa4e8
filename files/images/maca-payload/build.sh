#!/usr/bin/env bash
# Build the MXMACA payload images maca-<product>:<version> from the project's
# own files (no download): the simulated MXMACA tree of that version
# (sim.maca.write_tree: bin/, lib/, mxgpu_llvm/, Version.txt and the marker
# library, plus the product it is for), one image per product, and push them
# to the local registry.
#
# Usage: files/images/maca-payload/build.sh VERSION [PRODUCT...] [--no-push] [--save DIR]
#        (PRODUCT like c500, n100; default: c500 n100). --save DIR also writes each
#        image as the docker-archive DIR/maca-<product>-VERSION.tar, for the offline
#        bundle (the agent_images role's agent_images_payloads).
# Prints one line per image: maca-<product>=REGISTRY/metax-gpu/maca-<product>:VERSION (stdout).
# Environment: METAX_REGISTRY, METAX_AGENT_REPO_PREFIX (scripts/cluster/lib.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cluster/lib.sh
source "${HERE}/../../../scripts/cluster/lib.sh"

VERSION=${1:-}
[[ ${VERSION} =~ ^[0-9]+(\.[0-9]+){1,3}$ ]] || die "usage: $0 VERSION [PRODUCT...] [--no-push]  (VERSION like 2.18.0.3)"
shift
push=1
save=""
products=()
while (($#)); do
  case $1 in
    --no-push) push=0 ;;
    --save) save=${2:-} && shift && [[ -d ${save} ]] || die "--save needs an existing directory" ;;
    [a-z][0-9][0-9][0-9]) products+=("$1") ;;
    *) die "usage: $0 VERSION [PRODUCT...] [--no-push] [--save DIR]  (PRODUCT like c500)" ;;
  esac
  shift
done
((${#products[@]})) || products=(c500 n100)
PREFIX=${METAX_AGENT_REPO_PREFIX:-${METAX_REGISTRY}/metax-gpu}

ctx=$(mktemp -d)
trap 'rm -rf "${ctx}"' EXIT
cp "${HERE}/Containerfile" "${ctx}/Containerfile"
for product in "${products[@]}"; do
  rm -rf "${ctx}/opt"
  # the tree, written by the collection's own simulator
  PYTHONPATH="${REPO_ROOT}/.build/collections" python3 - "${ctx}/opt/maca" "${VERSION}" "${product}" <<'PY'
import sys

from ansible_collections.metax.gpu.plugins.module_utils.sim import maca

maca.write_tree(sys.argv[1], sys.argv[2], product=sys.argv[3].upper())
PY
  local_ref=localhost/metax-gpu/maca-${product}:${VERSION}
  ref=${PREFIX}/maca-${product}:${VERSION}
  nice podman build --quiet --layers --build-arg "VERSION=${VERSION}" --build-arg "PRODUCT=${product}" \
    -t "${local_ref}" "${ctx}" >/dev/null || die "podman build of ${local_ref} failed"
  publish_payload "${local_ref}" "${ref}" "${push}" "${save}" "maca-${product}-${VERSION}"
  echo "maca-${product}=${ref}"
done
