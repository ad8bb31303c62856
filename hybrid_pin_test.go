package pagedkv

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// gptOSSPinned returns a gpt-oss-like HybridManager (group 0 sliding window
// 6, group 1 full; pages of 4) with MaxPinnedPages maxPinned in which
// prompt has been computed and released: its full pages are cached, idle,
// in both groups.
func gptOSSPinned(t *testing.T, maxPinned int, prompt []int32) *HybridManager {
	t.Helper()
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 32, PageSize: 4, HashSeed: 1, MaxPinnedPages: maxPinned},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 1}, {Kind: FullAttention, NumLayers: 1}}})
	require.NoError(t, err)
	compute(t, h, 1, prompt)
	require.NoError(t, h.Release(1))
	return h
}

// compute admits request id on prompt and computes every token of it.
func compute(t *testing.T, h *HybridManager, id RequestID, prompt []int32) {
	t.Helper()
	_, err := h.Add(id, Request{Prompt: prompt})
	require.NoError(t, err)
	_, err = h.Reserve([]RequestID{id}, []int32{int32(len(prompt) - h.Computed(id))})
	require.NoError(t, err)
	require.NoError(t, h.Commit([]int32{NoToken}))
}

// TestHybridPinBadInput: every refused Pin or Unpin names the bad value
// (and the group) and changes nothing.
func TestHybridPinBadInput(t *testing.T) {
	prompt := seqTokens(10, 13) // pages [10..13] [14..17] [18..21], token 22
	h := gptOSSPinned(t, 2, prompt)
	before := h.Stats()
	unchanged := func(what string) {
		t.Helper()
		require.Equal(t, before, h.Stats(), "%s changed the manager", what)
		require.NoError(t, h.Audit())
	}
	for name, c := range map[string]struct {
		tokens []int32
		ns     Namespace
		want   error
		msg    string
	}{
		"under a page":    {prompt[:3], Namespace{}, ErrNotCached, "group 0 (sliding): prefixcache: prefix not cached: pin 3 tokens: their first page of 4 is not cached"},
		"nil":             {nil, Namespace{}, ErrNotCached, "pin 0 tokens"},
		"other prefix":    {seqTokens(50, 8), Namespace{}, ErrNotCached, "group 0 (sliding)"},
		"other namespace": {prompt, Namespace{Tenant: "b"}, ErrNotCached, "pin 13 tokens"},
		// Three pages, the cap is 2 in each group; group 0 is checked first.
		"past the cap": {prompt, Namespace{}, ErrPinLimit, "group 0 (sliding): prefixcache: pinned-page limit: pinning 3 more pages would make 3, limit 2"},
	} {
		_, _, err := h.Pin(c.ns, c.tokens)
		require.ErrorIs(t, err, c.want, name)
		require.ErrorContains(t, err, c.msg, name)
		unchanged(name)
	}
	for _, id := range []PinID{0, 1, 77} {
		err := h.Unpin(id)
		require.ErrorIs(t, err, ErrUnknownPin)
		require.ErrorContains(t, err, fmt.Sprintf("unpin %d", id))
		unchanged("unpin")
	}

	// A pin, then the same pin's second Unpin.
	id, n, err := h.Pin(Namespace{}, prompt[:8])
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.NoError(t, h.Unpin(id))
	err = h.Unpin(id)
	require.ErrorIs(t, err, ErrUnknownPin)
	require.ErrorContains(t, err, fmt.Sprintf("unpin %d", id))
	require.Zero(t, h.Stats().PinnedPages)
	require.NoError(t, h.Audit())
}

