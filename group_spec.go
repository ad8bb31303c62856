package pagedkv

import (
	"fmt"
)

// Speculative decoding and request edits.
//
// A speculative step reserves, for a request, its next known token(s) and k
// draft tokens after them (1+k query rows), and commits how many drafts the
// target model accepted plus the token it sampled after them (the bonus
// token). The state after CommitSpec is the state of a step that had
// reserved only the accepted tokens: the page table, the tokens, the
// prefix cache and Stats (but for the draft counters) are what that step
// would have left, because
//
//   - rejected tokens are cut off (Table.Truncate): the last page's length
//     shrinks and pages holding only rejected tokens go back to the pool;
//   - publishing and window release run after the cut, on accepted tokens
//     only, so a rejected token is never cached and never in a later plan;
//   - a copy-on-write copy taken only to hold rejected tokens is undone, so
//     the requests that keep no token end up sharing one page as they
//     would have without the drafts (see undoCopies).
//
// The one thing the drafts may leave behind is eviction: Reserve evicts for
// the pages the drafts need, and that is not undone.

// maxDrafts bounds the drafts of one request in one step.
const maxDrafts = 1 << 12

// lastPage is a batch member's last page before a speculative step, kept
// to undo copy-on-write at CommitSpec.
type lastPage struct {
	page     PageID
	idx      int32 // its index in the request's page list; -1: no partial last page
	mayShare bool  // the request's lastMaybeShared before the step
}

// noteLastPages records, before a speculative step's reservation, each
// member's partial last page (the one copy-on-write may move).
func (m *group) noteLastPages() {
	ps := m.pageSize
	lp := m.lastPages[:0]
	for _, r := range m.batch {
		e := lastPage{idx: -1, mayShare: r.lastMaybeShared}
		if held := r.computed - r.start; held%ps != 0 {
			pages := m.table.Pages(r.seq())
			e.idx = int32(len(pages) - 1)
			e.page = pages[e.idx]
		}
		lp = append(lp, e)
	}
	m.lastPages = lp
}

// rollbackDrafts cuts each member's rejected drafts (tokens and KV) and
// turns m.ntokens into the tokens kept. accepted is valid.
func (m *group) rollbackDrafts(accepted []int32) {
	undo := false
	for b, r := range m.batch {
		d, a := m.drafts[b], accepted[b]
		m.counters.draftTokens += int64(d)
		m.counters.acceptedDraftTokens += int64(a)
		if d == 0 {
			continue
		}
		rejected := int(d - a)
		m.ntokens[b] -= int32(rejected)
		r.tokens = r.tokens[:len(r.tokens)-rejected]
		if rejected > 0 {
			if err := m.table.Truncate(r.seq(), r.computed+int(m.ntokens[b])); err != nil {
				panic(fmt.Sprintf("pagedkv: cutting %d rejected drafts of request %d: %v", rejected, r.id, err))
			}
		}
		if m.ntokens[b] == 0 {
			r.lastMaybeShared = m.lastPages[b].mayShare
			undo = undo || m.lastPages[b].idx >= 0
		}
	}
	if !undo {
		return
	}
	for b, r := range m.batch {
		lp := m.lastPages[b]
		if m.ntokens[b] == 0 && lp.idx >= 0 && m.table.Pages(r.seq())[lp.idx] != lp.page {
			m.undoCopies(accepted, lp.page)
		}
	}
}

