package pagedkv

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
)

// core is the protocol that drives the layer groups sharing one page pool,
// and the whole of what both facades do: a dense Manager is a core of one
// group, a HybridManager a core of one group per LayerGroup. Every group
// (group.go) has its own page table, prefix cache and request records;
// core does what spans them, once for both facades.
//
//   - Admission (add, resume, admit): each group matches the prompt in its
//     cache and, with tiers, continues the match from the host tier and the
//     remote store; every group is then given the same prefix, the longest
//     all of them serve, with one page budget for the onloads.
//   - Per-request calls (extend, fork, release, preempt, truncate): group 0
//     validates, every group follows (each).
//   - A step (reserve): group 0 validates the step and resolves its
//     requests (prepare), each later group follows the records of the group
//     before (prepareSiblings), one page budget covers every group's pages
//     and copies (eviction across the groups' caches), and then every group
//     applies its part (apply) and republishes its Stats (afterChange).
//   - Commit (commit): group 0 checks the commit once for every group, every
//     group records it, then the pool evicts ahead; abort likewise.
//   - Eviction (evict, evictTo, evictAhead): from the group with the most
//     idle cached pages, offloading to the host tier where asked.
//   - Pins (pin, unpin): the prefix every group holds, pinned in every group.
//   - Tiers (core_tiers.go): one stream of tier copies for the pool; a copy
//     completes in the group it was planned for.
//   - Stats (stats.go): the one group's snapshot, or the groups' summed.
//   - Audit (audit, auditPool): every group, the groups against each other,
//     and every page's reference count against its holders in every group
//     and the tier copies.
//
// A group knows only its own state: nothing in a group points at its core
// or at another group, but for request.sibling, which core.link sets.
type core struct {
	groups []*group
	lead   *group // groups[0], read per request (has, tokens, computed)
	alloc  *allocator.Allocator
	tiers  *tiers // shared by every group; nil without tiers

	// servable, per group, counts the prompt tokens the group's device
	// cache alone could serve at Add and Resume (GroupStats.ServableTokens;
	// read from any goroutine).
	servable []atomic.Int64

	adm  []admission // per group: admission scratch
	recs []*request  // scratch: one request's record in each group

	clock func() time.Duration // Config.Clock (tick)
	// timed: a retention with a Duration or a TTL pin was given once, so
	// time matters and tick reads the clock (before, nothing can lapse).
	timed bool

	plan   HybridPlan // the step's plan: one Plan per group
	copies []CopyOp   // the buffer of plan.Copies over several groups

	// bound are the engine's step buffers (stepbuffers.go); nil: plans
	// are the groups' own buffers.
	bound *stepBuffers

	// media is the admission's scratch of the medium each page is read
	// from (usage.go); kept are released requests' CacheUsage until read.
	media []tier.Medium
	kept  keptUsages
	// state is a HybridManager's state groups (group_state.go), nil
	// without; attnAt is then each group's HybridConfig.Groups index
	// (plan.Groups holds every configured group).
	state  *stateSet
	attnAt []int
	specs  []LayerGroup // every configured group's (with state groups)
}

// admission is one group's part of an admission.
type admission struct {
	pages    []PageID           // the device pages matched
	last     prefixcache.Handle // the cache position of the last one
	hits     []HostPageID       // host pages (acquired) continuing the match
	hostHits int                // of hits, found in the host tier (the rest came from the remote store)
	fetched  []tier.Medium      // per hit after hostHits: the medium that served its fetch
}

func newCore(groups []*group, alloc *allocator.Allocator, t *tiers) *core {
	c := &core{groups: groups, lead: groups[0], alloc: alloc, tiers: t, servable: make([]atomic.Int64, len(groups)), clock: clockOf(&groups[0].cfg),
		adm: make([]admission, len(groups)), recs: make([]*request, len(groups)),
		plan: HybridPlan{Groups: make([]*Plan, len(groups))}}
	if t != nil {
		t.startClock = c.startClock
	}
	return c
}

