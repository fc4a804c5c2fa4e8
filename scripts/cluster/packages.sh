#!/usr/bin/env bash
# Install the Debian packages of requirements/system.txt (the project's one
# dependency list: the `deb` entries) when missing, after `apt-get update`.
# Does nothing when all are present. Services shipped by those packages are NOT started (policy-rc.d):
# the cluster runs its own instances on its own ports and state dirs.
#
# Usage: packages.sh [--check]   (--check: list what is missing, exit 1 if any)
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

# (The list path is overridable for tests/unit/scripts/ only.)
mapfile -t PACKAGES < <(system_deps deb "${METAX_SYSTEM_DEPS:-${REPO_ROOT}/requirements/system.txt}")
((${#PACKAGES[@]})) || die "no deb entries in ${METAX_SYSTEM_DEPS:-${REPO_ROOT}/requirements/system.txt}"

# one dpkg-query for the whole list (a package dpkg never heard of prints nothing)
declare -A state=()
while read -r name status; do
  state[${name%%:*}]=${status}
done < <(dpkg-query -W -f='${binary:Package} ${db:Status-Status}\n' "${PACKAGES[@]}" 2>/dev/null || true)
missing=()
for p in "${PACKAGES[@]}"; do
  [[ ${state[${p}]:-} == installed ]] || missing+=("${p}")
done

if ((${#missing[@]} == 0)); then
  log "Debian packages: all present."
  exit 0
fi
if [[ ${1:-} == --check ]]; then
  echo "missing Debian packages: ${missing[*]}"
  exit 1
fi

[[ ${EUID} -eq 0 ]] || die "missing Debian packages: ${missing[*]}
  Run as root, or install them: apt-get update && apt-get install -y ${missing[*]}"

log "installing Debian packages: ${missing[*]}"
# Keep package maintainer scripts from starting etcd, containerd or
# docker-registry services on the ports the cluster uses. Many images ship
# their own policy-rc.d: it is left as it is. (The path is overridable for
# tests/unit/scripts/test_packages_sh.py only.)
POLICY_RC_D=${METAX_POLICY_RC_D:-/usr/sbin/policy-rc.d}
created_policy=0
if [[ ! -e ${POLICY_RC_D} ]]; then
  printf '#!/bin/sh\nexit 101\n' >"${POLICY_RC_D}"
  chmod 755 "${POLICY_RC_D}"
  created_policy=1
fi
# An EXIT trap's last status becomes the script's: never end on a false test.
cleanup() {
  if ((created_policy)); then rm -f "${POLICY_RC_D}"; fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq; then
  die "apt-get update failed: no access to the Debian mirror? Fix apt sources/network, or install by hand:
  apt-get install -y ${missing[*]}"
fi
if ! apt-get install -y -qq "${missing[@]}" >"${TMPDIR:-/tmp}/metax-apt.log" 2>&1; then
  tail -n 30 "${TMPDIR:-/tmp}/metax-apt.log" >&2
  die "apt-get install failed (full log: ${TMPDIR:-/tmp}/metax-apt.log). Install by hand:
  apt-get install -y ${missing[*]}"
fi
log "Debian packages installed: ${missing[*]}"
