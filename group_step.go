package pagedkv

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// A group's part of a step (docs/manager.md, "The step protocol"): the
// core calls prepare (or prepareSiblings) on every group, then apply, then
// checkCommit once and commit (or abort) on every group.

// prepare validates a step and returns the pages it needs, changing
// nothing but the step's scratch (batch, counts).
func (m *group) prepare(ids []RequestID, ntokens []int32, drafts [][]int32) (need int, err error) {
	if m.pending {
		return 0, fmt.Errorf("%w: reserve", ErrStepPending)
	}
	if len(ids) != len(ntokens) {
		return 0, fmt.Errorf("%w: reserve: %d requests but %d token counts", ErrBadArgument, len(ids), len(ntokens))
	}
	if drafts != nil && len(drafts) != len(ids) {
		return 0, fmt.Errorf("%w: reserve: %d requests but %d draft lists", ErrBadArgument, len(ids), len(drafts))
	}
	m.epoch++
	batch, seqs := m.batch[:0], m.seqs[:0]
	var slots int64 // token slots of the batch's pages after the step
	maxHeld := m.maxHeld()
	counts, ndrafts := m.ntokens[:0], m.drafts[:0]
	for i, id := range ids {
		r, ok := m.reqs[id]
		switch {
		case !ok:
			return 0, fmt.Errorf("%w: reserve: ids[%d] = %d", ErrUnknownRequest, i, id)
		case !r.running:
			return 0, fmt.Errorf("%w: reserve: ids[%d] = %d", ErrPreempted, i, id)
		case r.loading > 0:
			return 0, fmt.Errorf("%w: reserve: ids[%d] = %d has %d onload copies in flight", ErrLoading, i, id, r.loading)
		case r.mark == m.epoch:
			return 0, fmt.Errorf("%w: reserve: ids[%d] = %d appears twice", ErrBadArgument, i, id)
		case ntokens[i] < 0 || r.computed+int(ntokens[i]) > len(r.tokens):
			return 0, fmt.Errorf("%w: reserve: ntokens[%d] = %d, request %d has %d tokens not yet computed",
				ErrBadArgument, i, ntokens[i], id, len(r.tokens)-r.computed)
		case int64(r.computed)+int64(ntokens[i]) > MaxRequestTokens:
			return 0, fmt.Errorf("%w: reserve: ntokens[%d] = %d takes request %d past %d tokens",
				ErrBadArgument, i, ntokens[i], id, MaxRequestTokens)
		}
		d := 0
		if drafts != nil {
			d = len(drafts[i])
		}
		if d > 0 {
			if r.computed+int(ntokens[i]) != len(r.tokens) {
				return 0, fmt.Errorf("%w: reserve: drafts[%d] has %d tokens, but request %d still has %d known tokens after this step's %d",
					ErrBadArgument, i, d, id, len(r.tokens)-r.computed-int(ntokens[i]), ntokens[i])
			}
			if d > maxDrafts || int64(r.computed)+int64(ntokens[i])+int64(d) > MaxRequestTokens {
				return 0, fmt.Errorf("%w: reserve: drafts[%d] has %d tokens, want at most %d (and at most %d tokens in the request)", ErrBadArgument, i, d, maxDrafts, MaxRequestTokens)
			}
			for k, t := range drafts[i] {
				if t < 0 {
					return 0, fmt.Errorf("%w: reserve: drafts[%d][%d] = %d is negative", ErrBadArgument, i, k, t)
				}
			}
		}
		held := int64(r.computed-r.start) + int64(ntokens[i]) + int64(d)
		if held > maxHeld {
			return 0, m.strideError(i, id, held)
		}
		slots += (held + int64(m.pageSize) - 1) / int64(m.pageSize) * int64(m.pageSize)
		r.mark = m.epoch
		batch = append(batch, r)
		seqs = append(seqs, r.seq())
		counts = append(counts, ntokens[i]+int32(d))
		ndrafts = append(ndrafts, int32(d))
	}
	m.batch, m.seqs, m.ntokens, m.drafts = batch, seqs, counts, ndrafts
	return m.checkSlots(slots)
}