// pageSize is the pool's page size (every group's).
func (c *core) pageSize() int { return c.groups[0].pageSize }

// ---- Per request ----

// add admits request id in every group on the prefix every group can serve
// (admit) and returns its length: the Add of both facades.
func (c *core) add(id RequestID, req Request) (matchedTokens int, err error) {
	if err := c.groups[0].checkAdd(id, req); err != nil {
		return 0, err
	}
	c.tickFor(req.Retention)
	recs := c.recs
	for g, m := range c.groups {
		recs[g] = m.newRecord(id, req)
	}
	if c.state != nil {
		c.state.add(id, req, recs[0].key.Hash())
	}
	matched := c.admit(recs)
	for g, m := range c.groups {
		m.added(recs[g], req, matched)
	}
	c.link(id)
	c.kept.forget(id) // the ID names a new request now
	return matched, nil
}

// resume re-admits preempted request id in every group on the prefix every
// group can serve (admit) and returns its length: the Resume of both
// facades.
func (c *core) resume(id RequestID) (matchedTokens int, err error) {
	r0, err := c.groups[0].checkResume(id)
	if err != nil {
		return 0, err
	}
	c.tick()
	recs := c.recs
	for g, r := 0, r0; g < len(c.groups); g, r = g+1, r.sibling {
		recs[g] = r
	}
	matched := c.admit(recs)
	for g, m := range c.groups {
		m.resumed(recs[g], matched)
	}
	return matched, nil
}

// extend appends tokens to request id in every group.
func (c *core) extend(id RequestID, tokens []int32) error {
	if err := c.each(func(m *group) error { return m.extend(id, tokens...) }); err != nil {
		return err
	}
	if c.state != nil {
		c.state.extend(id, len(c.tokens(id)))
	}
	return nil
}

// fork forks request parent to child in every group.
func (c *core) fork(parent, child RequestID) error {
	if err := c.checkLoading("fork", parent); err != nil {
		return err
	}
	if err := c.each(func(m *group) error { return m.fork(parent, child) }); err != nil {
		return err
	}
	if c.state != nil {
		c.state.fork(parent, child)
	}
	c.link(child)
	return nil
}

// release ends request id in every group, keeping its CacheUsage until
// read (usage.go).
func (c *core) release(id RequestID) error {
	c.tick()
	lead := c.groups[0]
	if r, ok := lead.reqs[id]; ok && !lead.pending {
		if c.kept.put(id, r.usage) {
			lead.counters.usageDropped++
		}
	}
	if err := c.each(func(m *group) error { return m.release(id) }); err != nil {
		return err
	}
	if c.state != nil {
		c.state.release(id)
	}
	return nil
}

// preempt drops request id's pages in every group.
func (c *core) preempt(id RequestID) error {
	c.tick()
	if err := c.each(func(m *group) error { return m.preempt(id) }); err != nil {
		return err
	}
	if c.state != nil {
		c.state.preempt(id)
	}
	return nil
}

// truncate cuts request id to n tokens in every group, or fails changing
// nothing if any group cannot.
func (c *core) truncate(id RequestID, n int) error {
	c.tick()
	if len(c.groups) > 1 || c.state != nil {
		for _, m := range c.groups {
			if _, err := m.checkTruncate(id, n); err != nil {
				return err
			}
		}
	}
	if c.state != nil {
		r := c.groups[0].reqs[id]
		if err := c.state.checkTruncate(id, n, r.computed, r.running); err != nil {
			return err
		}
	}
	if err := c.each(func(m *group) error { return m.truncate(id, n) }); err != nil {
		return err
	}
	if c.state != nil {
		c.state.truncate(id, n)
	}
	return nil
}

// unpin removes pin id from every group.
func (c *core) unpin(id PinID) error {
	c.tick()
	return c.each(func(m *group) error { return m.unpin(id) })
}

