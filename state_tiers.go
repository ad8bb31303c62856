package pagedkv

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/pagedkv/pagedkv/tier"
)

// State checkpoints through the tiers (docs/state-groups.md, "Tiers"): a
// checkpoint's page in state group j is a page like an attention page
// below the device (the same tier copies, host pages, values and
// verification), named by a digest of its own:
//
//	e(-1) = the namespace's root (tier.NamespaceRoot)
//	e(i)  = tier.Next(e(i-1), tokens of page i)
//	P_j   = SHA-256("pagedkv/tier/state/v1" ‖ e(k-2) ‖ state group j's tag)
//	D_j   = tier.Next(P_j, tokens of page k-1)
//
// for the checkpoint of the first k pages: P_j is the value's parent,
// page k-1's tokens its tokens and D_j its digest, so a tier verifies it
// as any page (parent, tokens, digest = Next(parent, tokens)), and the
// state domain and the group's tag (its index and state shape) keep it
// apart from every attention page and every other state group. Its
// values carry flags bit 0x04 (RemotePage.State).
//
// An evicted checkpoint's pages are offloaded (with Tiers, when the host
// tier takes them; written through at publication with WriteThrough or a
// remote store), and an admission whose attention match (device and
// tiers) reaches a boundary whose checkpoint the host tier or the remote
// store holds onloads it into a fresh slot: a checkpoint again, loading
// until its copies complete (a request on it takes no step meanwhile).

// ckptTier is a checkpoint's identity below the device (with tiers).
type ckptTier struct {
	dig, par   []tier.Digest // per state group: D_j and P_j
	last       []int32       // tokens of the checkpoint's last page
	parentHash uint64        // the chain hash before the last page (KV events' name)
	root       bool          // one page deep
	lora       string
	// Tier copies in flight of its slot: onloads (a request on it waits)
	// and write-through offloads; while there are any, the checkpoint
	// holds a reader (it is not evictable: its pages would not free).
	loading, offloading int
}

// hold counts a tier copy of c's slot in (+1) or out (-1): the checkpoint
// holds one reader while any is in flight.
func (s *stateSet) hold(c *checkpoint, onload bool, d int) {
	ct := c.tier
	before := ct.loading + ct.offloading
	if onload {
		if ct.loading == 0 && d > 0 {
			s.tiers.nLoading++
		}
		ct.loading += d
		if ct.loading == 0 {
			s.tiers.nLoading--
		}
	} else {
		ct.offloading += d
	}
	switch after := ct.loading + ct.offloading; {
	case before == 0 && after > 0:
		s.read(c, +1)
	case before > 0 && after == 0:
		s.read(c, -1)
	}
}

// stateTiers is the state set's part of the tiers.
type stateTiers struct {
	t    *tiers
	tags []string // per state group: its identity in digests
	// The admission's tier candidate: the checkpoint of tk pages, whose
	// pages held are host pages acquired as readers (0: none).
	tk        int
	held      []HostPageID
	heldDig   []tier.Digest
	heldPar   []tier.Digest
	heldMedia tier.Medium
	hs        []uint64      // scratch: chain hashes after k pages
	es        []tier.Digest // scratch: tier chain digests after k pages
	nLoading  int           // checkpoints with onloads in flight

	// Counters of the state groups' tier traffic (per group: every state
	// group moves one page per checkpoint); read from any goroutine.
	hostHitTokens, remoteHitTokens, offloaded, onloaded atomic.Int64
}

// stateTierTag is state group g's identity in digests: its index, kind,
// layer count and state shape, so no other group (nor a replica with
// another shape) reads its pages.
func stateTierTag(g int, s LayerGroup) string {
	st := s.State
	return fmt.Sprintf("g%d:%v:l%d:conv%v/%v:ssm%v/%v:p%d", g, s.Kind, s.NumLayers, st.ConvShape, st.ConvDType, st.SSMShape, st.SSMDType, st.PageBytes)
}

