// Package pagedkv is the KV-cache manager an LLM serving engine embeds. Its
// [Manager] decides which pages of a fixed pool hold which tokens of which
// request, reuses the pages of cached prompt prefixes, evicts cached pages
// when the pool runs short, and hands the engine exactly the arrays
// FlashInfer's kernels take (kv_indptr, kv_page_indices, kv_last_page_len,
// qo_indptr, batch_indices, positions, and multi-level cascade arrays).
//
// # Use
//
// Methods are grouped by caller:
//
//   - per request: [Manager.Add] (returns the tokens served from the prefix
//     cache), [Manager.Extend], [Manager.Fork], [Manager.Preempt],
//     [Manager.Resume], [Manager.Release];
//   - per step: [Manager.Reserve] (all-or-nothing, evicting on demand)
//     returns a [Plan]; the engine performs Plan.Copies, appends the step's
//     K/V at Plan.BatchIndices/Positions, runs attention over
//     Plan.KVIndptr/KVPageIndices/KVLastPageLen (or Plan.Cascade), then
//     calls [Manager.Commit] with the sampled tokens, or [Manager.Abort];
//   - operations: [Manager.Stats], [Manager.Audit], [Manager.Evict],
//     [Manager.Pin], [Manager.Unpin].
//
// A step in code:
//
//	plan, err := m.Reserve(ids, ntokens) // errors.Is(err, pagedkv.ErrOutOfPages): preempt someone
//	engine.Copy(plan.Copies)
//	engine.Forward(plan)                 // append K/V, attention
//	err = m.Commit(sampled)
//
// # Composition
//
// The Manager owns an allocator.Allocator (pages and reference counts), a
// pagetable.Table (each request's pages, copy-on-write, window release,
// CSR export) and a prefixcache.Cache (the hash-chained, token-verified
// prefix tree with O(1) eviction). It holds them consistent: every page's
// reference count is the number of requests holding it plus one if it is
// cached, and every change of a cached page's holders is reported to the
// cache, which is how it knows which pages are idle. docs/manager.md
// describes the policies, the metrics, and how they avoid the known bugs of
// other engines' KV managers.
//
// # Invariants
//
//   - A running request holds exactly ceil((computed+reserved-start)/PageSize)
//     pages, where start > 0 only with a sliding window; a preempted one
//     holds none.
//   - Every page is free, or held by requests and/or the cache; its
//     reference count says by how many. Free + used + evictable + pinned
//     idle pages == total pages.
//   - A request's cached prefix (its chain) holds its own tokens.
//   - A failed call changes nothing.
//
// [Manager.Audit] checks all of these.
//
// # Failures
//
// Predictable conditions return errors that work with errors.Is:
// [ErrOutOfPages] from Reserve, [ErrUnknownRequest], [ErrRequestExists],
// [ErrPreempted], [ErrStepPending], [ErrBadArgument] naming the value and
// the request index. An internal inconsistency (a bug) panics with the
// numbers needed to debug it.
//
// # Concurrency
//
// A Manager is not safe for concurrent use: it belongs to the engine's
// scheduler goroutine. [Manager.Stats] alone may be called from any
// goroutine at any time (a sequence lock over typed atomics).
package pagedkv
