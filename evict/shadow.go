package evict

import "fmt"

// Shadow estimates, while a cache serves, the hit ratio an LRU cache of
// the same references would have at ½×, 2× and 4× the cache's size, and
// with no limit: a live miss-ratio curve. It samples page keys spatially
// (SHARDS, Waldspurger et al., FAST '15, with its SHARDS-adj correction):
// a key is sampled when a mix of
// it falls under Rate of the hash space, and each sampled key is replayed
// through LRU caches of Rate × the size in question (and of
// ShadowUnlimitedFactor × the 4× one for the ceiling), so each estimate
// costs the share Rate of one LRU operation per reference. Prefix caches
// reference a chain's pages in order and release them deepest first, so
// under LRU a page is cached only while its prefix is: the per-key LRU
// hit ratio is the prefix cache's.
//
// The shadows are one LRU stack cut at the sizes' boundaries (see
// shadowStack), which takes its memory at construction (a key, two links,
// a segment byte per entry of the largest, and an open-addressing index of
// 2–4 int32 slots per entry). A key is mixed once per reference: the mix
// decides the sample and places the key in the index. Not safe for
// concurrent use (it belongs to its cache).
type Shadow struct {
	threshold uint64 // a key is sampled when mix(key) < threshold
	rate      float64
	stack     shadowStack
	found     [ShadowSizes + 1]int64 // sampled references found in each segment (ShadowSizes: in none)
	refs      int64                  // sampled references
	all       int64                  // every reference
}

// The shadow sizes, in the order of [ShadowEstimates.HitRatio].
const (
	ShadowHalf = iota
	ShadowDouble
	ShadowQuadruple
	ShadowUnlimited
	ShadowSizes
)

// ShadowFactors are the sizes the shadows stand for, per the cache's
// pages (the unlimited one is ShadowUnlimitedFactor × the 4× one's).
var ShadowFactors = [ShadowSizes]float64{0.5, 2, 4, 4 * ShadowUnlimitedFactor}

// ShadowUnlimitedFactor is how many times the 4× shadow the "unlimited"
// one holds: a bound on its memory, large enough that on the replay's
// trace it forgets nothing a reuse comes back for.
const ShadowUnlimitedFactor = 16

// DefaultShadowRate is the sampling rate when none is given: 1 key in 8,
// the lowest power of two at which the replay of the conversation trace
// is within 2 points of the true LRU figures (docs/replay.md).
const DefaultShadowRate = 1.0 / 8

// MinShadowEntries is the least a sampled shadow holds, so that a small
// cache's ½× shadow is not empty.
const MinShadowEntries = 16

// NewShadow returns the shadows of a cache of pages pages at sampling
// rate rate (0 < rate <= 1; 0 means DefaultShadowRate).
func NewShadow(pages int, rate float64) (*Shadow, error) {
	if rate == 0 {
		rate = DefaultShadowRate
	}
	if !(rate > 0 && rate <= 1) {
		return nil, fmt.Errorf("evict: shadow sampling rate %g, want (0, 1]", rate)
	}
	if pages < 1 {
		return nil, fmt.Errorf("evict: shadow of %d pages, want >= 1", pages)
	}
	s := &Shadow{rate: rate, threshold: uint64(rate * (1 << 53))}
	var sizes [ShadowSizes]int
	for i, f := range ShadowFactors {
		sizes[i] = max(int(f*rate*float64(pages)+0.5), MinShadowEntries+i) // strictly increasing
	}
	s.stack.init(sizes)
	return s, nil
}

// ShadowBytes is what NewShadow(pages, rate) allocates.
func ShadowBytes(pages int, rate float64) int64 {
	if rate == 0 {
		rate = DefaultShadowRate
	}
	e := int64(max(int(ShadowFactors[ShadowSizes-1]*rate*float64(pages)+0.5), MinShadowEntries+ShadowSizes-1))
	return e*8 + (e+1)*(2*4+1) + shadowIndexSize(int(e))*4
}

// Rate is the sampling rate.
func (s *Shadow) Rate() float64 { return s.rate }

