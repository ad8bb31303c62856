#!/usr/bin/env bash
# Runs every fuzz target of the module for a fixed time each, FUZZ_JOBS
# targets at once (default: the number of cores), and prints one summary
# line per target with its exec count as it finishes.
#
#   scripts/fuzz.sh            10s per target
#   scripts/fuzz.sh 5m         longer, by hand
#   scripts/fuzz.sh 60s ./pagetable ./fuzz    only these packages
#
# Targets are discovered with `go test -list '^Fuzz'`, so a new FuzzXxx in
# any package is picked up without editing this script. Each runs as
#   go test -run='^$' -fuzz="^FuzzXxx\$" -fuzztime=$T -parallel=1 \
#       -fuzzminimizetime=5s ./pkg
# The exit status is 1 if any target failed (a crasher is then written under
# the package's testdata/fuzz/FuzzXxx/; fix the bug and commit it, renamed to
# what it exercises), 0 otherwise. New interesting inputs go to the Go build
# cache (go env GOCACHE), not into the tree.
#
# Environment: FUZZ_JOBS targets run at once (default nproc); FUZZ_PARALLEL
# fuzz workers each (default 1); FUZZ_MINIMIZE caps the minimization of a
# new input (default 5s; Go's own default is 60s, which stalls a short run);
# FUZZ_BUDGETS gives some targets their own time ("FuzzManager=3s");
# FUZZ_FLAGS adds flags to every go test call; FUZZ_LOGDIR keeps each
# target's full output there (default: a temporary directory, removed at
# exit).
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${1:-10s}
shift || true
pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
	pkgs=(./...)
fi
read -r -a extra <<<"${FUZZ_FLAGS:-}"

logdir=${FUZZ_LOGDIR:-}
if [ -z "$logdir" ]; then
	logdir=$(mktemp -d)
	trap 'rm -rf "$logdir"' EXIT
fi
mkdir -p "$logdir"

# Discover: go test -list prints a package's matching test names, then
# "ok  <import path>  <time>". A package that does not build fails here.
if ! go test -list '^Fuzz' "${pkgs[@]}" >"$logdir/list" 2>&1; then
	cat "$logdir/list"
	echo "fuzz.sh: listing fuzz targets failed" >&2
	exit 1
fi
targets=()
names=()
while read -r first second _; do
	case "$first" in
	Fuzz*) names+=("$first") ;;
	ok)
		for n in "${names[@]+"${names[@]}"}"; do
			targets+=("$second $n")
		done
		names=()
		;;
	esac
done <"$logdir/list"
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz.sh: no fuzz targets found in ${pkgs[*]}" >&2
	exit 1
fi
# Order: each package's first target, then the rest. A fuzz run builds its
# package and every dependency with coverage instrumentation (cached in the
# build cache afterwards); two targets of one package started together
# would both build it from scratch (a minute for the cgo packages), the
# second one started after the first finds it built.
firsts=()
rest=()
seen=" "
for t in "${targets[@]}"; do
	if [[ $seen == *" ${t% *} "* ]]; then
		rest+=("$t")
	else
		firsts+=("$t")
		seen+="${t% *} "
	fi
done
targets=("${firsts[@]}" "${rest[@]+"${rest[@]}"}")

module=$(go list -m)
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
if ! [ "$jobs" -ge 1 ] 2>/dev/null; then
	echo "fuzz.sh: FUZZ_JOBS=$jobs, want a positive integer" >&2
	exit 2
fi
# One fuzz worker per job unless FUZZ_PARALLEL says otherwise: FUZZ_JOBS
# targets at once, each on one core, fill the machine without
# oversubscribing it.
workers=${FUZZ_PARALLEL:-1}
minimize=${FUZZ_MINIMIZE:-5s}

# budget NAME prints the fuzz time of target NAME: its entry in
# FUZZ_BUDGETS ("FuzzManager=3s FuzzEngine=20s"), else the common one.
budget() {
	local b
	for b in ${FUZZ_BUDGETS:-}; do
		if [ "${b%%=*}" = "$1" ]; then
			echo "${b#*=}"
			return
		fi
	done
	echo "$fuzztime"
}

# run_one I "PKG NAME" runs one target and writes its summary line to
# $logdir/I.line and, if it failed, the tail of its log to $logdir/I.fail.
run_one() {
	local i=$1 pkg=${2% *} name=${2#* } t0=$SECONDS status=PASS deadline=
	local rel=.${pkg#"$module"} ft
	ft=$(budget "$name")
	local log="$logdir/$(echo "$rel" | tr '/.' '__')_$name.log"
	if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$ft" -parallel="$workers" \
		-fuzzminimizetime="$minimize" "${extra[@]+"${extra[@]}"}" "$rel" >"$log" 2>&1; then
		status=FAIL
		# Go before 1.27 can end a run that found nothing with a bare
		# "context deadline exceeded" when -fuzztime expires while a worker
		# is busy (go.dev/issue/75804; the coordinator compares the error
		# with the child context's, which may not be cancelled yet). Such a
		# run wrote no crasher and failed no input: report it, do not fail.
		if grep -q '^    context deadline exceeded$' "$log" &&
			! grep -q -e 'Failing input written to' -e 'failure while testing seed corpus' \
				-e 'panic:' -e '^        ' "$log"; then
			status=PASS
			deadline=" (go.dev/issue/75804: deadline race at the end, no failing input)"
		fi
	fi
	# The last progress line: "fuzz: elapsed: 10s, execs: 12345 (1234/sec), new interesting: ..."
	local execs interesting
	execs=$(grep -o 'execs: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
	interesting=$(grep -o 'new interesting: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f3 || true)
	printf '%s  %-22s %-26s execs=%-9s new-interesting=%-4s %3ds%s\n' \
		"$status" "$rel" "$name" "${execs:-0}" "${interesting:-0}" $((SECONDS - t0)) "$deadline" >"$logdir/$i.line"
	if [ "$status" = FAIL ]; then
		sed 's/^/    /' "$log" | grep -v '^    fuzz: elapsed' | tail -n 40 >"$logdir/$i.fail"
	fi
	cat "$logdir/$i.line"
}

echo "fuzz.sh: ${#targets[@]} targets, $fuzztime each${FUZZ_BUDGETS:+ (budgets: $FUZZ_BUDGETS)}, $jobs at a time, $workers worker(s) each"
start=$SECONDS
i=0
for t in "${targets[@]}"; do
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
		wait -n || true
	done
	run_one "$i" "$t" &
	i=$((i + 1))
done
wait
failed=0
for ((k = 0; k < i; k++)); do
	if [ -f "$logdir/$k.fail" ]; then
		failed=$((failed + 1))
		sed -n 1p "$logdir/$k.line"
		cat "$logdir/$k.fail"
	fi
done
echo "fuzz.sh: ${#targets[@]} targets, $failed failed, $((SECONDS - start))s"
[ "$failed" -eq 0 ]
