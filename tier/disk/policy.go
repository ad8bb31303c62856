package disk

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
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
// head of the queue Dequeue picks. A policy that also keeps a ghost history
// of evicted pages (a prefixcache.GhostPolicy) is told the store's capacity, each page
// evicted and each page written.

// A policy that keeps a ghost history is a prefixcache.GhostPolicy (its
// adaptive replacement policy). The store calls Size once with its slot
// count, Evicted for each page it overwrites (its hash and the hits it
// would be enqueued with), and Returned for each page it writes; a page
// Returned reports true for counts as having served a hit until it serves
// one. A page's hash is the first 8 bytes of its digest, little-endian.
func ghostHash(d tier.Digest) uint64 { return binary.LittleEndian.Uint64(d[:8]) }

// notQueued marks a slot on no queue.
const notQueued = math.MaxUint8

// queues are a policy's FIFO queues of the slots holding servable pages:
// doubly linked lists over slot numbers, with queue q's sentinel at index
// slots+q. Allocated once (13 bytes a slot); no call allocates. Called with
// the store's lock held.
type queues struct {
	policy     prefixcache.Policy
	ghost      prefixcache.GhostPolicy // policy, if it keeps ghosts; else nil
	prev, next []int32
	queue      []uint8  // per slot, its queue or notQueued
	hits       []uint32 // per slot, the hits its page served since written
	returned   []bool   // per slot, whether ghost knew its page when written
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
	return newQueuesOf(p, slots)
}

// newQueuesOf returns the queues of policy p (fresh) over slots slots.
func newQueuesOf(p prefixcache.Policy, slots int) (*queues, error) {
	nq := p.Queues()
	if nq < 1 || nq > prefixcache.MaxQueues {
		return nil, fmt.Errorf("policy %q has %d queues, want 1..%d", p.Name(), nq, prefixcache.MaxQueues)
	}
	q := &queues{policy: p, prev: make([]int32, slots+nq), next: make([]int32, slots+nq),
		queue: make([]uint8, slots), hits: make([]uint32, slots), returned: make([]bool, slots), lens: make([]int, nq)}
	if g, ok := p.(prefixcache.GhostPolicy); ok {
		g.Size(slots)
		q.ghost = g
	}
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

// Added: slot now holds a servable page found by the restart scan.
func (q *queues) Added(slot int) { q.track(slot, false) }

// Written: slot now holds page d, just written.
func (q *queues) Written(slot int, d tier.Digest) {
	q.track(slot, q.ghost != nil && q.ghost.Returned(ghostHash(d)))
}

func (q *queues) track(slot int, returned bool) {
	if q.queue[slot] != notQueued {
		panic(fmt.Sprintf("disk: eviction: slot %d added twice", slot))
	}
	q.hits[slot], q.returned[slot] = 0, returned
	q.n++
	q.enqueue(slot)
}

// Evict: the page d in slot is overwritten (Removed, and the policy's
// ghosts told).
func (q *queues) Evict(slot int, d tier.Digest) {
	if q.ghost != nil {
		q.ghost.Evicted(ghostHash(d), q.enqueueHits(slot))
	}
	q.Removed(slot)
}

// enqueueHits is the hits slot joins a queue with: its own, or one for a
// page its policy remembered when it was written, until it serves one.
func (q *queues) enqueueHits(slot int) uint32 {
	if q.hits[slot] == 0 && q.returned[slot] {
		return 1
	}
	return q.hits[slot]
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
	k := q.policy.Enqueue(q.enqueueHits(slot))
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
