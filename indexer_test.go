package pagedkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/tier"
)

// Groups that own no pages (group_indexer.go): a DeepSeek sparse-attention
// indexer group following its MLA group, and shared-KV groups aliasing
// their targets. The randomized tests reuse TestHybridTiersMatchModel's
// harness (htHarness: the slow model of the requests, Audit, every group's
// K after every operation, tier copies at random times); its fake engine
// keeps the indexer K in a tensor of its own, moved by CopyOps and tier
// copies at the format's indexer offsets, so an indexer page served for
// another page, or left behind by a tier round trip, reads a wrong value.

// aliasConfigs are the test-scale models with groups that own no pages.
func aliasConfigs() map[string][]LayerGroup {
	mla := LayerGroup{Kind: MLAAttention, NumLayers: 1}
	idx := LayerGroup{Kind: IndexerAttention, Target: 0, NumLayers: 1, IndexerHeadDim: htIndexerHeadDim, IndexerQuantBlock: htIndexerHeadDim}
	sl := LayerGroup{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 1}
	full := LayerGroup{Kind: FullAttention, NumLayers: 1}
	return map[string][]LayerGroup{
		// DeepSeek V3.2: MLA on every layer, each with its lightning
		// indexer's K cache.
		"deepseek-v32-like": {mla, idx},
		// Layers that reuse earlier layers' KV (Gemma 3n, vLLM's
		// kv_sharing_target_layer_name): a sliding and a full group, and
		// a shared-KV group reading each.
		"shared-kv-like": {sl, full, {Kind: SharedKVAttention, Target: 0, WindowTokens: 6, NumLayers: 1}, {Kind: SharedKVAttention, Target: 1, NumLayers: 2}},
	}
}

// htIndexerHeadDim is the test indexer's K: 4 fp8 bytes and one float32
// scale a token (8 bytes), where the fake engine keeps a 64-bit value.
const htIndexerHeadDim = 4

// htFormat is the harness's tier format for groups: tierFormat, plus the
// indexer pages when there is an indexer group.
func htFormat(groups []LayerGroup) tier.PageFormat {
	f := tierFormat(htPageSize)
	for _, g := range groups {
		if g.Kind == IndexerAttention {
			f.IndexerLayers, f.IndexerTokenBytes = 1, g.IndexerLayout(htPageSize).TokenBytes()
		}
	}
	return f
}

// htIndexerCopy moves a device page's indexer entries (slots: page-size
// 64-bit values, the low half in the entry's K bytes, the high half in its
// scale) to or from host page hp of format f.
func htIndexerCopy(c TierCopy, hp []byte, f tier.PageFormat, slots []uint64) {
	l := IndexerLayout{PageSize: f.PageSize, HeadDim: htIndexerHeadDim, QuantBlock: htIndexerHeadDim}
	pg := hp[f.IndexerOffset(0) : f.IndexerOffset(0)+f.IndexerPageBytes()]
	for e := range slots {
		k, s := pg[l.KOffset(e):l.KOffset(e)+4], pg[l.ScaleOffset(e):l.ScaleOffset(e)+4]
		if c.Dir == tier.ToHost {
			binary.LittleEndian.PutUint32(k, uint32(slots[e]))
			binary.LittleEndian.PutUint32(s, uint32(slots[e]>>32))
		} else {
			slots[e] = uint64(binary.LittleEndian.Uint32(k)) | uint64(binary.LittleEndian.Uint32(s))<<32
		}
	}
}

// checkIndexerPlan checks indexer group g's Plan in p: a Plan of its own
// with its layout, whose page arrays are its MLA group's (the same
// slices: the identity map).
func checkIndexerPlan(t testing.TB, p *HybridPlan, g, target int) {
	t.Helper()
	ip, mp := p.Groups[g], p.Groups[target]
	require.NotSame(t, mp, ip, "indexer group %d shares its MLA group's Plan", g)
	require.NotNil(t, ip.Indexer, "indexer group %d's Plan has no layout", g)
	require.Nil(t, mp.Indexer, "MLA group %d's Plan has an indexer layout", target)
	for name, pair := range map[string][2][]int32{"KVIndptr": {ip.KVIndptr, mp.KVIndptr}, "KVPageIndices": {ip.KVPageIndices, mp.KVPageIndices},
		"KVLastPageLen": {ip.KVLastPageLen, mp.KVLastPageLen}, "Positions": {ip.Positions, mp.Positions}, "QOIndptr": {ip.QOIndptr, mp.QOIndptr}} {
		require.True(t, sameSlice(pair[0], pair[1]), "indexer group %d's %s is not its MLA group's", g, name)
	}
}