// withStateTiers gives the state set the tiers t (not nil).
func (c *core) withStateTiers(t *tiers) {
	s := c.state
	s.tiers = &stateTiers{t: t}
	for _, at := range s.at {
		s.tiers.tags = append(s.tiers.tags, stateTierTag(at, c.specs[at]))
	}
	t.state = s
}

// stateParent is P_j for the checkpoint whose prefix before its last page
// has tier chain digest e.
func (st *stateTiers) stateParent(e tier.Digest, j int) tier.Digest {
	return tier.StateParent(e, st.tags[j])
}

// names fills dig and par with the checkpoint's D_j and P_j, after a
// prefix (of all but its last page last) with tier chain digest e.
func (st *stateTiers) names(dig, par []tier.Digest, e tier.Digest, last []int32) {
	for j := range dig {
		par[j] = st.stateParent(e, j)
		dig[j] = tier.Next(st.t.buf[:0], par[j], last)
	}
}

// tierChain advances r's tier chain digest to its first k pages of tokens
// (from the root when it was past them) and returns it.
func (s *stateSet) tierChain(r *stateReq, tokens []int32, k int) tier.Digest {
	if r.thashed > k {
		r.thashed, r.tchain = 0, r.troot
	}
	for ; r.thashed < k; r.thashed++ {
		r.tchain = tier.Next(s.tiers.t.buf[:0], r.tchain, tokens[r.thashed*s.ps:(r.thashed+1)*s.ps])
	}
	return r.tchain
}

// nameCkpt gives checkpoint c of r's prefix tokens its identity below
// the device; parentHash is the chain hash before its last page.
func (s *stateSet) nameCkpt(c *checkpoint, r *stateReq, tokens []int32, parentHash uint64, lora string) {
	k := len(tokens) / s.ps
	ct := s.ckptTier(c)
	ct.last = append(ct.last[:0], tokens[(k-1)*s.ps:]...)
	ct.parentHash, ct.root, ct.lora = parentHash, k == 1, lora
	s.tiers.names(ct.dig, ct.par, s.tierChain(r, tokens, k-1), ct.last)
}

// ckptTier returns c's tier identity, sized for the state groups.
func (s *stateSet) ckptTier(c *checkpoint) *ckptTier {
	if c.tier == nil {
		c.tier = &ckptTier{dig: make([]tier.Digest, s.n), par: make([]tier.Digest, s.n)}
	}
	return c.tier
}

// hostName is the host tier's name of c's page in a state group.
func (c *checkpoint) hostName() hostName {
	ct := c.tier
	return hostName{hash: c.key.hash, parentHash: ct.parentHash, root: ct.root, lora: ct.lora, state: true}
}

// writeThrough plans the offload of checkpoint c's pages the host tier
// does not hold yet (TierConfig.WriteThrough, or a remote store): the
// device pages stay the checkpoint's, each copy holds a reference.
func (s *stateSet) writeThrough(c *checkpoint) {
	t := s.tiers.t
	for j, p := range c.slot {
		d := c.tier.dig[j]
		if t.host.Has(d) {
			continue
		}
		h, ok := t.claimFor(d, c.tier.par[j], c.tier.last, d, c.hostName())
		if !ok {
			continue
		}
		s.retain([]PageID{p})
		sl := t.plan(nil, tier.ToHost, p, h, nil, 0, false) // may grow t.copies: index it after
		t.copies[sl].ckpt = c
		s.hold(c, false, +1)
	}
}

