package pagedkv

import "github.com/pagedkv/pagedkv/tier"

// Per-request cache reads and writes, as a provider bills them (Anthropic's
// usage reports cache_read_input_tokens and cache_creation_input_tokens;
// vLLM issue #44775 asks for the same per request). docs/cache-usage.md
// states the rules; in short:
//
//   - A read is a token of the prefix an admission (Add or Resume)
//     resumed the request from: its matchedTokens, every admission
//     counted. Each token is attributed to the medium that served its
//     page: the device prefix cache, the host tier, the disk store, or a
//     remote store (Redis, a prefill worker's handoff). In a HybridManager
//     a token counts once, under the farthest medium any group read its
//     page from (device < host < disk < remote).
//   - A write is a token of a page the request computed and added to the
//     device prefix cache as a new entry (Stats.PublishedPages). A page
//     another request had already cached (a duplicate), a page onloaded
//     from a lower tier and then published (that is a read), and the
//     copies of a cached page into the host tier, the disk or Redis (a
//     page written once is billed once, whatever tiers it later moves
//     through) are not writes. In a HybridManager each group stores its
//     own layers' KV of the same positions; a request's writes are those
//     of the group that added the most of them.
//
// The counts live in the request's record (group 0's) from its Add;
// Release moves them to a bounded store of released requests, where
// CacheUsage finds them once (KeptCacheUsages).

// KeptCacheUsages is how many released requests' CacheUsage a Manager (or
// HybridManager) keeps for [Manager.CacheUsage] to read: reading one
// forgets it, and past this many the oldest is forgotten
// (Stats.CacheUsageDropped counts those).
const KeptCacheUsages = 1024

// CacheUsage is the cache reads and writes of one request (over all its
// admissions: Add and every Resume), or of every request of the pool
// (Stats.CacheUsage), in tokens.
type CacheUsage struct {
	// Tokens read from the cache, by the medium that served them.
	DeviceReadTokens int64 // the device prefix cache
	HostReadTokens   int64 // the host tier
	DiskReadTokens   int64 // a disk store (tier/disk)
	RemoteReadTokens int64 // a remote store: Redis, a handoff
	// WriteTokens are tokens of pages the request computed and added to
	// the prefix cache.
	WriteTokens int64
}

// ReadTokens returns the tokens read from every medium together
// (Anthropic's cache_read_input_tokens).
func (u CacheUsage) ReadTokens() int64 {
	return u.DeviceReadTokens + u.HostReadTokens + u.DiskReadTokens + u.RemoteReadTokens
}

// CacheUsage returns the cache reads and writes of request id so far
// (running or preempted), or of released request id if it is among the
// last KeptCacheUsages released and was not read since its release
// (reading it forgets it). ok is false for any other id.
func (m *Manager) CacheUsage(id RequestID) (u CacheUsage, ok bool) { return m.core.cacheUsage(id) }

// CacheUsage is [Manager.CacheUsage]: a token read counts once, under the
// farthest medium any group read it from; writes are those of the group
// that wrote the most.
func (h *HybridManager) CacheUsage(id RequestID) (u CacheUsage, ok bool) {
	return h.core.cacheUsage(id)
}

func (c *core) cacheUsage(id RequestID) (CacheUsage, bool) {
	if r, ok := c.groups[0].reqs[id]; ok {
		return r.usage, true
	}
	return c.kept.take(id)
}

// add counts n tokens read from medium m.
func (u *CacheUsage) add(m tier.Medium, n int64) {
	switch m {
	case tier.Device:
		u.DeviceReadTokens += n
	case tier.Host:
		u.HostReadTokens += n
	case tier.Disk:
		u.DiskReadTokens += n
	default:
		u.RemoteReadTokens += n
	}
}

// noteSources records, for the admission on L pages, the medium group g
// reads each page from (a: its device match and its onloads), keeping in
// c.media the farthest over the groups so far.
func (c *core) noteSources(g int, a *admission, L int) {
	if g == 0 {
		c.media = append(c.media[:0], make([]tier.Medium, L)...)[:L] // tier.Device
	}
	k := len(a.pages)
	for i := k; i < L; i++ {
		med := tier.Host
		if j := i - k; j >= a.hostHits {
			med = a.fetched[j-a.hostHits]
		}
		if tier.MediumRank(med) > tier.MediumRank(c.media[i]) {
			c.media[i] = med
		}
	}
}

// countReads adds the reads of the admission noted by noteSources to
// request r0 (its group-0 record) and to the pool's totals.
func (c *core) countReads(r0 *request) {
	ps := int64(c.pageSize())
	u := &c.groups[0].counters.usage
	for _, med := range c.media {
		r0.usage.add(med, ps)
		u.add(med, ps)
	}
	c.media = c.media[:0]
}

// countWrites brings the writes of the step's requests up to date after
// every group committed (the group that wrote the most counts). Only the
// records that wrote are looked at: each group notes them (group.writers,
// publishNoting), so the cost is per page written, not per request. A
// request noted outside its step (its onloads completed and it
// published) is counted at the next step it is in, as every request of a
// step would be; one no longer known is dropped.
func (c *core) countWrites() {
	lead := c.groups[0]
	var n int64
	for _, m := range c.groups {
		later := m.writers[:0]
		for _, s := range m.writers {
			if s.mark != m.epoch { // noted outside this step
				if m.reqs[s.id] == s {
					later = append(later, s)
				} // else released (the record may serve another request now)
				continue
			}
			r := s // in this step: its group-0 record is in the step too
			if m != lead {
				r = lead.reqs[s.id]
			}
			w := r.wrote
			for x := r.sibling; x != nil; x = x.sibling {
				w = max(w, x.wrote)
			}
			if w > r.usage.WriteTokens {
				n += w - r.usage.WriteTokens
				r.usage.WriteTokens = w
			}
		}
		clear(m.writers[len(later):])
		m.writers = later
	}
	lead.counters.usage.WriteTokens += n
}

// keptUsages holds the CacheUsage of released requests until read: a ring
// of KeptCacheUsages slots with an index by ID, made at the first release
// (so that releasing and admitting requests allocates nothing after).
type keptUsages struct {
	ids   []RequestID
	usage []CacheUsage
	live  []bool
	next  int
	index map[RequestID]int32
}

// put keeps u as released request id's usage, forgetting the oldest kept
// one if every slot is taken (and then reports true).
func (k *keptUsages) put(id RequestID, u CacheUsage) (dropped bool) {
	if k.index == nil {
		k.ids, k.usage, k.live = make([]RequestID, KeptCacheUsages), make([]CacheUsage, KeptCacheUsages), make([]bool, KeptCacheUsages)
		k.index = make(map[RequestID]int32, KeptCacheUsages)
	}
	k.forget(id)
	s := k.next
	if k.live[s] {
		delete(k.index, k.ids[s])
		dropped = true
	}
	k.ids[s], k.usage[s], k.live[s] = id, u, true
	k.index[id] = int32(s)
	k.next = (s + 1) % KeptCacheUsages
	return dropped
}

// take returns and forgets released request id's usage.
func (k *keptUsages) take(id RequestID) (CacheUsage, bool) {
	s, ok := k.index[id]
	if !ok {
		return CacheUsage{}, false
	}
	delete(k.index, id)
	k.live[s] = false
	return k.usage[s], true
}

// forget drops released request id's usage, if kept (its ID now names a
// new request).
func (k *keptUsages) forget(id RequestID) {
	if k.index != nil {
		k.take(id)
	}
}
