package pagedkv

import (
	"errors"
	"fmt"
	"time"

	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/host"
)

// The tiers below the device pool (docs/tiers.md): their configuration,
// their state (one tiers value, the core's, shared by its groups: the host
// pool, the remote store, the tier copies in flight) and the Manager's
// tier calls. A group's part of them is in group_tiers.go, what spans the
// groups (completing copies, admission over the tiers, eviction with
// offload, their audit) in core_tiers.go.

// HostPageID is a page of the host tier.
type HostPageID = tier.HostPageID

// DefaultRemoteDeadline bounds a remote lookup when
// TierConfig.RemoteDeadline is 0.
const DefaultRemoteDeadline = 20 * time.Millisecond

// ErrLoading reports a step, fork or copy completion that needs a request
// whose onload copies (host to device) are still in flight: complete them
// first ([Manager.CompleteTierCopies]).
var ErrLoading = errors.New("pagedkv: request is loading pages from a lower tier")

// TierConfig configures the tiers below the device pool. The zero value
// has none.
type TierConfig struct {
	// HostPages is the number of host (CPU) pages; 0 means no host tier.
	HostPages int
	// Format is the byte format of a page off the device. When set
	// (Layers > 0) the host tier owns HostPages*Format.PageBytes() bytes
	// ([Manager.HostPage]); a remote store needs it. The zero value keeps
	// the host tier as bookkeeping only: the engine holds the host pages'
	// bytes itself, indexed by HostPageID.
	Format tier.PageFormat
	// HostMemory, if not nil, is the host pages' memory (pinned memory the
	// engine allocated): HostPages*Format.PageBytes() bytes.
	HostMemory []byte
	// Remote is a store shared with other Managers; nil means none. It
	// needs HostPages > 0 and Format: fetched pages land in host pages and
	// are onloaded from there, and published pages are written through the
	// host tier to the store.
	Remote tier.RemoteStore
	// RemoteDeadline bounds each remote lookup (0: DefaultRemoteDeadline).
	// Past it the Manager serves what it has and counts the failure.
	RemoteDeadline time.Duration
	// OffloadFreePages makes Commit evict ahead of need, offloading the
	// victims to the host tier, until at least this many device pages are
	// free or on their way to free (offloads in flight). On-demand eviction
	// in Reserve frees pages for the step at once, so it cannot wait for an
	// offload and drops pages no host page backs; evicting ahead keeps that
	// rare. 0 disables it.
	OffloadFreePages int
	// WriteThrough offloads every page when it is published, so device
	// eviction never loses it (while the host tier keeps it). Implied by
	// Remote, which receives every published page this way.
	WriteThrough bool
}

// HostEventSink is implemented by a [Config.CacheEvents] sink that also
// announces the host tier's pages (events.Recorder does): a host page is
// stored when it becomes servable (the engine completed its offload, or a
// remote fetch landed in it) and removed when the host tier reclaims it.
// Its HostPages must equal TierConfig.HostPages. A CacheEvents sink
// without these methods hears of device pages only.
type HostEventSink interface {
	// HostPages is the number of host pages the sink tracks.
	HostPages() int
	// HostPageStored: host page page now holds tokens at chain hash hash
	// (the device cache's 64-bit chain); parentHash is the chain hash of
	// the page before it (hasParent is false at depth 0) and lora the
	// namespace's LoRA adapter.
	HostPageStored(page int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32)
	// HostPageRemoved: host page page, which had chain hash hash, was
	// reclaimed.
	HostPageRemoved(page int, hash uint64)
}

// TierCopy is a page copy between the device pool and the host tier that
// the engine runs asynchronously (e.g. on a side stream) and then reports
// with [Manager.CompleteTierCopies]: every layer's K and V of device page
// Device to host page Host (Dir == tier.ToHost, offload) or back
// (tier.ToDevice, onload), in the byte format of TierConfig.Format. Until
// completion the Manager neither reuses the source nor hands the
// destination to attention.
type TierCopy struct {
	ID     uint64
	Dir    tier.Direction
	Device PageID
	Host   HostPageID
}

