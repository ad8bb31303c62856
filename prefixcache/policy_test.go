package prefixcache

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
)

func TestUnknownEvictionPolicyIsRejectedByName(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 4})
	require.NoError(t, err)
	_, err = New(Config{NumPages: 4, PageSize: 2, Refs: a, Eviction: "lfu-ish"})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorIs(t, err, ErrUnknownPolicy)
	require.ErrorContains(t, err, `"lfu-ish"`)
	require.ErrorContains(t, err, "lru, slru, srrip")
	c, err := New(Config{NumPages: 4, PageSize: 2, Refs: a})
	require.NoError(t, err)
	require.Equal(t, PolicyLRU, c.Eviction(), "the default")
}

func TestNodeIsOneCacheLine(t *testing.T) {
	require.Equal(t, uintptr(64), unsafe.Sizeof(node{}))
}

// TestPoliciesOrderVictims draws each policy's choice on one picture: a
// chain a0<-a1 that served a hit and a fresh chain b0<-b1, idle in the
// order a1 a0 b1 b0.
func TestPoliciesOrderVictims(t *testing.T) {
	for policy, want := range map[string][]PageID{
		PolicyLRU:   {1, 0, 3, 2}, // idle order
		PolicySLRU:  {3, 2, 1, 0}, // probation (no hits) first
		PolicySRRIP: {3, 2, 1, 0}, // RRPV 2 before RRPV 0
		PolicyARC:   {1, 0, 3, 2}, // main: probation (2 pages) is within its target (half of 4)
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

// Publishing, hits, release and eviction allocate nothing under any policy
// (the per-step hot path).
func TestPoliciesDoNotAllocate(t *testing.T) {
	for _, policy := range PolicyNames() {
		a, err := allocator.New(allocator.Config{NumPages: 8})
		require.NoError(t, err)
		c, err := New(Config{NumPages: 8, PageSize: 1, Refs: a, Seed: 1, Eviction: policy})
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

// ghosts against a slice of the last n evictions: random adds and takes
// over a few hashes (so probes collide and wrap), every answer and count
// compared, and the index checked to hold exactly the live ghosts.
func TestGhostsMatchSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{1, 2, 5, 14} {
		var g ghosts
		g.init(n)
		type rec struct {
			hash uint64
			list uint8
			live bool
		}
		var ref []rec
		for step := range 5000 {
			h := uint64(rng.IntN(3 * n))
			if rng.IntN(4) == 0 {
				h <<= 40 // far apart too
			}
			if rng.IntN(2) == 0 {
				l := uint8(rng.IntN(2))
				g.add(h, l)
				for i := range ref {
					if ref[i].live && ref[i].hash == h {
						ref[i].live = false
					}
				}
				ref = append(ref, rec{h, l, true})
				if len(ref) > n {
					ref = ref[1:]
				}
			} else {
				list, ok := g.take(h)
				var wl uint8
				wok := false
				for i := range ref {
					if ref[i].live && ref[i].hash == h {
						ref[i].live, wl, wok = false, ref[i].list, true
					}
				}
				require.Equal(t, [2]any{wok, wl}, [2]any{ok, list}, "n %d step %d take %d", n, step, h)
			}
			var count [2]int
			live := 0
			for _, r := range ref {
				if r.live {
					count[r.list]++
					live++
					require.GreaterOrEqual(t, g.find(r.hash), 0, "n %d step %d: ghost %d not found", n, step, r.hash)
				}
			}
			require.Equal(t, count, g.count, "n %d step %d", n, step)
			indexed := 0
			for _, x := range g.index {
				if x != 0 {
					indexed++
				}
			}
			require.Equal(t, live, indexed, "n %d step %d: index entries", n, step)
		}
	}
}

// ARC's target moves by the ratio of the ghost lists on a ghost hit: up
// when the page left probation, down when it left main; and a page that
// comes back is enqueued on main.
func TestARCLearnsFromGhosts(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 8})
	require.NoError(t, err)
	c, err := New(Config{NumPages: 8, PageSize: 1, Refs: a, Seed: 1, Eviction: PolicyARC, Priorities: 1})
	require.NoError(t, err)
	arc := c.policies[0].(*arcPolicy)
	require.Equal(t, 4, arc.target, "starts in the middle")
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
	// Three probation ghosts (tokens 1..3) and one main ghost (token 9).
	for tok := range int32(3) {
		publish(tok+1, false)
	}
	publish(9, true)
	require.Equal(t, 4, c.Evict(4))
	require.Equal(t, [2]int{3, 1}, arc.ghosts.count)
	// A probation ghost returns: up by max(1, 1/3) = 1, onto main.
	p := publish(1, false)
	require.Equal(t, 5, arc.target)
	require.Equal(t, uint8(arcMain), c.nodes[p].queue)
	// The main ghost returns: down by max(1, 2/1) = 2.
	publish(9, false)
	require.Equal(t, 3, arc.target)
	require.Equal(t, [2]int{2, 0}, arc.ghosts.count)
	// A new page is on probation.
	p = publish(5, false)
	require.Equal(t, uint8(arcProbation), c.nodes[p].queue)
	require.NoError(t, c.CheckInvariants())
}
