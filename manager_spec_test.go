package pagedkv

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestScenarioSpecRollback draws one speculative step: a request with 6
// computed tokens on pages of 4 reserves its last sampled token and 4
// drafts (rows at positions 6..10, a new page for 8..10), the target model
// accepts 1 draft: the request keeps 6+1+1 = 8 tokens, the page that held
// only rejected drafts goes back to the pool, and the bonus token follows
// the accepted draft.
func TestScenarioSpecRollback(t *testing.T) {
	m := mustNew(t, Config{NumPages: 8, PageSize: 4, HashSeed: 1})
	_, err := m.Add(1, Request{Prompt: seqTokens(10, 6), NoCache: true})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{6}, []int32{50})
	require.Equal(t, ""+
		"r1 running computed 6/7 start 0 pages [0 1]\n"+
		"pages: free 6 used 2 evictable 0 pinned-idle 0 cached 0\n", describe(m))

	p, err := m.ReserveSpec([]RequestID{1}, []int32{1}, [][]int32{{51, 52, 53, 54}})
	require.NoError(t, err)
	require.Equal(t, []int32{0, 5}, p.QOIndptr)
	require.Equal(t, []int32{50, 51, 52, 53, 54}, p.TokenIDs)
	require.Equal(t, []int32{6, 7, 8, 9, 10}, p.TokenPositions)
	require.Equal(t, []int32{4}, p.Drafts)
	require.Equal(t, []int32{0, 1, 2}, p.KVPageIndices)
	require.Equal(t, []int32{3}, p.KVLastPageLen)
	require.NoError(t, m.Audit())

	require.NoError(t, m.CommitSpec([]int32{1}, []int32{60}))
	require.NoError(t, m.Audit())
	require.Equal(t, ""+
		"r1 running computed 8/9 start 0 pages [0 1]\n"+
		"pages: free 6 used 2 evictable 0 pinned-idle 0 cached 0\n", describe(m))
	require.Equal(t, append(seqTokens(10, 6), 50, 51, 60), m.Tokens(1))
	s := m.Stats()
	require.Equal(t, int64(4), s.DraftTokens)
	require.Equal(t, int64(1), s.AcceptedDraftTokens)
	require.Equal(t, int64(6+2), s.ComputedTokens)

	// The next step's arrays hold no rejected token: 8 tokens on 2 pages.
	p, err = m.Reserve([]RequestID{1}, []int32{1})
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1, 2}, p.KVPageIndices)
	require.Equal(t, []int32{1}, p.KVLastPageLen)
	require.Equal(t, []int32{8}, p.TokenPositions)
	require.NoError(t, m.Abort())

	// Commit refuses a speculative step; CommitSpec checks the counts.
	_, err = m.ReserveSpec([]RequestID{1}, []int32{1}, [][]int32{{7}})
	require.NoError(t, err)
	require.ErrorIs(t, m.Commit(nil), ErrBadArgument)
	require.ErrorIs(t, m.CommitSpec([]int32{2}, nil), ErrBadArgument)
	require.ErrorIs(t, m.CommitSpec(nil, nil), ErrBadArgument)
	require.NoError(t, m.Abort())
	require.Equal(t, append(seqTokens(10, 6), 50, 51, 60), m.Tokens(1), "Abort drops the drafts")

	// Drafts only after every known token.
	require.NoError(t, m.Extend(1, 70, 71))
	_, err = m.ReserveSpec([]RequestID{1}, []int32{1}, [][]int32{{7}})
	require.ErrorIs(t, err, ErrBadArgument)
	_, err = m.ReserveSpec([]RequestID{1}, []int32{3}, [][]int32{{-7}})
	require.ErrorIs(t, err, ErrBadArgument)
	require.NoError(t, m.Audit())
}

