package prefixcache

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/internal/invariants"
)

// PageID is the allocator's page ID: the cache indexes its nodes by it.
type PageID = allocator.PageID

// Priority orders eviction: every idle page of priority p is evicted before
// any idle page of priority p+1. It is in [0, Config.Priorities).
type Priority uint8

const (
	// DefaultPriorities is the number of priority levels when
	// Config.Priorities is 0.
	DefaultPriorities = 4
	// MaxPriorities is the largest Config.Priorities.
	MaxPriorities = 16
)

var (
	// ErrBadConfig reports an invalid [Config].
	ErrBadConfig = errors.New("prefixcache: bad config")
	// ErrBadArgument reports a malformed argument: a page outside the pool, a
	// page of the wrong length, a priority out of range.
	ErrBadArgument = errors.New("prefixcache: bad argument")
	// ErrStaleHandle reports a [Handle] whose page has been evicted since the
	// handle was made. It is predictable: a request whose chain was cut by
	// eviction simply stops publishing.
	ErrStaleHandle = errors.New("prefixcache: stale handle")
	// ErrPageCached reports publishing a page that is already in the cache
	// (under any prefix): a page holds one token range at a time.
	ErrPageCached = errors.New("prefixcache: page already cached")
	// ErrNotCached reports pinning a prefix none of whose pages is cached.
	ErrNotCached = errors.New("prefixcache: prefix not cached")
	// ErrPinLimit reports a pin that would take the pinned pages past
	// Config.MaxPinnedPages.
	ErrPinLimit = errors.New("prefixcache: pinned-page limit")
	// ErrUnknownPin reports a [PinID] that is not pinned (never was, or was
	// already unpinned).
	ErrUnknownPin = errors.New("prefixcache: unknown pin")
)

// Refs is the part of [allocator.Allocator] the cache uses: it holds one
// reference on every cached page and reads reference counts to tell idle
// pages (held by the cache alone) from pages in use.
type Refs interface {
	Retain(pages ...PageID) error
	Release(pages ...PageID) (freed int, err error)
	RefCount(p PageID) int32
}

// Config describes a Cache.
type Config struct {
	// NumPages is the size of the page pool; cached pages are in
	// [0, NumPages). The cache keeps one node and PageSize tokens per page of
	// the pool (about 48 + 4*PageSize bytes per page).
	NumPages int
	// PageSize is the number of tokens per page.
	PageSize int
	// Refs is the page pool's reference counter, normally the
	// *allocator.Allocator that hands out the pages.
	Refs Refs
	// Seed seeds the default hash. 0 picks a random seed, which makes
	// deliberate hash flooding (many prompts in one chain bucket)
	// impractical; a fixed seed makes hashes reproducible.
	Seed uint64
	// Hash replaces the default hash (tests inject colliding ones). Nil
	// means the seeded default.
	Hash HashFunc
	// Priorities is the number of priority levels, 1..MaxPriorities;
	// 0 means DefaultPriorities.
	Priorities int
	// MaxPinnedPages caps the pages pinned at once; 0 means no cap.
	MaxPinnedPages int
	// PinBudget caps the pages pinned at once at this share of NumPages
	// (rounded down; SGLang's SGLANG_HICACHE_MAX_PINNED_RATIO), on top of
	// MaxPinnedPages: a pin past it is refused with ErrPinLimit naming
	// the figures. 0 means no budget; it must be in [0, 1].
	PinBudget float64
	// Sink, when not nil, is told of every page stored and removed (KV
	// events). See [Sink].
	Sink Sink
	// Eviction names the eviction policy inside each priority level
	// (evict.Names: "adaptive", "arc", "lru", "slru", "srrip"); "" means "lru". See
	// evict.Policy and docs/replay.md for how they compare.
	Eviction string
	// ShadowRate, when > 0, keeps a live miss-ratio curve
	// ([Cache.Shadow]): SHARDS-sampled shadow LRU caches at that sampling
	// rate (at most 1) estimate the hit ratio at ½×, 2× and 4× NumPages
	// and with no limit, from the pages admissions hit ([Cache.Hit]) and
	// publish. 0: none.
	ShadowRate float64
}

