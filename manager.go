package pagedkv

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
)

// RequestID names a request. The Manager uses it as the request's page-table
// sequence ID, so one ID names one request (or one branch of a fork) at a
// time.
type RequestID uint64

// Types the Manager's API shares with the packages it composes.
type (
	// PageID is a physical page: an index into the page dimension of the
	// engine's K/V tensors (FlashInfer's page_idx).
	PageID = allocator.PageID
	// CopyOp is a copy-on-write page copy the engine performs before a step's
	// appends.
	CopyOp = pagetable.CopyOp
	// Namespace separates prefix caches (tenant, LoRA adapter, salt).
	Namespace = prefixcache.Namespace
	// Priority orders eviction of cached pages: lower goes first.
	Priority = prefixcache.Priority
	// PinID names a pinned prefix.
	PinID = prefixcache.PinID
)

// NoToken in Commit's sampled slice means "no token sampled for this
// request" (a prefill chunk that did not reach the end of the prompt).
const NoToken int32 = -1

var (
	// ErrOutOfPages reports a step that needs more pages than are free and
	// evictable together. Preempt a request and retry. It is
	// allocator.ErrOutOfPages.
	ErrOutOfPages = allocator.ErrOutOfPages
	// ErrUnknownRequest reports a request ID the Manager does not hold.
	ErrUnknownRequest = errors.New("pagedkv: unknown request")
	// ErrRequestExists reports adding or forking to an ID already in use.
	ErrRequestExists = errors.New("pagedkv: request already exists")
	// ErrPreempted reports an operation that needs a running request (one
	// with pages) on a preempted one.
	ErrPreempted = errors.New("pagedkv: request is preempted")
	// ErrNotPreempted reports Resume of a request that is running.
	ErrNotPreempted = errors.New("pagedkv: request is not preempted")
	// ErrStepPending reports a call that would change requests or pages
	// between Reserve and Commit (or Abort).
	ErrStepPending = errors.New("pagedkv: a step is reserved and not committed")
	// ErrNoStep reports Commit or Abort without a reserved step.
	ErrNoStep = errors.New("pagedkv: no step is reserved")
	// ErrBadArgument reports a malformed argument; the message names it.
	ErrBadArgument = errors.New("pagedkv: bad argument")
	// ErrBadConfig reports an invalid [Config].
	ErrBadConfig = errors.New("pagedkv: bad config")
	// ErrNotCached reports pinning a prefix that is not cached.
	ErrNotCached = prefixcache.ErrNotCached
	// ErrPinLimit reports a pin past Config.MaxPinnedPages.
	ErrPinLimit = prefixcache.ErrPinLimit
	// ErrUnknownPin reports unpinning a pin that does not exist.
	ErrUnknownPin = prefixcache.ErrUnknownPin
)

// DefaultCascadeMinSavedPages is the cascade threshold when
// Config.CascadeMinSavedPages is 0.
const DefaultCascadeMinSavedPages = 16

// MaxRequestTokens is the most tokens a request may have (its prompt, its
// CapacityTokens, and its length as it grows): FlashInfer's seq_len and
// positions are int32.
const MaxRequestTokens = math.MaxInt32

// Config describes a Manager.
type Config struct {
	// NumPages is the number of pages in the pool (the page dimension of the
	// engine's K/V tensors), 1..allocator.MaxPages.
	NumPages int
	// PageSize is the number of tokens per page.
	PageSize int
	// WindowTokens is the sliding-window size W in tokens (Mistral's
	// sliding_window); 0 means full attention. With W > 0 a request keeps
	// only the pages that hold any of its last W tokens, and plans carry
	// WindowLeft = W-1.
	WindowTokens int
	// Priorities is the number of eviction priority levels (1..16; 0 means
	// 4). Request.Priority must be below it.
	Priorities int
	// MaxPinnedPages caps the pages pinned at once; 0 means no cap.
	MaxPinnedPages int
	// HashSeed seeds the prefix hash; 0 picks a random seed.
	HashSeed uint64
	// Hash replaces the prefix hash (tests inject colliding ones); nil means
	// the seeded default. Hits are verified token by token either way.
	Hash prefixcache.HashFunc
	// CacheEvents, when not nil, is told of every page the prefix cache
	// stores or removes, on the Manager's goroutine, as it happens (package
	// events turns these into vLLM-format KV events). See
	// [prefixcache.Sink].
	CacheEvents prefixcache.Sink
	// CascadeMinSavedPages is the cascade planner's threshold: a shared
	// prefix becomes a cascade level when (requests sharing it - 1) * its
	// pages >= this many page reads saved per step. 0 means
	// DefaultCascadeMinSavedPages; negative disables cascade plans.
	CascadeMinSavedPages int
	// Tiers configures the host tier and the remote store below the device
	// pool (docs/tiers.md); the zero value has none.
	Tiers TierConfig
	// Eviction names the prefix cache's eviction policy inside each
	// priority level: "lru" (the default, also for ""), "slru", "srrip" or "arc"
	// (evict.Names; docs/replay.md compares them).
	Eviction string
	// MemoryLimit bounds the memory the configuration asks for
	// ([Config.AllocBytes], [HybridConfig.AllocBytes]: the bookkeeping of
	// every page in every group, and the host tier's pages), checked
	// before anything is allocated. 0 means this machine's physical
	// memory, so that a configuration that can never fit is refused by
	// name (ErrBadConfig, wrapping sysmem's error with the bytes needed
	// and the limit) instead of the process dying out of memory while it
	// initialises; < 0 is invalid. Raise it only for a machine whose
	// memory the library cannot see (it never lowers what is safe).
	MemoryLimit int64
}

