package main

/*
#include <stdlib.h>
#include <string.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
const char *pagedkv_last_error(void);
*/
import "C"

import (
	"slices"
	"unsafe"
)

// This file calls the exported functions from Go exactly as C would (same
// arguments, same memory rules), for the Go tests, benchmarks and the fuzz
// target: test files cannot use cgo's C types. Nothing here is reachable
// from C. A slice argument is passed as a pointer to its first element (nil
// for a nil slice) with the length given separately, so tests can pass
// lengths that do not match, as a buggy caller would; a length must never
// exceed the slice's, or the library would read past it, as it would in C.

func ptr32(s []int32) *C.int32_t {
	if s == nil {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(s)))
}

func ptrU64(s []uint64) *C.uint64_t {
	if s == nil {
		return nil
	}
	return (*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(s)))
}

// abiConfig is pagedkv_config.
type abiConfig struct {
	NumPages, PageSize, WindowTokens, Priorities, MaxPinnedPages int64
	HashSeed                                                     uint64
	CascadeMinSavedPages                                         int64
	MemoryLimit                                                  int64
	BlockTablesStride                                            int64
	PinBudget                                                    float64
}

func (cfg abiConfig) c() C.pagedkv_config {
	return C.pagedkv_config{
		num_pages: C.int64_t(cfg.NumPages), page_size: C.int64_t(cfg.PageSize), window_tokens: C.int64_t(cfg.WindowTokens),
		priorities: C.int64_t(cfg.Priorities), max_pinned_pages: C.int64_t(cfg.MaxPinnedPages),
		hash_seed: C.uint64_t(cfg.HashSeed), cascade_min_saved_pages: C.int64_t(cfg.CascadeMinSavedPages),
		memory_limit: C.int64_t(cfg.MemoryLimit), block_tables_stride: C.int64_t(cfg.BlockTablesStride),
		pin_budget: C.double(cfg.PinBudget),
	}
}

// goBlockTables is pagedkv_get_block_tables of group g: the table, its
// stride and max_seq_len.
func goBlockTables(h uint64, g int64) ([]int32, int64, int64, int32) {
	var out C.pagedkv_block_tables
	code := pagedkv_get_block_tables(C.pagedkv_manager(h), C.int64_t(g), &out, C.sizeof_pagedkv_block_tables)
	return readArray(out.block_tables), int64(out.stride), int64(out.max_seq_len), int32(code)
}

// goBlockTablesBad calls pagedkv_get_block_tables with a NULL out (null)
// or a wrong size (0: the right one).
func goBlockTablesBad(h uint64, g int64, null bool, size uintptr) int32 {
	var out C.pagedkv_block_tables
	p := &out
	if null {
		p = nil
	}
	if size == 0 {
		size = C.sizeof_pagedkv_block_tables
	}
	return int32(pagedkv_get_block_tables(C.pagedkv_manager(h), C.int64_t(g), p, C.size_t(size)))
}

func goCreate(cfg abiConfig) (uint64, int32) {
	c := cfg.c()
	var h C.pagedkv_manager
	code := pagedkv_create(&c, C.sizeof_pagedkv_config, &h)
	return uint64(h), int32(code)
}

func goDestroy(h uint64) int32 { return int32(pagedkv_destroy(C.pagedkv_manager(h))) }

// abiRequest is pagedkv_request; a nil Prompt with PromptLen > 0 is a NULL
// pointer with a length.
type abiRequest struct {
	Tenant            string
	Prompt            []int32
	PromptLen         int64
	Priority          int32
	NoCache           bool
	CapacityTokens    int64
	TenantLenOverride int64 // if nonzero, the tenant length passed (with the tenant's pointer, or NULL when Tenant is "")
}

func goAdd(h, id uint64, r abiRequest) (int64, int32) {
	var req C.pagedkv_request
	if r.Tenant != "" {
		req.ns.tenant = (*C.char)(unsafe.Pointer(unsafe.StringData(r.Tenant)))
	}
	req.ns.tenant_len = C.int64_t(len(r.Tenant))
	if r.TenantLenOverride != 0 {
		req.ns.tenant_len = C.int64_t(r.TenantLenOverride)
	}
	req.prompt, req.prompt_len = ptr32(r.Prompt), C.int64_t(r.PromptLen)
	req.priority, req.capacity_tokens = C.int32_t(r.Priority), C.int64_t(r.CapacityTokens)
	if r.NoCache {
		req.no_cache = 1
	}
	var matched C.int64_t
	code := pagedkv_add(C.pagedkv_manager(h), C.uint64_t(id), &req, &matched)
	return int64(matched), int32(code)
}

