package evict

import (
	"fmt"
	"unsafe"
)

// None is the slot Queues returns for "no slot": an empty queue's front,
// a queue's last slot's next, no victim.
const None int32 = -1

// queueShift numbers queues: queue k of level l is l<<queueShift | k, so
// a slot's level is its queue's number shifted, not divided.
const queueShift = 5

// MaxQueues == 1<<queueShift, or one of these has a negative length.
var (
	_ [MaxQueues - 1<<queueShift]struct{}
	_ [1<<queueShift - MaxQueues]struct{}
)

// A Link is one slot's place on its queue. A container that keeps a record
// per slot may embed it there ([NewQueuesIn]), so that the list work
// touches the records eviction reads anyway; only Queues reads or writes
// it. Its zero value is on no queue, so resetting a record of a slot that
// is on no queue resets its Link too.
type Link struct {
	prev, next int32
	queue      int32 // 1 + (level<<queueShift | policy queue); 0: on no queue
}

// SlotBytes is the size of a Link: what NewQueues takes per slot.
const SlotBytes = int64(unsafe.Sizeof(Link{}))

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
	classes  []ClassPolicy // policies[i] if it is a ClassPolicy, else nil
	aged     []AgePolicy   // policies[i] if it is an AgePolicy, else nil
	nq       int           // queues per level
	// Slot s's Link is at base + s*stride (in the container's records,
	// or in own); queue i's sentinel is sentinels[i], named slots+i, for
	// queue i = level<<queueShift | policy queue (MaxQueues a level, the
	// first nq used).
	base      unsafe.Pointer
	stride    uintptr
	own       []Link // the slots' Links when the container keeps none
	sentinels []Link
	slots     int32
	lens      []int // per queue; a level's first nq are what its Dequeue reads
	levelLen  []int
	n         int
	// For an [AgePolicy]: each slot's push number (stamps[slot]), the
	// pushes so far, and the ages of a level's queue heads.
	stamps []uint32
	pushes uint32
	ages   [MaxQueues]uint32
}

// NewQueues returns empty queues over slots slots (0..slots-1) with levels
// priority levels, each with a fresh policy named name ("" is LRU); the
// queues keep the slots' Links. A [GhostPolicy] is told the slot count.
func NewQueues(name string, levels, slots int) (*Queues, error) {
	policies, err := newPolicies(name, levels)
	if err != nil {
		return nil, err
	}
	return NewQueuesOf(policies, slots)
}

// NewQueuesOf is NewQueues with one level per policy (each a fresh
// instance, all with the same number of queues).
func NewQueuesOf(policies []Policy, slots int) (*Queues, error) {
	if slots < 0 {
		return nil, fmt.Errorf("evict: %d slots, want >= 0", slots)
	}
	own := make([]Link, slots)
	q, err := newQueues(policies, slots)
	if err != nil {
		return nil, err
	}
	q.own, q.stride = own, unsafe.Sizeof(Link{})
	if slots > 0 {
		q.base = unsafe.Pointer(&own[0])
	}
	return q, nil
}

// NewQueuesIn is NewQueues over the slots of records, one per slot, whose
// Links are where link says (a field of the record): the list work then
// touches the records themselves. records must stay where they are (never
// reallocated) while the queues are used, and each record's Link must be
// zero (on no queue).
func NewQueuesIn[R any](name string, levels int, records []R, link func(*R) *Link) (*Queues, error) {
	policies, err := newPolicies(name, levels)
	if err != nil {
		return nil, err
	}
	q, err := newQueues(policies, len(records))
	if err != nil {
		return nil, err
	}
	q.stride = unsafe.Sizeof(*new(R))
	if len(records) > 0 {
		first := unsafe.Pointer(&records[0])
		off := uintptr(unsafe.Pointer(link(&records[0]))) - uintptr(first)
		if off > q.stride-unsafe.Sizeof(Link{}) {
			return nil, fmt.Errorf("evict: the Link is not inside its record (offset %d of %d bytes)", off, q.stride)
		}
		q.base = unsafe.Add(first, off)
	}
	for s := range q.slots {
		if *q.at(s) != (Link{}) {
			return nil, fmt.Errorf("evict: slot %d's Link is not zero", s)
		}
	}
	return q, nil
}

func newPolicies(name string, levels int) ([]Policy, error) {
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
	return policies, nil
}