// Handle names a position in the prefix tree: a namespace root (the zero
// Handle) or one cached page. A handle to a page becomes stale, for good,
// when that page is evicted, even if the page is later cached again.
type Handle struct {
	page int32  // PageID+1 of the node; 0 is the root
	gen  uint32 // the node's generation when the handle was made
}

// IsRoot reports whether h is a namespace root (no page).
func (h Handle) IsRoot() bool { return h.page == 0 }

// Page returns the page h names; ok is false for a root.
func (h Handle) Page() (p PageID, ok bool) { return PageID(h.page - 1), h.page != 0 }

// lapseBytes is what retention lapses take per page: a lapse, a
// deadline, a heap position and a heap entry.
const lapseBytes = 8 + 8 + 4 + 4

// none marks an absent node in links.
const none int32 = -1

// Node state bits.
const (
	// stCached: the page is in the tree and the cache holds a reference.
	stCached uint8 = 1 << iota
	// stIdle: at the last Recheck (or publish) the cache was the page's only
	// holder (reference count 1). An idle node with no pins is on the LRU
	// queue of its priority; that is the only way onto a queue.
	stIdle
	// stReturned: its level's evict.GhostPolicy remembered the page's hash from
	// an eviction when it was published; it is enqueued as having served a
	// hit until it serves one.
	stReturned
)

// node is the cache's record of one page; nodes[p] describes page p.
type node struct {
	hash     uint64     // h_d = Hash(h_{d-1}, tokens of this page); h_{-1} is the namespace seed
	parent   int32      // page of the previous page of the prefix, or none at depth 0
	child    int32      // first child, or none
	next     int32      // next sibling, or none
	prev     int32      // previous sibling, or none
	nextHash int32      // next node in the same byHash chain, or none
	link     evict.Link // its place on its eviction queue (Cache.queues); zero off them
	children int32      // number of children
	pins     int32      // pins through this page (a pin covers a whole path)
	gen      uint32     // incremented when the node is removed
	prio     Priority
	state    uint8
	depth    uint16     // pages before it in its chain, saturating (the eviction class)
	hits     uint32     // admissions it served since it was published (Cache.Hit)
	hint     evict.Hint // its continuation hint (Cache.Hint); cleared by a hit

	// Pads the node to one 64-byte cache line (nodes is page-aligned), so
	// each node an eviction or a match touches costs one miss, not two.
	_ [3]byte
}

func (n *node) cached() bool { return n.state&stCached != 0 }
func (n *node) idle() bool   { return n.state&stIdle != 0 }

// policyHits is the hit count its level's policy sees: a page that
// returned from a ghost counts as having served one.
func (n *node) policyHits() uint32 {
	if n.hits == 0 && n.state&stReturned != 0 {
		return 1
	}
	return n.hits
}

// class is what its level's policy sees of it.
func (n *node) class() evict.Class {
	return evict.Class{Hits: n.policyHits(), Depth: uint32(n.depth), Hint: n.hint}
}

// listed reports whether n is on an eviction queue: idle and not pinned.
func (n *node) listed() bool { return n.state&(stCached|stIdle) == stCached|stIdle && n.pins == 0 }