// TestHybridPinAllOrNothing: a prefix one group lacks is refused, naming
// that group, with nothing pinned in the groups checked before it; a
// prefix one group holds only in part pins that part in every group, and
// a later Add is served exactly that, however hard the pool is evicted.
func TestHybridPinAllOrNothing(t *testing.T) {
	prompt := seqTokens(10, 13)
	h := gptOSSPinned(t, 0, prompt)
	full := h.core.groups[1]
	full.cache.Evict(32) // the full group's cache only
	full.afterChange()
	before := h.Stats()
	_, _, err := h.Pin(Namespace{}, prompt)
	require.ErrorIs(t, err, ErrNotCached)
	require.ErrorContains(t, err, "group 1 (full)")
	require.Equal(t, before, h.Stats(), "a refused pin changed the manager")
	require.Zero(t, h.core.groups[0].cache.Pinned())

	// The full group caches the first page again (a 5-token prompt), the
	// sliding group still holds three pages (its own copy of the first is
	// a duplicate).
	compute(t, h, 2, prompt[:5])
	require.NoError(t, h.Release(2))
	s := h.Stats()
	require.Equal(t, [2]int{3, 1}, [2]int{s.Groups[0].CachedPages, s.Groups[1].CachedPages})
	id, n, err := h.Pin(Namespace{}, prompt)
	require.NoError(t, err)
	require.Equal(t, 4, n, "the prefix every group holds")
	s = h.Stats()
	require.Equal(t, [2]int{1, 1}, [2]int{s.Groups[0].PinnedPages, s.Groups[1].PinnedPages}, "no group pins past the shortest")
	require.Equal(t, 2, s.PinnedPages)
	require.NoError(t, h.Audit())

	h.Evict(32)
	s = h.Stats()
	require.Equal(t, [2]int{1, 1}, [2]int{s.Groups[0].CachedPages, s.Groups[1].CachedPages}, "the pin survives eviction")
	got, err := h.Add(3, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, n, got, "a later Add is served pinnedTokens")
	require.NoError(t, h.Release(3))
	require.NoError(t, h.Unpin(id))
	h.Evict(32)
	s = h.Stats()
	require.Equal(t, [4]int{32, 0, 0, 0}, [4]int{s.FreePages, s.CachedPages, s.PinnedPages, s.PinnedIdlePages}, "unpinned pages are evicted")
	require.NoError(t, h.Audit())
}

// TestHybridPinsUnderPressure runs TestHybridMatchesRules' random workload
// (48 pages, so steps evict and fail for want of pages) on every hybrid
// config with pins and unpins among the operations, plus full evictions and
// Adds of pinned prompts, against a slow model of the pins: the set of
// token prefixes (one per page) the live pins cover. Before each Pin the
// model predicts its outcome from the groups' cached prefixes and the
// pinned set: the prefix every group holds, refused when the pages it would
// newly pin take a group past MaxPinnedPages, with nothing changed. After
// every operation: Audit and the harness's checks; each group's pinned
// pages equal the model's set; every live pin's pages are still cached in
// every group; an Add of a pinned prompt is served at least the pinned
// tokens. At the end of each run every pin is removed and every request
// released, and eviction then empties every group's cache: unpin releases.
func TestHybridPinsUnderPressure(t *testing.T) {
	t.Parallel()
	runs, ops := 10, 1000
	if testing.Short() || raceEnabled {
		runs = 2
	}
	const maxPinned = 3
	for name, groups := range hybridConfigs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var made, capped, served int
			for run := range runs {
				hh := newHybridHarness(t, groups, uint64(run))
				h, err := NewHybrid(HybridConfig{Config: Config{NumPages: hhPages, PageSize: hhPageSize, HashSeed: 5, MaxPinnedPages: maxPinned}, Groups: groups})
				require.NoError(t, err)
				hh.h = h
				x := &pinModel{t: t, hh: hh, maxPinned: maxPinned}
				for op := range ops {
					switch k := hh.rng.IntN(12); {
					case k < 2:
						x.pin()
					case k < 3:
						x.unpin()
					case k < 4:
						x.serve()
					case k < 5:
						h.Evict(hhPages)
					default:
						hh.op()
					}
					hh.check(op)
					x.check(op)
				}
				x.drain()
				made, capped, served = made+x.made, capped+x.capped, served+x.served
			}
			require.Positive(t, made)
			require.Positive(t, capped, "no pin reached MaxPinnedPages")
			require.Positive(t, served)
			t.Logf("%d runs of %d ops: %d pins made, %d capped, %d adds of pinned prompts", runs, ops, made, capped, served)
		})
	}
}

// pinModel is the slow model of TestHybridPinsUnderPressure.
type pinModel struct {
	t                    *testing.T
	hh                   *hybridHarness
	maxPinned            int
	pins                 []modelPin
	made, capped, served int
}

type modelPin struct {
	id     PinID
	tokens []int32 // the pinned prefix
}

func prefixKey(tokens []int32) string { return fmt.Sprint(tokens) }