// evictPages releases evicted checkpoint c's slot and returns the pages
// freed: with tiers, a page only the checkpoint held that the host tier
// does not back is offloaded when evicting with offload (its reference
// becomes the copy's, and it counts as freed), else dropped and counted.
func (s *stateSet) evictPages(c *checkpoint) int {
	if s.tiers == nil || c.tier == nil {
		return s.unref(c.slot)
	}
	t := s.tiers.t
	offloaded := 0
	rel := s.fresh[:0]
	for j, p := range c.slot {
		d := c.tier.dig[j]
		if s.alloc.RefCount(p) != 1 || t.host.Has(d) {
			rel = append(rel, p)
			continue
		}
		if t.offloading {
			if h, ok := t.claimFor(d, c.tier.par[j], c.tier.last, d, c.hostName()); ok {
				// The checkpoint's reference becomes the copy's.
				t.plan(nil, tier.ToHost, p, h, nil, 0, true)
				t.evicting++
				offloaded++
				continue
			}
		}
		t.c.DroppedPages++
		rel = append(rel, p)
	}
	s.fresh = rel
	return s.unref(rel) + offloaded
}

// tierProbe looks, for request id admitted with tokens on L pages every
// attention group serves (device and tiers), for a checkpoint deeper than
// every device checkpoint of the prefix, at k <= L pages, that the host
// tier holds in every state group, else (with a remote store) for one at
// the request's own checkpoint boundaries there, fetched into host pages.
// It holds the host pages as readers and returns k (0: none).
func (s *stateSet) tierProbe(id RequestID, tokens []int32, L int) int {
	st, r := s.tiers, s.reqs[id]
	st.tk, st.held = 0, st.held[:0]
	if r.noCache || L == 0 {
		return 0
	}
	st.hs, st.es = grow(st.hs, L+1), grow(st.es, L+1)
	st.hs[0], st.es[0] = r.root, r.troot
	for k := 1; k <= L; k++ {
		page := tokens[(k-1)*s.ps : k*s.ps]
		st.hs[k] = s.hash.Page(st.hs[k-1], page)
		st.es[k] = tier.Next(st.t.buf[:0], st.es[k-1], page)
	}
	kd := 0 // the deepest device checkpoint
	for k := L; k >= 1 && kd == 0; k-- {
		if _, ok := s.ckpts[ckptKey{st.hs[k], k * s.ps}]; ok {
			kd = k
		}
	}
	st.heldDig, st.heldPar = grow(st.heldDig, s.n), grow(st.heldPar, s.n)
	for k := L; k > kd; k-- {
		if s.hostFind(k, tokens) {
			st.tk, st.heldMedia = k, tier.Host
			return k
		}
	}
	if st.t.remote == nil {
		return 0
	}
	tries := 0
	for k := L; k > kd && tries < maxStateFetches; k-- {
		if !s.boundary(r, k*s.ps) {
			continue
		}
		tries++
		if s.fetch(k, tokens) {
			st.tk = k
			return k
		}
	}
	return 0
}

// maxStateFetches bounds the remote lookups of one admission's state.
const maxStateFetches = 2

// hostFind acquires the host pages of the checkpoint of k pages in every
// state group, or none.
func (s *stateSet) hostFind(k int, tokens []int32) bool {
	st := s.tiers
	last := tokens[(k-1)*s.ps : k*s.ps]
	for j := range s.n {
		st.heldPar[j] = st.stateParent(st.es[k-1], j)
		st.heldDig[j] = tier.Next(st.t.buf[:0], st.heldPar[j], last)
		h, ok := st.t.host.Lookup(st.heldDig[j], st.heldPar[j], last)
		if ok {
			if err := st.t.host.Acquire(h); err != nil {
				panic(fmt.Sprintf("pagedkv: acquiring host page %d for a state onload: %v", h, err))
			}
			st.held = append(st.held, h)
			continue
		}
		s.tierDrop()
		return false
	}
	return true
}

