package prefixcache

import "time"

// deadlines is an indexed binary min-heap of ids (int32, 0..len(at)-1)
// ordered by their deadline at[id], equal deadlines by tie[id] (by id when
// tie is nil), so that what lapses at one time lapses in one order. set, remove and pop
// are O(log n) in the ids on the heap, and nothing allocates once grow
// has sized it.
type deadlines struct {
	heap []int32         // ids, heap-ordered by at
	at   []time.Duration // at[id]: id's deadline while it is on the heap
	pos  []int32         // pos[id]: 1 + id's index in heap; 0: not on it
	tie  []uint64        // tie[id] orders equal deadlines; nil: the id does
}

// before reports whether id a lapses before id b.
func (d *deadlines) before(a, b int32) bool {
	if d.at[a] != d.at[b] {
		return d.at[a] < d.at[b]
	}
	if d.tie != nil {
		return d.tie[a] < d.tie[b]
	}
	return a < b
}

// grow makes room for ids 0..n-1.
func (d *deadlines) grow(n int) {
	if n <= len(d.at) {
		return
	}
	at, pos := make([]time.Duration, n), make([]int32, n)
	copy(at, d.at)
	copy(pos, d.pos)
	if d.tie != nil {
		tie := make([]uint64, n)
		copy(tie, d.tie)
		d.tie = tie
	}
	heap := make([]int32, len(d.heap), n)
	copy(heap, d.heap)
	d.at, d.pos, d.heap = at, pos, heap
}

// len is the number of ids on the heap.
func (d *deadlines) len() int { return len(d.heap) }

// has reports whether id is on the heap.
func (d *deadlines) has(id int32) bool { return int(id) < len(d.pos) && d.pos[id] != 0 }

// set puts id on the heap with deadline t, or moves it there.
func (d *deadlines) set(id int32, t time.Duration) {
	d.at[id] = t
	i := int(d.pos[id]) - 1
	if i < 0 {
		d.heap = append(d.heap, id)
		i = len(d.heap) - 1
		d.pos[id] = int32(i) + 1
	}
	d.fix(i)
}

// remove takes id off the heap, if it is on it.
func (d *deadlines) remove(id int32) {
	if !d.has(id) {
		return
	}
	i := int(d.pos[id]) - 1
	last := len(d.heap) - 1
	d.swap(i, last)
	d.heap = d.heap[:last]
	d.pos[id] = 0
	if i < last {
		d.fix(i)
	}
}

// due returns the id with the earliest deadline if that deadline is at or
// before now.
func (d *deadlines) due(now time.Duration) (int32, bool) {
	if len(d.heap) == 0 || d.at[d.heap[0]] > now {
		return 0, false
	}
	return d.heap[0], true
}

func (d *deadlines) swap(i, j int) {
	d.heap[i], d.heap[j] = d.heap[j], d.heap[i]
	d.pos[d.heap[i]] = int32(i) + 1
	d.pos[d.heap[j]] = int32(j) + 1
}

// fix restores the heap order around index i.
func (d *deadlines) fix(i int) {
	for i > 0 {
		up := (i - 1) / 2
		if !d.before(d.heap[i], d.heap[up]) {
			break
		}
		d.swap(i, up)
		i = up
	}
	for {
		l, small := 2*i+1, i
		if l < len(d.heap) && d.before(d.heap[l], d.heap[small]) {
			small = l
		}
		if r := l + 1; r < len(d.heap) && d.before(d.heap[r], d.heap[small]) {
			small = r
		}
		if small == i {
			return
		}
		d.swap(i, small)
		i = small
	}
}
