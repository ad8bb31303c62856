package kernels

import (
	"syscall"
	"unsafe"
)

// hugePage is the size of an x86-64 / arm64 transparent huge page.
const hugePage = 2 << 20

// newTensorBytes returns n zero bytes for a paged K/V buffer. On Linux, a
// buffer of at least two huge pages has its 2 MiB-aligned interior advised
// MADV_HUGEPAGE (before anything touches it, so the kernel faults it in
// huge pages where it has them): a decode or an append touches every page of
// the pool at a page stride (HND writes one head_dim row per head, each in
// a different 4 KiB page), and with 4 KiB pages the TLB misses, not the
// bytes, bound them. The advice is a hint: where transparent huge pages are
// off it changes nothing, and the memory stays the Go heap's.
func newTensorBytes(n int) []byte {
	b := make([]byte, n)
	if n < 2*hugePage {
		return b
	}
	start := unsafePointer(b)
	lo := (start + hugePage - 1) &^ (hugePage - 1)
	hi := (start + uintptr(n)) &^ (hugePage - 1)
	if hi > lo {
		_ = syscall.Madvise(b[lo-start:hi-start], syscall.MADV_HUGEPAGE) // a hint: ignore EINVAL where THP is not built in
	}
	return b
}

func unsafePointer(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
