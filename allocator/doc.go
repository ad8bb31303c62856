// Package allocator owns a fixed pool of KV-cache pages and hands them out by
// ID. It knows nothing of sequences or tokens: a page is an index into the
// engine's paged K/V tensors (FlashInfer's page_idx), and this package only
// records which pages are free and how many holders each allocated page has.
//
// # Representation and costs
//
// The pool holds [Config.NumPages] pages, 1 <= NumPages <= [MaxPages] (2^24).
// Free pages sit on a LIFO stack of page IDs, so a freed page is the next one
// handed out (its cache lines and TLB entries are likely still warm).
// Each page has an int32 reference count: 0 means free, n >= 1 means n holders.
// [Allocator.Alloc], [Allocator.Retain] and [Allocator.Release] cost O(1) per
// page plus one lock acquisition per call, so batching pages into one call is
// the fast path. Memory is 8 bytes per page (stack slot + count).
//
// For one page at a time, a [Cache] (Allocator.NewCache) is an owner-local
// front holding up to 32 pages allocated to it: its Alloc takes no lock
// while it has pages and its Release takes one, so an alloc+free pair costs
// one lock round trip instead of two.
//
// # Ownership
//
// Every page returned by Alloc has one holder: the caller. Each Retain adds a
// holder; each Release removes one, and the release that removes the last
// holder returns the page to the pool. A page table, a prefix cache and a
// forked sequence are typical holders of the same page.
//
// # Failures
//
// Running out of pages is predictable: Alloc returns an error wrapping
// [ErrOutOfPages]. Misuse (releasing a free page, i.e. a double free,
// retaining or releasing a page that was never allocated, or an ID outside
// the pool) returns an error wrapping [ErrBadPage] that names the page and its
// reference count. Either way the call changes nothing: all pages of a call are
// validated before any count changes.
//
// # Invariants
//
//   - Every page ID in [0, NumPages) is either on the free stack exactly once
//     with reference count 0, or off it with reference count >= 1.
//   - Free + InUse == Total, and Shared counts the pages with count >= 2.
//
// [Allocator.CheckInvariants] verifies all of this in O(NumPages). In builds
// with the invariants tag or -race (see internal/invariants), each mutating
// call also checks the counters and the pages it touched.
//
// # Concurrency
//
// An [Allocator] is safe for concurrent use by multiple goroutines: every
// method takes one internal mutex for the duration of the call. A [Cache]
// belongs to one goroutine at a time; the pages it holds count as in use.
package allocator
