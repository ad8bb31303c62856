package allocator

import (
	"fmt"

	"github.com/pagedkv/pagedkv/internal/invariants"
)

// cacheCap is the most pages a [Cache] holds; cacheRefill is how many it
// takes from the pool when it runs dry. Refilling half the capacity leaves
// room for frees to land in the cache before it must hand pages back.
const (
	cacheCap    = 32
	cacheRefill = cacheCap / 2
)

// Cache is an owner-local front to an [Allocator] for one page at a time,
// in the manner of the Go runtime's per-P mcache: it holds up to 32 pages
// that the pool has allocated to it (reference count 1, counted as in use),
// hands them out without taking the pool's lock, and keeps pages whose last
// holder frees them through it. So a single-page alloc takes the lock once
// per 16 allocations (when the cache refills) and a single-page free once,
// where [Allocator.Alloc] and [Allocator.Release] take it once each.
//
// Pages held by a Cache are allocated as far as the pool is concerned: they
// count in [Stats.InUse], have reference count 1, and other callers cannot
// get them until [Cache.Flush] returns them. Every invariant of the pool
// holds unchanged.
//
// A Cache belongs to one goroutine at a time (typically the scheduler's);
// its methods must not be called concurrently with each other. The
// Allocator behind it stays safe for concurrent use by everyone else, and
// pages from a Cache may be retained and released through the Allocator
// like any other.
type Cache struct {
	a     *Allocator
	n     int // pages[:n] are held by the cache, pages[n-1] handed out next
	pages [cacheCap]PageID
}

// NewCache returns an empty cache in front of a.
func (a *Allocator) NewCache() *Cache { return &Cache{a: a} }

// Len returns the number of pages the cache holds.
func (c *Cache) Len() int { return c.n }

// Alloc returns a page with reference count 1, held by the caller. When
// the cache is empty it first takes up to 16 pages from the pool under one
// lock; if the pool has none free it returns an error wrapping
// [ErrOutOfPages] and changes nothing.
func (c *Cache) Alloc() (PageID, error) {
	if c.n == 0 {
		if err := c.refill(); err != nil {
			return -1, err
		}
	}
	c.n--
	return c.pages[c.n], nil
}

// refill moves up to cacheRefill free pages of the pool into the cache.
// The cache is empty.
func (c *Cache) refill() error {
	a := c.a
	a.mu.Lock()
	nfree := len(a.free)
	k := min(cacheRefill, nfree)
	if k == 0 {
		a.mu.Unlock()
		return fmt.Errorf("%w: need 1 page, 0 of %d free", ErrOutOfPages, len(a.refs))
	}
	// Take them in pop order, so the cache hands them out in the order
	// Alloc would have.
	top := a.free[nfree-k:]
	for i, p := range top {
		c.pages[i] = p
		a.refs[p] = 1
	}
	a.free = a.free[:nfree-k]
	c.n = k
	if invariants.Enabled {
		a.checkTouchedLocked(c.pages[:k])
	}
	a.mu.Unlock()
	return nil
}

// Release removes one holder from page p, as [Allocator.Release] does for
// one page, and reports whether that was the last holder. A page whose last
// holder frees it stays in the cache (its one reference passes to the
// cache) while the cache has room, and returns to the pool otherwise. A
// page outside the pool or with no holder is an error wrapping
// [ErrBadPage]; nothing changes.
func (c *Cache) Release(p PageID) (freed bool, err error) {
	a := c.a
	a.mu.Lock()
	if uint(p) >= uint(len(a.refs)) || a.refs[p] <= 0 {
		err = a.checkAllocatedLocked("release", 0, p)
		a.mu.Unlock()
		return false, err
	}
	switch r := a.refs[p]; {
	case r == 1 && c.n < cacheCap:
		c.pages[c.n] = p
		c.n++
		freed = true
	case r == 1:
		a.refs[p] = 0
		a.free = append(a.free, p) // within capacity: never allocates
		freed = true
	default:
		if r == 2 {
			a.shared--
		}
		a.refs[p] = r - 1
	}
	if invariants.Enabled {
		a.checkTouchedLocked([]PageID{p})
	}
	a.mu.Unlock()
	return freed, nil
}

// Flush returns every page the cache holds to the pool.
func (c *Cache) Flush() {
	if c.n == 0 {
		return
	}
	a := c.a
	a.mu.Lock()
	for _, p := range c.pages[:c.n] {
		a.refs[p] = 0
		a.free = append(a.free, p) // within capacity: never allocates
	}
	if invariants.Enabled {
		a.checkTouchedLocked(c.pages[:c.n])
	}
	a.mu.Unlock()
	c.n = 0
}
