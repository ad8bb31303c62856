#!/usr/bin/env bash
# bench-step.sh: the step benchmarks, an old commit's binary against a new
# tree's, alternated (issue 36's comparison).
#
#   bash scripts/bench-step.sh [NEWDIR]
#
# Old is commit $OLD (default bf24977, issue 36's filing), checked out in a
# temporary worktree of $REPO (default: this repository). New is NEWDIR (a
# project tree, e.g. a worktree; its working files as they are) or, without
# it, $BRANCH (default HEAD) in a temporary worktree.
# Both are built as test binaries (go test -c), then $ROUNDS rounds (default
# 5) run, old and new alternated (old first in odd rounds, new first in even
# ones), each with -benchtime $BENCHTIME (default 1s) and -benchmem:
#   BenchmarkDecodeStep/ours/*        (root package)
#   BenchmarkHybridDecodeStep/*       (root package)
#   BenchmarkStepHost (old) / BenchmarkStepCPU (new)  (kernels/cuda, -tags cuda
#       linked against the stand-in libcuda of scripts/cuda-stub.sh, built
#       from each tree's own kernels/cuda/testdata/cudastub; needs the CUDA
#       headers of `bash scripts/nvcc.sh install`; CUDA=0 skips it)
# and prints, per case, the median ns/op of each, new/old - 1, and the
# largest allocs/op and B/op seen in any round. Raw output stays in $KEEP
# if set. Only the figures of one run are comparable with each other.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
OLD=${OLD:-bf24977}
BRANCH=${BRANCH:-HEAD}
ROUNDS=${ROUNDS:-5}
BENCHTIME=${BENCHTIME:-1s}
CUDA=${CUDA:-1}

work=$(mktemp -d)
cleanup() {
	git -C "$REPO" worktree remove --force "$work/old" 2>/dev/null || true
	git -C "$REPO" worktree remove --force "$work/newtree" 2>/dev/null || true
	if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/*.txt "$KEEP"/ 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

git -C "$REPO" worktree add -q --detach "$work/old" "$OLD"
if [ $# -ge 1 ]; then
	new=$(cd "$1" && pwd)
else
	git -C "$REPO" worktree add -q --detach "$work/newtree" "$BRANCH"
	new=$work/newtree
fi
echo "old: $OLD ($(git -C "$work/old" rev-parse --short HEAD)); new: $new ($(git -C "$new" rev-parse --short HEAD)$(git -C "$new" diff --quiet HEAD -- . 2>/dev/null || echo ', with uncommitted changes'))"

# The root package's test binaries.
for v in old new; do
	dir=$work/old
	[ $v = new ] && dir=$new
	(cd "$dir" && go test -c -o "$work/$v.test" .)
done

# stub builds tree's stand-in libcuda.so.1 into $2 (as scripts/cuda-stub.sh
# does) and its -tags cuda kernels/cuda test binary as $3.
stub() {
	local tree=$1 lib=$2 bin=$3 cuh cu
	mkdir -p "$lib"
	cuh=$(cd "$tree" && bash scripts/nvcc.sh install)
	cu=$(cd "$tree" && go list -tags cuda -deps -f '{{if eq .ImportPath "gorgonia.org/cu"}}{{.Dir}}{{end}}' ./kernels/cuda)
	gcc -c -fPIC -O2 -Wall -Werror -o "$lib/cudastub.o" "$tree/kernels/cuda/testdata/cudastub/cudastub.c"
	nm --defined-only -g "$lib/cudastub.o" | awk '{print $3}' | sort -u > "$lib/defined"
	{ grep -ohE '\bC\.cu[A-Za-z0-9_]+' "$cu"/*.go "$tree"/kernels/cuda/*.go | sed 's/^C\.//'
	  grep -ohE '\bcu[A-Z][A-Za-z0-9_]+\(' "$cu"/*.c "$cu"/*.h "$tree"/kernels/cuda/*.go | tr -d '('; } | sort -u > "$lib/names"
	(echo '#include <cuda.h>'; sed 's/.*/SYM: &/' "$lib/names") | gcc -E -I"$cuh/include" - |
		awk '/^SYM:/ {print $2}' | sort -u | comm -23 - "$lib/defined" |
		sed 's/.*/int &(void) { return 0; }/' > "$lib/rest.c"
	gcc -shared -fPIC -O2 -o "$lib/libcuda.so.1" -Wl,-soname,libcuda.so.1 "$lib/cudastub.o" "$lib/rest.c"
	ln -sf libcuda.so.1 "$lib/libcuda.so"
	(cd "$tree" && CGO_CFLAGS="-I$cuh/include" CGO_LDFLAGS="-L$lib" go test -tags cuda -c -o "$bin" ./kernels/cuda)
}
if [ "$CUDA" = 1 ]; then
	stub "$work/old" "$work/lib-old" "$work/old-cuda.test"
	stub "$new" "$work/lib-new" "$work/new-cuda.test"
