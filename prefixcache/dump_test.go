package prefixcache

import (
	"fmt"
	"strings"
)

// dump draws the cache as text, one cached page per line in page order, then
// one LRU list per priority (least recently used first):
//
//	p3 <- p1 [5 6 7 8] prio 0 pins 0 idle
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
		if n.idle() {
			b.WriteString(" idle")
		}
		if n.parent == none {
			fmt.Fprintf(&b, " ns %q", c.rootKey[int32(i)])
		}
		b.WriteByte('\n')
	}
	for prio, l := range c.lists {
		if l.n == 0 {
			continue
		}
		fmt.Fprintf(&b, "lru[%d]:", prio)
		for x := l.head; x != none; x = c.nodes[x].lruNext {
			fmt.Fprintf(&b, " p%d", x)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
