package pagedkv

import (
	"fmt"
	"sync/atomic"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
)

// request is a group's record of one request.
type request struct {
	id      RequestID
	key     prefixcache.Key
	prio    Priority
	noCache bool

	// retention: Request.Retention, or the last SetRetention.
	retention []RetentionRange

	// tokens are all tokens known: the prompt, then every token sampled or
	// extended. KV exists for tokens [0, computed) (on pages from the page
	// table's Start, for those not released by the window).
	tokens   []int32
	computed int
	running  bool // false: preempted, no pages

	// start is the page table's Start: the first token still on a page
	// (> 0 only after window releases), a multiple of the page size.
	// lastMaybeShared: the last page may be a partial page shared with a
	// fork, so the next append may copy it. Any append makes the last page
	// private again (a fresh page, a copy, or the one holder left).
	start           int
	lastMaybeShared bool

	// chain is the cache position of page cachedPages-1: pages
	// [0, cachedPages) of the request are in the cache (matched, published,
	// or found as duplicates), and page cachedPages is published under
	// chain when it fills. chainCut: eviction removed the chain, so the
	// request publishes nothing more.
	chain       prefixcache.Handle
	cachedPages int
	chainCut    bool

	// lostTokens is what the last preemption discarded: computed tokens a
	// Resume must serve from the cache or recompute.
	lostTokens int

	// Cache accounting (usage.go): readEnd is the pages the last
	// admission read (device matches and onloads; Truncate lowers it):
	// publishing one of them is no write. wrote is the tokens of pages
	// this group's record added to its cache past readEnd; usage (group
	// 0's record) the request's reads and writes.
	readEnd int
	wrote   int64
	usage   CacheUsage

	mark uint64 // Reserve's duplicate check: == group.epoch while in the batch

	// sibling is the same request's record in the core's next group (nil
	// in the last group, so always in a dense Manager, the core of one
	// group): a step's batch is resolved once, in the first group, and
	// followed from there (core.reserve).
	sibling *request

	// Tiers: troot is the namespace's tier digest, tchain the digest of
	// pages [0, cachedPages) and tfirst that of page 0; gen names the
	// admission (unique in the group: request records are reused), and
	// loading is the number of its onload copies still in flight (the
	// request may not step while it is > 0).
	troot, tchain, tfirst tier.Digest
	gen                   uint64
	loading               int
}

func (r *request) seq() pagetable.SeqID { return pagetable.SeqID(r.id) }

// group is one layer group's state on the pool: its page table, its
// prefix cache, its records of the requests, and the buffers of its part
// of a step (prepare, apply, commit, abort). It knows nothing of the other
// groups: the core drives the groups of a facade (a dense Manager is a
// core of one group, a HybridManager one of one group per LayerGroup) and
// does what spans them.
type group struct {
	cfg        Config
	pageSize   int
	window     int             // WindowTokens
	layerGroup layergroup.Spec // the attention whose pages this group keeps
	// attention is layerGroup.Attention(): the step reads it per request
	// (a Spec is too big to copy there).
	attention layergroup.Attention

	// cascadeWindows: cascade plans for a windowed group too (what every
	// sharing row sees in full, with CascadeWindowLeft); without it a
	// windowed group plans flat (docs/manager.md, "Cascade with windows").
	cascadeWindows bool
	// tierTag is the group's identity in tier digests (tierRoot): "" for
	// the group of a dense Manager.
	tierTag string
	// tierGroup is the group's index in its core: the host tier announces
	// the pages of its digest chain through tiers.ev[tierGroup].
	tierGroup uint16

	// prepared is the pages the prepared step needs, counted when the
	// cache had evicted preparedEvictions pages (apply counts again only
	// if it evicted since).
	prepared          int
	preparedEvictions int64
	// preparedSlots are the token slots (pages*page_size) of the prepared
	// step's page table, for the bound step buffers' page capacity.
	preparedSlots int64
	// levelCap, when capLevels, is the most cascade levels a plan may
	// have (the bound step buffers' MaxCascadeLevels): a deeper cascade
	// is planned flat.
	levelCap  int
	capLevels bool

	alloc      *allocator.Allocator
	table      *pagetable.Table
	cache      *prefixcache.Cache
	tiers      *tiers // the core's, shared by its groups; nil without tiers
	admissions uint64 // admit calls: request.gen
	// settle: requests whose onloads completed during a step, to publish
	// and release their window when it ends (a windowed group's).
	settle []loadedReq
	// writers: records whose wrote grew since the core last counted
	// writes (usage.go, countWrites).
	writers []*request

	reqs       map[RequestID]*request
	nPreempted int

	// The step in progress (between Reserve and Commit/Abort) and the
	// buffers every step reuses.
	pending     bool
	epoch       uint64
	batch       []*request
	seqs        []pagetable.SeqID
	ntokens     []int32 // per batch member: tokens reserved, drafts included
	drafts      []int32 // per batch member: draft tokens reserved (the last drafts[b] of ntokens[b])
	planDrafts  []int32 // the plan's Drafts: drafts as of the last successful reserve (prepare refills drafts, and may then fail)
	spec        bool    // some member has drafts
	lastPages   []lastPage
	plan        Plan
	csr         pagetable.CSR
	appendCSR   pagetable.AppendCSR
	blockTables []int32          // the plan's BlockTables (Config.BlockTablesStride > 0)
	copiedAway  map[PageID]int32 // pagesNeeded's copy-on-write count per shared page
	attn        chunkedAttn      // a chunked group's attention arrays
	scratch     []PageID
	planner     cascadePlanner

	// spare holds released requests for Add to reuse (with their token
	// buffers), so that admitting requests as others finish allocates
	// nothing once the engine has reached its working set.
	spare []*request

	counters counters
	stats    statsCell
	// groupTiers are this group's part of the tier counters
	// (GroupStats; read from any goroutine).
	groupTiers struct{ hostHitTokens, remoteHitTokens, offloaded, onloaded atomic.Int64 }
}