// newQueues returns the queues of policies over slots slots, without the
// slots' Links.
func newQueues(policies []Policy, slots int) (*Queues, error) {
	if len(policies) < 1 {
		return nil, fmt.Errorf("evict: no policy")
	}
	nq := policies[0].Queues()
	if nq < 1 || nq > MaxQueues {
		return nil, fmt.Errorf("evict: policy %q has %d queues, want 1..%d", policies[0].Name(), nq, MaxQueues)
	}
	if int64(slots)+int64(len(policies))*MaxQueues > 1<<31-1 {
		return nil, fmt.Errorf("evict: %d slots, want 0..2^31-1 with the queues' sentinels", slots)
	}
	q := &Queues{policies: policies, ghosts: make([]GhostPolicy, len(policies)), classes: make([]ClassPolicy, len(policies)), aged: make([]AgePolicy, len(policies)), nq: nq,
		sentinels: make([]Link, len(policies)*MaxQueues), slots: int32(slots),
		lens: make([]int, len(policies)*MaxQueues), levelLen: make([]int, len(policies))}
	for i, p := range policies {
		if p.Queues() != nq {
			return nil, fmt.Errorf("evict: policy %q of level %d has %d queues, level 0's %q has %d", p.Name(), i, p.Queues(), policies[0].Name(), nq)
		}
		if g, ok := p.(GhostPolicy); ok {
			g.Size(slots)
			q.ghosts[i] = g
		}
		if c, ok := p.(ClassPolicy); ok {
			q.classes[i] = c
		}
		if a, ok := p.(AgePolicy); ok {
			q.aged[i] = a
			if q.stamps == nil {
				q.stamps = make([]uint32, slots)
			}
		}
	}
	for i := range q.sentinels {
		s := q.slots + int32(i)
		q.sentinels[i] = Link{prev: s, next: s, queue: int32(i) + 1}
	}
	return q, nil
}

// at is the Link of slot or sentinel i.
func (q *Queues) at(i int32) *Link {
	if uint32(i) < uint32(q.slots) {
		return (*Link)(unsafe.Add(q.base, uintptr(i)*q.stride))
	}
	return &q.sentinels[i-q.slots]
}

// AllocBytes is what NewQueues(name, levels, slots) allocates over its
// life: a Link per slot and per queue (MaxQueues a level), for adaptive
// a push stamp per slot and each level's policy with its gap counts, and, for ARC and adaptive, each level's ghost
// history (a hash, a list byte and two index slots per ghost, taken at
// its first eviction; ARC keeps one ghost per slot, adaptive
// AdaptiveGhosts, each with an idle stamp too). An unknown name counts as
// LRU.
func AllocBytes(name string, levels, slots int) int64 {
	return int64(max(slots, 0))*SlotBytes + AllocBytesIn(name, levels, slots)
}