// sameSlice reports whether a and b are the same slice (not just equal).
func sameSlice(a, b []int32) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// indexerMismatch checks request id's indexer group g: its pages are its
// MLA group's, and every computed token's indexer K on them is the one
// written for that token (ctxKVs of group g).
func (x *htHarness) indexerMismatch(id RequestID, g int) error {
	h, r, ps := x.h, x.model.reqs[id], x.ps
	target := h.Group(g).Target
	pages, start := h.Pages(g, id)
	mpages, mstart := h.Pages(target, id)
	if !slices.Equal(pages, mpages) || start != mstart {
		return fmt.Errorf("request %d: indexer group %d holds pages %v from %d, its MLA group %v from %d", id, g, pages, start, mpages, mstart)
	}
	want := ctxKVs(g, r.ns, r.tokens)
	for tk := start; tk < r.computed; tk++ {
		p := pages[(tk-start)/ps]
		if got := x.idx[int(p)*ps+(tk-start)%ps]; got != want[tk] {
			return fmt.Errorf("request %d: indexer group %d token %d on page %d reads %#x, want %#x", id, g, tk, p, got, want[tk])
		}
	}
	return nil
}

// TestHybridAliasTiersMatchModel is TestHybridTiersMatchModel on models
// with groups that own no pages: 2 configs of 3 runs of 1500 random
// operations (a tenth under -race or -short) with a host tier: adds over
// shared prompts, steps (speculative at times), aborts, forks,
// truncation, preemption and resumes, releases, evictions that offload,
// pins, and tier copies completed in random subsets. After every
// operation: Audit, the model's checks, every group's K, and for the
// indexer group that its pages are its MLA group's page for page and hold
// the indexer K of their tokens, wherever they came from (device cache,
// copy-on-write, host round trip); its Plan has its layout and its MLA
// group's arrays; a shared-KV group's Plan is its target's.
func TestHybridAliasTiersMatchModel(t *testing.T) {
	t.Parallel()
	const runs = 3
	perRun := 1500
	if testing.Short() || raceEnabled {
		perRun /= 10
	}
	configs := aliasConfigs()
	for _, name := range slices.Sorted(maps.Keys(configs)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var sum htSums
			for run := range runs {
				x := newHTHarness(t, configs[name], htConfig{seed: 50 + uint64(run), hostPages: 8 + 4*run, ahead: run % 2,
					writeThrough: run == 1, events: run != 1})
				x.run(perRun)
				sum.add(x)
			}
			require.Positive(t, sum.hostHits, "the workload never hit the host tier")
			require.Positive(t, sum.offloaded)
			require.Positive(t, sum.evicted)
			t.Logf("%d runs of %d ops: %s", runs, perRun, sum)
		})
	}
}

