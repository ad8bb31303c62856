package prefixcache

import (
	"encoding/binary"
	"fmt"
)

// CheckInvariants verifies the whole cache in O(cached pages * PageSize)
// time and returns the first violation found, or nil. Beyond the structure
// (tree links, child counts, hash chains, LRU lists, counters) it recomputes
// every page's chained hash and re-reads every reference count, so a caller
// that forgot a [Cache.Recheck] is caught here.
func (c *Cache) CheckInvariants() error {
	var cached, idle, idlePinned, pinned int
	type sib struct {
		parent int32
		key    string
	}
	seen := make(map[sib]int32)
	for i := range c.nodes {
		p := int32(i)
		n := &c.nodes[p]
		if !n.cached() {
			if n.state != 0 || n.children != 0 || n.pins != 0 {
				return fmt.Errorf("prefixcache: uncached page %d has state %#x, %d children, %d pins", p, n.state, n.children, n.pins)
			}
			continue
		}
		cached++
		if err := c.nodeError(p); err != nil {
			return err
		}
		// Recomputed hash: the chain is what lookups will follow.
		var ph uint64
		if n.parent == none {
			k, ok := c.rootKey[p]
			if !ok {
				return fmt.Errorf("prefixcache: depth-0 page %d has no namespace", p)
			}
			ph = hashBytes(c.seed, []byte(k))
		} else {
			ph = c.nodes[n.parent].hash
		}
		if h := c.hash(ph, c.pageTokens(p)); h != n.hash {
			return fmt.Errorf("prefixcache: page %d stores hash %#x, its parent and tokens give %#x", p, n.hash, h)
		}
		// No prefix is cached twice.
		k := sib{parent: n.parent, key: tokensKey(c.pageTokens(p))}
		if n.parent == none {
			k.key += "|" + c.rootKey[p]
		}
		if q, dup := seen[k]; dup {
			return fmt.Errorf("prefixcache: pages %d and %d cache the same prefix (parent %d)", q, p, n.parent)
		}
		seen[k] = p
		// Reachable through its hash chain exactly once.
		hits := 0
		for x := c.byHash.get(c.nodes, n.hash); x != none; x = c.nodes[x].nextHash {
			if x == p {
				hits++
			}
			if hits > 1 || !c.nodes[x].cached() || c.nodes[x].hash != n.hash {
				return fmt.Errorf("prefixcache: hash chain %#x is broken at page %d", n.hash, x)
			}
		}
		if hits != 1 {
			return fmt.Errorf("prefixcache: page %d is not in its hash chain %#x", p, n.hash)
		}
		// The idle bit matches the reference count.
		rc := c.refs.RefCount(PageID(p))
		if rc < 1 {
			return fmt.Errorf("prefixcache: cached page %d has refcount %d (the cache holds one)", p, rc)
		}
		if n.idle() != (rc == 1) {
			return fmt.Errorf("prefixcache: page %d has refcount %d but idle = %v (missed Recheck?)", p, rc, n.idle())
		}
		if n.pins > 0 {
			pinned++
			if n.parent != none && c.nodes[n.parent].pins < n.pins {
				return fmt.Errorf("prefixcache: page %d has %d pins, its parent %d only %d", p, n.pins, n.parent, c.nodes[n.parent].pins)
			}
		}
		switch {
		case n.idle() && n.pins == 0:
			idle++
		case n.idle():
			idlePinned++
		}
	}
	chains := 0
	for i, sl := range c.byHash.slots {
		if sl.ref == 0 {
			continue
		}
		chains++
		x := sl.ref - 1
		if !c.nodes[x].cached() || uint32(c.nodes[x].hash>>32) != sl.tag {
			return fmt.Errorf("prefixcache: hash slot %d names page %d, which is not cached with that hash", i, x)
		}
		// Linear probing: every slot from the hash's home to i is occupied.
		for j := c.byHash.home(c.nodes[x].hash); j != uint64(i); j = (j + 1) & c.byHash.mask {
			if c.byHash.slots[j].ref == 0 {
				return fmt.Errorf("prefixcache: hash slot %d (page %d) is unreachable: slot %d is empty", i, x, j)
			}
		}
	}
	if chains != c.byHash.n || chains > cached {
		return fmt.Errorf("prefixcache: %d hash slots in use, counter says %d, %d cached pages", chains, c.byHash.n, cached)
	}
	for p := range c.rootKey {
		if !c.nodes[p].cached() || c.nodes[p].parent != none {
			return fmt.Errorf("prefixcache: namespace recorded for page %d, which is not a cached depth-0 page", p)
		}
	}
	if cached != c.nCached || idle != c.queues.Len() || idlePinned != c.nIdlePinned || pinned != c.nPinned {
		return fmt.Errorf("prefixcache: counted cached %d idle %d idle-pinned %d pinned %d; counters say %d %d %d %d",
			cached, idle, idlePinned, pinned, c.nCached, c.queues.Len(), c.nIdlePinned, c.nPinned)
	}
	if limit := c.PinBudget(); limit > 0 && pinned > limit {
		return fmt.Errorf("prefixcache: %d pages pinned, limit %d", pinned, limit)
	}
	// Eviction queues: well linked, and holding exactly the listed pages
	// (nodeError checks each page is queued iff listed, at its level).
	if err := c.queues.CheckInvariants(); err != nil {
		return fmt.Errorf("prefixcache: %w", err)
	}
	// Pins name live pinned pages.
	for id, h := range c.pins {
		x, ok := c.resolve(h)
		if !ok || x == none || c.nodes[x].pins < 1 {
			return fmt.Errorf("prefixcache: pin %d names page %d, which is not pinned", id, h.page-1)
		}
	}
	return c.checkTimed()
}

