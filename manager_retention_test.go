package pagedkv

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clocked returns a Manager of 8 pages of 4 tokens, 3 priority levels, on
// a clock the test sets.
func clocked(t *testing.T, mod func(*Config)) (*Manager, *time.Duration) {
	now := new(time.Duration)
	cfg := Config{NumPages: 8, PageSize: 4, Priorities: 3, HashSeed: 1, CascadeMinSavedPages: -1,
		Clock: func() time.Duration { return *now }}
	if mod != nil {
		mod(&cfg)
	}
	return mustNew(t, cfg), now
}

// serve adds request id on prompt, computes it, and releases it: its full
// pages are published and idle.
func serve(t *testing.T, m *Manager, id RequestID, req Request) {
	t.Helper()
	_, err := m.Add(id, req)
	require.NoError(t, err)
	step(t, m, []RequestID{id}, []int32{int32(len(req.Prompt) - m.Computed(id))}, []int32{1})
	require.NoError(t, m.Release(id))
}

// hits returns the tokens a new request on prompt would be served, and
// leaves nothing behind.
func hits(t *testing.T, m *Manager, prompt []int32) int {
	t.Helper()
	n, err := m.Add(99, Request{Prompt: prompt})
	require.NoError(t, err)
	require.NoError(t, m.Release(99))
	return n
}

// A retention range keeps its pages over lower levels until its duration
// of idleness lapses; then they drop to level 0 and go first.
func TestRetentionOrdersEvictionAndLapses(t *testing.T) {
	m, now := clocked(t, nil)
	kept, other := seqTokens(100, 9), seqTokens(200, 9)
	serve(t, m, 1, Request{Prompt: kept, Retention: []RetentionRange{{Retention: Retention{Priority: 2, Duration: 10 * time.Second}}}})
	serve(t, m, 2, Request{Prompt: other, Priority: 1})
	require.Equal(t, 4, m.Stats().CachedPages)

	*now = 9 * time.Second
	require.Equal(t, 2, m.Evict(m.Stats().FreePages+2))
	require.Equal(t, 8, hits(t, m, kept), "level 2 outlives level 1")
	require.Zero(t, hits(t, m, other))

	// hits() used the kept pages at 9 s: they lapse at 19 s.
	serve(t, m, 3, Request{Prompt: other, Priority: 1})
	*now = 18 * time.Second
	require.Equal(t, 2, m.Evict(m.Stats().FreePages+2))
	require.Equal(t, 8, hits(t, m, kept))
	serve(t, m, 4, Request{Prompt: other, Priority: 1})
	*now = 18*time.Second + 10*time.Second // idle since 18 s: lapsed at 28 s
	require.Equal(t, 2, m.Evict(m.Stats().FreePages+2))
	require.Zero(t, hits(t, m, kept), "lapsed to level 0, below level 1")
	require.Equal(t, 8, hits(t, m, other))
	require.NoError(t, m.Audit())
}

// The clock is read only once a retention with a Duration (or a TTL pin)
// exists, and that first duration counts from the clock's time then, not
// from the last time read (none: 0).
func TestRetentionClockStartsWithTheFirstDuration(t *testing.T) {
	reads := 0
	m, now := clocked(t, func(cfg *Config) {
		clock := cfg.Clock
		cfg.Clock = func() time.Duration { reads++; return clock() }
	})
	kept, other := seqTokens(100, 9), seqTokens(200, 9)
	*now = 100 * time.Second
	serve(t, m, 1, Request{Prompt: other, Priority: 1})
	require.Equal(t, 8, hits(t, m, other))
	require.Zero(t, reads, "no duration, no TTL pin: no clock read")

	serve(t, m, 2, Request{Prompt: kept, Retention: []RetentionRange{{Retention: Retention{Priority: 2, Duration: 10 * time.Second}}}})
	require.Positive(t, reads)
	*now = 109 * time.Second // idle since 100 s: lapses at 110 s
	require.Equal(t, 2, m.Evict(m.Stats().FreePages+2))
	require.Equal(t, 8, hits(t, m, kept), "the duration counts from 100 s, not from 0")
	serve(t, m, 3, Request{Prompt: other, Priority: 1})
	*now = 119 * time.Second // used at 109 s: lapsed at 119 s
	require.Equal(t, 2, m.Evict(m.Stats().FreePages+2))
	require.Zero(t, hits(t, m, kept), "lapsed to level 0, below level 1")

	require.NoError(t, m.Audit())

	// A TTL pin starts the clock too.
	p, pnow := clocked(t, nil)
	*pnow = 100 * time.Second
	serve(t, p, 1, Request{Prompt: kept})
	_, _, err := p.PinFor(Namespace{}, kept, 5*time.Second)
	require.NoError(t, err)
	*pnow = 104 * time.Second
	require.Zero(t, hits(t, p, other)) // an operation (that does not refresh the pin)
	require.Equal(t, 2, p.Stats().PinnedPages, "the pin lapses at 105 s, not at 5 s")
	*pnow = 105 * time.Second
	require.Zero(t, hits(t, p, other))
	require.Zero(t, p.Stats().PinnedPages, "lapsed at 105 s")
	require.NoError(t, p.Audit())
}

