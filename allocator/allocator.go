package allocator

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/pagedkv/pagedkv/internal/invariants"
)

// PageID names one page of the pool: an index in [0, NumPages) into the
// page dimension of the engine's K/V tensors (FlashInfer's page_idx).
type PageID int32

// MaxPages is the largest pool an Allocator manages (2^24 pages).
const MaxPages = 1 << 24

var (
	// ErrOutOfPages reports that the pool has fewer free pages than a call
	// asked for. It is a predictable condition (the engine should evict or
	// preempt), returned wrapped with the numbers involved.
	ErrOutOfPages = errors.New("allocator: out of pages")

	// ErrBadPage reports misuse of a page ID: a double free, a page that is
	// not allocated, or an ID outside the pool. The wrapping error names the
	// page and its reference count.
	ErrBadPage = errors.New("allocator: bad page")

	// ErrBadConfig reports an invalid [Config].
	ErrBadConfig = errors.New("allocator: bad config")
)

// Config describes a pool.
type Config struct {
	// NumPages is the number of pages in the pool, 1..MaxPages.
	NumPages int
}

// Stats is a snapshot of the pool's occupancy, in pages.
type Stats struct {
	Total  int // pages in the pool; Total == Free + InUse
	Free   int // pages with reference count 0
	InUse  int // pages with reference count >= 1
	Shared int // pages with reference count >= 2 (a subset of InUse)
}

// Allocator is a fixed pool of pages with reference counts. It is safe for
// concurrent use. The zero value is not usable; call [New]. An Allocator must
// not be copied after first use.
type Allocator struct {
	mu sync.Mutex // protects everything below

	// free is a LIFO stack of free page IDs; free[len(free)-1] is handed out
	// next. cap(free) == len(refs), so a push never allocates.
	free []PageID

	// refs[p] is the number of holders of page p: 0 means free.
	refs []int32

	// shared is the number of pages with refs >= 2.
	shared int
}

// AllocBytes is the memory New takes for a pool of numPages pages: a
// free-list slot and a reference count per page (numPages clamped to
// MaxPages+1, so the result never overflows).
func AllocBytes(numPages int) int64 {
	return int64(min(max(numPages, 0), MaxPages+1)) * int64(unsafe.Sizeof(PageID(0))+unsafe.Sizeof(int32(0)))
}

// New returns a pool of cfg.NumPages free pages. Pages are first handed out
// in increasing ID order.
func New(cfg Config) (*Allocator, error) {
	if cfg.NumPages < 1 || cfg.NumPages > MaxPages {
		return nil, fmt.Errorf("%w: NumPages = %d, want 1..%d", ErrBadConfig, cfg.NumPages, MaxPages)
	}
	a := &Allocator{
		free: make([]PageID, cfg.NumPages),
		refs: make([]int32, cfg.NumPages),
	}
	for i := range a.free {
		a.free[i] = PageID(cfg.NumPages - 1 - i)
	}
	return a, nil
}

// NumPages returns the number of pages in the pool.
func (a *Allocator) NumPages() int { return len(a.refs) }

// Alloc fills every element of dst with a distinct free page, each with
// reference count 1, or, if fewer than len(dst) pages are free, changes
// nothing (dst included) and returns an error wrapping [ErrOutOfPages].
// Alloc with an empty dst does nothing.
func (a *Allocator) Alloc(dst []PageID) error {
	n := len(dst)
	if n == 0 {
		return nil
	}
	a.mu.Lock()
	nfree := len(a.free)
	if n > nfree {
		a.mu.Unlock()
		return fmt.Errorf("%w: need %d pages, %d of %d free", ErrOutOfPages, n, nfree, len(a.refs))
	}
	// Fast path: the top n stack entries, taken in pop order.
	top := a.free[nfree-n:]
	for i, p := range top {
		dst[n-1-i] = p
		a.refs[p] = 1
	}
	a.free = a.free[:nfree-n]
	if invariants.Enabled {
		a.checkTouchedLocked(dst)
	}
	a.mu.Unlock()
	return nil
}

// Retain adds one holder to each listed page (a page listed k times gains k).
// Every page must be allocated; otherwise Retain changes nothing and returns
// an error wrapping [ErrBadPage] that names the first bad page.
func (a *Allocator) Retain(pages ...PageID) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, p := range pages {
		if err := a.checkAllocatedLocked("retain", i, p); err != nil {
			return err
		}
	}
	for _, p := range pages {
		a.refs[p]++
		if a.refs[p] == 2 {
			a.shared++
		}
	}
	if invariants.Enabled {
		a.checkTouchedLocked(pages)
	}
	return nil
}

