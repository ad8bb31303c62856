package pagedkv

import (
	"fmt"

	"github.com/pagedkv/pagedkv/tier"
)

// A group's part of the tiers (docs/tiers.md): its cache's references
// through the tiers (cacheRefs: an evicted page the host tier takes goes
// to an offload), the remote lookups and onloads of its admission, its
// tier digests (tierRoot, tierPublished, tierChainStart, tierChainAt),
// publishing a request whose onloads completed (loaded, settleLoaded) and
// its audit of the requests' tier state.

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
	t.host.Advance(c.m.cache.Now())
	evRet := c.m.cache.EvictedRetention()
	for i, p := range pages {
		md := &t.meta[p]
		valid := md.valid
		md.valid = false // p leaves the cache
		if !valid || c.m.alloc.RefCount(p) != 1 {
			rel = append(rel, p) // a request keeps it, or it was never published with tiers
			continue
		}
		if h, ok := t.host.Find(md.digest); ok {
			// Backed below: dropping loses nothing; the copy takes the
			// retention the page leaves with.
			if len(evRet) == len(pages) {
				t.hostRetain(h, evRet[i])
			}
			rel = append(rel, p)
			continue
		}
		if t.offloading {
			if h, ok := t.claimFor(md.digest, md.parent, t.pageTokens(p), md.first, hostName{md.hash, md.parentHash, md.root, md.lora, c.m.tierGroup, false}); ok {
				t.hostRetain(h, evictedRetention(evRet, i, len(pages)))
				// The cache's reference becomes the copy's.
				t.plan(c.m, tier.ToHost, p, h, nil, 0, true)
				offloaded++
				t.evicting++
				continue
			}
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

// loaded publishes r, whose onloads are all complete, and releases what
// its group's attention no longer reads (admission left it the whole
// prefix while loading). During a step a windowed group does both when
// the step ends (settleLoaded); a full group publishes r at its next
// commit.
func (m *group) loaded(r *request) {
	switch {
	case !m.pending:
		m.publishNoting(r)
		m.releaseWindow(r)
	case m.attention.KeepTokens(0) >= 0:
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
// held before the fetch, and appends to fetched the medium that served
// each fetched one (tier.FetchMedia: disk or remote), in order.
func (m *group) tierProbe(r *request, pages []PageID, want int, hits []HostPageID, fetched []tier.Medium) ([]HostPageID, int, []tier.Medium) {
	t, ps := m.tiers, m.pageSize
	t.host.Advance(m.cache.Now())
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
			hits, fetched = t.fetchClaimed(hits, fetched)
		}
	}
	return hits, hostHits, fetched
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
		t.onloadRetention(t.dev[i], h)
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
		m.restoreRetention(page, nd)
		if t.writeThrough && !t.host.Has(nd) {
			if h, ok := t.claimFor(nd, r.tchain, tokens, r.tfirst, hostName{hash, parentHash, root, t.meta[page].lora, m.tierGroup, false}); ok {
				t.one[0] = page
				if err := m.alloc.Retain(t.one[:]...); err != nil {
					panic(fmt.Sprintf("pagedkv: retaining page %d for its write-through: %v", page, err))
				}
				t.plan(m, tier.ToHost, page, h, nil, 0, false)
				m.cache.Recheck(page)
			}
		}
	}
	if !added && t.loadRet != nil {
		t.loadRet[page] = loadedRetention{}
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
	return tier.GroupRoot(d, m.tierTag)
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

// loading reports whether request id waits for onload copies in the group.
func (m *group) loading(id RequestID) bool { r, ok := m.reqs[id]; return ok && r.loading > 0 }
