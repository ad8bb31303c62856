package main

import (
	"runtime"
	"testing"
	"unsafe"
)

// pagedkv_destroy_keep_memory (issue 35: Python views written after
// close() aborted the process): the manager is gone at once, every call on
// the handle is PAGEDKV_ERR_BAD_HANDLE, but the memory its plans pointed
// into stays allocated, its values frozen, under collections and fresh
// allocations, until pagedkv_free_memory, which frees it once.
func TestDestroyKeepMemory(t *testing.T) {
	h, ids, ones, _, _ := decodeABI(t, 16)
	first := newCPlan()
	defer first.free()
	if code := goReserveC(h, ids[:1], ones[:1], 1, first); code != codeOK {
		t.Fatalf("reserve: %d: %s", code, goLastError())
	}
	stale := first.kvPageIndices() // a passed step's buffer once the next grows
	if code := goAbort(h); code != codeOK {
		t.Fatal(code)
	}
	p := newCPlan()
	defer p.free()
	if code := goReserveC(h, ids, ones, int64(len(ids)), p); code != codeOK {
		t.Fatalf("reserve: %d: %s", code, goLastError())
	}
	cur := p.kvPageIndices()
	if unsafe.SliceData(cur) == unsafe.SliceData(stale) {
		t.Fatal("the second step reused the first step's buffer: this test needs one that grew")
	}
	if code := goDestroyKeepMemory(h); code != codeOK {
		t.Fatalf("destroy_keep_memory: %d: %s", code, goLastError())
	}
	if code := goCommit(h, nil, 0); code != codeBadHandle {
		t.Fatalf("commit after destroy_keep_memory: code %d, want PAGEDKV_ERR_BAD_HANDLE", code)
	}
	if code := goDestroy(h); code != codeBadHandle {
		t.Fatalf("destroy after destroy_keep_memory: code %d, want PAGEDKV_ERR_BAD_HANDLE", code)
	}
	// Words that look like heap pointers (their own addresses), written
	// where a freed buffer would be reused by objects the collector scans.
	for _, s := range [][]int32{stale, cur} {
		for i := range s {
			s[i] = int32(uintptr(unsafe.Pointer(&s[i])))
		}
	}
	var junk [][]*int
	for range 20 {
		for range 1000 {
			junk = append(junk, make([]*int, 8))
		}
		runtime.GC()
	}
	runtime.KeepAlive(junk)
	for _, s := range [][]int32{stale, cur} {
		for i := range s {
			if s[i] != int32(uintptr(unsafe.Pointer(&s[i]))) {
				t.Fatalf("kept memory changed at %d: it was freed and reused", i)
			}
		}
	}
	if code := goFreeMemory(h); code != codeOK {
		t.Fatalf("free_memory: %d: %s", code, goLastError())
	}
	if code := goFreeMemory(h); code != codeBadHandle {
		t.Fatalf("second free_memory: code %d, want PAGEDKV_ERR_BAD_HANDLE", code)
	}
	if code := goFreeMemory(12345); code != codeBadHandle {
		t.Fatalf("free_memory of a handle never kept: code %d", code)
	}
}