// each runs op on every group; only group 0 may fail (every group holds the
// same requests in the same states, so they validate alike).
func (c *core) each(op func(m *group) error) error {
	for g, m := range c.groups {
		if err := op(m); err != nil {
			if g > 0 {
				panic(fmt.Sprintf("pagedkv: group %d failed where group 0 succeeded: %v", g, err))
			}
			return err
		}
	}
	return nil
}

// checkLoading fails with ErrLoading when request id waits for onloads in
// a group after group 0 (group 0's operations check their own).
func (c *core) checkLoading(op string, id RequestID) error {
	for g := 1; g < len(c.groups); g++ {
		if r, ok := c.groups[g].reqs[id]; ok && r.loading > 0 {
			return fmt.Errorf("%w: %s request %d: %d onload copies in flight in group %d (%v)", ErrLoading, op, id, r.loading, g, c.groups[g].layerGroup.Kind)
		}
	}
	return nil
}

// has, running, tokens and computed read group 0: every group holds the
// same requests with the same tokens.
func (c *core) has(id RequestID) bool { _, ok := c.lead.reqs[id]; return ok }

func (c *core) running(id RequestID) bool { r, ok := c.lead.reqs[id]; return ok && r.running }

func (c *core) tokens(id RequestID) []int32 {
	if r, ok := c.lead.reqs[id]; ok {
		return r.tokens
	}
	return nil
}

func (c *core) computed(id RequestID) int {
	if r, ok := c.lead.reqs[id]; ok {
		return r.computed
	}
	return 0
}

// loading reports whether request id waits for onloads in any group.
func (c *core) loading(id RequestID) bool {
	for _, m := range c.groups {
		if m.loading(id) {
			return true
		}
	}
	return c.state != nil && c.state.loadingReq(id)
}

// pending reports whether a step is reserved (in every group alike).
func (c *core) pending() bool { return c.groups[0].pending }

// evict evicts n idle cached pages (fewer if fewer are idle) and returns
// how many pages it freed: from the one group's cache, or from the group
// with the most idle pages first, one page at a time.
func (c *core) evict(n int) int {
	if len(c.groups) == 1 && c.state == nil {
		return c.groups[0].cache.Evict(n)
	}
	freed := 0
	for freed < n {
		best, most := -1, 0
		for g, m := range c.groups {
			if e, _ := m.cache.Idle(); e > most {
				best, most = g, e
			}
		}
		if c.state != nil && c.state.idlePages() > most {
			// Frees no page while a tier copy still reads its slot (a
			// write-through): the copy frees it; the idle count fell.
			freed += c.state.evictOne()
			continue
		}
		if best < 0 {
			break
		}
		freed += c.groups[best].cache.Evict(1)
	}
	return freed
}

// evictable returns the idle cached pages of every group.
func (c *core) evictable() int {
	n := 0
	for _, m := range c.groups {
		e, _ := m.cache.Idle()
		n += e
	}
	if c.state != nil {
		n += c.state.idlePages()
	}
	return n
}

// afterChange runs every group's afterChange.
func (c *core) afterChange() {
	for _, m := range c.groups {
		m.afterChange()
	}
}