// checkTimed checks the deadlines: the lapse heap holds exactly the idle
// cached pages with a lapse, each due after the cache's time (Advance
// lapses what is due) and at most a lapse after it, and the TTL pins are live pins whose records and
// last pages agree.
func (c *Cache) checkTimed() error {
	timed := 0
	for p := range c.lapse {
		n := &c.nodes[p]
		want := n.cached() && n.idle() && c.lapse[p] > 0
		if !n.cached() && c.lapse[p] != 0 {
			return fmt.Errorf("prefixcache: uncached page %d keeps a lapse of %v", p, c.lapse[p])
		}
		if c.lapses.has(int32(p)) != want {
			return fmt.Errorf("prefixcache: page %d (idle %v, lapse %v) is on the lapse deadlines: %v", p, n.idle(), c.lapse[p], !want)
		}
		if want {
			timed++
			if at := c.lapses.at[p]; at <= c.now || at > c.now+c.lapse[p] {
				return fmt.Errorf("prefixcache: page %d lapses at %v, now %v with a lapse of %v", p, at, c.now, c.lapse[p])
			}
		}
	}
	if timed != c.lapses.len() {
		return fmt.Errorf("prefixcache: %d pages have a lapse deadline, the heap holds %d", timed, c.lapses.len())
	}
	if len(c.ttlSlot) != c.pinLives.len() {
		return fmt.Errorf("prefixcache: %d TTL pins, %d pin deadlines", len(c.ttlSlot), c.pinLives.len())
	}
	for id, s := range c.ttlSlot {
		h, ok := c.pins[id]
		switch {
		case !ok:
			return fmt.Errorf("prefixcache: TTL pin %d is not a pin", id)
		case c.ttl[s].id != id || c.ttl[s].last != h.page-1:
			return fmt.Errorf("prefixcache: TTL pin %d's record names pin %d at page %d, the pin's last page is %d", id, c.ttl[s].id, c.ttl[s].last, h.page-1)
		case c.pinLives.at[s] <= c.now || c.pinLives.at[s] > c.now+c.ttl[s].life:
			return fmt.Errorf("prefixcache: TTL pin %d lapses at %v, now %v with a lifetime of %v", id, c.pinLives.at[s], c.now, c.ttl[s].life)
		}
	}
	return nil
}

// nodeError checks the links of cached page p against its parent, siblings
// and children.
func (c *Cache) nodeError(p int32) error {
	n := &c.nodes[p]
	if n.parent != none && (n.parent < 0 || int(n.parent) >= len(c.nodes) || !c.nodes[n.parent].cached()) {
		return fmt.Errorf("prefixcache: page %d has parent %d, which is not cached", p, n.parent)
	}
	if n.prev != none && c.nodes[n.prev].next != p {
		return fmt.Errorf("prefixcache: page %d: previous sibling %d does not link back", p, n.prev)
	}
	if n.next != none && c.nodes[n.next].prev != p {
		return fmt.Errorf("prefixcache: page %d: next sibling %d does not link back", p, n.next)
	}
	if n.prev == none && n.parent != none && c.nodes[n.parent].child != p {
		return fmt.Errorf("prefixcache: page %d is a first child but its parent %d starts at %d", p, n.parent, c.nodes[n.parent].child)
	}
	k := int32(0)
	for x := n.child; x != none; x = c.nodes[x].next {
		if !c.nodes[x].cached() || c.nodes[x].parent != p {
			return fmt.Errorf("prefixcache: page %d lists child %d whose parent is %d", p, x, c.nodes[x].parent)
		}
		if k++; k > n.children {
			break
		}
	}
	if k != n.children {
		return fmt.Errorf("prefixcache: page %d counts %d children, its list has %d", p, n.children, k)
	}
	level, _, queued := c.queues.Position(p)
	if queued != n.listed() || (queued && level != int(n.prio)) {
		return fmt.Errorf("prefixcache: page %d (idle %v, pins %d, priority %d): on an eviction queue %v (level %d)", p, n.idle(), n.pins, n.prio, queued, level)
	}
	if err := c.queues.CheckSlot(p); err != nil {
		return fmt.Errorf("prefixcache: %w", err)
	}
	return nil
}

// checkNode is the cheap per-mutation check of invariants builds: page p's
// links and the counters.
func (c *Cache) checkNode(p int32) {
	if c.nodes[p].cached() {
		if err := c.nodeError(p); err != nil {
			panic(err.Error())
		}
	}
	if c.nIdlePinned < 0 || c.nPinned < 0 || c.queues.Len()+c.nIdlePinned > c.nCached {
		panic(fmt.Sprintf("prefixcache: broken counters: cached %d idle %d idle-pinned %d pinned %d",
			c.nCached, c.queues.Len(), c.nIdlePinned, c.nPinned))
	}
}

// tokensKey is a page's tokens as a map key (4 bytes each; Sprint was most
// of the cost of a check run after every operation of a test).
func tokensKey(tokens []int32) string {
	b := make([]byte, 0, 4*len(tokens))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return string(b)
}
