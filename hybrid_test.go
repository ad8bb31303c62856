package pagedkv

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/layout"
)

// Hybrid models at test scale (page size 4): the shapes of the real ones,
// windows and chunks shrunk so that short requests cross them.
func hybridConfigs() map[string][]LayerGroup {
	sl := func(w int) LayerGroup { return LayerGroup{Kind: SlidingAttention, WindowTokens: w, NumLayers: 1} }
	full := LayerGroup{Kind: FullAttention, NumLayers: 1}
	chunk := LayerGroup{Kind: ChunkedAttention, ChunkTokens: 8, NumLayers: 1}
	return map[string][]LayerGroup{
		// gpt-oss: sliding (128 tokens) and full layers alternate: two
		// groups of equal layer counts.
		"gpt-oss-like": {sl(6), full},
		// Gemma 3: five local layers (1024) per global one: five sliding
		// groups and one full group of equal layer counts.
		"gemma-3-like": {sl(9), sl(9), sl(9), sl(9), sl(9), full},
		// Llama 4: chunked local attention (8192) on three of four layers.
		"llama-4-like": {chunk, chunk, chunk, full},
		// DeepSeek: MLA on every layer.
		"mla": {{Kind: MLAAttention, NumLayers: 1}},
	}
}

// TestScenarioHybridHitRule draws the hit rule on gpt-oss-like groups
// (sliding window 6, full; pages of 4): a 13-token prompt is computed and
// cached in both groups; a second request on the same prompt hits 12
// tokens. Evicting the sliding group's cached pages (the full group's stay)
// shrinks the hit to what both groups can serve: nothing.
func TestScenarioHybridHitRule(t *testing.T) {
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 32, PageSize: 4, HashSeed: 1},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 2}, {Kind: FullAttention, NumLayers: 2}}})
	require.NoError(t, err)
	prompt := seqTokens(10, 13)
	_, err = h.Add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	p, err := h.Reserve([]RequestID{1}, []int32{13})
	require.NoError(t, err)
	require.Len(t, p.Groups, 2)
	require.Equal(t, 5, p.Groups[0].WindowLeft)
	require.Equal(t, -1, p.Groups[1].WindowLeft)
	require.NoError(t, h.Commit([]int32{7}))
	require.NoError(t, h.Audit())
	// The sliding group keeps the pages holding the last 6 tokens (7..12:
	// pages 1..3), the full group every page.
	pages, start := h.Pages(0, 1)
	require.Equal(t, 4, start)
	require.Len(t, pages, 3)
	pages, start = h.Pages(1, 1)
	require.Equal(t, 0, start)
	require.Len(t, pages, 4)

	matched, err := h.Add(2, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 12, matched, "both groups cached pages 0..2")
	pages, start = h.Pages(0, 2)
	require.Equal(t, 4, start, "the sliding group takes only the pages its next query reads")
	require.Len(t, pages, 2)
	require.NoError(t, h.Release(2))
	require.NoError(t, h.Release(1))

	// Evict the sliding group's idle pages on purpose; the full group's
	// stay cached.
	h.core.groups[0].cache.Evict(h.core.alloc.NumPages())
	h.core.groups[0].afterChange()
	require.NoError(t, h.Audit())
	s := h.Stats()
	require.Zero(t, s.Groups[0].CachedPages)
	require.Equal(t, 3, s.Groups[1].CachedPages)
	matched, err = h.Add(3, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, matched, "the full group alone could serve 12 tokens; the sliding group nothing")
	require.NoError(t, h.Audit())
}

