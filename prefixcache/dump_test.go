package prefixcache

import (
	"fmt"
	"slices"
	"strings"
)

// dump draws the cache as text, one cached page per line in page order, then
// under LRU each level's list (least recently used first), under other
// policies each level's evictable pages in page order (the policy's order
// shows in which pages eviction takes); "hits" appear once a page served one:
//
//	p3 <- p1 [5 6 7 8] prio 0 pins 0 hits 1 idle
//	lru[0]: p3 p1
//
// "<- -" marks a depth-0 page, followed by its namespace. Tests compare dumps
// with require.Equal, so a failure prints a line diff.
func (c *Cache) dump() string {
	var b strings.Builder
	for i := range c.nodes {
		n := &c.nodes[i]
		if !n.cached() {
			continue
		}
		par := "-"
		if n.parent != none {
			par = fmt.Sprintf("p%d", n.parent)
		}
		fmt.Fprintf(&b, "p%d <- %s %v prio %d pins %d", i, par, c.pageTokens(int32(i)), n.prio, n.pins)
		if n.hits > 0 {
			fmt.Fprintf(&b, " hits %d", n.hits)
		}
		if n.idle() {
			b.WriteString(" idle")
		}
		if l := c.Lapse(PageID(i)); l > 0 {
			fmt.Fprintf(&b, " lapse %v", l)
			if at := c.lapses.at[i]; c.lapses.has(int32(i)) {
				fmt.Fprintf(&b, " at %v", at)
			}
		}
		if n.parent == none {
			fmt.Fprintf(&b, " ns %q", c.rootKey[int32(i)])
		}
		b.WriteByte('\n')
	}
	for prio := range c.queues.Levels() {
		if c.queues.LevelLen(prio) == 0 {
			continue
		}
		if c.queues.QueuesPerLevel() != 1 {
			fmt.Fprintf(&b, "evictable[%d]:", prio)
			for i := range c.nodes {
				if nd := &c.nodes[i]; nd.listed() && int(nd.prio) == prio {
					fmt.Fprintf(&b, " p%d", i)
				}
			}
			b.WriteByte('\n')
			continue
		}
		fmt.Fprintf(&b, "lru[%d]:", prio)
		for x := c.queues.Front(prio, 0); x != none; x = c.queues.Next(x) {
			fmt.Fprintf(&b, " p%d", x)
		}
		b.WriteByte('\n')
	}
	ids := make([]PinID, 0, len(c.ttlSlot))
	for id := range c.ttlSlot {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		at, _ := c.PinDeadline(id)
		fmt.Fprintf(&b, "pin %d lapses at %v\n", id, at)
	}
	return b.String()
}
