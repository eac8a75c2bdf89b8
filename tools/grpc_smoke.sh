#!/usr/bin/env bash
# A stock gRPC client that nobody here wrote (Python grpcio, generated from the .proto at run
# time, default channel options) talks to the real colibrid: health, reflection, Status and a
# streamed Generate.
# Run by .ci/run after the Rust tests; needs python3 and PyPI.
#   tools/grpc_smoke.sh [path/to/colibrid]
set -euo pipefail
cd "$(dirname "$0")/.."
colibrid=${1:-target/release/colibrid}
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
for try in 1 2 3; do
  "$work/venv/bin/pip" install --quiet --disable-pip-version-check -r tools/grpc_smoke_requirements.txt && break
  [ "$try" = 3 ] && { echo "grpc_smoke: pip install failed" >&2; exit 1; }
  sleep 5
done
"$colibrid" --socket "$work/c.sock" --state-dir "$work/state" >"$work/colibrid.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$work/c.sock" ] && break; sleep 0.1; done
# Stock channel options first (C-core's own :authority), then with an explicit authority.
"$work/venv/bin/python" tools/grpc_smoke.py --socket "$work/c.sock" --model tests/fixtures/olmoe
"$work/venv/bin/python" tools/grpc_smoke.py --socket "$work/c.sock" --model tests/fixtures/olmoe --authority localhost
