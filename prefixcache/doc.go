// Package prefixcache owns the prefix cache of a paged KV cache: which full
// pages hold which prompt prefixes, so that a new request whose prompt starts
// like an earlier one reuses those pages instead of recomputing them, and
// which cached pages to evict when the pool runs short.
//
// # Representation
//
// The cache is a tree of pages. A cached page p holds PageSize tokens and
// names its parent, the page before it in the prefix (none at depth 0, where
// the namespace is recorded instead). Nodes live in one array indexed by
// [PageID], so there is nothing to allocate per page; the tokens of every
// cached page are kept in a flat array indexed the same way.
//
// Lookups go through a hash chained over pages:
//
//	h_{-1} = hash(canonical namespace encoding)
//	h_d    = Hash(h_{d-1}, tokens of page d)
//
// A map from h_d to the pages with that hash gives candidates, and a
// candidate is a hit only if its parent is the page matched at depth d-1 and
// its PageSize tokens equal the prompt's, token by token (and, at depth 0,
// its namespace equals the request's byte for byte). The match at depth d
// therefore proves the whole prefix [0, (d+1)*PageSize) equal: a hash
// collision, even one forced on every page, can cost time but never serve
// another prefix's K/V. The default hash is a seeded multiply-mix of four
// tokens per step ([Config.Hash] replaces it in tests).
//
// Namespaces (tenant, LoRA adapter, salt) are encoded with a tag and a length
// per field, so no two different namespaces share an encoding, and are
// compared exactly; two namespaces never share a page.
//
// # Ownership
//
// The cache holds one reference ([Refs], normally the allocator) on every
// cached page: [Cache.Publish] retains, eviction releases. Requests hold
// their own references (through the page table). A cached page is idle when
// the cache is its only holder (reference count 1). Reference counts change
// outside the cache, so the caller reports every change with
// [Cache.Recheck]; [Cache.CheckInvariants] re-reads every count and reports a
// missed Recheck.
//
// # Eviction
//
// Idle pages without pins sit on intrusive doubly linked queues (an
// evict.Queues whose links live in the page nodes), a few per priority
// level, in the order they became idle (Recheck order); the level's
// evict.Policy ([Config.Eviction]: LRU, one queue, by default) says which
// queue a page joins and which queue gives up the next victim, and
// eviction takes that queue's head in the lowest non-empty level: O(1), no
// scan, no heap. A
// victim goes with its whole subtree, deepest first, so no cached page is
// ever left behind a missing parent. Releasing a request's pages deepest
// first makes every prefix's later pages idle before its earlier ones, so
// with full attention the victim is a leaf; [Counters.InnerVictims] counts
// the exceptions (a sliding window releases a prefix's early pages while the
// request still holds the later ones; a duplicate page leaves the cached
// original idle under a busy child). Pages in a cut subtree that requests
// still hold stay with them; only the cache's reference goes.
//
// Pins ([Cache.Pin]) take a whole cached prefix off the lists until
// [Cache.Unpin]; [Config.MaxPinnedPages] and [Config.PinBudget] cap them.
// Priorities are raised, never lowered, while a page is cached
// ([Cache.Raise]), except by retention: [Cache.Retain] sets a page's level
// and, with a lapse, drops it to level 0 once the page has stayed idle
// that long. A TTL pin ([Cache.PinFor]) lapses by itself, and a hit on its
// last page refreshes it. The cache reads no clock: its owner tells it the
// time ([Cache.Advance]), which lapses what is due, earliest deadline first
// (an indexed heap: O(log n) per timed page or pin, nothing allocated once
// sized). See docs/retention.md.
//
// # Invariants
//
//   - A page is cached at most once; its parent is cached; no two cached
//     pages have the same parent, tokens and (at depth 0) namespace.
//   - Each cached page's stored hash equals Hash(parent's hash, its tokens).
//   - A cached page is idle iff its reference count is 1, and is on exactly
//     one eviction queue (of its priority's level) iff it is idle and
//     unpinned.
//   - pins(parent) >= pins(child): a pin covers a path from the root; the
//     pinned pages are within MaxPinnedPages and the pin budget.
//   - A page is on the lapse heap iff it is cached, idle and has a lapse;
//     every lapse and TTL-pin deadline is after the cache's time and at most
//     its lapse or TTL after it (Advance took everything due).
//   - Counters (cached, idle, idle-pinned, pinned) equal what they count.
//
// In builds with the invariants tag or -race, every mutation checks the
// nodes it touched.
//
// # Failures
//
// Predictable conditions return errors that work with errors.Is:
// [ErrStaleHandle] (the parent was evicted), [ErrPinLimit] (naming the
// limit or budget and the figures), [ErrNotCached],
// [ErrUnknownPin]. Misuse returns [ErrBadArgument] or [ErrPageCached]. A
// failed call changes nothing.
//
// # Concurrency
//
// A [Cache] is not safe for concurrent use; it belongs to the engine's
// scheduler goroutine, like the page table it serves. Its Refs may be shared
// (the allocator is safe for concurrent use).
//
// See docs/manager.md for the policies and how they avoid the known bugs of
// other engines' prefix caches.
package prefixcache