// shadowMix mixes a key, a chain hash (uniform already), by Fibonacci
// hashing: its top 53 bits decide the sample, its low bits place it in
// the index (key × an odd number is a bijection on the low bits, so they
// stay as uniform as the key's). One multiply, so that Ref's test of the
// sample inlines into its caller.
func shadowMix(key uint64) uint64 { return key * shadowGolden }

// shadowGolden is 2^64 / φ, odd.
const shadowGolden = 0x9e3779b97f4a7c15

// Ref records a reference to the page with key (a chain hash): a hit in
// each shadow that holds it; the page becomes the most recently used.
// The test of the sample inlines into the caller; only a sampled key
// costs a call.
func (s *Shadow) Ref(key uint64) {
	s.all++
	if key*shadowGolden>>11 < s.threshold { // shadowMix, written out to stay inlinable
		s.ref(key)
	}
}

// ref is Ref of a sampled key: a hit is counted once, in the segment the
// key was found in ([Shadow.Estimates] adds them up per shadow).
// (Not inlined, so that Ref is.)
//
//go:noinline
func (s *Shadow) ref(key uint64) {
	s.refs++
	s.found[s.stack.use(key, shadowMix(key), true)]++
}

// Touch makes the page with key, if a shadow holds it, its most recently
// used: the container calls it when the page becomes evictable, so the
// shadows' order is the cache's LRU order (a request's pages released
// deepest first), not the order of the references.
func (s *Shadow) Touch(key uint64) {
	if key*shadowGolden>>11 < s.threshold { // shadowMix
		s.touch(key)
	}
}

// touch is Touch of a sampled key (not inlined, so that Touch is).
//
//go:noinline
func (s *Shadow) touch(key uint64) { s.stack.use(key, shadowMix(key), false) }

// shadowStack is one LRU stack of keys cut into ShadowSizes segments:
// segment k holds the stack positions [size[k-1], size[k]), so the LRU
// cache of size[j] entries holds exactly segments 0..j, and a key found
// in segment k hits in every shadow j >= k. A reference moves its key to
// the top and demotes one key across each boundary above its old place
// (the tail of each segment into the next): one index probe and
// O(segments) link updates per sampled reference, for all shadows at once.
// The index maps a key to its entry by open addressing over the key's mix
// (linear probing, backward-shift deletion), sized at construction.
type shadowStack struct {
	key        []uint64
	prev, next []int32 // entry links; index len(key) is the list's sentinel
	seg        []uint8
	n          int32
	room       [ShadowSizes]int32 // entries each segment holds when full
	count      [ShadowSizes]int32
	tail       [ShadowSizes]int32 // each segment's last (least recent) entry, or -1
	index      []int32            // entry+1 of a key, 0 for none; len a power of two
	mask       uint64
}

// shadowIndexSize is the index's length for n entries: the least power
// of two >= 2n (at most half full).
func shadowIndexSize(n int) int64 {
	size := int64(2)
	for size < 2*int64(n) {
		size *= 2
	}
	return size
}

func (l *shadowStack) init(sizes [ShadowSizes]int) {
	n := sizes[ShadowSizes-1]
	l.key, l.seg = make([]uint64, n), make([]uint8, n+1)
	l.prev, l.next = make([]int32, n+1), make([]int32, n+1)
	s := int32(n)
	l.prev[s], l.next[s], l.seg[s] = s, s, 0xff
	prev := 0
	for k, size := range sizes {
		l.room[k] = int32(size - prev)
		prev = size
		l.tail[k] = -1
	}
	l.index = make([]int32, shadowIndexSize(n))
	l.mask = uint64(len(l.index) - 1)
}

// find returns the index position of key (mixed h) and its entry, or the
// empty position where it would go and -1.
func (l *shadowStack) find(key, h uint64) (pos uint64, e int32) {
	for pos = h & l.mask; l.index[pos] != 0; pos = (pos + 1) & l.mask {
		if e := l.index[pos] - 1; l.key[e] == key {
			return pos, e
		}
	}
	return pos, -1
}

