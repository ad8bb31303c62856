package pagedkv

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/tier/host"
)

// tierChurn is churn (manager_alloc_test.go) with a write-through host tier
// and evict-ahead: every published page is offloaded, and finished
// requests are replaced by new ones on one of two prompts per slot in turn
// (the other one's pages were released a lifetime ago: served from the
// device cache or, once evicted, from host pages through onloads). The
// engine completes every planned copy before and after each step.
type tierChurn struct {
	m                 tierTarget
	reserve           func(ids []RequestID, nt []int32) error
	stats             func() Stats
	host              *host.Pool
	ids               []RequestID
	nt, sampled       []int32
	prompts           [][]int32
	next              RequestID
	copies            []TierCopy
	done              []uint64
	promptLen, maxLen int
	// rec, when set, records KV events (device and host pages); every
	// step flushes it and drains its queue.
	rec *events.Recorder
	q   *events.Queue
}

// tierTarget is what tierChurn drives: a Manager or a HybridManager.
type tierTarget interface {
	Add(RequestID, Request) (int, error)
	Release(RequestID) error
	Tokens(RequestID) []int32
	Computed(RequestID) int
	Commit([]int32) error
	TierCopies([]TierCopy) []TierCopy
	CompleteTierCopies(...uint64) error
	Audit() error
}

// newTierChurn drives a Manager, or with groups a HybridManager whose
// groups share the host tier (and, with events, one Recorder of the groups
// that announces each group's device and host pages).
func newTierChurn(t testing.TB, nreq, promptLen, maxLen int, withEvents bool, groups ...LayerGroup) *tierChurn {
	const ps = 16
	numPages := nreq*maxLen/ps + 64
	c := &tierChurn{
		ids: make([]RequestID, nreq), nt: make([]int32, nreq), sampled: make([]int32, nreq),
		prompts: make([][]int32, 2*nreq), promptLen: promptLen, maxLen: maxLen,
	}
	var err error
	hostPages := numPages
	if withEvents {
		hostPages = numPages / 2 // host pages are reclaimed too
	}
	cfg := Config{NumPages: numPages, PageSize: ps, HashSeed: 1,
		Tiers: TierConfig{HostPages: hostPages, WriteThrough: true, OffloadFreePages: numPages / 8}}
	if groups != nil {
		cfg.NumPages *= len(groups)
		cfg.Tiers.HostPages *= len(groups)
		cfg.Tiers.OffloadFreePages *= len(groups)
	}
	if withEvents {
		c.q, err = events.NewQueue(4)
		require.NoError(t, err)
		rc := events.RecorderConfig{NumPages: cfg.NumPages, PageSize: ps}
		if groups != nil {
			rc = hybridRecorderConfig(groups, cfg.NumPages, ps)
		}
		rc.HostPages = cfg.Tiers.HostPages
		c.rec, err = events.NewRecorder(rc, c.q)
		require.NoError(t, err)
		cfg.CacheEvents = c.rec
	}
	if groups == nil {
		m, err := New(cfg)
		require.NoError(t, err)
		c.m, c.stats, c.host = m, m.Stats, m.core.tiers.host
		c.reserve = func(ids []RequestID, nt []int32) error { _, err := m.Reserve(ids, nt); return err }
	} else {
		h, err := NewHybrid(HybridConfig{Config: cfg, Groups: groups})
		require.NoError(t, err)
		c.m, c.stats, c.host = h, func() Stats { return h.Stats().Stats }, h.core.tiers.host
		c.reserve = func(ids []RequestID, nt []int32) error { _, err := h.Reserve(ids, nt); return err }
	}
	for i := range c.prompts {
		c.prompts[i] = seqTokens(i*7919, promptLen)
	}
	for i := range nreq {
		c.admit(t, i)
	}
	c.completeCopies(t)
	return c
}

func (c *tierChurn) admit(t testing.TB, i int) {
	c.ids[i] = c.next
	c.next++
	p := c.prompts[i+len(c.ids)*int(c.next%2)]
	if _, err := c.m.Add(c.ids[i], Request{Prompt: p, CapacityTokens: c.maxLen + 1}); err != nil {
		t.Fatal(err)
	}
}