// fetch fetches the checkpoint of k pages from the remote store into
// claimed host pages, all state groups in one batch, and holds them; a
// checkpoint fetched in part is not used (the pages fetched stay).
func (s *stateSet) fetch(k int, tokens []int32) bool {
	st := s.tiers
	t := st.t
	last := tokens[(k-1)*s.ps : k*s.ps]
	t.claims, t.fetch = t.claims[:0], t.fetch[:0]
	name := hostName{hash: st.hs[k], parentHash: st.hs[k-1], root: k == 1, state: true}
	for j := range s.n {
		st.heldPar[j] = st.stateParent(st.es[k-1], j)
		st.heldDig[j] = tier.Next(t.buf[:0], st.heldPar[j], last)
		h, err := t.host.Claim(st.heldDig[j], st.heldPar[j], last)
		if err != nil {
			break
		}
		t.hostFirst[h] = st.heldDig[j]
		t.hostClaimed(h, name)
		t.claims = append(t.claims, h)
		t.fetch = append(t.fetch, tier.RemotePage{Digest: st.heldDig[j], Parent: st.heldPar[j], Chain: st.heldDig[j],
			Tokens: t.host.Tokens(h), Data: t.host.Page(h), State: true})
	}
	if len(t.claims) < s.n {
		for _, h := range t.claims {
			if err := t.host.Abandon(h); err != nil {
				panic(fmt.Sprintf("pagedkv: abandoning host page %d: %v", h, err))
			}
		}
		clear(t.fetch)
		return false
	}
	var media []tier.Medium
	st.held, media = t.fetchClaimed(st.held[:0], nil)
	if len(st.held) < s.n {
		s.tierDrop()
		return false
	}
	st.heldMedia = media[0]
	return true
}

// tierDrop releases the admission's held host pages.
func (s *stateSet) tierDrop() {
	st := s.tiers
	for _, h := range st.held {
		if err := st.t.host.Release(h); err != nil {
			panic(fmt.Sprintf("pagedkv: releasing host page %d: %v", h, err))
		}
	}
	st.held, st.tk = st.held[:0], 0
}

// onload makes the held tier candidate a checkpoint of r's first k pages
// of tokens on fresh pages (free: the admission's budget counted them),
// loading until the planned copies complete, and returns it.
func (s *stateSet) onload(r *stateReq, tokens []int32, k int) *checkpoint {
	st := s.tiers
	fresh := grow(s.fresh, s.n)
	s.fresh = fresh
	if err := s.alloc.Alloc(fresh); err != nil {
		panic(fmt.Sprintf("pagedkv: allocating a state slot for an onload: %v (the admission's budget counted it)", err))
	}
	c := s.newCheckpoint(ckptKey{st.hs[k], k * s.ps}, fresh) // the checkpoint's references
	ct := s.ckptTier(c)
	copy(ct.dig, st.heldDig)
	copy(ct.par, st.heldPar)
	ct.last = append(ct.last[:0], tokens[(k-1)*s.ps:k*s.ps]...)
	ct.parentHash, ct.root = st.hs[k-1], k == 1
	if s.ev != nil { // back on the device: announced as a publication is
		s.announceCheckpoint(c, r, tokens[:k*s.ps], ct.parentHash, k > 1)
	}
	for j, h := range st.held {
		// Alloc's reference and the host page's reader are the copy's.
		sl := st.t.plan(nil, tier.ToDevice, fresh[j], h, nil, 0, false) // may grow t.copies: index it after
		st.t.copies[sl].ckpt = c
		s.hold(c, true, +1)
	}
	tokensHit := int64(k * s.ps)
	if st.heldMedia == tier.Host {
		st.t.c.HostHitTokens += tokensHit * int64(s.n)
		st.hostHitTokens.Add(tokensHit)
	} else {
		st.t.c.RemoteHitTokens += tokensHit * int64(s.n)
		st.remoteHitTokens.Add(tokensHit)
	}
	st.held, st.tk = st.held[:0], 0
	// r's tier chain continues from the probe's.
	r.thashed, r.tchain = k-1, st.es[k-1]
	return c
}

// tierCopied records a tier copy of checkpoint c's slot (an onload, else a
// write-through offload) as complete.
func (s *stateSet) tierCopied(c *checkpoint, onload bool) { s.hold(c, onload, -1) }

