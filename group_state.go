package pagedkv

import (
	"fmt"
	"sync/atomic"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
)

// State groups (layergroup.State) of a HybridManager, and their prefix
// checkpoints; docs/state-groups.md is the contract.
//
// A request's state is one slot: one page of the pool per state group
// (layergroup's state.go: a state is one page). The slot is either
// writable (held by the request alone; the step's kernels update it in
// place) or frozen (shared read-only with a checkpoint or a fork sibling):
// the next step that includes the request gives it a fresh slot and plans a
// copy from the frozen one first (copy-on-write, as a shared partial page).
//
// A checkpoint is a frozen slot published under the prefix whose state it
// holds: at the commit of a step that ends exactly at a checkpoint
// boundary (nextBoundary), the request's slot becomes the checkpoint's and
// the request keeps reading it, frozen. A later admission whose prefix
// every attention group serves for L pages is cut to the deepest
// checkpoint at k <= L pages of the same tokens (a hybrid hit lands only
// where every group resumes exactly), and starts on that slot, frozen.
//
// References: every page of a slot has one reference per holder: the
// request whose slot it is (writable or frozen), the checkpoint publishing
// it, and, during a step, the request's previous frozen slot (old), read by
// the step's copy and released at commit.
type stateSet struct {
	at    []int // HybridConfig.Groups index of each state group
	n     int   // state groups: pages per slot
	ps    int
	every int // checkpoint interval in tokens (0: prompt ends only)
	alloc *allocator.Allocator
	hash  prefixcache.Hasher
	tiers *stateTiers      // checkpoints below the device (state_tiers.go); nil without tiers
	ev    []StateEventSink // per state group, nil without KV events (group_state_events.go)

	reqs  map[RequestID]*stateReq
	spare []*stateReq
	ckpts map[ckptKey]*checkpoint
	free  []*checkpoint // evicted checkpoints, reused with their slot buffers
	idle  int           // checkpoints no request reads (evictable)
	tick  uint64        // admissions: the checkpoints' recency clock
	seq   uint64        // checkpoints published

	// The step in progress.
	pending bool
	batch   []*stateReq
	lead    []*request // group 0's records of the batch (computed, tokens)
	old     []PageID   // per batch member, n pages: the frozen slot copied from (noStatePage: none)
	changed []bool     // per batch member: apply gave it a fresh slot
	fresh   []PageID   // scratch for allocations
	copies  []CopyOp   // the step's state copies, group-major
	plans   []Plan     // one per state group
	idx     []int32    // StateIndices of every group, group-major

	// Counters (GroupStats; read from any goroutine).
	published, evicted, copied atomic.Int64
	cached, evictable          atomic.Int64
}

// ckptKey names a prefix: the page-chain hash of its tokens in its
// namespace (prefixcache.Hasher, the hashes KV events carry) and its length.
type ckptKey struct {
	hash   uint64
	tokens int
}

// checkpoint is a published state slot.
type checkpoint struct {
	key     ckptKey
	slot    []PageID
	readers int       // requests whose frozen slot this is (and, while it loads, its load)
	lastUse uint64    // tick of its publication or last hit
	seq     uint64    // publication order (eviction's last tie-break)
	tier    *ckptTier // its identity below the device (with tiers)
}

// stateReq is a request's state record.
type stateReq struct {
	id        RequestID
	slot      []PageID // n pages, or empty: no state (not yet stepped, or preempted)
	frozen    bool     // slot is shared read-only: the next step copies it first
	from      *checkpoint
	noCache   bool
	lora      string // the namespace's LoRA adapter (KV events)
	root      uint64 // namespace hash (the chain's start)
	hashed    int    // pages hashed into chain
	chain     uint64
	promptEnd int // tokens given by Add and Extend (checkpoint boundaries lie in them)
	// junction is, when the attention groups matched more of the prompt at
	// admission than a checkpoint served, that match's end: the prefix is
	// shared with an earlier request, so the state there is checkpointed
	// for the next one (0: none).
	junction int
	// restored is the checkpoint boundary the request was last admitted
	// on (0: none); tests check it against their model.
	restored int
	// With tiers: the namespace's tier root, and the tier chain digest
	// after the first thashed pages (state_tiers.go).
	troot, tchain tier.Digest
	thashed       int
}

