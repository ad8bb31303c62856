package events

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/pagedkv/pagedkv/prefixcache"
)

// Media of vLLM's "medium" field.
const (
	MediumGPU = "GPU"
	MediumCPU = "CPU"
)

// ErrBadConfig reports an invalid [RecorderConfig] or [PublisherConfig].
var ErrBadConfig = errors.New("events: bad config")

// RecorderConfig describes the cache a [Recorder] observes and the fields
// every event it makes carries.
type RecorderConfig struct {
	// NumPages and PageSize are the Manager's (the mirror keeps one entry
	// and PageSize tokens per page).
	NumPages, PageSize int
	// Medium is vLLM's "medium" field of the device pages' events. ""
	// means [MediumGPU].
	Medium string
	// HostPages is the number of pages of the Manager's host tier
	// (pagedkv.TierConfig.HostPages); 0 means none. With a host tier the
	// Recorder also announces the host pages, with medium [MediumCPU]
	// (HostPageStored, HostPageRemoved), and must have the Manager's
	// number of host pages. With Groups, a host page belongs to the group
	// whose digest chain it holds (a pagedkv.HybridManager's one host tier
	// serves every group): it is announced through [Recorder.GroupSink](g),
	// whose sink also implements the host methods, with group g's
	// "group_idx" and spec fields.
	HostPages int
	// Group, when not nil, is sent as "group_idx" (the KV-cache group of
	// hybrid models); nil leaves the field out, which vLLM's decoder reads
	// as None.
	Group *int
	// SpecKind and SlidingWindow, when set, are sent as
	// "kv_cache_spec_kind" (e.g. "full_attention", "sliding_window") and
	// "kv_cache_spec_sliding_window" on BlockStored events.
	SpecKind      string
	SlidingWindow int
	// Groups, when not empty, makes a Recorder of several KV-cache groups
	// (a pagedkv.HybridManager's, which share one page pool): group g's
	// pages are reported through [Recorder.GroupSink](g) and their events
	// carry "group_idx" g and Groups[g]'s spec fields. Group, SpecKind and
	// SlidingWindow must then be unset.
	Groups []GroupConfig
	// Clock returns the batch timestamp in seconds since the Unix epoch
	// (vLLM's "ts"); nil means the wall clock.
	Clock func() float64
}

// GroupConfig is one KV-cache group of a [RecorderConfig]: its vLLM
// "kv_cache_spec_kind" ("full_attention", "sliding_window",
// "chunked_local_attention", "mla_attention", "mamba" for a state group;
// "" leaves it out) and, for a
// sliding window, "kv_cache_spec_sliding_window" (0 leaves it out).
type GroupConfig struct {
	SpecKind      string
	SlidingWindow int
}

// Kind is an event's type, vLLM's tag.
type Kind uint8

const (
	Stored  Kind = iota // BlockStored
	Removed             // BlockRemoved
	Cleared             // AllBlocksCleared
)

