package main

/*
#include <stdlib.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"slices"
	"unsafe"

	"github.com/pagedkv/pagedkv"
)

// export fills out with plan's arrays (zero copy) after pinning every
// buffer they point into. The descriptors are gathered first, the buffers
// pinned, and only then written into C memory (out and the level array),
// with plain integer stores: a pointer-typed store would run Go's write
// barrier on C memory, and during a collection the barrier shades the
// slot's old value — the previous plan's buffer, which may have been freed
// since — and the runtime dies on "found pointer to free object" (seen in
// the Python tests under load). It allocates only when a buffer or the
// level array grows.
func (h *handle) export(out *C.pagedkv_plan, p *pagedkv.Plan) {
	h.cur, h.outs = h.cur[:0], h.outs[:0]
	h.gather(&h.plans[0], out, p)
	h.pin()
	h.store()
}

// gather notes the descriptors of plan p for out (see export) and writes
// its integers; e is the plan's own C ABI memory.
func (h *handle) gather(e *planExport, out *C.pagedkv_plan, p *pagedkv.Plan) {
	h.array(&out.copies, copyWords(p.Copies))
	h.array(&out.qo_indptr, p.QOIndptr)
	h.array(&out.batch_indices, p.BatchIndices)
	h.array(&out.positions, p.Positions)
	h.array(&out.token_ids, p.TokenIDs)
	h.array(&out.token_positions, p.TokenPositions)
	h.array(&out.kv_indptr, p.KVIndptr)
	h.array(&out.kv_page_indices, p.KVPageIndices)
	h.array(&out.kv_last_page_len, p.KVLastPageLen)
	h.array(&out.seq_lens, p.SeqLens)
	h.array(&out.drafts, p.Drafts)
	e.blockTables, e.stride = p.BlockTables, p.BlockTablesStride
	if cap(e.blockTables) > 0 { // pinned with the plan's arrays
		h.cur = append(h.cur, unsafe.Pointer(unsafe.SliceData(e.blockTables)))
	}
	out.attention_kind = C.int64_t(p.AttentionKind())

	nlevels := 0
	var lp unsafe.Pointer
	if l := p.Cascade; l != nil {
		h.queryRows(e, l.RequestOrder, l.RequestQOIndptr, p.QOIndptr)
		h.array(&out.query_rows, e.rows)
		if len(l.Levels) > e.levelsCap {
			// A new array; the old one stays allocated until the handle's
			// memory is freed, like every buffer handed out.
			c := max(len(l.Levels), 2*e.levelsCap)
			nl := (*C.pagedkv_level)(C.malloc(C.size_t(c) * C.sizeof_pagedkv_level))
			if nl == nil {
				panic("cabi: out of C memory for cascade levels")
			}
			if e.levels != nil {
				h.retiredC = append(h.retiredC, unsafe.Pointer(e.levels))
			}
			e.levels, e.levelsCap = nl, c
		}
		levels := unsafe.Slice(e.levels, e.levelsCap)[:len(l.Levels)]
		for i, lv := range l.Levels {
			h.array(&levels[i].qo_indptr, lv.QOIndptr)
			h.array(&levels[i].kv_indptr, lv.KVIndptr)
			h.array(&levels[i].kv_indices, lv.KVPageIndices)
			h.array(&levels[i].kv_last_page_len, lv.KVLastPageLen)
		}
		nlevels, lp = len(levels), unsafe.Pointer(e.levels)
	} else {
		h.array(&out.query_rows, nil)
	}
	out.batch_size = C.int64_t(len(p.QOIndptr) - 1)
	out.nnz = C.int64_t(len(p.Positions))
	out.window_left = C.int64_t(p.WindowLeft)
	out.num_levels = C.int64_t(nlevels)
	*(*uintptr)(unsafe.Pointer(&out.levels)) = uintptr(lp) // C memory or nil
}

// store writes the gathered descriptors; every buffer is pinned.
func (h *handle) store() {
	for i := range h.outs {
		o := &h.outs[i]
		storeArray(o.dst, o.data, o.len, o.cap)
		o.data = nil
	}
}

// storeArray writes a descriptor into C memory without a write barrier
// (see export): data is pinned Go memory or nil.
func storeArray(dst *C.pagedkv_array, data unsafe.Pointer, n, capacity int) {
	*(*uintptr)(unsafe.Pointer(&dst.data)) = uintptr(data)
	dst.len, dst.cap = C.int64_t(n), C.int64_t(capacity)
}

// arrayOut is one array descriptor export writes once its buffer is pinned.
type arrayOut struct {
	dst      *C.pagedkv_array // in C memory
	data     unsafe.Pointer   // the buffer's first element; nil if it has none
	len, cap int
}

// array notes that dst will describe s, and s's buffer for pinning.
func (h *handle) array(dst *C.pagedkv_array, s []int32) {
	var data unsafe.Pointer
	if cap(s) > 0 {
		data = unsafe.Pointer(unsafe.SliceData(s))
		h.cur = append(h.cur, data)
	}
	h.outs = append(h.outs, arrayOut{dst: dst, data: data, len: len(s), cap: cap(s)})
}

// pin pins the buffers of the current plan. A buffer stays pinned (and
// alive) until the handle's memory is freed, even after the Manager moved
// to a larger one: a view of a passed plan then reads stale values, and a
// write into it changes memory nobody uses, never freed memory of the Go
// heap (docs/c-abi.md, "Lifetimes"). Buffers grow by doubling, so what
// is retired stays below what is in use. In steady state the Manager
// reuses its buffers and this compares a few pointers.
func (h *handle) pin() {
	if slices.Equal(h.cur, h.pinned) {
		return
	}
	if h.pinSet == nil {
		h.pinSet = make(map[unsafe.Pointer]struct{})
	}
	for _, p := range h.cur {
		if _, ok := h.pinSet[p]; !ok {
			h.pinner.Pin(p)
			h.pinSet[p] = struct{}{}
		}
	}
	h.pinned, h.cur = h.cur, h.pinned
}

// queryRows computes the cascade's row permutation into e.rows: cascade
// row r holds the query of plan row h.rows[r]. Cascade request IDs are
// batch indices, so request b's plan rows start at qoIndptr[b].
func (h *handle) queryRows(e *planExport, order []int, reqIndptr, qoIndptr []int32) {
	e.rows = e.rows[:0]
	for k, b := range order {
		start := qoIndptr[b]
		for i := range reqIndptr[k+1] - reqIndptr[k] {
			e.rows = append(e.rows, start+i)
		}
	}
}

//export pagedkv_get_block_tables
func pagedkv_get_block_tables(id C.pagedkv_manager, group C.int64_t, out *C.pagedkv_block_tables, size C.size_t) (code C.int32_t) {
	h, code := enter(id, "get_block_tables")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	switch {
	case out == nil:
		return badArg("get_block_tables: out is NULL")
	case size != C.sizeof_pagedkv_block_tables:
		return badArg("get_block_tables: size = %d, want sizeof(pagedkv_block_tables) = %d", uint64(size), C.sizeof_pagedkv_block_tables)
	case group < 0 || int(group) >= len(h.plans):
		return badArg("get_block_tables: group = %d, the manager has %d groups", int64(group), len(h.plans))
	}
	e := &h.plans[group]
	var data unsafe.Pointer
	if cap(e.blockTables) > 0 {
		data = unsafe.Pointer(unsafe.SliceData(e.blockTables)) // pinned by export
	}
	storeArray(&out.block_tables, data, len(e.blockTables), cap(e.blockTables))
	out.stride = C.int64_t(e.stride)
	out.max_seq_len = C.int64_t(e.stride * h.m.PageSize())
	return C.PAGEDKV_OK
}
