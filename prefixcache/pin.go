package prefixcache

import (
	"fmt"
	"time"
)

// PinID names one pin made by [Cache.Pin].
type PinID uint64

// Pin keeps the cached prefix of tokens in namespace key (every cached full
// page of it, from the first) out of eviction until [Cache.Unpin]. Pins
// count: a page pinned twice needs two Unpins. It returns the pin and the
// number of pages it covers. A pin covers a path from the root, so every
// ancestor of a pinned page is pinned and eviction never has to cut a pinned
// page out of a subtree.
//
// It fails, changing nothing, with [ErrNotCached] if not even the first page
// is cached and with [ErrPinLimit] if the pages it would newly pin take the
// total past Config.MaxPinnedPages.
func (c *Cache) Pin(key Key, tokens []int32) (id PinID, npages int, err error) {
	return c.PinFor(key, tokens, 0)
}

// PinFor is [Cache.Pin] with a lifetime: with ttl > 0 the pin lapses by
// itself once ttl has passed on the cache's clock ([Cache.Advance])
// since it was made or last refreshed, and every [Cache.Hit] on its last
// (deepest) page refreshes it (an admission that matched the whole
// pinned prefix). ttl 0 pins until Unpin; a negative ttl is
// ErrBadArgument. Unpin of a lapsed pin is ErrUnknownPin.
func (c *Cache) PinFor(key Key, tokens []int32, ttl time.Duration) (id PinID, npages int, err error) {
	if ttl < 0 {
		return 0, 0, fmt.Errorf("%w: pin %d tokens for %v, want a lifetime >= 0", ErrBadArgument, len(tokens), ttl)
	}
	path, last, err := c.pinPath(key, tokens)
	if err != nil {
		return 0, 0, err
	}
	for _, p := range path {
		n := &c.nodes[p]
		if n.pins == 0 {
			if n.idle() {
				c.unlinkLRU(int32(p))
				c.nIdlePinned++
			}
			c.nPinned++
		}
		n.pins++
	}
	c.nextPin++
	c.pins[c.nextPin] = last
	if ttl > 0 {
		c.addTTL(c.nextPin, last.page-1, ttl)
	}
	return c.nextPin, len(path), nil
}

// CheckPin reports what [Cache.Pin] of the same arguments would do, the
// pages it would cover or its error, and changes nothing. A caller pinning
// in several caches all or nothing checks each first.
func (c *Cache) CheckPin(key Key, tokens []int32) (npages int, err error) {
	path, _, err := c.pinPath(key, tokens)
	return len(path), err
}

// pinPath returns the cached path Pin of tokens would pin (in c.scratch)
// and its last page, or Pin's error.
func (c *Cache) pinPath(key Key, tokens []int32) ([]PageID, Handle, error) {
	path, last := c.Match(c.scratch[:0], key, tokens, len(tokens)/c.pageSize)
	c.scratch = path
	if len(path) == 0 {
		return nil, Handle{}, fmt.Errorf("%w: pin %d tokens: the first page is not cached", ErrNotCached, len(tokens))
	}
	fresh := 0
	for _, p := range path {
		if c.nodes[p].pins == 0 {
			fresh++
		}
	}
	if c.maxPinned > 0 && c.nPinned+fresh > c.maxPinned {
		return nil, Handle{}, fmt.Errorf("%w: pinning %d more pages would make %d, limit %d",
			ErrPinLimit, fresh, c.nPinned+fresh, c.maxPinned)
	}
	if c.pinBudget > 0 && c.nPinned+fresh > c.pinBudget {
		return nil, Handle{}, fmt.Errorf("%w: pinning %d more pages would make %d pinned, over the pin budget of %d pages (%g of %d)",
			ErrPinLimit, fresh, c.nPinned+fresh, c.pinBudget, c.pinShare, len(c.nodes))
	}
	return path, last, nil
}

