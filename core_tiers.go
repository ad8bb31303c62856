package pagedkv

import (
	"fmt"

	"github.com/pagedkv/pagedkv/tier"
)

// The core's part of the tiers (docs/tiers.md): one host tier, one remote
// store and one stream of tier copies below the pool, shared by every
// group. The tiers' own state is in manager_tiers.go, a group's hooks
// (onloading at admission, writing published pages through, its digests)
// in group_tiers.go.

func (c *core) hostPage(h HostPageID) []byte {
	if c.tiers == nil || h < 0 || int(h) >= c.tiers.host.NumPages() {
		return nil
	}
	return c.tiers.host.Page(h)
}

func (c *core) tierCopies(dst []TierCopy) []TierCopy {
	t := c.tiers
	if t == nil {
		return dst
	}
	for _, s := range t.planned {
		cp := &t.copies[s]
		cp.issued = true
		dst = append(dst, TierCopy{ID: t.id(s), Dir: cp.dir, Device: cp.dev, Host: cp.host})
	}
	t.planned = t.planned[:0]
	return dst
}

func (c *core) tierCopiesInFlight() int {
	if c.tiers == nil {
		return 0
	}
	return c.tiers.nLive
}

func (c *core) completeTierCopies(ids []uint64) error {
	t := c.tiers
	if t == nil {
		if len(ids) > 0 {
			return fmt.Errorf("%w: complete tier copy %d: the Manager has no tiers", ErrBadArgument, ids[0])
		}
		return nil
	}
	t.epoch++
	for i, id := range ids {
		s := uint32(id)
		if uint64(s) >= uint64(len(t.copies)) || uint32(id>>32) != t.copies[s].gen || !t.copies[s].live || !t.copies[s].issued {
			return fmt.Errorf("%w: complete tier copies: ids[%d] = %d is not a copy in flight", ErrBadArgument, i, id)
		}
		if t.copies[s].mark == t.epoch {
			return fmt.Errorf("%w: complete tier copies: ids[%d] = %d appears twice", ErrBadArgument, i, id)
		}
		t.copies[s].mark = t.epoch
	}
	for _, id := range ids {
		t.complete(uint32(id))
	}
	c.afterChange()
	return nil
}

// tierExtend continues each group's device match with pages of the host
// tier and then of the remote store, and returns the pages every group can
// serve: at most maxPages, and with onloads (the pages past a group's
// device match) that fit the free and evictable pages. It leaves that many
// free and each group's hits trimmed to its onloads.
func (c *core) tierExtend(rs []*request, maxPages int) int {
	short := false // some group's device match is short of maxPages
	for g, m := range c.groups {
		m.tierChainStart(rs[g], c.adm[g].pages)
		short = short || len(c.adm[g].pages) < maxPages
	}
	if !short && c.state == nil {
		return maxPages
	}
	// Onloads may take free pages and idle cached ones (evicted on demand,
	// least recently used first), never the pages just matched: hold them.
	for g, m := range c.groups {
		if a := &c.adm[g]; len(a.pages) > 0 {
			if err := c.alloc.Retain(a.pages...); err != nil {
				panic(fmt.Sprintf("pagedkv: holding %d matched pages: %v", len(a.pages), err))
			}
			m.cache.Recheck(a.pages...)
		}
	}
	defer func() {
		for g := range c.groups {
			// admitPages takes the request's own reference next.
			if a := &c.adm[g]; len(a.pages) > 0 {
				if _, err := c.alloc.Release(a.pages...); err != nil {
					panic(fmt.Sprintf("pagedkv: releasing %d matched pages: %v", len(a.pages), err))
				}
			}
		}
	}()
	free := c.alloc.NumFree()
	room := free + c.evictable()
	L := maxPages
	for g, m := range c.groups {
		a := &c.adm[g]
		if k := len(a.pages); k < maxPages {
			if want := min(maxPages-k, room); want > 0 {
				a.hits, a.hostHits, a.fetched = m.tierProbe(rs[g], a.pages, want, a.hits[:0], a.fetched[:0])
			}
		}
		L = min(L, len(a.pages)+len(a.hits))
	}
	sn := 0 // a state checkpoint's onloads (state_tiers.go)
	if c.state != nil {
		if k := c.state.tierProbe(rs[0].id, rs[0].tokens, L); k > 0 {
			L, sn = k, c.state.n
		}
	}
	// The onloads of every group fit the free and evictable pages.
	onloads := func(L int) int {
		n := sn
		for g := range c.groups {
			n += max(0, L-len(c.adm[g].pages))
		}
		return n
	}
	shorten := func() {
		if sn > 0 { // give up the state checkpoint first (admit cuts L)
			c.state.tierDrop()
			sn = 0
			return
		}
		L--
	}
	for onloads(L) > room {
		shorten()
	}
	if n := onloads(L); n > free {
		c.evict(n - free) // drops what no host page backs, like a step
		for onloads(L) > c.alloc.NumFree() {
			shorten()
		}
	}
	c.useHits(L)
	return L
}

// useHits releases the host pages each group's admission holds past L
// pages, which it will not onload.
func (c *core) useHits(L int) {
	t := c.tiers
	for g := range c.groups {
		a := &c.adm[g]
		use := max(0, L-len(a.pages))
		for _, h := range a.hits[use:] {
			if err := t.host.Release(h); err != nil {
				panic(fmt.Sprintf("pagedkv: releasing unused host page %d: %v", h, err))
			}
		}
		a.hits, a.hostHits = a.hits[:use], min(a.hostHits, use)
	}
}

