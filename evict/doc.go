// Package evict owns eviction order: the policies that decide which slot
// goes next (LRU, SLRU, SRRIP, ARC, adaptive; [New] by name), the
// continuation hints a [ClassPolicy] reads, [Shadow] (the live miss-ratio
// curve: sampled LRU shadows of a cache) and [Queues], the
// intrusive FIFO queues over int32 slots that every page store of the
// module keeps its evictable slots on (the prefix cache, the host tier, the
// disk tier). A slot is whatever the container numbers 0..n-1: a device
// page, a host page, a segment-file slot.
//
// # Representation
//
// A [Policy] holds no slots. It only says which of its few queues a slot
// joins when it becomes evictable (given the hits its page served) and
// which non-empty queue gives up the next victim (given the queues'
// lengths). [Queues] does the list work: one doubly linked list per
// (priority level, policy queue), threaded through one [Link] per slot,
// with one sentinel Link per list. The Links are an array of the Queues'
// own ([NewQueues]) or a field of the container's own per-slot records
// ([NewQueuesIn]: the prefix cache's page nodes, the host tier's entries),
// so that unlinking a victim touches the record eviction reads anyway.
// So a push, a removal and a victim are O(1) (O(levels + queues) for a
// victim), no policy scans or sorts, and nothing allocates after the
// constructor. For an [AgePolicy] (adaptive) the Queues also stamp each
// slot with its push number, so the policy sees each queue head's age.
//
// # Invariants
//
//   - A slot is on at most one queue; a queued slot's link names its
//     queue, and its neighbours link back to it.
//   - Each queue's length, each level's length and the total equal what
//     the lists hold.
//   - A victim is the head (oldest) slot of the queue the lowest non-empty
//     level's policy picks; that queue is non-empty. Each queue is in
//     push order, so its head is its oldest slot.
//   - Adaptive: while a bypassed class's queue is non-empty (and no
//     hinted segment is over its target), the victim is the oldest head
//     of the bypassed classes; with no class bypassed and every
//     multiplier 1 its order is LRU's.
//   - A [Shadow]'s segments hold, top down, the most recent keys: segment
//     k at most its room, the entries in all of them at most the largest
//     shadow's size; at rate 1 each shadow's hits are an LRU cache's.
//
// [Queues.CheckInvariants] checks them all.
//
// # Concurrency
//
// Neither a Policy nor a Queues is safe for concurrent use: each belongs to
// its container, which serializes calls (a goroutine or a lock).
package evict
