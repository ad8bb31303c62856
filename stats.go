package pagedkv

import (
	"fmt"
	"runtime"
	"sync/atomic"
)

// Stats is a consistent snapshot of the Manager's occupancy and cumulative
// counters.
//
// The page fields before CachedPages partition the pool:
//
//	TotalPages == FreePages + UsedPages + EvictablePages + PinnedIdlePages
//
// so a page counts once: in use by a request (cached or not), idle in the
// cache and evictable, idle but pinned, or free. Evictable pages are
// capacity: a step that needs them evicts them. (vLLM reports only "usage",
// so a full cache of idle pages reads as empty, or as full, depending on
// whom one asks; here both numbers are given.)
type Stats struct {
	TotalPages      int // pages in the pool
	FreePages       int // no holder
	UsedPages       int // held by at least one request
	EvictablePages  int // cached, held by the cache alone, not pinned
	PinnedIdlePages int // cached, pinned, held by no request

	CachedPages int // pages in the prefix cache (some also in UsedPages)
	PinnedPages int // cached pages under a pin (idle or in use)
	SharedPages int // pages with two or more holders (requests and the cache)

	Requests          int // running and preempted
	PreemptedRequests int // requests waiting in Resume, holding no page

	// Token counters. A token counts as a hit only if its KV was served from
	// the cache instead of computed; recomputation after preemption is
	// never a hit (vLLM issue #25780) and is counted apart.
	PromptTokens    int64 // prompt tokens of every Add
	PromptHitTokens int64 // of those, matched in the cache at Add
	ComputedTokens  int64 // tokens the engine computed (committed steps), recomputation included
	ResumedTokens   int64 // computed tokens a preemption discarded, due at Resume
	ResumeHitTokens int64 // of those, matched in the cache at Resume

	Steps               int64 // committed steps
	Preemptions         int64
	CopiedPages         int64 // copy-on-write copies in plans
	PublishedPages      int64 // pages added to the prefix cache
	DuplicatePages      int64 // filled pages whose prefix was already cached (kept private)
	EvictedPages        int64 // pages removed from the cache
	EvictionFreedPages  int64 // of those, returned to the pool (the rest stayed with requests)
	InnerVictims        int64 // eviction victims that had children (see prefixcache.Counters)
	WindowReleasedPages int64 // pages a sliding window released from requests
	ChainsCut           int64 // requests whose cache chain was evicted (they stop publishing)

	// Speculative decoding (CommitSpec). Rejected drafts are not in
	// ComputedTokens; accepted ones are.
	DraftTokens         int64 // draft tokens committed steps verified
	AcceptedDraftTokens int64 // of those, accepted
	// Tiers are the host tier's and the remote store's figures (zero
	// without tiers). Pages held only by tier copies in flight count as
	// UsedPages.
	Tiers TierStats
	// MissRatioCurve is the live miss-ratio curve (zero without
	// Config.MissRatioSampling).
	MissRatioCurve MissRatioCurve

	// CacheUsage is every request's cache reads and writes summed
	// ([Manager.CacheUsage]; released requests included), and
	// CacheUsageDropped the released requests whose usage was forgotten
	// unread (more than KeptCacheUsages released and not read).
	CacheUsage        CacheUsage
	CacheUsageDropped int64
}

// MissRatioCurve is what the sampled shadow caches of
// Config.MissRatioSampling estimate while the Manager serves (group 0's
// cache; evict.Shadow): the hit ratio of the pages admissions reference,
// as an LRU cache of ½×, 2× and 4× the pool would have it, and with no
// limit. SampledReferences is how many page references the shadows saw.
type MissRatioCurve struct {
	SampledReferences                  int64
	Half, Double, Quadruple, Unlimited float64
}

// curveScale: the curve's ratios travel in the stats snapshot as parts
// per billion.
const curveScale = 1e9

// HitRate returns PromptHitTokens / PromptTokens: the share of admitted
// prompt tokens served from the cache (0 before any prompt).
func (s Stats) HitRate() float64 {
	if s.PromptTokens == 0 {
		return 0
	}
	return float64(s.PromptHitTokens) / float64(s.PromptTokens)
}

