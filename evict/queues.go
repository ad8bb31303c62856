package evict

import (
	"fmt"
	"unsafe"
)

// None is the slot Queues returns for "no slot": an empty queue's front,
// a queue's last slot's next, no victim.
const None int32 = -1

// notQueued is the queue of a slot on no queue.
const notQueued int32 = -1

// queueShift numbers queues: queue k of level l is l<<queueShift | k, so
// a slot's level is its queue's number shifted, not divided.
const queueShift = 3

// MaxQueues == 1<<queueShift, or one of these has a negative length.
var (
	_ [MaxQueues - 1<<queueShift]struct{}
	_ [1<<queueShift - MaxQueues]struct{}
)

// link is one slot's (or one queue's sentinel's) place on its queue.
type link struct {
	prev, next int32
	queue      int32 // level<<queueShift | policy queue, or notQueued
}

// Queues keeps the evictable slots of a container on intrusive FIFO queues:
// for each of its priority levels, the queues of that level's [Policy]
// instance. A slot joins the tail of the queue its level's policy picks
// ([Queues.Push]), leaves it when used or evicted ([Queues.Remove]), and
// the next victim is the head of the queue the lowest non-empty level's
// policy picks ([Queues.Victim]). Every call is O(1) (a victim O(levels +
// queues)) and allocates nothing. Not safe for concurrent use.
type Queues struct {
	policies []Policy      // one per level
	ghosts   []GhostPolicy // policies[i] if it is a GhostPolicy, else nil
	nq       int           // queues per level
	// links[s] is slot s's link; links[slots+i] is queue i's sentinel,
	// queue i = level<<queueShift | policy queue (MaxQueues a level, the
	// first nq used).
	links    []link
	slots    int32
	lens     []int // per queue; a level's first nq are what its Dequeue reads
	levelLen []int
	n        int
}

// NewQueues returns empty queues over slots slots (0..slots-1) with levels
// priority levels, each with a fresh policy named name ("" is LRU). A
// [GhostPolicy] is told the slot count.
func NewQueues(name string, levels, slots int) (*Queues, error) {
	if levels < 1 {
		return nil, fmt.Errorf("evict: %d levels, want >= 1", levels)
	}
	policies := make([]Policy, levels)
	for i := range policies {
		p, err := New(name)
		if err != nil {
			return nil, err
		}
		policies[i] = p
	}
	return NewQueuesOf(policies, slots)
}

// NewQueuesOf returns empty queues over slots slots with one level per
// policy (each a fresh instance, all with the same number of queues). A
// [GhostPolicy] is told the slot count.
func NewQueuesOf(policies []Policy, slots int) (*Queues, error) {
	if len(policies) < 1 {
		return nil, fmt.Errorf("evict: no policy")
	}
	nq := policies[0].Queues()
	if nq < 1 || nq > MaxQueues {
		return nil, fmt.Errorf("evict: policy %q has %d queues, want 1..%d", policies[0].Name(), nq, MaxQueues)
	}
	if slots < 0 || int64(slots)+int64(len(policies))*MaxQueues > 1<<31-1 {
		return nil, fmt.Errorf("evict: %d slots, want 0..2^31-1 with the queues' sentinels", slots)
	}
	q := &Queues{policies: policies, ghosts: make([]GhostPolicy, len(policies)), nq: nq,
		links: make([]link, slots+len(policies)*MaxQueues), slots: int32(slots),
		lens: make([]int, len(policies)*MaxQueues), levelLen: make([]int, len(policies))}
	for i, p := range policies {
		if p.Queues() != nq {
			return nil, fmt.Errorf("evict: policy %q of level %d has %d queues, level 0's %q has %d", p.Name(), i, p.Queues(), policies[0].Name(), nq)
		}
		if g, ok := p.(GhostPolicy); ok {
			g.Size(slots)
			q.ghosts[i] = g
		}
	}
	for s := range q.links[:slots] {
		q.links[s] = link{prev: None, next: None, queue: notQueued}
	}
	for i := range q.lens {
		s := q.slots + int32(i)
		q.links[s] = link{prev: s, next: s, queue: int32(i)}
	}
	return q, nil
}

