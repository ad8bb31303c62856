package prefixcache

import "fmt"

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
