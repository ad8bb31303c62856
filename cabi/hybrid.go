package main

/*
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/pagedkv/pagedkv"
)

// groupKinds maps PAGEDKV_GROUP_* to a LayerGroup of that kind.
var groupKinds = [...]pagedkv.LayerGroup{
	C.PAGEDKV_GROUP_FULL:    {Kind: pagedkv.FullAttention},
	C.PAGEDKV_GROUP_SLIDING: {Kind: pagedkv.SlidingAttention},
	C.PAGEDKV_GROUP_CHUNKED: {Kind: pagedkv.ChunkedAttention},
	C.PAGEDKV_GROUP_MLA:     {Kind: pagedkv.MLAAttention},
}

// maxGroups bounds pagedkv_hybrid_create's num_groups (before the memory
// check, which bounds groups x pages).
const maxGroups = 1 << 16

// The hybrid calls: a handle whose manager is a pagedkv.HybridManager. The
// shared calls (add, commit, ...) reach it through handle.m; these are the
// ones whose arguments or results have groups.

//export pagedkv_hybrid_create
func pagedkv_hybrid_create(cfg *C.pagedkv_config, size C.size_t, groups *C.pagedkv_layer_group, n C.int64_t,
	groupSize C.size_t, out *C.pagedkv_manager) (code C.int32_t) {
	defer recoverTo(&code)
	return hybridCreate(cfg, size, groups, n, groupSize, nil, 0, out)
}

//export pagedkv_hybrid_create_ex
func pagedkv_hybrid_create_ex(cfg *C.pagedkv_config, size C.size_t, groups *C.pagedkv_layer_group, n C.int64_t,
	groupSize C.size_t, opts *C.pagedkv_options, optsSize C.size_t, out *C.pagedkv_manager) (code C.int32_t) {
	defer recoverTo(&code)
	return hybridCreate(cfg, size, groups, n, groupSize, opts, optsSize, out)
}

func hybridCreate(cfg *C.pagedkv_config, size C.size_t, groups *C.pagedkv_layer_group, n C.int64_t,
	groupSize C.size_t, opts *C.pagedkv_options, optsSize C.size_t, out *C.pagedkv_manager) C.int32_t {
	gcfg, clk, code, ok := goConfig("hybrid_create", cfg, size, out)
	if !ok {
		return code
	}
	switch {
	case groupSize != C.sizeof_pagedkv_layer_group:
		return badArg("hybrid_create: group_size = %d, want sizeof(pagedkv_layer_group) = %d", uint64(groupSize), C.sizeof_pagedkv_layer_group)
	case n < 1 || n > maxGroups:
		return badArg("hybrid_create: num_groups = %d, want 1..%d", int64(n), maxGroups)
	case groups == nil:
		return badArg("hybrid_create: groups is NULL with num_groups = %d", int64(n))
	}
	specs := make([]pagedkv.LayerGroup, n)
	for i, g := range unsafe.Slice(groups, int(n)) {
		if g.kind < 0 || g.kind >= C.int64_t(len(groupKinds)) {
			return badArg("hybrid_create: groups[%d].kind = %d, want PAGEDKV_GROUP_FULL (0), SLIDING (1), CHUNKED (2) or MLA (3)", i, int64(g.kind))
		}
		specs[i] = groupKinds[g.kind]
		specs[i].WindowTokens, specs[i].ChunkTokens, specs[i].NumLayers = int(g.window_tokens), int(g.chunk_tokens), int(g.num_layers)
	}
	ext, code, ok := newExtras("hybrid_create", opts, optsSize, &gcfg, specs)
	if !ok {
		return code
	}
	m, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: gcfg, Groups: specs})
	if err != nil {
		ext.close()
		return failErr(err)
	}
	h := &handle{m: m, hybrid: true, plans: make([]planExport, len(specs)), clock: clk}
	h.adopt(ext)
	*out = register(h)
	return C.PAGEDKV_OK
}

//export pagedkv_hybrid_num_groups
func pagedkv_hybrid_num_groups(id C.pagedkv_manager, n *C.int64_t) (code C.int32_t) {
	defer recoverTo(&code)
	// Lock-free: the groups are fixed at creation (register).
	h, code := peek(id, "hybrid_num_groups")
	if h == nil {
		return code
	}
	if !h.hybrid {
		return wrongKind(id, "hybrid_num_groups", true)
	}
	if n == nil {
		return badArg("hybrid_num_groups: num_groups is NULL")
	}
	*n = C.int64_t(h.numGroups)
	return C.PAGEDKV_OK
}

//export pagedkv_hybrid_reserve
func pagedkv_hybrid_reserve(id C.pagedkv_manager, ids *C.uint64_t, ntokens *C.int32_t, n C.int64_t,
	copies *C.pagedkv_array, groups *C.pagedkv_group_plan, ngroups C.int64_t) (code C.int32_t) {
	h, code := enterHybrid(id, "hybrid_reserve")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	return h.hybridReserve("hybrid_reserve", ids, ntokens, n, nil, nil, copies, groups, ngroups)
}

//export pagedkv_hybrid_reserve_spec
func pagedkv_hybrid_reserve_spec(id C.pagedkv_manager, ids *C.uint64_t, ntokens *C.int32_t, n C.int64_t,
	draftIndptr, drafts *C.int32_t, copies *C.pagedkv_array, groups *C.pagedkv_group_plan, ngroups C.int64_t) (code C.int32_t) {
	h, code := enterHybrid(id, "hybrid_reserve_spec")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	return h.hybridReserve("hybrid_reserve_spec", ids, ntokens, n, draftIndptr, drafts, copies, groups, ngroups)
}

// hybridReserve is both hybrid reserves; only reserve_spec passes drafts.
func (h *handle) hybridReserve(op string, ids *C.uint64_t, ntokens *C.int32_t, n C.int64_t,
	draftIndptr, drafts *C.int32_t, copies *C.pagedkv_array, groups *C.pagedkv_group_plan, ngroups C.int64_t) C.int32_t {
	rids, nt, code, ok := reserveArgs(op, ids, ntokens, n, unsafe.Pointer(copies), "copies")
	if !ok {
		return code
	}
	if want := C.int64_t(h.m.NumGroups()); ngroups != want || groups == nil {
		return badArg("%s: groups = %p with num_groups = %d; the manager has %d groups", op, groups, int64(ngroups), int64(want))
	}
	plan, code := h.reserveDrafts(op, rids, nt, n, draftIndptr, drafts)
	if plan == nil {
		return code
	}
	h.exportHybrid(copies, unsafe.Slice(groups, int(ngroups)), plan)
	return C.PAGEDKV_OK
}

// exportHybrid is export for a hybrid plan: the pool-wide copies into
// copies and group g's plan into groups[g], under the same rules.
func (h *handle) exportHybrid(copies *C.pagedkv_array, groups []C.pagedkv_group_plan, p *pagedkv.HybridPlan) {
	h.cur, h.outs = h.cur[:0], h.outs[:0]
	h.array(copies, copyWords(p.Copies))
	for g, gp := range p.Groups {
		e, out := &h.plans[g], &groups[g]
		h.gather(e, &out.plan, gp)
		e.windowLeft = e.windowLeft[:0]
		for _, w := range gp.CascadeWindowLeft {
			e.windowLeft = append(e.windowLeft, int32(w))
		}
		h.array(&out.cascade_window_left, e.windowLeft)
		h.array(&out.attn_qo_indptr, gp.AttnQOIndptr)
		h.array(&out.attn_kv_indptr, gp.AttnKVIndptr)
		h.array(&out.attn_kv_page_indices, gp.AttnKVPageIndices)
		h.array(&out.attn_kv_last_page_len, gp.AttnKVLastPageLen)
		h.array(&out.attn_requests, gp.AttnRequests)
	}
	h.pin()
	h.store()
}

//export pagedkv_hybrid_get_group_stats
func pagedkv_hybrid_get_group_stats(id C.pagedkv_manager, group C.int64_t, out *C.pagedkv_group_stats, size C.size_t) (code C.int32_t) {
	defer recoverTo(&code)
	h := lookup(id)
	switch {
	case h == nil:
		return fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: hybrid_group_stats: no manager with handle %d", uint64(id)))
	case !h.hybrid:
		return wrongKind(id, "hybrid_group_stats", true)
	case out == nil:
		return badArg("hybrid_group_stats: out is NULL")
	}
	if code, ok := h.checkGroup("hybrid_group_stats", group); !ok {
		return code
	}
	// Lock-free like pagedkv_get_stats: each group's numbers are a
	// consistent snapshot.
	g := h.m.GroupStats(int(group))
	v := [...]int64{int64(g.Kind), int64(g.CachedPages), int64(g.EvictablePages), g.ServableTokens,
		g.PublishedPages, g.EvictedPages, g.CopiedPages, g.WindowReleasedPages, int64(g.PinnedPages),
		g.HostHitTokens, g.RemoteHitTokens, g.OffloadedPages, g.OnloadedPages}
	if unsafe.Sizeof(v) != C.sizeof_pagedkv_group_stats {
		panic("cabi: pagedkv_group_stats and GroupStats have different field counts")
	}
	writeInt64s(unsafe.Pointer(out), size, v[:])
	return C.PAGEDKV_OK
}

//export pagedkv_hybrid_request_state
func pagedkv_hybrid_request_state(id C.pagedkv_manager, group C.int64_t, rid C.uint64_t, out *C.pagedkv_request_state) (code C.int32_t) {
	h, code := enterHybrid(id, "hybrid_request_state")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	return h.requestState("hybrid_request_state", int(group), rid, out)
}

//export pagedkv_hybrid_request_pages
func pagedkv_hybrid_request_pages(id C.pagedkv_manager, group C.int64_t, rid C.uint64_t, dst *C.int32_t, capacity C.int64_t, n *C.int64_t) (code C.int32_t) {
	h, code := enterHybrid(id, "hybrid_request_pages")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	return h.requestPages("hybrid_request_pages", int(group), rid, dst, capacity, n)
}

func (h *handle) checkGroup(op string, g C.int64_t) (C.int32_t, bool) {
	if n := h.m.NumGroups(); g < 0 || g >= C.int64_t(n) {
		return badArg("%s: group = %d, want 0..%d", op, int64(g), n-1), false
	}
	return C.PAGEDKV_OK, true
}

// copyWords views copies as int32 triples (pagedkv_copy), capacity kept.
func copyWords(c []pagedkv.CopyOp) []int32 {
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(c))), 3*cap(c))[:3*len(c)]
}
