package pagedkv

import (
	"fmt"
	"slices"
)

// auditGroup checks the group's own invariants: the packages under it,
// the partition, and each request against its pages and cache chain. The
// pool-wide checks (reference counts, tiers) are the core's (auditPool).
func (m *group) auditGroup() error {
	if err := m.alloc.CheckInvariants(); err != nil {
		return err
	}
	if err := m.table.CheckInvariants(); err != nil {
		return err
	}
	if err := m.cache.CheckInvariants(); err != nil {
		return err
	}
	if err := m.checkPartition(); err != nil {
		return err
	}
	ps := m.pageSize
	reserved := make(map[RequestID]int)
	if m.pending {
		for b, r := range m.batch {
			reserved[r.id] = int(m.ntokens[b])
		}
	}
	ids := make([]RequestID, 0, len(m.reqs))
	for id := range m.reqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		r := m.reqs[id]
		seq := r.seq()
		if r.id != id {
			return fmt.Errorf("pagedkv: request %d is filed under %d", r.id, id)
		}
		if r.computed < 0 || r.computed > len(r.tokens) {
			return fmt.Errorf("pagedkv: request %d has %d computed of %d tokens", id, r.computed, len(r.tokens))
		}
		if !r.running {
			if m.table.Has(seq) || r.computed != 0 {
				return fmt.Errorf("pagedkv: preempted request %d holds pages (%v) or computed tokens (%d)", id, m.table.Has(seq), r.computed)
			}
			continue
		}
		if !m.table.Has(seq) {
			return fmt.Errorf("pagedkv: running request %d has no page-table sequence", id)
		}
		if n := m.table.Len(seq); n != r.computed+reserved[id] {
			return fmt.Errorf("pagedkv: request %d has %d tokens on pages, want %d computed + %d reserved", id, n, r.computed, reserved[id])
		}
		start := m.table.Start(seq)
		if start != r.start {
			return fmt.Errorf("pagedkv: request %d starts at token %d, the page table says %d", id, r.start, start)
		}
		if m.layerGroup.KeepTokens(r.computed) < 0 && start != 0 {
			return fmt.Errorf("pagedkv: request %d starts at token %d without a window", id, start)
		}
		if from := m.layerGroup.KeepFrom(r.computed, ps); !m.pending && r.loading == 0 && start < from {
			return fmt.Errorf("pagedkv: request %d keeps tokens from %d after %d computed, %v group: pages before %d should have been released",
				id, start, r.computed, m.layerGroup.Kind, from)
		}
		if from := m.layerGroup.KeepFrom(r.computed, ps); start > from {
			return fmt.Errorf("pagedkv: request %d keeps tokens from %d after %d computed, but its next query reads from %d",
				id, start, r.computed, from)
		}
		if err := m.auditChain(r); err != nil {
			return err
		}
	}
	return nil
}

// auditChain checks that r's chain names cached pages holding r's tokens.
func (m *group) auditChain(r *request) error {
	if r.noCache || r.chainCut {
		return nil
	}
	ps := m.pageSize
	if r.cachedPages > r.computed/ps {
		return fmt.Errorf("pagedkv: request %d claims %d cached pages with %d computed tokens", r.id, r.cachedPages, r.computed)
	}
	d := r.cachedPages - 1
	h := r.chain
	for ; d >= 0; d-- {
		p, ok := h.Page()
		if !ok {
			return fmt.Errorf("pagedkv: request %d's chain ends at depth %d, want %d pages", r.id, d+1, r.cachedPages)
		}
		tokens, parent, live := m.cache.Entry(h)
		if !live {
			// The chain was cut by eviction after the request's last publish;
			// its next publish will notice.
			return nil
		}
		if !slices.Equal(tokens, r.tokens[d*ps:(d+1)*ps]) {
			return fmt.Errorf("pagedkv: request %d's cached page %d (depth %d) holds %v, the request has %v",
				r.id, p, d, tokens, r.tokens[d*ps:(d+1)*ps])
		}
		h = parent
	}
	if !h.IsRoot() {
		return fmt.Errorf("pagedkv: request %d's chain is deeper than its %d cached pages", r.id, r.cachedPages)
	}
	return nil
}