func newStateSet(at []int, ps, every int, alloc *allocator.Allocator, h prefixcache.Hasher) *stateSet {
	s := &stateSet{at: at, n: len(at), ps: ps, every: every, alloc: alloc, hash: h,
		reqs: make(map[RequestID]*stateReq), ckpts: make(map[ckptKey]*checkpoint), plans: make([]Plan, len(at))}
	for j := range s.plans {
		s.plans[j].WindowLeft = -1
	}
	return s
}

// ---- Per request ----

// add files request id's record, added with req (checked), before admit;
// root is the hash of its namespace (the lead group's Key), where its
// prefixes' hash chain starts.
func (s *stateSet) add(id RequestID, req Request, root uint64) {
	var r *stateReq
	if k := len(s.spare); k > 0 {
		r, s.spare = s.spare[k-1], s.spare[:k-1]
		*r = stateReq{slot: r.slot[:0]}
	} else {
		r = &stateReq{slot: make([]PageID, 0, s.n)}
	}
	r.id, r.noCache, r.promptEnd, r.lora = id, req.NoCache, len(req.Prompt), req.Namespace.LoRA
	if !r.noCache {
		r.root = root
		r.chain = r.root
		if s.tiers != nil {
			ns := req.Namespace
			r.troot = tier.NamespaceRoot(ns.Tenant, ns.LoRA, ns.Salt)
			r.tchain = r.troot
		}
	}
	s.reqs[id] = r
}

// admit cuts L, the pages every attention group serves for request id
// with tokens, to the deepest checkpoint of the same prefix at <= L pages,
// gives the request that checkpoint's slot (frozen), and returns the cut.
func (s *stateSet) admit(id RequestID, tokens []int32, L int) int {
	r := s.reqs[id]
	s.tick++
	r.restored, r.junction = 0, 0
	if r.noCache || L == 0 {
		return 0
	}
	r.junction = L * s.ps
	var best *checkpoint
	if st := s.tiers; st != nil && st.tk > 0 {
		// The tiers hold a checkpoint deeper than any on the device
		// (tierProbe), and the admission's budget kept room for it.
		if st.tk == L {
			best = s.onload(r, tokens, L)
		} else {
			s.tierDrop()
		}
	}
	if best == nil {
		h := r.root
		for k := 1; k <= L; k++ {
			h = s.hash.Page(h, tokens[(k-1)*s.ps:k*s.ps])
			if c, ok := s.ckpts[ckptKey{h, k * s.ps}]; ok {
				best = c
			}
		}
	}
	if best == nil {
		return 0
	}
	if best.key.tokens == r.junction {
		r.junction = 0
	}
	r.hashed, r.chain = best.key.tokens/s.ps, best.key.hash
	s.take(r, best)
	r.restored = best.key.tokens
	best.lastUse = s.tick
	return best.key.tokens / s.ps
}

// take gives r (without a slot) checkpoint c's slot, frozen.
func (s *stateSet) take(r *stateReq, c *checkpoint) {
	r.slot = append(r.slot[:0], c.slot...)
	s.retain(r.slot)
	r.frozen, r.from = true, c
	s.read(c, +1)
}

// read counts a reader in or out of c, keeping the idle count.
func (s *stateSet) read(c *checkpoint, d int) {
	if c.readers == 0 {
		s.idle--
	}
	c.readers += d
	if c.readers == 0 {
		s.idle++
	}
	s.evictable.Store(int64(s.idle))
}

