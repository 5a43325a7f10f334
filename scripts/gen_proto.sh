#!/usr/bin/env bash
# Regenerates src/atoll/wire/atoll_pb2*.py from atoll.proto. CI runs it and fails on any diff.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -Isrc --python_out=src --grpc_python_out=src src/atoll/wire/atoll.proto