// TierStats are the tiers' counters in [Stats].
type TierStats struct {
	HostPages     int // pages in the host tier (0: none)
	HostUsedPages int // host pages being written or holding a page
	InFlight      int // tier copies planned and not completed

	HostHitTokens   int64 // prompt tokens served from host pages (Add and Resume)
	RemoteHitTokens int64 // prompt tokens served from the remote store
	OffloadedPages  int64 // device-to-host copies completed
	OnloadedPages   int64 // host-to-device copies completed
	BytesToHost     int64 // bytes of completed offloads (0 without a Format)
	BytesToDevice   int64 // bytes of completed onloads
	DroppedPages    int64 // cached pages evicted with no copy below them
	HostFull        int64 // offloads not planned: no host page free or reclaimable
	RemoteFetched   int64 // pages fetched from the remote store into host pages
	RemoteStored    int64 // pages handed to the remote store's write queue

	// Remote is the remote store's own counters (errors, timeouts,
	// rejected values, bytes per direction).
	Remote tier.RemoteStats
}

// pageMeta is the tier identity of a cached device page.
type pageMeta struct {
	digest, parent, first tier.Digest
	valid                 bool // the page is cached and published with tiers on
	// The cache's 64-bit chain hashes (KV events name host pages by them);
	// at depth 0 parentHash is the namespace's seed h_{-1}.
	hash, parentHash uint64
	root             bool   // depth 0: no parent
	lora             string // the namespace's LoRA adapter
}

// hostName is what KV events call a host page: its device chain hash, and
// the group whose digest chain it holds (Manager.tierGroup).
type hostName struct {
	hash, parentHash uint64
	root             bool
	lora             string
	group            uint16
	state            bool // a state checkpoint's page (state_tiers.go): not announced
}

// tierCopy is one copy's record; the copy holds one allocator reference on
// its device page until completion.
type tierCopy struct {
	gen     uint32 // slot generation: the high half of the copy ID
	live    bool
	issued  bool // handed to the engine by TierCopies
	mark    uint64
	owner   *group // the group whose page it is
	dir     tier.Direction
	dev     PageID
	host    HostPageID
	req     *request // onload: the request it loads into, at admission reqGen
	reqGen  uint64
	bytes   int64
	evicted bool // an offload of an evicted page: it frees on completion
	// A state checkpoint's copy has no owner group; ckpt is the
	// checkpoint an onload loads or a write-through reads (state_tiers.go).
	ckpt *checkpoint
}

// tiers is the Manager's state for the tiers below the device.
type tiers struct {
	host         *host.Pool
	startClock   func() // the core's: a retention with a Duration came from below
	remote       tier.RemoteStore
	deadline     time.Duration
	pageBytes    int64
	offloadFree  int
	writeThrough bool

	meta      []pageMeta    // [device page]
	tokens    []int32       // [device page * PageSize]: tokens of cached pages
	hostFirst []tier.Digest // [host page]: the chain's first page digest (RemotePage.Chain)

	// KV events of the host tier (medium "CPU"): ev[g] is group g's sink
	// (ev[0] the CacheEvents of a dense Manager when it implements
	// HostEventSink; a HybridManager's GroupSink(g)), nil without host
	// events; hostName names each claimed host page and hostLive marks
	// those announced as stored (exactly the ready pages).
	ev       []HostEventSink
	hasher   prefixcache.Hasher
	hostName []hostName
	hostLive []bool

	copies  []tierCopy
	freeSl  []uint32 // free copy slots
	planned []uint32 // slots planned and not yet issued
	nLive   int
	epoch   uint64

	// Eviction mode, set around cache.Evict: offload victims (else drop)
	// and count offloaded pages as freed (they free on completion).
	offloading bool
	evicting   int // offloaded pages in flight that will free on completion

	rel     []PageID
	digests []tier.Digest
	claims  []HostPageID
	fetch   []tier.RemotePage
	media   []tier.Medium // per fetch page: the medium that served it (tier.FetchMedia)
	dev     []PageID
	// loadRet[p]: the retention device page p's onload brought from below
	// (the host page's), given back to the page when it is published with
	// that digest (retention.go); nil until a retention comes up.
	loadRet []loadedRetention
	buf     []byte
	one     [1]PageID

	// state is the state groups' checkpoints (nil without): copies
	// without an owner group are theirs.
	state *stateSet

	c TierStats
}