// TestIndexerHostRoundTrip is SGLang #38031: an MLA page and its indexer
// page go to the host tier and come back, and the indexer K must come
// back exactly. A prompt is computed, released, evicted to the host tier
// (offload) and the device pages are overwritten; the same prompt is
// admitted again and served from the host (onload). With the indexer
// pages in the tier format the indexer K reads back exactly; an engine
// that leaves them out of the copies (dropIndexer: what SGLang did) is
// caught by the same check, and NewHybrid refuses a tier format without
// them.
func TestIndexerHostRoundTrip(t *testing.T) {
	groups := aliasConfigs()["deepseek-v32-like"]
	for _, drop := range []bool{false, true} {
		x := newHTHarness(t, groups, htConfig{seed: 1, hostPages: 16})
		x.dropIndexer = drop
		h, m := x.h, x.model
		prompt := promptOf(5, 13)
		prefill := func(id RequestID) {
			nt := int32(len(m.reqs[id].tokens) - m.reqs[id].computed)
			p, err := h.Reserve([]RequestID{id}, []int32{nt})
			require.NoError(t, err)
			x.take()
			x.engine(p)
			require.NoError(t, h.Commit([]int32{7}))
			m.commit([]RequestID{id}, []int32{nt}, [][]int32{nil}, []int32{0}, []int32{7})
		}
		hit, err := h.Add(1, Request{Prompt: prompt})
		require.NoError(t, err)
		m.add(t, 1, Namespace{}, prompt, hit)
		prefill(1)
		require.NoError(t, x.indexerMismatch(1, 1))
		require.NoError(t, h.Release(1))
		m.release(1)
		// Offload every cached page and let the device pages be reused.
		require.Positive(t, h.Evict(h.NumPages()))
		x.complete(nil)
		require.Equal(t, h.NumPages(), h.Stats().FreePages)
		clear(x.kv)
		clear(x.idx)
		hit, err = h.Add(2, Request{Prompt: prompt})
		require.NoError(t, err)
		require.Equal(t, 12, hit, "the host tier serves every full page before the last token")
		m.add(t, 2, Namespace{}, prompt, hit)
		require.True(t, h.Loading(2))
		x.complete(nil)
		require.False(t, h.Loading(2))
		require.Equal(t, int64(3), h.Stats().Tiers.OnloadedPages, "3 pages onloaded (MLA pages: their indexer pages are the same IDs)")
		err = x.indexerMismatch(2, 1)
		if drop {
			require.Error(t, err, "an engine that drops the indexer pages in a round trip must be caught")
			continue
		}
		require.NoError(t, err)
		x.check(0, "after the round trip")
		prefill(2)
		x.check(1, "after the next step")
		x.drain()
	}
	// A tier format without the indexer pages is refused, naming it.
	_, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: htPageSize,
		Tiers: TierConfig{HostPages: 4, Format: tierFormat(htPageSize)}}, Groups: groups})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "IndexerLayers = 0 with indexer group 1")
}

// TestSharedKVAllocatesNothing runs the same random operations on a model
// with shared-KV groups and on the same model without them: the pool (its
// partition, counters and tiers), every request's pages in the groups
// that own pages and the groups' own numbers are the same after every
// operation, and a shared-KV group's pages are its target's.
func TestSharedKVAllocatesNothing(t *testing.T) {
	t.Parallel()
	ops := 1000
	if testing.Short() || raceEnabled {
		ops /= 10
	}
	shared := aliasConfigs()["shared-kv-like"]
	owners := shared[:layergroup.NumOwners(shared)]
	require.Equal(t, HybridConfig{Groups: owners}.AllocBytes(), HybridConfig{Groups: shared}.AllocBytes())
	for seed := range uint64(2) {
		a := newHTHarness(t, owners, htConfig{seed: seed, hostPages: 8, ahead: int(seed)})
		b := newHTHarness(t, shared, htConfig{seed: seed, hostPages: 8, ahead: int(seed)})
		require.Equal(t, 2, a.h.NumGroups())
		require.Equal(t, 4, b.h.NumGroups())
		for op := range ops {
			wa, wb := a.op(), b.op()
			require.Equal(t, wa, wb, "op %d", op)
			a.check(op, wa)
			b.check(op, wb)
			sa, sb := hybridOwnStats(a.h), hybridOwnStats(b.h)
			require.Equal(t, sa.Stats, sb.Stats, "op %d (%s): the pool differs", op, wa)
			require.Equal(t, sa.Groups, sb.Groups[:2], "op %d (%s)", op, wa)
			for g := 2; g < 4; g++ {
				require.Equal(t, GroupStats{Kind: SharedKVAttention}, sb.Groups[g], "shared-KV group %d owns nothing", g)
			}
			for _, id := range a.model.ids() {
				for g := range 4 {
					pa, sa := a.h.Pages(layergroup.Owner(shared, g), id)
					pb, sb := b.h.Pages(g, id)
					if !slices.Equal(pa, pb) || sa != sb {
						t.Fatalf("op %d (%s): request %d group %d: pages %v from %d, without shared-KV groups %v from %d", op, wa, id, g, pb, sb, pa, sa)
					}
				}
			}
		}
		a.drain()
		b.drain()
	}
}