// Cache is a prefix cache over the full pages of a page pool. It is not safe
// for concurrent use; it belongs to the engine's scheduler goroutine (its
// Refs may be shared). The zero value is not usable; call [New]. A Cache must
// not be copied.
type Cache struct {
	_        invariants.NoCopy
	pageSize int
	refs     Refs
	shadow   *evict.Shadow // the live miss-ratio curve (Config.ShadowRate), or nil
	seed     uint64
	// defaultKey is Key(Namespace{}); the zero Key stands for it.
	defaultKey Key
	hashFn     HashFunc // nil means hashTokens with seed
	sink       Sink     // nil: nobody observes changes
	// Retention of the pages an eviction releases, while it releases them
	// (tierret.go), when keepRet.
	keepRet bool
	evRet   []PageRetention

	// nodes[p] is page p's node; tokens[p*pageSize:(p+1)*pageSize] are the
	// tokens of page p while it is cached (what every hit is verified
	// against).
	nodes  []node
	tokens []int32

	// byHash maps a hash to the first page of its chain (linked by
	// node.nextHash). rootKey maps a depth-0 page to its namespace's
	// canonical encoding.
	byHash  index
	rootKey map[int32]string
	keys    map[Namespace]Key // Key's memo, at most maxMemoKeys entries

	// queues holds the idle, unpinned pages (the evictable ones), one
	// level per priority, each ordered by its own policy instance; its
	// links are in the nodes.
	queues *evict.Queues

	nCached     int // nodes with stCached
	nIdlePinned int // idle and pinned
	nPinned     int // nodes with pins > 0
	maxPinned   int // 0: no cap
	pinBudget   int // PinBudget's pages; 0: no budget
	pinShare    float64

	// now is the cache's clock (Advance). lapse[p] is cached page p's
	// retention lapse (nil until the first Retain with one); lapses holds
	// the deadlines of idle pages with a lapse.
	now    time.Duration
	lapse  []time.Duration
	lapses deadlines

	// TTL pins: ttl holds their records (free slots in ttlFree),
	// ttlSlot a pin's slot, ttlAt the first slot of the pins whose last
	// page is a page, pinLives their deadlines.
	ttl      []ttlPin
	ttlFree  []int32
	ttlSlot  map[PinID]int32
	ttlAt    map[int32]int32
	pinLives deadlines

	pins    map[PinID]Handle // live pins: the deepest page of each
	nextPin PinID

	counters Counters
	scratch  []PageID
	one      [1]PageID
}

// AllocBytes is the memory a Cache of cfg takes over its life for its
// pages: a node, PageSize tokens and two index slots per page, and with
// the "arc" policy each priority level's ghost list (a hash, a list byte
// and two index slots per page, taken at its first eviction) and, from
// the first Retain with a lapse, the lapse deadlines (lapseBytes a page).
// Callers that
// bound the memory a configuration asks for add it up (pagedkv's
// Config.MemoryLimit). Counts beyond what New accepts are clamped first
// (NumPages to MaxPages+1, PageSize to 2^32, Priorities to
// MaxPriorities), so the result never overflows and stays above any real
// memory.
func AllocBytes(cfg Config) int64 {
	n := int64(min(max(cfg.NumPages, 0), allocator.MaxPages+1))
	slots := int64(2)
	for slots < 2*n {
		slots *= 2
	}
	need := n*(int64(unsafe.Sizeof(node{}))+4*min(int64(max(cfg.PageSize, 0)), 1<<32)) + slots*int64(unsafe.Sizeof(slot{}))
	levels := min(max(cfg.Priorities, 0), MaxPriorities)
	if levels == 0 {
		levels = DefaultPriorities
	}
	need += evict.AllocBytesIn(cfg.Eviction, levels, int(n))
	need += n * lapseBytes
	if cfg.ShadowRate > 0 && cfg.ShadowRate <= 1 && n > 0 {
		need += evict.ShadowBytes(int(n), cfg.ShadowRate)
	}
	return need
}

