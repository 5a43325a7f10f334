#!/usr/bin/env bash
# Creates the peers' own virtual environments for the side-by-side benchmark (issue 9):
#   bench/.venvs/flare  -> nvflare==2.9.0 + numpy + tensorboard (its recipes' TensorBoard
#                          tracking, which tests/compat/test_flare_peer.py exports and simulates)
#   bench/.venvs/flower -> flwr==1.42.0 + numpy
# Never touches atoll's .venv. Idempotent: a venv that already has the pinned version is kept.
# Usage: bench/compare/setup_peers.sh [flare] [flower]   (default: both)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENVS="$ROOT/bench/.venvs"
PYTHON="${PEER_PYTHON:-python3.11}"
NVFLARE_VERSION="2.9.0"
FLWR_VERSION="1.42.0"

command -v "$PYTHON" >/dev/null || { echo "setup_peers: $PYTHON not found (set PEER_PYTHON)" >&2; exit 2; }
mkdir -p "$VENVS"

quiet_pip() { grep -v "is ignored: it is neither a file nor a directory" || true; }

# install_peer NAME DIST VERSION IMPORT_CHECK [EXTRA_PACKAGE...]
install_peer() {
    local name="$1" dist="$2" version="$3" check="$4"
    shift 4
    local extra=("$@")
    local venv="$VENVS/$name"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
        echo "setup_peers: $name already has $dist==$version ($venv)"
        return 0
    fi
    echo "setup_peers: creating $venv with $dist==$version"
    local start=$SECONDS
    "$PYTHON" -m venv "$venv"
    # The machine's pip config lists local indexes that may be absent: hide that noise only.
    nice -n 10 "$venv/bin/python" -m pip install --quiet --upgrade pip 2>&1 | quiet_pip
    nice -n 10 "$venv/bin/python" -m pip install --quiet "$dist==$version" numpy "${extra[@]}" 2>&1 | quiet_pip
    "$venv/bin/python" -c "$check" || { echo "setup_peers: $dist==$version did not import" >&2; exit 1; }
    echo "setup_peers: $name ready in $((SECONDS - start)) s, $(du -sh "$venv" | cut -f1)"
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(flare flower)
for t in "${targets[@]}"; do
    case "$t" in
        flare) install_peer flare nvflare "$NVFLARE_VERSION" \
            "import importlib.metadata as m, sys, tensorboard; sys.exit(m.version('nvflare') != '$NVFLARE_VERSION')" \
            tensorboard ;;
        flower) install_peer flower flwr "$FLWR_VERSION" \
            "import importlib.metadata as m, sys; sys.exit(m.version('flwr') != '$FLWR_VERSION')" ;;
        *) echo "setup_peers: unknown peer '$t' (use flare, flower)" >&2; exit 2 ;;
    esac
done
