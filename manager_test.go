package pagedkv

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// describe draws the Manager's requests and page occupancy as text, one
// request per line, so scenario tests read as pictures and fail with a
// line diff:
//
//	r1 running computed 9/10 start 0 pages [0 1 2]
//	pages: free 5 used 3 evictable 0 pinned-idle 0 cached 2
func describe(m *Manager) string {
	var b strings.Builder
	ids := make([]RequestID, 0, len(m.core.groups[0].reqs))
	for id := range m.core.groups[0].reqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		r := m.core.groups[0].reqs[id]
		state := "running"
		if !r.running {
			state = "preempted"
		}
		pages, start := m.Pages(id)
		fmt.Fprintf(&b, "r%d %s computed %d/%d start %d pages %v\n", id, state, r.computed, len(r.tokens), start, pages)
	}
	s := m.Stats()
	fmt.Fprintf(&b, "pages: free %d used %d evictable %d pinned-idle %d cached %d\n",
		s.FreePages, s.UsedPages, s.EvictablePages, s.PinnedIdlePages, s.CachedPages)
	return b.String()
}

func mustNew(t testing.TB, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	require.NoError(t, err)
	return m
}

// step reserves n tokens for each id, commits with the given samples (nil:
// none) and audits.
func step(t testing.TB, m *Manager, ids []RequestID, n []int32, sampled []int32) *Plan {
	t.Helper()
	p, err := m.Reserve(ids, n)
	require.NoError(t, err)
	require.NoError(t, m.Commit(sampled))
	require.NoError(t, m.Audit())
	return p
}

// TestScenarioReuseEvictPreempt walks through the life of a small pool
// (8 pages of 4 tokens): a prompt is computed and cached, a second request
// reuses it, the pool fills, a step evicts idle pages on demand, a step
// that cannot fit fails without changing anything, a preempted request
// resumes on its cached prefix.
func TestScenarioReuseEvictPreempt(t *testing.T) {
	m := mustNew(t, Config{NumPages: 8, PageSize: 4, HashSeed: 1})
	prompt := seqTokens(10, 10) // 2 full pages + 2 tokens

	matched, err := m.Add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, matched)
	step(t, m, []RequestID{1}, []int32{10}, []int32{99})
	require.Equal(t, ""+
		"r1 running computed 10/11 start 0 pages [0 1 2]\n"+
		"pages: free 5 used 3 evictable 0 pinned-idle 0 cached 2\n", describe(m))

	// The same prompt again: both full pages are reused.
	matched, err = m.Add(2, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 8, matched)
	require.NoError(t, m.Release(1))
	require.Equal(t, ""+
		"r2 running computed 8/10 start 0 pages [0 1]\n"+
		"pages: free 6 used 2 evictable 0 pinned-idle 0 cached 2\n", describe(m))

	// r3 fills the pool; its first step needs every free page.
	_, err = m.Add(3, Request{Prompt: seqTokens(50, 24)})
	require.NoError(t, err)
	step(t, m, []RequestID{3}, []int32{24}, nil)
	require.NoError(t, m.Release(2)) // r2's pages become idle cached pages
	require.Equal(t, ""+
		"r3 running computed 24/24 start 0 pages [2 3 4 5 6 7]\n"+
		"pages: free 0 used 6 evictable 2 pinned-idle 0 cached 8\n", describe(m))

	// r4 needs 2 pages: the step evicts r2's idle prefix on demand (page 1,
	// the deeper one, first).
	_, err = m.Add(4, Request{Prompt: seqTokens(90, 5)})
	require.NoError(t, err)
	step(t, m, []RequestID{4}, []int32{5}, nil)
	require.Equal(t, ""+
		"r3 running computed 24/24 start 0 pages [2 3 4 5 6 7]\n"+
		"r4 running computed 5/5 start 0 pages [0 1]\n"+
		"pages: free 0 used 8 evictable 0 pinned-idle 0 cached 7\n", describe(m))

	// Nothing is free or evictable: the step fails and changes nothing.
	before, beforeStats := describe(m), m.Stats()
	require.NoError(t, m.Extend(4, 1, 2, 3, 4))
	_, err = m.Reserve([]RequestID{4}, []int32{4})
	require.ErrorIs(t, err, ErrOutOfPages)
	require.Equal(t, strings.Replace(before, "5/5", "5/9", 1), describe(m))
	require.Equal(t, beforeStats, m.Stats())

	// Preempt r3: its 6 pages stay cached and become evictable, deepest
	// first. r4's step takes one of them (page 7, r3's tokens 20..23).
	// Resuming r3 matches at most (24-1)/4 = 5 pages (one token must be
	// left to compute), all still cached: 20 tokens come back, 4 are
	// recomputed.
	require.NoError(t, m.Preempt(3))
	step(t, m, []RequestID{4}, []int32{4}, nil)
	require.Equal(t, ""+
		"r3 preempted computed 0/24 start 0 pages []\n"+
		"r4 running computed 9/9 start 0 pages [0 1 7]\n"+
		"pages: free 0 used 3 evictable 5 pinned-idle 0 cached 7\n", describe(m))
	matched, err = m.Resume(3)
	require.NoError(t, err)
	require.Equal(t, 20, matched)
	s := m.Stats()
	require.Equal(t, int64(24), s.ResumedTokens)
	require.Equal(t, int64(20), s.ResumeHitTokens)
	require.Equal(t, int64(4), s.RecomputedTokens())
	require.Equal(t, int64(10+10+24+5), s.PromptTokens)
	require.Equal(t, int64(8), s.PromptHitTokens, "resumed tokens are not prompt hits")
	require.InDelta(t, 8.0/49, s.HitRate(), 1e-12)
	require.NoError(t, m.Audit())
}