// prepareSiblings is prepare for a group after the core's first: the
// step's requests are the siblings of the records of lead, the group
// before (see request.sibling), and the first group validated the step,
// which holds in every group because every group holds the same requests
// in the same states. Only the token-slot bound depends on the group (its
// held pages), and, with tiers, whether a request still loads pages here.
func (m *group) prepareSiblings(lead *group) (need int, err error) {
	m.epoch++
	batch, seqs := m.batch[:0], m.seqs[:0]
	var slots int64
	maxHeld := m.maxHeld()
	for i, l := range lead.batch {
		r := l.sibling
		if r == nil || r.id != l.id {
			panic(fmt.Sprintf("pagedkv: request %d of the step has no sibling in the next group", l.id))
		}
		if r.loading > 0 { // with tiers, groups onload different pages at admission
			return 0, fmt.Errorf("%w: reserve: ids[%d] = %d has %d onload copies in flight in a later layer group", ErrLoading, i, r.id, r.loading)
		}
		held := int64(r.computed-r.start) + int64(lead.ntokens[i])
		if held > maxHeld {
			return 0, m.strideError(i, r.id, held)
		}
		slots += (held + int64(m.pageSize) - 1) / int64(m.pageSize) * int64(m.pageSize)
		r.mark = m.epoch
		batch = append(batch, r)
		seqs = append(seqs, r.seq())
	}
	m.batch, m.seqs = batch, seqs
	m.ntokens = append(m.ntokens[:0], lead.ntokens...)
	m.drafts = append(m.drafts[:0], lead.drafts...)
	return m.checkSlots(slots)
}

// maxHeld is the most tokens from its first held page a request of a step
// may hold: Config.BlockTablesStride pages (no bound without a stride).
func (m *group) maxHeld() int64 {
	if stride := m.cfg.BlockTablesStride; stride != 0 {
		return int64(stride) * int64(m.pageSize)
	}
	return math.MaxInt64
}

// strideError is the refusal of a step that would give request ids[i] =
// id, holding held tokens (> maxHeld) from its first held page after the
// step, more pages than a row of the plan's BlockTables.
func (m *group) strideError(i int, id RequestID, held int64) error {
	stride := m.cfg.BlockTablesStride
	pages := (held + int64(m.pageSize) - 1) / int64(m.pageSize)
	return fmt.Errorf("%w: reserve: ids[%d] = %d would hold %d pages (%d tokens from its first held page, page size %d) in %s, more than Config.BlockTablesStride = %d",
		ErrBadArgument, i, id, pages, held, m.pageSize, m.layerGroup.Kind, stride)
}

// checkSlots bounds the prepared step's token slots and returns the pages
// it needs.
func (m *group) checkSlots(slots int64) (need int, err error) {
	if slots >= maxBatchTokenSlots {
		// Shared pages count once per request (FlashInfer indexes each
		// request's pages separately), so forks can exceed the pool.
		return 0, fmt.Errorf("%w: reserve: the step's %d requests would hold %d token slots (pages*page_size), want < %d (FlashInfer's 32-bit token offsets); split the batch",
			ErrBadArgument, len(m.batch), slots, int64(maxBatchTokenSlots))
	}
	m.prepared = m.pagesNeeded(m.batch, m.ntokens)
	m.writers = slices.Grow(m.writers, len(m.batch)) // as the batch grows, not during the commit
	m.preparedSlots = slots
	m.preparedEvictions = m.cache.Counters().Evicted
	return m.prepared, nil
}

// apply reserves the prepared step, whose pages are free. lead is the
// core's first group when m is a later one (nil: m is the first): a step's
// Requests, TokenIDs and TokenPositions are the same in every group, so
// m's plan shares lead's.
func (m *group) apply(drafts [][]int32, lead *group) *Plan {
	batch, seqs, counts, ndrafts := m.batch, m.seqs, m.ntokens, m.drafts
	// Eviction may have taken a cached partial last page (one a request
	// truncated into) from the cache, so it needs no copy any more: count
	// again if the cache evicted since prepare.
	need := m.prepared
	if m.cache.Counters().Evicted != m.preparedEvictions {
		need = m.pagesNeeded(batch, counts)
	}
	free := m.alloc.NumFree()
	// Nothing below fails. Drafts join the tokens for the step; Commit keeps
	// the accepted ones.
	m.spec = false
	for i, r := range batch {
		if ndrafts[i] > 0 {
			m.spec = true
			r.tokens = append(r.tokens, drafts[i]...)
		}
	}
	if m.spec {
		m.noteLastPages()
	}
	copies, err := m.table.Reserve(m.plan.Copies[:0], seqs, counts)
	if err != nil {
		// Validated above and the pages are there: the page table and this
		// group disagree.
		panic(fmt.Sprintf("pagedkv: reserving %d pages for a validated step: %v", need, err))
	}
	if invariants.Enabled {
		if got := free - m.alloc.NumFree(); got != need {
			panic(fmt.Sprintf("pagedkv: the step took %d pages, pagesNeeded said %d", got, need))
		}
	}
	for i, r := range batch {
		if counts[i] > 0 {
			r.lastMaybeShared = false
		}
	}
	for _, c := range copies {
		// A cached page a request truncated into and copied away from may
		// be idle now.
		m.cache.Recheck(c.Src)
	}
	m.fillPlan(copies, lead)
	m.pending = true
	m.counters.copiedPages += int64(len(copies))
	m.afterChange()
	return &m.plan
}