// New returns an empty cache.
func New(cfg Config) (*Cache, error) {
	switch {
	case cfg.NumPages < 1 || cfg.NumPages > allocator.MaxPages:
		return nil, fmt.Errorf("%w: NumPages = %d, want 1..%d", ErrBadConfig, cfg.NumPages, allocator.MaxPages)
	case cfg.PageSize < 1:
		return nil, fmt.Errorf("%w: PageSize = %d, want >= 1", ErrBadConfig, cfg.PageSize)
	case int64(cfg.NumPages)*int64(cfg.PageSize) > 1<<32:
		return nil, fmt.Errorf("%w: NumPages*PageSize = %d*%d tokens, want <= 2^32", ErrBadConfig, cfg.NumPages, cfg.PageSize)
	case cfg.Refs == nil:
		return nil, fmt.Errorf("%w: Refs is nil", ErrBadConfig)
	case cfg.Priorities < 0 || cfg.Priorities > MaxPriorities:
		return nil, fmt.Errorf("%w: Priorities = %d, want 0..%d", ErrBadConfig, cfg.Priorities, MaxPriorities)
	case cfg.MaxPinnedPages < 0:
		return nil, fmt.Errorf("%w: MaxPinnedPages = %d, want >= 0", ErrBadConfig, cfg.MaxPinnedPages)
	case !(cfg.PinBudget >= 0 && cfg.PinBudget <= 1):
		return nil, fmt.Errorf("%w: PinBudget = %g, want a share of the pool in [0, 1]", ErrBadConfig, cfg.PinBudget)
	case cfg.PinBudget > 0 && int(cfg.PinBudget*float64(cfg.NumPages)) == 0:
		return nil, fmt.Errorf("%w: PinBudget = %g of %d pages is no page, want 0 (no budget) or at least %g",
			ErrBadConfig, cfg.PinBudget, cfg.NumPages, 1/float64(cfg.NumPages))
	case !(cfg.ShadowRate >= 0 && cfg.ShadowRate <= 1):
		return nil, fmt.Errorf("%w: ShadowRate = %g, want 0..1", ErrBadConfig, cfg.ShadowRate)
	}
	np := cfg.Priorities
	if np == 0 {
		np = DefaultPriorities
	}
	nodes := make([]node, cfg.NumPages)
	queues, err := evict.NewQueuesIn(cfg.Eviction, np, nodes, func(n *node) *evict.Link { return &n.link })
	if err != nil {
		return nil, fmt.Errorf("Config.Eviction: %w: %w", ErrBadConfig, err)
	}
	seed := cfg.Seed
	if seed == 0 {
		var b [8]byte
		_, _ = crand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
		seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	c := &Cache{
		pageSize:  cfg.PageSize,
		refs:      cfg.Refs,
		seed:      seed,
		hashFn:    cfg.Hash,
		sink:      cfg.Sink,
		nodes:     nodes,
		tokens:    make([]int32, cfg.NumPages*cfg.PageSize),
		byHash:    newIndex(cfg.NumPages),
		rootKey:   make(map[int32]string),
		keys:      make(map[Namespace]Key),
		queues:    queues,
		maxPinned: cfg.MaxPinnedPages,
		pinBudget: int(cfg.PinBudget * float64(cfg.NumPages)),
		pinShare:  cfg.PinBudget,
		pins:      make(map[PinID]Handle),
		ttlSlot:   make(map[PinID]int32),
		ttlAt:     make(map[int32]int32),
	}
	for i := range c.nodes {
		c.nodes[i] = node{parent: none, child: none, next: none, prev: none, nextHash: none}
	}
	if cfg.ShadowRate > 0 {
		if c.shadow, err = evict.NewShadow(cfg.NumPages, cfg.ShadowRate); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	}
	c.defaultKey = c.Key(Namespace{})
	return c, nil
}

// keyOf maps the zero Key to the default namespace's, so that a Key{} the
// caller never prepared finds and publishes exactly what
// Key(Namespace{}) does. No prepared Key has an empty id: the encoding of
// every namespace, the zero one included, carries its field tags.
func (c *Cache) keyOf(k Key) Key {
	if k.id == "" {
		return c.defaultKey
	}
	return k
}

// PageSize returns the number of tokens per page.
func (c *Cache) PageSize() int { return c.pageSize }

// NumPriorities returns the number of priority levels.
func (c *Cache) NumPriorities() int { return c.queues.Levels() }

// Eviction returns the name of the eviction policy.
func (c *Cache) Eviction() string { return c.queues.Name() }

// maxMemoKeys bounds Cache.keys; past it the memo starts over.
const maxMemoKeys = 1024

// Key prepares a namespace for lookups and publishing. The last 1024
// namespaces' keys are remembered, so that admitting a request in a
// namespace seen before allocates nothing.
func (c *Cache) Key(ns Namespace) Key {
	if k, ok := c.keys[ns]; ok {
		return k
	}
	id := ns.encode()
	k := Key{id: id, hash: hashBytes(c.seed, []byte(id))}
	if len(c.keys) >= maxMemoKeys {
		clear(c.keys)
	}
	c.keys[ns] = k
	return k
}

// hash chains one page.
func (c *Cache) hash(prev uint64, tokens []int32) uint64 {
	if c.hashFn != nil {
		return c.hashFn(prev, tokens)
	}
	return hashTokens(c.seed, prev, tokens)
}

// pageTokens returns the stored tokens of page p.
func (c *Cache) pageTokens(p int32) []int32 {
	off := int(p) * c.pageSize
	return c.tokens[off : off+c.pageSize : off+c.pageSize]
}

// find returns the cached page with hash h, parent parent, and tokens, in
// namespace key (checked at depth 0), or none. Equal hashes are only a hint:
// the parent and every token are compared, so a collision costs a compare,
// never a wrong page.
func (c *Cache) find(h uint64, parent int32, key *Key, tokens []int32) int32 {
	for x := c.byHash.get(c.nodes, h); x != none; x = c.nodes[x].nextHash {
		n := &c.nodes[x]
		if n.hash != h || n.parent != parent || !slices.Equal(c.pageTokens(x), tokens) {
			continue
		}
		if parent == none && c.rootKey[x] != key.id {
			continue
		}
		return x
	}
	return none
}

// resolve returns the node a handle names (none for a root), or false if the
// handle is stale or out of range.
func (c *Cache) resolve(h Handle) (int32, bool) {
	if h.page == 0 {
		return none, true
	}
	p := h.page - 1
	if p < 0 || int(p) >= len(c.nodes) {
		return none, false
	}
	n := &c.nodes[p]
	return p, n.cached() && n.gen == h.gen
}

func (c *Cache) handle(p int32) Handle {
	if p == none {
		return Handle{}
	}
	return Handle{page: p + 1, gen: c.nodes[p].gen}
}

// Match finds the longest cached prefix of tokens in namespace key, page by
// page, up to maxPages full pages (and never past len(tokens)/PageSize). It
// appends the matched pages to dst and returns it with the handle of the
// last matched page (the root if none matched). Match changes nothing: the
// caller takes its own reference on the pages (for example with
// pagetable.Table.AddShared) and then calls [Cache.Recheck] on them.
//
// Cost: one hash of PageSize tokens, one map probe and one PageSize-token
// compare per matched page, plus one for the first miss.
func (c *Cache) Match(dst []PageID, key Key, tokens []int32, maxPages int) ([]PageID, Handle) {
	np := min(max(maxPages, 0), len(tokens)/c.pageSize)
	key = c.keyOf(key)
	h, parent := key.hash, none
	for i := range np {
		page := tokens[i*c.pageSize : (i+1)*c.pageSize]
		h = c.hash(h, page)
		x := c.find(h, parent, &key, page)
		if x == none {
			break
		}
		dst = append(dst, PageID(x))
		parent = x
	}
	return dst, c.handle(parent)
}

// Publish adds page, which holds tokens (exactly PageSize of them), to the
// cache as the page after parent in namespace key (key is read only when
// parent is a root), with priority prio, and takes a reference on it. If
// that prefix is already cached on another page, Publish changes nothing and
// returns the existing page's handle with added false: the caller keeps its
// page as a private duplicate and can chain later pages under the returned
// handle.
//
// It fails, changing nothing, with [ErrStaleHandle] if parent was evicted,
// [ErrPageCached] if page is cached already, [ErrBadArgument] for a bad page,
// length or priority, and with the allocator's error if page is not
// allocated.
func (c *Cache) Publish(parent Handle, key Key, page PageID, tokens []int32, prio Priority) (h Handle, added bool, err error) {
	par, ok := c.resolve(parent)
	switch {
	case !ok:
		return Handle{}, false, fmt.Errorf("%w: publish page %d under page %d (generation %d)", ErrStaleHandle, page, parent.page-1, parent.gen)
	case page < 0 || int(page) >= len(c.nodes):
		return Handle{}, false, fmt.Errorf("%w: publish page %d outside the pool [0, %d)", ErrBadArgument, page, len(c.nodes))
	case len(tokens) != c.pageSize:
		return Handle{}, false, fmt.Errorf("%w: publish page %d with %d tokens, want a full page of %d", ErrBadArgument, page, len(tokens), c.pageSize)
	case int(prio) >= c.queues.Levels():
		return Handle{}, false, fmt.Errorf("%w: publish page %d with priority %d, want 0..%d", ErrBadArgument, page, prio, c.queues.Levels()-1)
	}
	key = c.keyOf(key)
	ph := key.hash
	if par != none {
		ph = c.nodes[par].hash
	}
	hv := c.hash(ph, tokens)
	if x := c.find(hv, par, &key, tokens); x != none {
		if c.shadow != nil {
			c.shadow.Ref(hv)
		}
		c.counters.Duplicates++
		return c.handle(x), false, nil
	}
	p := int32(page)
	if c.nodes[p].cached() {
		return Handle{}, false, fmt.Errorf("%w: publish page %d under page %d: it is cached at depth %d",
			ErrPageCached, page, par, c.depth(p))
	}
	c.one[0] = page // a variadic call through an interface would allocate the slice
	if err := c.refs.Retain(c.one[:]...); err != nil {
		return Handle{}, false, fmt.Errorf("prefixcache: publish page %d: %w", page, err)
	}

	// Commit: nothing below fails.
	if c.shadow != nil {
		c.shadow.Ref(hv)
	}
	copy(c.pageTokens(p), tokens)
	n := &c.nodes[p]
	*n = node{
		hash: hv, parent: par, child: none, next: none, prev: none, nextHash: none,
		gen: n.gen, prio: prio, state: stCached,
	}
	if c.queues.Returned(int(prio), hv) {
		n.state |= stReturned
	}
	if c.lapse != nil {
		c.lapse[p] = 0
	}
	if par == none {
		c.rootKey[p] = key.id
	} else {
		pn := &c.nodes[par]
		if pn.child != none {
			c.nodes[pn.child].prev = p
			n.next = pn.child
		}
		pn.child = p
		pn.children++
		n.depth = pn.depth + 1
		if pn.depth == ^uint16(0) {
			n.depth = pn.depth
		}
	}
	n.nextHash = c.byHash.push(c.nodes, hv, p)
	c.nCached++
	c.counters.Published++
	c.recheck(p)
	if invariants.Enabled {
		c.checkNode(p)
	}
	if c.sink != nil {
		c.sink.PageStored(page, hv, PageID(par), ph, key, tokens)
	}
	return c.handle(p), true, nil
}

// depth returns the number of pages before p in its prefix.
func (c *Cache) depth(p int32) int {
	d := 0
	for x := c.nodes[p].parent; x != none; x = c.nodes[x].parent {
		d++
	}
	return d
}

// Recheck re-reads the reference counts of pages after their holders changed
// (a request released them, or started using them after [Cache.Match]).
// Cached pages now held by the cache alone become idle and join the tail (the
// most recently used end) of their priority's LRU list, in argument order;
// cached pages with other holders leave it. Pages that are not cached are
// ignored.
//
// Pass a released request's pages deepest first: then a prefix's later pages
// are evicted before its earlier ones, and a page is normally evicted only
// after every page that extends it.
func (c *Cache) Recheck(pages ...PageID) {
	for _, p := range pages {
		if p >= 0 && int(p) < len(c.nodes) && c.nodes[p].cached() {
			c.recheck(int32(p))
			if invariants.Enabled {
				c.checkNode(int32(p))
			}
		}
	}
}

// recheck sets the idle bit of cached page p from its reference count.
func (c *Cache) recheck(p int32) {
	n := &c.nodes[p]
	idle := c.refs.RefCount(PageID(p)) == 1
	if idle == n.idle() {
		return
	}
	if idle {
		n.state |= stIdle
		if n.pins == 0 {
			c.pushLRU(p)
		} else {
			c.nIdlePinned++
		}
		c.timeLapse(p)
		return
	}
	if n.pins == 0 {
		c.queues.Reuse(p)
	} else {
		c.nIdlePinned--
	}
	n.state &^= stIdle
	c.timeLapse(p)
}

// Raise lifts the priority of the cached pages among pages to at least prio;
// an idle page that changes level moves to the tail of its new list.
func (c *Cache) Raise(prio Priority, pages ...PageID) error {
	if int(prio) >= c.queues.Levels() {
		return fmt.Errorf("%w: raise to priority %d, want 0..%d", ErrBadArgument, prio, c.queues.Levels()-1)
	}
	for _, p := range pages {
		if p < 0 || int(p) >= len(c.nodes) {
			continue
		}
		n := &c.nodes[p]
		if !n.cached() || n.prio >= prio {
			continue
		}
		c.requeue(int32(p), func(n *node) { n.prio = prio })
	}
	return nil
}

// requeue applies change (to what places the page on a queue) to cached
// page p's node; a listed page moves to the tail of its new queue.
func (c *Cache) requeue(p int32, change func(*node)) {
	n := &c.nodes[p]
	if !n.listed() {
		change(n)
		return
	}
	c.unlinkLRU(p)
	change(n)
	c.pushLRU(p)
}

// Hit records that the cached pages among pages served a hit (a request
// was admitted on them): eviction policies other than LRU keep pages that
// served hits longer. Call it with the whole matched prefix, so a page's
// hits are never fewer than its descendants'. Pages that are not cached are
// ignored; the count saturates.
func (c *Cache) Hit(pages ...PageID) {
	for _, p := range pages {
		if p >= 0 && int(p) < len(c.nodes) && c.nodes[p].cached() {
			n := &c.nodes[p]
			if c.shadow != nil {
				c.shadow.Ref(n.hash)
			}
			n.hint = evict.HintNone
			if n.pins > 0 && len(c.ttlAt) > 0 {
				c.refreshTTL(int32(p))
			}
			if n.hits < ^uint32(0) {
				n.hits++
			}
		}
	}
}

// Hint sets the continuation hint of the cached pages among pages: what
// the engine expects of their chain once its request lets them go (see
// evict.Hint). Only the "adaptive" policy reads it: it keeps hinted pages
// on queues of their own and learns how much reuse each earns. A page
// that serves a hit loses its hint (its new holder hints it again); an
// idle page moves to the tail of its new queue. Pages that are not cached
// are ignored; a hint outside evict's hints is ErrBadArgument, and nothing
// changes.
func (c *Cache) Hint(h evict.Hint, pages ...PageID) error {
	if h >= evict.NumHints {
		return fmt.Errorf("%w: hint %d, want 0..%d", ErrBadArgument, h, evict.NumHints-1)
	}
	for _, p := range pages {
		if p < 0 || int(p) >= len(c.nodes) || !c.nodes[p].cached() {
			continue
		}
		if c.nodes[p].hint != h {
			c.requeue(int32(p), func(n *node) { n.hint = h })
		}
	}
	return nil
}

// Entry returns the tokens of the page h names (read-only, valid while the
// page is cached) and the handle of the page before it (a root at depth
// 0); live is false for a root or a stale handle.
func (c *Cache) Entry(h Handle) (tokens []int32, parent Handle, live bool) {
	x, ok := c.resolve(h)
	if !ok || x == none {
		return nil, Handle{}, false
	}
	return c.pageTokens(x), c.handle(c.nodes[x].parent), true
}

// Cached reports whether page p is in the cache.
func (c *Cache) Cached(p PageID) bool {
	return p >= 0 && int(p) < len(c.nodes) && c.nodes[p].cached()
}

// Idle returns the number of cached pages held by the cache alone: evictable
// ones (no pin) and pinned ones.
func (c *Cache) Idle() (evictable, pinned int) { return c.queues.Len(), c.nIdlePinned }

// Len returns the number of cached pages.
func (c *Cache) Len() int { return c.nCached }

// Pinned returns the number of cached pages with at least one pin.
func (c *Cache) Pinned() int { return c.nPinned }

// Counters are the cache's cumulative event counts.
type Counters struct {
	Published  int64 // pages added by Publish
	Duplicates int64 // Publish calls that found the prefix already cached
	Evicted    int64 // pages removed by eviction (victims and the pages cut with them)
	Freed      int64 // of Evicted, pages returned to the pool (the cache was their last holder)
	Victims    int64 // eviction victims (idle, unpinned pages chosen from an LRU list)
	// InnerVictims counts victims that still had children when chosen: their
	// subtree went with them. With full attention and no duplicates it stays
	// 0 (children always become idle before their parent); sliding-window
	// releases and duplicates can make an old parent idle under busy
	// children.
	InnerVictims int64
}

// Shadow returns the live miss-ratio curve's estimates (Config.ShadowRate);
// ok is false without one.
func (c *Cache) Shadow() (e evict.ShadowEstimates, ok bool) {
	if c.shadow == nil {
		return e, false
	}
	return c.shadow.Estimates(), true
}

// Counters returns the cumulative event counts.
func (c *Cache) Counters() Counters { return c.counters }
