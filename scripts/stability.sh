#!/usr/bin/env bash
# The timing-sensitive tests, run again and again under load (issue 34): each run must pass.
#
#   scripts/stability.sh [RUNS] [TEST ...]
#
# Starts two busy loops (one per core on the 2-core reference machine) for the whole run, then
# runs the tests RUNS times in a row (default 20), stopping at the first failing run. Prints one
# line per run and a summary; exit 0 only when every run passed. Logs: build/stability/run-N.log.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-20}
shift || true
TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
  TESTS=(tests/integration/federation/test_revocation.py tests/security/test_hostile_peers.py
         tests/unit/fl/test_dropout.py)
fi
PY=${PY:-.venv/bin/python}
LOGS=build/stability
mkdir -p "$LOGS"
LOOPS=()
stop_loops() { for p in "${LOOPS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_loops EXIT
for _ in 1 2; do
  sh -c 'while :; do :; done' &
  LOOPS+=($!)
done
echo "[stability] ${RUNS} runs of ${TESTS[*]} under ${#LOOPS[@]} busy loops ($(nproc) cores)"
start=$(date +%s)
for i in $(seq 1 "$RUNS"); do
  t0=$(date +%s)
  if CI=${CI:-true} "$PY" -m pytest -q -p no:randomly -p no:cacheprovider "${TESTS[@]}" \
      >"$LOGS/run-$i.log" 2>&1; then
    echo "[stability] run $i/$RUNS passed in $(( $(date +%s) - t0 )) s: $(tail -n1 "$LOGS/run-$i.log")"
  else
    echo "[stability] run $i/$RUNS FAILED in $(( $(date +%s) - t0 )) s; log: $LOGS/run-$i.log"
    grep -E '^(FAILED|ERROR)' "$LOGS/run-$i.log" || tail -n 20 "$LOGS/run-$i.log"
    exit 1
  fi
done
echo "[stability] all $RUNS runs passed in $(( $(date +%s) - start )) s"
