#!/usr/bin/env bash
# libpagedkv.sh: build the C ABI (cabi/) as the shared library OUT (default
# build/cabi/libpagedkv.so) with the SONAME libpagedkv.so, so that a program
# linked against it records that name (readelf -d shows it) and finds the
# library by that name at run time. The one place the build flags live:
# scripts/cabi.sh, python/setup.py (pip install ./python) and the cabi
# tests call it. $GO names the go command (default go). PAGEDKV_STRIP=1
# leaves out the symbol table and DWARF debug info (go build -ldflags=-s -w),
# as the Python package and wheel do (scripts/wheel.sh): 9 MB, not 13.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/cabi/libpagedkv.so}
mkdir -p "$(dirname "$out")"
cd "$root"
ldflags=-extldflags=-Wl,-soname,libpagedkv.so
if [ "${PAGEDKV_STRIP:-0}" = 1 ]; then
	ldflags="-s -w $ldflags"
fi
"${GO:-go}" build -buildmode=c-shared -ldflags="$ldflags" -o "$out" ./cabi
# go build also writes cgo's header (Go's type names) next to the library;
# callers include cabi/pagedkv.h instead.
rm -f "${out%.so}.h"