// RecomputedTokens returns the tokens recomputed because of preemption:
// discarded by a preemption and not found in the cache at Resume.
func (s Stats) RecomputedTokens() int64 { return s.ResumedTokens - s.ResumeHitTokens }

// counters are the Manager's cumulative counts, owned by its goroutine.
type counters struct {
	promptTokens, promptHitTokens, computedTokens, resumedTokens, resumeHitTokens int64
	steps, preemptions, copiedPages, windowReleasedPages, chainsCut               int64
	draftTokens, acceptedDraftTokens                                              int64

	// usage and usageDropped are the pool's CacheUsage totals, counted in
	// the core's group 0 (usage.go).
	usage        CacheUsage
	usageDropped int64
}

// Stats returns a consistent snapshot. Unlike every other method it is safe
// to call from any goroutine at any time: the Manager republishes the
// snapshot after each call that changes it, and readers retry while a
// republish is in progress (a sequence lock over typed atomics; no lock is
// taken and nothing is allocated).
func (m *Manager) Stats() Stats { return m.core.stats() }

// Field indexes of the published snapshot.
const (
	fTotal = iota
	fFree
	fUsed
	fEvictable
	fPinnedIdle
	fCached
	fPinned
	fShared
	fRequests
	fPreempted
	fPromptTokens
	fPromptHit
	fComputed
	fResumed
	fResumeHit
	fSteps
	fPreemptions
	fCopied
	fPublished
	fDuplicates
	fEvicted
	fEvictionFreed
	fInnerVictims
	fWindowReleased
	fChainsCut
	fDrafts
	fAcceptedDrafts
	fHostPages
	fHostUsed
	fInFlight
	fHostHitTokens
	fRemoteHitTokens
	fOffloaded
	fOnloaded
	fBytesToHost
	fBytesToDevice
	fDropped
	fHostFull
	fRemoteFetched
	fRemoteStored
	fCurveSampled
	fCurveHalf
	fCurveDouble
	fCurveQuadruple
	fCurveUnlimited
	fReadDevice
	fReadHost
	fReadDisk
	fReadRemote
	fWrite
	fUsageDropped
	numStatFields
)

// statsCell is a sequence lock: the single writer makes seq odd, stores the
// fields, and makes it even again; a reader retries until it reads the same
// even seq before and after the fields.
type statsCell struct {
	seq atomic.Uint64
	v   [numStatFields]atomic.Int64
}

func (c *statsCell) store(v *[numStatFields]int64) {
	c.seq.Add(1)
	for i := range v {
		// The one writer reads its own last value: most fields do not
		// change in a step, and an atomic store is a full barrier (XCHG),
		// about 40 times the cost of the load.
		if c.v[i].Load() != v[i] {
			c.v[i].Store(v[i])
		}
	}
	c.seq.Add(1)
}

func (c *statsCell) load(v *[numStatFields]int64) {
	for {
		s := c.seq.Load()
		if s&1 == 0 {
			for i := range v {
				v[i] = c.v[i].Load()
			}
			if c.seq.Load() == s {
				return
			}
		}
		runtime.Gosched()
	}
}

