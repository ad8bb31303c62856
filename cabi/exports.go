package main

/*
#include <stdlib.h>
#include <string.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/pagedkv/pagedkv"
)

// ---- Create and destroy ----

//export pagedkv_create
func pagedkv_create(cfg *C.pagedkv_config, size C.size_t, out *C.pagedkv_manager) (code C.int32_t) {
	defer recoverTo(&code)
	gcfg, clk, code, ok := goConfig("create", cfg, size, out)
	if !ok {
		return code
	}
	if _, code, ok := stateCheckpointEvery("create", cfg, size, false); !ok {
		return code
	}
	m, err := pagedkv.New(gcfg)
	if err != nil {
		return failErr(err)
	}
	*out = register(&handle{m: m, plans: make([]planExport, 1), clock: clk})
	return C.PAGEDKV_OK
}

// goConfig checks create's common arguments and converts cfg.
// The manager's clock (Config.Clock, pagedkv_set_clock) comes with it.
func goConfig(op string, cfg *C.pagedkv_config, size C.size_t, out *C.pagedkv_manager) (pagedkv.Config, *cabiClock, C.int32_t, bool) {
	switch {
	case cfg == nil || out == nil:
		return pagedkv.Config{}, nil, badArg("%s: cfg = %p, out = %p; both are required", op, cfg, out), false
	case size != C.sizeof_pagedkv_config && size != configSizeV5 && size != configSizeV4 && size != configSizeV3 && size != configSizeV2:
		return pagedkv.Config{}, nil, badArg("%s: cfg_size = %d, want sizeof(pagedkv_config) = %d (or %d, without state_checkpoint_every, or %d, without pin_budget, or %d, without block_tables_stride, or %d, without memory_limit)",
			op, uint64(size), C.sizeof_pagedkv_config, configSizeV5, configSizeV4, configSizeV3, configSizeV2), false
	}
	gcfg := pagedkv.Config{
		NumPages:             int(cfg.num_pages),
		PageSize:             int(cfg.page_size),
		WindowTokens:         int(cfg.window_tokens),
		Priorities:           int(cfg.priorities),
		MaxPinnedPages:       int(cfg.max_pinned_pages),
		HashSeed:             uint64(cfg.hash_seed),
		CascadeMinSavedPages: int(cfg.cascade_min_saved_pages),
	}
	if size > configSizeV2 { // a caller of an earlier header has no memory_limit
		gcfg.MemoryLimit = int64(cfg.memory_limit)
	}
	if size > configSizeV3 { // nor block_tables_stride
		gcfg.BlockTablesStride = int(cfg.block_tables_stride)
	}
	if size > configSizeV4 { // nor pin_budget
		gcfg.PinBudget = float64(cfg.pin_budget)
	}
	clk := newClock()
	gcfg.Clock = clk.read
	return gcfg, clk, C.PAGEDKV_OK, true
}

// configSizeV2 is the size of pagedkv_config before memory_limit was
// appended (ABI version 2 as first published): callers built with that
// header keep working, with the default memory limit.
const configSizeV2 = C.size_t(unsafe.Offsetof(C.pagedkv_config{}.memory_limit))

// configSizeV3 is its size before block_tables_stride was appended.
const configSizeV3 = C.size_t(unsafe.Offsetof(C.pagedkv_config{}.block_tables_stride))

// configSizeV4 is its size before pin_budget was appended.
const configSizeV4 = C.size_t(unsafe.Offsetof(C.pagedkv_config{}.pin_budget))

// configSizeV5 is its size before state_checkpoint_every was appended.
const configSizeV5 = C.size_t(unsafe.Offsetof(C.pagedkv_config{}.state_checkpoint_every))

// stateCheckpointEvery is cfg's state_checkpoint_every (0 for a caller
// whose cfg_size has none; goConfig checked cfg). A dense manager
// (hybrid false) has no state groups: a non-zero value is refused.
func stateCheckpointEvery(op string, cfg *C.pagedkv_config, size C.size_t, hybrid bool) (int, C.int32_t, bool) {
	if size <= configSizeV5 {
		return 0, C.PAGEDKV_OK, true
	}
	v := int64(cfg.state_checkpoint_every)
	if !hybrid && v != 0 {
		return 0, badArg("%s: cfg.state_checkpoint_every = %d, want 0: a dense manager has no state groups (pagedkv_hybrid_create)", op, v), false
	}
	if v < 0 || v > math.MaxInt32 {
		return 0, badArg("%s: cfg.state_checkpoint_every = %d, want 0 or a multiple of page_size up to 2^31-1", op, v), false
	}
	return int(v), C.PAGEDKV_OK, true
}

//export pagedkv_destroy
func pagedkv_destroy(id C.pagedkv_manager) (code C.int32_t) {
	defer recoverTo(&code)
	h := lookup(id)
	if h == nil {
		return fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: destroy: no manager with handle %d", uint64(id)))
	}
	if !h.busy.CompareAndSwap(false, true) {
		return fail(C.PAGEDKV_ERR_BUSY, fmt.Sprintf("pagedkv: destroy: manager %d is in use by another thread", uint64(id)))
	}
	destroyHeld(h, uint64(id))
	return C.PAGEDKV_OK
}

// destroyHeld destroys h, whose busy flag the caller holds. The flag stays
// set: a thread that looked the handle up before the delete gets
// PAGEDKV_ERR_BUSY (or, waiting for it, PAGEDKV_ERR_BAD_HANDLE), never a
// destroyed Manager.
func destroyHeld(h *handle, id uint64) {
	registry.Lock()
	delete(registry.handles, id)
	registry.Unlock()
	h.kill()
	h.ext.closeIO()
	h.freeMemory()
}

// pagedkv_destroy_keep_memory destroys m as pagedkv_destroy does (its
// stores and sockets closed, every call on it PAGEDKV_ERR_BAD_HANDLE), but
// keeps the memory it handed out allocated, unchanging, until
// pagedkv_free_memory(m): for bindings whose views of that memory may
// outlive the manager (Python's numpy views).
//
//export pagedkv_destroy_keep_memory
func pagedkv_destroy_keep_memory(id C.pagedkv_manager) (code C.int32_t) {
	defer recoverTo(&code)
	h := lookup(id)
	if h == nil {
		return fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: destroy_keep_memory: no manager with handle %d", uint64(id)))
	}
	if !h.busy.CompareAndSwap(false, true) {
		return fail(C.PAGEDKV_ERR_BUSY, fmt.Sprintf("pagedkv: destroy_keep_memory: manager %d is in use by another thread", uint64(id)))
	}
	registry.Lock()
	delete(registry.handles, uint64(id))
	registry.kept[uint64(id)] = h
	registry.Unlock()
	h.kill()
	h.ext.closeIO()
	// The Manager goes; what it handed out stays pinned (h.pinner, the
	// extras' host pin) or allocated (C buffers) until free_memory.
	h.m = nil
	return C.PAGEDKV_OK
}

// pagedkv_free_memory frees what pagedkv_destroy_keep_memory(m) kept.
//
//export pagedkv_free_memory
func pagedkv_free_memory(id C.pagedkv_manager) (code C.int32_t) {
	defer recoverTo(&code)
	registry.Lock()
	h := registry.kept[uint64(id)]
	delete(registry.kept, uint64(id))
	registry.Unlock()
	if h == nil {
		return fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: free_memory: no memory kept for handle %d (destroy_keep_memory keeps it, once)", uint64(id)))
	}
	h.freeMemory()
	return C.PAGEDKV_OK
}

// freeMemory unpins every buffer h handed out and frees its C memory.
func (h *handle) freeMemory() {
	h.pinner.Unpin()
	h.pinSet, h.pinned, h.cur = nil, nil, nil
	h.ext.free()
	for i := range h.plans {
		C.free(unsafe.Pointer(h.plans[i].levels))
		h.plans[i].levels, h.plans[i].levelsCap = nil, 0
	}
	for _, p := range h.retiredC {
		C.free(p)
	}
	h.retiredC = nil
}

// ---- Per request ----

//export pagedkv_add
func pagedkv_add(id C.pagedkv_manager, rid C.uint64_t, req *C.pagedkv_request, matched *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "add")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if req == nil {
		return badArg("add request %d: req is NULL", uint64(rid))
	}
	ns, code, ok := namespace("add", &req.ns)
	if !ok {
		return code
	}
	if code, ok := checkArray("add", "prompt", unsafe.Pointer(req.prompt), req.prompt_len); !ok {
		return code
	}
	switch {
	case req.priority < 0 || req.priority > 255:
		return badArg("add request %d: priority = %d, want 0..255 (and below the configured priorities)", uint64(rid), int32(req.priority))
	case req.capacity_tokens < 0 || req.capacity_tokens >= maxLen:
		return badArg("add request %d: capacity_tokens = %d, want 0..%d", uint64(rid), int64(req.capacity_tokens), maxLen-1)
	}
	n, err := h.m.Add(pagedkv.RequestID(rid), pagedkv.Request{
		Namespace:      ns,
		Prompt:         int32s(req.prompt, req.prompt_len),
		Priority:       pagedkv.Priority(req.priority),
		NoCache:        req.no_cache != 0,
		CapacityTokens: int(req.capacity_tokens),
	})
	if err != nil {
		return failErr(err)
	}
	if matched != nil {
		*matched = C.int64_t(n)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_extend
func pagedkv_extend(id C.pagedkv_manager, rid C.uint64_t, tokens *C.int32_t, n C.int64_t) (code C.int32_t) {
	h, code := enter(id, "extend")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if code, ok := checkArray("extend", "tokens", unsafe.Pointer(tokens), n); !ok {
		return code
	}
	if err := h.m.Extend(pagedkv.RequestID(rid), int32s(tokens, n)...); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_fork
func pagedkv_fork(id C.pagedkv_manager, parent, child C.uint64_t) (code C.int32_t) {
	h, code := enter(id, "fork")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if err := h.m.Fork(pagedkv.RequestID(parent), pagedkv.RequestID(child)); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_preempt
func pagedkv_preempt(id C.pagedkv_manager, rid C.uint64_t) (code C.int32_t) {
	h, code := enter(id, "preempt")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if err := h.m.Preempt(pagedkv.RequestID(rid)); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_resume
func pagedkv_resume(id C.pagedkv_manager, rid C.uint64_t, matched *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "resume")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	n, err := h.m.Resume(pagedkv.RequestID(rid))
	if err != nil {
		return failErr(err)
	}
	if matched != nil {
		*matched = C.int64_t(n)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_release
func pagedkv_release(id C.pagedkv_manager, rid C.uint64_t) (code C.int32_t) {
	h, code := enter(id, "release")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if err := h.m.Release(pagedkv.RequestID(rid)); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

// ---- Per step ----

//export pagedkv_reserve
func pagedkv_reserve(id C.pagedkv_manager, ids *C.uint64_t, ntokens *C.int32_t, n C.int64_t, out *C.pagedkv_plan) (code C.int32_t) {
	h, code := enterDense(id, "reserve")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	rids, nt, code, ok := reserveArgs("reserve", ids, ntokens, n, unsafe.Pointer(out), "out")
	if !ok {
		return code
	}
	plan, err := h.m.ReserveStep(rids, nt, nil)
	if err != nil {
		return failErr(err)
	}
	h.export(out, plan.Groups[0])
	return C.PAGEDKV_OK
}

// reserveArgs checks and views reserve's common arguments.
func reserveArgs(op string, ids *C.uint64_t, ntokens *C.int32_t, n C.int64_t, out unsafe.Pointer, outName string) ([]pagedkv.RequestID, []int32, C.int32_t, bool) {
	if code, ok := checkArray(op, "ids", unsafe.Pointer(ids), n); !ok {
		return nil, nil, code, false
	}
	if code, ok := checkArray(op, "ntokens", unsafe.Pointer(ntokens), n); !ok {
		return nil, nil, code, false
	}
	if out == nil {
		return nil, nil, badArg("%s: %s is NULL", op, outName), false
	}
	var rids []pagedkv.RequestID
	if n > 0 {
		rids = unsafe.Slice((*pagedkv.RequestID)(unsafe.Pointer(ids)), int(n))
	}
	return rids, int32s(ntokens, n), C.PAGEDKV_OK, true
}

//export pagedkv_reserve_spec
func pagedkv_reserve_spec(id C.pagedkv_manager, ids *C.uint64_t, ntokens *C.int32_t, n C.int64_t,
	draftIndptr *C.int32_t, drafts *C.int32_t, out *C.pagedkv_plan) (code C.int32_t) {
	h, code := enterDense(id, "reserve_spec")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	rids, nt, code, ok := reserveArgs("reserve_spec", ids, ntokens, n, unsafe.Pointer(out), "out")
	if !ok {
		return code
	}
	plan, code := h.reserveDrafts("reserve_spec", rids, nt, n, draftIndptr, drafts)
	if plan == nil {
		return code
	}
	h.export(out, plan.Groups[0])
	return C.PAGEDKV_OK
}

// reserveDrafts checks the drafts (draftArgs) and reserves the step; a nil
// plan comes with the error code to return.
func (h *handle) reserveDrafts(op string, rids []pagedkv.RequestID, nt []int32, n C.int64_t,
	draftIndptr, drafts *C.int32_t) (*pagedkv.HybridPlan, C.int32_t) {
	lists, code, ok := h.draftArgs(op, n, draftIndptr, drafts)
	if !ok {
		return nil, code
	}
	// The Manager copies the drafts; drop the views of C memory.
	defer clear(h.draftLists)
	plan, err := h.m.ReserveStep(rids, nt, lists)
	if err != nil {
		return nil, failErr(err)
	}
	return plan, C.PAGEDKV_OK
}

// draftArgs checks reserve_spec's drafts and views them as one list per
// request (nil: no drafts) in h.draftLists, which the caller clears after
// the call.
func (h *handle) draftArgs(op string, n C.int64_t, draftIndptr, drafts *C.int32_t) ([][]int32, C.int32_t, bool) {
	if draftIndptr == nil {
		if drafts != nil {
			return nil, badArg("%s: drafts without draft_indptr", op), false
		}
		return nil, C.PAGEDKV_OK, true
	}
	ip := int32s(draftIndptr, n+1)
	if ip[0] != 0 {
		return nil, badArg("%s: draft_indptr[0] = %d, want 0", op, ip[0]), false
	}
	for i := 1; i < len(ip); i++ {
		if ip[i] < ip[i-1] {
			return nil, badArg("%s: draft_indptr[%d] = %d < draft_indptr[%d] = %d", op, i, ip[i], i-1, ip[i-1]), false
		}
	}
	total := C.int64_t(ip[n])
	if code, ok := checkArray(op, "drafts", unsafe.Pointer(drafts), total); !ok {
		return nil, code, false
	}
	flat := int32s(drafts, total)
	h.draftLists = h.draftLists[:0]
	for i := range int(n) {
		h.draftLists = append(h.draftLists, flat[ip[i]:ip[i+1]:ip[i+1]])
	}
	return h.draftLists, C.PAGEDKV_OK, true
}

//export pagedkv_commit_spec
func pagedkv_commit_spec(id C.pagedkv_manager, accepted *C.int32_t, nAccepted C.int64_t, sampled *C.int32_t, nSampled C.int64_t) (code C.int32_t) {
	h, code := enter(id, "commit_spec")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if code, ok := checkArray("commit_spec", "accepted", unsafe.Pointer(accepted), nAccepted); !ok {
		return code
	}
	if code, ok := checkArray("commit_spec", "sampled", unsafe.Pointer(sampled), nSampled); !ok {
		return code
	}
	acc := int32s(accepted, nAccepted)
	if acc == nil {
		acc = []int32{}
	}
	var s []int32
	if sampled != nil {
		if s = int32s(sampled, nSampled); s == nil {
			s = []int32{}
		}
	}
	if err := h.m.CommitSpec(acc, s); err != nil {
		return failErr(err)
	}
	h.flushEvents()
	return C.PAGEDKV_OK
}

//export pagedkv_truncate
func pagedkv_truncate(id C.pagedkv_manager, rid C.uint64_t, n C.int64_t) (code C.int32_t) {
	h, code := enter(id, "truncate")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if n < 0 || n >= maxLen {
		return badArg("truncate request %d to %d tokens, want 0..%d", uint64(rid), int64(n), maxLen-1)
	}
	if err := h.m.Truncate(pagedkv.RequestID(rid), int(n)); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_commit
func pagedkv_commit(id C.pagedkv_manager, sampled *C.int32_t, n C.int64_t) (code C.int32_t) {
	h, code := enter(id, "commit")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if sampled == nil {
		if n != 0 {
			return badArg("commit: sampled is NULL with n_sampled = %d (NULL means nothing sampled; pass 0)", int64(n))
		}
		if err := h.m.Commit(nil); err != nil {
			return failErr(err)
		}
		h.flushEvents()
		return C.PAGEDKV_OK
	}
	if code, ok := checkArray("commit", "sampled", unsafe.Pointer(sampled), n); !ok {
		return code
	}
	s := int32s(sampled, n)
	if s == nil {
		s = []int32{} // not nil: an empty sampled list is checked against the batch
	}
	if err := h.m.Commit(s); err != nil {
		return failErr(err)
	}
	h.flushEvents()
	return C.PAGEDKV_OK
}

//export pagedkv_abort
func pagedkv_abort(id C.pagedkv_manager) (code C.int32_t) {
	h, code := enter(id, "abort")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if err := h.m.Abort(); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

// ---- Operations ----

//export pagedkv_get_stats
func pagedkv_get_stats(id C.pagedkv_manager, out *C.pagedkv_stats, size C.size_t) (code C.int32_t) {
	defer recoverTo(&code)
	s, code, ok := snapshot(id, "stats", unsafe.Pointer(out))
	if !ok {
		return code
	}
	v := [...]int64{
		int64(s.TotalPages), int64(s.FreePages), int64(s.UsedPages), int64(s.EvictablePages), int64(s.PinnedIdlePages),
		int64(s.CachedPages), int64(s.PinnedPages), int64(s.SharedPages),
		int64(s.Requests), int64(s.PreemptedRequests),
		s.PromptTokens, s.PromptHitTokens, s.ComputedTokens, s.ResumedTokens, s.ResumeHitTokens,
		s.Steps, s.Preemptions, s.CopiedPages, s.PublishedPages, s.DuplicatePages,
		s.EvictedPages, s.EvictionFreedPages, s.InnerVictims, s.WindowReleasedPages, s.ChainsCut,
		s.DraftTokens, s.AcceptedDraftTokens,
	}
	if unsafe.Sizeof(v) != C.sizeof_pagedkv_stats {
		panic("cabi: pagedkv_stats and Stats have different field counts")
	}
	writeInt64s(unsafe.Pointer(out), size, v[:])
	return C.PAGEDKV_OK
}

// snapshot is the Stats of handle id (the pool's, for a hybrid manager)
// for a call that writes them to out: lock-free, so any thread may ask,
// even while the owner is inside a call.
func snapshot(id C.pagedkv_manager, op string, out unsafe.Pointer) (pagedkv.Stats, C.int32_t, bool) {
	h := lookup(id)
	switch {
	case h == nil:
		return pagedkv.Stats{}, fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: %s: no manager with handle %d", op, uint64(id))), false
	case out == nil:
		return pagedkv.Stats{}, badArg("%s: out is NULL", op), false
	}
	return h.m.PoolStats(), C.PAGEDKV_OK, true
}

// writeInt64s writes v into a caller's struct of size bytes: an older
// caller's smaller struct gets the fields it knows; a newer caller's larger
// one gets zeros past ours.
func writeInt64s(out unsafe.Pointer, size C.size_t, v []int64) {
	n := min(uintptr(size), uintptr(len(v))*8)
	C.memset(out, 0, size)
	C.memcpy(out, unsafe.Pointer(&v[0]), C.size_t(n))
}

//export pagedkv_audit
func pagedkv_audit(id C.pagedkv_manager) (code C.int32_t) {
	h, code := enter(id, "audit")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if err := h.m.Audit(); err != nil {
		return fail(C.PAGEDKV_ERR_AUDIT, "pagedkv: audit: "+err.Error())
	}
	return C.PAGEDKV_OK
}

//export pagedkv_evict
func pagedkv_evict(id C.pagedkv_manager, npages C.int64_t, freed *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "evict")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if npages < 0 || npages >= maxLen {
		return badArg("evict: npages = %d, want 0..%d", int64(npages), maxLen-1)
	}
	n := h.m.Evict(int(npages))
	if freed != nil {
		*freed = C.int64_t(n)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_pin
func pagedkv_pin(id C.pagedkv_manager, ns *C.pagedkv_namespace, tokens *C.int32_t, n C.int64_t, pin *C.uint64_t, pinned *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "pin")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	return pinWith("pin", h, ns, tokens, n, 0, pin, pinned)
}

// pinWith is pagedkv_pin (ttl 0) and pagedkv_pin_for inside the call.
func pinWith(op string, h *handle, ns *C.pagedkv_namespace, tokens *C.int32_t, n C.int64_t, ttl time.Duration,
	pin *C.uint64_t, pinned *C.int64_t) C.int32_t {
	gns, code, ok := namespace(op, ns)
	if !ok {
		return code
	}
	if code, ok := checkArray(op, "tokens", unsafe.Pointer(tokens), n); !ok {
		return code
	}
	if pin == nil {
		return badArg("%s: pin is NULL (the pin's id is needed to unpin it)", op)
	}
	p, nt, err := h.m.PinFor(gns, int32s(tokens, n), ttl)
	if err != nil {
		return failErr(err)
	}
	*pin = C.uint64_t(p)
	if pinned != nil {
		*pinned = C.int64_t(nt)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_unpin
func pagedkv_unpin(id C.pagedkv_manager, pin C.uint64_t) (code C.int32_t) {
	h, code := enter(id, "unpin")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if err := h.m.Unpin(pagedkv.PinID(pin)); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

// ---- Inspection ----

//export pagedkv_get_request_state
func pagedkv_get_request_state(id C.pagedkv_manager, rid C.uint64_t, out *C.pagedkv_request_state) (code C.int32_t) {
	h, code := enterDense(id, "request_state")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	return h.requestState("request_state", 0, rid, out)
}

// requestState fills out with request rid's state, its pages those of
// group g (0 for a dense handle), after checking g.
func (h *handle) requestState(op string, g int, rid C.uint64_t, out *C.pagedkv_request_state) C.int32_t {
	if code, ok := h.checkGroup(op, C.int64_t(g)); !ok {
		return code
	}
	if out == nil {
		return badArg("%s: out is NULL", op)
	}
	r := pagedkv.RequestID(rid)
	if !h.m.Has(r) {
		return failErr(fmt.Errorf("%w: %s of request %d", pagedkv.ErrUnknownRequest, op, uint64(rid)))
	}
	*out = C.pagedkv_request_state{computed: C.int64_t(h.m.Computed(r)), num_tokens: C.int64_t(len(h.m.Tokens(r)))}
	if h.m.Running(r) {
		pages, start := h.pagesOf(g, r)
		out.running, out.start, out.num_pages = 1, C.int64_t(start), C.int64_t(len(pages))
	}
	return C.PAGEDKV_OK
}

// pagesOf is request r's pages in group g (0 for a dense handle) and the
// first token they hold.
func (h *handle) pagesOf(g int, r pagedkv.RequestID) ([]pagedkv.PageID, int) {
	return h.m.GroupPages(g, r)
}

//export pagedkv_request_tokens
func pagedkv_request_tokens(id C.pagedkv_manager, rid C.uint64_t, dst *C.int32_t, capacity C.int64_t, n *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "request_tokens")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	r := pagedkv.RequestID(rid)
	if !h.m.Has(r) {
		return failErr(fmt.Errorf("%w: request_tokens of request %d", pagedkv.ErrUnknownRequest, uint64(rid)))
	}
	return copyOut("request_tokens", h.m.Tokens(r), dst, capacity, n)
}

//export pagedkv_request_pages
func pagedkv_request_pages(id C.pagedkv_manager, rid C.uint64_t, dst *C.int32_t, capacity C.int64_t, n *C.int64_t) (code C.int32_t) {
	h, code := enterDense(id, "request_pages")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	return h.requestPages("request_pages", 0, rid, dst, capacity, n)
}

// requestPages copies request rid's pages in group g into dst, after
// checking g.
func (h *handle) requestPages(op string, g int, rid C.uint64_t, dst *C.int32_t, capacity C.int64_t, n *C.int64_t) C.int32_t {
	if code, ok := h.checkGroup(op, C.int64_t(g)); !ok {
		return code
	}
	r := pagedkv.RequestID(rid)
	if !h.m.Has(r) {
		return failErr(fmt.Errorf("%w: %s of request %d", pagedkv.ErrUnknownRequest, op, uint64(rid)))
	}
	var pages []int32
	if h.m.Running(r) {
		p, _ := h.pagesOf(g, r)
		pages = unsafe.Slice((*int32)(unsafe.SliceData(p)), len(p))
	}
	return copyOut(op, pages, dst, capacity, n)
}

func copyOut(op string, src []int32, dst *C.int32_t, capacity C.int64_t, n *C.int64_t) C.int32_t {
	if code, ok := checkArray(op, "dst", unsafe.Pointer(dst), capacity); !ok {
		return code
	}
	if n == nil {
		return badArg("%s: n is NULL", op)
	}
	copy(int32s(dst, capacity), src)
	*n = C.int64_t(len(src))
	return C.PAGEDKV_OK
}

//export pagedkv_pending
func pagedkv_pending(id C.pagedkv_manager, pending *C.int32_t) (code C.int32_t) {
	h, code := enterDense(id, "pending")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if pending == nil {
		return badArg("pending: pending is NULL")
	}
	*pending = 0
	if h.m.Pending() {
		*pending = 1
	}
	return C.PAGEDKV_OK
}

// pagedkv_debug_panic panics inside a call on handle id, so that bindings
// can test that no panic crosses the boundary and that the handle is then
// poisoned. It is not in pagedkv.h: tests declare it themselves.
//
//export pagedkv_debug_panic
func pagedkv_debug_panic(id C.pagedkv_manager) (code C.int32_t) {
	h, code := enter(id, "debug_panic")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	panic("pagedkv_debug_panic was called")
}