// reserve reserves a step in every group: the first group validates it
// and resolves its requests (prepare), each later group follows the
// records of the group before (prepareSiblings), one page budget covers
// every group's new pages and copies, evicting idle cached pages of any
// group if the pool is short, and then every group applies its part
// (apply), its plan sharing the first group's token arrays. It is
// all-or-nothing: on error nothing changes, the caches included.
func (c *core) reserve(ids []RequestID, ntokens []int32, drafts [][]int32) (*HybridPlan, error) {
	c.tick()
	lead := c.groups[0]
	if c.state != nil {
		if err := c.state.checkDrafts(drafts); err != nil {
			return nil, err
		}
		if err := c.state.checkLoading(ids); err != nil {
			return nil, err
		}
	}
	need, err := lead.prepare(ids, ntokens, drafts)
	if err != nil {
		return nil, err
	}
	for g := 1; g < len(c.groups); g++ {
		n, err := c.groups[g].prepareSiblings(c.groups[g-1])
		if err != nil {
			return nil, err
		}
		need += n
	}
	if c.state != nil {
		need += c.state.prepare(lead.batch)
	}
	if c.bound != nil {
		if err := c.bound.check(c, len(ids)); err != nil {
			return nil, err
		}
	}
	if free := c.alloc.NumFree(); need > free {
		evictable := c.evictable()
		if need > free+evictable {
			if len(c.groups) == 1 {
				return nil, fmt.Errorf("%w: a step of %d requests needs %d pages; %d are free and %d evictable",
					ErrOutOfPages, len(ids), need, free, evictable)
			}
			return nil, fmt.Errorf("%w: a step of %d requests needs %d pages in %d groups; %d are free and %d evictable",
				ErrOutOfPages, len(ids), need, len(c.groups), free, evictable)
		}
		c.evict(need - free)
	}
	lead.apply(drafts, nil)
	for _, m := range c.groups[1:] {
		m.apply(drafts, lead)
	}
	// The step's plan: every group's, and their copies in one list (the
	// one group's own list when there is one).
	p := &c.plan
	if c.state != nil {
		c.placeStatePlans(p)
	} else {
		for g, m := range c.groups {
			p.Groups[g] = &m.plan
		}
	}
	p.Requests = lead.plan.Requests
	if len(c.groups) == 1 && c.state == nil {
		p.Copies = lead.plan.Copies
	} else {
		p.Copies = c.copies[:0]
		for _, m := range c.groups {
			p.Copies = append(p.Copies, m.plan.Copies...)
		}
		if c.state != nil {
			p.Copies = append(p.Copies, c.state.copies...)
		}
		c.copies = p.Copies
	}
	if c.bound != nil {
		return c.bound.write(p), nil
	}
	return p, nil
}

// commit commits the pending step in every group (accepted nil: a step
// without drafts): the first group checks it for all (every group holds
// the same requests, tokens and step), then every group records it, and
// the pool evicts ahead (Tiers.OffloadFreePages). On error nothing
// changes.
func (c *core) commit(accepted, sampled []int32) error {
	if err := c.groups[0].checkCommit(accepted, sampled); err != nil {
		return err
	}
	c.tick()
	for _, m := range c.groups {
		m.commit(accepted, sampled)
	}
	c.countWrites()
	if c.state != nil {
		c.state.commit()
	}
	if c.tiers != nil {
		c.evictAhead()
	}
	// Every group's Stats once, after all of the commit (a later group's
	// commit may plan tier copies, write-through, and the writes count
	// after every group's).
	c.afterChange()
	return nil
}

// commitSpec is commit for a speculative step (see Manager.CommitSpec).
func (c *core) commitSpec(accepted, sampled []int32) error {
	if accepted == nil {
		accepted = []int32{} // a spec commit of a step without requests
	}
	return c.commit(accepted, sampled)
}

// abort undoes the pending step in every group.
func (c *core) abort() error {
	c.tick()
	for g, m := range c.groups {
		if err := m.abort(); err != nil {
			if g > 0 {
				panic(fmt.Sprintf("pagedkv: group %d failed to abort where group 0 did: %v", g, err))
			}
			return err
		}
	}
	if c.state != nil {
		c.state.abort()
	}
	return nil
}

