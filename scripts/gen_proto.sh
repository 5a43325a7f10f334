#!/usr/bin/env bash
# Regenerates src/atoll/wire/atoll_pb2.py from atoll.proto. atoll does not load it at run time
# (wire/messages.py and wire/rpc.py speak the proto themselves); tests check both against it.
# With --check: regenerates into a scratch folder and fails if the committed code differs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ "${1:-}" = "--check" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/atoll/wire" && cp src/atoll/wire/atoll.proto "$tmp/atoll/wire/"
  "$PY" -m grpc_tools.protoc -I"$tmp" --python_out="$tmp" "$tmp/atoll/wire/atoll.proto"
  for f in atoll_pb2.py; do
    if ! diff -u "src/atoll/wire/$f" "$tmp/atoll/wire/$f"; then
      echo "generated protobuf code is stale: run 'make proto' and commit the result" >&2
      exit 1
    fi
  done
  echo "protobuf code is up to date"
else
  "$PY" -m grpc_tools.protoc -Isrc --python_out=src src/atoll/wire/atoll.proto
fi
