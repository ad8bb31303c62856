#!/usr/bin/env bash
# cuda-stub.sh: the -tags cuda host path on a machine without a GPU.
#
# Builds the stand-in driver library of kernels/cuda/testdata/cudastub (one
# device; every entry point succeeds and does nothing) as libcuda.so.1 in
# a temporary folder, links the -tags cuda test binary of kernels/cuda
# against it and runs BenchmarkStepCPU: the host cost of a device step
# (plan, launches, synchronize) with no device time in it.
#
#   bash scripts/cuda-stub.sh [benchtime]   (default 2000x; CI passes 20x)
#
# The entry points the Go code links that cudastub.c does not define are
# made here, each returning CUDA_SUCCESS: their names are read from
# gorgonia.org/cu and kernels/cuda and preprocessed through cuda.h, so that
# cuMemAlloc becomes cuMemAlloc_v2 (as ../shared/gpu/build.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
benchtime=${1:-2000x}
tree=$(bash scripts/nvcc.sh install)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cu=$(go list -tags cuda -deps -f '{{if eq .ImportPath "gorgonia.org/cu"}}{{.Dir}}{{end}}' ./kernels/cuda)
src=kernels/cuda/testdata/cudastub/cudastub.c
gcc -c -fPIC -O2 -Wall -Werror -o "$work/cudastub.o" "$src"
nm --defined-only -g "$work/cudastub.o" | awk '{print $3}' | sort -u > "$work/defined"
{ grep -ohE '\bC\.cu[A-Za-z0-9_]+' "$cu"/*.go kernels/cuda/*.go | sed 's/^C\.//'
  grep -ohE '\bcu[A-Z][A-Za-z0-9_]+\(' "$cu"/*.c "$cu"/*.h kernels/cuda/*.go | tr -d '('; } | sort -u > "$work/names"
(echo '#include <cuda.h>'; sed 's/.*/SYM: &/' "$work/names") | gcc -E -I"$tree/include" - |
	awk '/^SYM:/ {print $2}' | sort -u | comm -23 - "$work/defined" |
	sed 's/.*/int &(void) { return 0; }/' > "$work/rest.c"
gcc -shared -fPIC -O2 -o "$work/libcuda.so.1" -Wl,-soname,libcuda.so.1 "$work/cudastub.o" "$work/rest.c"
ln -s libcuda.so.1 "$work/libcuda.so"

export CGO_CFLAGS="-I$tree/include" CGO_LDFLAGS="-L$work" LD_LIBRARY_PATH="$work${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
go test -tags cuda -c -o "$work/cuda.test" ./kernels/cuda
"$work/cuda.test" -test.run '^TestStepCPUAllocatesNothing$' -test.v -test.bench '^BenchmarkStepCPU$' -test.benchtime "$benchtime" -test.benchmem
