package main

/*
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"unsafe"

	"github.com/pagedkv/pagedkv"
)

// stepBinder is what both facades have for step buffers.
type stepBinder interface {
	BindStepBuffers(mem []byte, caps pagedkv.StepBufferCapacities) (*pagedkv.StepBufferLayout, error)
	UnbindStepBuffers()
	StepBufferLayoutFor(caps pagedkv.StepBufferCapacities) (*pagedkv.StepBufferLayout, error)
}

var (
	_ stepBinder = (*pagedkv.Manager)(nil)
	_ stepBinder = (*pagedkv.HybridManager)(nil)
)

// goCaps checks and converts step buffer capacities.
func goCaps(op string, caps *C.pagedkv_step_capacities, size C.size_t) (pagedkv.StepBufferCapacities, C.int32_t, bool) {
	switch {
	case caps == nil:
		return pagedkv.StepBufferCapacities{}, badArg("%s: caps is NULL", op), false
	case size != C.sizeof_pagedkv_step_capacities:
		return pagedkv.StepBufferCapacities{}, badArg("%s: caps_size = %d, want sizeof(pagedkv_step_capacities) = %d",
			op, uint64(size), C.sizeof_pagedkv_step_capacities), false
	}
	// Values past int range are refused by the layout's bounds (2^28).
	clamp := func(v C.int64_t) int { return int(max(min(int64(v), 1<<40), -1<<40)) }
	return pagedkv.StepBufferCapacities{MaxRequests: clamp(caps.max_requests), MaxTokens: clamp(caps.max_tokens),
		MaxPages: clamp(caps.max_pages), MaxCascadeLevels: clamp(caps.max_cascade_levels)}, C.PAGEDKV_OK, true
}

//export pagedkv_step_layout
func pagedkv_step_layout(id C.pagedkv_manager, caps *C.pagedkv_step_capacities, capsSize C.size_t,
	rows *C.pagedkv_step_row, n C.int64_t, count, size *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "step_layout")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	gc, code, ok := goCaps("step_layout", caps, capsSize)
	if !ok {
		return code
	}
	if code, ok := checkArray("step_layout", "rows", unsafe.Pointer(rows), n); !ok {
		return code
	}
	if count == nil || size == nil {
		return badArg("step_layout: n = %p, size = %p; both are required", count, size)
	}
	lay, err := h.m.(stepBinder).StepBufferLayoutFor(gc)
	if err != nil {
		return failErr(err)
	}
	out := unsafe.Slice(rows, int(n))
	for i, r := range lay.Rows {
		if i >= len(out) {
			break
		}
		out[i] = C.pagedkv_step_row{array: C.int32_t(r.Array), group: C.int32_t(r.Group), level: C.int32_t(r.Level),
			offset: C.int64_t(r.Offset), cap: C.int64_t(r.Cap)}
	}
	*count, *size = C.int64_t(len(lay.Rows)), C.int64_t(lay.Size)
	return C.PAGEDKV_OK
}

// pagedkv_bind_step_buffers binds C memory (never Go memory: the caller's
// pointer is C's or another runtime's) as the manager's step buffers. The
// Manager keeps a Go slice over it, which the cgo rules allow (Go may hold
// pointers to C memory, and writes into it); it stores no Go pointer there.
//
//export pagedkv_bind_step_buffers
func pagedkv_bind_step_buffers(id C.pagedkv_manager, mem unsafe.Pointer, size C.int64_t,
	caps *C.pagedkv_step_capacities, capsSize C.size_t) (code C.int32_t) {
	h, code := enter(id, "bind_step_buffers")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	gc, code, ok := goCaps("bind_step_buffers", caps, capsSize)
	if !ok {
		return code
	}
	switch {
	case mem == nil:
		return badArg("bind_step_buffers: mem is NULL (size %d)", int64(size))
	case size <= 0 || size >= 1<<40:
		return badArg("bind_step_buffers: size = %d bytes, want 1..%d", int64(size), int64(1)<<40-1)
	}
	if _, err := h.m.(stepBinder).BindStepBuffers(unsafe.Slice((*byte)(mem), int(size)), gc); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_unbind_step_buffers
func pagedkv_unbind_step_buffers(id C.pagedkv_manager) (code C.int32_t) {
	h, code := enter(id, "unbind_step_buffers")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	h.m.(stepBinder).UnbindStepBuffers()
	return C.PAGEDKV_OK
}