// TestScenarioSpecForkUndoesCopy: two forks share a partial page; one
// re-verifies from drafts alone (ntokens 0) and has them all rejected, so
// the copy it took for them is undone and it shares the page again, while
// the other keeps its copy with its accepted token.
func TestScenarioSpecForkUndoesCopy(t *testing.T) {
	m := mustNew(t, Config{NumPages: 8, PageSize: 4, HashSeed: 1})
	_, err := m.Add(1, Request{Prompt: seqTokens(10, 6), NoCache: true})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{6}, nil)
	require.NoError(t, m.Fork(1, 2))
	require.NoError(t, m.Extend(2, 33))
	p, err := m.ReserveSpec([]RequestID{1, 2}, []int32{0, 1}, [][]int32{{40, 41}, {42}})
	require.NoError(t, err)
	require.Len(t, p.Copies, 1, "request 1 copies, request 2 then writes in place")
	require.Equal(t, ""+
		"r1 running computed 6/8 start 0 pages [0 2]\n"+
		"r2 running computed 6/8 start 0 pages [0 1]\n"+
		"pages: free 5 used 3 evictable 0 pinned-idle 0 cached 0\n", describe(m))
	require.NoError(t, m.CommitSpec([]int32{0, 1}, nil))
	require.NoError(t, m.Audit())
	// Without the drafts request 2 would have copied and request 1 kept
	// page 1: the same sharing, up to the page names.
	require.Equal(t, ""+
		"r1 running computed 6/6 start 0 pages [0 2]\n"+
		"r2 running computed 8/8 start 0 pages [0 1]\n"+
		"pages: free 5 used 3 evictable 0 pinned-idle 0 cached 0\n", describe(m))
	require.Equal(t, int64(1), m.Stats().CopiedPages)

	// A third branch that shares request 1's page, both rejecting all:
	// back to one shared page.
	require.NoError(t, m.Fork(1, 3))
	_, err = m.ReserveSpec([]RequestID{1, 3}, []int32{0, 0}, [][]int32{{1}, {2}})
	require.NoError(t, err)
	require.NoError(t, m.CommitSpec([]int32{0, 0}, nil))
	require.NoError(t, m.Audit())
	require.Equal(t, ""+
		"r1 running computed 6/6 start 0 pages [0 2]\n"+
		"r2 running computed 8/8 start 0 pages [0 1]\n"+
		"r3 running computed 6/6 start 0 pages [0 2]\n"+
		"pages: free 5 used 3 evictable 0 pinned-idle 0 cached 0\n", describe(m))
	require.Equal(t, int64(1), m.Stats().CopiedPages)
}

// TestScenarioTruncate cuts a cached request back into its second page:
// the pages past the cut stay cached (idle), the cut page is shared with
// the cache, so the next append copies it.
func TestScenarioTruncate(t *testing.T) {
	m := mustNew(t, Config{NumPages: 8, PageSize: 4, HashSeed: 1})
	_, err := m.Add(1, Request{Prompt: seqTokens(10, 12)})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{12}, []int32{5})
	require.NoError(t, m.Truncate(1, 6))
	require.NoError(t, m.Audit())
	require.Equal(t, ""+
		"r1 running computed 6/6 start 0 pages [0 1]\n"+
		"pages: free 5 used 2 evictable 1 pinned-idle 0 cached 3\n", describe(m))
	require.NoError(t, m.Extend(1, 77))
	p, err := m.Reserve([]RequestID{1}, []int32{1})
	require.NoError(t, err)
	require.Equal(t, []CopyOp{{Src: 1, Dst: 3, Entries: 2}}, p.Copies)
	require.NoError(t, m.Commit(nil))
	require.NoError(t, m.Audit())
	require.Equal(t, ""+
		"r1 running computed 7/7 start 0 pages [0 3]\n"+
		"pages: free 4 used 2 evictable 2 pinned-idle 0 cached 3\n", describe(m))

	require.ErrorIs(t, m.Truncate(1, 8), ErrBadArgument)
	require.ErrorIs(t, m.Truncate(9, 0), ErrUnknownRequest)
	w := mustNew(t, Config{NumPages: 8, PageSize: 4, WindowTokens: 4, HashSeed: 1})
	_, err = w.Add(1, Request{Prompt: seqTokens(10, 12)})
	require.NoError(t, err)
	step(t, w, []RequestID{1}, []int32{12}, nil)
	require.ErrorIs(t, w.Truncate(1, 3), ErrBadArgument, "tokens 0..7 left the window")
	// A query at 11 would read 8..11 and also needs token 7, released.
	require.ErrorIs(t, w.Truncate(1, 11), ErrBadArgument)
	require.NoError(t, w.Truncate(1, 12))
	require.NoError(t, w.Audit())
}

