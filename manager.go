package pagedkv

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/prefixcache"
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
	// PinBudget caps the pages pinned at once at this share of NumPages
	// (SGLang's SGLANG_HICACHE_MAX_PINNED_RATIO), on top of
	// MaxPinnedPages; a pin past it is refused with ErrPinLimit naming
	// the figures. 0 means no budget; otherwise it is in (0, 1] and at
	// least one page.
	PinBudget float64
	// Clock is the time retention durations and TTL pins are measured
	// on: the time since any fixed origin, never decreasing (a smaller
	// value is taken as the last one). The Manager reads it once at the
	// start of each operation from the first retention with a Duration
	// or TTL pin on (before, nothing can lapse and it is not read). nil
	// means a monotonic clock from New; tests inject one.
	Clock func() time.Duration
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
	// priority level: "lru" (the default, also for ""), "slru", "srrip", "arc" or "adaptive"
	// (evict.Names; docs/replay.md compares them).
	Eviction string
	// MissRatioSampling, when > 0, keeps a live miss-ratio curve
	// (Stats.MissRatioCurve): shadow LRU caches sampling that share of
	// page keys (SHARDS; at most 1, e.g. evict.DefaultShadowRate). 0: none.
	MissRatioSampling float64
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
	// BlockTablesStride, when > 0, makes every Plan carry the padded page
	// table of FlashInfer's trtllm-gen, XQA and cuDNN decode
	// (block_tables[B, BlockTablesStride], [Plan.BlockTables]): the number
	// of columns, the most pages one request's table may hold in a step
	// (e.g. ceil(max_model_len / PageSize)). The engine fixes it so a CUDA
	// graph can replay the table; a step that would give a request more
	// pages is refused before anything changes. 0 (the default) builds no
	// padded tables; it must be in 0..NumPages (a request's pages are
	// distinct pages of the pool, so wider rows would only pad).
	BlockTablesStride int
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
	// Retention gives ranges of the request's tokens their own retention
	// (priority, duration, ephemeral, session; see [RetentionRange] and
	// [Manager.SetRetention]); pages no range covers keep Priority. At
	// most MaxRetentionRanges; Add copies them.
	Retention []RetentionRange
	// CapacityTokens, if larger than the prompt, reserves room for that many
	// tokens in the request's token list, so decoding does not grow it. It
	// must be in [0, MaxRequestTokens]. It is a hint: Add reserves at most
	// the prompt plus the pool's capacity in tokens, so a huge value costs
	// no more memory than the pool could ever fill.
	CapacityTokens int
}

// Manager is the KV-cache manager an engine embeds: it admits requests on
// cached prefixes, reserves pages for each step and returns the FlashInfer
// arrays, publishes filled pages to the prefix cache, evicts on demand,
// releases pages that leave a sliding window, and preempts and resumes.
//
// A Manager is not safe for concurrent use: it belongs to the engine's
// scheduler goroutine. Only [Manager.Stats] may be called from other
// goroutines at any time. The zero value is not usable; call [New].
type Manager struct {
	_    invariants.NoCopy
	core *core // of one group
}

// New returns a Manager with an empty pool.
func New(cfg Config) (*Manager, error) {
	if cfg.WindowTokens < 0 || cfg.WindowTokens > MaxRequestTokens {
		return nil, fmt.Errorf("%w: WindowTokens = %d, want 0..%d (window_left is int32)", ErrBadConfig, cfg.WindowTokens, MaxRequestTokens)
	}
	spec := layergroup.Spec{Kind: layergroup.Full, NumLayers: 1}
	if cfg.WindowTokens > 0 {
		spec = layergroup.Spec{Kind: layergroup.Sliding, WindowTokens: cfg.WindowTokens, NumLayers: 1}
	}
	if err := checkMemory(&cfg, 1, "a Manager"); err != nil {
		return nil, err
	}
	alloc, err := allocator.New(allocator.Config{NumPages: cfg.NumPages})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	g, err := newGroup(cfg, alloc, spec, nil)
	if err != nil {
		return nil, err
	}
	return &Manager{core: newCore([]*group{g}, alloc, g.tiers)}, nil
}