// chunkedAttn holds the buffers of a chunked group's Plan.Attn arrays.
type chunkedAttn struct {
	qo, kvp, kvi, last, reqs []int32
	segs                     []layergroup.Segment
}

// newGroup returns a group keeping the pages of spec on pool alloc, with
// the tiers shared (nil: those of cfg.Tiers, its own; a HybridManager
// passes the tiers its groups share).
func newGroup(cfg Config, alloc *allocator.Allocator, spec layergroup.Spec, shared *tiers) (*group, error) {
	table, err := pagetable.New(pagetable.Config{PageSize: cfg.PageSize, Allocator: alloc})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	tiers := shared
	if tiers == nil {
		if f := cfg.Tiers.Format; f.IndexerLayers != 0 {
			return nil, fmt.Errorf("%w: Tiers.Format.IndexerLayers = %d in a Manager: indexer pages follow an MLA group of a HybridManager", ErrBadConfig, f.IndexerLayers)
		}
		if tiers, err = newTiers(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.BlockTablesStride < 0 || cfg.BlockTablesStride > cfg.NumPages {
		return nil, fmt.Errorf("%w: BlockTablesStride = %d, want 0..NumPages = %d (a request's pages are distinct pages of the pool)",
			ErrBadConfig, cfg.BlockTablesStride, cfg.NumPages)
	}
	m := &group{tiers: tiers}
	var refs prefixcache.Refs = alloc
	if tiers != nil {
		refs = cacheRefs{m}
	}
	cache, err := prefixcache.New(prefixcache.Config{
		NumPages: cfg.NumPages, PageSize: cfg.PageSize, Refs: refs, Seed: cfg.HashSeed, Hash: cfg.Hash,
		Priorities: cfg.Priorities, MaxPinnedPages: cfg.MaxPinnedPages, PinBudget: cfg.PinBudget, Sink: cfg.CacheEvents,
		Eviction: cfg.Eviction, ShadowRate: cfg.MissRatioSampling,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if tiers != nil {
		tiers.hasher = prefixcache.NewHasher(cache.Seed(), cfg.Hash)
		cache.KeepEvictedRetention() // an offloaded page takes its retention below
	}
	if cfg.CascadeMinSavedPages == 0 {
		cfg.CascadeMinSavedPages = DefaultCascadeMinSavedPages
	}
	*m = group{
		cfg: cfg, pageSize: cfg.PageSize, window: spec.WindowTokens, layerGroup: spec, attention: spec.Attention(),
		alloc: alloc, table: table, cache: cache, tiers: tiers,
		reqs:       make(map[RequestID]*request),
		copiedAway: make(map[PageID]int32),
	}
	m.planner.init(cfg.NumPages)
	m.publishStats()
	return m, nil
}

// lookup returns request id or an error naming it.
func (m *group) lookup(op string, id RequestID) (*request, error) {
	r, ok := m.reqs[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s request %d", ErrUnknownRequest, op, id)
	}
	return r, nil
}

// ---- Per request ----

// checkAdd validates Add's arguments.
func (m *group) checkAdd(id RequestID, req Request) error {
	if m.pending {
		return fmt.Errorf("%w: add request %d", ErrStepPending, id)
	}
	if _, ok := m.reqs[id]; ok {
		return fmt.Errorf("%w: add request %d", ErrRequestExists, id)
	}
	if int(req.Priority) >= m.cache.NumPriorities() {
		return fmt.Errorf("%w: add request %d with priority %d, want 0..%d", ErrBadArgument, id, req.Priority, m.cache.NumPriorities()-1)
	}
	if err := checkRetention("add", id, req.Retention, m.cache.NumPriorities()); err != nil {
		return err
	}
	if len(req.Prompt) > MaxRequestTokens {
		return fmt.Errorf("%w: add request %d: prompt of %d tokens, want at most %d", ErrBadArgument, id, len(req.Prompt), MaxRequestTokens)
	}
	if req.CapacityTokens < 0 || req.CapacityTokens > MaxRequestTokens {
		return fmt.Errorf("%w: add request %d: CapacityTokens = %d, want 0..%d", ErrBadArgument, id, req.CapacityTokens, MaxRequestTokens)
	}
	for i, t := range req.Prompt {
		if t < 0 {
			return fmt.Errorf("%w: add request %d: prompt[%d] = %d is negative", ErrBadArgument, id, i, t)
		}
	}
	return nil
}

// capacity is the tokens to make room for in a request added with req:
// CapacityTokens is a hint, so never more than the pool could hold beyond
// the prompt.
func (m *group) capacity(req Request) int {
	return max(len(req.Prompt), min(req.CapacityTokens, len(req.Prompt)+m.alloc.NumPages()*m.pageSize))
}

// newRecord returns the record of request id, added with req (checked),
// to admit.
func (m *group) newRecord(id RequestID, req Request) *request {
	r := m.newRequest(m.capacity(req))
	r.id, r.prio, r.noCache = id, req.Priority, req.NoCache
	if len(req.Retention) > 0 {
		r.retention = append(r.retention[:0], req.Retention...)
	}
	r.tokens = append(r.tokens, req.Prompt...)
	if !r.noCache {
		r.key = m.cache.Key(req.Namespace)
		if m.tiers != nil {
			r.troot = m.tierRoot(req.Namespace)
		}
	}
	return r
}

// added files r, added with req and just admitted on matched tokens.
func (m *group) added(r *request, req Request, matched int) {
	// Size the page list for the tokens the engine said to expect, so
	// Reserve never grows it by append in a decode step.
	capacity := m.capacity(req)
	growTo := capacity
	if k := m.attention.KeepTokens(capacity); k >= 0 {
		growTo = min(growTo, r.start+max(m.window, m.layerGroup.ChunkTokens)+2*m.pageSize)
	}
	if err := m.table.Grow(r.seq(), growTo); err != nil {
		panic(fmt.Sprintf("pagedkv: sizing the page list of request %d: %v", r.id, err))
	}
	m.reqs[r.id] = r
	m.counters.promptTokens += int64(len(r.tokens))
	m.counters.promptHitTokens += int64(matched)
	m.afterChange()
}

// newRequest returns a zero request whose tokens buffer (empty) has room
// for capTokens tokens, reusing a released one when there is one.
func (m *group) newRequest(capTokens int) *request {
	n := len(m.spare)
	if n == 0 {
		return &request{tokens: make([]int32, 0, capTokens)}
	}
	r := m.spare[n-1]
	m.spare[n-1] = nil
	m.spare = m.spare[:n-1]
	tokens := r.tokens[:0]
	if cap(tokens) < capTokens {
		tokens = make([]int32, 0, capTokens)
	}
	*r = request{tokens: tokens, retention: r.retention[:0]}
	return r
}

// admitPages gives r (not in the page table) the device pages a matched
// (a.last is the cache position of the last) and onloads of the host
// pages a.hits into n fresh pages after them, and sets its state.
func (m *group) admitPages(r *request, a *admission, n int) {
	ps := m.pageSize
	pages := a.pages
	cached := len(pages)
	if n > 0 {
		pages = m.tierOnload(r, pages, a.hits[:n], a.hostHits)
		a.pages = pages
	}
	if err := m.table.AddShared(r.seq(), pages, len(pages)*ps); err != nil {
		// The ID is free, the pages are distinct and cached (so allocated).
		panic(fmt.Sprintf("pagedkv: admitting request %d on %d cached pages: %v", r.id, len(pages), err))
	}
	m.cache.Recheck(pages...) // no longer idle
	m.cache.Hit(pages[:cached]...)
	if err := m.cache.Raise(r.prio, pages...); err != nil {
		panic(err) // the priority was checked by Add
	}
	if len(r.retention) > 0 {
		for d := range cached {
			m.retainPage(r, d, pages[d])
		}
	}
	r.running = true
	r.computed, r.start, r.lastMaybeShared = len(pages)*ps, 0, false
	r.chain, r.cachedPages, r.chainCut = a.last, cached, false
	r.readEnd = len(pages)
	if r.loading == 0 {
		// A loading request releases its window once its onloads are
		// complete and published (loaded).
		m.releaseWindow(r)
	}
}

// releaseWindow drops r's leading pages that its group's attention no
// longer reads: those entirely before its last WindowTokens computed tokens
// (sliding), or before its current chunk (chunked). They stay cached (and
// become evictable) if they were published.
func (m *group) releaseWindow(r *request) {
	if m.attention.KeepTokens(0) < 0 {
		return // full attention keeps every page
	}
	// r's pages hold exactly its computed tokens here (after a commit or
	// an admission), so the page table need not be asked.
	n := r.computed
	keep := m.attention.KeepTokens(n)
	before := n - keep - r.start
	seq := r.seq()
	if invariants.Enabled {
		if got := m.table.Len(seq); got != n {
			panic(fmt.Sprintf("pagedkv: window release of request %d: the page table holds %d tokens, computed %d", r.id, got, n))
		}
	}
	if before < m.pageSize {
		return
	}
	drop := before / m.pageSize
	dropped := append(m.scratch[:0], m.table.Pages(seq)[:drop]...)
	m.scratch = dropped
	released, err := m.table.ReleaseWindow(seq, keep)
	if err != nil || released != drop {
		panic(fmt.Sprintf("pagedkv: window release of request %d: released %d pages, want %d (%v)", r.id, released, drop, err))
	}
	r.start += drop * m.pageSize
	m.recheckDeepestFirst(dropped)
	m.counters.windowReleasedPages += int64(drop)
}

// recheckDeepestFirst tells the cache that pages, in token order, lost a
// holder: later pages become evictable before earlier ones.
func (m *group) recheckDeepestFirst(pages []PageID) {
	for i := len(pages) - 1; i >= 0; i-- {
		m.cache.Recheck(pages[i])
	}
}

// dropPages releases every page of running request r (cached ones stay in
// the cache).
func (m *group) dropPages(r *request) {
	held := append(m.scratch[:0], m.table.Pages(r.seq())...)
	m.scratch = held
	r.loading = 0 // copies in flight keep their own references
	if err := m.table.Release(r.seq()); err != nil {
		panic(fmt.Sprintf("pagedkv: releasing request %d: %v", r.id, err))
	}
	m.recheckDeepestFirst(held)
}

// extend is Manager.Extend in the group.
func (m *group) extend(id RequestID, tokens ...int32) error {
	if m.pending {
		return fmt.Errorf("%w: extend request %d", ErrStepPending, id)
	}
	r, err := m.lookup("extend", id)
	if err != nil {
		return err
	}
	if int64(len(r.tokens))+int64(len(tokens)) > MaxRequestTokens {
		return fmt.Errorf("%w: extend request %d by %d tokens: it would hold %d, want at most %d",
			ErrBadArgument, id, len(tokens), int64(len(r.tokens))+int64(len(tokens)), MaxRequestTokens)
	}
	for i, t := range tokens {
		if t < 0 {
			return fmt.Errorf("%w: extend request %d: tokens[%d] = %d is negative", ErrBadArgument, id, i, t)
		}
	}
	r.tokens = append(r.tokens, tokens...)
	return nil
}

// fork is Manager.Fork in the group.
func (m *group) fork(parent, child RequestID) error {
	if m.pending {
		return fmt.Errorf("%w: fork request %d", ErrStepPending, parent)
	}
	p, err := m.lookup("fork", parent)
	if err != nil {
		return err
	}
	if !p.running {
		return fmt.Errorf("%w: fork request %d", ErrPreempted, parent)
	}
	if p.loading > 0 {
		return fmt.Errorf("%w: fork request %d: %d onload copies in flight", ErrLoading, parent, p.loading)
	}
	if _, ok := m.reqs[child]; ok {
		return fmt.Errorf("%w: fork request %d to %d", ErrRequestExists, parent, child)
	}
	if err := m.table.Fork(p.seq(), pagetable.SeqID(child)); err != nil {
		return fmt.Errorf("pagedkv: fork request %d to %d: %w", parent, child, err)
	}
	c := *p
	c.id, c.mark, c.sibling = child, 0, nil
	c.wrote, c.usage = 0, CacheUsage{} // the child read and wrote nothing yet
	if p.computed%m.pageSize != 0 {
		p.lastMaybeShared, c.lastMaybeShared = true, true
	}
	c.tokens = append(make([]int32, 0, cap(p.tokens)), p.tokens...)
	// The child inherits the parent's retention ranges in a list of its
	// own (SetRetention rewrites a record's list in place).
	c.retention = append([]RetentionRange(nil), p.retention...)
	m.reqs[child] = &c
	m.afterChange()
	return nil
}

// release is Manager.Release in the group.
func (m *group) release(id RequestID) error {
	if m.pending {
		return fmt.Errorf("%w: release request %d", ErrStepPending, id)
	}
	r, err := m.lookup("release", id)
	if err != nil {
		return err
	}
	if r.running {
		m.dropPages(r)
	} else {
		m.nPreempted--
	}
	delete(m.reqs, id)
	// Nothing refers to a released request (a step's batch is gone once
	// the step is no longer pending), so Add may reuse it. The spare list
	// is bounded by the most requests ever held at once.
	m.spare = append(m.spare, r)
	m.afterChange()
	return nil
}

// preempt is Manager.Preempt in the group.
func (m *group) preempt(id RequestID) error {
	if m.pending {
		return fmt.Errorf("%w: preempt request %d", ErrStepPending, id)
	}
	r, err := m.lookup("preempt", id)
	if err != nil {
		return err
	}
	if !r.running {
		return fmt.Errorf("%w: preempt request %d", ErrPreempted, id)
	}
	m.dropPages(r)
	r.running = false
	r.lostTokens = r.computed
	r.computed, r.start, r.cachedPages, r.chain, r.chainCut = 0, 0, 0, prefixcache.Handle{}, false
	m.nPreempted++
	m.counters.preemptions++
	m.afterChange()
	return nil
}

// checkResume validates Resume's argument and returns its record.
func (m *group) checkResume(id RequestID) (*request, error) {
	if m.pending {
		return nil, fmt.Errorf("%w: resume request %d", ErrStepPending, id)
	}
	r, err := m.lookup("resume", id)
	if err != nil {
		return nil, err
	}
	if r.running {
		return nil, fmt.Errorf("%w: resume request %d", ErrNotPreempted, id)
	}
	return r, nil
}

// resumed counts r, just re-admitted on matched tokens.
func (m *group) resumed(r *request, matched int) {
	m.nPreempted--
	m.counters.resumedTokens += int64(r.lostTokens)
	m.counters.resumeHitTokens += int64(min(matched, r.lostTokens))
	r.lostTokens = 0
	m.afterChange()
}

// unpin is Manager.Unpin in the group.
func (m *group) unpin(id PinID) error {
	if err := m.cache.Unpin(id); err != nil {
		return fmt.Errorf("pagedkv: %w", err)
	}
	m.afterChange()
	return nil
}

// pages is Manager.Pages in the group.
func (m *group) pages(id RequestID) (pages []PageID, start int) {
	seq := pagetable.SeqID(id)
	return m.table.Pages(seq), m.table.Start(seq)
}

// afterChange republishes Stats and, in invariants builds, checks the cheap
// counters.
func (m *group) afterChange() {
	m.publishStats()
	if invariants.Enabled {
		if err := m.checkPartition(); err != nil {
			panic(err.Error())
		}
	}
}
