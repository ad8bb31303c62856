package reference

import "slices"

// Speculative steps and Truncate in the Manager model. The model states
// the property the real Manager must meet as its definition: CommitSpec
// puts the state back to what it was just after the speculative Reserve's
// eviction, then reserves and commits a plain step of the known tokens and
// the accepted drafts only. (Reserve's eviction for the drafts' pages
// stays: that is the one trace drafts may leave.)

// mgrSnapshot is the state a speculative step changes after its eviction.
type mgrSnapshot struct {
	refs  map[int32]int
	reqs  map[uint64]MgrRequestModel
	st    ManagerModelStats
	idle  map[*mgrEntry]bool // copy-on-write during the step may idle a cached page
	ticks map[*mgrEntry]int64
	tick  int64
}

func (m *ManagerModel) save(ids []uint64) *mgrSnapshot {
	s := &mgrSnapshot{refs: make(map[int32]int, len(m.refs)), reqs: map[uint64]MgrRequestModel{}, st: m.st}
	for p, n := range m.refs {
		s.refs[p] = n
	}
	s.idle, s.ticks, s.tick = map[*mgrEntry]bool{}, map[*mgrEntry]int64{}, m.tick
	for _, e := range m.entries {
		s.idle[e], s.ticks[e] = e.idle, e.tick
	}
	for _, id := range ids {
		r := *m.reqs[id]
		r.Tokens, r.Pages = slices.Clone(r.Tokens), slices.Clone(r.Pages)
		s.reqs[id] = r
	}
	return s
}

// CommitSpec commits a step reserved with ReserveSpec: accepted[b] drafts
// of member b are kept, then sampled[b] as in Commit.
func (m *ManagerModel) CommitSpec(accepted, sampled []int32) error {
	if !m.pending {
		return ErrMgrNoStep
	}
	if len(accepted) != len(m.stepIDs) {
		return ErrMgrBadArgument
	}
	for b, a := range accepted {
		if a < 0 || int(a) > len(m.stepDrafts[b]) {
			return ErrMgrBadArgument
		}
	}
	if err := m.checkSampled(sampled); err != nil {
		return err
	}
	ids, drafts, snap := m.stepIDs, m.stepDrafts, m.snapshot
	// Back to the state before the step, then the step without the
	// rejected drafts.
	m.refs, m.st, m.tick = snap.refs, snap.st, snap.tick
	for e, idle := range snap.idle {
		e.idle, e.tick = idle, snap.ticks[e]
	}
	counts := make([]int32, len(ids))
	for b, id := range ids {
		r := snap.reqs[id]
		*m.reqs[id] = r
		counts[b] = m.stepTokens[b] - int32(len(drafts[b])) + accepted[b]
		m.reqs[id].Tokens = append(m.reqs[id].Tokens, drafts[b][:accepted[b]]...)
	}
	m.pending = false
	need, cow := m.stepNeed(ids, counts)
	if need > m.numFree() {
		panic("reference: the accepted tokens need more pages than the drafts did")
	}
	m.reserve(ids, counts, cow)
	m.stepDrafts = nil
	if err := m.Commit(sampled); err != nil {
		panic("reference: commit of the accepted tokens failed: " + err.Error())
	}
	for b := range ids {
		m.st.DraftTokens += int64(len(drafts[b]))
		m.st.AcceptedDraftTokens += int64(accepted[b])
	}
	return nil
}

// Truncate cuts a request's tokens to its first n, releasing the pages
// past them (cached ones stay cached).
func (m *ManagerModel) Truncate(id uint64, n int) error {
	r, err := m.existing(id)
	if err != nil {
		return err
	}
	if n < 0 || n > len(r.Tokens) {
		return ErrMgrBadArgument
	}
	if r.Running && n < r.Computed {
		ps := m.cfg.PageSize
		// The next query, at position n, reads keys from keepFrom(n) on;
		// the pages the window (or chunk) released before Start cannot
		// serve it.
		if m.keepFrom(n) < r.Start {
			return ErrMgrBadArgument
		}
		keep := (n - r.Start + ps - 1) / ps
		dropped := slices.Clone(r.Pages[keep:])
		r.Pages = slices.Clone(r.Pages[:keep])
		for _, p := range dropped {
			m.unref(p)
		}
		m.recheckDeepestFirst(dropped)
		r.Computed, r.Length = n, n
		for !r.NoCache && !r.ChainCut && r.CachedPages > n/ps {
			if r.chain.gone {
				r.ChainCut = true
				m.st.ChainsCut++
				break
			}
			r.chain = r.chain.parent
			r.CachedPages--
		}
	}
	if !r.Running {
		r.lost = min(r.lost, n)
	}
	r.Tokens = r.Tokens[:n]
	return nil
}

// RefCount returns the holders of page p (requests and the cache).
func (m *ManagerModel) RefCount(p int32) int { return m.refs[p] }

// CachedPage reports whether page p is in the model's cache.
func (m *ManagerModel) CachedPage(p int32) bool { return m.byPage[p] != nil }