// SlotBytes is the memory a Queues takes per slot (and per queue).
const SlotBytes = int64(unsafe.Sizeof(link{}))

// AllocBytes is what NewQueues(name, levels, slots) allocates over its
// life: a link per slot and per queue (MaxQueues a level), and, for
// ARC, each level's ghost history (a hash, a list byte and two index slots
// per slot, taken at its first eviction). An unknown name counts as LRU.
func AllocBytes(name string, levels, slots int) int64 {
	n, l := int64(max(slots, 0)), int64(max(levels, 0))
	need := (n + l*MaxQueues) * SlotBytes
	if name == ARC {
		idx := int64(2)
		for idx < 2*n {
			idx *= 2
		}
		need += l * (n*(8+1) + idx*4)
	}
	return need
}

// Name is the name of the levels' policy.
func (q *Queues) Name() string { return q.policies[0].Name() }

// Levels is the number of priority levels.
func (q *Queues) Levels() int { return len(q.policies) }

// QueuesPerLevel is the number of queues of each level's policy.
func (q *Queues) QueuesPerLevel() int { return q.nq }

// Policy returns level's policy.
func (q *Queues) Policy(level int) Policy { return q.policies[level] }

// Slots is the number of slots.
func (q *Queues) Slots() int { return int(q.slots) }

// Len is the number of queued slots.
func (q *Queues) Len() int { return q.n }

// LevelLen is the number of slots queued at level.
func (q *Queues) LevelLen(level int) int { return q.levelLen[level] }

// QueueLen is the length of queue k of level.
func (q *Queues) QueueLen(level, k int) int { return q.lens[level<<queueShift|k] }

// Queued reports whether slot is on a queue.
func (q *Queues) Queued(slot int32) bool { return q.links[slot].queue != notQueued }

// Position returns the level and policy queue slot is on; ok is false for
// a slot on none.
func (q *Queues) Position(slot int32) (level, k int, ok bool) {
	i := q.links[slot].queue
	if i == notQueued {
		return 0, 0, false
	}
	return int(i >> queueShift), int(i & (MaxQueues - 1)), true
}

// Push puts slot, which is on no queue, at the tail of the queue level's
// policy picks for a page that served hits hits.
func (q *Queues) Push(slot int32, level int, hits uint32) {
	if q.links[slot].queue != notQueued {
		panic(fmt.Sprintf("evict: slot %d pushed while on queue %d", slot, q.links[slot].queue))
	}
	p := q.policies[level]
	k := p.Enqueue(hits)
	if k < 0 || k >= q.nq {
		panic(fmt.Sprintf("evict: policy %q put slot %d on queue %d of %d", p.Name(), slot, k, q.nq))
	}
	i := level<<queueShift | k
	head := q.slots + int32(i)
	tail := q.links[head].prev
	q.links[slot] = link{prev: tail, next: head, queue: int32(i)}
	q.links[tail].next = slot
	q.links[head].prev = slot
	q.lens[i]++
	q.levelLen[level]++
	q.n++
}

// Remove takes slot off its queue.
func (q *Queues) Remove(slot int32) {
	l := q.links[slot]
	if l.queue == notQueued {
		panic(fmt.Sprintf("evict: slot %d removed while on no queue", slot))
	}
	q.links[l.prev].next = l.next
	q.links[l.next].prev = l.prev
	q.links[slot] = link{prev: None, next: None, queue: notQueued}
	q.lens[l.queue]--
	q.levelLen[l.queue>>queueShift]--
	q.n--
}

// Victim returns the slot eviction takes next, without removing it: the
// head of the queue the policy of the lowest non-empty level picks. None
// when no slot is queued.
func (q *Queues) Victim() int32 {
	if q.n == 0 {
		return None
	}
	for level, n := range q.levelLen {
		if n == 0 {
			continue
		}
		lens := q.lens[level<<queueShift : level<<queueShift+q.nq]
		k := q.policies[level].Dequeue(lens)
		if k < 0 || k >= q.nq || lens[k] == 0 {
			panic(fmt.Sprintf("evict: policy %q picked queue %d of lengths %v", q.policies[level].Name(), k, lens))
		}
		return q.links[q.slots+int32(level<<queueShift|k)].next
	}
	return None
}

