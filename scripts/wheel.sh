#!/usr/bin/env bash
# wheel.sh: build the pagedkv wheel into OUTDIR (default dist/), the one
# command for it: pagedkv-<version>-py3-none-manylinux_<glibc>_<arch>.whl,
# the stripped libpagedkv.so inside, installable with pip wherever that
# glibc (or a newer one) runs, with no Go and no compiler. Building it
# needs go, gcc, binutils (objdump) and Debian's python3-venv,
# python3-setuptools and python3-wheel (offline: no package index).
# It checks what it built: one wheel, tagged py3-none-<the tag
# scripts/glibc-tag.sh gives the library inside it>, the library
# stripped (no .symtab, no .debug_* sections), and prints its name.
#
# Usage: scripts/wheel.sh [OUTDIR]   ($PYTHON: the building interpreter,
#        default /usr/bin/python3; $GO as for scripts/libpagedkv.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dist}
python=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A venv over the interpreter's own packages (setuptools, wheel): pip with
# no index and no build isolation uses those, offline.
"$python" -m venv --system-site-packages "$work/venv"
PIP_NO_INDEX=1 PIP_FIND_LINKS= PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -m pip wheel -q \
	--no-build-isolation --no-deps -w "$work/wheel" "$root/python"
# pip copies the source tree to build it: gosrc/ is only in an sdist.
whl=$(ls "$work"/wheel/pagedkv-*.whl)
if [ "$(echo "$whl" | wc -l)" != 1 ]; then
	echo "wheel.sh: pip wheel wrote $(ls "$work/wheel"), want one pagedkv wheel" >&2
	exit 1
fi
"$python" -m zipfile -e "$whl" "$work/unpacked"
lib="$work/unpacked/pagedkv/libpagedkv.so"
tag=$(bash "$root/scripts/glibc-tag.sh" "$lib")
case $(basename "$whl") in
pagedkv-*-py3-none-"$tag".whl) ;;
*) echo "wheel.sh: $(basename "$whl") is not tagged py3-none-$tag (the library's glibc tag)" >&2; exit 1 ;;
esac
if objdump -h "$lib" | grep -Eq ' (\.symtab|\.debug_[a-z]+) '; then
	echo "wheel.sh: $lib keeps a symbol table or debug info (PAGEDKV_STRIP)" >&2
	exit 1
fi
rm -f "$out"/pagedkv-*-py3-none-*.whl
cp "$whl" "$out/"
echo "$out/$(basename "$whl") ($(du -k "$whl" | cut -f1) KiB)"
