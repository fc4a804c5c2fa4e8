#!/usr/bin/env bash
# Regenerate the Python stubs of the kubelet APIs (api/*_pb2.py, api/*_pb2_grpc.py)
# from api/*.proto with grpcio-tools (requirements/test.txt); see gen_protos.py.
#
#   plugins/module_utils/deviceplugin/gen_protos.sh          rewrite the stubs
#   plugins/module_utils/deviceplugin/gen_protos.sh --check  exit 1 when the
#                                                            committed stubs are stale
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "${HERE}/../../.." && pwd)
PYTHON=${PYTHON:-}
if [[ -z ${PYTHON} ]]; then
  if [[ -x ${REPO}/.venv/bin/python ]]; then PYTHON=${REPO}/.venv/bin/python; else PYTHON=python3; fi
fi
# run the file directly: the generator needs nothing from the collection
exec "${PYTHON}" "${HERE}/gen_protos.py" "$@"
