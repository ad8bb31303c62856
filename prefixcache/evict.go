package prefixcache

import (
	"fmt"

	"github.com/pagedkv/pagedkv/internal/invariants"
)

// pushLRU appends idle, unpinned page p at the tail of the eviction queue
// its level's policy picks for it.
func (c *Cache) pushLRU(p int32) {
	n := &c.nodes[p]
	c.queues.PushClass(p, int(n.prio), n.class())
	if c.shadow != nil {
		c.shadow.Touch(n.hash)
	}
}

// unlinkLRU removes page p from its eviction queue.
func (c *Cache) unlinkLRU(p int32) { c.queues.Remove(p) }

// victim returns the next page eviction takes: the head of the queue the
// policy of the lowest non-empty priority level picks, or none.
func (c *Cache) victim() int32 { return c.queues.Victim() }

// Evict removes idle, unpinned pages until at least npages pages have
// returned to the pool or none is left to evict, and returns how many
// returned. Victims are taken from the lowest priority level up, in the
// order the level's evict.Policy gives (least recently idle first for
// LRU). A victim's subtree (the cached pages that extend it)
// goes with it, deepest first, so no cached page is ever left behind a
// missing parent; pages of that subtree still held by requests stay with
// them and are only dropped from the cache.
//
// Cost: O(1) per removed page (a list unlink, a map delete, and one batched
// release per victim) plus O(priorities + queues) per victim; no scan, no
// heap.
func (c *Cache) Evict(npages int) (freed int) {
	for freed < npages {
		v := c.victim()
		if v == none {
			break
		}
		freed += c.evictSubtree(v)
	}
	return freed
}

// evictSubtree removes v and every page under it, children before parents,
// releases the cache's references in one call, and returns how many pages
// returned to the pool. Pins cover whole paths, so a subtree under an
// unpinned v holds no pinned page.
func (c *Cache) evictSubtree(v int32) int {
	c.counters.Victims++
	if c.nodes[v].children > 0 {
		c.counters.InnerVictims++
	}
	rel := c.scratch[:0]
	// Post-order walk without recursion: descend to a leaf, remove it, resume
	// at its parent. Each page is entered once going down and once going up.
	x := v
	for {
		for c.nodes[x].child != none {
			x = c.nodes[x].child
		}
		up := c.nodes[x].parent
		c.queues.EvictedSlot(x, int(c.nodes[x].prio), c.nodes[x].hash, c.nodes[x].class())
		c.noteEvicted(x)
		c.remove(x)
		rel = append(rel, PageID(x))
		if x == v {
			break
		}
		x = up
	}
	c.scratch = rel
	freed, err := c.refs.Release(rel...)
	c.evRet = c.evRet[:0]
	if err != nil {
		panic(fmt.Sprintf("prefixcache: releasing %d evicted pages: %v", len(rel), err))
	}
	c.counters.Evicted += int64(len(rel))
	c.counters.Freed += int64(freed)
	return freed
}

// remove takes leaf x out of the tree, its hash chain and its list; the
// caller releases the page.
func (c *Cache) remove(x int32) {
	n := &c.nodes[x]
	if invariants.Enabled && (n.children != 0 || n.pins != 0) {
		panic(fmt.Sprintf("prefixcache: removing page %d with %d children and %d pins", x, n.children, n.pins))
	}
	if n.idle() {
		c.unlinkLRU(x) // pins == 0, so it is listed
	}
	// Sibling list and parent.
	if n.prev != none {
		c.nodes[n.prev].next = n.next
	} else if n.parent != none {
		c.nodes[n.parent].child = n.next
	}
	if n.next != none {
		c.nodes[n.next].prev = n.prev
	}
	if n.parent != none {
		c.nodes[n.parent].children--
	} else {
		delete(c.rootKey, x)
	}
	c.byHash.drop(c.nodes, n.hash, x, n.nextHash)
	if c.lapse != nil {
		c.lapse[x] = 0
		c.lapses.remove(x)
	}
	if c.sink != nil {
		c.sink.PageRemoved(PageID(x), n.hash)
	}
	*n = node{parent: none, child: none, next: none, prev: none, nextHash: none, gen: n.gen + 1}
	c.nCached--
}
