#!/usr/bin/env bash
# The release archives, in one command:
#   packaging/dist.sh            -> target/dist/colibri-VERSION-x86_64-windows.zip
#                                   target/dist/colibri-VERSION-x86_64-linux.tar.gz
# Builds (or reuses) the release binaries of both targets (the Windows ones cross-built with
# Debian's mingw-w64: `apt-get install gcc-mingw-w64-x86-64`, `rustup target add
# x86_64-pc-windows-gnu`), strips them, packs them with README.md and LICENSE (the zip also
# holds WINDOWS.md = packaging/windows/README.md; the tarball the systemd units), then checks
# both archives' contents: exactly the expected files, executables of the right kind, and no
# DLL in the zip (tools/windows_e2e.sh's Wine-only ProcessPrng shim must never ship).
# DIST_NO_BUILD=1: pack the binaries already built. DIST_OUT: where to write (target/dist).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "dist: no version in Cargo.toml" >&2; exit 1; }
wtarget=x86_64-pc-windows-gnu
tdir=${CARGO_TARGET_DIR:-target}
out=${DIST_OUT:-$tdir/dist}
if [ -z "${DIST_NO_BUILD:-}" ]; then
  cargo build --release --bins
  CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc \
    cargo build --release --target "$wtarget" --bins
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

win=colibri-$version-x86_64-windows
lin=colibri-$version-x86_64-linux
mkdir -p "$stage/$win" "$stage/$lin/systemd"
cp "$tdir/$wtarget/release/coli.exe" "$tdir/$wtarget/release/colibrid.exe" "$stage/$win/"
cp README.md LICENSE "$stage/$win/"
cp packaging/windows/README.md "$stage/$win/WINDOWS.md"
cp "$tdir/release/coli" "$tdir/release/colibrid" "$stage/$lin/"
cp README.md LICENSE "$stage/$lin/"
cp packaging/systemd/colibrid.service packaging/systemd/colibrid.socket "$stage/$lin/systemd/"
if command -v x86_64-w64-mingw32-strip >/dev/null; then
  x86_64-w64-mingw32-strip "$stage/$win/"*.exe
fi
if command -v strip >/dev/null; then
  strip "$stage/$lin/coli" "$stage/$lin/colibrid"
fi

rm -f "$out/$win.zip" "$out/$lin.tar.gz"
# Python's zipfile: no `zip` package needed; entries sorted, one folder at the top.
python3 - "$stage" "$win" "$out/$win.zip" <<'PY'
import os, sys, zipfile
stage, top, dest = sys.argv[1:]
with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    for name in sorted(os.listdir(os.path.join(stage, top))):
        z.write(os.path.join(stage, top, name), f"{top}/{name}")
PY
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -czf "$out/$lin.tar.gz" "$lin"

# The checks (CI runs this script): exactly these files, the right kind of executables.
python3 - "$out/$win.zip" "$out/$lin.tar.gz" "$win" "$lin" <<'PY'
import sys, tarfile, zipfile
zpath, tpath, win, lin = sys.argv[1:]
want_zip = {f"{win}/{n}" for n in ("coli.exe", "colibrid.exe", "README.md", "WINDOWS.md", "LICENSE")}
want_tar = {f"{lin}/{n}" for n in ("coli", "colibrid", "README.md", "LICENSE",
                                   "systemd/colibrid.service", "systemd/colibrid.socket")}
with zipfile.ZipFile(zpath) as z:
    names = set(z.namelist())
    assert names == want_zip, f"{zpath}: {sorted(names ^ want_zip)} unexpected or missing"
    assert not any(n.lower().endswith(".dll") for n in names), f"{zpath} holds a DLL"
    for exe in ("coli.exe", "colibrid.exe"):
        b = z.read(f"{win}/{exe}")
        pe = int.from_bytes(b[0x3C:0x40], "little")
        assert b[:2] == b"MZ" and b[pe:pe + 6] == b"PE\0\0\x64\x86", f"{exe} is no x86-64 PE"
    lic = z.read(f"{win}/LICENSE").decode()
    assert "Apache License" in lic and "Version 2.0" in lic, "LICENSE is not Apache-2.0"
with tarfile.open(tpath) as t:
    files = {m.name for m in t.getmembers() if m.isfile()}
    assert files == want_tar, f"{tpath}: {sorted(files ^ want_tar)} unexpected or missing"
    for exe in ("coli", "colibrid"):
        m = t.getmember(f"{lin}/{exe}")
        assert m.mode & 0o111, f"{exe} is not executable"
        assert t.extractfile(m).read(4) == b"\x7fELF", f"{exe} is no ELF"
print(f"dist: {zpath}: {len(names)} files; {tpath}: {len(files)} files; contents checked")
PY
ls -l "$out/$win.zip" "$out/$lin.tar.gz"