// TestSpecEqualsAcceptedOnly runs random speculative workloads (forks,
// truncations, preemption, eviction, windows) on one Manager and, in
// lockstep, on a twin that reserves only each step's known tokens and
// accepted drafts. After every operation the two must agree: tokens,
// computed counts, page tables up to a renaming of pages, which pages are
// cached, the prefix each request's tokens match in the cache, and Stats
// but for the draft counters; both must pass Audit and read back their
// fake K/V. The twin evicts first exactly what the speculative Reserve
// evicted for its drafts' pages, the one trace drafts may leave.
func TestSpecEqualsAcceptedOnly(t *testing.T) {
	t.Parallel()
	runs, ops := 80, 300
	if testing.Short() || raceEnabled {
		runs = 10
	}
	for _, window := range []int{0, 7} {
		t.Run(fmt.Sprintf("window-%d", window), func(t *testing.T) {
			t.Parallel()
			var drafts, accepted, copies int64
			for run := range runs {
				tw := newSpecTwins(t, window, uint64(run))
				for op := range ops {
					tw.op()
					tw.check(op)
				}
				s := tw.spec.Stats()
				drafts, accepted, copies = drafts+s.DraftTokens, accepted+s.AcceptedDraftTokens, copies+s.CopiedPages
			}
			require.Positive(t, accepted)
			require.Less(t, accepted, drafts)
			require.Positive(t, copies)
			t.Logf("%d runs of %d ops: %d drafts, %d accepted, %d copies", runs, ops, drafts, accepted, copies)
		})
	}
}

type specTwins struct {
	t          *testing.T
	rng        *rand.Rand
	spec, twin *Manager
	kvS, kvT   []uint64
	ids        []RequestID
	next       RequestID
}

const twinPages, twinPageSize = 20, 4

func newSpecTwins(t *testing.T, window int, seed uint64) *specTwins {
	cfg := Config{NumPages: twinPages, PageSize: twinPageSize, WindowTokens: window, HashSeed: 3}
	return &specTwins{t: t, rng: rand.New(rand.NewPCG(seed, 77)), spec: mustNew(t, cfg), twin: mustNew(t, cfg),
		kvS: make([]uint64, twinPages*twinPageSize), kvT: make([]uint64, twinPages*twinPageSize)}
}

func (tw *specTwins) both(op string, f func(m *Manager) error) {
	tw.t.Helper()
	e1, e2 := f(tw.spec), f(tw.twin)
	require.Equal(tw.t, e1 == nil, e2 == nil, "%s: %v vs %v", op, e1, e2)
}

func (tw *specTwins) pick(running bool) (RequestID, bool) {
	var c []RequestID
	for _, id := range tw.ids {
		if !running || tw.spec.Running(id) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return 0, false
	}
	return c[tw.rng.IntN(len(c))], true
}

func (tw *specTwins) op() {
	r := tw.rng
	switch k := r.IntN(20); {
	case k < 3:
		id := tw.next
		tw.next++
		prompt := promptOf(r.IntN(4), 1+r.IntN(14))
		tw.both("add", func(m *Manager) error { _, err := m.Add(id, Request{Prompt: prompt}); return err })
		tw.ids = append(tw.ids, id)
	case k < 4:
		if p, ok := tw.pick(true); ok {
			id := tw.next
			tw.next++
			tw.both("fork", func(m *Manager) error { return m.Fork(p, id) })
			tw.ids = append(tw.ids, id)
		}
	case k < 5:
		if id, ok := tw.pick(false); ok {
			tw.both("release", func(m *Manager) error { return m.Release(id) })
			tw.ids = slices.DeleteFunc(tw.ids, func(x RequestID) bool { return x == id })
		}
	case k < 6:
		if id, ok := tw.pick(true); ok {
			tw.both("preempt", func(m *Manager) error { return m.Preempt(id) })
		}
	case k < 7:
		if id, ok := tw.pick(false); ok && !tw.spec.Running(id) {
			tw.both("resume", func(m *Manager) error { _, err := m.Resume(id); return err })
		}
	case k < 8:
		if id, ok := tw.pick(false); ok {
			n := max(0, len(tw.spec.Tokens(id))-r.IntN(7))
			tw.both("truncate", func(m *Manager) error { return m.Truncate(id, n) })
		}
	default:
		tw.step()
	}
}