// Ephemeral tokens' pages, and every page after them, are not published;
// clearing the range lets publishing go on.
func TestRetentionEphemeralIsNeverPublished(t *testing.T) {
	m, _ := clocked(t, nil)
	prompt := seqTokens(1, 13)
	_, err := m.Add(1, Request{Prompt: prompt, Retention: []RetentionRange{{Start: 5, End: 6, Retention: Retention{Ephemeral: true}}}})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{13}, []int32{7})
	require.Equal(t, 1, m.Stats().CachedPages, "page 1 holds an ephemeral token: it and page 2 stay private")
	require.NoError(t, m.SetRetention(1, nil))
	step(t, m, []RequestID{1}, []int32{1}, []int32{7})
	require.Equal(t, 3, m.Stats().CachedPages)
	require.NoError(t, m.Release(1))
	require.NoError(t, m.Audit())
}

// SetRetention re-levels a request's cached pages at once: a session that
// ended drops its pages below another's.
func TestSetRetentionRelevelsCachedPages(t *testing.T) {
	m, _ := clocked(t, nil)
	a, b := seqTokens(100, 9), seqTokens(200, 9)
	_, err := m.Add(1, Request{Prompt: a, Priority: 2})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{9}, []int32{1})
	serve(t, m, 2, Request{Prompt: b, Priority: 1})
	require.NoError(t, m.SetRetention(1, []RetentionRange{{Retention: Retention{Priority: 0, Session: SessionEnded}}}))
	require.NoError(t, m.Release(1))
	require.Equal(t, 2, m.Evict(m.Stats().FreePages+2))
	require.Zero(t, hits(t, m, a))
	require.Equal(t, 8, hits(t, m, b))
	require.NoError(t, m.Audit())
}

// A TTL pin lapses by itself at the first operation past its lifetime;
// an admission on its whole prefix refreshes it; the budget refuses a pin
// past it by its figures.
func TestPinForLapsesRefreshesAndKeepsTheBudget(t *testing.T) {
	m, now := clocked(t, func(c *Config) { c.PinBudget = 0.25 }) // 2 of 8 pages
	a, b := seqTokens(100, 9), seqTokens(200, 9)
	serve(t, m, 1, Request{Prompt: a})
	serve(t, m, 2, Request{Prompt: b})
	id, n, err := m.PinFor(Namespace{}, a, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, 8, n)
	_, _, err = m.Pin(Namespace{}, b[:4])
	require.ErrorIs(t, err, ErrPinLimit)
	require.ErrorContains(t, err, "pinning 1 more pages would make 3 pinned, over the pin budget of 2 pages (0.25 of 8)")

	*now = 9 * time.Second
	require.Equal(t, 8, hits(t, m, a)) // refreshes: lapses at 19 s
	*now = 18 * time.Second
	m.Evict(8)
	require.Equal(t, 2, m.Stats().PinnedPages)
	require.Equal(t, 8, hits(t, m, a))
	*now = 40 * time.Second
	m.Evict(8) // the pin lapses first, then its pages go
	require.Zero(t, m.Stats().PinnedPages)
	require.Zero(t, m.Stats().CachedPages)
	require.ErrorIs(t, m.Unpin(id), ErrUnknownPin)
	require.NoError(t, m.Audit())
}