// AllocBytesIn is what NewQueuesIn allocates over its life: AllocBytes
// without the slots' Links (the records hold them).
func AllocBytesIn(name string, levels, slots int) int64 {
	n, l := int64(max(slots, 0)), int64(max(levels, 0))
	need := l * MaxQueues * SlotBytes
	if name == Adaptive {
		need += n*4 + l*int64(unsafe.Sizeof(adaptivePolicy{})) // the push stamps, each level's policy (its gap counts)
	}
	if name == ARC || name == Adaptive {
		g, per := n, int64(8+1) // ghosts: a hash and a list byte each
		if name == Adaptive {
			g, per = AdaptiveGhosts*n, 8+1+4 // and an idle stamp
		}
		idx := int64(2)
		for idx < 2*g {
			idx *= 2
		}
		need += l * (g*per + idx*4)
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
func (q *Queues) Queued(slot int32) bool { return q.at(slot).queue != 0 }

// Position returns the level and policy queue slot is on; ok is false for
// a slot on none.
func (q *Queues) Position(slot int32) (level, k int, ok bool) {
	i := q.at(slot).queue - 1
	if i < 0 {
		return 0, 0, false
	}
	return int(i >> queueShift), int(i & (MaxQueues - 1)), true
}

// Push puts slot, which is on no queue, at the tail of the queue level's
// policy picks for a page that served hits hits.
func (q *Queues) Push(slot int32, level int, hits uint32) {
	q.PushClass(slot, level, Class{Hits: hits})
}

// PushClass is Push for a page of class c: a [ClassPolicy] places it by
// the whole class, any other policy by c.Hits.
func (q *Queues) PushClass(slot int32, level int, c Class) {
	l := q.at(slot)
	if l.queue != 0 {
		panic(fmt.Sprintf("evict: slot %d pushed while on queue %d", slot, l.queue-1))
	}
	p := q.policies[level]
	var k int
	if cp := q.classes[level]; cp != nil {
		k = cp.EnqueueClass(c)
	} else {
		k = p.Enqueue(c.Hits)
	}
	if k < 0 || k >= q.nq {
		panic(fmt.Sprintf("evict: policy %q put slot %d on queue %d of %d", p.Name(), slot, k, q.nq))
	}
	if q.stamps != nil {
		q.stamps[slot] = q.pushes
		q.pushes++
	}
	i := level<<queueShift | k
	head := &q.sentinels[i]
	tail := head.prev
	*l = Link{prev: tail, next: q.slots + int32(i), queue: int32(i) + 1}
	q.at(tail).next = slot
	head.prev = slot
	q.lens[i]++
	q.levelLen[level]++
	q.n++
}

// Remove takes slot off its queue.
func (q *Queues) Remove(slot int32) {
	l := q.at(slot)
	i := l.queue - 1
	if i < 0 {
		panic(fmt.Sprintf("evict: slot %d removed while on no queue", slot))
	}
	q.at(l.prev).next = l.next
	q.at(l.next).prev = l.prev
	*l = Link{}
	q.lens[i]--
	q.levelLen[i>>queueShift]--
	q.n--
}

// Reuse takes slot off its queue because its page is used again (not
// evicted), and tells a [ClassPolicy] which queue it left.
func (q *Queues) Reuse(slot int32) {
	level, k, ok := q.Position(slot)
	q.Remove(slot)
	if ok {
		if cp := q.classes[level]; cp != nil {
			cp.Reused(k, q.age(slot))
		}
	}
}

// age is how many pushes ago slot was pushed (0 where no stamps are kept).
func (q *Queues) age(slot int32) uint32 {
	if q.stamps == nil {
		return 0
	}
	return q.pushes - q.stamps[slot]
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
		var k int
		if ap := q.aged[level]; ap != nil {
			for j := range q.nq {
				q.ages[j] = 0
				if lens[j] > 0 {
					q.ages[j] = q.pushes - q.stamps[q.sentinels[level<<queueShift|j].next]
				}
			}
			k = ap.DequeueAges(lens, q.ages[:q.nq])
		} else {
			k = q.policies[level].Dequeue(lens)
		}
		if k < 0 || k >= q.nq || lens[k] == 0 {
			panic(fmt.Sprintf("evict: policy %q picked queue %d of lengths %v", q.policies[level].Name(), k, lens))
		}
		return q.sentinels[level<<queueShift|k].next
	}
	return None
}

// Front returns the head (oldest) slot of queue k of level, or None.
func (q *Queues) Front(level, k int) int32 {
	s := q.sentinels[level<<queueShift|k].next
	if s >= q.slots {
		return None
	}
	return s
}

// Next returns the slot after slot on its queue, or None.
func (q *Queues) Next(slot int32) int32 {
	l := q.at(slot)
	if l.queue == 0 || l.next >= q.slots {
		return None
	}
	return l.next
}

// Evicted tells level's policy, if it is a [GhostPolicy], that the page
// with hash was evicted, with the hits it would be enqueued with.
func (q *Queues) Evicted(level int, hash uint64, hits uint32) {
	q.EvictedClass(level, hash, Class{Hits: hits})
}

// EvictedSlot is EvictedClass for the page of slot, called before the
// slot leaves its queue: c.Age is set to the pushes since slot became
// idle (0 for a slot on no queue, or where no stamps are kept).
func (q *Queues) EvictedSlot(slot int32, level int, hash uint64, c Class) {
	c.Age = 0
	if q.at(slot).queue != 0 {
		c.Age = q.age(slot)
	}
	q.EvictedClass(level, hash, c)
}

// EvictedClass is Evicted for a page of class c.
func (q *Queues) EvictedClass(level int, hash uint64, c Class) {
	if cp := q.classes[level]; cp != nil {
		cp.EvictedClass(hash, c)
	} else if g := q.ghosts[level]; g != nil {
		g.Evicted(hash, c.Hits)
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

// CheckSlot checks slot's own Link: on no queue it is zero; on a queue
// its neighbours link back to it.
func (q *Queues) CheckSlot(slot int32) error {
	l := *q.at(slot)
	if l.queue == 0 {
		if l != (Link{}) {
			return fmt.Errorf("evict: slot %d is on no queue but links %d and %d", slot, l.prev, l.next)
		}
		return nil
	}
	end := q.slots + int32(len(q.sentinels))
	if l.queue < 0 || int(l.queue) > len(q.lens) || l.prev < 0 || l.next < 0 || l.prev >= end || l.next >= end ||
		q.at(l.prev).next != slot || q.at(l.next).prev != slot {
		return fmt.Errorf("evict: slot %d on queue %d is not linked (prev %d, next %d)", slot, l.queue-1, l.prev, l.next)
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
		level, k := i>>queueShift, i&(MaxQueues-1)
		if q.sentinels[i].queue != int32(i)+1 {
			return fmt.Errorf("evict: sentinel of queue %d records queue %d", i, q.sentinels[i].queue-1)
		}
		n, prev := 0, head
		for s := q.sentinels[i].next; s != head; prev, s = s, q.at(s).next {
			if s < 0 || s >= q.slots || q.at(s).queue != int32(i)+1 || q.at(s).prev != prev {
				return fmt.Errorf("evict: queue %d of level %d broken at slot %d after %d slots", k, level, s, n)
			}
			if n++; n > int(q.slots) {
				return fmt.Errorf("evict: queue %d of level %d has a cycle", k, level)
			}
		}
		if q.sentinels[i].prev != prev || n != want {
			return fmt.Errorf("evict: queue %d of level %d holds %d slots, its length says %d", k, level, n, want)
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
		if q.at(s).queue != 0 {
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