// maxBatchTokenSlots bounds kv_indptr[B]*page_size of an exported step, the
// rule pagetable.ValidateCSR enforces.
const maxBatchTokenSlots = 1 << 32

// pagesNeeded returns the pages the page table's Reserve will take for the
// batch: new pages past each request's last one, plus one per copy-on-write.
// Of k batch members sharing a partial last page, the first k-1 copy (the
// last writes in place) unless other holders keep it shared.
func (m *group) pagesNeeded(batch []*request, ntokens []int32) int {
	ps, need := m.pageSize, 0
	shared := false
	for i, r := range batch {
		n := int(ntokens[i])
		held := r.computed - r.start // no step is pending
		need += (held+n+ps-1)/ps - (held+ps-1)/ps
		shared = shared || n > 0 && r.lastMaybeShared && held%ps != 0
	}
	if !shared {
		return need
	}
	// Slow path, after forks: count the copies.
	clear(m.copiedAway)
	for i, r := range batch {
		held := r.computed - r.start
		if ntokens[i] == 0 || !r.lastMaybeShared || held%ps == 0 {
			continue
		}
		pages := m.table.Pages(r.seq())
		last := pages[len(pages)-1]
		if rc := m.alloc.RefCount(last); rc > 1 && rc-m.copiedAway[last] > 1 {
			m.copiedAway[last]++
			need++
		}
	}
	return need
}

// fillPlan exports the step's arrays into the reused plan (sharing lead's
// token arrays; see apply).
func (m *group) fillPlan(copies []CopyOp, lead *group) {
	p := &m.plan
	if err := m.table.ExportTo(&m.csr, m.seqs); err != nil {
		panic(fmt.Sprintf("pagedkv: exporting the step's page table: %v", err))
	}
	if err := m.table.ExportAppendTo(&m.appendCSR, m.seqs, m.ntokens); err != nil {
		panic(fmt.Sprintf("pagedkv: exporting the step's appends: %v", err))
	}
	p.Copies = copies
	m.planDrafts = append(m.planDrafts[:0], m.drafts...)
	p.Drafts = m.planDrafts
	p.QOIndptr, p.BatchIndices, p.Positions = m.appendCSR.AppendIndptr, m.appendCSR.BatchIndices, m.appendCSR.Positions
	p.KVIndptr, p.KVPageIndices, p.KVLastPageLen, p.SeqLens = m.csr.KVIndptr, m.csr.KVPageIndices, m.csr.KVLastPageLen, m.csr.SeqLens
	p.BlockTables, p.BlockTablesStride = nil, m.cfg.BlockTablesStride
	if p.BlockTablesStride > 0 {
		// prepare checked every row fits.
		m.blockTables = m.csr.BlockTablesTo(m.blockTables, p.BlockTablesStride, BlockTablesPad)
		p.BlockTables = m.blockTables
	}
	if lead != nil {
		lp := &lead.plan
		p.Requests, p.TokenIDs, p.TokenPositions = lp.Requests, lp.TokenIDs, lp.TokenPositions
	} else {
		m.fillTokens()
	}
	p.WindowLeft = -1
	if m.window > 0 {
		p.WindowLeft = m.window - 1
	}
	p.AttnQOIndptr, p.AttnKVIndptr, p.AttnKVPageIndices, p.AttnKVLastPageLen, p.AttnRequests = nil, nil, nil, nil, nil
	if m.layerGroup.Kind == layergroup.Chunked {
		m.fillChunkedAttention()
	}
	p.Cascade, p.CascadeWindowLeft = nil, nil
	// A plain Manager with a window keeps flat plans (its engines run the
	// CUDA step's cascade, which takes no window); a HybridManager's
	// windowed groups cascade what every sharing row sees in full.
	if (m.attention.KeepTokens(0) < 0 || m.cascadeWindows) && m.cfg.CascadeMinSavedPages > 0 {
		p.Cascade = m.planner.plan(m, m.cfg.CascadeMinSavedPages)
		if p.Cascade != nil && m.capLevels && len(p.Cascade.Levels) > m.levelCap {
			p.Cascade = nil // deeper than the bound step buffers hold: run flat
		}
	}
	if p.Cascade != nil {
		w := m.planner.windows[:0]
		for l := range p.Cascade.Levels {
			wl := -1
			if l == len(p.Cascade.Levels)-1 {
				wl = p.WindowLeft
			}
			w = append(w, wl)
		}
		m.planner.windows, p.CascadeWindowLeft = w, w
	}
}