func goExtend(h, id uint64, tokens []int32, n int64) int32 {
	return int32(pagedkv_extend(C.pagedkv_manager(h), C.uint64_t(id), ptr32(tokens), C.int64_t(n)))
}

func goFork(h, parent, child uint64) int32 {
	return int32(pagedkv_fork(C.pagedkv_manager(h), C.uint64_t(parent), C.uint64_t(child)))
}

func goPreempt(h, id uint64) int32 {
	return int32(pagedkv_preempt(C.pagedkv_manager(h), C.uint64_t(id)))
}

func goResume(h, id uint64) (int64, int32) {
	var matched C.int64_t
	code := pagedkv_resume(C.pagedkv_manager(h), C.uint64_t(id), &matched)
	return int64(matched), int32(code)
}

func goRelease(h, id uint64) int32 {
	return int32(pagedkv_release(C.pagedkv_manager(h), C.uint64_t(id)))
}

// abiPlan is a pagedkv_plan read back: every array copied out.
type abiPlan struct {
	BatchSize, NNZ, WindowLeft int64
	AttentionKind              int64
	Arrays                     map[string][]int32
	Levels                     []map[string][]int32
}

func readArray(a C.pagedkv_array) []int32 {
	if a.len == 0 {
		return nil
	}
	return append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(a.data)), int(a.len))...)
}

func (p *abiPlan) read(c *C.pagedkv_plan) {
	p.BatchSize, p.NNZ, p.WindowLeft = int64(c.batch_size), int64(c.nnz), int64(c.window_left)
	p.AttentionKind = int64(c.attention_kind)
	p.Arrays = map[string][]int32{
		"copies": readArray(c.copies), "qo_indptr": readArray(c.qo_indptr), "batch_indices": readArray(c.batch_indices),
		"positions": readArray(c.positions), "token_ids": readArray(c.token_ids), "token_positions": readArray(c.token_positions),
		"kv_indptr": readArray(c.kv_indptr), "kv_page_indices": readArray(c.kv_page_indices),
		"kv_last_page_len": readArray(c.kv_last_page_len), "seq_lens": readArray(c.seq_lens), "query_rows": readArray(c.query_rows),
	}
	p.Levels = nil
	if c.num_levels > 0 {
		for _, lv := range unsafe.Slice(c.levels, int(c.num_levels)) {
			p.Levels = append(p.Levels, map[string][]int32{
				"qo_indptr": readArray(lv.qo_indptr), "kv_indptr": readArray(lv.kv_indptr),
				"kv_indices": readArray(lv.kv_indices), "kv_last_page_len": readArray(lv.kv_last_page_len),
			})
		}
	}
}

// goReserve reserves; out receives the plan struct (nil passes NULL).
func goReserve(h uint64, ids []uint64, nt []int32, n int64, out *abiPlanC) int32 {
	return int32(pagedkv_reserve(C.pagedkv_manager(h), ptrU64(ids), ptr32(nt), C.int64_t(n), out.ptr()))
}

// abiPlanC holds a pagedkv_plan as C would (in caller memory).
type abiPlanC struct{ c C.pagedkv_plan }

// ptr is the plan argument of a call: NULL for a nil *abiPlanC.
func (p *abiPlanC) ptr() *C.pagedkv_plan {
	if p == nil {
		return nil
	}
	return &p.c
}

func (p *abiPlanC) read() abiPlan {
	var out abiPlan
	out.read(&p.c)
	return out
}

// cPlan is a pagedkv_plan in C memory, where a C or Python caller keeps it
// (an abiPlanC lives in the Go heap, whose pointer slots the collector
// scans, so it cannot show what the runtime does with C memory).
type cPlan struct{ c *C.pagedkv_plan }

func newCPlan() cPlan {
	return cPlan{(*C.pagedkv_plan)(C.calloc(1, C.sizeof_pagedkv_plan))}
}

