#!/usr/bin/env bash
# nvcc.sh: a private CUDA 11.8 nvcc for building the PTX of kernels/cuda on a
# machine without a GPU and without touching any system file.
#
#   scripts/nvcc.sh install   ensure the private tree exists; print its path
#   scripts/nvcc.sh path      print where the tree is (or would be)
#   scripts/nvcc.sh ptx       install if needed, then regenerate kernels/cuda/ptx/*.ptx
#
# The tree comes from Debian's non-free packages nvidia-cuda-toolkit (nvcc,
# cicc, ptxas, libdevice; cuobjdump and nvdisasm for scripts/ptx-report.sh) and nvidia-cuda-dev (only /usr/include, which is the
# first member of that 774 MB package's data archive, so `head -c` cuts the
# decompression short). apt runs with private lists, cache and source list
# (the mirror is the one this machine's apt sources already name); the
# packages are unpacked with dpkg-deb -x into the tree. Nothing under /etc,
# /usr or /var is written.
#
# Environment:
#   PAGEDKV_NVCC_DIR   where trees live (default ${XDG_CACHE_HOME:-$HOME/.cache}/pagedkv-nvcc)
#   PAGEDKV_NVCC_VERSION  the Debian version to pin (default below); the PTX
#                      committed in kernels/cuda/ptx was made with this version
set -euo pipefail

version=${PAGEDKV_NVCC_VERSION:-11.8.89~11.8.0-5~deb12u1}
suite=${PAGEDKV_NVCC_SUITE:-bookworm}
root=${PAGEDKV_NVCC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pagedkv-nvcc}
tree="$root/${version//[~:]/_}"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { printf 'nvcc.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# mirror prints the first Debian archive URI of this machine's apt sources
# (deb822 .sources files and one-line .list files), skipping the security
# archive. Read only.
mirror() {
	local f uri
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
		[ -n "$uri" ] && { echo "$uri"; return; }
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] || continue
		uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { if ($i !~ /security/ && $(i+1) ~ /^(bookworm|stable)$/) { print $i; exit } } }' "$f")
		[ -n "$uri" ] && { echo "$uri"; return; }
	done
	return 1
}

# fetch_debs downloads the given packages (name=version) into $work/debs
# with apt-get on private lists, cache and source list; $work must exist.
fetch_debs() {
	command -v apt-get >/dev/null || die "apt-get not found: this script needs a Debian-based machine"
	local uri
	uri=$(mirror) || die "no Debian mirror found in /etc/apt/sources.list*"
	mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/parts" "$work/debs" "$work/x"
	local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	echo "deb [signed-by=$keyring] $uri $suite non-free" >"$work/sources.list"
	local apt=(apt-get -q
		-o "Dir::Etc::SourceList=$work/sources.list"
		-o "Dir::Etc::SourceParts=$work/parts"
		-o "Dir::State::Lists=$work/lists"
		-o "Dir::Cache=$work/cache"
		-o "Debug::NoLocking=1"
		-o "APT::Sandbox::User=root")
	log "apt-get update (private lists, $suite non-free)"
	"${apt[@]}" update >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; die "apt-get update failed"; }
	log "apt-get download $*"
	(cd "$work/debs" && "${apt[@]}" download "$@") >"$work/download.log" 2>&1 ||
		{ cat "$work/download.log" >&2; die "apt-get download failed (is version $version still on the mirror? set PAGEDKV_NVCC_VERSION)"; }
}

# add_nvdisasm puts nvdisasm (which cuobjdump -sass runs, for
# scripts/ptx-report.sh) into a tree installed before the tree had it,
# without touching the rest of the tree.
add_nvdisasm() {
	[ -x "$tree/bin/nvdisasm" ] && return
	mkdir -p "$root"
	work=$(mktemp -d "$root/.work.XXXXXX")
	trap 'rm -rf "${work:-}"' EXIT
	fetch_debs "nvidia-cuda-toolkit=$version"
	dpkg-deb -x "$work"/debs/nvidia-cuda-toolkit_*.deb "$work/x"
	[ -x "$work/x/usr/bin/nvdisasm" ] || die "nvidia-cuda-toolkit=$version has no /usr/bin/nvdisasm"
	cp "$work/x/usr/bin/nvdisasm" "$tree/bin/nvdisasm.tmp"
	mv "$tree/bin/nvdisasm.tmp" "$tree/bin/nvdisasm"
	log "added nvdisasm to $tree"
	rm -rf "$work"
	trap - EXIT
}

