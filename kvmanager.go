package pagedkv

import "time"

// KVManager is what a consumer calls of a KV-cache manager, dense or
// hybrid: [Manager] and [HybridManager] both implement it, so one value
// drives either (the simulator, the C ABI and the replay hold one). A
// Manager is a KVManager of one layer group (a full attention group, or a
// sliding one with Config.WindowTokens).
//
// Each method is the facade's method of that name; the few that differ
// between the facades have a form here that is the same for both:
// ReserveStep returns every group's plan, GroupPages names the group, and
// PoolStats is the pool-wide part of the Stats.
type KVManager interface {
	// The pool and its groups.
	PageSize() int
	NumPages() int
	NumGroups() int
	Group(g int) LayerGroup

	// Per request.
	Add(id RequestID, req Request) (matchedTokens int, err error)
	Resume(id RequestID) (matchedTokens int, err error)
	Extend(id RequestID, tokens ...int32) error
	Fork(parent, child RequestID) error
	Truncate(id RequestID, n int) error
	Preempt(id RequestID) error
	Release(id RequestID) error
	Has(id RequestID) bool
	Running(id RequestID) bool
	Computed(id RequestID) int
	Tokens(id RequestID) []int32
	// CacheUsage returns request id's cache reads and writes, kept after
	// Release until read ([Manager.CacheUsage]).
	CacheUsage(id RequestID) (u CacheUsage, ok bool)
	// GroupPages returns the pages request id holds in group g and the
	// first token they hold ([Manager.Pages] for g == 0 of a Manager).
	GroupPages(g int, id RequestID) (pages []PageID, start int)

	// Per step. ReserveStep is ReserveSpec returning a [HybridPlan] for
	// both facades (drafts nil: Reserve): one Plan per group, a
	// Manager's Groups[0] being the Plan its Reserve returns.
	ReserveStep(ids []RequestID, ntokens []int32, drafts [][]int32) (*HybridPlan, error)
	Commit(sampled []int32) error
	CommitSpec(accepted, sampled []int32) error
	Abort() error
	Pending() bool

	// The cache.
	Evict(npages int) (freed int)
	Pin(ns Namespace, tokens []int32) (id PinID, pinnedTokens int, err error)
	PinFor(ns Namespace, tokens []int32, ttl time.Duration) (id PinID, pinnedTokens int, err error)
	Unpin(id PinID) error
	SetRetention(id RequestID, ranges []RetentionRange) error

	// The tiers (docs/tiers.md).
	TierCopies(dst []TierCopy) []TierCopy
	TierCopiesInFlight() int
	CompleteTierCopies(ids ...uint64) error
	HostPage(h HostPageID) []byte
	HostCachedHashes(dst []uint64) []uint64
	Loading(id RequestID) bool

	// PoolStats returns the pool's partition and the counters over every
	// group: [Manager.Stats], or [HybridStats].Stats. Like Stats it may be
	// called from any goroutine.
	PoolStats() Stats
	// GroupStats returns group g's numbers ([HybridStats].Groups[g]).
	GroupStats(g int) GroupStats
	// Audit checks every invariant (see [Manager.Audit]).
	Audit() error
}

var (
	_ KVManager = (*Manager)(nil)
	_ KVManager = (*HybridManager)(nil)
)

// NumGroups returns 1: a Manager has one layer group.
func (m *Manager) NumGroups() int { return 1 }

// Group returns the Manager's layer group (g must be 0): full attention,
// or sliding with Config.WindowTokens.
func (m *Manager) Group(g int) LayerGroup { return m.core.groups[g].layerGroup }

// GroupPages is [Manager.Pages] (g must be 0).
func (m *Manager) GroupPages(g int, id RequestID) (pages []PageID, start int) {
	return m.core.groups[g].pages(id)
}

// ReserveStep is [Manager.ReserveSpec] (drafts nil: [Manager.Reserve])
// returning the plan as a HybridPlan of one group: Groups[0] is the Plan,
// whose Requests and Copies the HybridPlan shares.
func (m *Manager) ReserveStep(ids []RequestID, ntokens []int32, drafts [][]int32) (*HybridPlan, error) {
	return m.core.reserve(ids, ntokens, drafts)
}

// PoolStats is [Manager.Stats].
func (m *Manager) PoolStats() Stats { return m.core.stats() }

// GroupStats returns the numbers of the Manager's one group (g must be 0)
// as a HybridManager reports each of its groups'.
func (m *Manager) GroupStats(g int) GroupStats { return m.core.groupStats(g) }

// NumPages returns the number of pages in the pool.
func (h *HybridManager) NumPages() int { return h.core.alloc.NumPages() }

// GroupPages is [HybridManager.Pages].
func (h *HybridManager) GroupPages(g int, id RequestID) (pages []PageID, start int) {
	return h.Pages(g, id)
}

// ReserveStep is [HybridManager.ReserveSpec].
func (h *HybridManager) ReserveStep(ids []RequestID, ntokens []int32, drafts [][]int32) (*HybridPlan, error) {
	return h.ReserveSpec(ids, ntokens, drafts)
}

// Pending reports whether a step is reserved and not yet committed or
// aborted.
func (h *HybridManager) Pending() bool { return h.core.pending() }

// PoolStats is [HybridManager.Stats]' pool-wide part, without the groups'
// numbers (it allocates nothing).
func (h *HybridManager) PoolStats() Stats { return h.core.stats() }

// GroupStats returns group g's numbers: [HybridStats].Groups[g].
func (h *HybridManager) GroupStats(g int) GroupStats { return h.groupStatsOf(g) }