// drop releases r's slot (its state is lost).
func (s *stateSet) drop(r *stateReq) {
	if len(r.slot) > 0 {
		s.unref(r.slot)
	}
	if r.from != nil {
		s.read(r.from, -1)
	}
	r.slot, r.frozen, r.from = r.slot[:0], false, nil
	r.hashed, r.chain = 0, r.root
}

// fork gives child parent's state: both read parent's slot, frozen, so each
// copies it before its next step writes.
func (s *stateSet) fork(parent, child RequestID) {
	p := s.reqs[parent]
	c := &stateReq{slot: make([]PageID, 0, s.n)}
	if k := len(s.spare); k > 0 {
		c, s.spare = s.spare[k-1], s.spare[:k-1]
	}
	slot := c.slot[:0]
	*c = *p
	c.id, c.slot = child, append(slot, p.slot...)
	if len(p.slot) > 0 {
		p.frozen, c.frozen = true, true
		s.retain(c.slot)
		if p.from != nil {
			s.read(p.from, +1)
		}
	}
	s.reqs[child] = c
}

func (s *stateSet) release(id RequestID) {
	r := s.reqs[id]
	s.drop(r)
	delete(s.reqs, id)
	s.spare = append(s.spare, r)
}

func (s *stateSet) preempt(id RequestID) { s.drop(s.reqs[id]) }

// extend moves request id's prompt end to its known tokens.
func (s *stateSet) extend(id RequestID, known int) { s.reqs[id].promptEnd = known }

// checkTruncate refuses to take a request's state back before its computed
// tokens: a recurrent state cannot be rewound.
func (s *stateSet) checkTruncate(id RequestID, n, computed int, running bool) error {
	if running && n < computed {
		return fmt.Errorf("%w: truncate request %d to %d tokens: a state group's recurrent state cannot return before its %d computed tokens",
			ErrBadArgument, id, n, computed)
	}
	return nil
}

func (s *stateSet) truncate(id RequestID, n int) {
	r := s.reqs[id]
	r.promptEnd = min(r.promptEnd, n)
	if r.junction > n {
		r.junction = 0
	}
	if r.hashed*s.ps > n {
		r.hashed, r.chain = 0, r.root
	}
	if r.thashed*s.ps > n {
		r.thashed, r.tchain = 0, r.troot
	}
}

// boundary reports whether request r keeps a checkpoint after its first b
// tokens: b is a page boundary in its prompt (the tokens Add and Extend
// gave) and either a multiple of the interval, the prompt's last whole
// page, the one before it when the prompt ends on a page boundary (the
// deepest an identical prompt can hit: Add leaves a token to compute), or
// the junction where its admission's attention match ended.
func (s *stateSet) boundary(r *stateReq, b int) bool {
	promptEnd := r.promptEnd
	if b <= 0 || b%s.ps != 0 || b > promptEnd {
		return false
	}
	if b == r.junction {
		return true
	}
	if s.every > 0 && b%s.every == 0 {
		return true
	}
	return b == promptEnd/s.ps*s.ps || b == (promptEnd-1)/s.ps*s.ps
}

// nextBoundary is the first checkpoint boundary after computed tokens, or 0.
func (s *stateSet) nextBoundary(id RequestID, computed int) int {
	r := s.reqs[id]
	if r.noCache {
		return 0
	}
	for b := (computed/s.ps + 1) * s.ps; b <= r.promptEnd; b += s.ps {
		if s.boundary(r, b) {
			return b
		}
	}
	return 0
}

// ---- Per step ----

// prepare counts the pages the step's state slots need: a fresh slot for
// every member whose slot is not writable. lead are group 0's records.
func (s *stateSet) prepare(lead []*request) (need int) {
	s.batch, s.lead = s.batch[:0], append(s.lead[:0], lead...)
	for _, l := range lead {
		r := s.reqs[l.id]
		s.batch = append(s.batch, r)
		if len(r.slot) == 0 || r.frozen {
			need += s.n
		}
	}
	return need
}