// newTiers validates cfg and builds the tiers (nil when none).
func newTiers(cfg *Config) (*tiers, error) {
	tc := &cfg.Tiers
	ev, _ := cfg.CacheEvents.(HostEventSink)
	if ev != nil && ev.HostPages() != tc.HostPages {
		return nil, fmt.Errorf("%w: CacheEvents announces %d host pages, Tiers.HostPages = %d", ErrBadConfig, ev.HostPages(), tc.HostPages)
	}
	if tc.HostPages == 0 {
		if tc.Remote != nil || tc.OffloadFreePages != 0 || tc.WriteThrough || tc.HostMemory != nil || tc.Format.Layers != 0 {
			return nil, fmt.Errorf("%w: Tiers.HostPages = 0, but a remote store, offloading or a page format is set (the tiers stage through host pages)", ErrBadConfig)
		}
		return nil, nil
	}
	if tc.HostPages < 0 {
		return nil, fmt.Errorf("%w: Tiers.HostPages = %d, want >= 0", ErrBadConfig, tc.HostPages)
	}
	pageBytes := 0
	if tc.Format.Layers != 0 {
		if err := tc.Format.Validate(); err != nil {
			return nil, fmt.Errorf("%w: Tiers.Format: %w", ErrBadConfig, err)
		}
		if tc.Format.PageSize != cfg.PageSize {
			return nil, fmt.Errorf("%w: Tiers.Format.PageSize = %d, the pool's PageSize is %d", ErrBadConfig, tc.Format.PageSize, cfg.PageSize)
		}
		pageBytes = tc.Format.PageBytes()
	}
	switch {
	case tc.Remote != nil && pageBytes == 0:
		return nil, fmt.Errorf("%w: Tiers.Remote needs Tiers.Format (fetched pages land in host pages)", ErrBadConfig)
	case tc.HostMemory != nil && pageBytes == 0:
		return nil, fmt.Errorf("%w: Tiers.HostMemory needs Tiers.Format", ErrBadConfig)
	case tc.RemoteDeadline < 0:
		return nil, fmt.Errorf("%w: Tiers.RemoteDeadline = %v, want >= 0", ErrBadConfig, tc.RemoteDeadline)
	case tc.OffloadFreePages < 0 || tc.OffloadFreePages > cfg.NumPages:
		return nil, fmt.Errorf("%w: Tiers.OffloadFreePages = %d, want 0..NumPages (%d)", ErrBadConfig, tc.OffloadFreePages, cfg.NumPages)
	}
	hp, err := host.New(host.Config{NumPages: tc.HostPages, PageSize: cfg.PageSize, PageBytes: pageBytes, Memory: tc.HostMemory,
		Levels: hostLevels(cfg.Priorities), MemoryLimit: cfg.MemoryLimit})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	t := &tiers{
		host: hp, remote: tc.Remote, deadline: tc.RemoteDeadline, pageBytes: int64(pageBytes),
		offloadFree: tc.OffloadFreePages, writeThrough: tc.WriteThrough || tc.Remote != nil,
		meta:      make([]pageMeta, cfg.NumPages),
		tokens:    make([]int32, cfg.NumPages*cfg.PageSize),
		hostFirst: make([]tier.Digest, tc.HostPages),
		ev:        nil,
		hostName:  make([]hostName, tc.HostPages),
		hostLive:  make([]bool, tc.HostPages),
		// tier.Next's scratch: digests cost no allocation.
		buf: make([]byte, 0, 64+32+4*cfg.PageSize),
	}
	if ev != nil {
		t.ev = []HostEventSink{ev}
	}
	if t.deadline == 0 {
		t.deadline = DefaultRemoteDeadline
	}
	t.c.HostPages = tc.HostPages
	return t, nil
}

