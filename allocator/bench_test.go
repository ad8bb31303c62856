package allocator_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/pagedkv/pagedkv/allocator"
)

// naiveAllocator is the baseline the benchmarks compare against: what one
// writes first in Go, a mutex, a map of reference counts and a slice of free
// pages, with one lock per page.
type naiveAllocator struct {
	mu   sync.Mutex
	refs map[allocator.PageID]int32
	free []allocator.PageID
}

func newNaive(n int) *naiveAllocator {
	a := &naiveAllocator{refs: map[allocator.PageID]int32{}}
	for p := n - 1; p >= 0; p-- {
		a.free = append(a.free, allocator.PageID(p))
	}
	return a
}

func (a *naiveAllocator) Alloc(dst []allocator.PageID) error {
	for i := range dst {
		a.mu.Lock()
		if len(a.free) == 0 {
			a.mu.Unlock()
			return errors.New("out of pages")
		}
		p := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		a.refs[p] = 1
		a.mu.Unlock()
		dst[i] = p
	}
	return nil
}

func (a *naiveAllocator) Release(pages ...allocator.PageID) error {
	for _, p := range pages {
		a.mu.Lock()
		r, ok := a.refs[p]
		if !ok {
			a.mu.Unlock()
			return errors.New("bad page")
		}
		if r == 1 {
			delete(a.refs, p)
			a.free = append(a.free, p)
		} else {
			a.refs[p] = r - 1
		}
		a.mu.Unlock()
	}
	return nil
}

// BenchmarkAllocRelease allocates and releases batch pages per iteration from
// a pool of 65536 pages, half in use, and reports ns/page. pagedkv/* is this
// package's Allocator, pagedkv-cache/* its owner-local Cache, naive/* the
// mutex+map baseline.
func BenchmarkAllocRelease(b *testing.B) {
	const numPages = 1 << 16
	for _, batch := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("pagedkv/batch=%d", batch), func(b *testing.B) {
			a, _ := allocator.New(allocator.Config{NumPages: numPages})
			_ = a.Alloc(make([]allocator.PageID, numPages/2))
			dst := make([]allocator.PageID, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := a.Alloc(dst); err != nil {
					b.Fatal(err)
				}
				if _, err := a.Release(dst...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/page")
		})
		if batch == 1 {
			// The owner-local Cache: one page at a time, one lock per free.
			b.Run("pagedkv-cache/batch=1", func(b *testing.B) {
				a, _ := allocator.New(allocator.Config{NumPages: numPages})
				_ = a.Alloc(make([]allocator.PageID, numPages/2))
				c := a.NewCache()
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					p, err := c.Alloc()
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.Release(p); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/page")
			})
		}
		b.Run(fmt.Sprintf("naive/batch=%d", batch), func(b *testing.B) {
			a := newNaive(numPages)
			_ = a.Alloc(make([]allocator.PageID, numPages/2))
			dst := make([]allocator.PageID, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := a.Alloc(dst); err != nil {
					b.Fatal(err)
				}
				if err := a.Release(dst...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/page")
		})
	}
}

// BenchmarkAllocReleaseParallel is BenchmarkAllocRelease with batch 16 from
// GOMAXPROCS goroutines sharing one pool (contended lock).
func BenchmarkAllocReleaseParallel(b *testing.B) {
	const numPages, batch = 1 << 16, 16
	a, _ := allocator.New(allocator.Config{NumPages: numPages})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]allocator.PageID, batch)
		for pb.Next() {
			if err := a.Alloc(dst); err != nil {
				b.Error(err)
				return
			}
			if _, err := a.Release(dst...); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/page")
}