install_tree() {
	if [ -x "$tree/bin/nvcc" ] && [ -f "$tree/.complete" ]; then
		add_nvdisasm
		echo "$tree"
		return
	fi
	local t0
	t0=$(date +%s)
	mkdir -p "$root"
	work=$(mktemp -d "$root/.work.XXXXXX")
	trap 'rm -rf "${work:-}"' EXIT
	fetch_debs "nvidia-cuda-toolkit=$version" "nvidia-cuda-dev=$version"

	local new="$work/tree"
	mkdir -p "$new/bin" "$new/nvvm/libdevice" "$new/include"
	dpkg-deb -x "$work"/debs/nvidia-cuda-toolkit_*.deb "$work/x"
	local tk="$work/x/usr/lib/nvidia-cuda-toolkit"
	cp "$tk/bin/nvcc" "$tk/bin/cicc" "$new/bin/"
	cp "$work/x/usr/bin/ptxas" "$work/x/usr/bin/fatbinary" "$work/x/usr/bin/cuobjdump" "$work/x/usr/bin/nvdisasm" "$new/bin/"
	cp "$(find "$work/x" -name libdevice.10.bc | head -n 1)" "$new/nvvm/libdevice/"
	# /usr/include is the first member of nvidia-cuda-dev's data archive: stop
	# decompressing after it. tar exits non-zero on the cut stream; the
	# headers are checked below instead.
	dpkg-deb --fsys-tarfile "$work"/debs/nvidia-cuda-dev_*.deb 2>/dev/null | head -c 60000000 |
		tar -x -C "$work/x" ./usr/include 2>/dev/null || true
	cp -r "$work/x/usr/include/." "$new/include/"
	for h in cuda.h cuda_fp16.h cuda_bf16.h cuda_runtime.h crt/host_config.h; do
		[ -f "$new/include/$h" ] || die "header $h missing after unpacking nvidia-cuda-dev"
	done
	# Debian's nvcc.profile is a link to /etc/nvcc.profile with absolute
	# paths; this one is relative to the binary.
	cat >"$new/bin/nvcc.profile" <<'PROFILE'
TOP = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH += $(_HERE_):
INCLUDES += "-I$(TOP)/include" $(_SPACE_)
PROFILE
	echo "$version" >"$new/.complete"
	rm -rf "$tree"
	mv "$new" "$tree"
	log "installed $tree in $(($(date +%s) - t0)) s ($(du -sh "$tree" | cut -f1))"
	echo "$tree"
}

# The kernels (below) and the exact nvcc command line (build_kernel). Changing either changes the
# PTX; CI regenerates and diffs it (scripts/ci-cuda.sh). Each kernel <k>.cu
# of kernels/cuda is built for sm_80 into ptx/<k>.ptx (any GPU from Ampere
# on; the driver JIT-compiles it for newer ones) and for sm_90 (Hopper:
# hardware fp8 pair converts). The sm_90 build is kept, as ptx/<k>_sm90.ptx,
# only when it differs from the sm_80 build in more than its .target line;
# otherwise the sm_80 PTX serves sm_90 too and no _sm90 file exists.
# kernels/cuda/ptx.go embeds exactly these files and picks a module's build
# by the device's compute capability (a Go test checks that the files and
# the embedded modules agree).
kernels=(append decode decode_tc prefill merge mla_decode mla_tc)

# build_kernel T SRC NEW K builds kernel K's PTX into NEW (run by gen_ptx,
# one process per kernel, up to PAGEDKV_NVCC_JOBS at once).
build_kernel() {
	local t=$1 src=$2 new=$3 k=$4
	local flags=(-ptx -std=c++17 -O3 -allow-unsupported-compiler -Xcudafe --diag_suppress=177)
	"$t/bin/nvcc" "${flags[@]}" -arch=sm_80 -o "$new/$k.ptx" "$src/$k.cu"
	"$t/bin/nvcc" "${flags[@]}" -arch=sm_90 -o "$new/${k}_sm90.ptx" "$src/$k.cu"
	if sed 's/^\.target sm_90$/.target sm_80/' "$new/${k}_sm90.ptx" | cmp -s - "$new/$k.ptx"; then
		rm "$new/${k}_sm90.ptx"
		echo "nvcc.sh: built ptx/$k.ptx ($(wc -c <"$new/$k.ptx") bytes), which serves sm_90 too (its sm_90 build differs only in .target)" >&2
	else
		echo "nvcc.sh: built ptx/$k.ptx ($(wc -c <"$new/$k.ptx") bytes) and ptx/${k}_sm90.ptx ($(wc -c <"$new/${k}_sm90.ptx") bytes)" >&2
	fi
}

gen_ptx() {
	local t
	t=$(install_tree)
	local src="$repo/kernels/cuda" dir="$repo/kernels/cuda/ptx"
	new=$(mktemp -d) # global: the EXIT trap runs after this function returns
	trap 'rm -rf "${new:-}"' EXIT
	# Kernels build in parallel (nvcc is single-threaded; CI has 2 cores).
	local jobs=${PAGEDKV_NVCC_JOBS:-$(nproc 2>/dev/null || echo 2)}
	export -f build_kernel
	printf '%s\n' "${kernels[@]}" |
		xargs -P "$jobs" -I{} bash -c 'build_kernel "$@"' _ "$t" "$src" "$new" {} ||
		die "building the PTX failed"
	# Replace the whole set, so that no PTX of a removed source or of an
	# sm_90 build no longer needed stays behind.
	mkdir -p "$dir"
	rm -f "$dir"/*.ptx
	mv "$new"/*.ptx "$dir"/
	rm -rf "$new"
	trap - EXIT
	log "wrote kernels/cuda/ptx"
}

case "${1:-}" in
install) install_tree ;;
path) echo "$tree" ;;
ptx) gen_ptx ;;
*) die "usage: $0 install|path|ptx" ;;
esac