// completeCopies runs the engine's side: take the planned copies and
// report them all done.
func (c *tierChurn) completeCopies(t testing.TB) {
	c.copies = c.m.TierCopies(c.copies[:0])
	c.done = c.done[:0]
	for _, cp := range c.copies {
		c.done = append(c.done, cp.ID)
	}
	if err := c.m.CompleteTierCopies(c.done...); err != nil {
		t.Fatal(err)
	}
}

func (c *tierChurn) step(t testing.TB) {
	m := c.m
	for i, id := range c.ids {
		if len(m.Tokens(id)) >= c.maxLen-i%32 {
			if err := m.Release(id); err != nil {
				t.Fatal(err)
			}
			c.admit(t, i)
		}
	}
	c.completeCopies(t) // onloads of the admitted requests
	for i, id := range c.ids {
		c.nt[i] = int32(len(m.Tokens(id)) - m.Computed(id))
		c.sampled[i] = int32(id) % 32000
	}
	if err := c.reserve(c.ids, c.nt); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(c.sampled); err != nil {
		t.Fatal(err)
	}
	c.completeCopies(t) // write-through and evict-ahead offloads
	if c.rec != nil {
		if !c.rec.Flush() {
			t.Fatal("the event queue is full")
		}
		for b := c.q.TryNext(); b != nil; b = c.q.TryNext() {
			c.q.Done(b)
		}
	}
}

// TestTierStepAllocatesNothing pins the hot path with a host tier: after
// a warm-up, a step with releases, admissions (device and host hits),
// publishing with write-through offloads, evict-ahead offloads and the
// engine's copy completions allocates nothing.
func TestTierStepAllocatesNothing(t *testing.T) {
	promptLen, maxLen, runs := 40, 104, 40
	if raceEnabled { // invariant checks after every call: keep it short
		promptLen, maxLen, runs = 24, 64, 8
	}
	gptOSS := hybridConfigs()["gpt-oss-like"]
	gptOSS[0].WindowTokens = 64
	for _, tc := range []struct {
		nreq   int
		events bool
		groups []LayerGroup
	}{{64, false, nil}, {256, false, nil}, {64, true, nil}, {64, false, gptOSS}, {64, true, gptOSS}} {
		nreq := tc.nreq
		name := fmt.Sprint(nreq, "requests")
		if tc.events {
			name += "/events"
		}
		if tc.groups != nil {
			name += "/hybrid"
		}
		t.Run(name, func(t *testing.T) {
			c := newTierChurn(t, nreq, promptLen, maxLen, tc.events, tc.groups...)
			for range 3 * maxLen {
				c.step(t)
			}
			before := c.stats().Tiers
			var evBefore events.RecorderStats
			if c.rec != nil {
				evBefore = c.rec.Stats()
			}
			hostBefore := c.host.Counters()
			allocs := testing.AllocsPerRun(runs, func() { c.step(t) })
			require.Zero(t, allocs, "allocations per step")
			st := c.stats()
			require.Greater(t, st.Tiers.OffloadedPages, before.OffloadedPages, "the steps measured offload: %+v", st.Tiers)
			require.Greater(t, st.Tiers.OnloadedPages, before.OnloadedPages, "the steps measured onload: %+v", st.Tiers)
			require.NoError(t, c.m.Audit())
			if c.rec != nil {
				// The measured steps announced host pages stored and
				// reclaimed (medium CPU) besides the device's.
				ev, host := c.rec.Stats(), c.host.Counters()
				require.Greater(t, host.Reclaimed, hostBefore.Reclaimed, "no host page was reclaimed in the measured steps")
				require.Greater(t, ev.Pages, evBefore.Pages, "no event in the measured steps")
				for g := range c.rec.NumGroups() {
					require.Positive(t, c.rec.GroupStats(g).StoredPages, "group %d announced no device page", g)
				}
			}
			t.Logf("%d steps measured: %d pages offloaded, %d onloaded", runs+1,
				st.Tiers.OffloadedPages-before.OffloadedPages, st.Tiers.OnloadedPages-before.OnloadedPages)
		})
	}
}