func (t *tiers) pageTokens(p PageID) []int32 {
	ps := len(t.tokens) / len(t.meta)
	return t.tokens[int(p)*ps : (int(p)+1)*ps]
}

// hostClaimed names host page h, just claimed. A claim may reclaim a ready
// page: its removal is announced first.
// claim claims a host page for an offload, or reports that none is free
// or reclaimable without trying: the failed claim's error allocates, and
// evictions and write-through run on the step's path.
func (t *tiers) claim(d, parent tier.Digest, tokens []int32) (HostPageID, bool) {
	if free, _, _, reclaimable := t.host.Usage(); free == 0 && reclaimable == 0 {
		return 0, false
	}
	h, err := t.host.Claim(d, parent, tokens)
	return h, err == nil
}

// claimFor claims a host page for an offload of the page d (its parent,
// tokens, the digest of its chain's first page and its name), or counts
// the host tier full.
func (t *tiers) claimFor(d, parent tier.Digest, tokens []int32, first tier.Digest, n hostName) (HostPageID, bool) {
	h, ok := t.claim(d, parent, tokens)
	if !ok {
		t.c.HostFull++
		return 0, false
	}
	t.hostFirst[h] = first
	t.hostClaimed(h, n)
	return h, true
}

func (t *tiers) hostClaimed(h HostPageID, n hostName) {
	if t.hostLive[h] {
		t.hostLive[h] = false
		if t.ev != nil && !t.hostName[h].state {
			t.ev[t.hostName[h].group].HostPageRemoved(int(h), t.hostName[h].hash)
		}
	}
	t.hostName[h] = n
}

// hostWritten announces host page h, just made ready.
func (t *tiers) hostWritten(h HostPageID) {
	t.hostLive[h] = true
	if t.ev != nil && !t.hostName[h].state {
		n := &t.hostName[h]
		t.ev[n.group].HostPageStored(int(h), n.hash, n.parentHash, !n.root, n.lora, t.host.Tokens(h))
	}
}

// plan records a copy for group m (whose cache or request r the device
// page is for; nil: a state checkpoint's) in a free slot and returns the
// slot; the caller has arranged its device reference (the copy owns one).
func (t *tiers) plan(m *group, dir tier.Direction, dev PageID, h HostPageID, r *request, reqGen uint64, evicted bool) uint32 {
	var s uint32
	if n := len(t.freeSl); n > 0 {
		s = t.freeSl[n-1]
		t.freeSl = t.freeSl[:n-1]
	} else {
		s = uint32(len(t.copies))
		t.copies = append(t.copies, tierCopy{})
	}
	c := &t.copies[s]
	*c = tierCopy{gen: c.gen + 1, live: true, owner: m, dir: dir, dev: dev, host: h, req: r, reqGen: reqGen, bytes: t.pageBytes, evicted: evicted}
	t.planned = append(t.planned, s)
	t.nLive++
	return s
}

func (t *tiers) id(s uint32) uint64 { return uint64(t.copies[s].gen)<<32 | uint64(s) }

// HostPage returns the bytes of host page h (nil without a host tier or a
// Format). The engine reads and writes them for tier copies.
func (m *Manager) HostPage(h HostPageID) []byte { return m.core.hostPage(h) }

// TierCopies appends to dst the tier copies planned since the last call
// (by Add, Resume, Commit, Evict and Reserve) and returns it. The engine
// runs them, in any order and asynchronously, and reports each with
// [Manager.CompleteTierCopies]. It allocates nothing once dst has room.
func (m *Manager) TierCopies(dst []TierCopy) []TierCopy { return m.core.tierCopies(dst) }

// TierCopiesInFlight returns the number of tier copies planned and not yet
// completed.
func (m *Manager) TierCopiesInFlight() int { return m.core.tierCopiesInFlight() }

// CompleteTierCopies records that the engine finished the copies ids (from
// [Manager.TierCopies]). An offload's host page becomes servable (and is
// written to the remote store), its device page is released (returning to
// the pool if it was evicted); an onload's device page may be attended,
// and once a request's onloads are all done its pages join the prefix
// cache. It may be called during a step. On an unknown, repeated or
// not-yet-issued ID nothing changes and the error names it.
func (m *Manager) CompleteTierCopies(ids ...uint64) error { return m.core.completeTierCopies(ids) }