func (p cPlan) free() { C.free(unsafe.Pointer(p.c)) }

// fillWords sets every 8-byte word of the struct to w, with integer stores:
// what stale caller memory may hold.
func (p cPlan) fillWords(w uintptr) { fillWords(unsafe.Pointer(p.c), C.sizeof_pagedkv_plan, w) }

// fillWords sets the size/8 words at ptr (C memory) to w.
func fillWords(ptr unsafe.Pointer, size int, w uintptr) {
	words := unsafe.Slice((*uintptr)(ptr), size/8)
	for i := range words {
		words[i] = w
	}
}

func (p cPlan) read() abiPlan {
	var out abiPlan
	out.read(p.c)
	return out
}

func goReserveC(h uint64, ids []uint64, nt []int32, n int64, p cPlan) int32 {
	return int32(pagedkv_reserve(C.pagedkv_manager(h), ptrU64(ids), ptr32(nt), C.int64_t(n), p.c))
}

func goCommit(h uint64, sampled []int32, n int64) int32 {
	return int32(pagedkv_commit(C.pagedkv_manager(h), ptr32(sampled), C.int64_t(n)))
}

func goAbort(h uint64) int32 { return int32(pagedkv_abort(C.pagedkv_manager(h))) }

func goAudit(h uint64) int32 { return int32(pagedkv_audit(C.pagedkv_manager(h))) }

func goEvict(h uint64, n int64) (int64, int32) {
	var freed C.int64_t
	code := pagedkv_evict(C.pagedkv_manager(h), C.int64_t(n), &freed)
	return int64(freed), int32(code)
}

func goPin(h uint64, tokens []int32, n int64) (uint64, int64, int32) {
	var pin C.uint64_t
	var pinned C.int64_t
	code := pagedkv_pin(C.pagedkv_manager(h), nil, ptr32(tokens), C.int64_t(n), &pin, &pinned)
	return uint64(pin), int64(pinned), int32(code)
}

func goUnpin(h, pin uint64) int32 { return int32(pagedkv_unpin(C.pagedkv_manager(h), C.uint64_t(pin))) }

// goStats returns the stats as int64 fields in pagedkv_stats order.
func goStats(h uint64) ([]int64, int32) {
	var s C.pagedkv_stats
	code := pagedkv_get_stats(C.pagedkv_manager(h), &s, C.sizeof_pagedkv_stats)
	n := int(C.sizeof_pagedkv_stats / 8)
	return append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(&s)), n)...), int32(code)
}

// goRequestState returns running, computed, num_tokens, start, num_pages.
func goRequestState(h, id uint64) ([5]int64, int32) {
	var s C.pagedkv_request_state
	code := pagedkv_get_request_state(C.pagedkv_manager(h), C.uint64_t(id), &s)
	return [5]int64{int64(s.running), int64(s.computed), int64(s.num_tokens), int64(s.start), int64(s.num_pages)}, int32(code)
}

func goRequestTokens(h, id uint64, dst []int32) (int64, int32) {
	var n C.int64_t
	code := pagedkv_request_tokens(C.pagedkv_manager(h), C.uint64_t(id), ptr32(dst), C.int64_t(len(dst)), &n)
	return int64(n), int32(code)
}

// goLastError is the calling thread's last message: lock the goroutine to
// its thread (runtime.LockOSThread) around the failing call and this.
func goLastError() string { return C.GoString(C.pagedkv_last_error()) }

// Error codes for the tests.
const (
	codeOK             = C.PAGEDKV_OK
	codeOutOfPages     = C.PAGEDKV_ERR_OUT_OF_PAGES
	codeUnknownRequest = C.PAGEDKV_ERR_UNKNOWN_REQUEST
	codeBadArgument    = C.PAGEDKV_ERR_BAD_ARGUMENT
	codeBadConfig      = C.PAGEDKV_ERR_BAD_CONFIG
	codeBadHandle      = C.PAGEDKV_ERR_BAD_HANDLE
	codeInternal       = C.PAGEDKV_ERR_INTERNAL
	codeBusy           = C.PAGEDKV_ERR_BUSY
)