// apply gives every member a writable slot (the pages were budgeted by
// prepare), plans the copies from frozen slots, and fills each state
// group's Plan. lp is group 0's plan, whose token arrays it shares.
func (s *stateSet) apply(lp *Plan) {
	B := len(s.batch)
	s.old = grow(s.old, B*s.n)
	s.idx = grow(s.idx, B*s.n)
	s.copies = s.copies[:0]
	s.changed = grow(s.changed, B)
	for b, r := range s.batch {
		s.changed[b] = false
		old := s.old[b*s.n : (b+1)*s.n]
		for j := range old {
			old[j] = noStatePage
		}
		if len(r.slot) > 0 && !r.frozen {
			continue
		}
		fresh := grow(s.fresh, s.n)
		s.fresh = fresh
		if err := s.alloc.Alloc(fresh); err != nil {
			panic(fmt.Sprintf("pagedkv: state slot of request %d: %v (the step's budget counted it)", r.id, err))
		}
		if len(r.slot) > 0 {
			copy(old, r.slot)
		}
		r.slot = append(r.slot[:0], fresh...)
		r.frozen, s.changed[b] = false, true
	}
	// Copies group-major, so each group's Plan.Copies is a run.
	for j := range s.plans {
		start := len(s.copies)
		for b, r := range s.batch {
			if src := s.old[b*s.n+j]; src != noStatePage {
				s.copies = append(s.copies, CopyOp{Src: src, Dst: r.slot[j], Entries: int32(s.ps)})
			}
			s.idx[j*B+b] = int32(r.slot[j])
		}
		p := &s.plans[j]
		p.Requests, p.QOIndptr, p.TokenIDs, p.TokenPositions = lp.Requests, lp.QOIndptr, lp.TokenIDs, lp.TokenPositions
		p.Drafts = lp.Drafts
		p.Copies = s.copies[start:len(s.copies):len(s.copies)]
		p.StateIndices = s.idx[j*B : (j+1)*B : (j+1)*B]
	}
	s.copied.Add(int64(len(s.copies)))
	s.pending = true
}

// commit ends the step: the frozen slots copied from are released, and a
// member whose step ended on a checkpoint boundary publishes its slot.
func (s *stateSet) commit() {
	for b, r := range s.batch {
		old := s.old[b*s.n : (b+1)*s.n]
		if old[0] != noStatePage {
			s.unref(old)
			if r.from != nil {
				s.read(r.from, -1)
				r.from = nil
			}
		}
		l := s.lead[b]
		if !r.noCache && s.boundary(r, l.computed) {
			s.publish(r, l.tokens[:l.computed])
		}
	}
	s.pending = false
}

// abort undoes apply: fresh slots are freed, the frozen ones restored.
func (s *stateSet) abort() {
	for b, r := range s.batch {
		if !s.changed[b] {
			continue
		}
		s.unref(r.slot)
		old := s.old[b*s.n : (b+1)*s.n]
		r.slot = r.slot[:0]
		if old[0] != noStatePage {
			r.slot, r.frozen = append(r.slot, old...), true
		}
	}
	s.copied.Add(-int64(len(s.copies)))
	s.pending = false
}

// publish makes r's writable slot, holding the state after tokens, the
// checkpoint of that prefix (unless one exists), and freezes r on it.
func (s *stateSet) publish(r *stateReq, tokens []int32) {
	k := len(tokens) / s.ps
	if r.hashed > k {
		r.hashed, r.chain = 0, r.root
	}
	parentHash, ran := r.chain, r.hashed < k // the chain hash before the last page, when hashed here
	for ; r.hashed < k; r.hashed++ {
		parentHash = r.chain
		r.chain = s.hash.Page(r.chain, tokens[r.hashed*s.ps:(r.hashed+1)*s.ps])
	}
	key := ckptKey{r.chain, len(tokens)}
	if c, ok := s.ckpts[key]; ok {
		c.lastUse = s.tick
		return
	}
	c := s.newCheckpoint(key, r.slot)
	r.frozen, r.from = true, c
	s.read(c, +1)
	s.published.Add(1)
	if (s.tiers != nil || s.ev != nil) && !ran {
		parentHash = s.parentHash(r, tokens)
	}
	if s.ev != nil {
		s.announceCheckpoint(c, r, tokens, parentHash, k > 1)
	}
	if s.tiers != nil {
		s.nameCkpt(c, r, tokens, parentHash, r.lora)
		if s.tiers.t.writeThrough {
			s.writeThrough(c)
		}
	}
}