// undoCopies undoes the copy-on-write of shared partial page p by the
// members that keep no token of the step (n+a == 0; call them idle).
//
// A step without the drafts would have left every member that keeps
// tokens with a page of its own, and the idle members, with p's holders
// outside the step, sharing one page whose entries are p's. After the
// drafts, an idle member that wrote drafts holds a copy of p (entries up
// to its own length, then its rejected drafts) or p itself, written in
// place (only when every holder of p wrote: the others all copied away).
// So: if p is held by someone that wrote nothing (a member without tokens
// or drafts, or a holder outside the step), p is untouched and the idle
// members return to it; otherwise they move to the page of the longest
// idle member, the only page whose entries are right for all of them. The
// pages left go back to the pool, and the copies counted for the step
// become the ones the step without drafts would have made.
func (m *group) undoCopies(accepted []int32, p PageID) {
	onP, copied, keepers := 0, 0, 0
	untouched := false
	var best *request
	bestHeld, bestIdx := -1, int32(0)
	for c, o := range m.batch {
		lc := m.lastPages[c]
		if lc.idx < 0 || lc.page != p {
			continue
		}
		cur := m.table.Pages(o.seq())[lc.idx]
		wrote := m.ntokens[c]+m.drafts[c]-accepted[c] > 0
		if cur == p {
			onP++
			untouched = untouched || !wrote
		} else {
			copied++
		}
		if m.ntokens[c] > 0 {
			keepers++
			continue
		}
		if held := o.computed - o.start; held > bestHeld || held == bestHeld && cur == p {
			best, bestHeld, bestIdx = o, held, lc.idx
		}
	}
	if int(m.alloc.RefCount(p)) > onP {
		untouched = true // held outside the step (another request, or the cache)
	}
	target := p
	if !untouched {
		target = m.table.Pages(best.seq())[bestIdx]
	}
	for c, o := range m.batch {
		lc := m.lastPages[c]
		if lc.idx < 0 || lc.page != p {
			continue
		}
		m.lastPages[c].idx = -1 // the group is done
		if m.ntokens[c] > 0 {
			continue
		}
		o.lastMaybeShared = true
		if m.table.Pages(o.seq())[lc.idx] == target {
			continue
		}
		if _, err := m.table.ReplaceLast(o.seq(), target); err != nil {
			panic(fmt.Sprintf("pagedkv: undoing the copy-on-write of request %d: %v", o.id, err))
		}
	}
	m.cache.Recheck(target) // p may be cached (a request truncated into it) and was idle during the step
	// Without the drafts only the members that keep tokens copy, as the
	// idle ones still hold p.
	m.counters.copiedPages -= int64(copied - keepers)
}

// truncate is Manager.Truncate in the group.
func (m *group) truncate(id RequestID, n int) error {
	r, err := m.checkTruncate(id, n)
	if err != nil {
		return err
	}
	if r.running && n < r.computed {
		seq, ps := r.seq(), m.pageSize
		keep := (n - r.start + ps - 1) / ps
		dropped := append(m.scratch[:0], m.table.Pages(seq)[keep:]...)
		m.scratch = dropped
		if err := m.table.Truncate(seq, n); err != nil {
			panic(fmt.Sprintf("pagedkv: truncating request %d to %d tokens: %v", id, n, err))
		}
		m.recheckDeepestFirst(dropped)
		if n%ps != 0 {
			// The new last page was full, so it may be cached or shared.
			r.lastMaybeShared = true
		}
		r.computed = n
		r.readEnd = min(r.readEnd, n/ps) // recomputed past n: a write again
		for !r.noCache && !r.chainCut && r.cachedPages > n/ps {
			_, parent, live := m.cache.Entry(r.chain)
			if !live {
				r.chainCut = true
				m.counters.chainsCut++
				break
			}
			r.chain = parent
			r.cachedPages--
		}
		if m.tiers != nil && !r.noCache && !r.chainCut {
			m.tierChainAt(r)
		}
	}
	if !r.running {
		r.lostTokens = min(r.lostTokens, n)
	}
	r.tokens = r.tokens[:n]
	m.afterChange()
	return nil
}

// checkTruncate validates Truncate(id, n) without changing anything.
func (m *group) checkTruncate(id RequestID, n int) (*request, error) {
	if m.pending {
		return nil, fmt.Errorf("%w: truncate request %d", ErrStepPending, id)
	}
	r, err := m.lookup("truncate", id)
	if err != nil {
		return nil, err
	}
	if n < 0 || n > len(r.tokens) {
		return nil, fmt.Errorf("%w: truncate request %d to %d tokens, want 0..%d", ErrBadArgument, id, n, len(r.tokens))
	}
	if r.loading > 0 {
		return nil, fmt.Errorf("%w: truncate request %d: %d onload copies in flight", ErrLoading, id, r.loading)
	}
	if r.running && n < r.computed {
		if from := m.attention.KeepFrom(n, m.pageSize); from < r.start {
			return nil, fmt.Errorf("%w: truncate request %d to %d tokens: its next query would read from token %d, but tokens before %d left its %v window",
				ErrBadArgument, id, n, from, r.start, m.layerGroup.Kind)
		}
	}
	return r, nil
}
