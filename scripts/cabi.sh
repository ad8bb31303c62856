#!/usr/bin/env bash
# cabi.sh: build libpagedkv (the C ABI in cabi/) as a shared library and a
# static archive, run the C test program against both, and run the Python
# package's tests (Debian's /usr/bin/python3 with python3-numpy and
# python3-pytest). go test ./cabi runs this script too.
#
# Usage: scripts/cabi.sh [OUTDIR]   (default build/cabi; python/pagedkv finds
#        build/cabi/libpagedkv.so by itself, or set PAGEDKV_LIB)
# PAGEDKV_PYTEST=0 leaves out the pytest run (go test ./cabi does, without
# -short, because TestPythonPackageInstallsInFreshVenv runs the same suite
# against the installed wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${PAGEDKV_PYTEST:-1}" in
0 | 1) ;;
*)
	echo "cabi.sh: PAGEDKV_PYTEST=${PAGEDKV_PYTEST}, want 0 (leave pytest out) or 1" >&2
	exit 2
	;;
esac
out=${1:-build/cabi}
python=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)

echo "== go build -buildmode=c-shared and c-archive -> $out =="
bash scripts/libpagedkv.sh "$out/libpagedkv.so"
go build -buildmode=c-archive -o "$out/libpagedkv.a" ./cabi

echo "== C test (gcc against cabi/pagedkv.h), shared and static =="
cflags=(-std=c11 -O1 -Wall -Wextra -Werror -I cabi)
gcc "${cflags[@]}" cabi/testdata/pagedkv_test.c -L"$out" -Wl,-rpath,"$out" -lpagedkv -o "$out/pagedkv_test"
gcc "${cflags[@]}" cabi/testdata/pagedkv_test.c "$out/libpagedkv.a" -lpthread -o "$out/pagedkv_test_static"
"$out/pagedkv_test"
"$out/pagedkv_test_static" | tail -n 1

if [ "${PAGEDKV_PYTEST:-1}" = 0 ]; then
	echo "== pytest python/tests: left out (PAGEDKV_PYTEST=0) =="
	exit 0
fi
echo "== pytest python/tests ($python) =="
PAGEDKV_LIB="$out/libpagedkv.so" PYTHONDONTWRITEBYTECODE=1 \
	"$python" -m pytest -q -p no:cacheprovider python/tests
