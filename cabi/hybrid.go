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
	C.PAGEDKV_GROUP_FULL:      {Kind: pagedkv.FullAttention},
	C.PAGEDKV_GROUP_SLIDING:   {Kind: pagedkv.SlidingAttention},
	C.PAGEDKV_GROUP_CHUNKED:   {Kind: pagedkv.ChunkedAttention},
	C.PAGEDKV_GROUP_MLA:       {Kind: pagedkv.MLAAttention},
	C.PAGEDKV_GROUP_STATE:     {Kind: pagedkv.StateLayers},
	C.PAGEDKV_GROUP_INDEXER:   {Kind: pagedkv.IndexerAttention},
	C.PAGEDKV_GROUP_SHARED_KV: {Kind: pagedkv.SharedKVAttention},
}

// setDType sets a state dtype field (layergroup.StateDType, whose values
// are PAGEDKV_STATE_*) to v, checked by the caller; generic so that the C
// ABI needs no import of layergroup (deps_test.go).
func setDType[T ~uint8](dst *T, v C.int64_t) { *dst = T(v) }

// layerGroupSizeV1 is pagedkv_layer_group's size before target and the
// state and indexer fields were appended: a caller built with that header
// passes it, and the appended fields are 0.
const layerGroupSizeV1 = C.size_t(unsafe.Offsetof(C.pagedkv_layer_group{}.target))

// layerGroupWords is sizeof(pagedkv_layer_group) in int64 fields.
const layerGroupWords = C.sizeof_pagedkv_layer_group / 8

// goLayerGroup converts groups[i], given as its int64 fields w (the first
// four only for a caller of layerGroupSizeV1), refusing a kind or dtype
// out of range by name; the rest is checked by NewHybrid, whose errors
// name the Go fields.
func goLayerGroup(i int, w []int64) (pagedkv.LayerGroup, C.int32_t, bool) {
	var g C.pagedkv_layer_group
	copy(unsafe.Slice((*int64)(unsafe.Pointer(&g)), layerGroupWords), w)
	if g.kind < 0 || g.kind >= C.int64_t(len(groupKinds)) {
		return pagedkv.LayerGroup{}, badArg("hybrid_create: groups[%d].kind = %d, want PAGEDKV_GROUP_FULL (0), SLIDING (1), CHUNKED (2), MLA (3), STATE (4), INDEXER (5) or SHARED_KV (6)", i, int64(g.kind)), false
	}
	s := groupKinds[g.kind]
	s.WindowTokens, s.ChunkTokens, s.NumLayers = int(g.window_tokens), int(g.chunk_tokens), int(g.num_layers)
	s.Target, s.IndexerHeadDim, s.IndexerQuantBlock = int(g.target), int(g.indexer_head_dim), int(g.indexer_quant_block)
	for _, d := range [...]struct {
		name string
		v    C.int64_t
	}{{"conv_dtype", g.conv_dtype}, {"ssm_dtype", g.ssm_dtype}} {
		// 0 is no dtype (NewHybrid refuses it for a state group, by name).
		if d.v != 0 && (d.v < C.PAGEDKV_STATE_F32 || d.v > C.PAGEDKV_STATE_BF16) {
			return pagedkv.LayerGroup{}, badArg("hybrid_create: groups[%d].%s = %d, want PAGEDKV_STATE_F32 (1), F16 (2) or BF16 (3) for a state group, 0 for any other",
				i, d.name, int64(d.v)), false
		}
	}
	setDType(&s.State.ConvDType, g.conv_dtype)
	setDType(&s.State.SSMDType, g.ssm_dtype)
	s.State.ConvShape = [2]int{int(g.conv_shape[0]), int(g.conv_shape[1])}
	s.State.SSMShape = [3]int{int(g.ssm_shape[0]), int(g.ssm_shape[1]), int(g.ssm_shape[2])}
	s.State.PageBytes = int(g.page_bytes)
	return s, C.PAGEDKV_OK, true
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
	case groupSize != C.sizeof_pagedkv_layer_group && groupSize != layerGroupSizeV1:
		return badArg("hybrid_create: group_size = %d, want sizeof(pagedkv_layer_group) = %d (or %d, without target and the state and indexer fields)",
			uint64(groupSize), C.sizeof_pagedkv_layer_group, layerGroupSizeV1)
	case n < 1 || n > maxGroups:
		return badArg("hybrid_create: num_groups = %d, want 1..%d", int64(n), maxGroups)
	case groups == nil:
		return badArg("hybrid_create: groups is NULL with num_groups = %d", int64(n))
	}
	every, code, ok := stateCheckpointEvery("hybrid_create", cfg, size, true)
	if !ok {
		return code
	}
	words := int(groupSize / 8)
	all := unsafe.Slice((*int64)(unsafe.Pointer(groups)), int(n)*words)
	specs := make([]pagedkv.LayerGroup, n)
	for i := range specs {
		if specs[i], code, ok = goLayerGroup(i, all[i*words:(i+1)*words]); !ok {
			return code
		}
	}
	ext, code, ok := newExtras("hybrid_create", opts, optsSize, &gcfg, specs)
	if !ok {
		return code
	}
	m, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: gcfg, Groups: specs, StateCheckpointEvery: every})
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
		e.stateIndices = gp.StateIndices // pinned with the plan's arrays
		if cap(gp.StateIndices) > 0 {
			h.cur = append(h.cur, unsafe.Pointer(unsafe.SliceData(gp.StateIndices)))
		}
	}
	h.pin()
	h.store()
}

//export pagedkv_hybrid_state_indices
func pagedkv_hybrid_state_indices(id C.pagedkv_manager, group C.int64_t, out *C.pagedkv_array) (code C.int32_t) {
	h, code := enterHybrid(id, "hybrid_state_indices")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if out == nil {
		return badArg("hybrid_state_indices: out is NULL")
	}
	if code, ok := h.checkGroup("hybrid_state_indices", group); !ok {
		return code
	}
	s := h.plans[group].stateIndices
	var data unsafe.Pointer
	if cap(s) > 0 {
		data = unsafe.Pointer(unsafe.SliceData(s)) // pinned by exportHybrid
	}
	storeArray(out, data, len(s), cap(s))
	return C.PAGEDKV_OK
}

//export pagedkv_hybrid_next_state_checkpoint
func pagedkv_hybrid_next_state_checkpoint(id C.pagedkv_manager, rid C.uint64_t, tokens *C.int64_t) (code C.int32_t) {
	h, code := enterHybrid(id, "hybrid_next_state_checkpoint")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if tokens == nil {
		return badArg("hybrid_next_state_checkpoint: tokens is NULL")
	}
	*tokens = C.int64_t(h.m.(*pagedkv.HybridManager).NextStateCheckpoint(pagedkv.RequestID(rid)))
	return C.PAGEDKV_OK
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