// TestScenarioHybridPlans draws docs/manager.md's worked example of layer
// groups: gpt-oss-like groups (sliding window 6, full; pages of 4) on one
// pool of 32 pages. A 13-token prompt takes pages 0..3 in the sliding group
// and 4..7 in the full group; at commit the sliding group releases page 0
// (the next query, at 13, reads 8..13), which stays cached; after the next
// decode step it releases page 1 too.
func TestScenarioHybridPlans(t *testing.T) {
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 32, PageSize: 4, HashSeed: 1},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 2}, {Kind: FullAttention, NumLayers: 2}}})
	require.NoError(t, err)
	_, err = h.Add(1, Request{Prompt: seqTokens(10, 13)})
	require.NoError(t, err)
	p, err := h.Reserve([]RequestID{1}, []int32{13})
	require.NoError(t, err)
	sl, full := p.Groups[0], p.Groups[1]
	require.Equal(t, []int32{0, 4}, sl.KVIndptr)
	require.Equal(t, []int32{0, 1, 2, 3}, sl.KVPageIndices)
	require.Equal(t, []int32{1}, sl.KVLastPageLen)
	require.Equal(t, 5, sl.WindowLeft)
	require.Equal(t, []int32{0, 4}, full.KVIndptr)
	require.Equal(t, []int32{4, 5, 6, 7}, full.KVPageIndices)
	require.Equal(t, []int32{1}, full.KVLastPageLen)
	require.Equal(t, -1, full.WindowLeft)
	require.NoError(t, h.Commit([]int32{7}))
	pages, start := h.Pages(0, 1)
	require.Equal(t, []PageID{1, 2, 3}, pages)
	require.Equal(t, 4, start)
	pages, start = h.Pages(1, 1)
	require.Equal(t, []PageID{4, 5, 6, 7}, pages)
	require.Equal(t, 0, start)
	s := h.Stats()
	require.Equal(t, 24, s.FreePages, "page 0 left the sliding group's table but stays cached")
	require.Equal(t, 3, s.Groups[0].CachedPages)
	require.Equal(t, int64(1), s.Groups[0].WindowReleasedPages)

	p, err = h.Reserve([]RequestID{1}, []int32{1})
	require.NoError(t, err)
	sl, full = p.Groups[0], p.Groups[1]
	require.Equal(t, []int32{1, 2, 3}, sl.KVPageIndices)
	require.Equal(t, []int32{2}, sl.KVLastPageLen)
	require.Equal(t, []int32{9}, sl.Positions, "positions count from the group's first held token")
	require.Equal(t, []int32{13}, sl.TokenPositions)
	require.Equal(t, []int32{4, 5, 6, 7}, full.KVPageIndices)
	require.Equal(t, []int32{13}, full.Positions)
	require.NoError(t, h.Commit([]int32{8}))
	pages, start = h.Pages(0, 1)
	require.Equal(t, []PageID{2, 3}, pages)
	require.Equal(t, 8, start)
	require.Equal(t, int64(2), h.Stats().Groups[0].WindowReleasedPages)
	require.NoError(t, h.Audit())
}

