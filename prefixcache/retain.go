package prefixcache

import (
	"fmt"
	"time"
)

// Retention with a lapse and TTL pins measure time on the owner's clock:
// the cache reads none. [Cache.Advance] tells it the time, and every
// deadline that time has reached lapses then, in deadline order; the
// owner calls it before each operation that evicts, pins or admits (the
// pagedkv Manager does, with Config.Clock). Between two Advance calls the
// cache's time stands still, so the same calls give the same results.

// Retain sets the retention of the cached pages among pages: they move
// to priority level prio (up or down: the latest retention wins), and,
// with lapse > 0, back to level 0 once they have stayed idle for lapse
// (counted from when a page last became idle, so every use restarts it;
// a page in use never lapses). lapse 0 keeps the level until it is
// changed. An idle page that changes level moves to the tail of its new
// queue. Pages that are not cached are ignored. A level out of range or
// a negative lapse is ErrBadArgument, and nothing changes.
//
// The eviction rule, for every policy: the victim is taken from the
// lowest level that holds an evictable page, in that level's policy
// order, so no page is evicted while a page of a lower level is
// evictable; a page whose lapse has passed counts as level 0 from the
// first Advance at or after its deadline.
func (c *Cache) Retain(prio Priority, lapse time.Duration, pages ...PageID) error {
	switch {
	case int(prio) >= c.queues.Levels():
		return fmt.Errorf("%w: retain at priority %d, want 0..%d", ErrBadArgument, prio, c.queues.Levels()-1)
	case lapse < 0:
		return fmt.Errorf("%w: retain for %v, want a lapse >= 0", ErrBadArgument, lapse)
	}
	if lapse > 0 && c.lapse == nil {
		// The first lapse sizes the deadlines for every page: later
		// retention allocates nothing.
		c.lapse = make([]time.Duration, len(c.nodes))
		c.lapses.grow(len(c.nodes))
	}
	for _, p := range pages {
		if p < 0 || int(p) >= len(c.nodes) || !c.nodes[p].cached() {
			continue
		}
		if c.nodes[p].prio != prio {
			c.requeue(int32(p), func(n *node) { n.prio = prio })
		}
		c.setLapse(int32(p), lapse)
	}
	return nil
}

// setLapse sets cached page p's lapse and, while it is idle, its
// deadline.
func (c *Cache) setLapse(p int32, lapse time.Duration) {
	if c.lapse == nil {
		return
	}
	c.lapse[p] = lapse
	c.timeLapse(p)
}

// timeLapse puts page p on the lapse deadlines if it is idle with a
// lapse and off them otherwise (a page's deadline counts from when it
// became idle).
func (c *Cache) timeLapse(p int32) {
	if c.lapse == nil {
		return
	}
	if c.lapse[p] > 0 && c.nodes[p].idle() && c.nodes[p].cached() {
		c.lapses.set(p, c.now+c.lapse[p])
	} else {
		c.lapses.remove(p)
	}
}

// Lapse returns page p's lapse (0: none, or not cached).
func (c *Cache) Lapse(p PageID) time.Duration {
	if c.lapse == nil || p < 0 || int(p) >= len(c.nodes) || !c.nodes[p].cached() {
		return 0
	}
	return c.lapse[p]
}

// Priority returns cached page p's priority level (0 if not cached).
func (c *Cache) Priority(p PageID) Priority {
	if p < 0 || int(p) >= len(c.nodes) || !c.nodes[p].cached() {
		return 0
	}
	return c.nodes[p].prio
}

// Now returns the cache's time: the latest Advance.
func (c *Cache) Now() time.Duration { return c.now }

// Advance sets the cache's time to now (a time before the current one is
// taken as the current one: time never goes back) and lapses what is
// due, earliest deadline first: idle pages whose lapse has passed drop to
// level 0 (moving to the tail of their new queue), and TTL pins whose
// lifetime has passed are removed as [Cache.Unpin] would. It returns how
// many pages and pins lapsed. Cost: O(log n) per lapse; nothing
// allocates.
func (c *Cache) Advance(now time.Duration) (pages, pins int) {
	c.now = max(c.now, now)
	for {
		p, ok := c.lapses.due(c.now)
		if !ok {
			break
		}
		c.lapses.remove(p)
		c.lapse[p] = 0
		if c.nodes[p].prio != 0 {
			c.requeue(p, func(n *node) { n.prio = 0 })
		}
		pages++
	}
	for {
		s, ok := c.pinLives.due(c.now)
		if !ok {
			break
		}
		if err := c.Unpin(c.ttl[s].id); err != nil {
			panic(fmt.Sprintf("prefixcache: TTL pin %d lapsed but is unknown: %v", c.ttl[s].id, err))
		}
		pins++
	}
	return pages, pins
}