// goReserveSpec is pagedkv_reserve_spec; indptr nil passes NULL.
func goReserveSpec(h uint64, ids []uint64, nt []int32, n int64, indptr, drafts []int32, out *abiPlanC) int32 {
	return int32(pagedkv_reserve_spec(C.pagedkv_manager(h), ptrU64(ids), ptr32(nt), C.int64_t(n), ptr32(indptr), ptr32(drafts), out.ptr()))
}

func goCommitSpec(h uint64, accepted []int32, na int64, sampled []int32, ns int64) int32 {
	return int32(pagedkv_commit_spec(C.pagedkv_manager(h), ptr32(accepted), C.int64_t(na), ptr32(sampled), C.int64_t(ns)))
}

func goTruncate(h, id uint64, n int64) int32 {
	return int32(pagedkv_truncate(C.pagedkv_manager(h), C.uint64_t(id), C.int64_t(n)))
}

// abiGroup is pagedkv_layer_group.
type abiGroup struct{ Kind, WindowTokens, ChunkTokens, NumLayers int64 }

func goHybridCreate(cfg abiConfig, groups []abiGroup) (uint64, int32) {
	return goHybridCreateSized(cfg, groups, C.sizeof_pagedkv_config)
}

// goHybridCreateSized is goHybridCreate passing cfgSize as cfg_size (the
// config is in C memory of exactly that size, as an older caller's is).
func goHybridCreateSized(cfg abiConfig, groups []abiGroup, cfgSize uintptr) (uint64, int32) {
	c := cfg.c()
	cc := C.malloc(C.size_t(max(cfgSize, 1)))
	defer C.free(cc)
	C.memcpy(cc, unsafe.Pointer(&c), C.size_t(min(cfgSize, C.sizeof_pagedkv_config)))
	gs := cGroups(groups)
	defer C.free(unsafe.Pointer(gs))
	var h C.pagedkv_manager
	code := pagedkv_hybrid_create((*C.pagedkv_config)(cc), C.size_t(cfgSize), gs, C.int64_t(len(groups)), C.sizeof_pagedkv_layer_group, &h)
	return uint64(h), int32(code)
}

// cGroups is groups as a C array (C.free it).
func cGroups(groups []abiGroup) *C.pagedkv_layer_group {
	gs := (*C.pagedkv_layer_group)(C.calloc(C.size_t(max(len(groups), 1)), C.sizeof_pagedkv_layer_group))
	for i, g := range groups {
		unsafe.Slice(gs, len(groups))[i] = C.pagedkv_layer_group{kind: C.int64_t(g.Kind), window_tokens: C.int64_t(g.WindowTokens),
			chunk_tokens: C.int64_t(g.ChunkTokens), num_layers: C.int64_t(g.NumLayers)}
	}
	return gs
}

// cHybridPlan is hybrid reserve's out arguments in C memory: the copies
// descriptor and n group plans.
type cHybridPlan struct {
	copies *C.pagedkv_array
	groups *C.pagedkv_group_plan
	n      int
}

func newCHybridPlan(n int) cHybridPlan {
	return cHybridPlan{(*C.pagedkv_array)(C.calloc(1, C.sizeof_pagedkv_array)),
		(*C.pagedkv_group_plan)(C.calloc(C.size_t(n), C.sizeof_pagedkv_group_plan)), n}
}

func (p cHybridPlan) free() {
	C.free(unsafe.Pointer(p.copies))
	C.free(unsafe.Pointer(p.groups))
}

// fillWords sets every word of the out arguments to w (see cPlan).
func (p cHybridPlan) fillWords(w uintptr) {
	fillWords(unsafe.Pointer(p.copies), C.sizeof_pagedkv_array, w)
	fillWords(unsafe.Pointer(p.groups), p.n*C.sizeof_pagedkv_group_plan, w)
}

// abiGroupPlan is a pagedkv_group_plan read back.
type abiGroupPlan struct {
	abiPlan
	Hybrid map[string][]int32 // cascade_window_left and the attn_* arrays
}

func (p cHybridPlan) read() (copies []int32, groups []abiGroupPlan) {
	for _, g := range unsafe.Slice(p.groups, p.n) {
		var out abiGroupPlan
		out.abiPlan.read(&g.plan)
		out.Hybrid = map[string][]int32{
			"cascade_window_left": readArray(g.cascade_window_left), "attn_qo_indptr": readArray(g.attn_qo_indptr),
			"attn_kv_indptr": readArray(g.attn_kv_indptr), "attn_kv_page_indices": readArray(g.attn_kv_page_indices),
			"attn_kv_last_page_len": readArray(g.attn_kv_last_page_len), "attn_requests": readArray(g.attn_requests),
		}
		groups = append(groups, out)
	}
	return readArray(*p.copies), groups
}

