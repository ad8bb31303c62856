package main

/*
#include <stdlib.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import "unsafe"

// Go wrappers of the step buffer calls for the tests (cgo is not allowed
// in _test.go files).

// abiStepRow is a pagedkv_step_row.
type abiStepRow struct {
	Array, Group, Level int32
	Offset, Cap         int64
}

func cCaps(maxRequests, maxTokens, maxPages, maxLevels int64) C.pagedkv_step_capacities {
	return C.pagedkv_step_capacities{max_requests: C.int64_t(maxRequests), max_tokens: C.int64_t(maxTokens),
		max_pages: C.int64_t(maxPages), max_cascade_levels: C.int64_t(maxLevels)}
}

// goStepLayout returns the layout of the capacities (r, t, p, l) for h.
func goStepLayout(h uint64, r, t, p, l int64) ([]abiStepRow, int64, int32) {
	caps := cCaps(r, t, p, l)
	var n, size C.int64_t
	if code := pagedkv_step_layout(C.pagedkv_manager(h), &caps, C.sizeof_pagedkv_step_capacities, nil, 0, &n, &size); code != C.PAGEDKV_OK {
		return nil, 0, int32(code)
	}
	rows := (*C.pagedkv_step_row)(C.calloc(C.size_t(n), C.sizeof_pagedkv_step_row))
	defer C.free(unsafe.Pointer(rows))
	code := pagedkv_step_layout(C.pagedkv_manager(h), &caps, C.sizeof_pagedkv_step_capacities, rows, n, &n, &size)
	out := make([]abiStepRow, int(n))
	for i, r := range unsafe.Slice(rows, int(n)) {
		out[i] = abiStepRow{int32(r.array), int32(r.group), int32(r.level), int64(r.offset), int64(r.cap)}
	}
	return out, int64(size), int32(code)
}

// cMem is C memory for step buffers, aligned to 64 bytes, plus off bytes.
type cMem struct {
	base unsafe.Pointer
	size int
}

func newCMem(size, off int) cMem {
	p := C.aligned_alloc(64, C.size_t((size+off+63)/64*64))
	return cMem{unsafe.Add(p, off), size}
}

func (m cMem) free(off int) { C.free(unsafe.Add(m.base, -off)) }

// bytes views the memory.
func (m cMem) bytes() []byte { return unsafe.Slice((*byte)(m.base), m.size) }

func goBindStepBuffers(h uint64, m cMem, r, t, p, l int64) int32 {
	caps := cCaps(r, t, p, l)
	return int32(pagedkv_bind_step_buffers(C.pagedkv_manager(h), m.base, C.int64_t(m.size), &caps, C.sizeof_pagedkv_step_capacities))
}

func goBindStepBuffersSized(h uint64, mem unsafe.Pointer, size int64, capsSize uintptr) int32 {
	caps := cCaps(1, 1, 1, 0)
	return int32(pagedkv_bind_step_buffers(C.pagedkv_manager(h), mem, C.int64_t(size), &caps, C.size_t(capsSize)))
}

func goUnbindStepBuffers(h uint64) int32 {
	return int32(pagedkv_unbind_step_buffers(C.pagedkv_manager(h)))
}

// planData returns the data pointer of a C plan's kv_indptr.
func (p cPlan) kvIndptrData() uintptr { return uintptr(unsafe.Pointer(p.c.kv_indptr.data)) }

// groupData returns the data pointers of group g's kv_indptr and
// attn_requests in a hybrid plan.
func (p cHybridPlan) groupData(g int) (kvIndptr, attnRequests uintptr) {
	gp := unsafe.Slice(p.groups, p.n)[g]
	return uintptr(unsafe.Pointer(gp.plan.kv_indptr.data)), uintptr(unsafe.Pointer(gp.attn_requests.data))
}
