package prefixcache

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/evict"
)

func TestUnknownEvictionPolicyIsRejectedByName(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 4})
	require.NoError(t, err)
	_, err = New(Config{NumPages: 4, PageSize: 2, Refs: a, Eviction: "lfu-ish"})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorIs(t, err, evict.ErrUnknownPolicy)
	require.ErrorContains(t, err, `"lfu-ish"`)
	require.ErrorContains(t, err, "lru, slru, srrip")
	c, err := New(Config{NumPages: 4, PageSize: 2, Refs: a})
	require.NoError(t, err)
	require.Equal(t, evict.LRU, c.Eviction(), "the default")
}

func TestNodeIsOneCacheLine(t *testing.T) {
	require.Equal(t, uintptr(64), unsafe.Sizeof(node{}))
}

// TestPoliciesOrderVictims draws each policy's choice on one picture: a
// chain a0<-a1 that served a hit and a fresh chain b0<-b1, idle in the
// order a1 a0 b1 b0.
func TestPoliciesOrderVictims(t *testing.T) {
	for policy, want := range map[string][]PageID{
		evict.LRU:      {1, 0, 3, 2}, // idle order
		evict.SLRU:     {3, 2, 1, 0}, // probation (no hits) first
		evict.SRRIP:    {3, 2, 1, 0}, // RRPV 2 before RRPV 0
		evict.ARC:      {1, 0, 3, 2}, // main: probation (2 pages) is within its target (half of 4)
		evict.Adaptive: {1, 0, 3, 2}, // nothing learned yet (every multiplier 1): idle order
	} {
		t.Run(policy, func(t *testing.T) {
			a, err := allocator.New(allocator.Config{NumPages: 4})
			require.NoError(t, err)
			c, err := New(Config{NumPages: 4, PageSize: 1, Refs: a, Seed: 1, Eviction: policy})
			require.NoError(t, err)
			pages := make([]PageID, 4)
			require.NoError(t, a.Alloc(pages))
			publish := func(p0, p1 PageID, tok int32) {
				h, _, err := c.Publish(Handle{}, Key{}, p0, []int32{tok}, 0)
				require.NoError(t, err)
				_, _, err = c.Publish(h, Key{}, p1, []int32{tok + 1}, 0)
				require.NoError(t, err)
			}
			publish(0, 1, 10)
			publish(2, 3, 20)
			c.Hit(0, 1)
			for _, p := range []PageID{1, 0, 3, 2} {
				_, err := a.Release(p)
				require.NoError(t, err)
				c.Recheck(p)
			}
			var got []PageID
			for c.Len() > 0 {
				v := c.victim()
				got = append(got, PageID(v))
				require.Equal(t, 1, c.Evict(1))
			}
			require.Equal(t, want, got)
			require.NoError(t, c.CheckInvariants())
		})
	}
}

// The adaptive policy on the same picture with hints: the chain that
// served a hit is hinted dead, the fresh one live, so the dead one goes
// first; a hint is cleared by a hit; a bad hint is refused by value.
func TestAdaptiveHintsOrderVictims(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 4})
	require.NoError(t, err)
	c, err := New(Config{NumPages: 4, PageSize: 1, Refs: a, Seed: 1, Eviction: evict.Adaptive})
	require.NoError(t, err)
	pages := make([]PageID, 4)
	require.NoError(t, a.Alloc(pages))
	for _, p := range [][2]PageID{{0, 1}, {2, 3}} {
		h, _, err := c.Publish(Handle{}, Key{}, p[0], []int32{int32(10 * (p[0] + 1))}, 0)
		require.NoError(t, err)
		_, _, err = c.Publish(h, Key{}, p[1], []int32{int32(10*(p[0]+1) + 1)}, 0)
		require.NoError(t, err)
	}
	require.NoError(t, c.Hint(evict.HintReuse, 0, 1))
	c.Hit(0, 1)
	require.Equal(t, evict.HintNone, c.nodes[0].hint, "a hit clears the hint")
	require.NoError(t, c.Hint(evict.HintNoReuse, 0, 1))
	require.NoError(t, c.Hint(evict.HintReuse, 2, 3))
	require.ErrorIs(t, c.Hint(evict.NumHints, 2), ErrBadArgument)
	require.ErrorContains(t, c.Hint(7, 2), "hint 7")
	for _, p := range []PageID{1, 0, 3, 2} {
		_, err := a.Release(p)
		require.NoError(t, err)
		c.Recheck(p)
	}
	require.NoError(t, c.Hint(evict.HintNoReuse, 3), "an idle page moves to its new queue")
	var got []PageID
	for c.Len() > 0 {
		got = append(got, PageID(c.victim()))
		require.Equal(t, 1, c.Evict(1))
		require.NoError(t, c.CheckInvariants())
	}
	require.Equal(t, []PageID{1, 0, 3, 2}, got)
}