func goHybridReserveC(h uint64, ids []uint64, nt []int32, n int64, p cHybridPlan) int32 {
	return int32(pagedkv_hybrid_reserve(C.pagedkv_manager(h), ptrU64(ids), ptr32(nt), C.int64_t(n), p.copies, p.groups, C.int64_t(p.n)))
}

// abiOptions is pagedkv_options with a pagedkv_tier_config (HostPages < 0
// … or any field) and, when Events, a pagedkv_events_config. The *Size
// fields, when nonzero, replace the sizes passed (a caller's mistake);
// a HostMemoryLen with a nil HostMemory is a NULL with a length.
type abiOptions struct {
	Tiers                                 bool
	HostPages                             int64
	Layout, DType, Heads, Dim, Layers     int64
	HostMemory                            []byte
	HostMemoryLen                         int64
	DeadlineUS, OffloadFree, WriteThrough int64
	Redis, Disk                           *abiStore
	Events                                bool
	QueueBatches, Rank                    int64
	OptsSize, TiersSize, EventsSize       uint64 // Groups, when not nil, make it pagedkv_hybrid_create_ex.
	Groups                                []abiGroup

	RedisSize, DiskSize uint64
}

// abiStore is pagedkv_redis_config or pagedkv_disk_config: three strings
// (addr or dir, ns, group) and the integer fields in header order.
type abiStore struct {
	S    [3]string
	Ints [6]int64
}

func cstr(s string) *C.char {
	if s == "" {
		return nil
	}
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s)))
}

func sizeOr(v uint64, def C.size_t) C.size_t {
	if v != 0 {
		return C.size_t(v)
	}
	return def
}

func goCreateEx(cfg abiConfig, o *abiOptions) (uint64, int32) {
	c := cfg.c()
	var opts C.pagedkv_options
	var t C.pagedkv_tier_config
	var e C.pagedkv_events_config
	var r C.pagedkv_redis_config
	var d C.pagedkv_disk_config
	if o.Tiers {
		t = C.pagedkv_tier_config{host_pages: C.int64_t(o.HostPages), remote_deadline_us: C.int64_t(o.DeadlineUS),
			offload_free_pages: C.int64_t(o.OffloadFree), write_through: C.int64_t(o.WriteThrough), host_memory_len: C.int64_t(o.HostMemoryLen)}
		t.format = C.pagedkv_page_format{kv_layout: C.int64_t(o.Layout), dtype: C.int64_t(o.DType), num_kv_heads: C.int64_t(o.Heads),
			head_dim: C.int64_t(o.Dim), num_layers: C.int64_t(o.Layers)}
		if o.HostMemory != nil {
			t.host_memory = unsafe.Pointer(unsafe.SliceData(o.HostMemory))
		}
		if s := o.Redis; s != nil {
			r = C.pagedkv_redis_config{addr: cstr(s.S[0]), addr_len: C.int64_t(len(s.S[0])), ns: cstr(s.S[1]), ns_len: C.int64_t(len(s.S[1])),
				group: cstr(s.S[2]), group_len: C.int64_t(len(s.S[2])), tag_by_chain: C.int64_t(s.Ints[0]), queue_len: C.int64_t(s.Ints[1]),
				batch: C.int64_t(s.Ints[2]), expiry_ms: C.int64_t(s.Ints[3]), write_timeout_ms: C.int64_t(s.Ints[4]), dial_timeout_ms: C.int64_t(s.Ints[5])}
			t.redis, t.redis_size = &r, sizeOr(o.RedisSize, C.sizeof_pagedkv_redis_config)
		}
		if s := o.Disk; s != nil {
			d = C.pagedkv_disk_config{dir: cstr(s.S[0]), dir_len: C.int64_t(len(s.S[0])), ns: cstr(s.S[1]), ns_len: C.int64_t(len(s.S[1])),
				group: cstr(s.S[2]), group_len: C.int64_t(len(s.S[2])), pages: C.int64_t(s.Ints[0]), segment_pages: C.int64_t(s.Ints[1]),
				queue_len: C.int64_t(s.Ints[2]), sync_every: C.int64_t(s.Ints[3])}
			t.disk, t.disk_size = &d, sizeOr(o.DiskSize, C.sizeof_pagedkv_disk_config)
		}
		opts.tiers, opts.tiers_size = &t, sizeOr(o.TiersSize, C.sizeof_pagedkv_tier_config)
	}
	if o.Events {
		e = C.pagedkv_events_config{queue_batches: C.int64_t(o.QueueBatches), data_parallel_rank: C.int64_t(o.Rank)}
		opts.events, opts.events_size = &e, sizeOr(o.EventsSize, C.sizeof_pagedkv_events_config)
	}
	var h C.pagedkv_manager
	if o.Groups != nil {
		gs := cGroups(o.Groups)
		defer C.free(unsafe.Pointer(gs))
		code := pagedkv_hybrid_create_ex(&c, C.sizeof_pagedkv_config, gs, C.int64_t(len(o.Groups)), C.sizeof_pagedkv_layer_group,
			&opts, sizeOr(o.OptsSize, C.sizeof_pagedkv_options), &h)
		return uint64(h), int32(code)
	}
	code := pagedkv_create_ex(&c, C.sizeof_pagedkv_config, &opts, sizeOr(o.OptsSize, C.sizeof_pagedkv_options), &h)
	return uint64(h), int32(code)
}

