package prefixcache

import "math/bits"

// index maps a 64-bit prefix hash to the first page of the chain of cached
// pages with that hash (the rest follow node.nextHash). It is an
// open-addressing table with linear probing, sized once to at least twice
// the pool, so it never grows, never allocates after New, and stays at most
// half full (at most one chain per cached page). Hashes are already well
// mixed, so a hash's home slot is its high 32 bits masked: the slot's tag
// holds those bits, so deletion finds the home of every entry it shifts
// without reading that entry's node (a cache miss per entry at 10^6 pages).
//
// A Go map did the same job at about twice the cost per lookup (it rehashes
// the key and probes control bytes); lookups are the inner loop of every
// admission.
type index struct {
	slots []slot // len is a power of two, >= 2*NumPages
	mask  uint64
	n     int // occupied slots
}

// slot holds one chain: ref is the head page + 1 (0: empty, so the zero
// table is empty) and tag the hash's high 32 bits, compared before touching
// the node, from which the home slot follows (tag & mask).
type slot struct {
	tag uint32
	ref int32
}

// home returns the slot where the probe for hash h starts. The table has at
// most 2^25 slots (2*MaxPages), so the tag's 32 bits cover the mask.
func (ix *index) home(h uint64) uint64 { return (h >> 32) & ix.mask }

func newIndex(numPages int) index {
	size := 1 << bits.Len(uint(2*numPages-1))
	return index{slots: make([]slot, size), mask: uint64(size - 1)}
}

// get returns the head of the chain for h, or none.
func (ix *index) get(nodes []node, h uint64) int32 {
	tag := uint32(h >> 32)
	for i := ix.home(h); ; i = (i + 1) & ix.mask {
		s := ix.slots[i]
		if s.ref == 0 {
			return none
		}
		if s.tag == tag && nodes[s.ref-1].hash == h {
			return s.ref - 1
		}
	}
}

// find returns the slot of the chain for h, or the empty slot where it would
// go, and whether it exists.
func (ix *index) find(nodes []node, h uint64) (uint64, bool) {
	tag := uint32(h >> 32)
	for i := ix.home(h); ; i = (i + 1) & ix.mask {
		s := ix.slots[i]
		if s.ref == 0 {
			return i, false
		}
		if s.tag == tag && nodes[s.ref-1].hash == h {
			return i, true
		}
	}
}

// push makes p (with nodes[p].hash == h set) the head of the chain for h and
// returns the previous head, or none.
func (ix *index) push(nodes []node, h uint64, p int32) int32 {
	i, ok := ix.find(nodes, h)
	prev := none
	if ok {
		prev = ix.slots[i].ref - 1
	} else {
		ix.n++
	}
	ix.slots[i] = slot{tag: uint32(h >> 32), ref: p + 1}
	return prev
}

// drop unlinks page p, whose hash is h, from its chain; next is p's successor
// in the chain. When p was the only page with hash h, the slot is emptied by
// backward shift, so probes never need tombstones.
func (ix *index) drop(nodes []node, h uint64, p, next int32) {
	i, ok := ix.find(nodes, h)
	if !ok {
		panic("prefixcache: dropping a hash that is not indexed")
	}
	head := ix.slots[i].ref - 1
	if head != p {
		// p is inside the chain: unlink it there.
		y := head
		for nodes[y].nextHash != p {
			y = nodes[y].nextHash
		}
		nodes[y].nextHash = next
		return
	}
	if next != none {
		ix.slots[i].ref = next + 1
		return
	}
	// Backward-shift deletion: move later entries of the probe run into the
	// hole unless their home slot lies cyclically in (hole, j].
	ix.n--
	hole := i
	for j := (i + 1) & ix.mask; ix.slots[j].ref != 0; j = (j + 1) & ix.mask {
		home := uint64(ix.slots[j].tag) & ix.mask
		if hole <= j {
			if hole < home && home <= j {
				continue
			}
		} else if hole < home || home <= j {
			continue
		}
		ix.slots[hole] = ix.slots[j]
		hole = j
	}
	ix.slots[hole] = slot{}
}
