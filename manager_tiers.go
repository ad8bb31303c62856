package pagedkv

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/host"
)

// The tiers below the device pool (docs/tiers.md): their configuration
// and state, a group's part of them (planning offload and onload copies
// for its pages, the remote lookups of its admission, its tier digests)
// and the Manager's tier calls. What spans the groups (completing copies,
// admission over the tiers, eviction with offload, their audit) is the
// core's, in core_tiers.go. The rest of the package calls a few hooks:
// tierChainStart, tierPublished, tierChainAt, loaded and settleLoaded,
// evictTo and evictAhead, and cacheRefs under the cache.

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
}

// tiers is the Manager's state for the tiers below the device.
type tiers struct {
	host         *host.Pool
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
	dev     []PageID
	buf     []byte
	one     [1]PageID

	c TierStats
}

// cacheRefs is the prefix cache's view of the allocator: with tiers, the
// references the cache drops on eviction go through it, so an evicted page
// the host tier takes is handed to an offload copy instead of freed.
type cacheRefs struct{ m *group }

func (c cacheRefs) Retain(pages ...PageID) error { return c.m.alloc.Retain(pages...) }
func (c cacheRefs) RefCount(p PageID) int32      { return c.m.alloc.RefCount(p) }
func (c cacheRefs) Release(pages ...PageID) (int, error) {
	t := c.m.tiers
	rel := t.rel[:0]
	offloaded := 0
	for _, p := range pages {
		md := &t.meta[p]
		valid := md.valid
		md.valid = false // p leaves the cache
		if !valid || c.m.alloc.RefCount(p) != 1 {
			rel = append(rel, p) // a request keeps it, or it was never published with tiers
			continue
		}
		if t.host.Has(md.digest) {
			rel = append(rel, p) // backed below: dropping loses nothing
			continue
		}
		if t.offloading {
			if h, ok := t.claim(md.digest, md.parent, t.pageTokens(p)); ok {
				t.hostFirst[h] = md.first
				t.hostClaimed(h, hostName{md.hash, md.parentHash, md.root, md.lora, c.m.tierGroup})
				// The cache's reference becomes the copy's.
				t.plan(c.m, tier.ToHost, p, h, nil, 0, true)
				offloaded++
				t.evicting++
				continue
			}
			t.c.HostFull++
		}
		t.c.DroppedPages++
		rel = append(rel, p)
	}
	t.rel = rel
	freed, err := c.m.alloc.Release(rel...)
	if err == nil && t.offloading {
		freed += offloaded
	}
	return freed, err
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
		MemoryLimit: cfg.MemoryLimit})
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

func (t *tiers) hostClaimed(h HostPageID, n hostName) {
	if t.hostLive[h] {
		t.hostLive[h] = false
		if t.ev != nil {
			t.ev[t.hostName[h].group].HostPageRemoved(int(h), t.hostName[h].hash)
		}
	}
	t.hostName[h] = n
}

// hostWritten announces host page h, just made ready.
func (t *tiers) hostWritten(h HostPageID) {
	t.hostLive[h] = true
	if t.ev != nil {
		n := &t.hostName[h]
		t.ev[n.group].HostPageStored(int(h), n.hash, n.parentHash, !n.root, n.lora, t.host.Tokens(h))
	}
}

