#!/usr/bin/env bash
# ci-cuda.sh: the CUDA checks CI runs on a machine without a GPU.
#
#   1. PTX freshness: install the pinned private nvcc (scripts/nvcc.sh, cached
#      in ${XDG_CACHE_HOME:-$HOME/.cache}/pagedkv-nvcc), regenerate
#      kernels/cuda/ptx/*.ptx and fail when it differs from the committed files.
#   2. go vet -tags cuda ./... with cgo pointed at the private CUDA headers
#      (gorgonia.org/cu includes cuda.h). Tests with -tags cuda are never run
#      here: without a GPU gorgonia.org/cu exits the process at init.
#   3. The -tags cuda host path against the stand-in driver library
#      (scripts/cuda-stub.sh): TestStepCPUAllocatesNothing and a few
#      iterations of BenchmarkStepCPU, so that neither can rot.
#
# Usage: scripts/ci-cuda.sh [ptx|vet|stub|all]   (default all)
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
tree=$(bash scripts/nvcc.sh install)

if [ "$what" = ptx ] || [ "$what" = all ]; then
	echo "== PTX is up to date (nvcc $("$tree/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')) =="
	bash scripts/nvcc.sh ptx
	if ! git diff --exit-code --stat -- kernels/cuda/ptx ||
		[ -n "$(git status --porcelain --untracked-files=all -- kernels/cuda/ptx)" ]; then
		echo "kernels/cuda/ptx is stale: run 'go generate ./kernels/cuda' and commit the PTX" >&2
		exit 1
	fi
	echo "ok"
fi

if [ "$what" = vet ] || [ "$what" = all ]; then
	echo "== go vet -tags cuda ./... =="
	CGO_CFLAGS="-I$tree/include" go vet -tags cuda ./...
	echo "ok"
fi

if [ "$what" = stub ] || [ "$what" = all ]; then
	echo "== the -tags cuda host path on the stand-in libcuda (scripts/cuda-stub.sh 20x) =="
	bash scripts/cuda-stub.sh 20x
fi
