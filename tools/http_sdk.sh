#!/usr/bin/env bash
# The official openai and anthropic Python SDKs (pinned in tools/http_sdk_requirements.txt)
# against the real colibrid's HTTP API, served with `coli serve`. Run by .ci/run after the
# build; needs python3 and PyPI.
#   tools/http_sdk.sh [path/to/target/release]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release}
work=$(mktemp -d)
pid=
# The daemon saves its state as it stops: wait for it before removing the folder.
trap '[ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }; rm -rf "$work"' EXIT
# HTTP_SDK_VENV: a venv that already has the pinned packages (to rerun quickly).
venv=${HTTP_SDK_VENV:-$work/venv}
if [ -z "${HTTP_SDK_VENV:-}" ]; then
  python3 -m venv "$venv"
  for try in 1 2 3; do
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r tools/http_sdk_requirements.txt && break
    [ "$try" = 3 ] && { echo "http_sdk: pip install failed" >&2; exit 1; }
    sleep 5
  done
fi
key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
# One generation at a time and no queue: a second request while one runs is a 429.
"$bin/colibrid" --socket "$work/c.sock" --state-dir "$work/state" --max-batch 1 --queue 0 \
  --http-body-limit 1048576 >"$work/colibrid.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$work/c.sock" ] && break; sleep 0.1; done
# A DeepSeek-R1-like model: the deepseek_v3 fixture with R1's real chat template (it opens a
# think block, so the reply starts as reasoning).
cp -r tests/fixtures/deepseek_v3 "$work/deepseek_r1"
cp tests/fixtures/templates/deepseek_r1.jinja "$work/deepseek_r1/chat_template.jinja"
served=$(COLIBRI_API_KEY=$key "$bin/coli" --socket "$work/c.sock" --no-autostart serve \
  --model tests/fixtures/olmoe --model tests/fixtures/qwen3_moe --model "$work/deepseek_r1" \
  --http 127.0.0.1:0 --output json)
url=$(printf '%s' "$served" | python3 -c 'import json,sys; print(json.load(sys.stdin)["url"])')
echo "http_sdk: colibrid serves $url"
"$venv/bin/python" tools/http_sdk_test.py --url "$url" --key "$key" --model olmoe \
  --model-dir tests/fixtures/olmoe --coli "$bin/coli" --tools-model qwen3_moe --reasoning-model deepseek_r1 || { cat "$work/colibrid.log" >&2; exit 1; }
# docs/http.md's curl example, as written there (only the address and the key added): the
# origin policy and the JSON-only rule leave it working.
example=$(awk '/^curl http:\/\/127.0.0.1:11435\/v1\/chat\/completions/{on=1} on&&/^```/{exit} on' docs/http.md)
[ -n "$example" ] || { echo "http_sdk: no curl example in docs/http.md" >&2; exit 1; }
example=${example//http:\/\/127.0.0.1:11435\/v1/$url}
auth="authorization: Bearer $key"
example=${example/curl /curl -sS -H \"\$auth\" }
out=$(eval "$example")
if printf '%s' "$out" | grep -q '^data: \[DONE\]'; then
  echo "http_sdk: ok   docs/http.md's curl example streams to [DONE]"
else
  echo "http_sdk: FAIL docs/http.md's curl example: $out" >&2; exit 1
fi
