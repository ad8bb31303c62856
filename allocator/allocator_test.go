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
	"github.com/pagedkv/pagedkv/internal/reference"
)

func newPool(t testing.TB, n int) *allocator.Allocator {
	t.Helper()
	a, err := allocator.New(allocator.Config{NumPages: n})
	require.NoError(t, err)
	return a
}

// refs draws the pool as a map page -> refcount of the allocated pages.
func refs(a *allocator.Allocator) map[allocator.PageID]int32 {
	m := map[allocator.PageID]int32{}
	for p := range a.NumPages() {
		if r := a.RefCount(allocator.PageID(p)); r != 0 {
			m[allocator.PageID(p)] = r
		}
	}
	return m
}

type pages = []allocator.PageID

func TestNewRejectsBadSizes(t *testing.T) {
	for _, n := range []int{-1, 0, allocator.MaxPages + 1} {
		_, err := allocator.New(allocator.Config{NumPages: n})
		require.ErrorIs(t, err, allocator.ErrBadConfig, "NumPages %d", n)
		assert.Contains(t, err.Error(), fmt.Sprint(n))
	}
	a := newPool(t, allocator.MaxPages)
	assert.Equal(t, allocator.Stats{Total: 1 << 24, Free: 1 << 24}, a.Stats())
	require.NoError(t, a.CheckInvariants())
}