// TestForcedCollisionThroughTheManager gives the Manager a hash under which
// every page collides; requests must still get exactly the pages whose
// tokens they have.
func TestForcedCollisionThroughTheManager(t *testing.T) {
	m := mustNew(t, Config{NumPages: 32, PageSize: 4, Hash: func(uint64, []int32) uint64 { return 42 }})
	a := seqTokens(0, 13)
	b := slices.Clone(a)
	b[5] = 77 // differs inside page 1
	_, err := m.Add(1, Request{Prompt: a})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{13}, nil)
	_, err = m.Add(2, Request{Prompt: b})
	require.NoError(t, err)
	step(t, m, []RequestID{2}, []int32{9}, nil) // pages 1 and 2 of b
	got, err := m.Add(3, Request{Prompt: b})
	require.NoError(t, err)
	require.Equal(t, 12, got)
	p1, _ := m.Pages(1)
	p2, _ := m.Pages(2)
	p3, _ := m.Pages(3)
	require.Equal(t, p1[0], p3[0], "page 0 is shared by all")
	require.Equal(t, p2[1:3], p3[1:3], "pages 1 and 2 are b's, not a's")
	require.NotEqual(t, p1[1], p3[1])
	other, err := m.Add(4, Request{Namespace: Namespace{Salt: "x"}, Prompt: a})
	require.NoError(t, err)
	require.Zero(t, other, "another namespace sees nothing")
	require.NoError(t, m.Audit())
}

func TestNoCacheRequestsNeitherReuseNorPublish(t *testing.T) {
	m := mustNew(t, Config{NumPages: 16, PageSize: 4, HashSeed: 1})
	prompt := seqTokens(0, 9)
	_, err := m.Add(1, Request{Prompt: prompt, NoCache: true})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{9}, nil)
	require.Zero(t, m.Stats().CachedPages)
	_, err = m.Add(2, Request{Prompt: prompt})
	require.NoError(t, err)
	step(t, m, []RequestID{2}, []int32{9}, nil)
	got, err := m.Add(3, Request{Prompt: prompt, NoCache: true})
	require.NoError(t, err)
	require.Zero(t, got)
}

func TestPinSurvivesPressure(t *testing.T) {
	m := mustNew(t, Config{NumPages: 6, PageSize: 4, HashSeed: 1, MaxPinnedPages: 2})
	sys := seqTokens(0, 9)
	_, err := m.Add(1, Request{Prompt: sys})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{9}, nil)
	_, pinned, err := m.Pin(Namespace{}, sys)
	require.NoError(t, err)
	require.Equal(t, 8, pinned)
	require.NoError(t, m.Release(1))
	s := m.Stats()
	require.Equal(t, [4]int{4, 0, 0, 2}, [4]int{s.FreePages, s.UsedPages, s.EvictablePages, s.PinnedIdlePages})

	// A request that wants the whole pool cannot have the pinned pages.
	_, err = m.Add(2, Request{Prompt: seqTokens(100, 24)})
	require.NoError(t, err)
	_, err = m.Reserve([]RequestID{2}, []int32{24})
	require.ErrorIs(t, err, ErrOutOfPages)
	step(t, m, []RequestID{2}, []int32{16}, nil)
	got, err := m.Add(3, Request{Prompt: sys})
	require.NoError(t, err)
	require.Equal(t, 8, got)
	require.NoError(t, m.Audit())
}