// kindTags are vLLM's event tags, by Kind: String prints them and the
// encoder writes them.
var kindTags = [...]string{Stored: "BlockStored", Removed: "BlockRemoved", Cleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindTags) {
		return kindTags[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// event is one event of a batch; its hashes and tokens are ranges of the
// batch's flat arrays, so a batch reuses three slices and nothing else.
type event struct {
	kind      Kind
	h0, h1    int32 // hashes[h0:h1]
	t0, t1    int32 // tokens[t0:t1] (Stored)
	parent    uint64
	hasParent bool
	host      bool   // medium MediumCPU (a host-tier page), else the recorder's
	g         uint16 // index of the recorder's groups (meta.groups)
	lora      string // "" is None
}

// Batch is one step's events (vLLM's KVEventBatch). Batches are recycled
// through a [Queue]; a consumer must not keep one after [Queue.Done].
type Batch struct {
	TS     float64 // seconds since the Unix epoch
	events []event
	hashes []uint64
	tokens []int32
	meta   *meta
}

// meta is what every event of a recorder carries.
type meta struct {
	medium   string
	pageSize int
	groups   []groupMeta // [event.g]; one entry without RecorderConfig.Groups
}

// groupMeta is what the events of one KV-cache group carry.
type groupMeta struct {
	group         int
	hasGroup      bool
	specKind      string
	slidingWindow int
}

// Len returns the number of events.
func (b *Batch) Len() int { return len(b.events) }

func (b *Batch) reset() {
	b.events, b.hashes, b.tokens = b.events[:0], b.hashes[:0], b.tokens[:0]
}

// Pages returns the number of pages the batch's events name (stored and
// removed).
func (b *Batch) Pages() int { return len(b.hashes) }

func (b *Batch) stored(hash, parent uint64, hasParent bool, lora string, tokens []int32, host bool, g uint16) {
	if n := len(b.events); n > 0 {
		e := &b.events[n-1]
		// Extend the last event when this page continues its chain in the
		// same medium and group, as vLLM puts a request's new full blocks
		// in one BlockStored.
		if e.kind == Stored && e.host == host && e.g == g && hasParent && e.lora == lora && b.hashes[e.h1-1] == parent {
			b.hashes = append(b.hashes, hash)
			b.tokens = append(b.tokens, tokens...)
			e.h1, e.t1 = int32(len(b.hashes)), int32(len(b.tokens))
			return
		}
	}
	h0, t0 := int32(len(b.hashes)), int32(len(b.tokens))
	b.hashes = append(b.hashes, hash)
	b.tokens = append(b.tokens, tokens...)
	b.events = append(b.events, event{kind: Stored, h0: h0, h1: h0 + 1, t0: t0, t1: int32(len(b.tokens)),
		parent: parent, hasParent: hasParent, host: host, g: g, lora: lora})
}

func (b *Batch) removed(hash uint64, host bool, g uint16) {
	if n := len(b.events); n > 0 && b.events[n-1].kind == Removed && b.events[n-1].host == host && b.events[n-1].g == g {
		b.hashes = append(b.hashes, hash)
		b.events[n-1].h1++
		return
	}
	h0 := int32(len(b.hashes))
	b.hashes = append(b.hashes, hash)
	b.events = append(b.events, event{kind: Removed, h0: h0, h1: h0 + 1, host: host, g: g})
}

func (b *Batch) cleared() { b.events = append(b.events, event{kind: Cleared}) }

// RecorderStats are a Recorder's cumulative counts.
type RecorderStats struct {
	Batches       int64 // batches handed to the queue
	Events        int64 // events in them
	Pages         int64 // pages named by them (stored + removed)
	DroppedSteps  int64 // flushes whose batch the full queue refused
	DroppedEvents int64 // events in those batches
	Resyncs       int64 // AllBlocksCleared + snapshot batches sent after drops
}

// GroupStats are the cumulative counts of one KV-cache group's events in
// the batches a Recorder of several groups (RecorderConfig.Groups) handed
// to the queue; events of dropped batches are not counted.
type GroupStats struct {
	Stored, Removed           int64 // BlockStored and BlockRemoved events of device pages
	StoredPages, RemovedPages int64 // pages they name
	// The same of the group's host pages (medium "CPU";
	// RecorderConfig.HostPages).
	HostStored, HostRemoved           int64
	HostStoredPages, HostRemovedPages int64
}

// Recorder is a Manager's [prefixcache.Sink]: it collects the step's cache
// changes as events and keeps a mirror of the cached pages. It belongs to
// the Manager's goroutine. Its NumPages and PageSize must be the
// Manager's: an event for a page outside them, or removing a page it never
// saw stored, panics (a Recorder wired to the wrong Manager).
type Recorder struct {
	meta  meta
	clock func() float64
	q     *Queue
	cur   *Batch

	// The mirror, indexed by page: what resynchronisation re-sends.
	live       []bool
	hash       []uint64
	parentHash []uint64
	parent     []int32 // the parent page; -1 at depth 0, parentOutside for a checkpoint's
	depth      []int32
	lora       []string
	group      []uint16 // the group whose cache holds the page
	tokens     []int32
	order      []int32 // scratch of the snapshot
	sinks      []groupSink

	// The host tier's mirror, indexed by host page (medium MediumCPU).
	hostLive       []bool
	hostHash       []uint64
	hostParentHash []uint64
	hostHasParent  []bool
	hostLora       []string
	hostTokens     []int32
	hostGroup      []uint16 // the group whose digest chain the page holds

	resync bool // a batch was dropped: the next one starts over
	stats  RecorderStats
	gstats []GroupStats // [g] with RecorderConfig.Groups
	gstep  []GroupStats // the batch being offered's counts, [g]
}

var _ prefixcache.Sink = (*Recorder)(nil)

// NewRecorder returns a Recorder that flushes into q.
func NewRecorder(cfg RecorderConfig, q *Queue) (*Recorder, error) {
	switch {
	case cfg.NumPages < 1 || cfg.PageSize < 1:
		return nil, fmt.Errorf("%w: recorder for %d pages of %d tokens", ErrBadConfig, cfg.NumPages, cfg.PageSize)
	case int64(cfg.NumPages)*int64(cfg.PageSize) > 1<<32:
		return nil, fmt.Errorf("%w: recorder for %d pages of %d tokens: over 2^32 tokens", ErrBadConfig, cfg.NumPages, cfg.PageSize)
	case q == nil:
		return nil, fmt.Errorf("%w: recorder without a queue", ErrBadConfig)
	case cfg.HostPages < 0:
		return nil, fmt.Errorf("%w: recorder for %d host pages, want >= 0", ErrBadConfig, cfg.HostPages)
	case int64(cfg.HostPages)*int64(cfg.PageSize) > 1<<32:
		return nil, fmt.Errorf("%w: recorder for %d host pages of %d tokens: over 2^32 tokens", ErrBadConfig, cfg.HostPages, cfg.PageSize)
	case cfg.SlidingWindow < 0:
		return nil, fmt.Errorf("%w: sliding window %d < 0", ErrBadConfig, cfg.SlidingWindow)
	case len(cfg.Groups) > 0 && (cfg.Group != nil || cfg.SpecKind != "" || cfg.SlidingWindow != 0):
		return nil, fmt.Errorf("%w: %d groups and Group/SpecKind %q/SlidingWindow %d: set the spec per group", ErrBadConfig, len(cfg.Groups), cfg.SpecKind, cfg.SlidingWindow)
	case len(cfg.Groups) > 1<<16:
		return nil, fmt.Errorf("%w: %d groups, want at most 65536", ErrBadConfig, len(cfg.Groups))
	}
	for g, gc := range cfg.Groups {
		if gc.SlidingWindow < 0 {
			return nil, fmt.Errorf("%w: group %d: sliding window %d < 0", ErrBadConfig, g, gc.SlidingWindow)
		}
	}
	if cfg.Medium == "" {
		cfg.Medium = MediumGPU
	}
	r := &Recorder{
		meta: meta{medium: cfg.Medium, pageSize: cfg.PageSize},
		q:    q, clock: cfg.Clock,
		live: make([]bool, cfg.NumPages), hash: make([]uint64, cfg.NumPages), parentHash: make([]uint64, cfg.NumPages),
		parent: make([]int32, cfg.NumPages), depth: make([]int32, cfg.NumPages), lora: make([]string, cfg.NumPages),
		group:    make([]uint16, cfg.NumPages),
		tokens:   make([]int32, cfg.NumPages*cfg.PageSize),
		hostLive: make([]bool, cfg.HostPages), hostHash: make([]uint64, cfg.HostPages),
		hostParentHash: make([]uint64, cfg.HostPages), hostHasParent: make([]bool, cfg.HostPages),
		hostLora: make([]string, cfg.HostPages), hostTokens: make([]int32, cfg.HostPages*cfg.PageSize),
		hostGroup: make([]uint16, cfg.HostPages),
	}
	if len(cfg.Groups) == 0 {
		gm := groupMeta{specKind: cfg.SpecKind, slidingWindow: cfg.SlidingWindow}
		if cfg.Group != nil {
			gm.group, gm.hasGroup = *cfg.Group, true
		}
		r.meta.groups = []groupMeta{gm}
	}
	for g, gc := range cfg.Groups {
		r.meta.groups = append(r.meta.groups, groupMeta{group: g, hasGroup: true, specKind: gc.SpecKind, slidingWindow: gc.SlidingWindow})
		r.sinks = append(r.sinks, groupSink{r, uint16(g)})
	}
	if len(cfg.Groups) > 0 {
		r.gstats, r.gstep = make([]GroupStats, len(cfg.Groups)), make([]GroupStats, len(cfg.Groups))
	}
	if r.clock == nil {
		r.clock = wallClock
	}
	r.cur = q.take(&r.meta)
	return r, nil
}

func wallClock() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// PageStored implements [prefixcache.Sink] (group 0's, with
// RecorderConfig.Groups).
func (r *Recorder) PageStored(page prefixcache.PageID, hash uint64, parent prefixcache.PageID, parentHash uint64, key prefixcache.Key, tokens []int32) {
	r.pageStored(0, page, hash, parent, parentHash, key, tokens)
}

// PageRemoved implements [prefixcache.Sink] (group 0's, with
// RecorderConfig.Groups).
func (r *Recorder) PageRemoved(page prefixcache.PageID, hash uint64) { r.pageRemoved(0, page, hash) }

// NumGroups returns the number of RecorderConfig.Groups (0 without).
func (r *Recorder) NumGroups() int { return len(r.sinks) }

// GroupSink returns the [prefixcache.Sink] of group g's prefix cache: its
// events carry group_idx g and the group's spec fields. Page IDs are the
// pool's, shared by the groups; a page is in one group's cache at a time.
// The sink also has the host methods (HostPages, HostPageStored,
// HostPageRemoved) for the host pages of group g's digest chain; host page
// IDs are the one host tier's, a page in one group at a time. It panics
// for g outside RecorderConfig.Groups.
func (r *Recorder) GroupSink(g int) prefixcache.Sink { return &r.sinks[g] }

// GroupSpec returns group g's "kv_cache_spec_kind" and
// "kv_cache_spec_sliding_window" (RecorderConfig.Groups[g]).
func (r *Recorder) GroupSpec(g int) (kind string, slidingWindow int) {
	gm := &r.meta.groups[r.sinks[g].g]
	return gm.specKind, gm.slidingWindow
}

// groupSink is one group's view of a Recorder.
type groupSink struct {
	r *Recorder
	g uint16
}

func (s *groupSink) PageStored(page prefixcache.PageID, hash uint64, parent prefixcache.PageID, parentHash uint64, key prefixcache.Key, tokens []int32) {
	s.r.pageStored(s.g, page, hash, parent, parentHash, key, tokens)
}

func (s *groupSink) PageRemoved(page prefixcache.PageID, hash uint64) {
	s.r.pageRemoved(s.g, page, hash)
}

// CheckpointStored reports that device page page holds a state
// checkpoint of group g (a recurrent layer group's state after a prefix;
// docs/state-groups.md): the prefix's last page is tokens, at chain hash
// hash, depth pages deep (0 for the first page); parentHash is the chain
// hash of the page before it (hasParent false at depth 0) and lora the
// namespace's LoRA adapter. It is a BlockStored of that one block, whose
// parent need not be in the group: a state group holds checkpoints at some
// prefix ends only. [prefixcache.Sink.PageRemoved] removes it.
func (s *groupSink) CheckpointStored(page prefixcache.PageID, depth int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32) {
	s.r.checkpointStored(s.g, page, depth, hash, parentHash, hasParent, lora, tokens)
}

// HostPages is the Recorder's (RecorderConfig.HostPages).
func (s *groupSink) HostPages() int { return len(s.r.hostLive) }

// HostPageStored is [Recorder.HostPageStored] for a host page of group g.
func (s *groupSink) HostPageStored(page int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32) {
	s.r.hostPageStored(s.g, page, hash, parentHash, hasParent, lora, tokens)
}

// HostPageRemoved is [Recorder.HostPageRemoved] for a host page of group
// g.
func (s *groupSink) HostPageRemoved(page int, hash uint64) { s.r.hostPageRemoved(s.g, page, hash) }

func (r *Recorder) pageStored(g uint16, page prefixcache.PageID, hash uint64, parent prefixcache.PageID, parentHash uint64, key prefixcache.Key, tokens []int32) {
	p := int(page)
	if p < 0 || p >= len(r.live) || len(tokens) != r.meta.pageSize || r.live[p] || (parent >= 0 && (!r.live[parent] || r.group[parent] != g)) {
		panic(fmt.Sprintf("events: page %d stored (group %d, parent %d) with %d tokens; the recorder has %d pages of %d tokens, the page or its parent is in the wrong state",
			page, g, parent, len(tokens), len(r.live), r.meta.pageSize))
	}
	r.live[p], r.hash[p], r.parent[p], r.group[p] = true, hash, int32(parent), g
	if parent < 0 {
		r.lora[p], r.depth[p], r.parentHash[p] = key.Namespace().LoRA, 0, 0
	} else {
		r.lora[p], r.depth[p], r.parentHash[p] = r.lora[parent], r.depth[parent]+1, parentHash
	}
	copy(r.tokens[p*r.meta.pageSize:], tokens)
	if !r.resync {
		r.cur.stored(hash, parentHash, parent >= 0, r.lora[p], tokens, false, g)
	}
}

// parentOutside is a mirrored page's parent when the page has a parent
// hash but no parent page in its group (a state checkpoint).
const parentOutside = -2

func (r *Recorder) checkpointStored(g uint16, page prefixcache.PageID, depth int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32) {
	p := int(page)
	if p < 0 || p >= len(r.live) || len(tokens) != r.meta.pageSize || r.live[p] || depth < 0 || depth > 1<<30 || hasParent != (depth > 0) {
		panic(fmt.Sprintf("events: checkpoint page %d stored (group %d, depth %d, has parent %v) with %d tokens; the recorder has %d pages of %d tokens, or the page is in the wrong state",
			page, g, depth, hasParent, len(tokens), len(r.live), r.meta.pageSize))
	}
	r.live[p], r.hash[p], r.group[p], r.depth[p], r.lora[p] = true, hash, g, int32(depth), lora
	r.parent[p], r.parentHash[p] = -1, 0
	if hasParent {
		r.parent[p], r.parentHash[p] = parentOutside, parentHash
	}
	copy(r.tokens[p*r.meta.pageSize:], tokens)
	if !r.resync {
		r.cur.stored(hash, r.parentHash[p], hasParent, lora, tokens, false, g)
	}
}

func (r *Recorder) pageRemoved(g uint16, page prefixcache.PageID, hash uint64) {
	p := int(page)
	if p < 0 || p >= len(r.live) || !r.live[p] || r.group[p] != g {
		panic(fmt.Sprintf("events: page %d removed from group %d but not recorded as stored there", page, g))
	}
	r.live[p] = false
	r.lora[p] = ""
	if !r.resync {
		r.cur.removed(hash, false, g)
	}
}

// HostPages returns the number of host pages the Recorder mirrors
// (RecorderConfig.HostPages). The Manager checks it against its host tier.
func (r *Recorder) HostPages() int { return len(r.hostLive) }

// HostPageStored reports that host page page became servable (an offload
// the engine completed, or a remote fetch that landed in it), holding
// tokens at chain hash hash; parentHash is the chain hash of the page
// before it (hasParent false at depth 0) and lora the namespace's LoRA
// adapter. It becomes a BlockStored with medium "CPU". The parent need not
// be in the host tier: host pages are kept and reclaimed one by one. With
// RecorderConfig.Groups it is group 0's (see [Recorder.GroupSink]).
func (r *Recorder) HostPageStored(page int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32) {
	r.hostPageStored(0, page, hash, parentHash, hasParent, lora, tokens)
}

func (r *Recorder) hostPageStored(g uint16, page int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32) {
	if page < 0 || page >= len(r.hostLive) || len(tokens) != r.meta.pageSize || r.hostLive[page] {
		panic(fmt.Sprintf("events: host page %d stored (group %d) with %d tokens; the recorder has %d host pages of %d tokens (live %v)",
			page, g, len(tokens), len(r.hostLive), r.meta.pageSize, page >= 0 && page < len(r.hostLive) && r.hostLive[page]))
	}
	r.hostLive[page], r.hostHash[page], r.hostGroup[page] = true, hash, g
	r.hostParentHash[page], r.hostHasParent[page], r.hostLora[page] = parentHash, hasParent, lora
	if !hasParent {
		r.hostParentHash[page] = 0
	}
	copy(r.hostTokens[page*r.meta.pageSize:], tokens)
	if !r.resync {
		r.cur.stored(hash, r.hostParentHash[page], hasParent, lora, tokens, true, g)
	}
}

// HostPageRemoved reports that host page page, which had chain hash hash,
// was reclaimed: a BlockRemoved with medium "CPU". With
// RecorderConfig.Groups it is group 0's (see [Recorder.GroupSink]).
func (r *Recorder) HostPageRemoved(page int, hash uint64) { r.hostPageRemoved(0, page, hash) }

func (r *Recorder) hostPageRemoved(g uint16, page int, hash uint64) {
	if page < 0 || page >= len(r.hostLive) || !r.hostLive[page] || r.hostHash[page] != hash || r.hostGroup[page] != g {
		panic(fmt.Sprintf("events: host page %d (hash %#x) removed from group %d but not recorded as stored there", page, hash, g))
	}
	r.hostLive[page] = false
	r.hostLora[page] = ""
	if !r.resync {
		r.cur.removed(hash, true, g)
	}
}

// Flush ends the step: it hands the step's events (if any) to the queue
// and reports whether the queue took them. It never blocks: with the
// queue full the batch is dropped and counted, and the next Flush that
// fits sends AllBlocksCleared and a snapshot of the cached pages instead.
func (r *Recorder) Flush() bool {
	if r.resync {
		r.cur.reset()
		r.cur.cleared()
		r.snapshot()
	}
	if len(r.cur.events) == 0 {
		return true
	}
	r.cur.TS = r.clock()
	n := len(r.cur.events)
	r.countGroups() // before the offer: the consumer owns the batch after it
	if !r.q.offer(r.cur) {
		r.stats.DroppedSteps++
		r.stats.DroppedEvents += int64(n)
		r.resync = true
		r.cur.reset()
		return false
	}
	if r.resync {
		r.stats.Resyncs++
		r.resync = false
	}
	r.stats.Batches++
	r.stats.Events += int64(n)
	r.stats.Pages += int64(len(r.cur.hashes))
	for g := range r.gstep {
		gs, d := &r.gstats[g], &r.gstep[g]
		gs.Stored, gs.Removed = gs.Stored+d.Stored, gs.Removed+d.Removed
		gs.StoredPages, gs.RemovedPages = gs.StoredPages+d.StoredPages, gs.RemovedPages+d.RemovedPages
		gs.HostStored, gs.HostRemoved = gs.HostStored+d.HostStored, gs.HostRemoved+d.HostRemoved
		gs.HostStoredPages, gs.HostRemovedPages = gs.HostStoredPages+d.HostStoredPages, gs.HostRemovedPages+d.HostRemovedPages
	}
	r.cur = r.q.take(&r.meta)
	return true
}

// countGroups counts the current batch's events per group and medium into
// r.gstep (nothing without RecorderConfig.Groups).
func (r *Recorder) countGroups() {
	if len(r.gstep) == 0 {
		return
	}
	clear(r.gstep)
	for i := range r.cur.events {
		e := &r.cur.events[i]
		d := &r.gstep[e.g]
		n := int64(e.h1 - e.h0)
		switch {
		case e.host && e.kind == Stored:
			d.HostStored++
			d.HostStoredPages += n
			continue
		case e.host && e.kind == Removed:
			d.HostRemoved++
			d.HostRemovedPages += n
			continue
		}
		switch e.kind {
		case Stored:
			d.Stored++
			d.StoredPages += int64(e.h1 - e.h0)
		case Removed:
			d.Removed++
			d.RemovedPages += int64(e.h1 - e.h0)
		}
	}
}

// snapshot appends a BlockStored for every mirrored page: the device's
// parents first, then the host tier's in page order.
func (r *Recorder) snapshot() {
	order := r.order[:0]
	for p, live := range r.live {
		if live {
			order = append(order, int32(p))
		}
	}
	slices.SortFunc(order, func(a, b int32) int { return cmp.Or(cmp.Compare(r.depth[a], r.depth[b]), cmp.Compare(a, b)) })
	r.order = order
	ps := r.meta.pageSize
	for _, p := range order {
		r.cur.stored(r.hash[p], r.parentHash[p], r.parent[p] != -1, r.lora[p], r.tokens[int(p)*ps:(int(p)+1)*ps], false, r.group[p])
	}
	for h, live := range r.hostLive {
		if live {
			r.cur.stored(r.hostHash[h], r.hostParentHash[h], r.hostHasParent[h], r.hostLora[h], r.hostTokens[h*ps:(h+1)*ps], true, r.hostGroup[h])
		}
	}
}

// Stats returns the cumulative counts.
func (r *Recorder) Stats() RecorderStats { return r.stats }

// GroupStats returns group g's cumulative counts (RecorderConfig.Groups).
// It panics for g outside RecorderConfig.Groups.
func (r *Recorder) GroupStats(g int) GroupStats { return r.gstats[g] }

// Queue is the bounded hand-off between a [Recorder] and its consumer (a
// [Publisher], or a test). It holds up to its capacity of full batches and
// recycles them, so that a steady stream allocates nothing.
type Queue struct {
	full    chan *Batch
	free    chan *Batch
	offered atomic.Int64 // batches accepted by offer
}

// NewQueue returns a queue of capacity batches (>= 1).
func NewQueue(capacity int) (*Queue, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("%w: queue capacity %d, want >= 1", ErrBadConfig, capacity)
	}
	// The recorder's current batch and the one the consumer is working on
	// are outside the full channel, so capacity+2 batches always suffice.
	return &Queue{full: make(chan *Batch, capacity), free: make(chan *Batch, capacity+2)}, nil
}

func (q *Queue) offer(b *Batch) bool {
	select {
	case q.full <- b:
		q.offered.Add(1)
		return true
	default:
		return false
	}
}

func (q *Queue) take(m *meta) *Batch {
	select {
	case b := <-q.free:
		b.reset()
		b.meta = m
		return b
	default:
		return &Batch{meta: m}
	}
}

// Next returns the next batch, blocking until one is queued; ok is false
// once the queue is closed and empty. Return it with [Queue.Done].
func (q *Queue) Next() (b *Batch, ok bool) {
	b, ok = <-q.full
	return b, ok
}

// Chan is the channel Next reads, for a select.
func (q *Queue) Chan() <-chan *Batch { return q.full }

// TryNext returns a queued batch without blocking, or nil.
func (q *Queue) TryNext() *Batch {
	select {
	case b := <-q.full:
		return b
	default:
		return nil
	}
}

// Done recycles a batch returned by Next.
func (q *Queue) Done(b *Batch) {
	select {
	case q.free <- b:
	default:
	}
}

// Close ends the stream: Next drains what is queued, then reports !ok.
// The recorder must not flush after Close.
func (q *Queue) Close() { close(q.full) }