fi

run() { # run v round
	local v=$1 r=$2 cb
	"$work/$v.test" -test.run '^$' -test.bench '^BenchmarkDecodeStep$/^ours/' -test.benchtime "$BENCHTIME" -test.benchmem |
		sed -n "s/^Benchmark/$r Benchmark/p" >> "$work/$v.txt"
	"$work/$v.test" -test.run '^$' -test.bench '^BenchmarkHybridDecodeStep$' -test.benchtime "$BENCHTIME" -test.benchmem |
		sed -n "s/^Benchmark/$r Benchmark/p" >> "$work/$v.txt"
	if [ "$CUDA" = 1 ]; then
		cb='^BenchmarkStepCPU$'
		[ -n "$(LD_LIBRARY_PATH="$work/lib-$v" "$work/$v-cuda.test" -test.list '^BenchmarkStepCPU$')" ] || cb='^BenchmarkStepHost$'
		LD_LIBRARY_PATH="$work/lib-$v" "$work/$v-cuda.test" -test.run '^$' -test.bench "$cb" -test.benchtime "$BENCHTIME" -test.benchmem |
			sed -n "s/^Benchmark/$r Benchmark/p" >> "$work/$v.txt"
	fi
}
for r in $(seq 1 "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
	for v in $order; do run "$v" "$r"; done
	echo "round $r of $ROUNDS done" >&2
done

python3 - "$work/old.txt" "$work/new.txt" <<'EOF'
import re, statistics, sys
def load(path):
    d = {}
    for line in open(path):
        f = line.split()
        name = re.sub(r'-\d+$', '', f[1]).replace('BenchmarkStepHost', 'BenchmarkStepCPU')
        ns = float(f[f.index('ns/op') - 1])
        allocs = int(f[f.index('allocs/op') - 1]) if 'allocs/op' in f else -1
        bytes_ = int(f[f.index('B/op') - 1]) if 'B/op' in f else -1
        e = d.setdefault(name, {'ns': [], 'allocs': 0, 'B': 0})
        e['ns'].append(ns); e['allocs'] = max(e['allocs'], allocs); e['B'] = max(e['B'], bytes_)
    return d
old, new = load(sys.argv[1]), load(sys.argv[2])
print(f"{'case (StepHost in old = StepCPU)':<48} {'old ns/op':>11} {'new ns/op':>11} {'new/old-1':>9} {'allocs o/n':>10} {'B/op o/n':>9}  rounds")
for name in list(old) + [n for n in new if n not in old]:
    o, n = old.get(name), new.get(name)
    mo = statistics.median(o['ns']) if o else float('nan')
    mn = statistics.median(n['ns']) if n else float('nan')
    d = f"{(mn / mo - 1) * 100:+.1f}%" if o and n else '-'
    al = f"{o['allocs'] if o else '-'}/{n['allocs'] if n else '-'}"
    by = f"{o['B'] if o else '-'}/{n['B'] if n else '-'}"
    print(f"{name:<48} {mo:11.0f} {mn:11.0f} {d:>9} {al:>10} {by:>9}  {len(o['ns']) if o else 0}/{len(n['ns']) if n else 0}")
EOF