// admit gives rs[g], the request's record in group g (running, not in the
// page table, with the same tokens in every group), the longest prefix
// every group can serve, and returns its length in tokens. A group serves
// a prefix of L pages when its cache holds its first k pages and the host
// tier (or the remote store) the pages from k to L, which are onloaded
// into fresh device pages; the onloads of every group share one budget of
// free and evictable pages. At least one token is left to compute.
func (c *core) admit(rs []*request) int {
	r0 := rs[0]
	ps := c.groups[0].pageSize
	use := !r0.noCache && len(r0.tokens) > 1
	maxPages := 0
	if use {
		maxPages = (len(r0.tokens) - 1) / ps
	}
	// Device matches.
	L := maxPages
	for g, m := range c.groups {
		r, a := rs[g], &c.adm[g]
		a.pages, a.last, a.hits, a.hostHits, a.fetched = a.pages[:0], prefixcache.Handle{}, a.hits[:0], 0, a.fetched[:0]
		if use {
			a.pages, a.last = m.cache.Match(a.pages, r.key, r.tokens, maxPages)
		}
		if use {
			c.servable[g].Add(int64(len(a.pages) * ps))
		}
		m.admissions++
		r.gen, r.loading = m.admissions, 0
		L = min(L, len(a.pages))
	}
	if t := c.tiers; t != nil && !r0.noCache {
		L = c.tierExtend(rs, maxPages)
	}
	if c.state != nil {
		// The state groups resume only at a checkpoint (one the tiers
		// held included: state_tiers.go).
		L = c.state.admit(r0.id, r0.tokens, L)
		if c.tiers != nil && !r0.noCache {
			c.useHits(L)
		}
	}
	for g, m := range c.groups {
		r, a := rs[g], &c.adm[g]
		if len(a.pages) > L {
			// A shorter prefix than this group's cache serves: the pages
			// past it are idle again (tierExtend held them); match it
			// again for its last position.
			if c.tiers != nil && !r.noCache {
				m.cache.Recheck(a.pages[L:]...)
			}
			a.pages, a.last = m.cache.Match(a.pages[:0], r.key, r.tokens, L)
			if m.tiers != nil && !r.noCache {
				m.tierChainStart(r, a.pages)
			}
		}
		c.noteSources(g, a, L)
		m.admitPages(r, a, L-len(a.pages))
	}
	c.countReads(r0)
	return L * ps
}

// pinFor pins the prefix of tokens in ns that every group's cache holds
// (see HybridManager.Pin), for ttl (0: until Unpin): all or nothing, with
// the same pin ID in every group.
func (c *core) pinFor(ns Namespace, tokens []int32, ttl time.Duration) (id PinID, pinnedTokens int, err error) {
	if ttl < 0 {
		return 0, 0, fmt.Errorf("pagedkv: pin: %w: pin %d tokens for %v, want a lifetime >= 0", ErrBadArgument, len(tokens), ttl)
	}
	c.timed = c.timed || ttl > 0
	c.tick()
	ps := c.groups[0].pageSize
	if len(c.groups) == 1 {
		// One cache: its Pin is all or nothing by itself.
		m := c.groups[0]
		id, n, err := m.cache.PinFor(m.cache.Key(ns), tokens, ttl)
		if err != nil {
			return 0, 0, fmt.Errorf("pagedkv: pin: %w", err)
		}
		m.afterChange()
		return id, n * ps, nil
	}
	n := len(tokens) / ps
	for g, m := range c.groups {
		pages, _ := m.cache.Match(m.scratch[:0], m.cache.Key(ns), tokens, n)
		m.scratch = pages
		if len(pages) == 0 {
			return 0, 0, fmt.Errorf("pagedkv: pin: group %d (%v): %w: pin %d tokens: their first page of %d is not cached",
				g, m.layerGroup.Kind, ErrNotCached, len(tokens), ps)
		}
		n = len(pages)
	}
	prefix := tokens[:n*ps]
	for g, m := range c.groups {
		if _, err := m.cache.CheckPin(m.cache.Key(ns), prefix); err != nil {
			return 0, 0, fmt.Errorf("pagedkv: pin: group %d (%v): %w", g, m.layerGroup.Kind, err)
		}
	}
	// Every check passed, so no group fails; every pin goes through here,
	// so the groups' caches number their pins alike.
	for g, m := range c.groups {
		gid, k, err := m.cache.PinFor(m.cache.Key(ns), prefix, ttl)
		if err != nil || k != n || g > 0 && gid != id {
			panic(fmt.Sprintf("pagedkv: pin: group %d pinned %d of %d pages as pin %d (group 0: pin %d): %v", g, k, n, gid, id, err))
		}
		id = gid
		m.afterChange()
	}
	return id, n * ps, nil
}