// Front returns the head (oldest) slot of queue k of level, or None.
func (q *Queues) Front(level, k int) int32 {
	s := q.links[q.slots+int32(level<<queueShift|k)].next
	if s >= q.slots {
		return None
	}
	return s
}

// Next returns the slot after slot on its queue, or None.
func (q *Queues) Next(slot int32) int32 {
	s := q.links[slot].next
	if s >= q.slots || s == None {
		return None
	}
	return s
}

// Evicted tells level's policy, if it is a [GhostPolicy], that the page
// with hash was evicted, with the hits it would be enqueued with.
func (q *Queues) Evicted(level int, hash uint64, hits uint32) {
	if g := q.ghosts[level]; g != nil {
		g.Evicted(hash, hits)
	}
}

// Returned tells level's policy, if it is a [GhostPolicy], that the page
// with hash is stored again, and reports whether it remembered the page
// (the page then counts as having served a hit until it serves one).
func (q *Queues) Returned(level int, hash uint64) bool {
	g := q.ghosts[level]
	return g != nil && g.Returned(hash)
}

// HasGhosts reports whether the policy keeps a ghost history (a
// [GhostPolicy]).
func (q *Queues) HasGhosts() bool { return q.ghosts[0] != nil }

// CheckSlot checks slot's own links: on no queue it has none; on a queue
// its neighbours link back to it.
func (q *Queues) CheckSlot(slot int32) error {
	l := q.links[slot]
	if l.queue == notQueued {
		if l.prev != None || l.next != None {
			return fmt.Errorf("evict: slot %d is on no queue but links %d and %d", slot, l.prev, l.next)
		}
		return nil
	}
	if l.queue < 0 || int(l.queue) >= len(q.lens) || l.prev < 0 || l.next < 0 ||
		int(l.prev) >= len(q.links) || int(l.next) >= len(q.links) ||
		q.links[l.prev].next != slot || q.links[l.next].prev != slot {
		return fmt.Errorf("evict: slot %d on queue %d is not linked (prev %d, next %d)", slot, l.queue, l.prev, l.next)
	}
	return nil
}

// CheckInvariants walks every queue: each holds slots recorded on it, well
// linked, as many as its length says; the levels' lengths and the total
// add up; no slot claims a queue it is not on.
func (q *Queues) CheckInvariants() error {
	total := 0
	for i, want := range q.lens {
		head := q.slots + int32(i)
		if q.links[head].queue != int32(i) {
			return fmt.Errorf("evict: sentinel of queue %d records queue %d", i, q.links[head].queue)
		}
		n, prev := 0, head
		for s := q.links[head].next; s != head; prev, s = s, q.links[s].next {
			if s < 0 || s >= q.slots || q.links[s].queue != int32(i) || q.links[s].prev != prev {
				return fmt.Errorf("evict: queue %d (level %d, queue %d) broken at slot %d after %d slots", i, i>>queueShift, i&(MaxQueues-1), s, n)
			}
			if n++; n > int(q.slots) {
				return fmt.Errorf("evict: queue %d (level %d, queue %d) has a cycle", i, i>>queueShift, i&(MaxQueues-1))
			}
		}
		if q.links[head].prev != prev || n != want {
			return fmt.Errorf("evict: queue %d (level %d, queue %d) holds %d slots, its length says %d", i, i>>queueShift, i&(MaxQueues-1), n, want)
		}
		total += n
	}
	for level, n := range q.levelLen {
		sum := 0
		for _, k := range q.lens[level<<queueShift : (level+1)<<queueShift] {
			sum += k
		}
		if sum != n {
			return fmt.Errorf("evict: level %d counts %d slots, its queues hold %d", level, n, sum)
		}
	}
	if total != q.n {
		return fmt.Errorf("evict: queues hold %d slots, the counter says %d", total, q.n)
	}
	claimed := 0
	for s := range q.slots {
		if q.links[s].queue != notQueued {
			claimed++
		} else if err := q.CheckSlot(s); err != nil {
			return err
		}
	}
	if claimed != total {
		return fmt.Errorf("evict: %d slots record a queue, the queues hold %d", claimed, total)
	}
	return nil
}
