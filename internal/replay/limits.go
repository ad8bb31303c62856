package replay

import (
	"container/heap"
	"math"
)

// Limits of a block reference stream. An admission hits the longest prefix
// of its blocks that is cached, then every one of its blocks is cached
// (subject to capacity). Both limits ignore that running requests hold
// their pages: they bound the prefix cache alone.

// Unlimited returns the hit blocks of s with unlimited capacity: a block
// hits when the admission's blocks before it hit and it was referenced
// before.
func Unlimited(s *Stream) (hits, blocks int64) {
	seen := map[int32]struct{}{}
	for _, adm := range s.Admissions {
		k := 0
		for k < len(adm) {
			if _, ok := seen[adm[k]]; !ok {
				break
			}
			k++
		}
		hits += int64(k)
		blocks += int64(len(adm))
		for _, id := range adm[k:] {
			seen[id] = struct{}{}
		}
	}
	return hits, blocks
}

// Belady returns the hit blocks of s with room for capacity blocks under
// Belady's rule, with the future known: after each reference the block
// whose next reference is farthest away leaves (a block never referenced
// again is not kept at all).
//
// Leaf-first holds without a special case: next references are positions
// in the stream, all distinct, and a block's parent is referenced before
// it in every admission that references it, so a parent's next reference
// always comes before its child's; the farthest is never a parent of a
// cached block.
func Belady(s *Stream, capacity int) (hits int64) {
	// Dense ids and each reference's next reference position.
	dense := map[int32]int32{}
	var refs []int32
	for _, adm := range s.Admissions {
		for _, id := range adm {
			d, ok := dense[id]
			if !ok {
				d = int32(len(dense))
				dense[id] = d
			}
			refs = append(refs, d)
		}
	}
	const never = math.MaxInt64
	nextRef := make([]int64, len(refs))
	last := make([]int64, len(dense))
	for i := range last {
		last[i] = never
	}
	for i := len(refs) - 1; i >= 0; i-- {
		nextRef[i] = last[refs[i]]
		last[refs[i]] = int64(i)
	}
	// key[d] is cached block d's next reference (0: not cached); the heap
	// holds (key, d) entries, stale ones skipped when popped.
	key := make([]int64, len(dense))
	h := &farthest{}
	cached := 0
	pos := 0
	for _, adm := range s.Admissions {
		k := 0
		for k < len(adm) && key[refs[pos+k]] != 0 {
			k++
		}
		hits += int64(k)
		for j := range adm {
			d, nx := refs[pos+j], nextRef[pos+j]
			was := key[d] != 0
			switch {
			case nx == never && was:
				key[d] = 0
				cached--
			case nx == never:
			default:
				if !was {
					cached++
				}
				key[d] = nx + 1
				heap.Push(h, entry{nx + 1, d})
			}
			for cached > capacity {
				e := heap.Pop(h).(entry)
				if key[e.block] == e.next {
					key[e.block] = 0
					cached--
				}
			}
		}
		pos += len(adm)
	}
	return hits
}

type entry struct {
	next  int64 // next reference position + 1
	block int32
}

// farthest is a max-heap of entries by next reference.
type farthest []entry

func (h farthest) Len() int           { return len(h) }
func (h farthest) Less(i, j int) bool { return h[i].next > h[j].next }
func (h farthest) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *farthest) Push(x any)        { *h = append(*h, x.(entry)) }
func (h *farthest) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