// step runs a speculative step on spec and its accepted-only twin.
func (tw *specTwins) step() {
	r := tw.rng
	var ids []RequestID
	var nt []int32
	var drafts [][]int32
	for _, id := range tw.ids {
		if !tw.spec.Running(id) || r.IntN(2) == 0 || len(ids) == 4 {
			continue
		}
		left := len(tw.spec.Tokens(id)) - tw.spec.Computed(id)
		n := min(left, r.IntN(4))
		var d []int32
		if n == left {
			for range r.IntN(5) {
				d = append(d, int32(r.IntN(90)))
			}
		}
		if n+len(d) == 0 {
			continue
		}
		ids, nt, drafts = append(ids, id), append(nt, int32(n)), append(drafts, d)
	}
	if len(ids) == 0 {
		return
	}
	freedBefore := tw.spec.Stats().EvictionFreedPages
	plan, err := tw.spec.ReserveSpec(ids, nt, drafts)
	if err != nil {
		require.ErrorIs(tw.t, err, ErrOutOfPages)
		victim := ids[r.IntN(len(ids))]
		tw.both("preempt", func(m *Manager) error { return m.Preempt(victim) })
		return
	}
	runFakeEngine(plan, tw.kvS)
	accepted, sampled := make([]int32, len(ids)), make([]int32, len(ids))
	twinN := make([]int32, len(ids))
	for b, id := range ids {
		accepted[b] = int32(r.IntN(len(drafts[b]) + 1))
		sampled[b] = NoToken
		if len(drafts[b]) > 0 || tw.spec.Computed(id)+int(nt[b]) == len(tw.spec.Tokens(id)) {
			sampled[b] = int32(r.IntN(90))
		}
		twinN[b] = nt[b] + accepted[b]
	}
	require.NoError(tw.t, tw.spec.CommitSpec(accepted, sampled))

	if freed := tw.spec.Stats().EvictionFreedPages - freedBefore; freed > 0 {
		// Evict(n) evicts until n pages are free: the spec Manager's free
		// count before the step (the twins agree) plus what it freed.
		require.Equal(tw.t, int(freed), tw.twin.Evict(tw.twin.Stats().FreePages+int(freed)))
	}
	for b, id := range ids {
		require.NoError(tw.t, tw.twin.Extend(id, drafts[b][:accepted[b]]...))
	}
	tplan, err := tw.twin.Reserve(ids, twinN)
	require.NoError(tw.t, err)
	runFakeEngine(tplan, tw.kvT)
	require.NoError(tw.t, tw.twin.Commit(sampled))
}

// runFakeEngine performs a plan's copies and appends on a fake K/V store.
func runFakeEngine(p *Plan, kv []uint64) {
	const ps = twinPageSize
	for _, c := range p.Copies {
		copy(kv[int(c.Dst)*ps:int(c.Dst)*ps+int(c.Entries)], kv[int(c.Src)*ps:])
	}
	for r := range p.Positions {
		b, pos := p.BatchIndices[r], p.Positions[r]
		page := p.KVPageIndices[p.KVIndptr[b]+pos/ps]
		kv[int(page)*ps+int(pos)%ps] = fakeKV(p.TokenIDs[r], int(p.TokenPositions[r]))
	}
}

