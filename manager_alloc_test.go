package pagedkv

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// churn is a decode server in steady state: nreq running requests decode
// one token per step, and a request that reaches its length is released and
// replaced by a new one on the same prompt (a cache hit up to the prompt's
// last full page), all in a pool small enough that filled pages are evicted.
// Lengths are staggered so requests finish and are admitted on most steps.
type churn struct {
	m                 *Manager
	ids               []RequestID
	nt, sampled       []int32
	prompts           [][]int32
	next              RequestID
	promptLen, maxLen int
	// With retention: every request carries retention ranges, and the
	// clock advances a second a step, so retention lapses as it runs.
	retention []RetentionRange
	now       time.Duration
}

func newChurn(t testing.TB, nreq, promptLen, maxLen int, retention ...RetentionRange) *churn {
	const ps = 16
	c := &churn{retention: retention}
	*c = churn{
		// Padded block tables too (Plan.BlockTables), one column to spare.
		m: mustNew(t, Config{NumPages: nreq*maxLen/ps + 64, PageSize: ps, HashSeed: 1, BlockTablesStride: (maxLen+ps-1)/ps + 1,
			Clock: func() time.Duration { return c.now }}),
		retention: retention,
		ids:       make([]RequestID, nreq), nt: make([]int32, nreq), sampled: make([]int32, nreq),
		prompts: make([][]int32, nreq), promptLen: promptLen, maxLen: maxLen,
	}
	for i := range nreq {
		c.prompts[i] = seqTokens(i*7919, promptLen)
		c.admit(t, i)
	}
	return c
}

func (c *churn) admit(t testing.TB, i int) {
	c.ids[i] = c.next
	c.next++
	if _, err := c.m.Add(c.ids[i], Request{Prompt: c.prompts[i], CapacityTokens: c.maxLen + 1, Retention: c.retention}); err != nil {
		t.Fatal(err)
	}
}

// step releases and replaces the requests that are done, then runs one
// step: the rest of each prompt, or one decode token.
func (c *churn) step(t testing.TB) {
	m := c.m
	c.now += time.Second
	for i, id := range c.ids {
		if len(m.Tokens(id)) >= c.maxLen-i%32 {
			if err := m.Release(id); err != nil {
				t.Fatal(err)
			}
			c.admit(t, i)
		}
		id = c.ids[i]
		c.nt[i] = int32(len(m.Tokens(id)) - m.Computed(id))
		c.sampled[i] = int32(id) % 32000 // new tokens each lifetime: new pages to publish, old ones to evict
	}
	if _, err := m.Reserve(c.ids, c.nt); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(c.sampled); err != nil {
		t.Fatal(err)
	}
}

// TestStepWithChurnAllocatesNothing pins the Manager's hot path with
// requests finishing and being admitted: after a warm-up of three request
// lifetimes (every buffer, slot and spare request at its working-set
// size), a step with releases, admissions, cache hits, publishing and
// eviction allocates nothing, at 64, 256 and 4096 requests (under -race,
// which checks invariants after every call, at 64 and 256: .ci/run runs
// the 4096 case without it).
func TestStepWithChurnAllocatesNothing(t *testing.T) {
	promptLen, maxLen, runs := 40, 104, 40
	if raceEnabled {
		promptLen, maxLen, runs = 24, 64, 8
	}
	// Retention: the first page kept at level 2 for 3 s of idleness, the
	// rest of the prompt at level 1 with the session continuing, and the
	// decoded tokens past the prompt's first 8 ephemeral (never published).
	hints := []RetentionRange{
		{Start: 0, End: 16, Retention: Retention{Priority: 2, Duration: 3 * time.Second}},
		{Start: 16, End: promptLen, Retention: Retention{Priority: 1, Duration: 5 * time.Second, Session: SessionContinues}},
		{Start: promptLen + 8, Retention: Retention{Ephemeral: true, Session: SessionEnded}},
	}
	for _, tc := range []struct {
		nreq  int
		hints []RetentionRange
	}{{64, nil}, {256, nil}, {4096, nil}, {256, hints}} {
		nreq := tc.nreq
		if raceEnabled && nreq > 256 {
			continue
		}
		name := fmt.Sprint(nreq, "requests")
		if tc.hints != nil {
			name += "/retention"
		}
		t.Run(name, func(t *testing.T) {
			c := newChurn(t, nreq, promptLen, maxLen, tc.hints...)
			for range 3 * maxLen {
				c.step(t)
			}
			evicted := c.m.Stats().EvictedPages
			allocs := testing.AllocsPerRun(runs, func() { c.step(t) })
			require.Zero(t, allocs, "allocations per step")
			st := c.m.Stats()
			require.Greater(t, st.EvictedPages, evicted, "the steps measured evict: %+v", st)
			if tc.hints != nil {
				// The retention took: pages sit at levels 1 and 2, some
				// with a lapse running, and some lapsed to level 0.
				cache := c.m.core.groups[0].cache
				var levels [4]int
				timed := 0
				for p := range PageID(c.m.NumPages()) {
					if cache.Cached(p) {
						levels[cache.Priority(p)]++
						if cache.Lapse(p) > 0 {
							timed++
						}
					}
				}
				require.Positive(t, levels[0], "lapsed pages: %v", levels)
				require.Positive(t, levels[1], "level 1 pages: %v", levels)
				require.Positive(t, levels[2], "level 2 pages: %v", levels)
				require.Positive(t, timed)
			}
			require.NoError(t, c.m.Audit())
		})
	}
}