// Request describes a request to [Manager.Add].
type Request struct {
	// Namespace keeps the request's prefix cache apart from other tenants,
	// adapters or salts.
	Namespace Namespace
	// Prompt is the request's input tokens. Add copies it.
	Prompt []int32
	// Priority is the eviction priority of the pages the request publishes
	// or reuses (pages keep the highest priority of any request that used
	// them while cached).
	Priority Priority
	// NoCache keeps the request out of the prefix cache: it neither reuses
	// nor publishes pages.
	NoCache bool
	// CapacityTokens, if larger than the prompt, reserves room for that many
	// tokens in the request's token list, so decoding does not grow it. It
	// must be in [0, MaxRequestTokens]. It is a hint: Add reserves at most
	// the prompt plus the pool's capacity in tokens, so a huge value costs
	// no more memory than the pool could ever fill.
	CapacityTokens int
}

// request is the Manager's record of one request.
type request struct {
	id      RequestID
	key     prefixcache.Key
	prio    Priority
	noCache bool

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

	mark uint64 // Reserve's duplicate check: == Manager.epoch while in the batch

	// sibling is the same request's record in the core's next group (nil
	// in the last group, so always in a dense Manager, the core of one
	// group): a step's batch is resolved once, in the first group, and
	// followed from there (core.reserve).
	sibling *request

	// Tiers: troot is the namespace's tier digest, tchain the digest of
	// pages [0, cachedPages) and tfirst that of page 0; gen names the
	// admission (unique in the Manager: request records are reused), and
	// loading is the number of its onload copies still in flight (the
	// request may not step while it is > 0).
	troot, tchain, tfirst tier.Digest
	gen                   uint64
	loading               int
}

func (r *request) seq() pagetable.SeqID { return pagetable.SeqID(r.id) }

