package prefixcache

import (
	"time"

	"github.com/pagedkv/pagedkv/evict"
)

// PageRetention is a cached page's retention as the tiers below the
// device take it (docs/retention.md, "Below the device"): its level, its
// lapse, what is left of the lapse (the whole lapse for a page in use:
// its count has not started) and its continuation hint.
type PageRetention struct {
	Priority    Priority
	Hint        evict.Hint
	Lapse, Left time.Duration
}

// RetentionOf returns cached page p's retention (zero if not cached).
func (c *Cache) RetentionOf(p PageID) PageRetention {
	if p < 0 || int(p) >= len(c.nodes) || !c.nodes[p].cached() {
		return PageRetention{}
	}
	return c.retentionOf(int32(p))
}

func (c *Cache) retentionOf(x int32) PageRetention {
	n := &c.nodes[x]
	r := PageRetention{Priority: n.prio, Hint: n.hint}
	if c.lapse != nil && c.lapse[x] > 0 {
		r.Lapse, r.Left = c.lapse[x], c.lapse[x]
		if c.lapses.has(x) {
			r.Left = c.lapses.at[x] - c.now
		}
	}
	return r
}

// KeepEvictedRetention makes eviction note each evicted page's retention
// for [Cache.EvictedRetention] (the tiers below the device keep it with
// the page). Off by default: eviction then notes nothing.
func (c *Cache) KeepEvictedRetention() { c.keepRet = true }

// EvictedRetention returns, while the owner's Refs.Release runs for an
// eviction, the retention the released pages had, in their order; empty
// at any other time.
func (c *Cache) EvictedRetention() []PageRetention { return c.evRet }

// noteEvicted notes page x's retention before eviction removes it.
func (c *Cache) noteEvicted(x int32) {
	if c.keepRet {
		c.evRet = append(c.evRet, c.retentionOf(x))
	}
}
