#!/usr/bin/env bash
# The `venv` phase: the checkout's .venv, made from PYTHON with requirements/test.txt
# (and the files it includes).
#
# The venv itself lives in the build cache, under a key of what makes it: the
# interpreter (its resolved path and version), the requirements files and the ISO
# week (the requirements give ranges, so a venv is made again from PyPI once a
# week, as the base image is). The checkout's .venv is a link to it. A fresh clone
# on a machine that made this venv before links it in under a second instead of
# installing about 1 GB of packages (100 s measured); a machine without it makes it
# as before. Nothing depends on the cache: a missing or half-made venv is made again
# (the stamp `.complete` is written last). The four venvs used last are kept.
#
# Usage: PYTHON=/usr/bin/python3.11 VENV=.venv scripts/venv.sh
set -euo pipefail
# shellcheck source=scripts/cluster/lib.sh
source "$(dirname "$0")/cluster/lib.sh"
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-${REPO_ROOT}/.venv}
KEEP=4
REQUIREMENTS=(agents controller node test)

command -v "${PYTHON}" >/dev/null || die "venv: ${PYTHON} not found (PYTHON= chooses another python3.11)"
key=$({
  readlink -f "$(command -v "${PYTHON}")"
  "${PYTHON}" -c 'import sys; print(sys.version)'
  date -u +%G-W%V
  for name in "${REQUIREMENTS[@]}"; do cat "${REPO_ROOT}/requirements/${name}.txt"; done
} | sha256sum | cut -c1-16)
store=${METAX_CACHE_DIR}/venv
dir=${store}/${key}
mkdir -p "${store}"
exec 9>"${store}/.lock"
flock 9   # another checkout making the same venv: wait for it, then use it

if [[ ! -f ${dir}/.complete ]]; then
  log "venv: making ${dir} from ${PYTHON} and requirements/test.txt"
  rm -rf "${dir}"
  "${PYTHON}" -m venv "${dir}"
  "${dir}/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
  "${dir}/bin/pip" install --quiet --disable-pip-version-check -r "${REPO_ROOT}/requirements/test.txt"
fi
touch "${dir}/.complete"   # made, and used now (the pruning below keeps the newest)

# the checkout's link; a venv directory an older checkout made in place goes
if [[ -e ${VENV} && ! -L ${VENV} ]]; then
  rm -rf "${VENV}"
fi
ln -sfn "${dir}" "${VENV}"

# keep the venvs used last; a checkout whose venv went makes it again at its next `make venv`
mapfile -t old < <(find "${store}" -mindepth 2 -maxdepth 2 -name .complete -printf '%T@ %h\n' \
  | sort -rn | tail -n +$((KEEP + 1)) | cut -d' ' -f2-)
for stale in "${old[@]}"; do
  [[ ${stale} == "${dir}" ]] || rm -rf "${stale}"
done