// fillTokens fills the plan's Requests, TokenIDs and TokenPositions.
func (m *group) fillTokens() {
	p := &m.plan
	p.Requests = p.Requests[:0]
	for _, r := range m.batch {
		p.Requests = append(p.Requests, r.id)
	}
	nnz := len(p.Positions)
	p.TokenIDs = slices.Grow(p.TokenIDs[:0], nnz)[:nnz]
	p.TokenPositions = slices.Grow(p.TokenPositions[:0], nnz)[:nnz]
	for b, r := range m.batch {
		start := int32(r.start)
		for i := p.QOIndptr[b]; i < p.QOIndptr[b+1]; i++ {
			pos := p.Positions[i] + start
			p.TokenPositions[i] = pos
			p.TokenIDs[i] = r.tokens[pos]
		}
	}
}

// checkCommit validates a commit (accepted nil: Commit; else CommitSpec)
// against the pending step.
func (m *group) checkCommit(accepted, sampled []int32) error {
	if !m.pending {
		return fmt.Errorf("%w: commit", ErrNoStep)
	}
	if accepted == nil {
		if m.spec {
			return fmt.Errorf("%w: commit: the step has draft tokens; commit it with CommitSpec", ErrBadArgument)
		}
	} else {
		if len(accepted) != len(m.batch) {
			return fmt.Errorf("%w: commit: %d accepted counts for a step of %d requests", ErrBadArgument, len(accepted), len(m.batch))
		}
		for b, a := range accepted {
			if a < 0 || a > m.drafts[b] {
				return fmt.Errorf("%w: commit: accepted[%d] = %d, request %d has %d drafts",
					ErrBadArgument, b, a, m.batch[b].id, m.drafts[b])
			}
		}
	}
	if sampled != nil && len(sampled) != len(m.batch) {
		return fmt.Errorf("%w: commit: %d sampled tokens for a step of %d requests", ErrBadArgument, len(sampled), len(m.batch))
	}
	return m.checkSampled(sampled)
}

// commit records the pending step, checked by checkCommit (in the core's
// first group, for every group); accepted is nil for a step without
// drafts.
func (m *group) commit(accepted, sampled []int32) {
	if accepted != nil {
		m.rollbackDrafts(accepted)
	}
	nnz := int64(0)
	for b, r := range m.batch {
		r.computed += int(m.ntokens[b])
		nnz += int64(m.ntokens[b])
		m.publishNoting(r)
		if sampled != nil && sampled[b] != NoToken {
			r.tokens = append(r.tokens, sampled[b])
		}
		m.releaseWindow(r)
	}
	m.pending, m.spec = false, false
	m.counters.steps++
	m.counters.computedTokens += nnz
	m.settleLoaded()
	// The core publishes the Stats (afterChange) once every group
	// committed and the writes are counted.
}

// publishNoting is publish, noting r in m.writers if it wrote (usage.go,
// countWrites).
func (m *group) publishNoting(r *request) {
	w := r.wrote
	m.publish(r)
	if r.wrote != w {
		m.writers = append(m.writers, r)
	}
}

// checkSampled checks a commit's sampled tokens against the step.
func (m *group) checkSampled(sampled []int32) error {
	for b, t := range sampled {
		r := m.batch[b]
		switch {
		case t == NoToken:
		case t < 0:
			return fmt.Errorf("%w: commit: sampled[%d] = %d (request %d) is negative", ErrBadArgument, b, t, r.id)
		case r.computed+int(m.ntokens[b]) != len(r.tokens):
			return fmt.Errorf("%w: commit: sampled[%d] = %d, but request %d still has %d known tokens to compute",
				ErrBadArgument, b, t, r.id, len(r.tokens)-r.computed-int(m.ntokens[b]))
		}
	}
	return nil
}

