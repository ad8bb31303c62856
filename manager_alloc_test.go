package pagedkv

import (
	"fmt"
	"testing"

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
}

func newChurn(t testing.TB, nreq, promptLen, maxLen int) *churn {
	const ps = 16
	c := &churn{
		// Padded block tables too (Plan.BlockTables), one column to spare.
		m:   mustNew(t, Config{NumPages: nreq*maxLen/ps + 64, PageSize: ps, HashSeed: 1, BlockTablesStride: (maxLen+ps-1)/ps + 1}),
		ids: make([]RequestID, nreq), nt: make([]int32, nreq), sampled: make([]int32, nreq),
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
	if _, err := c.m.Add(c.ids[i], Request{Prompt: c.prompts[i], CapacityTokens: c.maxLen + 1}); err != nil {
		t.Fatal(err)
	}
}

// step releases and replaces the requests that are done, then runs one
// step: the rest of each prompt, or one decode token.
func (c *churn) step(t testing.TB) {
	m := c.m
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
	sizes := []int{64, 256, 4096}
	if raceEnabled {
		promptLen, maxLen, runs = 24, 64, 8
		sizes = sizes[:2]
	}
	for _, nreq := range sizes {
		t.Run(fmt.Sprint(nreq, "requests"), func(t *testing.T) {
			c := newChurn(t, nreq, promptLen, maxLen)
			for range 3 * maxLen {
				c.step(t)
			}
			evicted := c.m.Stats().EvictedPages
			allocs := testing.AllocsPerRun(runs, func() { c.step(t) })
			require.Zero(t, allocs, "allocations per step")
			st := c.m.Stats()
			require.Greater(t, st.EvictedPages, evicted, "the steps measured evict: %+v", st)
			require.NoError(t, c.m.Audit())
		})
	}
}