// evictTo evicts idle cached pages until npages pages are free (with
// tiers: free or on their way to free, offloading the victims the host
// tier takes) or nothing is evictable, and returns how many it freed.
func (c *core) evictTo(npages int) (freed int) {
	c.tick()
	if t := c.tiers; t != nil {
		if need := npages - c.alloc.NumFree() - t.evicting; need > 0 {
			freed = c.evictOffload(need)
		}
	} else if need := npages - c.alloc.NumFree(); need > 0 {
		freed = c.evict(need)
	}
	c.afterChange()
	return freed
}

// evictOffload evicts n pages' worth of victims with offload, counting
// pages that go to the host as freed (they free on completion).
func (c *core) evictOffload(n int) int {
	t := c.tiers
	t.offloading = true
	freed := c.evict(n)
	t.offloading = false
	return freed
}

// evictAhead keeps OffloadFreePages pages free or on their way to free.
func (c *core) evictAhead() {
	t := c.tiers
	if t == nil || t.offloadFree == 0 {
		return
	}
	if short := t.offloadFree - c.alloc.NumFree() - t.evicting; short > 0 {
		c.evictOffload(short)
	}
}

// auditTiers checks the tiers against the groups: host pool invariants,
// copies against host states and device references, request loading
// counts, and tier identities of cached pages (a device page has one iff
// some group's cache holds it). held gains each copy's device reference.
func (c *core) auditTiers(held map[PageID]int32) error {
	t := c.tiers
	if t == nil {
		return nil
	}
	if err := t.host.CheckInvariants(); err != nil {
		return err
	}
	readers := map[HostPageID]int{}
	writers := map[HostPageID]int{}
	loading := map[*request]int{}
	live, evicting := 0, 0
	for s := range t.copies {
		cp := &t.copies[s]
		if !cp.live {
			continue
		}
		live++
		held[cp.dev]++
		if cp.dir == tier.ToDevice {
			readers[cp.host]++
			if r := cp.req; r != nil && cp.owner.reqs[r.id] == r && r.gen == cp.reqGen && r.running {
				loading[r]++
			}
		} else {
			writers[cp.host]++
			if cp.evicted {
				evicting++
			}
		}
	}
	if live != t.nLive {
		return fmt.Errorf("pagedkv: %d tier copies live, the counter says %d", live, t.nLive)
	}
	if len(t.planned) > live {
		return fmt.Errorf("pagedkv: %d tier copies planned, %d live", len(t.planned), live)
	}
	if evicting != t.evicting {
		return fmt.Errorf("pagedkv: %d evicted pages wait for offloads, the counter says %d", evicting, t.evicting)
	}
	for h := range HostPageID(t.host.NumPages()) {
		_, _, ready, nr, ok := t.host.Entry(h)
		switch {
		case !ok && (readers[h] > 0 || writers[h] > 0):
			return fmt.Errorf("pagedkv: free host page %d has %d onloads and %d offloads in flight", h, readers[h], writers[h])
		case ok && ready && (nr != readers[h] || writers[h] != 0):
			return fmt.Errorf("pagedkv: ready host page %d has %d readers, %d onloads and %d offloads in flight", h, nr, readers[h], writers[h])
		case ok && !ready && writers[h] != 1:
			return fmt.Errorf("pagedkv: writing host page %d has %d offloads in flight, want 1", h, writers[h])
		case t.hostLive[h] != (ok && ready):
			return fmt.Errorf("pagedkv: host page %d: ready %v but announced to KV events %v", h, ok && ready, t.hostLive[h])
		}
		if n := &t.hostName[h]; ok && t.hasher.Page(n.parentHash, t.host.Tokens(h)) != n.hash {
			return fmt.Errorf("pagedkv: host page %d: chain hash %#x is not that of its tokens under parent %#x", h, n.hash, n.parentHash)
		}
	}
	for _, m := range c.groups {
		if err := m.auditTierRequests(loading); err != nil {
			return err
		}
	}
	onHost := map[tier.Digest]HostPageID{}
	for h := range HostPageID(t.host.NumPages()) {
		if d, _, _, _, ok := t.host.Entry(h); ok {
			onHost[d] = h
		}
	}
	for p := range PageID(c.alloc.NumPages()) {
		md := &t.meta[p]
		var m *group // the group whose cache holds p
		for _, g := range c.groups {
			if g.cache.Cached(p) {
				m = g
			}
		}
		if md.valid != (m != nil) {
			return fmt.Errorf("pagedkv: page %d: cached %v but tier identity valid %v", p, m != nil, md.valid)
		}
		if !md.valid {
			continue
		}
		// The cache's hashes, and the host tier's names for the same
		// digest (a fetched page's were chained by tierProbe).
		hash, parentHash, root, _ := m.cache.PageHash(p)
		if hash != md.hash || root != md.root || (!root && parentHash != md.parentHash) {
			return fmt.Errorf("pagedkv: page %d: chain hash %#x (parent %#x, root %v), its tier identity says %#x (%#x, %v)",
				p, hash, parentHash, root, md.hash, md.parentHash, md.root)
		}
		if h, ok := onHost[md.digest]; ok {
			if n := &t.hostName[h]; n.hash != md.hash || n.root != md.root || n.parentHash != md.parentHash || n.lora != md.lora || n.group != m.tierGroup {
				return fmt.Errorf("pagedkv: host page %d holds page %d's digest under chain hash %#x, the cache's is %#x", h, p, n.hash, md.hash)
			}
		}
	}
	return nil
}

func (c *core) hostCachedHashes(dst []uint64) []uint64 {
	t := c.tiers
	if t == nil {
		return dst
	}
	for h, live := range t.hostLive {
		if live && !t.hostName[h].state { // checkpoints' pages are not announced
			dst = append(dst, t.hostName[h].hash)
		}
	}
	return dst
}