// TestScenarioHybridCascade draws docs/manager.md's worked example of
// cascade with windows: four requests hit a cached 32-token prefix on
// gpt-oss-like groups (sliding window 6, full; pages of 4) and prefill 5
// tokens each. The full group's plan has two cascade levels (the 8 shared
// pages once, then each request's 2 own pages); the sliding group holds
// only pages 6 and 7 of the prefix (tokens 24..31) and its plan is flat,
// because every row's window (row at 32: keys 27..32; row at 36: 31..36)
// excludes some token of each shared page. With W = 48 the same batch
// holds 37 keys per request, all visible to every row, and the sliding
// group's plan is the same two-level cascade with CascadeWindowLeft
// [-1 47]; decoding on, it stays a cascade up to 48 keys per request and
// turns flat at 49 (the full group's stays a cascade).
func TestScenarioHybridCascade(t *testing.T) {
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 128, PageSize: 4, HashSeed: 1},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 2}, {Kind: FullAttention, NumLayers: 2}}})
	require.NoError(t, err)
	sys := seqTokens(100, 32)
	_, err = h.Add(1, Request{Prompt: append(slices.Clone(sys), 1)})
	require.NoError(t, err)
	_, err = h.Reserve([]RequestID{1}, []int32{33})
	require.NoError(t, err)
	require.NoError(t, h.Commit(nil))
	ids := []RequestID{2, 3, 4, 5}
	for i, id := range ids {
		n, err := h.Add(id, Request{Prompt: append(slices.Clone(sys), seqTokens(1000*(i+1), 5)...)})
		require.NoError(t, err)
		require.Equal(t, 32, n)
	}
	p, err := h.Reserve(ids, []int32{5, 5, 5, 5})
	require.NoError(t, err)
	sl, full := p.Groups[0], p.Groups[1]
	require.Nil(t, sl.Cascade)
	require.Nil(t, sl.CascadeWindowLeft)
	require.Equal(t, 5, sl.WindowLeft)
	require.Equal(t, []int32{0, 4, 8, 12, 16}, sl.KVIndptr)
	require.Equal(t, []int32{6, 7, 18, 19, 6, 7, 20, 21, 6, 7, 22, 23, 6, 7, 24, 25}, sl.KVPageIndices)
	require.Equal(t, []int32{1, 1, 1, 1}, sl.KVLastPageLen)
	require.NotNil(t, full.Cascade)
	require.Equal(t, -1, full.WindowLeft)
	lv := full.Cascade.Levels
	require.Len(t, lv, 2)
	require.Equal(t, []int32{0, 20}, lv[0].QOIndptr)
	require.Equal(t, []int32{0, 8}, lv[0].KVIndptr)
	require.Equal(t, []int32{9, 10, 11, 12, 13, 14, 15, 16}, lv[0].KVPageIndices)
	require.Equal(t, []int32{4}, lv[0].KVLastPageLen)
	require.Equal(t, []int32{0, 5, 10, 15, 20}, lv[1].QOIndptr)
	require.Equal(t, []int32{0, 2, 4, 6, 8}, lv[1].KVIndptr)
	require.Equal(t, []int32{26, 27, 28, 29, 30, 31, 32, 33}, lv[1].KVPageIndices)
	require.Equal(t, []int32{1, 1, 1, 1}, lv[1].KVLastPageLen)
	// No shared page of the sliding group is visible to every row.
	spec := h.Group(0)
	for _, first := range []int{24, 28} {
		all := true
		for q := 32; q <= 36; q++ {
			for k := first; k < first+4; k++ {
				all = all && spec.Visible(q, k)
			}
		}
		require.False(t, all, "page of tokens %d..%d", first, first+3)
	}
	require.NoError(t, h.Commit(nil))
	require.NoError(t, h.Audit())

	// The same batch with W = 48: every request holds 37 <= 48 keys, so
	// every row sees the whole prefix and the sliding group cascades like
	// the full group, window_left -1 on the shared level and 47 on each
	// request's own pages. Decoding on, a request past 48 keys shares
	// nothing (its first page holds a key outside the window) and the plan
	// turns flat.
	h, err = NewHybrid(HybridConfig{Config: Config{NumPages: 128, PageSize: 4, HashSeed: 1},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 48, NumLayers: 2}, {Kind: FullAttention, NumLayers: 2}}})
	require.NoError(t, err)
	_, err = h.Add(1, Request{Prompt: append(slices.Clone(sys), 1)})
	require.NoError(t, err)
	_, err = h.Reserve([]RequestID{1}, []int32{33})
	require.NoError(t, err)
	require.NoError(t, h.Commit(nil))
	for i, id := range ids {
		n, err := h.Add(id, Request{Prompt: append(slices.Clone(sys), seqTokens(1000*(i+1), 5)...)})
		require.NoError(t, err)
		require.Equal(t, 32, n)
	}
	p, err = h.Reserve(ids, []int32{5, 5, 5, 5})
	require.NoError(t, err)
	sl = p.Groups[0]
	require.NotNil(t, sl.Cascade)
	require.Equal(t, []int{-1, 47}, sl.CascadeWindowLeft)
	require.Equal(t, []int{-1, -1}, p.Groups[1].CascadeWindowLeft)
	lv = sl.Cascade.Levels
	require.Len(t, lv, 2)
	require.Equal(t, []int32{0, 20}, lv[0].QOIndptr)
	require.Equal(t, []int32{0, 8}, lv[0].KVIndptr)
	require.Equal(t, []int32{0, 1, 2, 3, 4, 5, 6, 7}, lv[0].KVPageIndices)
	require.Equal(t, []int32{4}, lv[0].KVLastPageLen)
	require.Equal(t, []int32{0, 5, 10, 15, 20}, lv[1].QOIndptr)
	require.Equal(t, []int32{0, 2, 4, 6, 8}, lv[1].KVIndptr)
	require.Equal(t, []int32{18, 19, 20, 21, 22, 23, 24, 25}, lv[1].KVPageIndices)
	require.Equal(t, []int32{1, 1, 1, 1}, lv[1].KVLastPageLen)
	require.NoError(t, h.Commit([]int32{7, 7, 7, 7}))
	decode := []int32{1, 1, 1, 1}
	for n := 38; n <= 48; n++ { // the step's SeqLens
		p, err = h.Reserve(ids, decode)
		require.NoError(t, err)
		require.Equal(t, int32(n), p.Groups[0].SeqLens[0])
		require.NotNil(t, p.Groups[0].Cascade, "%d keys", n)
		require.NoError(t, h.Commit([]int32{7, 7, 7, 7}))
	}
	p, err = h.Reserve(ids, decode)
	require.NoError(t, err)
	require.Equal(t, int32(49), p.Groups[0].SeqLens[0])
	require.Nil(t, p.Groups[0].Cascade)
	require.Nil(t, p.Groups[0].CascadeWindowLeft)
	require.NotNil(t, p.Groups[1].Cascade)
	require.NoError(t, h.Commit(nil))
	require.NoError(t, h.Audit())
}

