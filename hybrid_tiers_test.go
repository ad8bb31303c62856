package pagedkv

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// TestScenarioHybridTierHit draws a hybrid admission over the host tier on
// gpt-oss-like groups (sliding W = 6 and full, pages of 4): a 13-token
// prompt is computed and released, so both groups cache its 3 full pages.
// The sliding group's cached pages are offloaded to the host tier; the
// same prompt then hits 12 tokens, the full group from its cache and the
// sliding group from 3 host pages onloaded into fresh device pages (group
// 0's tier counters alone move). The request takes no step until the
// onloads complete; then the sliding group publishes them and releases
// the page its window no longer reads, and every group's K/V reads back.
// Finally both groups' device caches are emptied, dropping the full
// group's pages: the host tier still holds the sliding group's pages of
// the same tokens, but they are not the full group's (another digest
// chain), so the full group serves nothing and neither does the hit.
//
// Cache usage (docs/cache-usage.md): request 1 writes its 3 pages (12
// tokens, each group wrote them); request 2 reads 12 tokens, from the
// host tier (the farthest medium any group read them from: the full
// group's device copy is not what the request waited for), and writes
// nothing (publishing the onloaded pages is no write); request 3 reads
// nothing.
func TestScenarioHybridTierHit(t *testing.T) {
	groups := hybridConfigs()["gpt-oss-like"] // sliding 6, full
	x := newHTHarness(t, groups, htConfig{hostPages: 16})
	h, m := x.h, x.model
	prompt := seqTokens(20, 13)
	hit, err := h.Add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	m.add(t, 1, Namespace{}, prompt, hit)
	p, err := h.Reserve([]RequestID{1}, []int32{13})
	require.NoError(t, err)
	x.engine(p)
	require.NoError(t, h.Commit([]int32{7}))
	m.commit([]RequestID{1}, []int32{13}, [][]int32{nil}, []int32{0}, []int32{7})
	x.check(0, "prefill")
	require.NoError(t, h.Release(1))
	m.release(1)
	require.Equal(t, 3, h.Stats().Groups[0].CachedPages)

	// Offload the sliding group's cached pages (the full group's stay).
	tiers := h.core.tiers
	tiers.offloading = true
	require.Equal(t, 3, h.core.groups[0].cache.Evict(3))
	tiers.offloading = false
	h.core.afterChange()
	x.complete(nil)
	s := h.Stats()
	require.EqualValues(t, 3, s.Tiers.OffloadedPages)
	require.EqualValues(t, [2]int64{3, 0}, [2]int64{s.Groups[0].OffloadedPages, s.Groups[1].OffloadedPages})
	require.Equal(t, [2]int{0, 3}, [2]int{s.Groups[0].CachedPages, s.Groups[1].CachedPages})

	hit, err = h.Add(2, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 12, hit, "the full group's cache and the sliding group's host pages")
	m.add(t, 2, Namespace{}, prompt, hit)
	require.True(t, h.Loading(2))
	require.False(t, h.core.groups[1].loading(2), "the full group served its pages from its cache")
	_, err = h.Reserve([]RequestID{2}, []int32{1})
	require.ErrorIs(t, err, ErrLoading)
	copies := h.TierCopies(nil)
	require.Len(t, copies, 3)
	for _, c := range copies {
		require.Equal(t, tier.ToDevice, c.Dir)
	}
	x.issue = append(x.issue, copies...)
	s = h.Stats()
	require.EqualValues(t, [2]int64{12, 0}, [2]int64{s.Groups[0].HostHitTokens, s.Groups[1].HostHitTokens})
	require.EqualValues(t, [2]int64{0, 12}, [2]int64{s.Groups[0].ServableTokens, s.Groups[1].ServableTokens},
		"the sliding group's cache alone could serve nothing, the full group's 12 tokens")
	pages, start := h.Pages(0, 2)
	require.Equal(t, [2]int{3, 0}, [2]int{len(pages), start}, "while loading, the sliding group holds the whole prefix")

	x.complete(nil)
	require.False(t, h.Loading(2))
	pages, start = h.Pages(0, 2)
	require.Equal(t, [2]int{2, 4}, [2]int{len(pages), start}, "loaded: the sliding group keeps the pages from KeepFrom(12) = 4")
	require.Equal(t, 3, h.Stats().Groups[0].CachedPages, "the onloaded pages joined the sliding group's cache")
	x.check(1, "after the onloads")
	p, err = h.Reserve([]RequestID{2}, []int32{1})
	require.NoError(t, err)
	x.engine(p)
	require.NoError(t, h.Commit([]int32{9}))
	m.commit([]RequestID{2}, []int32{1}, [][]int32{nil}, []int32{0}, []int32{9})
	x.check(2, "a step after the onloads")
	require.NoError(t, h.Release(2))
	m.release(2)
	u1, ok1 := h.CacheUsage(1)
	u2, ok2 := h.CacheUsage(2)
	require.True(t, ok1 && ok2, "released usage kept until read")
	require.Equal(t, CacheUsage{WriteTokens: 12}, u1)
	require.Equal(t, CacheUsage{HostReadTokens: 12}, u2)
	require.Equal(t, CacheUsage{HostReadTokens: 12, WriteTokens: 12}, h.Stats().CacheUsage)

	// Empty both device caches, dropping what the host tier lacks: the
	// full group's pages (the sliding group's are on host pages already).
	require.Equal(t, 6, h.core.evict(6))
	h.core.afterChange()
	require.Zero(t, h.Stats().CachedPages)
	hit, err = h.Add(3, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, hit, "the sliding group's host pages are not the full group's")
	require.False(t, h.Loading(3), "no onload planned")
	require.Empty(t, h.TierCopies(nil))
	m.add(t, 3, Namespace{}, prompt, hit)
	x.check(3, "a miss")
	u3, ok3 := h.CacheUsage(3)
	require.True(t, ok3)
	require.Equal(t, CacheUsage{}, u3)
	x.drain()
}

// TestHybridFormatLayers: a hybrid pool's Tiers.Format.Layers is the
// groups' layer count (shared per-layer tensors) or their sum (tensors of
// each group's own); any other count is refused with ErrBadConfig naming
// both, and no Manager is made.
func TestHybridFormatLayers(t *testing.T) {
	groups := []LayerGroup{{Kind: SlidingAttention, WindowTokens: 8, NumLayers: 2}, {Kind: FullAttention, NumLayers: 2},
		{Kind: FullAttention, NumLayers: 2}}
	for layers, ok := range map[int]bool{2: true, 6: true, 1: false, 3: false, 4: false, 12: false} {
		f := tier.PageFormat{DType: layout.F32, PageSize: 4, NumKVHeads: 1, HeadDim: 1, Layers: layers}
		h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4, Tiers: TierConfig{HostPages: 4, Format: f}},
			Groups: groups})
		if ok {
			require.NoError(t, err, "Layers = %d", layers)
			require.Len(t, h.HostPage(0), 2*4*4*layers)
			continue
		}
		require.ErrorIs(t, err, ErrBadConfig, "Layers = %d", layers)
		require.EqualError(t, err, fmt.Sprintf("pagedkv: bad config: Tiers.Format.Layers = %d, want 2 (the groups' layer count: "+
			"groups share the per-layer tensors) or 6 (their sum: tensors of each group's own)", layers))
		require.Nil(t, h)
	}
}
