package allocator_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
)

func TestCacheScript(t *testing.T) {
	a := newPool(t, 40)
	c := a.NewCache()
	p, err := c.Alloc()
	require.NoError(t, err)
	assert.Equal(t, allocator.PageID(0), p, "the cache hands pages out in the pool's order")
	assert.Equal(t, 15, c.Len(), "one refill takes 16 pages")
	assert.Equal(t, allocator.Stats{Total: 40, Free: 24, InUse: 16}, a.Stats(), "cached pages count as in use")
	for p := range allocator.PageID(16) {
		assert.Equal(t, int32(1), a.RefCount(p), "page %d", p)
	}
	require.NoError(t, a.CheckInvariants())

	q, err := c.Alloc()
	require.NoError(t, err)
	assert.Equal(t, allocator.PageID(1), q)
	freed, err := c.Release(p)
	require.NoError(t, err)
	assert.True(t, freed)
	assert.Equal(t, 15, c.Len(), "a freed page stays in the cache")
	again, err := c.Alloc()
	require.NoError(t, err)
	assert.Equal(t, p, again, "LIFO: the freed page is reused first")

	// A shared page loses a holder and stays with the other holder.
	require.NoError(t, a.Retain(q))
	freed, err = c.Release(q)
	require.NoError(t, err)
	assert.False(t, freed)
	assert.Equal(t, int32(1), a.RefCount(q))
	assert.Equal(t, 0, a.Stats().Shared)

	// Misuse changes nothing and names the page.
	_, err = c.Release(39)
	require.ErrorIs(t, err, allocator.ErrBadPage)
	assert.EqualError(t, err, "allocator: bad page: release pages[0] = 39: refcount 0, not allocated (double free?)")
	_, err = c.Release(-1)
	assert.EqualError(t, err, "allocator: bad page: release pages[0] = -1: outside the pool [0, 40)")
	assert.Equal(t, 14, c.Len())

	// Pages from the cache go back through the Allocator like any other.
	_, err = a.Release(p, q)
	require.NoError(t, err)
	c.Flush()
	assert.Zero(t, c.Len())
	assert.Equal(t, allocator.Stats{Total: 40, Free: 40}, a.Stats())
	require.NoError(t, a.CheckInvariants())
}

func TestCacheOutOfPages(t *testing.T) {
	a := newPool(t, 3)
	require.NoError(t, a.Alloc(make(pages, 1)))
	c := a.NewCache()
	for range 2 {
		_, err := c.Alloc()
		require.NoError(t, err)
	}
	before := a.Stats()
	_, err := c.Alloc()
	require.ErrorIs(t, err, allocator.ErrOutOfPages)
	assert.EqualError(t, err, "allocator: out of pages: need 1 page, 0 of 3 free")
	assert.Equal(t, before, a.Stats())
	assert.Zero(t, c.Len())
	require.NoError(t, a.CheckInvariants())
}

// TestCacheFullReturnsToPool: with the cache full, a page freed through it
// goes back to the pool.
func TestCacheFullReturnsToPool(t *testing.T) {
	a := newPool(t, 64)
	held := make(pages, 40)
	require.NoError(t, a.Alloc(held))
	c := a.NewCache()
	for i, p := range held {
		freed, err := c.Release(p)
		require.NoError(t, err)
		require.True(t, freed)
		assert.Equal(t, min(i+1, 32), c.Len())
	}
	assert.Equal(t, allocator.Stats{Total: 64, Free: 32, InUse: 32}, a.Stats())
	require.NoError(t, a.CheckInvariants())
	c.Flush()
	assert.Equal(t, allocator.Stats{Total: 64, Free: 64}, a.Stats())
}