// TestHybridEvictionShrinksHit evicts a sliding group's pages on purpose,
// one at a time, on every hybrid config with a sliding group, and checks
// after each eviction that a new request's hit is exactly the shortest
// prefix every group still serves (measured page by page), never longer.
func TestHybridEvictionShrinksHit(t *testing.T) {
	for name, groups := range hybridConfigs() {
		t.Run(name, func(t *testing.T) {
			h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 200, PageSize: 4, HashSeed: 1}, Groups: groups})
			require.NoError(t, err)
			prompt := seqTokens(3, 41)
			_, err = h.Add(1, Request{Prompt: prompt})
			require.NoError(t, err)
			_, err = h.Reserve([]RequestID{1}, []int32{41})
			require.NoError(t, err)
			require.NoError(t, h.Commit(nil))
			require.NoError(t, h.Release(1))
			id := RequestID(2)
			last, shorter := 40, false
			for g := range groups {
				for {
					serve := 40 / 4
					most := 0
					for _, m := range h.core.groups {
						pages, _ := m.cache.Match(nil, m.cache.Key(Namespace{}), prompt, 40/4)
						serve = min(serve, len(pages))
						most = max(most, len(pages))
					}
					matched, err := h.Add(id, Request{Prompt: prompt})
					require.NoError(t, err)
					require.Equal(t, serve*4, matched, "group %d evicting", g)
					require.LessOrEqual(t, matched, last, "an eviction lengthened the hit")
					// The hit is shorter than what some group alone serves:
					// the group being evicted limits it.
					shorter = shorter || matched < most*4
					last = matched
					require.NoError(t, h.Audit())
					require.NoError(t, h.Release(id))
					id++
					if h.core.groups[g].cache.Evict(1) == 0 {
						break
					}
				}
			}
			matched, err := h.Add(id, Request{Prompt: prompt})
			require.NoError(t, err)
			require.Zero(t, matched)
			if len(groups) > 1 {
				require.True(t, shorter, "no eviction left one group serving more than the hit")
			}
		})
	}
}

// TestHybridMatchesRules runs random engine workloads (adds over shared
// prompts, chunked prefill, decode, speculative steps with random accept
// counts, forks, truncation, preemption, resume, eviction, aborted steps)
// on the four hybrid configs, >= 100k operations each, and after every
// operation checks Audit (every group's invariants, the start of each
// group's pages equal to its KeepFrom rule, no page in two groups, exact
// reference counts over the pool) and a fake K/V store: the engine writes
// f(token, position, group) for every appended row of every group, and
// every running request's pages must read f back for every token its group
// must still read. Adds and resumes must hit exactly the prefix every
// group's cache serves, and chunked groups' attention entries must cover
// exactly each row's visible keys.
func TestHybridMatchesRules(t *testing.T) {
	t.Parallel()
	// 100k operations per config; under -race (CI) a twentieth, to keep
	// the suite's time on 2 cores (.ci/run runs the full count without it).
	runs, ops := 100, 1000
	if raceEnabled || testing.Short() {
		runs = 5
	}
	for name, groups := range hybridConfigs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var s HybridStats
			var total int
			for run := range runs {
				hh := newHybridHarness(t, groups, uint64(run))
				for op := range ops {
					hh.op()
					hh.check(op)
					total++
				}
				st := hh.h.Stats()
				s.Steps += st.Steps
				s.PromptHitTokens += st.PromptHitTokens
				s.EvictedPages += st.EvictedPages
				s.WindowReleasedPages += st.WindowReleasedPages
				s.CopiedPages += st.CopiedPages
				s.AcceptedDraftTokens += st.AcceptedDraftTokens
				s.Preemptions += st.Preemptions
			}
			if !raceEnabled && !testing.Short() {
				require.GreaterOrEqual(t, total, 100_000)
			}
			require.Positive(t, s.PromptHitTokens)
			require.Positive(t, s.EvictedPages)
			require.Positive(t, s.CopiedPages)
			require.Positive(t, s.AcceptedDraftTokens)
			require.Positive(t, s.Preemptions)
			if len(groups) > 1 {
				require.Positive(t, s.WindowReleasedPages)
			}
			t.Logf("%d ops: %d steps, %d hit tokens, %d evicted, %d window/chunk released, %d copies, %d accepted drafts, %d preemptions",
				total, s.Steps, s.PromptHitTokens, s.EvictedPages, s.WindowReleasedPages, s.CopiedPages, s.AcceptedDraftTokens, s.Preemptions)
		})
	}
}

const hhPages, hhPageSize = 48, 4

type hybridHarness struct {
	t    testing.TB
	rng  *rand.Rand
	h    *HybridManager
	kv   []uint64
	ids  []RequestID
	next RequestID
	// onPlan, when set, is called with every reserved plan after engine
	// checked it (tests that run kernels on the plans).
	onPlan func(*HybridPlan)
}

func newHybridHarness(t testing.TB, groups []LayerGroup, seed uint64) *hybridHarness {
	return newHybridHarnessSrc(t, groups, rand.NewPCG(seed, 99))
}

