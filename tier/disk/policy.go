package disk

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

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

// Retention: the queues have a level per retention level (each with its
// own instance of the policy), a slot joins its page's level, and a victim
// comes from the lowest level that holds a slot (evict.Queues), the
// device's eviction rule (docs/retention.md). A slot whose level lapses
// moves to the tail of level 0 (Relevel). The ghosts a level's policy
// keeps are of the pages evicted from that level.
//
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
// with levels retention levels over slots slots.
func newQueues(name string, levels, slots int) (*queues, error) {
	q, err := evict.NewQueues(name, levels, slots)
	if err != nil {
		return nil, err
	}
	return &queues{q: q, hits: make([]uint32, slots), returned: make([]bool, slots)}, nil
}

// newQueuesOf returns the queues of policy p (fresh) over slots slots,
// one level.
func newQueuesOf(p evict.Policy, slots int) (*queues, error) {
	q, err := evict.NewQueuesOf([]evict.Policy{p}, slots)
	if err != nil {
		return nil, err
	}
	return &queues{q: q, hits: make([]uint32, slots), returned: make([]bool, slots)}, nil
}

// Name is the policy's name.
func (q *queues) Name() string { return q.q.Name() }

// Added: slot now holds a servable page of level found by the restart
// scan.
func (q *queues) Added(slot, level int) { q.track(slot, level, false) }

// Written: slot now holds page d of level, just written.
func (q *queues) Written(slot, level int, d tier.Digest) {
	q.track(slot, level, q.q.Returned(level, ghostHash(d)))
}

func (q *queues) track(slot, level int, returned bool) {
	if q.q.Queued(int32(slot)) {
		panic(fmt.Sprintf("disk: eviction: slot %d added twice", slot))
	}
	q.hits[slot], q.returned[slot] = 0, returned
	q.q.Push(int32(slot), level, q.enqueueHits(slot))
}

// Evict: the page d in slot is overwritten (Removed, and its level's
// ghosts told).
func (q *queues) Evict(slot int, d tier.Digest) {
	level, _, _ := q.q.Position(int32(slot))
	q.q.Evicted(level, ghostHash(d), q.enqueueHits(slot))
	q.Removed(slot)
}

// Relevel moves tracked slot to the tail of level (its retention lapsed).
func (q *queues) Relevel(slot, level int) {
	q.q.Remove(int32(slot))
	q.q.Push(int32(slot), level, q.enqueueHits(slot))
}

// Level is tracked slot's level.
func (q *queues) Level(slot int) int {
	level, _, _ := q.q.Position(int32(slot))
	return level
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
	level, _, _ := q.q.Position(int32(slot))
	q.q.Remove(int32(slot))
	if q.hits[slot] < math.MaxUint32 {
		q.hits[slot]++
	}
	q.q.Push(int32(slot), level, q.enqueueHits(slot))
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

// now reads the store's wall clock.
func (s *Store) now() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock()
	}
	return time.Now()
}

// advance lapses, earliest deadline first (ties: lowest slot), the ready
// slots whose deadline the wall clock has reached: each drops to level 0
// (the tail of its queue), keeping its hint. It returns the time it read.
// s.mu is held.
func (s *Store) advance() time.Time {
	now := s.now()
	for {
		slot, ok := s.lapses.Due(time.Duration(now.UnixNano()))
		if !ok {
			return now
		}
		s.lapses.Remove(slot)
		s.slots[slot].ret = tier.ValueRetention{Hint: s.slots[slot].ret.Hint}
		s.policy.Relevel(int(slot), 0)
	}
}

// timeRetention puts ready slot's lapse on the heap (a level already
// lapsed at now drops to 0 first), restarting the count at now when used
// (a served page), and returns the slot's level. s.mu is held.
func (s *Store) timeRetention(slot int, now time.Time, used bool) int {
	e := &s.slots[slot]
	if e.ret.Duration == 0 {
		return int(e.ret.Priority)
	}
	if used {
		e.ret.Deadline = now.UnixNano() + int64(e.ret.Duration)
	}
	if e.ret.Deadline <= now.UnixNano() {
		s.lapses.Remove(int32(slot))
		e.ret = tier.ValueRetention{Hint: e.ret.Hint}
		if s.policy.tracked(slot) {
			s.policy.Relevel(slot, 0)
		}
		return 0
	}
	s.lapses.Set(int32(slot), time.Duration(e.ret.Deadline))
	return int(e.ret.Priority)
}