// Publishing, hits, release and eviction allocate nothing under any policy
// (the per-step hot path), with the live miss-ratio curve too.
func TestPoliciesDoNotAllocate(t *testing.T) {
	for i, policy := range append(evict.Names(), evict.LRU) {
		rate := 0.0
		if i == len(evict.Names()) {
			rate = 1 // every reference sampled
		}
		a, err := allocator.New(allocator.Config{NumPages: 8})
		require.NoError(t, err)
		c, err := New(Config{NumPages: 8, PageSize: 1, Refs: a, Seed: 1, Eviction: policy, ShadowRate: rate})
		require.NoError(t, err)
		pages := make([]PageID, 4)
		tok := []int32{0}
		allocs := testing.AllocsPerRun(100, func() {
			if err := a.Alloc(pages); err != nil {
				t.Fatal(err)
			}
			h := Handle{}
			for i, p := range pages {
				tok[0] = int32(i)
				h, _, _ = c.Publish(h, Key{}, p, tok, 0)
			}
			c.Hit(pages[:2]...)
			for i := len(pages) - 1; i >= 0; i-- {
				if _, err := a.Release(pages[i]); err != nil {
					t.Fatal(err)
				}
				c.Recheck(pages[i])
			}
			c.Evict(len(pages))
		})
		require.Zero(t, allocs, policy)
	}
}

// Under ARC a page published while its level's ghost history remembers it
// joins main, a new page probation (evict's TestARCLearnsFromGhosts pins
// how the target moves).
func TestARCReturnedPagesJoinMain(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 8})
	require.NoError(t, err)
	c, err := New(Config{NumPages: 8, PageSize: 1, Refs: a, Seed: 1, Eviction: evict.ARC, Priorities: 1})
	require.NoError(t, err)
	page := make([]PageID, 1)
	// publish caches token tok as a root page, idle, and returns its page.
	publish := func(tok int32, hit bool) PageID {
		require.NoError(t, a.Alloc(page))
		_, added, err := c.Publish(Handle{}, Key{}, page[0], []int32{tok}, 0)
		require.NoError(t, err)
		require.True(t, added)
		if hit {
			c.Hit(page[0])
		}
		_, err = a.Release(page[0])
		require.NoError(t, err)
		c.Recheck(page[0])
		return page[0]
	}
	queueOf := func(p PageID) int {
		_, k, ok := c.queues.Position(int32(p))
		require.True(t, ok)
		return k
	}
	const probation, main = 0, 1
	// Three probation ghosts (tokens 1..3) and one main ghost (token 9).
	for tok := range int32(3) {
		require.Equal(t, probation, queueOf(publish(tok+1, false)))
	}
	require.Equal(t, main, queueOf(publish(9, true)))
	require.Equal(t, 4, c.Evict(4))
	require.Equal(t, main, queueOf(publish(1, false)), "a probation ghost returns")
	require.Equal(t, main, queueOf(publish(9, false)), "the main ghost returns")
	require.Equal(t, probation, queueOf(publish(5, false)), "a new page")
	require.NoError(t, c.CheckInvariants())
}