func newHybridHarnessSrc(t testing.TB, groups []LayerGroup, src rand.Source) *hybridHarness {
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: hhPages, PageSize: hhPageSize, HashSeed: 5, BlockTablesStride: hhPages}, Groups: groups})
	require.NoError(t, err)
	return &hybridHarness{t: t, rng: rand.New(src), h: h, kv: make([]uint64, hhPages*hhPageSize)}
}

// byteSource feeds a harness's choices from fuzz input, one byte a draw:
// the byte is the draw's top 8 bits, so rand's IntN(n) (the high word of
// the draw times n) picks about byte*n/256 and a mutated byte changes one
// choice. The low bits mix a counter, so rand's rejection sampling cannot
// loop. Once the input runs out (the operation in progress finishes, then
// the run ends) draws are the mixed counter alone.
type byteSource struct {
	data []byte
	n    uint64
}

func (s *byteSource) Uint64() uint64 {
	s.n++
	v := s.n * 0x9e3779b97f4a7c15
	v ^= v >> 29
	if len(s.data) == 0 {
		return v
	}
	b := s.data[0]
	s.data = s.data[1:]
	return uint64(b)<<56 | v>>8
}

// FuzzHybrid drives a HybridManager with choices read from the input: the
// first byte picks the config (gpt-oss-like, Gemma-3-like, Llama-4-like,
// MLA), then each operation (add, fork, release, preempt, resume, evict,
// truncate, extend, plain and speculative steps, aborts) draws its
// arguments from the bytes, with TestHybridMatchesRules' checks after
// each: Audit, the hit rule, every group's KeepFrom start, chunked
// attention entries and the fake K/V of every group. Seeds are short (64
// choices) and inputs are cut at 256: Go minimizes every input that widens
// coverage, in time quadratic in its length, and 257-byte seeds left a 5 s
// run (CI's) minimizing one input, with 5 execs counted.
func FuzzHybrid(f *testing.F) {
	names := []string{"gpt-oss-like", "gemma-3-like", "llama-4-like", "mla"}
	for i := range names {
		seed := make([]byte, 1+64)
		for j := range seed {
			seed[j] = byte(j*37 + i*11)
		}
		seed[0] = byte(i)
		f.Add(seed)
	}
	configs := hybridConfigs()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		data = data[:min(len(data), 1+256)]
		src := &byteSource{data: data[1:]}
		hh := newHybridHarnessSrc(t, configs[names[int(data[0])%len(names)]], src)
		for op := 0; len(src.data) > 0; op++ {
			hh.op()
			hh.check(op)
		}
	})
}

func groupKV(tok int32, pos, g int) uint64 { return fakeKV(tok, pos) ^ uint64(g+1)<<56 }

func (hh *hybridHarness) pick(running bool) (RequestID, bool) {
	var c []RequestID
	for _, id := range hh.ids {
		if !running || hh.h.Running(id) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return 0, false
	}
	return c[hh.rng.IntN(len(c))], true
}

// expectHit computes, before an Add or Resume, the prefix every group
// serves, page by page.
func (hh *hybridHarness) expectHit(ns Namespace, tokens []int32) int {
	if len(tokens) < 2 {
		return 0
	}
	serve := (len(tokens) - 1) / hhPageSize
	for _, m := range hh.h.core.groups {
		pages, _ := m.cache.Match(nil, m.cache.Key(ns), tokens, serve)
		serve = min(serve, len(pages))
	}
	return serve * hhPageSize
}

func (hh *hybridHarness) op() {
	r, h, t := hh.rng, hh.h, hh.t
	switch k := r.IntN(24); {
	case k < 4:
		id := hh.next
		hh.next++
		prompt := promptOf(r.IntN(6), 1+r.IntN(22))
		want := hh.expectHit(Namespace{}, prompt)
		got, err := h.Add(id, Request{Prompt: prompt})
		require.NoError(t, err)
		require.Equal(t, want, got, "add %d: hit", id)
		hh.ids = append(hh.ids, id)
	case k < 5:
		if p, ok := hh.pick(true); ok {
			id := hh.next
			hh.next++
			require.NoError(t, h.Fork(p, id))
			hh.ids = append(hh.ids, id)
		}
	case k < 7:
		if id, ok := hh.pick(false); ok {
			require.NoError(t, h.Release(id))
			hh.ids = slices.DeleteFunc(hh.ids, func(x RequestID) bool { return x == id })
		}
	case k < 8:
		if id, ok := hh.pick(true); ok {
			require.NoError(t, h.Preempt(id))
		}
	case k < 9:
		if id, ok := hh.pick(false); ok && !h.Running(id) {
			want := hh.expectHit(Namespace{}, h.Tokens(id))
			got, err := h.Resume(id)
			require.NoError(t, err)
			require.Equal(t, want, got, "resume %d: hit", id)
		}
	case k < 10:
		h.Evict(1 + r.IntN(hhPages/2))
	case k < 11:
		if id, ok := hh.pick(false); ok {
			n := max(0, len(h.Tokens(id))-r.IntN(10))
			err := h.Truncate(id, n)
			if err != nil {
				require.ErrorIs(t, err, ErrBadArgument)
			}
		}
	case k < 12:
		if id, ok := hh.pick(false); ok {
			require.NoError(t, h.Extend(id, promptOf(r.IntN(6), 1+r.IntN(4))...))
		}
	default:
		hh.step()
	}
}

