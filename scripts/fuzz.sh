#!/usr/bin/env bash
# Runs every fuzz target of the module, one after another, for a fixed time
# each, and prints one summary line per target with its exec count.
#
#   scripts/fuzz.sh            10s per target (what CI runs)
#   scripts/fuzz.sh 5m         longer, by hand
#   scripts/fuzz.sh 60s ./pagetable ./fuzz    only these packages
#
# Targets are discovered with `go test -list '^Fuzz'`, so a new FuzzXxx in
# any package is picked up without editing this script. Each runs as
#   go test -run='^$' -fuzz="^FuzzXxx\$" -fuzztime=$T ./pkg
# The exit status is 1 if any target failed (a crasher is then written under
# the package's testdata/fuzz/FuzzXxx/; fix the bug and commit it, renamed to
# what it exercises), 0 otherwise. New interesting inputs go to the Go build
# cache (go env GOCACHE), not into the tree.
#
# Environment: FUZZ_FLAGS adds flags to every go test call (for example
# FUZZ_FLAGS='-fuzzminimizetime=5s'); FUZZ_LOGDIR keeps each target's full
# output there (default: a temporary directory, removed at exit).
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

module=$(go list -m)
echo "fuzz.sh: ${#targets[@]} targets, $fuzztime each"
failed=0
start=$SECONDS
for t in "${targets[@]}"; do
	pkg=${t% *}
	name=${t#* }
	rel=.${pkg#"$module"}
	log="$logdir/$(echo "$rel" | tr '/.' '__')_$name.log"
	t0=$SECONDS
	status=PASS
	if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "${extra[@]+"${extra[@]}"}" "$rel" >"$log" 2>&1; then
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
	if [ "$status" = FAIL ]; then
		failed=$((failed + 1))
	fi
	# The last progress line: "fuzz: elapsed: 10s, execs: 12345 (1234/sec), new interesting: ..."
	execs=$(grep -o 'execs: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
	interesting=$(grep -o 'new interesting: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f3 || true)
	printf '%s  %-22s %-26s execs=%-9s new-interesting=%-4s %3ds%s\n' \
		"$status" "$rel" "$name" "${execs:-0}" "${interesting:-0}" $((SECONDS - t0)) "${deadline:-}"
	deadline=
	if [ "$status" = FAIL ]; then
		sed 's/^/    /' "$log" | grep -v '^    fuzz: elapsed' | tail -n 40
	fi
done
echo "fuzz.sh: ${#targets[@]} targets, $failed failed, $((SECONDS - start))s"
[ "$failed" -eq 0 ]