// checkLoading refuses a step of requests reading a checkpoint whose
// onloads are in flight.
func (s *stateSet) checkLoading(ids []RequestID) error {
	if s.tiers == nil || s.tiers.nLoading == 0 {
		return nil
	}
	for i, id := range ids {
		if s.loadingReq(id) {
			return fmt.Errorf("%w: reserve: ids[%d] = %d reads a state checkpoint whose onload copies are in flight", ErrLoading, i, id)
		}
	}
	return nil
}

// loadingReq reports whether request id reads a loading checkpoint.
func (s *stateSet) loadingReq(id RequestID) bool {
	r, ok := s.reqs[id]
	return ok && s.tiers != nil && r.from != nil && r.from.tier != nil && r.from.tier.loading > 0
}

// fetchClaimed fetches t.fetch into the host pages t.claims (claimed for
// them) in one batch under the remote deadline: each fetched page becomes
// ready and is acquired (appended to hits, its medium to fetched), the
// rest are abandoned.
func (t *tiers) fetchClaimed(hits []HostPageID, fetched []tier.Medium) ([]HostPageID, []tier.Medium) {
	ctx, cancel := context.WithTimeout(context.Background(), t.deadline)
	t.media = append(t.media[:0], make([]tier.Medium, len(t.fetch))...)
	got := tier.FetchMedia(ctx, t.remote, t.fetch, t.media)
	cancel()
	got = max(0, min(got, len(t.claims)))
	fetched = append(fetched, t.media[:got]...)
	for i, h := range t.claims {
		var err error
		if i < got {
			if err = t.host.Written(h); err == nil {
				t.hostWritten(h)
				t.fetchedRetention(h, t.fetch[i].Retention)
				err = t.host.Acquire(h)
			}
			hits = append(hits, h)
		} else {
			err = t.host.Abandon(h)
		}
		if err != nil {
			panic(fmt.Sprintf("pagedkv: host page %d after a remote fetch: %v", h, err))
		}
	}
	t.c.RemoteFetched += int64(got)
	clear(t.fetch) // drop references to host memory
	return hits, fetched
}

// TierTag returns configured group g's identity in tier digests: an
// attention group's chains start from tier.GroupRoot(namespace root,
// TierTag(g)), a state group's checkpoint pages have parents
// tier.StateParent(e, TierTag(g)). A handoff sender names the group by it
// (handoff.Request.GroupTag), so the receiving HybridManager, with the
// same groups, finds the pages under its own digests.
func (h *HybridManager) TierTag(g int) string {
	c := h.core
	if c.state != nil {
		if c.state.index(g) >= 0 {
			return stateTierTag(g, c.specs[g])
		}
		return groupTierTag(c.attnIndex(g), c.specs[g])
	}
	return groupTierTag(g, c.groups[g].layerGroup)
}

// StateCheckpoint returns the deepest state checkpoint on the device of a
// prefix of tokens in ns: its length in tokens and its slot, one page per
// state group in their order in HybridConfig.Groups (0 and nil: none, or
// no state groups). The pages are valid until the next call that may
// evict; a handoff sender reads their bytes at once.
func (h *HybridManager) StateCheckpoint(ns Namespace, tokens []int32) (n int, slot []PageID) {
	s := h.core.state
	if s == nil {
		return 0, nil
	}
	var best *checkpoint
	hv := h.core.groups[0].cache.Key(ns).Hash()
	for k := 1; k*s.ps <= len(tokens); k++ {
		hv = s.hash.Page(hv, tokens[(k-1)*s.ps:k*s.ps])
		if c, ok := s.ckpts[ckptKey{hv, k * s.ps}]; ok {
			best = c
		}
	}
	if best == nil {
		return 0, nil
	}
	return best.key.tokens, slices.Clone(best.slot)
}