// stepDraw says how the randomized hybrid tests draw a step: each running
// candidate joins with probability 1/2 (at most 4 join) and computes
// min(left, minNew+IntN(newSpan)) of its uncomputed tokens; one that computes
// all of them takes IntN(draftSpan) drafts when spec is set.
type stepDraw struct {
	minNew, newSpan, draftSpan int
	spec                       bool
}

// draw picks a step's requests, token counts and drafts from candidates.
func (d stepDraw) draw(r *rand.Rand, h *HybridManager, candidates []RequestID) (ids []RequestID, nt []int32, drafts [][]int32) {
	for _, id := range candidates {
		if !h.Running(id) || r.IntN(2) == 0 || len(ids) == 4 {
			continue
		}
		left := len(h.Tokens(id)) - h.Computed(id)
		n := min(left, d.minNew+r.IntN(d.newSpan))
		var dr []int32
		if d.spec && n == left {
			for range r.IntN(d.draftSpan) {
				dr = append(dr, int32(r.IntN(90)))
			}
		}
		if n+len(dr) == 0 {
			continue
		}
		ids, nt, drafts = append(ids, id), append(nt, int32(n)), append(drafts, dr)
	}
	return ids, nt, drafts
}

// drawCommit draws the commit of a reserved speculative step: request b
// keeps IntN(len(drafts[b])+1) of its drafts and samples IntN(90), or
// NoToken unless the step reaches the end of its known tokens.
func drawCommit(r *rand.Rand, h *HybridManager, ids []RequestID, nt []int32, drafts [][]int32) (accepted, sampled []int32) {
	accepted, sampled = make([]int32, len(ids)), make([]int32, len(ids))
	for b, id := range ids {
		accepted[b] = int32(r.IntN(len(drafts[b]) + 1))
		sampled[b] = NoToken
		if h.Computed(id)+int(nt[b])+len(drafts[b]) == len(h.Tokens(id)) {
			sampled[b] = int32(r.IntN(90))
		}
	}
	return accepted, sampled
}

func (hh *hybridHarness) step() {
	r, h, t := hh.rng, hh.h, hh.t
	ids, nt, drafts := stepDraw{minNew: 1, newSpan: 9, draftSpan: 4, spec: r.IntN(3) == 0}.draw(r, h, hh.ids)
	if len(ids) == 0 {
		return
	}
	before := h.Stats()
	p, err := h.ReserveSpec(ids, nt, drafts)
	if err != nil {
		require.ErrorIs(t, err, ErrOutOfPages)
		require.Equal(t, before, h.Stats(), "a failed Reserve changed the Manager")
		require.NoError(t, h.Preempt(ids[r.IntN(len(ids))]))
		return
	}
	hh.engine(p)
	require.NoError(t, h.Audit(), "during the step")
	if r.IntN(10) == 0 {
		require.NoError(t, h.Abort())
		return
	}
	accepted, sampled := drawCommit(r, h, ids, nt, drafts)
	require.NoError(t, h.CommitSpec(accepted, sampled))
}

