package prefixcache

import (
	"crypto/sha256"
	"encoding/binary"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/evict"
)

// Benchmarks, each beside a naive baseline in the same run:
//
//	BenchmarkMatch/ours          hash + verify per token of a cached prompt
//	BenchmarkMatch/naive-sha256  vLLM's default: chained SHA-256 per page, digest trusted
//	BenchmarkEvict/ours          one page per Evict at 10^6 cached pages, p99 reported
//	BenchmarkEvict/naive-scan    scan every page for the least recently used leaf

const benchPageSize = 16

func benchTokens(n int, salt int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)*7919 + salt
	}
	return out
}

func BenchmarkMatch(b *testing.B) {
	const ntokens = 8192
	const npages = ntokens / benchPageSize
	a, err := allocator.New(allocator.Config{NumPages: 4 * npages})
	require.NoError(b, err)
	c, err := New(Config{NumPages: 4 * npages, PageSize: benchPageSize, Refs: a})
	require.NoError(b, err)
	key := c.Key(Namespace{Tenant: "bench"})
	// Three cached prompts that share nothing, so the map holds distractors.
	var prompt []int32
	for salt := range int32(3) {
		prompt = benchTokens(ntokens, salt)
		pages := make([]PageID, npages)
		require.NoError(b, a.Alloc(pages))
		h := Handle{}
		for i, p := range pages {
			h, _, err = c.Publish(h, key, p, prompt[i*benchPageSize:(i+1)*benchPageSize], 0)
			require.NoError(b, err)
		}
	}

	b.Run("ours", func(b *testing.B) {
		dst := make([]PageID, 0, npages)
		b.ReportAllocs()
		b.SetBytes(4 * ntokens)
		for b.Loop() {
			got, _ := c.Match(dst[:0], key, prompt, npages)
			if len(got) != npages {
				b.Fatalf("matched %d pages, want %d", len(got), npages)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/ntokens, "ns/token")
	})

	b.Run("naive-sha256", func(b *testing.B) {
		index := make(map[[32]byte]PageID, npages)
		var buf []byte
		var prev [32]byte
		for i := range npages {
			buf = sha256Page(buf[:0], prev, prompt[i*benchPageSize:(i+1)*benchPageSize])
			prev = sha256.Sum256(buf)
			index[prev] = PageID(i)
		}
		dst := make([]PageID, 0, npages)
		b.ReportAllocs()
		b.SetBytes(4 * ntokens)
		for b.Loop() {
			got := dst[:0]
			var prev [32]byte
			for i := range npages {
				buf = sha256Page(buf[:0], prev, prompt[i*benchPageSize:(i+1)*benchPageSize])
				prev = sha256.Sum256(buf)
				p, ok := index[prev]
				if !ok {
					break
				}
				got = append(got, p)
			}
			if len(got) != npages {
				b.Fatalf("matched %d pages, want %d", len(got), npages)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/ntokens, "ns/token")
	})
}

func sha256Page(buf []byte, prev [32]byte, tokens []int32) []byte {
	buf = append(buf, prev[:]...)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
	}
	return buf
}

const (
	evictPages = 1 << 20 // ~10^6 cached pages
	evictChain = 64      // pages per cached prompt
)

// fillIdle caches evictPages pages as prompts of evictChain pages, all
// released (idle), in the order real traffic would leave them.
func fillIdle(b testing.TB, a *allocator.Allocator, c *Cache, round int) {
	key := c.Key(Namespace{})
	pages := make([]PageID, evictChain)
	toks := make([]int32, benchPageSize)
	for chain := 0; chain < evictPages/evictChain; chain++ {
		require.NoError(b, a.Alloc(pages))
		h := Handle{}
		var err error
		for d, p := range pages {
			for t := range toks {
				toks[t] = int32(round<<24 ^ chain<<8 ^ d<<4 ^ t)
			}
			h, _, err = c.Publish(h, key, p, toks, 0)
			require.NoError(b, err)
		}
		_, err = a.Release(pages...)
		require.NoError(b, err)
		for i := len(pages) - 1; i >= 0; i-- {
			c.Recheck(pages[i])
		}
	}
}

// p99 returns the 99th percentile of the samples (sorting them).
func p99(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	slices.Sort(samples)
	return samples[len(samples)*99/100]
}

func BenchmarkEvict(b *testing.B) {
	b.Run("ours", func(b *testing.B) {
		a, err := allocator.New(allocator.Config{NumPages: evictPages})
		require.NoError(b, err)
		c, err := New(Config{NumPages: evictPages, PageSize: benchPageSize, Refs: a})
		require.NoError(b, err)
		fillIdle(b, a, c, 0)
		samples := make([]time.Duration, 0, min(b.N, 1<<22))
		runtime.GC() // collect earlier rounds' caches now, not while timing
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if c.Len() == 0 {
				b.StopTimer()
				fillIdle(b, a, c, i)
				b.StartTimer()
			}
			t0 := time.Now()
			if c.Evict(1) != 1 {
				b.Fatal("evicted nothing")
			}
			if len(samples) < cap(samples) {
				samples = append(samples, time.Since(t0))
			}
		}
		b.StopTimer()
		// The samples include one time.Now pair (~20-50 ns).
		b.ReportMetric(float64(p99(samples).Nanoseconds()), "p99-ns/page")
		b.ReportMetric(float64(c.Len()), "cached-pages-left")
	})

	b.Run("naive-scan", func(b *testing.B) {
		// The shape of a radix tree without an LRU list: find the least
		// recently used leaf by scanning every cached page.
		n := newNaiveTree(evictPages, evictChain)
		samples := make([]time.Duration, 0, b.N)
		runtime.GC()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if n.cached == 0 {
				b.StopTimer()
				n = newNaiveTree(evictPages, evictChain)
				b.StartTimer()
			}
			t0 := time.Now()
			n.evictOne()
			samples = append(samples, time.Since(t0))
		}
		b.StopTimer()
		b.ReportMetric(float64(p99(samples).Nanoseconds()), "p99-ns/page")
	})
}