// drop empties index position i, shifting later probes back.
func (l *shadowStack) drop(i uint64) {
	for j := (i + 1) & l.mask; l.index[j] != 0; j = (j + 1) & l.mask {
		k := shadowMix(l.key[l.index[j]-1]) & l.mask
		// Move j's entry to the hole at i unless its home lies in (i, j].
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			l.index[i] = l.index[j]
			i = j
		}
	}
	l.index[i] = 0
}

func (l *shadowStack) unlink(e int32) {
	l.next[l.prev[e]] = l.next[e]
	l.prev[l.next[e]] = l.prev[e]
}

// leave takes entry e out of segment k's count and, if it is the
// segment's tail, moves the tail up (the list links stay).
func (l *shadowStack) leave(e int32, k int) {
	if l.tail[k] == e {
		if p := l.prev[e]; l.seg[p] == uint8(k) {
			l.tail[k] = p
		} else {
			l.tail[k] = -1
		}
	}
	l.count[k]--
}

// use moves key (mixed h) to the top and returns the segment it was
// found in; if absent it inserts it when insert says so, and returns
// ShadowSizes.
func (l *shadowStack) use(key, h uint64, insert bool) int {
	top := int(ShadowSizes) // segments [0, top) shift down by one
	pos, e := l.find(key, h)
	ok := e >= 0
	switch {
	case ok:
		k := int(l.seg[e])
		top = k
		l.leave(e, k)
		l.unlink(e)
	case !insert:
		return ShadowSizes
	case int(l.n) < len(l.key):
		e = l.n
		l.n++
		l.key[e] = key
		l.index[pos] = e + 1
	default:
		// Full: the last segment's tail leaves the stack.
		last := ShadowSizes - 1
		e = l.tail[last]
		l.leave(e, last)
		l.unlink(e)
		old, _ := l.find(l.key[e], shadowMix(l.key[e]))
		l.drop(old)
		l.key[e] = key
		pos, _ = l.find(key, h) // the drop may have moved the hole
		l.index[pos] = e + 1
	}
	s := int32(len(l.key))
	l.prev[e], l.next[e] = s, l.next[s]
	l.prev[l.next[s]] = e
	l.next[s] = e
	l.seg[e] = 0
	l.count[0]++
	if l.tail[0] < 0 {
		l.tail[0] = e
	}
	// Each overfull segment above the old place gives its tail to the next.
	for k := 0; k < top && k < ShadowSizes-1; k++ {
		if l.count[k] <= l.room[k] {
			break
		}
		d := l.tail[k]
		l.leave(d, k)
		l.seg[d] = uint8(k + 1)
		l.count[k+1]++
		if l.tail[k+1] < 0 {
			l.tail[k+1] = d
		}
	}
	if ok {
		return top
	}
	return ShadowSizes
}

// ShadowEstimates is what the shadows measured.
type ShadowEstimates struct {
	Rate float64
	// References are every reference, Sampled those the shadows saw.
	References, Sampled int64
	// HitRatio is each shadow's hit ratio (ShadowHalf .. ShadowUnlimited).
	HitRatio [ShadowSizes]float64
}

// Estimates returns the shadows' hit ratios so far.
func (s *Shadow) Estimates() ShadowEstimates {
	e := ShadowEstimates{Rate: s.rate, References: s.all, Sampled: s.refs}
	// SHARDS-adj: the sample holds a share of the references that differs
	// from the rate by which hot keys it happened to draw; the difference
	// between the expected and the actual sampled references is counted
	// as hits at the shortest reuse distance (hot keys hit in every
	// shadow), and the expected count is the denominator.
	want := s.rate * float64(s.all)
	if want > 0 {
		adj := want - float64(s.refs)
		for i, h := range s.hits() {
			e.HitRatio[i] = min(max((float64(h)+adj)/want, 0), 1)
		}
	}
	return e
}

// hits is each shadow's hits: a key found in segment k hit in every
// shadow from k on.
func (s *Shadow) hits() (hits [ShadowSizes]int64) {
	sum := int64(0)
	for j := range hits {
		sum += s.found[j]
		hits[j] = sum
	}
	return hits
}