// PageSize returns the number of tokens per page.
func (m *Manager) PageSize() int { return m.core.pageSize() }

// HashSeed returns the seed of the prefix hash chain (the one picked when
// Config.HashSeed was 0). A router given it and the page size computes the
// chain hashes of KV events with [prefixcache.NewHasher].
func (m *Manager) HashSeed() uint64 { return m.core.groups[0].cache.Seed() }

// CachedHashes appends the chain hash of every page in the prefix cache to
// dst and returns it: the page set KV events describe.
func (m *Manager) CachedHashes(dst []uint64) []uint64 {
	return m.core.groups[0].cache.AppendHashes(dst)
}

// NumPages returns the number of pages in the pool.
func (m *Manager) NumPages() int { return m.core.alloc.NumPages() }

// ---- Per request ----

// Add admits request id: it matches the prompt's leading full pages against
// the prefix cache (never the whole prompt: at least one token is left to
// compute, so the step that computes it yields logits), gives the request
// the matched pages, and returns how many tokens they hold. Those tokens
// count as computed; the engine reserves and computes the rest
// ([Manager.Reserve]).
func (m *Manager) Add(id RequestID, req Request) (matchedTokens int, err error) {
	return m.core.add(id, req)
}

// Extend appends known tokens to request id (a new user turn, or tokens
// sampled outside [Manager.Commit]); the engine computes them in later
// steps.
func (m *Manager) Extend(id RequestID, tokens ...int32) error { return m.core.extend(id, tokens) }

// Fork adds request child as a copy of running request parent (parallel
// sampling, beam search): it shares every page of parent, its tokens and its
// cache chain. The first append into a shared partial page copies it
// ([Plan.Copies]).
func (m *Manager) Fork(parent, child RequestID) error { return m.core.fork(parent, child) }

// Release ends request id and releases its pages; its published pages stay
// in the prefix cache.
func (m *Manager) Release(id RequestID) error { return m.core.release(id) }

// Preempt releases every page of running request id but keeps the request
// (its tokens, namespace and priority). Its published pages stay cached, so
// [Manager.Resume] later reuses whatever eviction has not taken.
func (m *Manager) Preempt(id RequestID) error { return m.core.preempt(id) }

// Resume re-admits preempted request id on whatever of its tokens' prefix
// is still cached and returns the matched length; the engine recomputes the
// rest. Stats count the tokens lost to the preemption and how many of them
// came back from the cache, apart from the admission hit rate.
func (m *Manager) Resume(id RequestID) (matchedTokens int, err error) { return m.core.resume(id) }

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
	return m.core.pinFor(ns, tokens, 0)
}

// Unpin removes a pin; its pages become evictable when nothing else holds
// them.
func (m *Manager) Unpin(id PinID) error { return m.core.unpin(id) }

// Has reports whether request id exists (running or preempted).
func (m *Manager) Has(id RequestID) bool { return m.core.has(id) }

// Running reports whether request id exists and holds pages.
func (m *Manager) Running(id RequestID) bool { return m.core.running(id) }

// Tokens returns every token known for request id (nil if unknown). The
// slice is read-only and valid until the next call that changes the
// request.
func (m *Manager) Tokens(id RequestID) []int32 { return m.core.tokens(id) }

// Computed returns how many of request id's tokens have KV (0 if unknown or
// preempted). During a step it excludes the tokens reserved by the step.
func (m *Manager) Computed(id RequestID) int { return m.core.computed(id) }

// Pages returns the pages request id holds, in token order, and the index
// of the first token they hold (WindowTokens > 0 releases leading pages).
// Token t >= start lives in entry (t-start)%PageSize of
// pages[(t-start)/PageSize]. The slice is read-only and valid until the
// next call that changes the Manager.
func (m *Manager) Pages(id RequestID) (pages []PageID, start int) { return m.core.groups[0].pages(id) }