// engine performs the copies, writes every group's rows and checks each
// group's plan against its pages (and a chunked group's attention entries
// against the dense visibility rule).
func (hh *hybridHarness) engine(p *HybridPlan) {
	t, ps := hh.t, hhPageSize
	for _, c := range p.Copies {
		copy(hh.kv[int(c.Dst)*ps:int(c.Dst)*ps+int(c.Entries)], hh.kv[int(c.Src)*ps:])
	}
	for g, gp := range p.Groups {
		require.Equal(t, p.Requests, gp.Requests)
		requireBlockTablesMatchCSR(t, gp, hh.h.core.groups[g].cfg.BlockTablesStride, ps)
		for i := range gp.Positions {
			b, pos := gp.BatchIndices[i], gp.Positions[i]
			page := gp.KVPageIndices[gp.KVIndptr[b]+pos/int32(ps)]
			hh.kv[int(page)*ps+int(pos)%ps] = groupKV(gp.TokenIDs[i], int(gp.TokenPositions[i]), g)
		}
		spec := hh.h.core.groups[g].layerGroup
		if spec.Kind != layergroup.Chunked {
			require.Nil(t, gp.AttnQOIndptr)
			continue
		}
		require.Equal(t, gp.QOIndptr[len(gp.QOIndptr)-1], gp.AttnQOIndptr[len(gp.AttnQOIndptr)-1])
		for e := range gp.AttnRequests {
			b := gp.AttnRequests[e]
			pages := gp.KVPageIndices[gp.KVIndptr[b]:gp.KVIndptr[b+1]]
			seg := gp.AttnKVPageIndices[gp.AttnKVIndptr[e]:gp.AttnKVIndptr[e+1]]
			first := slices.Index(pages, seg[0])
			require.GreaterOrEqual(t, first, 0)
			require.Equal(t, pages[first:first+len(seg)], seg)
			_, start := hh.h.Pages(g, p.Requests[b])
			keyFrom := start + first*ps
			kvLen := (len(seg)-1)*ps + int(gp.AttnKVLastPageLen[e])
			rows := int(gp.AttnQOIndptr[e+1] - gp.AttnQOIndptr[e])
			for j := range rows {
				row := int(gp.AttnQOIndptr[e]) + j
				require.Equal(t, b, gp.BatchIndices[row])
				q := int(gp.TokenPositions[row])
				require.Equal(t, keyFrom+kvLen-rows+j, q, "causal alignment of row %d", row)
				for k := max(0, q-3*spec.ChunkTokens); k <= q; k++ {
					if spec.Visible(q, k) != (k >= keyFrom) {
						require.Failf(t, "chunk keys", "row at %d: key %d visible %v, entry keys from %d", q, k, spec.Visible(q, k), keyFrom)
					}
				}
			}
		}
	}
	if hh.onPlan != nil {
		hh.onPlan(p)
	}
}

func (hh *hybridHarness) check(op int) {
	t, h, ps := hh.t, hh.h, hhPageSize
	if err := h.Audit(); err != nil {
		require.NoError(t, err, "audit after op %d", op)
	}
	for _, id := range hh.ids {
		if !h.Running(id) {
			continue
		}
		tokens, n := h.Tokens(id), h.Computed(id)
		for g := range h.NumGroups() {
			spec := h.Group(g)
			pages, start := h.Pages(g, id)
			if start != spec.KeepFrom(n, ps) {
				require.Failf(t, "start", "op %d: request %d group %d starts at %d, want %d", op, id, g, start, spec.KeepFrom(n, ps))
			}
			for tk := start; tk < n; tk++ {
				got := hh.kv[int(pages[(tk-start)/ps])*ps+(tk-start)%ps]
				if want := groupKV(tokens[tk], tk, g); got != want {
					require.Failf(t, "wrong K/V", "op %d: request %d group %d token %d reads %#x, want %#x", op, id, g, tk, got, want)
				}
			}
		}
	}
}

// TestHybridDecodeEqualsDense runs each hybrid config's groups through real
// attention on the CPU backend: one paged cache serves every group (a page
// belongs to one group at a time), prefill in chunks that cross window and
// chunk boundaries, then decode and speculative steps; every step's rows,
// attended over each group's pages with its window_left (or a chunked
// group's Attn entries), must equal dense float64 attention over the whole
// sequence under that group's visibility rule.
func TestHybridDecodeEqualsDense(t *testing.T) {
	for name, groups := range hybridConfigs() {
		t.Run(name, func(t *testing.T) {
			const ps = 4
			h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 256, PageSize: ps, HashSeed: 1}, Groups: groups})
			require.NoError(t, err)
			e := newCPUEngine(t, 256, ps)
			prompt := seqTokens(40, 23)
			_, err = h.Add(1, Request{Prompt: prompt})
			require.NoError(t, err)
			_, err = h.Add(2, Request{Prompt: seqTokens(70, 9)})
			require.NoError(t, err)
			for step := 0; step < 30; step++ {
				var ids []RequestID
				var nt []int32
				var drafts [][]int32
				for _, id := range []RequestID{1, 2} {
					left := len(h.Tokens(id)) - h.Computed(id)
					n := min(left, 5)
					var d []int32
					if n == left && step%3 == 0 {
						d = []int32{int32(step), int32(step + 1), int32(step + 2)}
					}
					if n+len(d) > 0 {
						ids, nt, drafts = append(ids, id), append(nt, int32(n)), append(drafts, d)
					}
				}
				p, err := h.ReserveSpec(ids, nt, drafts)
				require.NoError(t, err)
				// Copies first (pool-wide), then every group's appends.
				e.copyPages(p.Copies)
				for _, gp := range p.Groups {
					gpNoCopies := *gp
					gpNoCopies.Copies = nil
					e.apply(t, &gpNoCopies)
				}
				for g, gp := range p.Groups {
					got := e.groupAttention(t, gp, h.core.groups[g].layerGroup)
					want := denseGroupAttention(gp, h.core.groups[g].layerGroup, func(id RequestID) []int32 { return h.Tokens(id) })
					requireClose(t, want, got, 1e-5, fmt.Sprintf("%s group %d (%v) step %d", name, g, h.core.groups[g].layerGroup.Kind, step))
				}
				accepted, sampled := make([]int32, len(ids)), make([]int32, len(ids))
				for b, id := range ids {
					accepted[b] = int32(min(len(drafts[b]), step%2))
					sampled[b] = NoToken
					if h.Computed(id)+int(nt[b])+len(drafts[b]) == len(h.Tokens(id)) {
						sampled[b] = int32(300 + step)
					}
				}
				require.NoError(t, h.CommitSpec(accepted, sampled))
				require.NoError(t, h.Audit())
			}
			require.Positive(t, h.Stats().Steps)
		})
	}
}