// publish adds r's newly filled pages to the prefix cache, in order, under
// its chain. A chain cut by eviction ends publishing for the request.
func (m *group) publish(r *request) {
	if r.noCache || r.chainCut {
		return
	}
	ps := m.pageSize
	full := r.computed / ps
	if r.cachedPages >= full {
		return
	}
	// A chain cut by eviction is the expected case under memory pressure:
	// see it here rather than through Publish's formatted error.
	if _, _, live := m.cache.Entry(r.chain); !live && !r.chain.IsRoot() {
		r.chainCut = true
		m.counters.chainsCut++
		return
	}
	first := r.start / ps
	pages := m.table.Pages(r.seq())
	for d := r.cachedPages; d < full; d++ {
		if d < first {
			// Unreachable: pages are published as they fill, before the
			// window can release them.
			panic(fmt.Sprintf("pagedkv: request %d publishes page %d, released by the window (first held %d)", r.id, d, first))
		}
		if m.ephemeralFrom(r, d) {
			return // the chain stops before an ephemeral page
		}
		h, added, err := m.cache.Publish(r.chain, r.key, pages[d-first], r.tokens[d*ps:(d+1)*ps], r.prio)
		if errors.Is(err, prefixcache.ErrStaleHandle) {
			r.chainCut = true
			m.counters.chainsCut++
			return
		}
		if err != nil {
			panic(fmt.Sprintf("pagedkv: publishing page %d of request %d: %v", d, r.id, err))
		}
		if m.tiers != nil {
			m.tierPublished(r, pages[d-first], r.tokens[d*ps:(d+1)*ps], added)
		}
		if added && d >= r.readEnd {
			r.wrote += int64(ps)
		}
		r.chain = h
		r.cachedPages++
		if len(r.retention) > 0 {
			p, _ := h.Page()
			m.retainPage(r, d, p)
		}
	}
}

// abort is Abort in one group.
func (m *group) abort() error {
	if !m.pending {
		return fmt.Errorf("%w: abort", ErrNoStep)
	}
	for b, r := range m.batch {
		if err := m.table.Truncate(r.seq(), m.table.Len(r.seq())-int(m.ntokens[b])); err != nil {
			panic(fmt.Sprintf("pagedkv: aborting the step of request %d: %v", r.id, err))
		}
		r.tokens = r.tokens[:len(r.tokens)-int(m.drafts[b])]
	}
	m.pending, m.spec = false, false
	m.settleLoaded()
	m.afterChange()
	return nil
}

// fillChunkedAttention fills the plan's Attn arrays of a chunked group:
// each request's rows split at chunk boundaries (layergroup.Spec.Segments),
// each segment over the pages from its chunk's start (page-aligned) to its
// last row.
func (m *group) fillChunkedAttention() {
	p, ps := &m.plan, m.pageSize
	qo, kvp, kvi, last, reqs := m.attn.qo[:0], m.attn.kvp[:0], m.attn.kvi[:0], m.attn.last[:0], m.attn.reqs[:0]
	qo, kvp = append(qo, 0), append(kvp, 0)
	for b, r := range m.batch {
		rows := int(p.QOIndptr[b+1] - p.QOIndptr[b])
		pages := p.KVPageIndices[p.KVIndptr[b]:p.KVIndptr[b+1]]
		m.attn.segs = m.attention.Segments(m.attn.segs[:0], r.computed, rows, r.start)
		for _, sg := range m.attn.segs {
			first, end := (sg.KeyFrom-r.start)/ps, (sg.KeyTo-r.start+ps-1)/ps
			kvi = append(kvi, pages[first:end]...)
			kvp = append(kvp, int32(len(kvi)))
			last = append(last, int32(sg.KeyTo-r.start-(end-1)*ps))
			qo = append(qo, qo[len(qo)-1]+int32(sg.Rows))
			reqs = append(reqs, int32(b))
		}
	}
	m.attn.qo, m.attn.kvp, m.attn.kvi, m.attn.last, m.attn.reqs = qo, kvp, kvi, last, reqs
	p.AttnQOIndptr, p.AttnKVIndptr, p.AttnKVPageIndices, p.AttnKVLastPageLen, p.AttnRequests = qo, kvp, kvi, last, reqs
}