func TestRefusedCallsChangeNothing(t *testing.T) {
	m := mustNew(t, Config{NumPages: 16, PageSize: 4, HashSeed: 1})
	_, err := m.Add(1, Request{Prompt: seqTokens(0, 6)})
	require.NoError(t, err)
	_, err = m.Add(2, Request{Prompt: seqTokens(0, 6)})
	require.NoError(t, err)
	require.NoError(t, m.Preempt(2))
	before := describe(m)
	for name, call := range map[string]func() error{
		"add existing":       func() error { _, err := m.Add(1, Request{}); return err },
		"add bad priority":   func() error { _, err := m.Add(9, Request{Priority: 4}); return err },
		"add negative token": func() error { _, err := m.Add(9, Request{Prompt: []int32{1, -2}}); return err },
		"fork preempted":     func() error { return m.Fork(2, 9) },
		"fork to existing":   func() error { return m.Fork(1, 2) },
		"resume running":     func() error { _, err := m.Resume(1); return err },
		"preempt preempted":  func() error { return m.Preempt(2) },
		"release unknown":    func() error { return m.Release(9) },
		"commit no step":     func() error { return m.Commit(nil) },
		"abort no step":      func() error { return m.Abort() },
		"reserve preempted":  func() error { _, err := m.Reserve([]RequestID{1, 2}, []int32{1, 1}); return err },
		"reserve too many":   func() error { _, err := m.Reserve([]RequestID{1}, []int32{7}); return err },
		"reserve twice":      func() error { _, err := m.Reserve([]RequestID{1, 1}, []int32{1, 1}); return err },
		"reserve lengths":    func() error { _, err := m.Reserve([]RequestID{1}, nil); return err },
		"extend negative":    func() error { return m.Extend(1, -5) },
		"unpin unknown":      func() error { return m.Unpin(77) },
		"pin uncached":       func() error { _, _, err := m.Pin(Namespace{}, seqTokens(0, 8)); return err },
	} {
		require.Error(t, call(), name)
		require.Equal(t, before, describe(m), name)
	}

	// During a step only Commit, Abort and operations are allowed.
	_, err = m.Reserve([]RequestID{1}, []int32{6})
	require.NoError(t, err)
	_, err = m.Add(5, Request{})
	require.ErrorIs(t, err, ErrStepPending)
	require.ErrorIs(t, m.Release(1), ErrStepPending)
	require.ErrorIs(t, m.Fork(1, 5), ErrStepPending)
	_, err = m.Reserve([]RequestID{1}, []int32{0})
	require.ErrorIs(t, err, ErrStepPending)
	require.ErrorIs(t, m.Commit([]int32{1, 2}), ErrBadArgument)
	require.NoError(t, m.Audit())
	require.NoError(t, m.Abort())
	require.Equal(t, before, describe(m))
	// A token may be sampled only where the step reached the known end.
	_, err = m.Reserve([]RequestID{1}, []int32{3})
	require.NoError(t, err)
	require.ErrorIs(t, m.Commit([]int32{5}), ErrBadArgument)
	require.NoError(t, m.Commit([]int32{NoToken}))
}