// naiveTree is the baseline: per-page last-use times and child counts, and
// eviction by a full scan for the oldest cached leaf.
type naiveTree struct {
	lastUse  []int64
	parent   []int32
	children []int32
	isCached []bool
	cached   int
}

func newNaiveTree(npages, chain int) *naiveTree {
	n := &naiveTree{lastUse: make([]int64, npages), parent: make([]int32, npages),
		children: make([]int32, npages), isCached: make([]bool, npages), cached: npages}
	for p := range npages {
		n.isCached[p] = true
		n.lastUse[p] = int64(p/chain*chain + (chain - 1 - p%chain)) // deeper pages older, as in ours
		if p%chain == 0 {
			n.parent[p] = -1
		} else {
			n.parent[p] = int32(p - 1)
			n.children[p-1]++
		}
	}
	return n
}

func (n *naiveTree) evictOne() {
	best := -1
	for p, ok := range n.isCached {
		if ok && n.children[p] == 0 && (best < 0 || n.lastUse[p] < n.lastUse[best]) {
			best = p
		}
	}
	n.isCached[best] = false
	if q := n.parent[best]; q >= 0 {
		n.children[q]--
	}
	n.cached--
}

// BenchmarkLookupShadow is an admission's lookup (Match, then Hit on the
// matched pages) of a cached 8,192-token prompt in two caches, one
// without the live miss-ratio curve and one with it at its default rate,
// alternated in one loop (which goes first alternating too) so that a
// loaded machine slows both alike; it reports each one's median ns per
// lookup over the last benchRing lookups (a median, so that the load's
// spikes, which hit one lookup of the pair and not the other, do not
// decide it) and the curve's overhead in percent of the medians
// (docs/replay.md, goal <= 10%).
func BenchmarkLookupShadow(b *testing.B) {
	const ntokens = 8192
	const npages = ntokens / benchPageSize
	type setup struct {
		c      *Cache
		key    Key
		prompt []int32
		dst    []PageID
		ring   []time.Duration
	}
	mk := func(rate float64) *setup {
		a, err := allocator.New(allocator.Config{NumPages: 4 * npages})
		require.NoError(b, err)
		c, err := New(Config{NumPages: 4 * npages, PageSize: benchPageSize, Refs: a, ShadowRate: rate, Seed: 1})
		require.NoError(b, err)
		s := &setup{c: c, key: c.Key(Namespace{Tenant: "bench"}), dst: make([]PageID, 0, npages), ring: make([]time.Duration, 0, benchRing)}
		for salt := range int32(3) {
			s.prompt = benchTokens(ntokens, salt)
			pages := make([]PageID, npages)
			require.NoError(b, a.Alloc(pages))
			h := Handle{}
			for i, p := range pages {
				h, _, err = c.Publish(h, s.key, p, s.prompt[i*benchPageSize:(i+1)*benchPageSize], 0)
				require.NoError(b, err)
			}
		}
		return s
	}
	off, on := mk(0), mk(evict.DefaultShadowRate)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		pair := [...]*setup{off, on}
		if i%2 == 1 {
			pair = [...]*setup{on, off}
		}
		for _, s := range pair {
			t0 := time.Now()
			s.dst, _ = s.c.Match(s.dst[:0], s.key, s.prompt, npages)
			s.c.Hit(s.dst...)
			if d := time.Since(t0); len(s.ring) < benchRing {
				s.ring = append(s.ring, d)
			} else {
				s.ring[i%benchRing] = d
			}
		}
		i++
	}
	require.Len(b, on.dst, npages)
	median := func(s *setup) float64 {
		slices.Sort(s.ring)
		return float64(s.ring[len(s.ring)/2].Nanoseconds())
	}
	moff, mon := median(off), median(on)
	b.ReportMetric(moff, "ns-off/lookup")
	b.ReportMetric(mon, "ns-curve/lookup")
	b.ReportMetric(100*(mon/moff-1), "curve-overhead-%")
}

// benchRing is how many of the last lookups BenchmarkLookupShadow takes
// the median of.
const benchRing = 4096