// Unpin removes one pin. Pages left with no pin that are idle join the tail
// of their LRU lists, deepest first.
func (c *Cache) Unpin(id PinID) error {
	h, ok := c.pins[id]
	if !ok {
		return fmt.Errorf("%w: unpin %d", ErrUnknownPin, id)
	}
	x, ok := c.resolve(h)
	if !ok || x == none {
		// Pinned pages are never evicted, so this cannot happen.
		panic(fmt.Sprintf("prefixcache: pin %d names page %d, which is gone", id, h.page-1))
	}
	delete(c.pins, id)
	c.dropTTL(id)
	for ; x != none; x = c.nodes[x].parent {
		n := &c.nodes[x]
		if n.pins <= 0 {
			panic(fmt.Sprintf("prefixcache: unpin %d: page %d on the pinned path has %d pins", id, x, n.pins))
		}
		n.pins--
		if n.pins == 0 {
			c.nPinned--
			if n.idle() {
				c.nIdlePinned--
				c.pushLRU(x)
			}
		}
	}
	return nil
}

// ttlPin is the record of one pin with a lifetime (slot s of Cache.ttl).
type ttlPin struct {
	id   PinID
	life time.Duration // the ttl: each refresh sets the deadline to now + life
	last int32         // the pinned prefix's last page: a hit on it refreshes
	next int32         // the next slot of a pin with the same last page, or none
	prev int32         // the previous one, or none (then Cache.ttlAt[last] is this slot)
}

// addTTL records that pin id, whose last page is last, lapses ttl from now.
func (c *Cache) addTTL(id PinID, last int32, ttl time.Duration) {
	var s int32
	if n := len(c.ttlFree); n > 0 {
		s = c.ttlFree[n-1]
		c.ttlFree = c.ttlFree[:n-1]
	} else {
		s = int32(len(c.ttl))
		c.ttl = append(c.ttl, ttlPin{})
		if c.pinLives.tie == nil {
			c.pinLives.tie = []uint64{}
		}
		c.pinLives.grow(max(len(c.ttl), 2*len(c.pinLives.at)))
	}
	c.pinLives.tie[s] = uint64(id) // pins due at once lapse oldest first
	head, ok := c.ttlAt[last]
	if !ok {
		head = none
	}
	c.ttl[s] = ttlPin{id: id, life: ttl, last: last, next: head, prev: none}
	if head != none {
		c.ttl[head].prev = s
	}
	c.ttlAt[last] = s
	c.ttlSlot[id] = s
	c.pinLives.set(s, c.now+ttl)
}

// dropTTL forgets pin id's lifetime, if it has one.
func (c *Cache) dropTTL(id PinID) {
	s, ok := c.ttlSlot[id]
	if !ok {
		return
	}
	t := &c.ttl[s]
	if t.prev != none {
		c.ttl[t.prev].next = t.next
	} else if t.next != none {
		c.ttlAt[t.last] = t.next
	} else {
		delete(c.ttlAt, t.last)
	}
	if t.next != none {
		c.ttl[t.next].prev = t.prev
	}
	delete(c.ttlSlot, id)
	c.pinLives.remove(s)
	*t = ttlPin{}
	c.ttlFree = append(c.ttlFree, s)
}

// refreshTTL restarts the lifetime of every TTL pin whose last page is p.
func (c *Cache) refreshTTL(p int32) {
	s, ok := c.ttlAt[p]
	if !ok {
		return
	}
	for ; s != none; s = c.ttl[s].next {
		c.pinLives.set(s, c.now+c.ttl[s].life)
	}
}

// PinDeadline returns when pin id lapses on the cache's clock; ok is
// false for a pin without a lifetime or an unknown one.
func (c *Cache) PinDeadline(id PinID) (at time.Duration, ok bool) {
	s, ok := c.ttlSlot[id]
	if !ok {
		return 0, false
	}
	return c.pinLives.at[s], true
}

// PinBudget returns the most pages pins may hold at once (the tighter of
// Config.MaxPinnedPages and Config.PinBudget's share of the pool), 0 for
// no limit.
func (c *Cache) PinBudget() int {
	switch {
	case c.maxPinned == 0:
		return c.pinBudget
	case c.pinBudget == 0:
		return c.maxPinned
	}
	return min(c.maxPinned, c.pinBudget)
}