// snapshot computes the current Stats fields.
func (m *group) snapshot(v *[numStatFields]int64) {
	a := m.alloc.Stats()
	evictable, pinnedIdle := m.cache.Idle()
	cc := m.cache.Counters()
	c := &m.counters
	*v = [numStatFields]int64{
		fTotal: int64(a.Total), fFree: int64(a.Free), fUsed: int64(a.InUse - evictable - pinnedIdle),
		fEvictable: int64(evictable), fPinnedIdle: int64(pinnedIdle),
		fCached: int64(m.cache.Len()), fPinned: int64(m.cache.Pinned()), fShared: int64(a.Shared),
		fRequests: int64(len(m.reqs)), fPreempted: int64(m.nPreempted),
		fPromptTokens: c.promptTokens, fPromptHit: c.promptHitTokens, fComputed: c.computedTokens,
		fResumed: c.resumedTokens, fResumeHit: c.resumeHitTokens,
		fSteps: c.steps, fPreemptions: c.preemptions, fCopied: c.copiedPages,
		fPublished: cc.Published, fDuplicates: cc.Duplicates,
		fEvicted: cc.Evicted, fEvictionFreed: cc.Freed, fInnerVictims: cc.InnerVictims,
		fWindowReleased: c.windowReleasedPages, fChainsCut: c.chainsCut,
		fDrafts: c.draftTokens, fAcceptedDrafts: c.acceptedDraftTokens,
		fReadDevice: c.usage.DeviceReadTokens, fReadHost: c.usage.HostReadTokens, fReadDisk: c.usage.DiskReadTokens,
		fReadRemote: c.usage.RemoteReadTokens, fWrite: c.usage.WriteTokens, fUsageDropped: c.usageDropped,
	}
	if e, ok := m.cache.Shadow(); ok {
		v[fCurveSampled] = e.Sampled
		for i, f := range [...]int{fCurveHalf, fCurveDouble, fCurveQuadruple, fCurveUnlimited} {
			v[f] = int64(e.HitRatio[i]*curveScale + 0.5)
		}
	}
	if t := m.tiers; t != nil {
		free, _, _, _ := t.host.Usage()
		tc := &t.c
		v[fHostPages], v[fHostUsed], v[fInFlight] = int64(tc.HostPages), int64(tc.HostPages-free), int64(t.nLive)
		v[fHostHitTokens], v[fRemoteHitTokens] = tc.HostHitTokens, tc.RemoteHitTokens
		v[fOffloaded], v[fOnloaded], v[fBytesToHost], v[fBytesToDevice] = tc.OffloadedPages, tc.OnloadedPages, tc.BytesToHost, tc.BytesToDevice
		v[fDropped], v[fHostFull], v[fRemoteFetched], v[fRemoteStored] = tc.DroppedPages, tc.HostFull, tc.RemoteFetched, tc.RemoteStored
	}
}

func statsFromFields(v *[numStatFields]int64) Stats {
	return Stats{
		TotalPages: int(v[fTotal]), FreePages: int(v[fFree]), UsedPages: int(v[fUsed]),
		EvictablePages: int(v[fEvictable]), PinnedIdlePages: int(v[fPinnedIdle]),
		CachedPages: int(v[fCached]), PinnedPages: int(v[fPinned]), SharedPages: int(v[fShared]),
		Requests: int(v[fRequests]), PreemptedRequests: int(v[fPreempted]),
		PromptTokens: v[fPromptTokens], PromptHitTokens: v[fPromptHit], ComputedTokens: v[fComputed],
		ResumedTokens: v[fResumed], ResumeHitTokens: v[fResumeHit],
		Steps: v[fSteps], Preemptions: v[fPreemptions], CopiedPages: v[fCopied],
		PublishedPages: v[fPublished], DuplicatePages: v[fDuplicates],
		EvictedPages: v[fEvicted], EvictionFreedPages: v[fEvictionFreed], InnerVictims: v[fInnerVictims],
		WindowReleasedPages: v[fWindowReleased], ChainsCut: v[fChainsCut],
		DraftTokens: v[fDrafts], AcceptedDraftTokens: v[fAcceptedDrafts],
		CacheUsage: CacheUsage{DeviceReadTokens: v[fReadDevice], HostReadTokens: v[fReadHost], DiskReadTokens: v[fReadDisk],
			RemoteReadTokens: v[fReadRemote], WriteTokens: v[fWrite]},
		CacheUsageDropped: v[fUsageDropped],
		MissRatioCurve: MissRatioCurve{SampledReferences: v[fCurveSampled],
			Half: float64(v[fCurveHalf]) / curveScale, Double: float64(v[fCurveDouble]) / curveScale,
			Quadruple: float64(v[fCurveQuadruple]) / curveScale, Unlimited: float64(v[fCurveUnlimited]) / curveScale},
		Tiers: TierStats{
			HostPages: int(v[fHostPages]), HostUsedPages: int(v[fHostUsed]), InFlight: int(v[fInFlight]),
			HostHitTokens: v[fHostHitTokens], RemoteHitTokens: v[fRemoteHitTokens],
			OffloadedPages: v[fOffloaded], OnloadedPages: v[fOnloaded], BytesToHost: v[fBytesToHost], BytesToDevice: v[fBytesToDevice],
			DroppedPages: v[fDropped], HostFull: v[fHostFull], RemoteFetched: v[fRemoteFetched], RemoteStored: v[fRemoteStored],
		},
	}
}

