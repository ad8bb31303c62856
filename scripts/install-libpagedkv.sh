#!/usr/bin/env bash
# install-libpagedkv.sh: install the C library under PREFIX (default
# /usr/local): PREFIX/lib/libpagedkv.so (SONAME libpagedkv.so, built by
# scripts/libpagedkv.sh), PREFIX/include/pagedkv.h and
# PREFIX/lib/pkgconfig/pagedkv.pc, so that an engine builds with
#   gcc engine.c $(pkg-config --cflags --libs pagedkv)
# (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig when PREFIX is not a system one).
# The .pc's Version is the ABI version of pagedkv.h (PAGEDKV_ABI_VERSION).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-/usr/local}
case $prefix in
*[[:space:]]*) echo "install-libpagedkv.sh: PREFIX '$prefix' holds white space, which a .pc file cannot quote" >&2; exit 2 ;;
/*) ;;
*) echo "install-libpagedkv.sh: PREFIX must be an absolute path, got '$prefix'" >&2; exit 2 ;;
esac
abi=$(sed -n 's/^#define PAGEDKV_ABI_VERSION \([0-9][0-9]*\)$/\1/p' "$root/cabi/pagedkv.h")
if [ -z "$abi" ]; then
	echo "install-libpagedkv.sh: no PAGEDKV_ABI_VERSION in $root/cabi/pagedkv.h" >&2
	exit 1
fi
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
bash "$root/scripts/libpagedkv.sh" "$prefix/lib/libpagedkv.so"
install -m 0644 "$root/cabi/pagedkv.h" "$prefix/include/pagedkv.h"
cat >"$prefix/lib/pkgconfig/pagedkv.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: pagedkv
Description: pagedkv's KV-cache Manager behind a C ABI (FlashInfer page-table arrays)
Version: $abi
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lpagedkv
PC
echo "installed libpagedkv (ABI $abi) under $prefix"
