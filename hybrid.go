package pagedkv

import (
	"time"

	"fmt"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// Hybrid attention models: several KV-cache groups on one page pool.
//
// A HybridManager is a core (core.go) of one group per layer group
// (package layergroup: full, sliding window W, chunked local attention C,
// MLA), and, for recurrent layers (layergroup.State), a state set
// (group_state.go, docs/state-groups.md) beside them; indexer and shared-KV
// groups, which own no pages, are mapped above the core to a target among
// those groups (group_indexer.go). The groups share one allocator, so a page ID is one slot of one
// pool, held by one group at a time, and every group has its own page
// table and its own prefix cache (cached pages are keyed per group).
// Requests exist in every group with the same tokens; each group keeps
// only the pages its attention still reads (layergroup.Spec.KeepFrom) and
// releases the rest at commit.
//
// The core does what spans groups, for a dense Manager (a core of one
// group) as well: admission on the prefix every group can serve,
// all-or-nothing steps (one page budget for every group's pages, eviction
// across the groups' caches), pins of that prefix in every group, and the
// pool-wide Audit. A single-group model keeps using Manager, whose API and
// numbers are unchanged.

// LayerGroup describes one KV-cache group of a hybrid model; see package
// layergroup for the page-size and bytes rule (equal layer counts).
type LayerGroup = layergroup.Spec

// The attention kinds of a LayerGroup.
const (
	FullAttention    = layergroup.Full
	SlidingAttention = layergroup.Sliding
	ChunkedAttention = layergroup.Chunked
	MLAAttention     = layergroup.MLA
	StateLayers      = layergroup.State
)

// HybridConfig describes a HybridManager: the pool and cache settings of
// Config (WindowTokens must be 0: windows are per group) and the groups.
type HybridConfig struct {
	Config
	Groups []LayerGroup
	// StateCheckpointEvery is, with state groups (StateLayers), the
	// interval in tokens (a multiple of PageSize; 0: none) at which a
	// prompt's state is also checkpointed for the prefix cache, besides
	// its last whole page (vLLM's prefix_cache_retention_interval; see
	// docs/state-groups.md). It must be 0 without state groups.
	StateCheckpointEvery int
}

// HybridPlan is a hybrid step's plan: the copies to make first (page IDs
// are pool-wide; a copy copies the page in every layer's tensor) and one
// Plan per group with that group's FlashInfer arrays (its page table, its
// positions relative to the group's first held page, its window_left, and
// for a chunked group the Attn arrays). Every group's plan lists the same
// requests, rows and tokens (Requests, TokenIDs and TokenPositions are the
// same slices in every group). Valid until the next Reserve.
type HybridPlan struct {
	Requests []RequestID
	Copies   []CopyOp
	Groups   []*Plan
}

// GroupStats are one group's numbers in HybridStats.
type GroupStats struct {
	Kind           layergroup.Kind
	CachedPages    int   // pages in the group's prefix cache
	EvictablePages int   // of those, idle and evictable
	PinnedPages    int   // of those, under a pin (HybridManager.Pin pins the same prefixes in every group)
	ServableTokens int64 // prompt tokens the group's cache alone could have served at Add and Resume
	PublishedPages int64
	EvictedPages   int64
	CopiedPages    int64
	// WindowReleasedPages are pages the group released because its
	// attention no longer reads them (left the window, or a finished chunk).
	WindowReleasedPages int64
	// The group's part of the tier counters (HybridStats.Tiers is the
	// pool's, over every group): prompt tokens it onloaded from host pages
	// and from the remote store at Add and Resume, and its tier copies
	// completed each way.
	HostHitTokens, RemoteHitTokens int64
	OffloadedPages, OnloadedPages  int64
}

// HybridStats is the pool's partition (over every group), the request and
// token counters (equal in every group: PromptHitTokens counts the prefix
// every group could serve), the tiers' counters (Stats.Tiers: the one host
// tier and remote store; hit tokens and copies summed over the groups) and
// each group's numbers.
type HybridStats struct {
	Stats
	Groups []GroupStats
}

// HybridManager is the KV-cache manager of a hybrid attention model. Like
// Manager it belongs to the engine's scheduler goroutine; Stats may be
// called from any goroutine (each group's numbers are a consistent
// snapshot; the pool totals may straddle one operation).
type HybridManager struct {
	_    invariants.NoCopy
	core *core // of every LayerGroup that owns pages (attention and state)
	// alias: the groups that own no pages (group_indexer.go); nil: none.
	alias *aliases
}

// NewHybrid returns a HybridManager with an empty pool.
func NewHybrid(cfg HybridConfig) (*HybridManager, error) {
	if cfg.WindowTokens != 0 {
		return nil, fmt.Errorf("%w: WindowTokens = %d in a hybrid config; give sliding groups their WindowTokens", ErrBadConfig, cfg.WindowTokens)
	}
	if err := layergroup.ValidateGroups(cfg.Groups, cfg.PageSize); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if err := checkIndexerFormat(cfg.Tiers.Format, cfg.Groups); err != nil {
		return nil, err
	}
	// The core holds the groups that own pages (listed first); indexer
	// and shared-KV groups are the facade's (group_indexer.go).
	alias := newAliases(cfg.Groups, cfg.PageSize)
	cfg.Groups = cfg.Groups[:layergroup.NumOwners(cfg.Groups)]
	if err := checkMemory(&cfg.Config, len(cfg.Groups), fmt.Sprintf("a HybridManager of %d groups", len(cfg.Groups))); err != nil {
		return nil, err
	}
	attnAt, stateAt, err := splitStateGroups(&cfg)
	if err != nil {
		return nil, err
	}
	all := cfg.Groups // every group that owns pages: group_idx of its KV events
	if stateAt != nil {
		cfg.Groups = make([]LayerGroup, len(attnAt))
		for g, at := range attnAt {
			cfg.Groups[g] = all[at]
		}
	}
	var sinks GroupEventSink
	if cfg.CacheEvents != nil {
		gs, ok := cfg.CacheEvents.(GroupEventSink)
		if !ok || gs.NumGroups() != len(all) {
			n := 0
			if ok {
				n = gs.NumGroups()
			}
			return nil, fmt.Errorf("%w: CacheEvents = %T with %d groups in a hybrid config of %d groups that own pages: it needs a GroupEventSink with one sink per such group (events.RecorderConfig.Groups; indexer and shared-KV groups have none)",
				ErrBadConfig, cfg.CacheEvents, n, len(all))
		}
		for g, spec := range all {
			wk, ww := KVEventSpec(spec)
			if k, w := gs.GroupSpec(g); k != wk || w != ww {
				return nil, fmt.Errorf("%w: CacheEvents group %d has kv_cache_spec_kind %q, sliding window %d; the %v group's are %q, %d",
					ErrBadConfig, g, k, w, spec.Kind, wk, ww)
			}
		}
		sinks = gs
	}
	// The host tier's KV events: group g's host pages (those of its digest
	// chain) are announced through GroupSink(g), labelled with the group.
	var hostSinks []HostEventSink
	if hs, ok := cfg.CacheEvents.(HostEventSink); ok && hs.HostPages() != 0 {
		for i := range cfg.Groups {
			g := groupIdx(attnAt, i)
			gs, ok := sinks.GroupSink(g).(HostEventSink)
			if !ok || gs.HostPages() != hs.HostPages() {
				n := 0
				if ok {
					n = gs.HostPages()
				}
				return nil, fmt.Errorf("%w: CacheEvents announces %d host pages, its group %d sink (%T) %d: a HybridManager announces group g's host pages through GroupSink(g), which must be a HostEventSink of as many",
					ErrBadConfig, hs.HostPages(), g, sinks.GroupSink(g), n)
			}
			hostSinks = append(hostSinks, gs)
		}
	}
	alloc, err := allocator.New(allocator.Config{NumPages: cfg.NumPages})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	// One set of tiers (one host pool, one remote store, one stream of
	// tier copies) for every group: each group's pages enter it under
	// digests of their own (Manager.tierRoot).
	tcfg := cfg.Config
	if err := checkFormatLayers(tcfg.Tiers.Format.Layers, all); err != nil {
		return nil, err
	}
	tiers, err := newTiers(&tcfg) // checks CacheEvents' HostPages against Tiers.HostPages
	if err != nil {
		return nil, err
	}
	if tiers != nil && hostSinks != nil {
		tiers.ev = hostSinks
	}
	groups := make([]*group, 0, len(cfg.Groups))
	for i, g := range cfg.Groups {
		gcfg := cfg.Config
		gcfg.CacheEvents = nil
		if sinks != nil {
			gcfg.CacheEvents = sinks.GroupSink(groupIdx(attnAt, i))
		}
		m, err := newGroup(gcfg, alloc, g, tiers)
		if err != nil {
			return nil, err
		}
		m.cascadeWindows = true
		if tiers != nil {
			m.tierTag, m.tierGroup = groupTierTag(i, g), uint16(i)
		}
		groups = append(groups, m)
		// One hash chain for every group (KV events name a prefix's pages
		// by the same hashes in each group, as vLLM does), even when
		// HashSeed was 0 and group 0 picked one.
		cfg.HashSeed = m.cache.Seed()
	}
	c := newCore(groups, alloc, tiers)
	if stateAt != nil {
		c.withStates(all, attnAt, stateAt, cfg.StateCheckpointEvery, cfg.Hash)
		if tiers != nil {
			c.withStateTiers(tiers)
		}
		if sinks != nil {
			if c.state.ev, err = stateEventSinks(sinks, stateAt); err != nil {
				return nil, err
			}
		}
	}
	return &HybridManager{core: c, alias: alias}, nil
}

// GroupEventSink is a [Config.CacheEvents] sink for a HybridManager: one
// [prefixcache.Sink] per layer group, whose KV events carry the group's
// index as vLLM's "group_idx" and the group's spec ([KVEventSpec]).
// events.Recorder implements it when built with RecorderConfig.Groups.
type GroupEventSink interface {
	prefixcache.Sink
	// NumGroups is the number of groups; it must equal HybridConfig.Groups'.
	NumGroups() int
	// GroupSink is group g's sink.
	GroupSink(g int) prefixcache.Sink
	// GroupSpec is group g's kv_cache_spec_kind and sliding window; they
	// must be KVEventSpec(HybridConfig.Groups[g]).
	GroupSpec(g int) (kind string, slidingWindow int)
}

// KVEventSpec returns the "kv_cache_spec_kind" and
// "kv_cache_spec_sliding_window" vLLM sends for a group of this kind
// (vLLM's KVCacheSpecKind values): "full_attention", "sliding_window" with
// its WindowTokens, "chunked_local_attention", "mla_attention" and, for a
// state group (vLLM's MambaSpec), "mamba". Indexer and shared-KV groups
// send no events (they own no pages; vLLM has no group for them).
func KVEventSpec(g LayerGroup) (kind string, slidingWindow int) {
	switch g.Kind {
	case StateLayers:
		return kvEventSpecState, 0
	case SlidingAttention:
		return "sliding_window", g.WindowTokens
	case ChunkedAttention:
		return "chunked_local_attention", 0
	case MLAAttention:
		return "mla_attention", 0
	}
	return "full_attention", 0
}

// NumGroups returns the number of layer groups (those that own no pages
// included).
func (h *HybridManager) NumGroups() int {
	if h.alias != nil {
		return len(h.alias.specs)
	}
	return h.core.numGroups()
}

// Group returns group g's spec.
func (h *HybridManager) Group(g int) LayerGroup {
	if h.alias != nil {
		return h.alias.specs[g]
	}
	return h.core.groupSpec(g)
}

// PageSize returns the number of tokens per page.
func (h *HybridManager) PageSize() int { return h.core.pageSize() }

// ---- Per request ----

// Add admits request id in every group on the longest cached prefix every
// group can serve (full and MLA groups: every page of it; sliding and
// chunked groups: the pages their next query reads, which their caches hold
// only with every page before them), and returns its length. See
// [Manager.Add]. With tiers a group serves the pages its cache lacks from
// the host tier or the remote store (onloads, see
// [HybridManager.TierCopies]) when every group can, and the onloads of
// every group fit the pool.
func (h *HybridManager) Add(id RequestID, req Request) (matchedTokens int, err error) {
	return h.core.add(id, req)
}

// Extend appends known tokens to request id in every group.
func (h *HybridManager) Extend(id RequestID, tokens ...int32) error { return h.core.extend(id, tokens) }

// Fork forks request parent to child in every group.
func (h *HybridManager) Fork(parent, child RequestID) error { return h.core.fork(parent, child) }

// Release ends request id in every group.
func (h *HybridManager) Release(id RequestID) error { return h.core.release(id) }

// Preempt drops request id's pages in every group.
func (h *HybridManager) Preempt(id RequestID) error { return h.core.preempt(id) }

// Resume re-admits preempted request id on the prefix every group can
// serve, and returns its length.
func (h *HybridManager) Resume(id RequestID) (matchedTokens int, err error) { return h.core.resume(id) }

// Truncate cuts request id to its first n tokens in every group; it fails,
// changing nothing, if any group cannot (a window group whose next query
// would need released keys).
func (h *HybridManager) Truncate(id RequestID, n int) error { return h.core.truncate(id, n) }

// ---- Per step ----

// Reserve reserves a step in every group (see [Manager.Reserve]): one page
// budget covers every group's new pages and copies, evicting idle cached
// pages of any group if the pool is short. All-or-nothing.
func (h *HybridManager) Reserve(ids []RequestID, ntokens []int32) (*HybridPlan, error) {
	return h.ReserveSpec(ids, ntokens, nil)
}

// ReserveSpec is [Manager.ReserveSpec] in every group.
func (h *HybridManager) ReserveSpec(ids []RequestID, ntokens []int32, drafts [][]int32) (*HybridPlan, error) {
	p, err := h.core.reserve(ids, ntokens, drafts)
	if err != nil {
		return nil, err
	}
	return h.aliasPlan(p), nil
}

// Commit commits the step in every group (see [Manager.Commit]).
func (h *HybridManager) Commit(sampled []int32) error { return h.core.commit(nil, sampled) }

// CommitSpec commits a speculative step in every group (see
// [Manager.CommitSpec]).
func (h *HybridManager) CommitSpec(accepted, sampled []int32) error {
	return h.core.commitSpec(accepted, sampled)
}

// Abort undoes the reserved step in every group.
func (h *HybridManager) Abort() error { return h.core.abort() }

// ---- Operations ----

// Evict evicts idle cached pages of any group, from the group with the
// most of them first, until npages pages are free or nothing is evictable,
// and returns how many it freed. With a host tier, victims the host tier
// takes are offloaded instead of dropped and count as free, as
// [Manager.Evict] does.
func (h *HybridManager) Evict(npages int) int { return h.core.evictTo(npages) }

// Pin keeps the prefix of tokens in ns that every group's cache holds from
// eviction until [HybridManager.Unpin], and returns the pin and the tokens
// it covers: pinnedTokens is the longest page-aligned prefix of tokens (at
// most len(tokens)/PageSize pages) cached in every group, which is the hit
// rule of [HybridManager.Add]. Each group's cache holds a page only with
// every page before it, so a sliding or chunked group, whose next query
// reads only the last pages of the prefix, still needs the whole path for a
// hit: the pin holds those pinnedTokens/PageSize pages in every group, and
// no more in any group (pages past the shortest group's prefix could not be
// served). While the pin lasts, a later Add or Resume whose tokens start
// with them is served at least min(pinnedTokens, the hit cap of
// [Manager.Add]: every full page before its last token).
//
// It is all or nothing, as [Manager.Pin]: it fails, changing nothing, with
// [ErrNotCached] naming the first group whose cache lacks the prefix's first
// page, or with [ErrPinLimit] naming a group whose pins would pass
// Config.MaxPinnedPages (the cap applies to each group's cache).
func (h *HybridManager) Pin(ns Namespace, tokens []int32) (id PinID, pinnedTokens int, err error) {
	return h.core.pinFor(ns, tokens, 0)
}

// PinFor is [Manager.PinFor] in every group, all or nothing as Pin: the
// pin's lifetime, refreshes and lapse are the same in every group (they
// follow one clock read per operation).
func (h *HybridManager) PinFor(ns Namespace, tokens []int32, ttl time.Duration) (id PinID, pinnedTokens int, err error) {
	return h.core.pinFor(ns, tokens, ttl)
}

// SetRetention is [Manager.SetRetention] in every group.
func (h *HybridManager) SetRetention(id RequestID, ranges []RetentionRange) error {
	return h.core.setRetention(id, ranges)
}

// Unpin removes a pin from every group; its pages become evictable when
// nothing else holds them. It fails, changing nothing, with [ErrUnknownPin]
// naming id.
func (h *HybridManager) Unpin(id PinID) error { return h.core.unpin(id) }

// Tokens, Computed, Running and Has are as for [Manager] (every group holds
// the same tokens).
func (h *HybridManager) Tokens(id RequestID) []int32 { return h.core.tokens(id) }

// Computed returns how many of request id's tokens have KV.
func (h *HybridManager) Computed(id RequestID) int { return h.core.computed(id) }

// Running reports whether request id exists and holds pages.
func (h *HybridManager) Running(id RequestID) bool { return h.core.running(id) }

// Has reports whether request id exists.
func (h *HybridManager) Has(id RequestID) bool { return h.core.has(id) }

// Pages returns the pages request id holds in group g and the first token
// they hold (see [Manager.Pages]); an indexer or shared-KV group's are
// its target's.
func (h *HybridManager) Pages(g int, id RequestID) (pages []PageID, start int) {
	return h.core.groupPages(h.owner(g), id)
}

// Stats returns the pool partition, the request and token counters and
// each group's numbers.
func (h *HybridManager) Stats() HybridStats {
	s := HybridStats{Stats: h.core.stats(), Groups: make([]GroupStats, h.NumGroups())}
	for g := range s.Groups {
		s.Groups[g] = h.groupStatsOf(g)
	}
	return s
}

// Audit checks every group (see [Manager.Audit]), that every group holds
// the same requests with the same tokens and computed counts and pins the
// same prefixes, that no page is held by two groups, that every page's
// reference count is exactly its holders in every group's requests plus
// one per cache holding it and one per tier copy in flight, and the tiers
// shared by the groups; and that every indexer or shared-KV group maps to
// its target, whose pages and Plan arrays it has.
func (h *HybridManager) Audit() error {
	if err := h.core.audit(); err != nil {
		return err
	}
	return h.auditAliases()
}

// checkFormatLayers checks a hybrid pool's Tiers.Format.Layers (0: no
// format): the per-layer KV tensors a tier copy moves a page in. That is
// every group's NumLayers when the groups share the tensors (layer j of
// every group in tensor j, docs/manager.md, the layout vLLM's hybrid
// allocator uses), or their sum when each group's layers have tensors of
// their own; any other count is another model's format.
func checkFormatLayers(layers int, groups []LayerGroup) error {
	if layers == 0 {
		return nil
	}
	shared, sum := groups[0].NumLayers, 0
	for _, g := range groups {
		sum += g.NumLayers
	}
	if layers != shared && layers != sum {
		return fmt.Errorf("%w: Tiers.Format.Layers = %d, want %d (the groups' layer count: groups share the per-layer tensors) or %d (their sum: tensors of each group's own)",
			ErrBadConfig, layers, shared, sum)
	}
	return nil
}
