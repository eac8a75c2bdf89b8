#!/usr/bin/env bash
# The dashboard (`coli web`) in a real headless Chromium against the real colibrid
# (tools/web_e2e.py). Run by .ci/run after the build. Installs Debian's chromium and
# chromium-driver when missing (as root: CI runs as root) and the pinned selenium package
# into a private venv. Screenshots and the daemon's log go to target/artifacts/web/.
#   tools/web_e2e.sh [path/to/target/release]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release}
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "web_e2e: chromium and chromium-driver are needed (apt-get install chromium chromium-driver)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  for try in 1 2 3; do
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; } && break
    [ "$try" = 3 ] && { echo "web_e2e: apt-get install chromium chromium-driver failed" >&2; exit 1; }
    sleep 5
  done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# WEB_E2E_VENV: a venv that already has the pinned packages (to rerun quickly).
venv=${WEB_E2E_VENV:-$work/venv}
if [ -z "${WEB_E2E_VENV:-}" ]; then
  python3 -m venv "$venv"
  for try in 1 2 3; do
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r tools/web_e2e_requirements.txt && break
    [ "$try" = 3 ] && { echo "web_e2e: pip install failed" >&2; exit 1; }
    sleep 5
  done
fi
# Selenium must use the chromedriver above, never fetch one.
export SE_OFFLINE=true
timeout 600 "$venv/bin/python" tools/web_e2e.py --bin "$bin" --artifacts target/artifacts/web