// Release removes one holder from each listed page; pages left with no holder
// return to the pool, and freed is how many did. A page listed k times loses
// k holders, so it must have at least k. If any page has too few holders (a
// double free, a page never allocated) or lies outside the pool, Release
// changes nothing and returns an error wrapping [ErrBadPage] naming it.
func (a *Allocator) Release(pages ...PageID) (freed int, err error) {
	a.mu.Lock()
	// One pass that checks and applies, undone on the first bad page: pages
	// are almost always good, so this beats a separate checking pass.
	refs := a.refs
	for i, p := range pages {
		if uint(p) >= uint(len(refs)) || refs[p] <= 0 {
			err = a.checkAllocatedLocked("release", i, p)
			a.undoReleaseLocked(pages[:i])
			a.mu.Unlock()
			return 0, err
		}
		r := refs[p] - 1
		refs[p] = r
		switch r {
		case 0:
			a.free = append(a.free, p) // within capacity: never allocates
			freed++
		case 1:
			a.shared--
		}
	}
	if invariants.Enabled {
		a.checkTouchedLocked(pages)
	}
	a.mu.Unlock()
	return freed, nil
}

// undoReleaseLocked reverts the decrements of done, in reverse order, so a
// page pushed on the free stack is popped from its top.
func (a *Allocator) undoReleaseLocked(done []PageID) {
	for i := len(done) - 1; i >= 0; i-- {
		p := done[i]
		if a.refs[p] == 0 {
			a.free = a.free[:len(a.free)-1]
		}
		a.refs[p]++
		if a.refs[p] == 2 {
			a.shared++
		}
	}
}

// checkAllocatedLocked reports whether p (argument i of op) is in the pool and
// has at least one holder.
func (a *Allocator) checkAllocatedLocked(op string, i int, p PageID) error {
	if p < 0 || int(p) >= len(a.refs) {
		return fmt.Errorf("%w: %s pages[%d] = %d: outside the pool [0, %d)", ErrBadPage, op, i, p, len(a.refs))
	}
	if a.refs[p] <= 0 {
		what := "not allocated"
		if op == "release" {
			what = "not allocated (double free?)"
		}
		return fmt.Errorf("%w: %s pages[%d] = %d: refcount %d, %s", ErrBadPage, op, i, p, a.refs[p], what)
	}
	return nil
}

// RefCount returns the number of holders of page p: 0 for a free page and
// for an ID outside the pool.
func (a *Allocator) RefCount(p PageID) int32 {
	if p < 0 || int(p) >= len(a.refs) {
		return 0
	}
	a.mu.Lock()
	n := a.refs[p]
	a.mu.Unlock()
	return n
}

// NumFree returns the number of free pages.
func (a *Allocator) NumFree() int {
	a.mu.Lock()
	n := len(a.free)
	a.mu.Unlock()
	return n
}

// Stats returns a consistent snapshot of the pool's occupancy.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{
		Total:  len(a.refs),
		Free:   len(a.free),
		InUse:  len(a.refs) - len(a.free),
		Shared: a.shared,
	}
}

// CheckInvariants verifies the whole pool in O(NumPages) time and returns an
// error describing the first violation found, or nil.
func (a *Allocator) CheckInvariants() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.refs)
	if cap(a.free) != n || len(a.free) > n {
		return fmt.Errorf("allocator: free stack len %d cap %d, pool %d pages", len(a.free), cap(a.free), n)
	}
	onStack := make([]bool, n)
	for i, p := range a.free {
		if p < 0 || int(p) >= n {
			return fmt.Errorf("allocator: free[%d] = %d outside the pool [0, %d)", i, p, n)
		}
		if onStack[p] {
			return fmt.Errorf("allocator: page %d is on the free stack twice (second at free[%d])", p, i)
		}
		onStack[p] = true
		if a.refs[p] != 0 {
			return fmt.Errorf("allocator: page %d is on the free stack (free[%d]) with refcount %d", p, i, a.refs[p])
		}
	}
	shared := 0
	for p, r := range a.refs {
		switch {
		case r < 0:
			return fmt.Errorf("allocator: page %d has refcount %d", p, r)
		case r == 0 && !onStack[p]:
			return fmt.Errorf("allocator: page %d has refcount 0 but is not on the free stack (leaked)", p)
		case r >= 2:
			shared++
		}
	}
	if shared != a.shared {
		return fmt.Errorf("allocator: %d pages have refcount >= 2, shared counter says %d", shared, a.shared)
	}
	return nil
}

// checkTouchedLocked is the cheap per-call check of invariants builds: the
// counters, and the pages the call touched.
func (a *Allocator) checkTouchedLocked(pages []PageID) {
	n := len(a.refs)
	if len(a.free) > n || a.shared < 0 || a.shared > n-len(a.free) {
		panic(fmt.Sprintf("allocator: broken counters: free %d, shared %d, pool %d", len(a.free), a.shared, n))
	}
	for _, p := range pages {
		if int(p) < 0 || int(p) >= n {
			panic(fmt.Sprintf("allocator: page %d outside the pool [0, %d) after a call", p, n))
		}
		if a.refs[p] < 0 {
			panic(fmt.Sprintf("allocator: page %d has refcount %d after a call", p, a.refs[p]))
		}
	}
}