// newCheckpoint publishes slot (its pages gain the checkpoint's
// references) as the idle checkpoint of key.
func (s *stateSet) newCheckpoint(key ckptKey, slot []PageID) *checkpoint {
	var c *checkpoint
	if n := len(s.free); n > 0 {
		c, s.free = s.free[n-1], s.free[:n-1]
	} else {
		c = &checkpoint{slot: make([]PageID, 0, s.n)}
	}
	s.seq++
	c.key, c.slot, c.readers, c.lastUse, c.seq = key, append(c.slot[:0], slot...), 0, s.tick, s.seq
	s.retain(c.slot)
	s.ckpts[key] = c
	s.idle++
	s.evictable.Store(int64(s.idle))
	s.cached.Store(int64(len(s.ckpts)))
	return c
}

// evictOne evicts the idle checkpoint of least utility and returns the
// pages it freed (0 when none is idle). Utility is Marconi's FLOPs saved
// per byte held: every checkpoint holds the same bytes (one slot) and a
// recurrent layer's FLOPs grow linearly with the tokens it skips, so the
// saving is proportional to the checkpoint's tokens; it is discounted by
// recency, the admissions since its publication or last hit. The victim
// minimises tokens / (1 + age), then tokens, then publication order (the
// oldest first). O(checkpoints).
func (s *stateSet) evictOne() int {
	var victim *checkpoint
	var vu float64
	for _, c := range s.ckpts {
		if c.readers > 0 {
			continue
		}
		u := float64(c.key.tokens) / float64(1+s.tick-c.lastUse)
		if victim == nil || u < vu || u == vu && (c.key.tokens < victim.key.tokens || c.key.tokens == victim.key.tokens && c.seq < victim.seq) {
			victim, vu = c, u
		}
	}
	if victim == nil {
		return 0
	}
	delete(s.ckpts, victim.key)
	if s.ev != nil {
		s.announceEvicted(victim)
	}
	s.idle--
	freed := s.evictPages(victim)
	s.free = append(s.free, victim)
	s.evicted.Add(1)
	s.cached.Store(int64(len(s.ckpts)))
	s.evictable.Store(int64(s.idle))
	return freed
}

// idlePages are the pages of idle checkpoints.
func (s *stateSet) idlePages() int { return s.idle * s.n }

func (s *stateSet) retain(p []PageID) {
	if err := s.alloc.Retain(p...); err != nil {
		panic(fmt.Sprintf("pagedkv: retaining state slot %v: %v", p, err))
	}
}

func (s *stateSet) unref(p []PageID) int {
	freed, err := s.alloc.Release(p...)
	if err != nil {
		panic(fmt.Sprintf("pagedkv: releasing state slot %v: %v", p, err))
	}
	return freed
}

// noStatePage marks no page in a state slot list.
const noStatePage = ^PageID(0)

// grow returns buf resized to n, reallocating only when too small.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n, 2*n)
	}
	return buf[:n]
}

// ---- Audit ----

