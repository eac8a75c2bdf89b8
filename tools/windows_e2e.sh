#!/usr/bin/env bash
# The Windows build end to end under Wine (tools/windows_e2e.py): cross-builds coli.exe and
# colibrid.exe once, in release, for x86_64-pc-windows-gnu with Debian's mingw-w64, then runs
# them headless under Debian's Wine against the Linux build's answers. Run by .ci/run after the
# Linux build. Installs what it needs when missing (as root: CI runs as root): the rustup
# target, gcc-mingw-w64-x86-64, wine64, and the pinned openai package in a private venv.
#   tools/windows_e2e.sh [path/to/linux/target/release]
# WINDOWS_E2E_VENV: a venv that already has tools/http_sdk_requirements.txt (to rerun quickly).
# WINDOWS_E2E_NO_BUILD=1: use the .exe files already in target/x86_64-pc-windows-gnu/release.
set -euo pipefail
cd "$(dirname "$0")/.."
linux_bin=${1:-target/release}
target=x86_64-pc-windows-gnu
start=$(date +%s)
need=()
command -v x86_64-w64-mingw32-gcc >/dev/null || need+=(gcc-mingw-w64-x86-64)
{ command -v wine >/dev/null && [ -x /usr/lib/wine/wine64 ] ; } || command -v wine64 >/dev/null || need+=(wine64 wine)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "windows_e2e: needs ${need[*]} (apt-get install ${need[*]})" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  for try in 1 2 3; do
    { apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; } && break
    [ "$try" = 3 ] && { echo "windows_e2e: apt-get install ${need[*]} failed" >&2; exit 1; }
    sleep 5
  done
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  for try in 1 2 3; do
    rustup target add "$target" && break
    [ "$try" = 3 ] && { echo "windows_e2e: rustup target add $target failed" >&2; exit 1; }
    sleep 5
  done
fi
out=${CARGO_TARGET_DIR:-target}/$target/release
# The linker is also set in .cargo/config.toml; repeated here for a CARGO_HOME elsewhere.
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
if [ -z "${WINDOWS_E2E_NO_BUILD:-}" ]; then
  cargo build --release --target "$target" --bins
fi
# The transport's unit tests, cross-built on the same release artifacts (only the daemon
# library is compiled again, as a test), run under Wine by windows_e2e.py.
unit=$(cargo test --release --target "$target" -p colibri-daemon -p colibri-client --lib --no-run \
  --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    j = json.loads(line)
    if j.get("reason") == "compiler-artifact" and j.get("executable") and j["profile"]["test"]:
        print(j["executable"])')
[ -n "$unit" ] || { echo "windows_e2e: no daemon unit-test executable" >&2; exit 1; }
built=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Test-only: Wine 8 has no bcryptprimitives!ProcessPrng (Rust's std imports it); the shim
# forwards it to advapi32's SystemFunction036. It goes beside the .exe copies in the test's
# own folder, never into $out or a release archive.
x86_64-w64-mingw32-gcc -O2 -shared -o "$work/bcryptprimitives.dll" tools/windows/prng_shim.c -ladvapi32
venv=${WINDOWS_E2E_VENV:-$work/venv}
if [ -z "${WINDOWS_E2E_VENV:-}" ]; then
  python3 -m venv "$venv"
  for try in 1 2 3; do
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r tools/http_sdk_requirements.txt && break
    [ "$try" = 3 ] && { echo "windows_e2e: pip install failed" >&2; exit 1; }
    sleep 5
  done
fi
timeout 900 "$venv/bin/python" tools/windows_e2e.py --win-bin "$out" --linux-bin "$linux_bin" \
  --shim "$work/bcryptprimitives.dll" --unit-tests "$unit"
checked=$(date +%s)
echo "windows_e2e: cross build $((built - start)) s, Wine checks $((checked - built)) s"
# The release archives from the binaries just tested (WINDOWS_E2E_NO_DIST=1 skips them).
if [ -z "${WINDOWS_E2E_NO_DIST:-}" ]; then
  DIST_NO_BUILD=1 packaging/dist.sh
fi
