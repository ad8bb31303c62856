// Package host owns the host tier: a fixed pool of host (CPU) pages below the
// device page pool, with its own allocator, an index from page digest to host
// page, and an LRU over the pages that can be reclaimed (evict's LRU policy
// on an evict.Queues over host page IDs).
//
// A host page is free, writing (claimed by an offload copy the engine has not
// finished: indexed, so the same page is not offloaded twice, but never
// served), or ready (its bytes are valid and it can be served). A ready page
// with readers (onload copies in flight) is not reclaimable; a ready page
// without readers sits on the LRU list, and [Pool.Claim] reclaims the least
// recently used one when no page is free. A writing page is never reclaimed:
// the engine may still be writing it.
//
// Every entry records its digest, its parent's digest and its tokens;
// [Pool.Lookup] serves a digest only if all three equal the caller's (see
// package tier), so a page of another prefix is never served.
//
// The pool optionally owns the pages' bytes ([Config.PageBytes]): the engine
// copies into and out of [Pool.Page], and a remote tier reads and fills them.
// The bookkeeping never touches the bytes.
//
// # Invariants
//
//   - free pages are on the free stack exactly once and in no index;
//   - writing and ready pages are indexed under their digest, one page per
//     digest;
//   - a page is on the LRU list iff it is ready and has no readers, on
//     the queue of its own level;
//   - a page is on the lapse heap iff it is not free and has a duration,
//     its deadline after the pool's time and at most a duration after it;
//   - the counters equal what they count.
//
// [Pool.CheckInvariants] checks them all; builds with the invariants tag or
// -race check touched pages after every mutation.
//
// # Concurrency
//
// A Pool is not safe for concurrent use: it belongs to the Manager's
// goroutine. The engine may read and write [Pool.Page] of pages whose copies
// are in flight from any goroutine (the Manager does not touch them).
package host