// TestScript runs small scripts; after each step the pool is drawn as
// page -> refcount of allocated pages.
func TestScript(t *testing.T) {
	type step struct {
		op     string // alloc N | retain | release
		pages  pages  // for retain/release
		n      int    // for alloc
		want   pages  // alloc result
		freed  int    // release result
		err    error  // expected error class
		after  map[allocator.PageID]int32
		shared int
	}
	tests := map[string]struct {
		numPages int
		steps    []step
	}{
		"FreshPoolHandsOutIncreasingIDs": {4, []step{
			{op: "alloc", n: 3, want: pages{0, 1, 2}, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
		}},
		"FreedPageIsReusedFirst(LIFO)": {4, []step{
			{op: "alloc", n: 3, want: pages{0, 1, 2}, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
			{op: "release", pages: pages{1}, freed: 1, after: map[allocator.PageID]int32{0: 1, 2: 1}},
			{op: "alloc", n: 2, want: pages{1, 3}, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1, 3: 1}},
		}},
		"ExhaustExactly": {3, []step{
			{op: "alloc", n: 3, want: pages{0, 1, 2}, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
			{op: "alloc", n: 1, err: allocator.ErrOutOfPages, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
		}},
		"ExhaustPlusOneChangesNothing": {3, []step{
			{op: "alloc", n: 1, want: pages{0}, after: map[allocator.PageID]int32{0: 1}},
			{op: "alloc", n: 3, err: allocator.ErrOutOfPages, after: map[allocator.PageID]int32{0: 1}},
		}},
		"SharedPageFreedByLastHolder": {4, []step{
			{op: "alloc", n: 2, want: pages{0, 1}, after: map[allocator.PageID]int32{0: 1, 1: 1}},
			{op: "retain", pages: pages{1, 1}, after: map[allocator.PageID]int32{0: 1, 1: 3}, shared: 1},
			{op: "release", pages: pages{1, 1}, freed: 0, after: map[allocator.PageID]int32{0: 1, 1: 1}},
			{op: "release", pages: pages{1, 0}, freed: 2, after: map[allocator.PageID]int32{}},
		}},
		"DoubleFree": {4, []step{
			{op: "alloc", n: 1, want: pages{0}, after: map[allocator.PageID]int32{0: 1}},
			{op: "release", pages: pages{0}, freed: 1, after: map[allocator.PageID]int32{}},
			{op: "release", pages: pages{0}, err: allocator.ErrBadPage, after: map[allocator.PageID]int32{}},
		}},
		"ListedTwiceWithOneHolderChangesNothing": {4, []step{
			{op: "alloc", n: 2, want: pages{0, 1}, after: map[allocator.PageID]int32{0: 1, 1: 1}},
			{op: "release", pages: pages{1, 0, 1}, err: allocator.ErrBadPage, after: map[allocator.PageID]int32{0: 1, 1: 1}},
		}},
		"BadPageLastChangesNothing": {4, []step{
			{op: "alloc", n: 3, want: pages{0, 1, 2}, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
			{op: "release", pages: pages{0, 1, 2, 3}, err: allocator.ErrBadPage, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
			{op: "release", pages: pages{2, 4}, err: allocator.ErrBadPage, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
			{op: "release", pages: pages{2, -1}, err: allocator.ErrBadPage, after: map[allocator.PageID]int32{0: 1, 1: 1, 2: 1}},
		}},
		"RetainFreePageChangesNothing": {4, []step{
			{op: "alloc", n: 1, want: pages{0}, after: map[allocator.PageID]int32{0: 1}},
			{op: "retain", pages: pages{0, 1}, err: allocator.ErrBadPage, after: map[allocator.PageID]int32{0: 1}},
			{op: "retain", pages: pages{0, 9}, err: allocator.ErrBadPage, after: map[allocator.PageID]int32{0: 1}},
		}},
		"EmptyCalls": {1, []step{
			{op: "alloc", n: 0, want: pages{}, after: map[allocator.PageID]int32{}},
			{op: "retain", pages: pages{}, after: map[allocator.PageID]int32{}},
			{op: "release", pages: pages{}, after: map[allocator.PageID]int32{}},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := newPool(t, tc.numPages)
			for i, s := range tc.steps {
				var err error
				switch s.op {
				case "alloc":
					dst := make(pages, s.n)
					for k := range dst {
						dst[k] = -7 // must stay untouched on failure
					}
					err = a.Alloc(dst)
					if s.err == nil {
						assert.Equal(t, s.want, dst, "step %d alloc result", i)
					} else {
						for _, p := range dst {
							assert.Equal(t, allocator.PageID(-7), p, "step %d: failed Alloc wrote dst", i)
						}
					}
				case "retain":
					err = a.Retain(s.pages...)
				case "release":
					var freed int
					freed, err = a.Release(s.pages...)
					assert.Equal(t, s.freed, freed, "step %d freed", i)
				}
				if s.err != nil {
					require.ErrorIs(t, err, s.err, "step %d", i)
				} else {
					require.NoError(t, err, "step %d", i)
				}
				assert.Equal(t, s.after, refs(a), "step %d: page -> refcount", i)
				st := a.Stats()
				assert.Equal(t, allocator.Stats{Total: tc.numPages, Free: tc.numPages - len(s.after), InUse: len(s.after), Shared: s.shared}, st, "step %d stats", i)
				require.NoError(t, a.CheckInvariants(), "step %d", i)
			}
		})
	}
}

func TestErrorsNameThePageAndItsRefcount(t *testing.T) {
	a := newPool(t, 8)
	dst := make(pages, 2)
	require.NoError(t, a.Alloc(dst))
	_, err := a.Release(5)
	require.ErrorIs(t, err, allocator.ErrBadPage)
	assert.EqualError(t, err, "allocator: bad page: release pages[0] = 5: refcount 0, not allocated (double free?)")

	_, err = a.Release(0, 1, 1)
	assert.EqualError(t, err, "allocator: bad page: release pages[2] = 1: refcount 0, not allocated (double free?)")
	assert.Equal(t, int32(1), a.RefCount(1), "failed release must restore page 1")

	err = a.Retain(0, 8)
	assert.EqualError(t, err, "allocator: bad page: retain pages[1] = 8: outside the pool [0, 8)")

	err = a.Alloc(make(pages, 7))
	require.ErrorIs(t, err, allocator.ErrOutOfPages)
	assert.EqualError(t, err, "allocator: out of pages: need 7 pages, 6 of 8 free")
}

func TestRefCountOutsideThePoolIsZero(t *testing.T) {
	a := newPool(t, 2)
	assert.Zero(t, a.RefCount(-1))
	assert.Zero(t, a.RefCount(2))
	assert.Equal(t, 2, a.NumPages())
	assert.Equal(t, 2, a.NumFree())
}

// pairing maps real pages to model pages; the allocators may pick different
// free pages, so they are compared up to this renaming.
type pairing struct {
	toModel map[allocator.PageID]int32
	toReal  map[int32]allocator.PageID
}

func (p *pairing) add(t testing.TB, r allocator.PageID, m int32) {
	if old, ok := p.toModel[r]; ok {
		t.Fatalf("real page %d handed out again while paired with model page %d", r, old)
	}
	if old, ok := p.toReal[m]; ok {
		t.Fatalf("model page %d handed out again while paired with real page %d", m, old)
	}
	p.toModel[r], p.toReal[m] = m, r
}

// runAllocOps decodes ops from rng-like byte source and checks the real
// allocator against the model after each one.
func runAllocOps(t testing.TB, numPages int, next func() byte, nops int) {
	a := newPool(t, numPages)
	m := reference.NewPageAllocModel(numPages)
	pr := &pairing{map[allocator.PageID]int32{}, map[int32]allocator.PageID{}}
	var held pages // one entry per holder we own, in real IDs
	pick := func() allocator.PageID {
		// Mostly pages we hold; sometimes any ID, including outside the pool.
		if len(held) > 0 && next()%8 != 0 {
			return held[int(next())%len(held)]
		}
		return allocator.PageID(int(next())%(numPages+2) - 1)
	}
	toModel := func(ps pages) []int32 {
		out := make([]int32, len(ps))
		for i, p := range ps {
			mp, ok := pr.toModel[p]
			if !ok {
				mp = -1000 - int32(p) // a page the model has not handed out
			}
			out[i] = mp
		}
		return out
	}
	for i := 0; i < nops; i++ {
		var realErr, modelErr error
		op := next() % 3
		switch op {
		case 0: // alloc
			n := int(next()) % (numPages/2 + 2)
			dst := make(pages, n)
			realErr = a.Alloc(dst)
			got, err := m.Alloc(n)
			modelErr = err
			if realErr == nil && modelErr == nil {
				for k := range dst {
					pr.add(t, dst[k], got[k])
				}
				held = append(held, dst...)
			}
		case 1: // retain
			ps := make(pages, int(next())%4)
			for k := range ps {
				ps[k] = pick()
			}
			realErr = a.Retain(ps...)
			modelErr = m.Retain(toModel(ps)...)
			if realErr == nil && modelErr == nil {
				held = append(held, ps...)
			}
		case 2: // release
			ps := make(pages, int(next())%4)
			for k := range ps {
				ps[k] = pick()
			}
			freed, err := a.Release(ps...)
			realErr = err
			mfreed, merr := m.Release(toModel(ps)...)
			modelErr = merr
			if realErr == nil && modelErr == nil {
				require.Equal(t, mfreed, freed, "op %d: pages freed by release %v", i, ps)
				for _, p := range ps {
					k := indexOf(held, p)
					held = append(held[:k], held[k+1:]...)
				}
				for _, p := range ps {
					if a.RefCount(p) == 0 {
						if mp, ok := pr.toModel[p]; ok {
							delete(pr.toModel, p)
							delete(pr.toReal, mp)
						}
					}
				}
			}
		}
		require.Equal(t, modelErr == nil, realErr == nil, "op %d (%d): real error %v, model error %v", i, op, realErr, modelErr)
		require.Equal(t, errors.Is(modelErr, reference.ErrModelOutOfPages), errors.Is(realErr, allocator.ErrOutOfPages), "op %d: %v vs %v", i, realErr, modelErr)
		require.Equal(t, errors.Is(modelErr, reference.ErrModelBadPage), errors.Is(realErr, allocator.ErrBadPage), "op %d: %v vs %v", i, realErr, modelErr)

		st := a.Stats()
		require.Equal(t, allocator.Stats{Total: numPages, Free: m.NumFree(), InUse: numPages - m.NumFree(), Shared: m.NumShared()}, st, "op %d", i)
		require.Equal(t, len(m.Refs), len(pr.toModel), "op %d: pages in use vs paired pages", i)
		for r, mp := range pr.toModel { // no testify here: this runs for every page after every op
			if got, want := a.RefCount(r), int32(m.RefCount(mp)); got != want {
				t.Fatalf("op %d: real page %d has refcount %d, model page %d has %d", i, r, got, mp, want)
			}
		}
		require.Equal(t, len(held), sumRefs(a), "op %d: holders we own vs sum of refcounts", i)
		require.NoError(t, a.CheckInvariants(), "op %d", i)
	}
}

func indexOf(ps pages, p allocator.PageID) int {
	for i, q := range ps {
		if q == p {
			return i
		}
	}
	panic(fmt.Sprintf("page %d not held", p))
}

func sumRefs(a *allocator.Allocator) int {
	n := 0
	for p := range a.NumPages() {
		n += int(a.RefCount(allocator.PageID(p)))
	}
	return n
}

func TestRandomAgainstModel(t *testing.T) {
	for _, numPages := range []int{1, 2, 7, 32} {
		t.Run(fmt.Sprint(numPages, "pages"), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(numPages), 42))
			runAllocOps(t, numPages, func() byte { return byte(rng.Uint32()) }, 5000)
		})
	}
}

func FuzzAllocatorOps(f *testing.F) {
	f.Add(uint8(4), []byte{})                                // empty
	f.Add(uint8(1), []byte{0, 1, 0, 1, 2, 1, 0, 2, 1, 0})    // one page: alloc, double free
	f.Add(uint8(8), []byte{0, 8, 0, 9, 1, 3, 1, 1, 1, 2, 3}) // full pool, retains
	f.Add(uint8(3), []byte{0, 3, 1, 2, 1, 1, 2, 2, 1, 1, 2}) // shared pages released twice
	f.Add(uint8(16), []byte{0, 200, 2, 3, 7, 7, 7, 0, 5, 1}) // oversized alloc, bad IDs
	f.Fuzz(func(t *testing.T, size uint8, ops []byte) {
		numPages := int(size)%64 + 1
		i := 0
		next := func() byte {
			if i >= len(ops) {
				return 0
			}
			i++
			return ops[i-1]
		}
		runAllocOps(t, numPages, next, len(ops)/2)
	})
}

// TestConcurrentUse hammers one pool from several goroutines: every page is
// allocated, shared and released by its goroutine, and the pool ends empty
// and consistent (run with -race to check the locking).
func TestConcurrentUse(t *testing.T) {
	const workers, rounds, numPages = 8, 500, 256
	a := newPool(t, numPages)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			dst := make(pages, 16)
			for range rounds {
				n := 1 + rng.IntN(len(dst))
				if err := a.Alloc(dst[:n]); err != nil {
					if !errors.Is(err, allocator.ErrOutOfPages) {
						t.Error(err)
					}
					continue
				}
				if err := a.Retain(dst[:n]...); err != nil {
					t.Error(err)
				}
				_ = a.Stats()
				if _, err := a.Release(dst[:n]...); err != nil {
					t.Error(err)
				}
				if freed, err := a.Release(dst[:n]...); err != nil || freed != n {
					t.Errorf("freed %d of %d: %v", freed, n, err)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, allocator.Stats{Total: numPages, Free: numPages}, a.Stats())
	require.NoError(t, a.CheckInvariants())
}