// covered returns the model's pinned set: each page-aligned prefix of a
// live pin, with how many pins cover it.
func (x *pinModel) covered() map[string]int {
	set := map[string]int{}
	for _, p := range x.pins {
		for k := hhPageSize; k <= len(p.tokens); k += hhPageSize {
			set[prefixKey(p.tokens[:k])]++
		}
	}
	return set
}

// held returns how many leading pages of tokens every group's cache holds,
// at most len(tokens)/PageSize, asking each cache page by page.
func (x *pinModel) held(tokens []int32) int {
	n := len(tokens) / hhPageSize
	for _, m := range x.hh.h.core.groups {
		k := 0
		for k < n {
			pages, _ := m.cache.Match(nil, m.cache.Key(Namespace{}), tokens[:(k+1)*hhPageSize], k+1)
			if len(pages) != k+1 {
				break
			}
			k++
		}
		n = k
	}
	return n
}

func (x *pinModel) pin() {
	t, h := x.t, x.hh.h
	tokens := promptOf(x.hh.rng.IntN(6), 1+x.hh.rng.IntN(22))
	n := x.held(tokens)
	fresh := 0
	set := x.covered()
	for k := 1; k <= n; k++ {
		if set[prefixKey(tokens[:k*hhPageSize])] == 0 {
			fresh++
		}
	}
	before := h.Stats()
	id, got, err := h.Pin(Namespace{}, tokens)
	switch {
	case n == 0:
		require.ErrorIs(t, err, ErrNotCached, "pin %v", tokens)
	case len(set)+fresh > x.maxPinned:
		require.ErrorIs(t, err, ErrPinLimit, "pin %v: %d pinned, %d fresh", tokens, len(set), fresh)
		x.capped++
	default:
		require.NoError(t, err, "pin %v", tokens)
		require.Equal(t, n*hhPageSize, got, "pin %v", tokens)
		x.pins = append(x.pins, modelPin{id, slices.Clone(tokens[:got])})
		x.made++
		return
	}
	require.Equal(t, before, h.Stats(), "a refused pin changed the manager")
}

func (x *pinModel) unpin() {
	if len(x.pins) == 0 {
		return
	}
	i := x.hh.rng.IntN(len(x.pins))
	require.NoError(x.t, x.hh.h.Unpin(x.pins[i].id))
	x.pins = slices.Delete(x.pins, i, i+1)
}

// serve adds a request whose prompt extends a live pin's tokens by one: it
// is served at least the pinned tokens.
func (x *pinModel) serve() {
	if len(x.pins) == 0 {
		return
	}
	hh := x.hh
	p := x.pins[hh.rng.IntN(len(x.pins))]
	id := hh.next
	hh.next++
	got, err := hh.h.Add(id, Request{Prompt: append(slices.Clone(p.tokens), 1)})
	require.NoError(x.t, err)
	require.GreaterOrEqual(x.t, got, len(p.tokens), "add of pinned %v", p.tokens)
	hh.ids = append(hh.ids, id)
	x.served++
}

func (x *pinModel) check(op int) {
	t, h := x.t, x.hh.h
	want := len(x.covered())
	s := h.Stats()
	for g, gs := range s.Groups {
		if gs.PinnedPages != want {
			require.Failf(t, "pinned pages", "op %d group %d: %d pinned pages, the model's pins cover %d", op, g, gs.PinnedPages, want)
		}
	}
	for _, p := range x.pins {
		if n := x.held(p.tokens); n*hhPageSize != len(p.tokens) {
			require.Failf(t, "pin lost", "op %d: pin %d of %d tokens: every group holds only %d pages", op, p.id, len(p.tokens), n)
		}
	}
}

// drain unpins everything and releases every request: eviction then
// empties the pool.
func (x *pinModel) drain() {
	t, h := x.t, x.hh.h
	for len(x.pins) > 0 {
		x.unpin()
	}
	for _, id := range x.hh.ids {
		require.NoError(t, h.Release(id))
	}
	x.hh.ids = nil
	h.Evict(hhPages)
	s := h.Stats()
	require.Equal(t, [3]int{hhPages, 0, 0}, [3]int{s.FreePages, s.CachedPages, s.PinnedPages}, "after every unpin and release")
	require.NoError(t, h.Audit())
}
