package disk

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/prefixcache"
)

// Eviction: when no slot is free, the writer overwrites the victim of a
// prefixcache eviction policy ([Config.Eviction]: the names and the
// semantics of prefixcache.Config.Eviction, the same implementation).
// The policy only says which queue a slot joins and which queue gives up
// the next victim; queues keeps the store's slots on those queues.
//
// The disk tier's contract with the policy, as a prefix cache's: a slot
// joins a queue (Enqueue, with the hits its page served since it was
// written) when its page is written or found by the restart scan (oldest
// sequence first, hits 0: a restart forgets hits), and again each time it
// is served (leaving its queue first, its hits one more); a victim is the
// head of the queue Dequeue picks.

// notQueued marks a slot on no queue.
const notQueued = math.MaxUint8

// queues are a policy's FIFO queues of the slots holding servable pages:
// doubly linked lists over slot numbers, with queue q's sentinel at index
// slots+q. Allocated once (13 bytes a slot); no call allocates. Called with
// the store's lock held.
type queues struct {
	policy     prefixcache.Policy
	prev, next []int32
	queue      []uint8  // per slot, its queue or notQueued
	hits       []uint32 // per slot, the hits its page served since written
	lens       []int    // per queue, its length
	n          int
}

// newQueues returns the queues of the policy named name ("" is
// prefixcache.PolicyLRU) over slots slots.
func newQueues(name string, slots int) (*queues, error) {
	p, err := prefixcache.NewPolicy(name)
	if err != nil {
		return nil, err
	}
	nq := p.Queues()
	if nq < 1 || nq > prefixcache.MaxQueues {
		return nil, fmt.Errorf("policy %q has %d queues, want 1..%d", p.Name(), nq, prefixcache.MaxQueues)
	}
	q := &queues{policy: p, prev: make([]int32, slots+nq), next: make([]int32, slots+nq),
		queue: make([]uint8, slots), hits: make([]uint32, slots), lens: make([]int, nq)}
	for i := range q.queue {
		q.queue[i] = notQueued
	}
	for k := range nq {
		s := q.sentinel(k)
		q.prev[s], q.next[s] = s, s
	}
	return q, nil
}

func (q *queues) sentinel(k int) int32 { return int32(len(q.queue) + k) }

// Added: slot now holds a servable page (just written, or found by the
// restart scan).
func (q *queues) Added(slot int) {
	if q.queue[slot] != notQueued {
		panic(fmt.Sprintf("disk: eviction: slot %d added twice", slot))
	}
	q.hits[slot] = 0
	q.n++
	q.enqueue(slot)
}

// Used: the page in slot was served.
func (q *queues) Used(slot int) {
	if q.queue[slot] == notQueued {
		panic(fmt.Sprintf("disk: eviction: slot %d used but not tracked", slot))
	}
	q.unlink(slot)
	if q.hits[slot] < math.MaxUint32 {
		q.hits[slot]++
	}
	q.enqueue(slot)
}

// Removed: slot no longer holds a servable page.
func (q *queues) Removed(slot int) {
	if q.queue[slot] == notQueued {
		panic(fmt.Sprintf("disk: eviction: slot %d removed but not tracked", slot))
	}
	q.unlink(slot)
	q.n--
}

// Victim returns the slot to overwrite next, without removing it (the
// store calls Removed), or false when no slot is tracked.
func (q *queues) Victim() (int, bool) {
	if q.n == 0 {
		return 0, false
	}
	k := q.policy.Dequeue(q.lens)
	if k < 0 || k >= len(q.lens) || q.lens[k] == 0 {
		panic(fmt.Sprintf("disk: eviction: policy %q picked queue %d of lengths %v", q.policy.Name(), k, q.lens))
	}
	return int(q.next[q.sentinel(k)]), true
}

// Len is the number of slots tracked.
func (q *queues) Len() int { return q.n }

// enqueue puts slot at the tail of the queue the policy picks.
func (q *queues) enqueue(slot int) {
	k := q.policy.Enqueue(q.hits[slot])
	if k < 0 || k >= len(q.lens) {
		panic(fmt.Sprintf("disk: eviction: policy %q put slot %d on queue %d of %d", q.policy.Name(), slot, k, len(q.lens)))
	}
	s, head := int32(slot), q.sentinel(k)
	tail := q.prev[head]
	q.prev[s], q.next[s] = tail, head
	q.next[tail], q.prev[head] = s, s
	q.queue[slot] = uint8(k)
	q.lens[k]++
}

func (q *queues) unlink(slot int) {
	s := int32(slot)
	q.next[q.prev[s]], q.prev[q.next[s]] = q.next[s], q.prev[s]
	q.lens[q.queue[slot]]--
	q.queue[slot] = notQueued
}

// checkInvariants walks every queue: together they hold exactly the
// tracked slots, each once, on the queue it records, with consistent
// links and lengths.
func (q *queues) checkInvariants() error {
	seen := 0
	for k := range q.lens {
		head, n := q.sentinel(k), 0
		for s, prev := q.next[head], head; s != head; prev, s = s, q.next[s] {
			if s < 0 || int(s) >= len(q.queue) || int(q.queue[s]) != k || q.prev[s] != prev || n > q.n {
				return fmt.Errorf("disk: eviction queue %d broken at slot %d after %d slots", k, s, n)
			}
			n++
		}
		if n != q.lens[k] {
			return fmt.Errorf("disk: eviction queue %d holds %d slots, its length says %d", k, n, q.lens[k])
		}
		seen += n
	}
	if seen != q.n {
		return fmt.Errorf("disk: eviction queues hold %d slots, the counter says %d", seen, q.n)
	}
	return nil
}

// tracked reports whether slot is on a queue.
func (q *queues) tracked(slot int) bool { return q.queue[slot] != notQueued }