func (tw *specTwins) check(op int) {
	t := tw.t
	require.NoError(t, tw.spec.Audit(), "op %d", op)
	require.NoError(t, tw.twin.Audit(), "op %d", op)
	s1, s2 := tw.spec.Stats(), tw.twin.Stats()
	s1.DraftTokens, s1.AcceptedDraftTokens = 0, 0
	if s1 != s2 {
		require.Equal(t, s2, s1, "stats after op %d", op)
	}
	rename := map[PageID]PageID{}
	back := map[PageID]PageID{}
	for _, id := range tw.ids {
		tokens := tw.spec.Tokens(id)
		p1, st1 := tw.spec.Pages(id)
		p2, st2 := tw.twin.Pages(id)
		if !slices.Equal(tw.twin.Tokens(id), tokens) || tw.twin.Computed(id) != tw.spec.Computed(id) ||
			tw.twin.Running(id) != tw.spec.Running(id) || st1 != st2 || len(p1) != len(p2) {
			require.Failf(t, "request differs", "op %d: request %d: spec %v computed %d start %d pages %v; twin %v computed %d start %d pages %v",
				op, id, tokens, tw.spec.Computed(id), st1, p1, tw.twin.Tokens(id), tw.twin.Computed(id), st2, p2)
		}
		for k := range p1 {
			if q, ok := rename[p1[k]]; ok && q != p2[k] || func() bool { q, ok := back[p2[k]]; return ok && q != p1[k] }() {
				require.Failf(t, "sharing differs", "op %d: request %d page %d: %d vs %d", op, id, k, p1[k], p2[k])
			}
			rename[p1[k]], back[p2[k]] = p2[k], p1[k]
			if tw.twin.core.groups[0].cache.Cached(p2[k]) != tw.spec.core.groups[0].cache.Cached(p1[k]) {
				require.Failf(t, "cached differs", "op %d: request %d page %d", op, id, k)
			}
		}
		for tk := st1; tk < tw.spec.Computed(id); tk++ {
			i, e := (tk-st1)/twinPageSize, (tk-st1)%twinPageSize
			want := fakeKV(tokens[tk], tk)
			if tw.kvS[int(p1[i])*twinPageSize+e] != want || tw.kvT[int(p2[i])*twinPageSize+e] != want {
				require.Failf(t, "wrong K/V", "op %d: request %d token %d: spec %#x twin %#x want %#x", op, id, tk,
					tw.kvS[int(p1[i])*twinPageSize+e], tw.kvT[int(p2[i])*twinPageSize+e], want)
			}
		}
		// The cache serves the same prefix of the request's tokens.
		if len(tokens) > 0 {
			m1, _ := tw.spec.core.groups[0].cache.Match(nil, tw.spec.core.groups[0].cache.Key(Namespace{}), tokens, len(tokens)/twinPageSize)
			m2, _ := tw.twin.core.groups[0].cache.Match(nil, tw.twin.core.groups[0].cache.Key(Namespace{}), tokens, len(tokens)/twinPageSize)
			if len(m1) != len(m2) {
				require.Failf(t, "cached prefix differs", "op %d: request %d: %d vs %d pages", op, id, len(m1), len(m2))
			}
		}
	}
}

// TestSpecStepDoesNotAllocate pins the speculative step (ReserveSpec with
// 4 drafts per request, CommitSpec rolling back the rejected ones) to zero
// allocations once buffers have grown.
func TestSpecStepDoesNotAllocate(t *testing.T) {
	s := newSpecBench(t, 16, 4)
	for range 40 {
		s.run(t)
	}
	require.Zero(t, testing.AllocsPerRun(40, func() { s.run(t) }))
	require.NoError(t, s.m.Audit())
}

// A plan stays unchanged until the next successful reserve, and a failed
// reserve after its commit must not write into it: Drafts once shared the
// step's scratch counts, which prepare refills before it can fail, so a
// refused ReserveSpec rewrote the last plan's Drafts (found by the Python
// package's test_plan_currency_matches_a_model).
func TestFailedReserveLeavesTheLastPlansDrafts(t *testing.T) {
	m, err := New(Config{NumPages: 8, PageSize: 4})
	require.NoError(t, err)
	for id, prompt := range map[RequestID][]int32{1: {1, 2, 3}, 2: {4, 5, 6}} {
		_, err := m.Add(id, Request{Prompt: prompt})
		require.NoError(t, err)
	}
	plan, err := m.ReserveSpec([]RequestID{1, 2}, []int32{3, 3}, nil)
	require.NoError(t, err)
	require.NoError(t, m.Commit([]int32{7, 8}))
	want := slices.Clone(plan.Drafts)
	require.Equal(t, []int32{0, 0}, want)
	for _, tc := range []struct {
		name   string
		ids    []RequestID
		drafts [][]int32
	}{
		{"unknown second id", []RequestID{1, 9}, [][]int32{{5, 5}, nil}},
		{"bad second drafts", []RequestID{1, 2}, [][]int32{{5}, {-1}}},
		{"out of pages", []RequestID{1, 2}, [][]int32{make([]int32, 20), make([]int32, 20)}},
	} {
		_, err := m.ReserveSpec(tc.ids, []int32{1, 1}, tc.drafts)
		require.Error(t, err, tc.name)
		require.Equal(t, want, plan.Drafts, "%s (%v) rewrote the last plan's Drafts", tc.name, err)
	}
}
