#!/usr/bin/env bash
# The whole suite: start the real backends (Docker Engine, Slurm, Kubernetes) with the project's
# own scripts, run pytest, stop the backends. A backend that cannot start is reported here; its
# tests then fail under CI=true (their fixtures check it) and are skipped elsewhere.
set -uo pipefail
cd "$(dirname "$0")/.."
BACKENDS=${ATOLL_BACKENDS-"docker slurm k8s"}
started=()
stop_backends() {
  for b in "${started[@]}"; do
    echo "== stopping $b"
    scripts/backends/$b.sh down >/dev/null 2>&1 || echo "warning: $b did not stop cleanly" >&2
  done
}
trap stop_backends EXIT
for b in $BACKENDS; do
  [ -x "scripts/backends/$b.sh" ] || continue
  echo "== starting $b ($(date +%T))"
  if scripts/backends/$b.sh up; then
    started+=("$b")
  else
    echo "error: the $b backend did not start; its tests will fail under CI=true" >&2
  fi
done
# FLARE 2.9 in its own venv: the FLARE-jobs suite exports its jobs with FLARE's recipes
# (tests/compat/test_flare_peer.py)
echo "== FLARE 2.9 for the FLARE-jobs suite ($(date +%T))"
bash bench/compare/setup_peers.sh flare || echo "error: FLARE 2.9 did not install; tests/compat/test_flare_peer.py will fail under CI=true" >&2
# Debian's headless Chromium for the dashboard's browser tests
echo "== chromium for the dashboard's browser tests ($(date +%T))"
scripts/chromium.sh || echo "error: chromium did not install; tests/integration/federation/test_dashboard.py will fail under CI=true" >&2
echo "== running the suite ($(date +%T))"
.venv/bin/pytest -q -ra --durations=15 "$@"