// TestCacheRandomAgainstModel mixes single-page allocs and frees through a
// Cache with batch calls on the Allocator, and checks every page's
// reference count against a model (our holders plus one for each page in
// the cache), the pool's stats and its invariants after each operation.
func TestCacheRandomAgainstModel(t *testing.T) {
	for _, numPages := range []int{1, 5, 17, 70} {
		t.Run(fmt.Sprint(numPages, "pages"), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(numPages), 7))
			a := newPool(t, numPages)
			c := a.NewCache()
			held := map[allocator.PageID]int32{} // our holders per page
			var list pages                       // one entry per holder we own
			cached := func() map[allocator.PageID]bool {
				// The cache's pages are exactly the in-use pages we do not hold.
				m := map[allocator.PageID]bool{}
				for p := range allocator.PageID(numPages) {
					if a.RefCount(p) > 0 && held[p] == 0 {
						m[p] = true
					}
				}
				return m
			}
			pick := func() allocator.PageID {
				if len(list) > 0 && rng.IntN(4) != 0 {
					return list[rng.IntN(len(list))]
				}
				for {
					p := allocator.PageID(rng.IntN(numPages+2) - 1)
					if !cached()[p] { // the cache's pages are not ours to free
						return p
					}
				}
			}
			drop := func(p allocator.PageID) {
				held[p]--
				if held[p] == 0 {
					delete(held, p)
				}
				for k, q := range list {
					if q == p {
						list = append(list[:k], list[k+1:]...)
						break
					}
				}
			}
			for i := range 3000 {
				inCache, free := c.Len(), a.NumFree()
				switch op := rng.IntN(6); op {
				case 0, 1: // cache alloc
					p, err := c.Alloc()
					if inCache == 0 && free == 0 {
						require.ErrorIs(t, err, allocator.ErrOutOfPages, "op %d", i)
						break
					}
					require.NoError(t, err, "op %d", i)
					require.Zero(t, held[p], "op %d: page %d handed out while we hold it", i, p)
					held[p] = 1
					list = append(list, p)
				case 2, 3: // cache release
					p := pick()
					want := held[p]
					freed, err := c.Release(p)
					if want == 0 {
						require.ErrorIs(t, err, allocator.ErrBadPage, "op %d: page %d", i, p)
						break
					}
					require.NoError(t, err, "op %d", i)
					require.Equal(t, want == 1, freed, "op %d", i)
					drop(p)
				case 4: // batch through the Allocator: alloc, retain, or release
					switch rng.IntN(3) {
					case 0:
						dst := make(pages, rng.IntN(3))
						err := a.Alloc(dst)
						if len(dst) > free {
							require.ErrorIs(t, err, allocator.ErrOutOfPages, "op %d", i)
							break
						}
						require.NoError(t, err, "op %d", i)
						for _, p := range dst {
							held[p]++
							list = append(list, p)
						}
					case 1:
						if len(list) > 0 {
							p := list[rng.IntN(len(list))]
							require.NoError(t, a.Retain(p), "op %d", i)
							held[p]++
							list = append(list, p)
						}
					case 2:
						if len(list) > 0 {
							p := list[rng.IntN(len(list))]
							_, err := a.Release(p)
							require.NoError(t, err, "op %d", i)
							drop(p)
						}
					}
				case 5:
					if rng.IntN(8) == 0 {
						c.Flush()
						require.Zero(t, c.Len())
					}
				}
				cm := cached()
				require.Equal(t, c.Len(), len(cm), "op %d: pages in the cache", i)
				shared := 0
				for p := range allocator.PageID(numPages) {
					want := held[p]
					if cm[p] {
						want = 1
					}
					if got := a.RefCount(p); got != want {
						t.Fatalf("op %d: page %d has refcount %d, want %d", i, p, got, want)
					}
					if want >= 2 {
						shared++
					}
				}
				inUse := len(held) + c.Len()
				require.Equal(t, allocator.Stats{Total: numPages, Free: numPages - inUse, InUse: inUse, Shared: shared}, a.Stats(), "op %d", i)
				require.NoError(t, a.CheckInvariants(), "op %d", i)
			}
			for len(list) > 0 {
				_, err := c.Release(list[0])
				require.NoError(t, err)
				drop(list[0])
			}
			c.Flush()
			assert.Equal(t, allocator.Stats{Total: numPages, Free: numPages}, a.Stats())
		})
	}
}

// TestCacheConcurrentWithPool: one goroutine owns a Cache while others use
// the Allocator directly (run with -race to check the locking).
func TestCacheConcurrentWithPool(t *testing.T) {
	const numPages, rounds = 128, 2000
	a := newPool(t, numPages)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		c := a.NewCache()
		var mine pages
		rng := rand.New(rand.NewPCG(1, 2))
		for range rounds {
			if len(mine) < 8 && rng.IntN(2) == 0 {
				p, err := c.Alloc()
				if err == nil {
					mine = append(mine, p)
				} else if !errors.Is(err, allocator.ErrOutOfPages) {
					t.Error(err)
				}
			} else if len(mine) > 0 {
				if _, err := c.Release(mine[len(mine)-1]); err != nil {
					t.Error(err)
				}
				mine = mine[:len(mine)-1]
			}
		}
		for _, p := range mine {
			if _, err := c.Release(p); err != nil {
				t.Error(err)
			}
		}
		c.Flush()
	}()
	for w := range 2 {
		go func() {
			defer wg.Done()
			dst := make(pages, 4)
			for range rounds {
				if err := a.Alloc(dst[:1+w]); err != nil {
					continue
				}
				_ = a.Stats()
				if _, err := a.Release(dst[:1+w]...); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, allocator.Stats{Total: numPages, Free: numPages}, a.Stats())
	require.NoError(t, a.CheckInvariants())
}

// TestSteadyStateAllocatesNothing pins the hot paths at zero allocations.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	a := newPool(t, 1024)
	c := a.NewCache()
	dst := make(pages, 16)
	allocs := testing.AllocsPerRun(100, func() {
		if err := a.Alloc(dst); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Release(dst...); err != nil {
			t.Fatal(err)
		}
		p, err := c.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Release(p); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}