// link points request id's record in each group at its record in the next
// group (request.sibling), after the groups made the records.
func (c *core) link(id RequestID) {
	for g, m := range c.groups {
		m.reqs[id].sibling = c.sibling(g, id)
	}
}

// sibling is request id's record in group g+1, nil after the last group.
func (c *core) sibling(g int, id RequestID) *request {
	if g+1 == len(c.groups) {
		return nil
	}
	return c.groups[g+1].reqs[id]
}

// audit checks every group (auditGroup; findings name the group when
// there are several), that every group holds the same requests with the
// same tokens, computed counts and states, pins the same prefixes and
// links each record to the next group's, and then the pool (auditPool).
func (c *core) audit() error {
	for g, m := range c.groups {
		if err := m.auditGroup(); err != nil {
			if len(c.groups) == 1 {
				return err
			}
			return fmt.Errorf("group %d (%v): %w", g, m.layerGroup.Kind, err)
		}
	}
	g0 := c.groups[0]
	for g, m := range c.groups {
		// Pin pins the same token prefixes in every group.
		if m.cache.Pinned() != g0.cache.Pinned() {
			return fmt.Errorf("%w: group %d has %d pinned pages, group 0 %d", errPool, g, m.cache.Pinned(), g0.cache.Pinned())
		}
		if len(m.reqs) != len(g0.reqs) {
			return fmt.Errorf("%w: group %d has %d requests, group 0 %d", errPool, g, len(m.reqs), len(g0.reqs))
		}
		for id, r := range m.reqs {
			r0 := g0.reqs[id]
			if r0 == nil || r0.computed != r.computed || r0.running != r.running || len(r0.tokens) != len(r.tokens) {
				return fmt.Errorf("%w: request %d differs between groups 0 and %d", errPool, id, g)
			}
			if want := c.sibling(g, id); r.sibling != want {
				return fmt.Errorf("%w: request %d of group %d is not linked to its record in group %d", errPool, id, g, g+1)
			}
		}
	}
	return c.auditPool()
}

// auditPool checks what spans the groups: the tiers (auditTiers), that no
// page is held by two groups, and that every page's reference count is
// exactly its holders: the running requests of every group, one per cache
// holding it, and one per tier copy in flight.
func (c *core) auditPool() error {
	held := make(map[PageID]int32)
	owner := make(map[PageID]int)
	own := func(p PageID, g int) error {
		if o, ok := owner[p]; ok && o != g {
			return fmt.Errorf("%w: page %d is held by groups %d and %d", errPool, p, o, g)
		}
		owner[p] = g
		held[p]++
		return nil
	}
	for g, m := range c.groups {
		for _, r := range m.reqs {
			if r.running {
				for _, p := range m.table.Pages(r.seq()) {
					if err := own(p, g); err != nil {
						return err
					}
				}
			}
		}
		for p := range PageID(c.alloc.NumPages()) {
			if m.cache.Cached(p) {
				if err := own(p, g); err != nil {
					return err
				}
			}
		}
	}
	if c.state != nil {
		if err := c.state.audit(own, len(c.groups), c.groups[0].reqs); err != nil {
			return err
		}
	}
	if err := c.auditTiers(held); err != nil {
		return err
	}
	for p := range PageID(c.alloc.NumPages()) {
		if rc := c.alloc.RefCount(p); rc != held[p] {
			return fmt.Errorf("%w: page %d has refcount %d, but the requests, caches and tier copies hold it %d times", errPool, p, rc, held[p])
		}
	}
	return nil
}

// errPool is the class of the pool-wide Audit's findings.
var errPool = errors.New("pagedkv: pool")