// plan records a copy for group m (whose cache or request r the device
// page is for) in a free slot; the caller has arranged its device
// reference (the copy owns one).
func (t *tiers) plan(m *group, dir tier.Direction, dev PageID, h HostPageID, r *request, reqGen uint64, evicted bool) {
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
		if err := t.host.Written(c.host); err != nil {
			panic(fmt.Sprintf("pagedkv: completing the offload of page %d to host page %d: %v", c.dev, c.host, err))
		}
		t.hostWritten(c.host)
		t.c.OffloadedPages++
		t.c.BytesToHost += c.bytes
		m.groupTiers.offloaded.Add(1)
		if t.remote != nil {
			d, parent, _, _, _ := t.host.Entry(c.host)
			p := tier.RemotePage{Digest: d, Parent: parent, Chain: t.hostFirst[c.host], Tokens: t.host.Tokens(c.host), Data: t.host.Page(c.host)}
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
		m.groupTiers.onloaded.Add(1)
	}
	t.one[0] = c.dev
	freed, err := m.alloc.Release(t.one[:]...)
	if err != nil {
		panic(fmt.Sprintf("pagedkv: releasing page %d after its tier copy: %v", c.dev, err))
	}
	if freed == 0 {
		m.cache.Recheck(c.dev)
	}
	if c.evicted {
		t.evicting--
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

// loaded publishes r, whose onloads are all complete, and releases what
// its group's attention no longer reads (admission left it the whole
// prefix while loading). During a step a windowed group does both when
// the step ends (settleLoaded); a full group publishes r at its next
// commit.
func (m *group) loaded(r *request) {
	switch {
	case !m.pending:
		m.publish(r)
		m.releaseWindow(r)
	case m.layerGroup.KeepTokens(0) >= 0:
		m.settle = append(m.settle, loadedReq{r, r.gen})
	}
}

// settleLoaded runs loaded for the requests whose onloads completed during
// the step that just ended.
func (m *group) settleLoaded() {
	for _, l := range m.settle {
		if r := l.r; m.reqs[r.id] == r && r.gen == l.gen && r.running && r.loading == 0 {
			m.loaded(r)
		}
	}
	clear(m.settle)
	m.settle = m.settle[:0]
}

// loadedReq is a request at admission gen whose onloads completed.
type loadedReq struct {
	r   *request
	gen uint64
}

// tierProbe continues r's device match of pages (whose chain ends at
// r.tchain) with up to want pages of the host tier and then of the remote
// store (fetched into host pages), appending each to hits as a host page
// it holds as a reader. It returns hits and how many of them the host tier
// held before the fetch.
func (m *group) tierProbe(r *request, pages []PageID, want int, hits []HostPageID) ([]HostPageID, int) {
	t, ps := m.tiers, m.pageSize
	k := len(pages)
	d, first := r.tchain, r.tfirst
	// hv: the 64-bit chain hash after the pages so far (KV events name
	// fetched host pages by it).
	hv := r.key.Hash()
	if k > 0 {
		hv = t.meta[pages[k-1]].hash
	}
	j := k
	for ; j < k+want; j++ {
		tok := r.tokens[j*ps : (j+1)*ps]
		nd := tier.Next(t.buf[:0], d, tok)
		if j == 0 {
			first = nd
		}
		h, ok := t.host.Lookup(nd, d, tok)
		if !ok {
			break
		}
		// A reader now, so the claims below cannot reclaim it.
		if err := t.host.Acquire(h); err != nil {
			panic(fmt.Sprintf("pagedkv: acquiring host page %d for an onload: %v", h, err))
		}
		hits = append(hits, h)
		d, hv = nd, t.hostName[h].hash
	}
	hostHits := len(hits)
	// Remote: claim host pages for the rest, fetch into them in one batch.
	if t.remote != nil && j < k+want {
		t.claims, t.fetch = t.claims[:0], t.fetch[:0]
		for ; j < k+want; j++ {
			tok := r.tokens[j*ps : (j+1)*ps]
			nd := tier.Next(t.buf[:0], d, tok)
			if j == 0 {
				first = nd
			}
			h, err := t.host.Claim(nd, d, tok)
			if err != nil {
				break // present (an offload in flight) or no room
			}
			t.hostFirst[h] = first
			nh := t.hasher.Page(hv, tok)
			t.hostClaimed(h, hostName{hash: nh, parentHash: hv, root: j == 0, lora: r.key.Namespace().LoRA, group: m.tierGroup})
			hv = nh
			t.claims = append(t.claims, h)
			t.fetch = append(t.fetch, tier.RemotePage{Digest: nd, Parent: d, Chain: first, Tokens: t.host.Tokens(h), Data: t.host.Page(h)})
			d = nd
		}
		if len(t.claims) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), t.deadline)
			got := t.remote.Fetch(ctx, t.fetch)
			cancel()
			got = max(0, min(got, len(t.claims)))
			for i, h := range t.claims {
				var err error
				if i < got {
					if err = t.host.Written(h); err == nil {
						t.hostWritten(h)
						err = t.host.Acquire(h)
					}
					hits = append(hits, h)
				} else {
					err = t.host.Abandon(h)
				}
				if err != nil {
					panic(fmt.Sprintf("pagedkv: host page %d after a remote fetch: %v", h, err))
				}
			}
			t.c.RemoteFetched += int64(got)
			clear(t.fetch) // drop references to host memory
		}
	}
	return hits, hostHits
}

// tierOnload plans the onload of host pages hits (held as readers; the
// first hostHits of them found in the host tier, the rest fetched from the
// remote store) into as many fresh device pages, which must be free, and
// returns pages with them appended. r waits for the copies (r.loading).
func (m *group) tierOnload(r *request, pages []PageID, hits []HostPageID, hostHits int) []PageID {
	t, n := m.tiers, len(hits)
	t.dev = append(t.dev[:0], make([]PageID, n)...)[:n]
	if err := m.alloc.Alloc(t.dev); err != nil {
		panic(fmt.Sprintf("pagedkv: allocating %d onload pages with %d free: %v", n, m.alloc.NumFree(), err))
	}
	for i, h := range hits {
		// The host page's reader and Alloc's reference are the copy's;
		// AddShared adds the request's.
		t.plan(m, tier.ToDevice, t.dev[i], h, r, r.gen, false)
	}
	r.loading = n
	t.c.HostHitTokens += int64(hostHits * m.pageSize)
	t.c.RemoteHitTokens += int64((n - hostHits) * m.pageSize)
	m.groupTiers.hostHitTokens.Add(int64(hostHits * m.pageSize))
	m.groupTiers.remoteHitTokens.Add(int64((n - hostHits) * m.pageSize))
	return append(pages, t.dev...)
}

