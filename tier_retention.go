package pagedkv

import (
	"fmt"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
)

// Retention below the device (docs/retention.md, "Below the device"): a
// page that leaves the device for the host tier takes the retention the
// cache gave it (level, lapse and what is left of it, continuation hint);
// the host tier keeps it and honours it in its reclaim order, hands it to
// the stores below with the page, and an onload gives it back to the
// device page when the page is published again. None of it runs on a
// step without tier traffic.

// hostLevels is the host tier's number of retention levels: the pool's.
func hostLevels(priorities int) int {
	if priorities == 0 {
		return prefixcache.DefaultPriorities
	}
	return min(max(priorities, 1), tier.MaxRetentionLevels)
}

// tierRetention converts a cached page's retention for the tiers.
func tierRetention(r prefixcache.PageRetention) tier.Retention {
	out := tier.Retention{Priority: uint8(r.Priority), Hint: uint8(r.Hint)}
	if r.Priority > 0 && r.Lapse > 0 {
		out.Duration, out.Left = min(r.Lapse, tier.MaxRetentionDuration), min(max(r.Left, 1), r.Lapse, tier.MaxRetentionDuration)
	}
	return out
}

// hostRetain gives host page h the retention r of the device page it
// holds.
func (t *tiers) hostRetain(h HostPageID, r prefixcache.PageRetention) {
	if err := t.host.SetRetention(h, tierRetention(r)); err != nil {
		panic(fmt.Sprintf("pagedkv: retention %+v of host page %d: %v", r, h, err))
	}
}

// evictedRetention is the retention of pages[i] in an eviction's release
// (zero outside one).
func evictedRetention(ret []prefixcache.PageRetention, i, n int) prefixcache.PageRetention {
	if len(ret) != n {
		return prefixcache.PageRetention{}
	}
	return ret[i]
}

// fetchedRetention gives host page h, just fetched from below, the
// retention the store served with it, its level cut to the pool's levels
// (a store may hold values of a pool with more).
func (t *tiers) fetchedRetention(h HostPageID, r tier.Retention) {
	if r == (tier.Retention{}) {
		return
	}
	if r.Duration > 0 {
		t.startClock() // the host tier's time is the caches'
	}
	if top := uint8(t.host.Levels() - 1); r.Priority > top {
		r.Priority = top
	}
	if err := t.host.SetRetention(h, r); err != nil {
		panic(fmt.Sprintf("pagedkv: retention %+v of fetched host page %d: %v", r, h, err))
	}
}

// loadedRetention is what an onload brought for a device page: the
// retention, for the page of that digest.
type loadedRetention struct {
	digest tier.Digest
	r      tier.Retention
}

// onloadRetention notes host page h's retention for device page dev,
// onloaded from it.
func (t *tiers) onloadRetention(dev PageID, h HostPageID) {
	r := t.host.Retention(h)
	if r == (tier.Retention{}) && t.loadRet == nil {
		return
	}
	if t.loadRet == nil {
		t.loadRet = make([]loadedRetention, len(t.meta))
	}
	if r.Duration > 0 {
		t.startClock()
	}
	d, _, _, _, _ := t.host.Entry(h)
	t.loadRet[dev] = loadedRetention{d, r}
}

// restoreRetention gives device page p, just published with digest d, the
// retention its onload brought (if any): its level when that is above the
// page's (the loading request's priority may be higher), with its whole
// lapse (a use restarts the count), and its hint. The request's retention
// ranges apply after it (the latest hint wins).
func (m *group) restoreRetention(p PageID, d tier.Digest) {
	t := m.tiers
	if t.loadRet == nil {
		return
	}
	lr := t.loadRet[p]
	t.loadRet[p] = loadedRetention{}
	if lr.digest != d || lr.r == (tier.Retention{}) {
		return
	}
	if prefixcache.Priority(lr.r.Priority) >= m.cache.Priority(p) && int(lr.r.Priority) < m.cache.NumPriorities() {
		if err := m.cache.Retain(prefixcache.Priority(lr.r.Priority), lr.r.Duration, p); err != nil {
			panic(fmt.Sprintf("pagedkv: restoring the retention of onloaded page %d: %v", p, err))
		}
	}
	if h := evict.Hint(lr.r.Hint); h != evict.HintNone {
		if err := m.cache.Hint(h, p); err != nil {
			panic(fmt.Sprintf("pagedkv: restoring the hint of onloaded page %d: %v", p, err))
		}
	}
}