// TestStepIsAllocationFreeInSteadyState pins the per-step hot path: once a
// server has warmed up (requests have come and gone, so every buffer and
// every page-table slot has grown to the working set), Reserve + Commit of
// a decode step allocate nothing, with and without a sliding window, and
// with cascade planning off for a shared system prompt (steps that emit a
// cascade layout are pinned by TestCascadeStepIsAllocationFreeInSteadyState).
func TestStepIsAllocationFreeInSteadyState(t *testing.T) {
	for _, cfg := range []Config{
		{NumPages: 4096, PageSize: 16, HashSeed: 1},
		{NumPages: 4096, PageSize: 16, HashSeed: 1, WindowTokens: 64},
		// Padded block tables (Plan.BlockTables), full and windowed.
		{NumPages: 4096, PageSize: 16, HashSeed: 1, BlockTablesStride: 64},
		{NumPages: 4096, PageSize: 16, HashSeed: 1, WindowTokens: 64, BlockTablesStride: 8},
		{NumPages: 4096, PageSize: 16, HashSeed: 1, CascadeMinSavedPages: -1},
		// Tiers: every filled page is written through to a host tier too
		// small to keep them all (claims reclaim), and the copies complete
		// each step.
		{NumPages: 4096, PageSize: 16, HashSeed: 1, Tiers: TierConfig{HostPages: 256, WriteThrough: true}},
	} {
		m := mustNew(t, cfg)
		const nreq = 32
		ids := make([]RequestID, nreq)
		ones := make([]int32, nreq)
		sampled := make([]int32, nreq)
		var copies []TierCopy
		var copyIDs []uint64
		decode := func() {
			if _, err := m.Reserve(ids, ones); err != nil {
				panic(err)
			}
			if err := m.Commit(sampled); err != nil {
				panic(err)
			}
			copies = m.TierCopies(copies[:0])
			copyIDs = copyIDs[:0]
			for _, c := range copies {
				copyIDs = append(copyIDs, c.ID)
			}
			if err := m.CompleteTierCopies(copyIDs...); err != nil {
				panic(err)
			}
		}
		// Two generations of requests: the first grows the buffers (300
		// tokens each), the second runs in them.
		for gen := range 2 {
			for i := range ids {
				if gen > 0 {
					require.NoError(t, m.Release(ids[i]))
				}
				ids[i], ones[i], sampled[i] = RequestID(gen*nreq+i), 1, 3
				prompt := seqTokens(i*1000+gen, 40)
				if cfg.CascadeMinSavedPages < 0 {
					prompt = concat(seqTokens(0, 32), seqTokens(i*1000+gen, 8)) // a shared system prompt
				}
				_, err := m.Add(ids[i], Request{Prompt: prompt, CapacityTokens: 4096})
				require.NoError(t, err)
				for m.Computed(ids[i]) < len(m.Tokens(ids[i])) {
					step(t, m, ids[i:i+1], []int32{int32(min(16, len(m.Tokens(ids[i]))-m.Computed(ids[i])))}, nil)
				}
				require.NoError(t, m.Extend(ids[i], 1))
			}
			if gen == 0 {
				for range 300 {
					decode()
				}
			}
		}
		runs := 200
		if raceEnabled { // .ci/run runs it without -race too, at the full count
			runs = 20
		}
		require.Zero(t, testing.AllocsPerRun(runs, decode), "config %+v", cfg)
		require.NoError(t, m.Audit())
	}
}

// TestStatsIsConsistentUnderConcurrentReads reads Stats from other
// goroutines while the owner runs steps; every snapshot must add up (run
// with -race).
func TestStatsIsConsistentUnderConcurrentReads(t *testing.T) {
	m := mustNew(t, Config{NumPages: 64, PageSize: 4, HashSeed: 1})
	done := make(chan struct{})
	var wg sync.WaitGroup
	var bad sync.Map
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				s := m.Stats()
				if s.FreePages+s.UsedPages+s.EvictablePages+s.PinnedIdlePages != s.TotalPages {
					bad.Store(fmt.Sprintf("%+v", s), true)
				}
			}
		}()
	}
	for i := range 300 {
		id := RequestID(i)
		_, err := m.Add(id, Request{Prompt: seqTokens(i%7*10, 9)})
		require.NoError(t, err)
		if _, err := m.Reserve([]RequestID{id}, []int32{int32(9 - m.Computed(id))}); err == nil {
			require.NoError(t, m.Commit(nil))
		}
		require.NoError(t, m.Release(id))
	}
	close(done)
	wg.Wait()
	bad.Range(func(k, _ any) bool { t.Errorf("inconsistent snapshot: %v", k); return true })
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no pages":        {PageSize: 4},
		"no page size":    {NumPages: 4},
		"negative window": {NumPages: 4, PageSize: 4, WindowTokens: -1},
		"priorities":      {NumPages: 4, PageSize: 4, Priorities: 17},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrBadConfig, name)
	}
}