// groupAttention is causal attention of every row of a group's plan over
// its pages on the CPU backend: batch prefill with the group's
// window_left, on a chunked group's Attn entries when it has them.
func (e *cpuEngine) groupAttention(t testing.TB, p *Plan, spec LayerGroup) []float32 {
	nnz := len(p.Positions)
	q := make([]float32, 0, nnz*engHeads*engDim)
	for r := range nnz {
		q = append(q, queryOf(r)...)
	}
	qo, table := p.QOIndptr, kernels.PageTable{KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices, KVLastPageLen: p.KVLastPageLen}
	if p.AttnQOIndptr != nil {
		qo, table = p.AttnQOIndptr, kernels.PageTable{KVIndptr: p.AttnKVIndptr, KVPageIndices: p.AttnKVPageIndices, KVLastPageLen: p.AttnKVLastPageLen}
	}
	o := kernels.NewTensor(layout.F32, nnz, engHeads, engDim)
	require.NoError(t, e.be.BatchPrefill(&kernels.PrefillParams{
		Q: kernels.TensorFromF32(layout.F32, q, nnz, engHeads, engDim), QOIndptr: qo, Cache: e.cache,
		Table: table, Causal: true, O: o,
		AttentionParams: kernels.AttentionParams{NumQOHeads: engHeads, WindowLeft: p.WindowLeft},
	}))
	require.Equal(t, spec.WindowLeft(), p.WindowLeft)
	return o.F32()
}

// denseGroupAttention is float64 attention of every row of the plan over
// the request's whole token sequence, keys chosen by the group's
// visibility rule, K/V recomputed from (token, position).
func denseGroupAttention(p *Plan, spec LayerGroup, tokensOf func(RequestID) []int32) []float32 {
	out := make([]float32, 0, len(p.Positions)*engHeads*engDim)
	scale := 1 / math.Sqrt(engDim)
	for r := range p.Positions {
		tokens := tokensOf(p.Requests[p.BatchIndices[r]])
		qpos := int(p.TokenPositions[r])
		qv := queryOf(r)
		for hd := range engHeads {
			var logits []float64
			var vals [][]float32
			for k := 0; k <= qpos; k++ {
				if !spec.Visible(qpos, k) {
					continue
				}
				kv := kvOf(0, tokens[k], int32(k), hd)
				s := 0.0
				for d := range engDim {
					s += float64(qv[hd*engDim+d]) * float64(kv[d])
				}
				logits = append(logits, s*scale)
				vals = append(vals, kvOf(1, tokens[k], int32(k), hd))
			}
			mx := math.Inf(-1)
			for _, l := range logits {
				mx = max(mx, l)
			}
			sum := 0.0
			acc := make([]float64, engDim)
			for i, l := range logits {
				w := math.Exp(l - mx)
				sum += w
				for d := range engDim {
					acc[d] += w * float64(vals[i][d])
				}
			}
			for d := range engDim {
				out = append(out, float32(acc[d]/sum))
			}
		}
	}
	return out
}

// copyPages performs copy-on-write copies on the engine's cache.
func (e *cpuEngine) copyPages(copies []CopyOp) {
	g := e.cache.Geometry
	for _, c := range copies {
		for ent := range int(c.Entries) {
			for _, off := range []func(page, entry, head, feat int) int64{g.KOffset, g.VOffset} {
				src, dst := off(int(c.Src), ent, 0, 0)*4, off(int(c.Dst), ent, 0, 0)*4
				copy(e.cache.Data[dst:dst+engHeads*engDim*4], e.cache.Data[src:])
			}
		}
	}
}