// Manager is the KV-cache manager an engine embeds: it admits requests on
// cached prefixes, reserves pages for each step and returns the FlashInfer
// arrays, publishes filled pages to the prefix cache, evicts on demand,
// releases pages that leave a sliding window, and preempts and resumes.
//
// A Manager is not safe for concurrent use: it belongs to the engine's
// scheduler goroutine. Only [Manager.Stats] may be called from other
// goroutines at any time. The zero value is not usable; call [New].
type Manager struct {
	_        noCopy
	cfg      Config
	pageSize int
	window   int             // WindowTokens
	group    layergroup.Spec // the attention whose pages this Manager keeps

	// windowCascade: cascade plans for a windowed group too (what every
	// sharing row sees in full, with CascadeWindowLeft); a dense Manager
	// with a window keeps flat plans.
	windowCascade bool
	// tierTag is the group's identity in tier digests (tierRoot): "" for
	// a dense Manager.
	tierTag string
	// tierGroup is the group's index in its HybridManager (0 for a dense
	// Manager): the host tier announces the pages of its digest chain
	// through tiers.ev[tierGroup].
	tierGroup uint16

	// prepared is the pages the prepared step needs, counted when the
	// cache had evicted preparedEvictions pages (apply counts again only
	// if it evicted since).
	prepared          int
	preparedEvictions int64

	alloc      *allocator.Allocator
	table      *pagetable.Table
	cache      *prefixcache.Cache
	tiers      *tiers // nil without tiers (a HybridManager's groups share theirs)
	admissions uint64 // admit calls: request.gen
	// core drives a dense Manager as the core of one group; nil in a
	// HybridManager's groups, which their HybridManager's core drives.
	core *core
	// settle: requests whose onloads completed during a step, to publish
	// and release their window when it ends (a windowed group's).
	settle []loadedReq

	reqs       map[RequestID]*request
	nPreempted int

	// The step in progress (between Reserve and Commit/Abort) and the
	// buffers every step reuses.
	pending    bool
	epoch      uint64
	batch      []*request
	seqs       []pagetable.SeqID
	ntokens    []int32 // per batch member: tokens reserved, drafts included
	drafts     []int32 // per batch member: draft tokens reserved (the last drafts[b] of ntokens[b])
	planDrafts []int32 // the plan's Drafts: drafts as of the last successful reserve (prepare refills drafts, and may then fail)
	spec       bool    // some member has drafts
	lastPages  []lastPage
	plan       Plan
	csr        pagetable.CSR
	appendCSR  pagetable.AppendCSR
	copiedAway map[PageID]int32 // pagesNeeded's copy-on-write count per shared page
	attn       chunkedAttn      // a chunked group's attention arrays
	scratch    []PageID
	planner    cascadePlanner

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

type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// New returns a Manager with an empty pool.
func New(cfg Config) (*Manager, error) {
	if cfg.WindowTokens < 0 || cfg.WindowTokens > MaxRequestTokens {
		return nil, fmt.Errorf("%w: WindowTokens = %d, want 0..%d (window_left is int32)", ErrBadConfig, cfg.WindowTokens, MaxRequestTokens)
	}
	group := layergroup.Spec{Kind: layergroup.Full, NumLayers: 1}
	if cfg.WindowTokens > 0 {
		group = layergroup.Spec{Kind: layergroup.Sliding, WindowTokens: cfg.WindowTokens, NumLayers: 1}
	}
	if err := checkMemory(&cfg, 1, "a Manager"); err != nil {
		return nil, err
	}
	alloc, err := allocator.New(allocator.Config{NumPages: cfg.NumPages})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	m, err := newManager(cfg, alloc, group, nil)
	if err != nil {
		return nil, err
	}
	m.core = newCore([]*Manager{m}, alloc, m.tiers)
	return m, nil
}

// newManager returns a Manager keeping the pages of group on pool alloc,
// with the tiers shared (nil: those of cfg.Tiers, its own; a HybridManager
// passes the tiers its groups share). Its core is the caller's to set.
func newManager(cfg Config, alloc *allocator.Allocator, group layergroup.Spec, shared *tiers) (*Manager, error) {
	table, err := pagetable.New(pagetable.Config{PageSize: cfg.PageSize, Allocator: alloc})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	tiers := shared
	if tiers == nil {
		if tiers, err = newTiers(&cfg); err != nil {
			return nil, err
		}
	}
	m := &Manager{tiers: tiers}
	var refs prefixcache.Refs = alloc
	if tiers != nil {
		refs = cacheRefs{m}
	}
	cache, err := prefixcache.New(prefixcache.Config{
		NumPages: cfg.NumPages, PageSize: cfg.PageSize, Refs: refs, Seed: cfg.HashSeed, Hash: cfg.Hash,
		Priorities: cfg.Priorities, MaxPinnedPages: cfg.MaxPinnedPages, Sink: cfg.CacheEvents,
		Eviction: cfg.Eviction,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if tiers != nil {
		tiers.hasher = prefixcache.NewHasher(cache.Seed(), cfg.Hash)
	}
	if cfg.CascadeMinSavedPages == 0 {
		cfg.CascadeMinSavedPages = DefaultCascadeMinSavedPages
	}
	*m = Manager{
		cfg: cfg, pageSize: cfg.PageSize, window: group.WindowTokens, group: group,
		alloc: alloc, table: table, cache: cache, tiers: tiers,
		reqs:       make(map[RequestID]*request),
		copiedAway: make(map[PageID]int32),
	}
	m.planner.init(cfg.NumPages)
	m.publishStats()
	return m, nil
}

// PageSize returns the number of tokens per page.
func (m *Manager) PageSize() int { return m.pageSize }

// HashSeed returns the seed of the prefix hash chain (the one picked when
// Config.HashSeed was 0). A router given it and the page size computes the
// chain hashes of KV events with [prefixcache.NewHasher].
func (m *Manager) HashSeed() uint64 { return m.cache.Seed() }

// CachedHashes appends the chain hash of every page in the prefix cache to
// dst and returns it: the page set KV events describe.
func (m *Manager) CachedHashes(dst []uint64) []uint64 { return m.cache.AppendHashes(dst) }

// NumPages returns the number of pages in the pool.
func (m *Manager) NumPages() int { return m.alloc.NumPages() }

// lookup returns request id or an error naming it.
func (m *Manager) lookup(op string, id RequestID) (*request, error) {
	r, ok := m.reqs[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s request %d", ErrUnknownRequest, op, id)
	}
	return r, nil
}

// ---- Per request ----

// Add admits request id: it matches the prompt's leading full pages against
// the prefix cache (never the whole prompt: at least one token is left to
// compute, so the step that computes it yields logits), gives the request
// the matched pages, and returns how many tokens they hold. Those tokens
// count as computed; the engine reserves and computes the rest
// ([Manager.Reserve]).
func (m *Manager) Add(id RequestID, req Request) (matchedTokens int, err error) {
	if err := m.checkAdd(id, req); err != nil {
		return 0, err
	}
	r := m.newRecord(id, req)
	matched := m.admit(r)
	m.added(r, req, matched)
	return matched, nil
}

// checkAdd validates Add's arguments.
func (m *Manager) checkAdd(id RequestID, req Request) error {
	if m.pending {
		return fmt.Errorf("%w: add request %d", ErrStepPending, id)
	}
	if _, ok := m.reqs[id]; ok {
		return fmt.Errorf("%w: add request %d", ErrRequestExists, id)
	}
	if int(req.Priority) >= m.cache.NumPriorities() {
		return fmt.Errorf("%w: add request %d with priority %d, want 0..%d", ErrBadArgument, id, req.Priority, m.cache.NumPriorities()-1)
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
func (m *Manager) capacity(req Request) int {
	return max(len(req.Prompt), min(req.CapacityTokens, len(req.Prompt)+m.alloc.NumPages()*m.pageSize))
}

// newRecord returns the record of request id, added with req (checked),
// to admit.
func (m *Manager) newRecord(id RequestID, req Request) *request {
	r := m.newRequest(m.capacity(req))
	r.id, r.prio, r.noCache = id, req.Priority, req.NoCache
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
func (m *Manager) added(r *request, req Request, matched int) {
	// Size the page list for the tokens the engine said to expect, so
	// Reserve never grows it by append in a decode step.
	capacity := m.capacity(req)
	growTo := capacity
	if k := m.group.KeepTokens(capacity); k >= 0 {
		growTo = min(growTo, r.start+max(m.window, m.group.ChunkTokens)+2*m.pageSize)
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
func (m *Manager) newRequest(capTokens int) *request {
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
	*r = request{tokens: tokens}
	return r
}

// admit gives r (not in the page table) its cached prefix and returns its
// length in tokens: the admission of a core of one group.
func (m *Manager) admit(r *request) int {
	m.core.recs[0] = r
	return m.core.admit(m.core.recs)
}

// admitPages gives r (not in the page table) the device pages a matched
// (a.last is the cache position of the last) and onloads of the host
// pages a.hits into n fresh pages after them, and sets its state.
func (m *Manager) admitPages(r *request, a *admission, n int) {
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
	r.running = true
	r.computed, r.start, r.lastMaybeShared = len(pages)*ps, 0, false
	r.chain, r.cachedPages, r.chainCut = a.last, cached, false
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
func (m *Manager) releaseWindow(r *request) {
	if m.group.KeepTokens(0) < 0 {
		return // full attention keeps every page
	}
	// r's pages hold exactly its computed tokens here (after a commit or
	// an admission), so the page table need not be asked.
	n := r.computed
	keep := m.group.KeepTokens(n)
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
func (m *Manager) recheckDeepestFirst(pages []PageID) {
	for i := len(pages) - 1; i >= 0; i-- {
		m.cache.Recheck(pages[i])
	}
}

// dropPages releases every page of running request r (cached ones stay in
// the cache).
func (m *Manager) dropPages(r *request) {
	held := append(m.scratch[:0], m.table.Pages(r.seq())...)
	m.scratch = held
	r.loading = 0 // copies in flight keep their own references
	if err := m.table.Release(r.seq()); err != nil {
		panic(fmt.Sprintf("pagedkv: releasing request %d: %v", r.id, err))
	}
	m.recheckDeepestFirst(held)
}

// Extend appends known tokens to request id (a new user turn, or tokens
// sampled outside [Manager.Commit]); the engine computes them in later
// steps.
func (m *Manager) Extend(id RequestID, tokens ...int32) error {
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

// Fork adds request child as a copy of running request parent (parallel
// sampling, beam search): it shares every page of parent, its tokens and its
// cache chain. The first append into a shared partial page copies it
// ([Plan.Copies]).
func (m *Manager) Fork(parent, child RequestID) error {
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
	if p.computed%m.pageSize != 0 {
		p.lastMaybeShared, c.lastMaybeShared = true, true
	}
	c.tokens = append(make([]int32, 0, cap(p.tokens)), p.tokens...)
	m.reqs[child] = &c
	m.afterChange()
	return nil
}

// Release ends request id and releases its pages; its published pages stay
// in the prefix cache.
func (m *Manager) Release(id RequestID) error {
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

// Preempt releases every page of running request id but keeps the request
// (its tokens, namespace and priority). Its published pages stay cached, so
// [Manager.Resume] later reuses whatever eviction has not taken.
func (m *Manager) Preempt(id RequestID) error {
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

// Resume re-admits preempted request id on whatever of its tokens' prefix
// is still cached and returns the matched length; the engine recomputes the
// rest. Stats count the tokens lost to the preemption and how many of them
// came back from the cache, apart from the admission hit rate.
func (m *Manager) Resume(id RequestID) (matchedTokens int, err error) {
	r, err := m.checkResume(id)
	if err != nil {
		return 0, err
	}
	matched := m.admit(r)
	m.resumed(r, matched)
	return matched, nil
}

// checkResume validates Resume's argument and returns its record.
func (m *Manager) checkResume(id RequestID) (*request, error) {
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
func (m *Manager) resumed(r *request, matched int) {
	m.nPreempted--
	m.counters.resumedTokens += int64(r.lostTokens)
	m.counters.resumeHitTokens += int64(min(matched, r.lostTokens))
	r.lostTokens = 0
	m.afterChange()
}

// ---- Operations ----

// Evict evicts idle cached pages (lowest priority first, in the order of
// Config.Eviction's policy: least recently used by default) until at least npages pages of the pool are free or nothing
// evictable is left, and returns how many pages it freed: 0 when npages
// pages are already free. Steps evict on demand; this is for engines that
// keep a reserve of free pages. With a host tier, victims the host tier
// takes are offloaded instead of dropped: they count as freed, and as free
// towards npages, but return to the pool when their offload completes
// ([Manager.TierCopies]).
func (m *Manager) Evict(npages int) (freed int) { return m.core.evictTo(npages) }

// Pin keeps the cached prefix of tokens in ns (every cached full page of
// it) from eviction until [Manager.Unpin], and returns the pin and the
// tokens it covers. See [prefixcache.Cache.Pin].
func (m *Manager) Pin(ns Namespace, tokens []int32) (id PinID, pinnedTokens int, err error) {
	id, n, err := m.cache.Pin(m.cache.Key(ns), tokens)
	if err != nil {
		return 0, 0, fmt.Errorf("pagedkv: pin: %w", err)
	}
	m.afterChange()
	return id, n * m.pageSize, nil
}

// Unpin removes a pin; its pages become evictable when nothing else holds
// them.
func (m *Manager) Unpin(id PinID) error {
	if err := m.cache.Unpin(id); err != nil {
		return fmt.Errorf("pagedkv: %w", err)
	}
	m.afterChange()
	return nil
}

// Has reports whether request id exists (running or preempted).
func (m *Manager) Has(id RequestID) bool { _, ok := m.reqs[id]; return ok }

// Running reports whether request id exists and holds pages.
func (m *Manager) Running(id RequestID) bool { r, ok := m.reqs[id]; return ok && r.running }

// Tokens returns every token known for request id (nil if unknown). The
// slice is read-only and valid until the next call that changes the
// request.
func (m *Manager) Tokens(id RequestID) []int32 {
	if r, ok := m.reqs[id]; ok {
		return r.tokens
	}
	return nil
}

// Computed returns how many of request id's tokens have KV (0 if unknown or
// preempted). During a step it excludes the tokens reserved by the step.
func (m *Manager) Computed(id RequestID) int {
	if r, ok := m.reqs[id]; ok {
		return r.computed
	}
	return 0
}

// Pages returns the pages request id holds, in token order, and the index
// of the first token they hold (WindowTokens > 0 releases leading pages).
// Token t >= start lives in entry (t-start)%PageSize of
// pages[(t-start)/PageSize]. The slice is read-only and valid until the
// next call that changes the Manager.
func (m *Manager) Pages(id RequestID) (pages []PageID, start int) {
	seq := pagetable.SeqID(id)
	return m.table.Pages(seq), m.table.Start(seq)
}

// afterChange republishes Stats and, in invariants builds, checks the cheap
// counters.
func (m *Manager) afterChange() {
	m.publishStats()
	if invariants.Enabled {
		if err := m.checkPartition(); err != nil {
			panic(err.Error())
		}
	}
}