// TestNewHybridAliasErrors: every bad indexer or shared-KV config is
// refused with ErrBadConfig naming the bad value, and nothing is built.
func TestNewHybridAliasErrors(t *testing.T) {
	mla := LayerGroup{Kind: MLAAttention, NumLayers: 2}
	full := LayerGroup{Kind: FullAttention, NumLayers: 2}
	sl := LayerGroup{Kind: SlidingAttention, WindowTokens: 8, NumLayers: 2}
	idx := func(target int) LayerGroup {
		return LayerGroup{Kind: IndexerAttention, Target: target, NumLayers: 2, IndexerHeadDim: 128, IndexerQuantBlock: 128}
	}
	shr := func(target, w int) LayerGroup {
		return LayerGroup{Kind: SharedKVAttention, Target: target, WindowTokens: w, NumLayers: 1}
	}
	f := tier.PageFormat{Layout: tierFormat(4).Layout, DType: tierFormat(4).DType, PageSize: 4, NumKVHeads: 1, HeadDim: 576, Layers: 2}
	withIdx := f
	withIdx.IndexerLayers, withIdx.IndexerTokenBytes = 2, 132
	for _, c := range []struct {
		name   string
		groups []LayerGroup
		format tier.PageFormat
		want   string
	}{
		{"indexer without an MLA group", []LayerGroup{full, idx(0)}, tier.PageFormat{}, "Target = 0, a full group"},
		{"indexer target missing", []LayerGroup{mla, idx(5)}, tier.PageFormat{}, "Target = 5, want a group index 0..1"},
		{"indexer alone", []LayerGroup{idx(0)}, tier.PageFormat{}, "groups[0] (indexer) has Target = 0, a indexer group"},
		{"two indexers", []LayerGroup{mla, idx(0), idx(0)}, tier.PageFormat{}, "groups[1] and groups[2] are both indexers of MLA group 0"},
		{"indexer head dim", []LayerGroup{mla, {Kind: IndexerAttention, NumLayers: 2}}, tier.PageFormat{}, "IndexerHeadDim = 0"},
		{"indexer quant block", []LayerGroup{mla, {Kind: IndexerAttention, NumLayers: 2, IndexerHeadDim: 128, IndexerQuantBlock: 96}}, tier.PageFormat{}, "IndexerQuantBlock = 96"},
		{"alias before an owner", []LayerGroup{mla, idx(0), full}, tier.PageFormat{}, "groups[2] (full) follows groups[1] (indexer)"},
		{"target missing", []LayerGroup{full, shr(3, 0)}, tier.PageFormat{}, "Target = 3, want a group index 0..1"},
		{"target negative", []LayerGroup{full, shr(-1, 0)}, tier.PageFormat{}, "Target = -1"},
		{"target itself shared", []LayerGroup{full, shr(0, 0), shr(1, 0)}, tier.PageFormat{}, "groups[2] (shared_kv) has Target = 1, itself a shared_kv group"},
		{"target an indexer", []LayerGroup{mla, idx(0), shr(1, 0)}, tier.PageFormat{}, "Target = 1, itself a indexer group"},
		{"window differs", []LayerGroup{sl, full, shr(0, 4)}, tier.PageFormat{}, "WindowTokens = 4, ChunkTokens = 0; its target groups[0] (sliding) has 8, 0"},
		{"window on a full target", []LayerGroup{sl, full, shr(1, 8)}, tier.PageFormat{}, "WindowTokens = 8, ChunkTokens = 0; its target groups[1] (full) has 0, 0"},
		{"target field on an owner", []LayerGroup{{Kind: FullAttention, NumLayers: 2, Target: 1}}, tier.PageFormat{}, "full group with Target = 1"},
		{"format without the indexer pages", []LayerGroup{mla, idx(0)}, f, "Tiers.Format.IndexerLayers = 0 with indexer group 1"},
		{"format's indexer token bytes", []LayerGroup{mla, {Kind: IndexerAttention, NumLayers: 2, IndexerHeadDim: 128, IndexerQuantBlock: 64}}, withIdx,
			"IndexerTokenBytes = 132, indexer group 1 has 136"},
		{"format's indexer layers", []LayerGroup{mla, {Kind: IndexerAttention, NumLayers: 1, IndexerHeadDim: 128, IndexerQuantBlock: 128}}, withIdx,
			"IndexerLayers = 2, want 1"},
		{"format with indexer pages, no indexer", []LayerGroup{mla}, withIdx, "IndexerLayers = 2 with no indexer group"},
		{"indexer fields without a format", []LayerGroup{mla, idx(0)}, tier.PageFormat{IndexerLayers: 2, IndexerTokenBytes: 132}, "without a format (Layers = 0)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := HybridConfig{Config: Config{NumPages: 16, PageSize: 4}, Groups: c.groups}
			if c.format != (tier.PageFormat{}) {
				cfg.Tiers = TierConfig{HostPages: 4, Format: c.format}
			}
			h, err := NewHybrid(cfg)
			require.Nil(t, h)
			require.ErrorIs(t, err, ErrBadConfig)
			require.ErrorContains(t, err, c.want)
		})
	}
	// The good ones build, and a dense Manager refuses indexer pages.
	for _, groups := range [][]LayerGroup{{mla, idx(0)}, {sl, full, shr(0, 8), shr(1, 0)}, {mla, idx(0), shr(0, 0)}} {
		_, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4}, Groups: groups})
		require.NoError(t, err, "%v", groups)
	}
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4, Tiers: TierConfig{HostPages: 4, Format: withIdx}}, Groups: []LayerGroup{mla, idx(0)}})
	require.NoError(t, err)
	require.Equal(t, withIdx.PageBytes(), len(h.HostPage(0)), "a host page holds the indexer pages")
	_, err = New(Config{NumPages: 16, PageSize: 4, Tiers: TierConfig{HostPages: 4, Format: withIdx}})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "IndexerLayers = 2 in a Manager")
	require.True(t, errors.Is(err, ErrBadConfig))
}