// abiTierCopy is one entry of pagedkv_tier_copies.
type abiTierCopy struct {
	ID             uint64
	Dir, Dev, Host int32
}

// goTierCopies takes the planned tier copies into dst (reused).
func goTierCopies(h uint64, dst []abiTierCopy) ([]abiTierCopy, int32) {
	var out C.pagedkv_tier_copies
	code := int32(pagedkv_tier_copies_take(C.pagedkv_manager(h), &out))
	dst = dst[:0]
	if code != 0 {
		return dst, code
	}
	n := int(out.n)
	if n > 0 {
		ids := unsafe.Slice((*uint64)(unsafe.Pointer(out.ids)), n)
		dirs, dev, host := unsafe.Slice((*int32)(unsafe.Pointer(out.dirs)), n), unsafe.Slice((*int32)(unsafe.Pointer(out.device_pages)), n),
			unsafe.Slice((*int32)(unsafe.Pointer(out.host_pages)), n)
		for i := range n {
			dst = append(dst, abiTierCopy{ids[i], dirs[i], dev[i], host[i]})
		}
	}
	return dst, code
}

func goCompleteTierCopies(h uint64, ids []uint64, n int64) int32 {
	return int32(pagedkv_complete_tier_copies(C.pagedkv_manager(h), ptrU64(ids), C.int64_t(n)))
}

// goDrainEvents returns the next batch's payload (a view of the handle's
// buffer, valid until the next drain), nil when none is left.
func goDrainEvents(h uint64) ([]byte, int32) {
	data, n := &drainOut.data, &drainOut.n // not on the heap per call
	code := int32(pagedkv_drain_events(C.pagedkv_manager(h), data, n))
	if code != 0 || *n == 0 {
		return nil, code
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(*data)), int(*n)), code
}

// drainOut is goDrainEvents' out-parameters (the tests drain from one
// goroutine at a time).
var drainOut struct {
	data *C.uint8_t
	n    C.int64_t
}

// goCachedHashes is pagedkv_cached_hashes of medium (PAGEDKV_MEDIUM_*)
// into a buffer of capacity hashes.
func goCachedHashes(h uint64, medium int32, capacity int) ([]uint64, int32) {
	p := (*C.uint64_t)(C.malloc(C.size_t(max(capacity, 1) * 8)))
	defer C.free(unsafe.Pointer(p))
	var n C.int64_t
	code := int32(pagedkv_cached_hashes(C.pagedkv_manager(h), C.int32_t(medium), p, C.int64_t(capacity), &n))
	if code != 0 {
		return nil, code
	}
	return slices.Clone(unsafe.Slice((*uint64)(unsafe.Pointer(p)), int(n))), code
}

