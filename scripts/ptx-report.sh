#!/usr/bin/env bash
# ptx-report.sh: a static proxy for the CUDA kernels' speed that needs no
# GPU. For every entry point of kernels/cuda/ptx/*.ptx it assembles the PTX for
# sm_90 with the private nvcc tree's ptxas (scripts/nvcc.sh) and prints
#
#   regs     registers per thread (ptxas -v)
#   spill    spill stores + spill loads, bytes per thread (ptxas -v)
#   stack    stack frame bytes per thread
#   smem     static shared memory per block (the decode kernels' K/V tiles
#            are dynamic shared memory, sized by the host at launch, and not
#            counted here)
#   loop     the main loop of the SASS (cuobjdump -sass, which runs
#            nvdisasm): instructions in its body, bytes of global memory it
#            loads (LDG and LDGSTS, by width), and instructions per 16 bytes
#            loaded; "-" when the entry has no loop that loads from global
#            memory
#
# The main loop is the innermost loop (a backward branch and the code
# between its target and it) whose body loads at least 16 bytes from
# global memory; failing that, the loop that loads the most. These are
# static counts of one pass of the body, a proxy: predicated-off
# instructions and inner loops count once.
#
# Usage: scripts/ptx-report.sh [--check] [file.ptx ...]  (default kernels/cuda/ptx/*.ptx)
#   --check  exit 1 when any entry spills (CI requires 0 spills)
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
if [ "${1:-}" = --check ]; then
	check=1
	shift
fi
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(kernels/cuda/ptx/*.ptx)

tree=$(bash scripts/nvcc.sh install)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# assemble TREE TMP FILE: ptxas -v and the SASS of one PTX file; files are
# assembled in parallel (ptxas is single-threaded; CI has 2 cores).
assemble() {
	local tree=$1 tmp=$2 f=$3 k
	k=$(basename "$f" .ptx)
	"$tree/bin/ptxas" -arch=sm_90 -v -o "$tmp/$k.cubin" "$f" 2>"$tmp/$k.ptxas"
	PATH="$tree/bin:$PATH" "$tree/bin/cuobjdump" -sass "$tmp/$k.cubin" >"$tmp/$k.sass"
}
export -f assemble
printf '%s\n' "${files[@]}" |
	xargs -P "${PAGEDKV_NVCC_JOBS:-$(nproc 2>/dev/null || echo 2)}" -I{} bash -c 'assemble "$@"' _ "$tree" "$tmp" {} || {
	echo "ptx-report.sh: ptxas or cuobjdump failed" >&2
	exit 1
}

python3 - "$check" "$tmp" "${files[@]}" <<'PY'
import os, re, sys

check, tmp, files = sys.argv[1] == "1", sys.argv[2], sys.argv[3:]

def ptxas_info(text):
    """entry -> dict(regs, spill, stack, smem) from ptxas -v output."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = out.setdefault(m.group(1), {"regs": 0, "spill": 0, "stack": 0, "smem": 0})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"] = int(m.group(1))
            cur["spill"] = int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return out

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")

def load_bytes(op):
    """bytes one global load instruction moves per thread (0 if not one)."""
    name = op.split()[0] if not op.startswith("@") else op.split()[1]
    if not (name.startswith("LDG") or name.startswith("LDGSTS")):
        return 0
    for suffix, n in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1), (".S8", 1)):
        if suffix in name:
            return n
    return 4

def sass_functions(text):
    """entry -> list of (address, instruction text)."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return out

def main_loop(insns):
    """(instructions, load bytes) of the main loop, or None."""
    index = {a: i for i, (a, _) in enumerate(insns)}
    loops = []
    for i, (a, op) in enumerate(insns):
        m = re.search(r"\bBRA\s+(?:`?\(?\.?L?_?x?_?)?(0x[0-9a-f]+)", op)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target <= a and target in index:
            body = insns[index[target]:i + 1]
            loops.append((len(body), sum(load_bytes(o) for _, o in body)))
    loading = [l for l in loops if l[1] >= 16]
    if loading:
        return min(loading)  # innermost: the shortest body
    loading = [l for l in loops if l[1] > 0]
    return max(loading, key=lambda l: l[1]) if loading else None

rows, bad = [], []
for f in files:
    k = os.path.basename(f)[:-len(".ptx")]
    info = ptxas_info(open(os.path.join(tmp, k + ".ptxas")).read())
    sass = sass_functions(open(os.path.join(tmp, k + ".sass")).read())
    for entry in sorted(info):
        i = info[entry]
        loop = main_loop(sass.get(entry, []))
        if loop:
            n, b = loop
            ls = "%d insns / %d B = %.1f per 16 B" % (n, b, 16.0 * n / b)
        else:
            ls = "-"
        rows.append((k, entry, i["regs"], i["spill"], i["stack"], i["smem"], ls))
        if i["spill"] > 0:
            bad.append("%s %s: %d bytes of spills" % (k, entry, i["spill"]))

print("%-8s %-36s %5s %6s %6s %6s  %s" % ("file", "entry (ptxas -arch=sm_90)", "regs", "spill", "stack", "smem", "main loop"))
for r in rows:
    print("%-8s %-36s %5d %6d %6d %6d  %s" % r)
if bad:
    print("\nspills (CI allows none):\n  " + "\n  ".join(bad), file=sys.stderr)
    if check:
        sys.exit(1)
PY