// publishStats stores the current snapshot for Stats.
func (m *group) publishStats() {
	var v [numStatFields]int64
	m.snapshot(&v)
	m.stats.store(&v)
}

// checkPartition verifies the page partition and the request counts
// (cheap: counters only).
func (m *group) checkPartition() error {
	var v [numStatFields]int64
	m.snapshot(&v)
	s := statsFromFields(&v)
	if s.FreePages+s.UsedPages+s.EvictablePages+s.PinnedIdlePages != s.TotalPages || s.UsedPages < 0 {
		return fmt.Errorf("pagedkv: pages free %d + used %d + evictable %d + pinned idle %d != total %d",
			s.FreePages, s.UsedPages, s.EvictablePages, s.PinnedIdlePages, s.TotalPages)
	}
	running := m.table.NumSeqs()
	if running+m.nPreempted != len(m.reqs) {
		return fmt.Errorf("pagedkv: %d requests, %d in the page table, %d preempted", len(m.reqs), running, m.nPreempted)
	}
	return nil
}

// groupFields are the Stats fields each group counts for its own cache and
// page table; a core of several groups sums them. The pool's fields come
// from the allocator, and the request, token and tier counters are equal in
// every group (the tiers are the core's).
var groupFields = [...]int{fEvictable, fPinnedIdle, fCached, fPinned, fCopied, fPublished, fDuplicates,
	fEvicted, fEvictionFreed, fInnerVictims, fWindowReleased, fChainsCut}

// stats is the Stats of both facades: the one group's published snapshot,
// or, over several groups, group 0's with the groupFields summed over the
// groups and the pool's fields from the allocator (each group's part is a
// consistent snapshot; the sum may straddle one operation).
func (c *core) stats() Stats {
	var v [numStatFields]int64
	c.groups[0].stats.load(&v)
	if len(c.groups) > 1 {
		var w [numStatFields]int64
		for _, m := range c.groups[1:] {
			m.stats.load(&w)
			for _, f := range groupFields {
				v[f] += w[f]
			}
		}
	}
	if st := c.state; st != nil {
		// The checkpoints are cached pages (idle ones evictable) of the
		// state groups, one page each per group.
		n := int64(st.n)
		v[fCached] += st.cached.Load() * n
		v[fEvictable] += st.evictable.Load() * n
		v[fPublished] += st.published.Load() * n
		v[fEvicted] += st.evicted.Load() * n
	}
	if len(c.groups) > 1 || c.state != nil {
		a := c.alloc.Stats()
		v[fTotal], v[fFree], v[fShared] = int64(a.Total), int64(a.Free), int64(a.Shared)
		v[fUsed] = int64(a.InUse) - v[fEvictable] - v[fPinnedIdle]
	}
	s := statsFromFields(&v)
	if t := c.tiers; t != nil && t.remote != nil {
		s.Tiers.Remote = t.remote.Stats()
	}
	return s
}

// groupStats returns group g's numbers.
func (c *core) groupStats(g int) GroupStats {
	if c.state != nil {
		if c.state.index(g) >= 0 {
			return c.state.groupStats()
		}
		g = c.attnIndex(g)
	}
	m := c.groups[g]
	var v [numStatFields]int64
	m.stats.load(&v)
	gs := GroupStats{Kind: m.layerGroup.Kind, CachedPages: int(v[fCached]), EvictablePages: int(v[fEvictable]),
		PinnedPages: int(v[fPinned]), PublishedPages: v[fPublished], EvictedPages: v[fEvicted],
		CopiedPages: v[fCopied], WindowReleasedPages: v[fWindowReleased],
		HostHitTokens: m.groupTiers.hostHitTokens.Load(), RemoteHitTokens: m.groupTiers.remoteHitTokens.Load(),
		OffloadedPages: m.groupTiers.offloaded.Load(), OnloadedPages: m.groupTiers.onloaded.Load(),
		ServableTokens: c.servable[g].Load()}
	return gs
}