func goTierStats(h uint64) ([]int64, int32) {
	var s C.pagedkv_tier_stats
	code := int32(pagedkv_get_tier_stats(C.pagedkv_manager(h), &s, C.sizeof_pagedkv_tier_stats))
	return unsafe.Slice((*int64)(unsafe.Pointer(&s)), C.sizeof_pagedkv_tier_stats/8), code
}

// goGroupStats is pagedkv_hybrid_get_group_stats of group g into a struct
// of size bytes (the fields past it stay -1), as int64 fields.
func goGroupStats(h uint64, g int64, size uintptr) ([]int64, int32) {
	n := max(int(size), C.sizeof_pagedkv_group_stats) / 8
	p := (*C.pagedkv_group_stats)(C.malloc(C.size_t(n * 8)))
	defer C.free(unsafe.Pointer(p))
	v := unsafe.Slice((*int64)(unsafe.Pointer(p)), n)
	for i := range v {
		v[i] = -1
	}
	code := int32(pagedkv_hybrid_get_group_stats(C.pagedkv_manager(h), C.int64_t(g), p, C.size_t(size)))
	return append([]int64(nil), v...), code
}

// configSizes are the sizes pagedkv_create accepts: sizeof(pagedkv_config),
// that of ABI 2's first release, without memory_limit, that without
// block_tables_stride, that without pin_budget, and that without
// state_checkpoint_every.
var configSizes = [5]uintptr{C.sizeof_pagedkv_config, uintptr(configSizeV2), uintptr(configSizeV3), uintptr(configSizeV4), uintptr(configSizeV5)}

func goDestroyKeepMemory(h uint64) int32 {
	return int32(pagedkv_destroy_keep_memory(C.pagedkv_manager(h)))
}

func goFreeMemory(h uint64) int32 { return int32(pagedkv_free_memory(C.pagedkv_manager(h))) }

// kvPageIndices is the plan's kv_page_indices buffer, [0, cap), as the
// caller sees it: memory it may keep a pointer to.
func (p cPlan) kvPageIndices() []int32 {
	a := p.c.kv_page_indices
	return unsafe.Slice((*int32)(unsafe.Pointer(a.data)), int(a.cap))
}

func goSetBusyTimeout(h uint64, ms int64) int32 {
	return int32(pagedkv_set_busy_timeout(C.pagedkv_manager(h), C.int64_t(ms)))
}

// goHold takes h's busy flag as a call in flight on another thread would;
// the function returned releases it.
func goHold(h uint64) func() {
	hd := lookup(C.pagedkv_manager(h))
	if !hd.busy.CompareAndSwap(false, true) {
		panic("goHold: the handle is busy")
	}
	return hd.release
}

// goLockFree calls every lock-free export on h (a hybrid manager with
// tiers and events) and returns their codes.
func goLockFree(h uint64) []int32 {
	m := C.pagedkv_manager(h)
	var st C.pagedkv_stats
	var ts C.pagedkv_tier_stats
	var gs C.pagedkv_group_stats
	var cu C.pagedkv_cache_usage
	var n, pb, np C.int64_t
	var data *C.uint8_t
	return []int32{
		int32(pagedkv_get_stats(m, &st, C.sizeof_pagedkv_stats)),
		int32(pagedkv_get_cache_usage_totals(m, &cu, C.sizeof_pagedkv_cache_usage)),
		int32(pagedkv_get_tier_stats(m, &ts, C.sizeof_pagedkv_tier_stats)),
		int32(pagedkv_hybrid_get_group_stats(m, 0, &gs, C.sizeof_pagedkv_group_stats)),
		int32(pagedkv_hybrid_num_groups(m, &n)),
		int32(pagedkv_host_memory(m, &data, &pb, &np)),
		int32(pagedkv_set_busy_timeout(m, 0)),
	}
}

func lookupHandle(h uint64) *handle { return lookup(C.pagedkv_manager(h)) }

// headerAttentionKinds are the header's PAGEDKV_ATTENTION_* by the name
// kernels.AttentionKind's String gives them.
func headerAttentionKinds() map[string]int64 {
	return map[string]int64{"decode": C.PAGEDKV_ATTENTION_DECODE, "prefill": C.PAGEDKV_ATTENTION_PREFILL,
		"cascade": C.PAGEDKV_ATTENTION_CASCADE, "chunked": C.PAGEDKV_ATTENTION_CHUNKED}
}