// Bad retention is refused by name and changes nothing.
func TestRetentionRefusesBadArguments(t *testing.T) {
	m, _ := clocked(t, nil)
	for _, tc := range []struct {
		r    RetentionRange
		want string
	}{
		{RetentionRange{Start: -1}, "retention range 0 starts at token -1"},
		{RetentionRange{Start: 4, End: 4}, "retention range 0 is tokens [4, 4)"},
		{RetentionRange{Retention: Retention{Priority: 3}}, "retention range 0 has priority 3, want 0..2"},
		{RetentionRange{Retention: Retention{Duration: -time.Second}}, "retention range 0 lasts -1s"},
		{RetentionRange{Retention: Retention{Session: 3}}, "retention range 0 has session 3, want 0..2"},
	} {
		_, err := m.Add(1, Request{Prompt: seqTokens(1, 5), Retention: []RetentionRange{tc.r}})
		require.ErrorIs(t, err, ErrBadArgument)
		require.ErrorContains(t, err, tc.want)
		require.False(t, m.Has(1))
	}
	_, err := m.Add(1, Request{Prompt: seqTokens(1, 5), Retention: make([]RetentionRange, MaxRetentionRanges+1)})
	require.ErrorContains(t, err, "65 retention ranges, want at most 64")
	require.ErrorIs(t, m.SetRetention(1, nil), ErrUnknownRequest)
	_, err = m.Add(1, Request{Prompt: seqTokens(1, 5)})
	require.NoError(t, err)
	require.ErrorContains(t, m.SetRetention(1, []RetentionRange{{}, {Start: 9, End: 2}}), "retention range 1 is tokens [9, 2)")
	_, err = m.Reserve([]RequestID{1}, []int32{5})
	require.NoError(t, err)
	require.ErrorIs(t, m.SetRetention(1, nil), ErrStepPending)
	require.NoError(t, m.Commit([]int32{1}))
	_, _, err = m.PinFor(Namespace{}, seqTokens(1, 4), -time.Second)
	require.ErrorIs(t, err, ErrBadArgument)
	for _, b := range []float64{-0.1, 1.5, 0.01} {
		_, err := New(Config{NumPages: 8, PageSize: 4, PinBudget: b})
		require.ErrorIs(t, err, ErrBadConfig, "PinBudget %g", b)
	}
	require.NoError(t, m.Audit())
}

// A HybridManager's TTL pin lapses in every group at once, and retention
// re-levels the pages of every group: the audit (which compares the
// groups' pins) holds throughout.
func TestHybridPinForAndRetention(t *testing.T) {
	now := time.Duration(0)
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 32, PageSize: 4, HashSeed: 1, Priorities: 3,
		Clock: func() time.Duration { return now }},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 1}, {Kind: FullAttention, NumLayers: 1}}})
	require.NoError(t, err)
	prompt := seqTokens(10, 13)
	compute(t, h, 1, prompt)
	require.NoError(t, h.SetRetention(1, []RetentionRange{{Retention: Retention{Priority: 2, Duration: time.Second}}}))
	require.NoError(t, h.Release(1))
	_, _, err = h.PinFor(Namespace{}, prompt, 5*time.Second)
	require.NoError(t, err)
	for g := range 2 {
		require.Equal(t, 3, h.GroupStats(g).PinnedPages, "group %d", g)
	}
	full := h.core.groups[1].cache
	for p := range PageID(32) {
		if full.Cached(p) {
			require.Equal(t, Priority(2), full.Priority(p), "full group page %d retained", p)
		}
	}
	require.NoError(t, h.Audit())
	now = 5 * time.Second
	h.Evict(0) // an operation: the pin lapses in both groups
	for g := range 2 {
		gs := h.GroupStats(g)
		require.Zero(t, gs.PinnedPages, "group %d", g)
		require.Positive(t, gs.CachedPages, "group %d", g)
	}
	for g, m := range h.core.groups {
		for p := range PageID(32) {
			if m.cache.Cached(p) {
				require.Equal(t, Priority(0), m.cache.Priority(p), "group %d page %d lapsed", g, p)
			}
		}
	}
	require.NoError(t, h.Audit())
}

// slowPageRetention resolves page d's retention token by token: the last
// range in the list holding any of the page's tokens gives it, and an
// ephemeral range holding any of them makes the page ephemeral.
func slowPageRetention(ranges []RetentionRange, d, ps int) (ret Retention, ranged, eph bool) {
	for i, r := range ranges {
		for t := d * ps; t < (d+1)*ps; t++ {
			if t >= r.Start && (r.End == 0 || t < r.End) {
				ret, ranged = ranges[i].Retention, true
				eph = eph || r.Ephemeral
				break
			}
		}
	}
	return ret, ranged, eph
}