// audit checks the state records and checkpoints, and counts their page
// references through own (the pool audit compares the counts with the
// allocator's): a writable slot has one holder, its request; every reader
// count is the frozen requests on the checkpoint; the idle count matches.
func (s *stateSet) audit(own func(p PageID, owner int) error, owner int, reqs map[RequestID]*request) error {
	readers := make(map[*checkpoint]int)
	for id, r := range s.reqs {
		l, ok := reqs[id]
		if !ok {
			return fmt.Errorf("%w: state record of request %d, unknown to group 0", errPool, id)
		}
		if len(r.slot) != 0 && len(r.slot) != s.n {
			return fmt.Errorf("%w: request %d has a state slot of %d pages, want %d", errPool, id, len(r.slot), s.n)
		}
		if l.computed > 0 && l.running && len(r.slot) == 0 {
			return fmt.Errorf("%w: request %d computed %d tokens but holds no state slot", errPool, id, l.computed)
		}
		if !l.running && len(r.slot) != 0 {
			return fmt.Errorf("%w: preempted request %d holds state slot %v", errPool, id, r.slot)
		}
		if r.from != nil {
			if s.ckpts[r.from.key] != r.from || !s.pending && (!r.frozen || r.slot[0] != r.from.slot[0]) {
				return fmt.Errorf("%w: request %d reads a checkpoint that is not its frozen slot", errPool, id)
			}
			readers[r.from]++
		}
		for _, p := range r.slot {
			if err := own(p, owner); err != nil {
				return err
			}
			if !r.frozen && s.alloc.RefCount(p) != 1 {
				return fmt.Errorf("%w: request %d's writable state page %d has refcount %d, want 1 (one live owner)", errPool, id, p, s.alloc.RefCount(p))
			}
		}
	}
	idle := 0
	for k, c := range s.ckpts {
		if c.key != k || k.tokens <= 0 || k.tokens%s.ps != 0 || len(c.slot) != s.n {
			return fmt.Errorf("%w: checkpoint %+v is malformed (slot %v)", errPool, k, c.slot)
		}
		if c.tier != nil && c.tier.loading+c.tier.offloading > 0 {
			readers[c]++ // its tier copies' hold
		}
		if c.readers != readers[c] {
			return fmt.Errorf("%w: checkpoint of %d tokens counts %d readers, %d requests read it", errPool, k.tokens, c.readers, readers[c])
		}
		if c.readers == 0 {
			idle++
		}
		for _, p := range c.slot {
			if err := own(p, owner); err != nil {
				return err
			}
		}
	}
	if idle != s.idle {
		return fmt.Errorf("%w: %d idle checkpoints, counted %d", errPool, idle, s.idle)
	}
	if s.pending {
		for b := range s.batch {
			for _, p := range s.old[b*s.n : (b+1)*s.n] {
				if p != noStatePage {
					if err := own(p, owner); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// stateGroupStats is state group j's GroupStats: its checkpoints (one page
// each in every state group) and copies.
func (s *stateSet) groupStats() GroupStats {
	gs := GroupStats{Kind: layergroup.State, CachedPages: int(s.cached.Load()), EvictablePages: int(s.evictable.Load()),
		PublishedPages: s.published.Load(), EvictedPages: s.evicted.Load(), CopiedPages: s.copied.Load() / int64(s.n)}
	if st := s.tiers; st != nil {
		gs.HostHitTokens, gs.RemoteHitTokens = st.hostHitTokens.Load(), st.remoteHitTokens.Load()
		gs.OffloadedPages, gs.OnloadedPages = st.offloaded.Load()/int64(s.n), st.onloaded.Load()/int64(s.n)
	}
	return gs
}

// checkDrafts refuses speculative steps: a state group would need a state
// per draft position to roll back rejected drafts, which it does not keep.
func (s *stateSet) checkDrafts(drafts [][]int32) error {
	for b, d := range drafts {
		if len(d) > 0 {
			return fmt.Errorf("%w: reserve: drafts[%d] has %d tokens, but a model with state groups cannot roll its recurrent state back: reserve without drafts",
				ErrBadArgument, b, len(d))
		}
	}
	return nil
}

// placeStatePlans puts every group's Plan at its HybridConfig.Groups index
// in p: the attention groups' and the state groups'.
func (c *core) placeStatePlans(p *HybridPlan) {
	for g, m := range c.groups {
		p.Groups[c.attnAt[g]] = &m.plan
	}
	c.state.apply(&c.groups[0].plan)
	for j, at := range c.state.at {
		p.Groups[at] = &c.state.plans[j]
	}
}

// splitStateGroups returns, for cfg's groups, the indexes of the attention
// groups and of the state groups (nil when there are none, and then
// attnAt is nil too), refusing what state groups do not support yet.
func splitStateGroups(cfg *HybridConfig) (attnAt, stateAt []int, err error) {
	for g, s := range cfg.Groups {
		if s.Kind == layergroup.State {
			stateAt = append(stateAt, g)
		} else {
			attnAt = append(attnAt, g)
		}
	}
	every := cfg.StateCheckpointEvery
	if stateAt == nil {
		if every != 0 {
			return nil, nil, fmt.Errorf("%w: StateCheckpointEvery = %d without state groups, want 0", ErrBadConfig, every)
		}
		return nil, nil, nil
	}
	switch {
	case every < 0 || every > MaxRequestTokens || every%cfg.PageSize != 0:
		return nil, nil, fmt.Errorf("%w: StateCheckpointEvery = %d, want 0 or a multiple of PageSize = %d up to %d",
			ErrBadConfig, every, cfg.PageSize, MaxRequestTokens)
	}
	return attnAt, stateAt, nil
}

// withStates gives c the state groups at stateAt of the configured groups
// all (c.groups are those at attnAt).
func (c *core) withStates(all []LayerGroup, attnAt, stateAt []int, every int, hash prefixcache.HashFunc) {
	c.attnAt = attnAt
	c.plan.Groups = make([]*Plan, len(all))
	c.state = newStateSet(stateAt, c.pageSize(), every, c.alloc, prefixcache.NewHasher(c.groups[0].cache.Seed(), hash))
	c.specs = all
}

// numGroups is the number of configured groups.
func (c *core) numGroups() int { return len(c.groups) + c.numStates() }

func (c *core) numStates() int {
	if c.state == nil {
		return 0
	}
	return c.state.n
}

// groupSpec is configured group g's spec.
func (c *core) groupSpec(g int) LayerGroup {
	if c.state == nil {
		return c.groups[g].layerGroup
	}
	return c.specs[g]
}

// attnIndex is configured group g's index in c.groups (g an attention
// group).
func (c *core) attnIndex(g int) int {
	for i, at := range c.attnAt {
		if at == g {
			return i
		}
	}
	panic(fmt.Sprintf("pagedkv: group %d is not an attention group", g))
}

// index is configured group g's index among the state groups, or -1.
func (s *stateSet) index(g int) int {
	for j, at := range s.at {
		if at == g {
			return j
		}
	}
	return -1
}

// groupPages is configured group g's pages of request id: for a state
// group, the request's state slot page in it (none without a state), and
// its computed tokens as start (the state holds them all).
func (c *core) groupPages(g int, id RequestID) (pages []PageID, start int) {
	if c.state == nil {
		return c.groups[g].pages(id)
	}
	if j := c.state.index(g); j >= 0 {
		r, ok := c.state.reqs[id]
		if !ok || len(r.slot) == 0 {
			return nil, c.computed(id)
		}
		return r.slot[j : j+1 : j+1], c.computed(id)
	}
	return c.groups[c.attnIndex(g)].pages(id)
}

// NextStateCheckpoint returns the token count at which request id's state
// is next checkpointed (the first checkpoint boundary after its computed
// tokens), or 0 when no boundary remains or the model has no state groups.
// A checkpoint is taken only at the commit of a step that ends exactly
// there, so an engine ends a prefill chunk at it: a request with c computed
// tokens reserves at most NextStateCheckpoint-c tokens when it is not 0 (as
// vLLM's scheduler aligns Mamba chunks to blocks).
func (h *HybridManager) NextStateCheckpoint(id RequestID) int {
	if h.core.state == nil || !h.core.has(id) {
		return 0
	}
	return h.core.state.nextBoundary(id, h.core.computed(id))
}