// TestAuditAliases: Audit's check of the groups that own no pages fails
// when a reserved step's plan gives an indexer group pages other than its
// MLA group's, or a shared-KV group a plan other than its target's.
func TestAuditAliases(t *testing.T) {
	groups := append(aliasConfigs()["deepseek-v32-like"], LayerGroup{Kind: SharedKVAttention, Target: 0, NumLayers: 1})
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4}, Groups: groups})
	require.NoError(t, err)
	_, err = h.Add(1, Request{Prompt: promptOf(1, 9)})
	require.NoError(t, err)
	p, err := h.Reserve([]RequestID{1}, []int32{9})
	require.NoError(t, err)
	require.NoError(t, h.auditAliases())
	require.Same(t, p.Groups[0], p.Groups[2])
	require.Equal(t, &IndexerLayout{PageSize: 4, HeadDim: htIndexerHeadDim, QuantBlock: htIndexerHeadDim}, p.Groups[1].Indexer)
	good := *p.Groups[1]
	p.Groups[1].KVPageIndices = slices.Clone(good.KVPageIndices) // equal pages, not the MLA group's array
	require.ErrorContains(t, h.auditAliases(), "indexer group 1's plan does not name its MLA group 0's pages")
	*p.Groups[1] = good
	p.Groups[2] = &good
	require.ErrorContains(t, h.auditAliases(), "shared-KV group 2's plan is not its target 0's")
	p.Groups[2] = p.Groups[0]
	require.NoError(t, h.auditAliases())
	require.NoError(t, h.Commit([]int32{3}))
	require.NoError(t, h.Audit())
}

// TestAliasStepAllocatesNothing: a decode step of a model with an indexer
// and a shared-KV group (Reserve with the alias plans, Commit) allocates
// nothing once the requests are admitted.
func TestAliasStepAllocatesNothing(t *testing.T) {
	groups := append(aliasConfigs()["deepseek-v32-like"], LayerGroup{Kind: SharedKVAttention, Target: 0, NumLayers: 1})
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 256, PageSize: 4}, Groups: groups})
	require.NoError(t, err)
	ids := []RequestID{1, 2, 3}
	ones, sampled := []int32{1, 1, 1}, []int32{5, 5, 5}
	for _, id := range ids {
		_, err := h.Add(id, Request{Prompt: promptOf(int(id), 10), CapacityTokens: 400})
		require.NoError(t, err)
		_, err = h.Reserve([]RequestID{id}, []int32{int32(len(h.Tokens(id)) - h.Computed(id))})
		require.NoError(t, err)
		require.NoError(t, h.Commit([]int32{5}))
	}
	var plan *HybridPlan
	var stepErr error
	decode := func() {
		if plan, stepErr = h.Reserve(ids, ones); stepErr == nil {
			stepErr = h.Commit(sampled)
		}
	}
	decode()
	require.NoError(t, stepErr)
	require.Zero(t, testing.AllocsPerRun(100, decode))
	require.NoError(t, stepErr)
	require.Len(t, plan.Groups, 3)
	require.NotNil(t, plan.Groups[1].Indexer)
	require.NoError(t, h.Audit())
}