// complete records copy s as done, in the group it was planned for.
func (t *tiers) complete(s uint32) {
	c := &t.copies[s]
	m := c.owner
	switch c.dir {
	case tier.ToHost:
		if m != nil { // a state checkpoint's copy (owner nil) carries no retention
			t.host.Advance(m.cache.Now()) // what is left of a retention, at the cache's time
		}
		if m != nil && !c.evicted && t.meta[c.dev].valid {
			// A write-through: the page, still cached, has the retention
			// the cache gives it now.
			t.hostRetain(c.host, m.cache.RetentionOf(c.dev))
		}
		if err := t.host.Written(c.host); err != nil {
			panic(fmt.Sprintf("pagedkv: completing the offload of page %d to host page %d: %v", c.dev, c.host, err))
		}
		t.hostWritten(c.host)
		t.c.OffloadedPages++
		t.c.BytesToHost += c.bytes
		if m != nil {
			m.groupTiers.offloaded.Add(1)
		} else {
			t.state.tiers.offloaded.Add(1)
		}
		if t.remote != nil {
			d, parent, _, _, _ := t.host.Entry(c.host)
			p := tier.RemotePage{Digest: d, Parent: parent, Chain: t.hostFirst[c.host], Tokens: t.host.Tokens(c.host), Data: t.host.Page(c.host),
				State: t.hostName[c.host].state, Retention: t.host.Retention(c.host)}
			if t.remote.Store(&p) {
				t.c.RemoteStored++
			}
		}
	case tier.ToDevice:
		if err := t.host.Release(c.host); err != nil {
			panic(fmt.Sprintf("pagedkv: completing the onload of host page %d to page %d: %v", c.host, c.dev, err))
		}
		t.c.OnloadedPages++
		t.c.BytesToDevice += c.bytes
		if m != nil {
			m.groupTiers.onloaded.Add(1)
		} else {
			t.state.tiers.onloaded.Add(1)
		}
	}
	t.one[0] = c.dev
	var freed int
	var err error
	if m != nil {
		freed, err = m.alloc.Release(t.one[:]...)
	} else {
		freed, err = t.state.alloc.Release(t.one[:]...)
	}
	if err != nil {
		panic(fmt.Sprintf("pagedkv: releasing page %d after its tier copy: %v", c.dev, err))
	}
	if freed == 0 && m != nil {
		m.cache.Recheck(c.dev)
	}
	if c.evicted {
		t.evicting--
	}
	if c.ckpt != nil {
		t.state.tierCopied(c.ckpt, c.dir == tier.ToDevice)
	}
	r, reqGen := c.req, c.reqGen
	// Free the slot before publishing: publishing may plan write-through
	// copies, and a plan may grow t.copies, which would leave c pointing
	// into the old array (the slot would stay live in the new one).
	*c = tierCopy{gen: c.gen}
	t.freeSl = append(t.freeSl, s)
	t.nLive--
	if r != nil && m.reqs[r.id] == r && r.gen == reqGen && r.running {
		r.loading--
		if r.loading == 0 {
			m.loaded(r)
		}
	}
}

// groupTierTag is group g's tier identity: its index and its spec.
func groupTierTag(g int, s LayerGroup) string {
	return fmt.Sprintf("g%d:%v:w%d:c%d:l%d", g, s.Kind, s.WindowTokens, s.ChunkTokens, s.NumLayers)
}

// HostCachedHashes appends the chain hash of every servable host page to
// dst and returns it: the page set KV events with medium "CPU" describe.
func (m *Manager) HostCachedHashes(dst []uint64) []uint64 { return m.core.hostCachedHashes(dst) }

// Loading reports whether request id waits for onload copies: it may not
// take part in a step (or fork) until they are complete.
func (m *Manager) Loading(id RequestID) bool { return m.core.loading(id) }