// tierPublished records the tier identity of r's page d, just published on
// page (added: a new cache entry; else a duplicate of a cached one), and
// writes it through to the host tier when configured.
func (m *group) tierPublished(r *request, page PageID, tokens []int32, added bool) {
	t := m.tiers
	nd := tier.Next(t.buf[:0], r.tchain, tokens)
	if r.tchain == r.troot { // depth 0
		r.tfirst = nd
	}
	if added {
		hash, parentHash, root, ok := m.cache.PageHash(page)
		if !ok {
			panic(fmt.Sprintf("pagedkv: page %d, just published, is not cached", page))
		}
		if root {
			parentHash = r.key.Hash() // h_{-1}: what Audit rehashes from
		}
		t.meta[page] = pageMeta{digest: nd, parent: r.tchain, first: r.tfirst, valid: true,
			hash: hash, parentHash: parentHash, root: root, lora: r.key.Namespace().LoRA}
		copy(t.pageTokens(page), tokens)
		if t.writeThrough && !t.host.Has(nd) {
			if h, ok := t.claim(nd, r.tchain, tokens); ok {
				t.hostFirst[h] = r.tfirst
				t.hostClaimed(h, hostName{hash, parentHash, root, t.meta[page].lora, m.tierGroup})
				t.one[0] = page
				if err := m.alloc.Retain(t.one[:]...); err != nil {
					panic(fmt.Sprintf("pagedkv: retaining page %d for its write-through: %v", page, err))
				}
				t.plan(m, tier.ToHost, page, h, nil, 0, false)
				m.cache.Recheck(page)
			} else {
				t.c.HostFull++
			}
		}
	}
	r.tchain = nd
}

// tierChainStart sets r.tchain to the digest after its device-matched
// pages.
func (m *group) tierChainStart(r *request, pages []PageID) {
	if len(pages) == 0 {
		r.tchain, r.tfirst = r.troot, tier.Digest{}
		return
	}
	md := &m.tiers.meta[pages[len(pages)-1]]
	if !md.valid {
		panic(fmt.Sprintf("pagedkv: matched page %d has no tier identity", pages[len(pages)-1]))
	}
	r.tchain, r.tfirst = md.digest, md.first
}

// tierChainAt resets r.tchain to the digest of r's chain (pages
// [0, cachedPages)) after the chain moved back (Truncate).
func (m *group) tierChainAt(r *request) {
	p, ok := r.chain.Page()
	if !ok {
		r.tchain, r.tfirst = r.troot, tier.Digest{}
		return
	}
	if _, _, live := m.cache.Entry(r.chain); !live {
		return // evicted: the next publish cuts the chain
	}
	md := &m.tiers.meta[p]
	r.tchain, r.tfirst = md.digest, md.first
}

// tierRoot returns the tier digest every chain of ns starts from in this
// Manager: the namespace's root (tier.NamespaceRoot) for a dense Manager;
// for a group of a HybridManager, that root followed by the group's
// identity (tierTag), so no two groups share a digest, in the host tier
// or in a remote store's keys (docs/tiers.md, "Hybrid groups").
func (m *group) tierRoot(ns Namespace) tier.Digest {
	d := tier.NamespaceRoot(ns.Tenant, ns.LoRA, ns.Salt)
	if m.tierTag == "" {
		return d
	}
	h := sha256.New()
	h.Write([]byte("pagedkv/tier/group/v1"))
	h.Write(d[:])
	h.Write([]byte(m.tierTag))
	h.Sum(d[:0])
	return d
}

// groupTierTag is group g's tier identity: its index and its spec.
func groupTierTag(g int, s LayerGroup) string {
	return fmt.Sprintf("g%d:%v:w%d:c%d:l%d", g, s.Kind, s.WindowTokens, s.ChunkTokens, s.NumLayers)
}

// auditTierRequests checks each request's loading count against its
// onloads in flight (loading) and its tier chain digest against its cache
// chain.
func (m *group) auditTierRequests(loading map[*request]int) error {
	t := m.tiers
	for _, r := range m.reqs {
		if r.loading != loading[r] {
			return fmt.Errorf("pagedkv: request %d waits for %d onloads, %d are in flight", r.id, r.loading, loading[r])
		}
		if !r.running || r.noCache || r.chainCut {
			continue
		}
		want := r.troot
		if p, ok := r.chain.Page(); ok {
			if _, _, live := m.cache.Entry(r.chain); !live {
				continue
			}
			want = t.meta[p].digest
		}
		if r.tchain != want {
			return fmt.Errorf("pagedkv: request %d's tier chain digest %s is not its cache chain's %s", r.id, r.tchain.String()[:16], want.String()[:16])
		}
	}
	return nil
}

// HostCachedHashes appends the chain hash of every servable host page to
// dst and returns it: the page set KV events with medium "CPU" describe.
func (m *Manager) HostCachedHashes(dst []uint64) []uint64 { return m.core.hostCachedHashes(dst) }

// Loading reports whether request id waits for onload copies: it may not
// take part in a step (or fork) until they are complete.
func (m *Manager) Loading(id RequestID) bool { return m.core.loading(id) }

// loading reports whether request id waits for onload copies in the group.
func (m *group) loading(id RequestID) bool { r, ok := m.reqs[id]; return ok && r.loading > 0 }
