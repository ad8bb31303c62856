#!/usr/bin/env bash
# glibc-tag.sh: print the manylinux platform tag (PEP 600) of the shared
# library LIB, e.g. manylinux_2_34_x86_64: the newest GLIBC_x.y symbol
# version among the symbols it imports (objdump -T, binutils), so that pip
# installs a wheel holding LIB only where that glibc or a newer one runs.
# It fails, naming them, when LIB needs a library other than glibc's
# (libc, libpthread, libdl, librt, libm, ld-linux), which manylinux wheels
# may not assume. setup.py tags the wheel with it; scripts/wheel.sh and
# the cabi tests check the tag against the library in the wheel.
#
# Usage: scripts/glibc-tag.sh LIB
set -euo pipefail
lib=${1:?usage: glibc-tag.sh LIB}
command -v objdump >/dev/null || { echo "glibc-tag.sh: objdump not found (apt-get install binutils)" >&2; exit 1; }
dyn=$(objdump -T "$lib")
ver=$(grep -o 'GLIBC_[0-9][0-9]*\.[0-9][0-9]*' <<<"$dyn" | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n | tail -n 1)
if [ -z "$ver" ]; then
	echo "glibc-tag.sh: $lib imports no GLIBC_ symbol version (objdump -T)" >&2
	exit 1
fi
other=$(objdump -p "$lib" | awk '$1 == "NEEDED" {print $2}' |
	grep -Ev '^(libc\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libm\.so\.6|ld-linux[-a-z0-9_.]*\.so\.[0-9]+)$' || true)
if [ -n "$other" ]; then
	echo "glibc-tag.sh: $lib needs libraries a manylinux wheel may not assume: $(echo $other)" >&2
	exit 1
fi
arch=$(objdump -f "$lib" | sed -n 's/^architecture: \([^,]*\),.*/\1/p')
case $arch in
i386:x86-64) arch=x86_64 ;;
aarch64) ;;
*) echo "glibc-tag.sh: $lib: architecture '$arch' has no wheel platform name here" >&2; exit 1 ;;
esac
echo "manylinux_${ver%.*}_${ver#*.}_$arch"
