package disk

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/tier"
)

// Eviction: when no slot is free, the writer overwrites the victim of an
// evict policy ([Config.Eviction]: evict's names, the implementation the
// prefix cache uses too). The policy only says which queue a slot joins
// and which queue gives up the next victim; an evict.Queues of one level
// keeps the store's slots on those queues.
//
// The disk tier's contract with the policy, as a prefix cache's: a slot
// joins a queue (with the hits its page served since it was written) when
// its page is written or found by the restart scan (oldest sequence first,
// hits 0: a restart forgets hits), and again each time it is served
// (leaving its queue first, its hits one more); a victim is the head of
// the queue the policy picks. A policy that also keeps a ghost history of
// evicted pages (an evict.GhostPolicy: ARC) is told the store's capacity,
// each page evicted (its hash and the hits it would be enqueued with) and
// each page written; a page it reports as returned counts as having
// served a hit until it serves one. A page's hash is the first 8 bytes of
// its digest, little-endian.
func ghostHash(d tier.Digest) uint64 { return binary.LittleEndian.Uint64(d[:8]) }

// queues are the store's slots holding servable pages on the policy's
// queues, with what the policy is told of each: its hits and whether the
// policy remembered its page when it was written. Allocated once (17 bytes
// a slot); no call allocates. Called with the store's lock held.
type queues struct {
	q        *evict.Queues
	hits     []uint32 // per slot, the hits its page served since written
	returned []bool   // per slot, whether the policy knew its page when written
}

// newQueues returns the queues of the policy named name ("" is evict.LRU)
// over slots slots.
func newQueues(name string, slots int) (*queues, error) {
	p, err := evict.New(name)
	if err != nil {
		return nil, err
	}
	return newQueuesOf(p, slots)
}

// newQueuesOf returns the queues of policy p (fresh) over slots slots.
func newQueuesOf(p evict.Policy, slots int) (*queues, error) {
	q, err := evict.NewQueuesOf([]evict.Policy{p}, slots)
	if err != nil {
		return nil, err
	}
	return &queues{q: q, hits: make([]uint32, slots), returned: make([]bool, slots)}, nil
}

// Name is the policy's name.
func (q *queues) Name() string { return q.q.Name() }

// Added: slot now holds a servable page found by the restart scan.
func (q *queues) Added(slot int) { q.track(slot, false) }

// Written: slot now holds page d, just written.
func (q *queues) Written(slot int, d tier.Digest) {
	q.track(slot, q.q.Returned(0, ghostHash(d)))
}

func (q *queues) track(slot int, returned bool) {
	if q.q.Queued(int32(slot)) {
		panic(fmt.Sprintf("disk: eviction: slot %d added twice", slot))
	}
	q.hits[slot], q.returned[slot] = 0, returned
	q.q.Push(int32(slot), 0, q.enqueueHits(slot))
}

// Evict: the page d in slot is overwritten (Removed, and the policy's
// ghosts told).
func (q *queues) Evict(slot int, d tier.Digest) {
	q.q.Evicted(0, ghostHash(d), q.enqueueHits(slot))
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
	if !q.q.Queued(int32(slot)) {
		panic(fmt.Sprintf("disk: eviction: slot %d used but not tracked", slot))
	}
	q.q.Remove(int32(slot))
	if q.hits[slot] < math.MaxUint32 {
		q.hits[slot]++
	}
	q.q.Push(int32(slot), 0, q.enqueueHits(slot))
}

// Removed: slot no longer holds a servable page.
func (q *queues) Removed(slot int) {
	if !q.q.Queued(int32(slot)) {
		panic(fmt.Sprintf("disk: eviction: slot %d removed but not tracked", slot))
	}
	q.q.Remove(int32(slot))
}

// Victim returns the slot to overwrite next, without removing it (the
// store calls Removed), or false when no slot is tracked.
func (q *queues) Victim() (int, bool) {
	v := q.q.Victim()
	return int(v), v != evict.None
}

// Len is the number of slots tracked.
func (q *queues) Len() int { return q.q.Len() }

// checkInvariants checks the queues: together they hold exactly the
// tracked slots, each once, with consistent links and lengths.
func (q *queues) checkInvariants() error {
	if err := q.q.CheckInvariants(); err != nil {
		return fmt.Errorf("disk: eviction: %w", err)
	}
	return nil
}

// tracked reports whether slot is on a queue.
func (q *queues) tracked(slot int) bool { return q.q.Queued(int32(slot)) }