// Random retention ranges on random requests: every page the request
// holds is cached exactly when no page up to it holds an ephemeral token,
// at the level and with the duration the slow token-by-token resolution
// gives (the request's priority and no duration where no range covers
// it), and SetRetention re-levels the cached pages the same way.
func TestRetentionRangesMatchSlowResolution(t *testing.T) {
	runs := 300
	if raceEnabled {
		runs = 30
	}
	const ps = 4
	rng := rand.New(rand.NewPCG(3, 9))
	randomRanges := func() []RetentionRange {
		rs := make([]RetentionRange, rng.IntN(4))
		for i := range rs {
			r := &rs[i]
			r.Start = rng.IntN(40)
			if rng.IntN(3) > 0 {
				r.End = r.Start + 1 + rng.IntN(12)
			}
			r.Priority = Priority(rng.IntN(4))
			if rng.IntN(2) == 0 {
				r.Duration = time.Duration(1+rng.IntN(3)) * time.Second
			}
			r.Ephemeral = rng.IntN(6) == 0
			r.Session = Session(rng.IntN(3))
		}
		return rs
	}
	var ephemeralSeen, rangedSeen int
	// check compares request id's pages with ranges; before (nil at the
	// first check) are the ranges the pages had, which pages the new ones
	// do not cover keep.
	check := func(m *Manager, id RequestID, ranges, before []RetentionRange, prio Priority, published bool) {
		t.Helper()
		cache := m.core.groups[0].cache
		pages, _ := m.Pages(id)
		full := m.Computed(id) / ps
		cut := false
		for d := range full {
			ret, ranged, eph := slowPageRetention(ranges, d, ps)
			cut = cut || eph
			if published {
				require.Equal(t, !cut, cache.Cached(pages[d]), "page %d of ranges %+v", d, ranges)
			}
			if !cache.Cached(pages[d]) {
				ephemeralSeen++
				continue
			}
			want, lapse := prio, time.Duration(0)
			if old, oldRanged, _ := slowPageRetention(before, d, ps); oldRanged {
				want, lapse = old.Priority, old.Duration
			}
			if ranged {
				want, lapse = ret.Priority, ret.Duration
				rangedSeen++
			}
			require.Equal(t, want, cache.Priority(pages[d]), "level of page %d, ranges %+v", d, ranges)
			require.Equal(t, lapse, cache.Lapse(pages[d]), "lapse of page %d, ranges %+v", d, ranges)
		}
	}
	for run := range runs {
		m, _ := clocked(t, func(c *Config) { c.NumPages, c.Priorities = 64, 4 })
		prio := Priority(rng.IntN(4))
		ranges := randomRanges()
		id := RequestID(run)
		prompt := seqTokens(run*1000, 1+rng.IntN(40))
		_, err := m.Add(id, Request{Prompt: prompt, Priority: prio, Retention: ranges})
		require.NoError(t, err)
		for m.Computed(id) < len(prompt)+3 {
			left := len(m.Tokens(id)) - m.Computed(id)
			n, sampled := min(1+rng.IntN(9), left), NoToken
			if n == left {
				sampled = 7 // the step reaches the last known token
			}
			step(t, m, []RequestID{id}, []int32{int32(n)}, []int32{sampled})
		}
		check(m, id, ranges, nil, prio, true)
		// The engine changes its mind: the cached pages follow at once.
		next := randomRanges()
		require.NoError(t, m.SetRetention(id, next))
		check(m, id, next, ranges, prio, false)
		require.NoError(t, m.Audit())
	}
	require.Positive(t, ephemeralSeen, "pages kept out by ephemeral tokens")
	require.Positive(t, rangedSeen, "pages under a range")
}

// A fork inherits its parent's retention in a list of its own: changing
// the parent's leaves the child's as it was.
func TestForkKeepsItsOwnRetention(t *testing.T) {
	m, _ := clocked(t, nil)
	_, err := m.Add(1, Request{Prompt: seqTokens(100, 9), Retention: []RetentionRange{{Retention: Retention{Priority: 2}}}})
	require.NoError(t, err)
	require.NoError(t, m.Fork(1, 2))
	require.NoError(t, m.SetRetention(1, []RetentionRange{{Retention: Retention{Priority: 1}}}))
	child := m.core.groups[0].reqs[2]
	require.Equal(t, []RetentionRange{{Retention: Retention{Priority: 2}}}, child.retention)
	step(t, m, []RequestID{2}, []int32{9}, []int32{1})
	pages, _ := m.Pages(2)
	require.Equal(t, Priority(2), m.core.groups[0].cache.Priority(pages[0]), "the child publishes at its own level")
	require.NoError(t, m.Audit())
}
