#!/usr/bin/env bash
# Debian's chromium and chromium-driver for the dashboard's browser tests
# (tests/integration/federation/test_dashboard.py): installed once, a no-op when present.
set -euo pipefail
die() { echo "chromium.sh: $*" >&2; exit 1; }
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
[[ $(id -u) == 0 ]] || die "chromium or chromedriver missing: run as root or apt-get install chromium chromium-driver"
apt-get update -qq -o DPkg::Lock::Timeout=600
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
  chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null || die "apt-get installed no chromium"
