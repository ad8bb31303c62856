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
//     [Manager.Pin], [Manager.Unpin], and with tiers [Manager.TierCopies]
//     and [Manager.CompleteTierCopies].
//
// A step in code:
//
//	plan, err := m.Reserve(ids, ntokens) // errors.Is(err, pagedkv.ErrOutOfPages): preempt someone
//	engine.Copy(plan.Copies)
//	engine.Forward(plan)                 // append K/V, attention
//	err = m.Commit(sampled)
//
// # The step protocol
//
// A step is Reserve (or ReserveSpec), the engine's work, then exactly one of
// Commit (CommitSpec) or Abort. Reserve validates the whole batch, counts
// the pages it needs (new pages and copy-on-write copies), evicts idle
// cached pages if the pool is short, and only then changes anything, so an
// ErrOutOfPages leaves the Manager as it was. Between Reserve and its
// Commit or Abort the step is pending: per-request calls fail with
// [ErrStepPending], and the Plan's slices stay valid. Commit appends the
// sampled tokens, publishes the pages the step filled to the prefix cache
// and releases what a window no longer reads; Abort undoes the reservation.
// Reserve, Commit and the Plan they build allocate nothing once the
// Manager's buffers have grown to the batch.
//
// # Speculative steps
//
// [Manager.ReserveSpec] takes, per request, draft tokens after its known
// tokens; the plan gives the draft rows like any others (Plan.Drafts says
// how many). [Manager.CommitSpec] keeps each request's accepted drafts and
// its sampled token and leaves exactly the state a plain step of the known
// tokens and the accepted drafts would have (page tables up to page names,
// the prefix cache, Stats but for the draft counters); only eviction done
// for the rejected drafts' pages stays. See docs/manager.md.
//
// # Hybrid models
//
// A model whose layers mix attention kinds (gpt-oss: sliding and full;
// Gemma 3: five sliding per full; Llama 4: chunked local and full;
// DeepSeek: MLA) uses a [HybridManager] ([NewHybrid]) instead: one group
// per kind ([LayerGroup], rules in package layergroup), every group with
// its own page table and prefix cache on one shared page pool and page
// size. Every group holds the same requests and tokens; each keeps only the
// pages its attention still reads. Admission serves the longest prefix
// every group's cache holds (the minimum over groups); a step is one page
// budget over every group, all or nothing, and its [HybridPlan] has the
// pool-wide copies and one [Plan] per group (its page table arrays, its
// window_left, and for a chunked group the per-chunk Attn arrays).
// HybridManager has the per-request, step, speculative, Pin/Unpin, Evict,
// tier, Stats and Audit calls of Manager, and package metrics exports its
// per-group figures (metrics.HybridCollector).
//
// # Tiers
//
// With [Config.Tiers] a Manager keeps evicted prefix pages below the
// device pool: in host memory, and through a tier.RemoteStore on a local
// disk or a shared Redis. Eviction plans offload copies and a prefix hit on
// a lower tier plans onload copies; the engine takes them with
// [Manager.TierCopies], runs them asynchronously and reports them with
// [Manager.CompleteTierCopies], and a request whose onloads are in flight
// ([Manager.Loading]) takes no step. A HybridManager's groups share one
// host tier and one remote store; each group's pages enter them under a
// digest chain of its own (the namespace's root followed by the group's
// index and spec), so no group reads another's, and admission serves the
// prefix every group can serve from its cache and then from the tiers.
// See docs/tiers.md.
//
// # One core for every group
//
// What spans the layer groups of one page pool is one unexported type,
// core: admission (each group matches its cache, then the tiers continue
// the match; every group gets the longest prefix all of them serve, with
// one page budget for the onloads), a step (the first group validates the
// batch and resolves its requests, each later group follows the records of
// the group before, one page budget covers every group's pages with
// eviction across the groups' caches, then every group applies its part
// and its plan shares the first group's token arrays), commit (checked
// once, recorded in every group), abort, eviction, the tier copies and the
// pool-wide audit. A dense Manager is the core of one group, itself; a
// HybridManager's core has one group per LayerGroup, each a Manager that
// knows only its own page table, cache and records.
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
