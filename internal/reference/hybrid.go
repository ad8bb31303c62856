package reference

import "fmt"

// This file models a hybrid attention model's layer groups (the root
// package's HybridManager): one ManagerModel per group, each with the
// group's rule of which keys a query reads (full and MLA: all; sliding
// window W: the last W; chunked C: its own chunk), so each group releases,
// caches and serves on its own. What spans groups is the hit rule: a
// request is admitted on the longest cached prefix every group serves, the
// minimum over groups of what each group's cache alone matches (a group's
// cache holds a page only with every page before it). Every operation
// runs on every group with the same arguments.
//
// The groups' pools are separate here (each numbers its own pages), where
// the real groups share one: the model states what each group holds,
// caches and serves, not which group's cached pages a short pool evicts.
// Tests compare it with the real manager on workloads that never evict.

// GroupModelKind is a layer group's attention.
type GroupModelKind int

// The attention kinds of a group.
const (
	GroupFull GroupModelKind = iota
	GroupSliding
	GroupChunked
	GroupMLA
)

// GroupModelSpec is one layer group: its kind and, for sliding and chunked
// groups, the window or chunk in tokens.
type GroupModelSpec struct {
	Kind          GroupModelKind
	Window, Chunk int
}

// HybridModel is the slow twin of pagedkv.HybridManager.
type HybridModel struct {
	pageSize int
	groups   []*ManagerModel
}

// NewHybridModel returns an empty model of the groups, each with a pool of
// numPages pages of pageSize tokens and at most maxPinned pinned pages (0:
// no cap).
func NewHybridModel(numPages, pageSize, maxPinned int, groups []GroupModelSpec) *HybridModel {
	h := &HybridModel{pageSize: pageSize}
	for g, s := range groups {
		cfg := ManagerModelConfig{NumPages: numPages, PageSize: pageSize, MaxPinnedPages: maxPinned}
		switch s.Kind {
		case GroupSliding:
			cfg.WindowTokens = s.Window
		case GroupChunked:
			if s.Chunk < 1 || s.Chunk%pageSize != 0 {
				panic(fmt.Sprintf("reference: group %d: chunk %d is not a positive multiple of the page size %d", g, s.Chunk, pageSize))
			}
			cfg.ChunkTokens = s.Chunk
		}
		h.groups = append(h.groups, NewManagerModel(cfg))
	}
	return h
}

// Group returns group g's model.
func (h *HybridModel) Group(g int) *ManagerModel { return h.groups[g] }

// NumGroups returns the number of groups.
func (h *HybridModel) NumGroups() int { return len(h.groups) }

// servable returns the pages of tokens every group's cache serves, at most
// (len(tokens)-1)/pageSize.
func (h *HybridModel) servable(ns string, tokens []int32) int {
	limit := (len(tokens) - 1) / h.pageSize
	for _, m := range h.groups {
		limit = min(limit, len(m.match(ns, tokens, limit)))
	}
	return limit
}

// each runs op on every group and requires the groups to agree.
func (h *HybridModel) each(op func(m *ManagerModel) (int, error)) (int, error) {
	n0, err0 := op(h.groups[0])
	for g, m := range h.groups[1:] {
		n, err := op(m)
		if n != n0 || (err == nil) != (err0 == nil) {
			panic(fmt.Sprintf("reference: group %d: %d, %v; group 0: %d, %v", g+1, n, err, n0, err0))
		}
	}
	return n0, err0
}

// admitLimited runs admit (Add or Resume) on every group, capped at the
// prefix every group serves.
func (h *HybridModel) admitLimited(ns string, tokens []int32, noCache bool, op func(m *ManagerModel) (int, error)) (int, error) {
	limit := 0
	if !noCache && len(tokens) > 1 {
		limit = h.servable(ns, tokens)
	}
	for _, m := range h.groups {
		m.limited, m.limit = true, limit
	}
	defer func() {
		for _, m := range h.groups {
			m.limited = false
		}
	}()
	return h.each(op)
}

// Add admits a request on the prefix every group serves.
func (h *HybridModel) Add(id uint64, ns string, prompt []int32, prio int, noCache bool) (int, error) {
	return h.admitLimited(ns, prompt, noCache, func(m *ManagerModel) (int, error) { return m.Add(id, ns, prompt, prio, noCache) })
}

// Resume re-admits a preempted request on the prefix every group serves.
func (h *HybridModel) Resume(id uint64) (int, error) {
	r := h.groups[0].reqs[id]
	if r == nil || r.Running || h.groups[0].pending {
		return h.each(func(m *ManagerModel) (int, error) { return m.Resume(id) })
	}
	return h.admitLimited(r.NS, r.Tokens, r.NoCache, func(m *ManagerModel) (int, error) { return m.Resume(id) })
}

func noCount(err error) (int, error) { return 0, err }

// Usage returns request id's cache reads and writes (pagedkv.CacheUsage):
// the reads of its admissions (equal in every group: each admits the
// prefix every group serves) and the writes of the group that wrote the
// most. A released request's are forgotten once read.
func (h *HybridModel) Usage(id uint64) (read, write int64, ok bool) {
	for g, m := range h.groups {
		r, w, k := m.Usage(id)
		if g == 0 {
			read, ok = r, k
		}
		write = max(write, w)
	}
	return read, write, ok
}

// Extend, Fork, Release, Preempt, Commit, CommitSpec and Abort run on
// every group.
func (h *HybridModel) Extend(id uint64, tokens []int32) error {
	_, err := h.each(func(m *ManagerModel) (int, error) { return noCount(m.Extend(id, tokens)) })
	return err
}

// Fork forks a request in every group.
func (h *HybridModel) Fork(parent, child uint64) error {
	_, err := h.each(func(m *ManagerModel) (int, error) { return noCount(m.Fork(parent, child)) })
	return err
}

// Release ends a request in every group.
func (h *HybridModel) Release(id uint64) error {
	_, err := h.each(func(m *ManagerModel) (int, error) { return noCount(m.Release(id)) })
	return err
}

// Preempt drops a request's pages in every group.
func (h *HybridModel) Preempt(id uint64) error {
	_, err := h.each(func(m *ManagerModel) (int, error) { return noCount(m.Preempt(id)) })
	return err
}

// Truncate cuts a request in every group, or in none if any group cannot
// (its next query would need keys it released).
func (h *HybridModel) Truncate(id uint64, n int) error {
	for _, m := range h.groups {
		r, err := m.existing(id)
		if err != nil {
			return err
		}
		if n < 0 || n > len(r.Tokens) || r.Running && n < r.Computed && m.keepFrom(n) < r.Start {
			return ErrMgrBadArgument
		}
	}
	_, err := h.each(func(m *ManagerModel) (int, error) { return noCount(m.Truncate(id, n)) })
	return err
}

// ReserveSpec reserves a step in every group and returns the copies every
// group makes, in total.
func (h *HybridModel) ReserveSpec(ids []uint64, ntokens []int32, drafts [][]int32) (copies int, err error) {
	for g, m := range h.groups {
		c, err := m.ReserveSpec(ids, ntokens, drafts)
		if err != nil {
			if g > 0 {
				panic(fmt.Sprintf("reference: group %d refused a step group 0 took: %v", g, err))
			}
			return 0, err
		}
		copies += c
	}
	return copies, nil
}

// CommitSpec commits a speculative (or plain, with no drafts) step in
// every group.
func (h *HybridModel) CommitSpec(accepted, sampled []int32) error {
	_, err := h.each(func(m *ManagerModel) (int, error) { return noCount(m.CommitSpec(accepted, sampled)) })
	return err
}

// Abort undoes the reserved step in every group.
func (h *HybridModel) Abort() error {
	_, err := h.each(func(m *ManagerModel) (int, error) { return noCount(m.Abort()) })
	return err
}

// Pin pins, in every group, the prefix of tokens every group's cache holds
// (at most len(tokens)/pageSize pages), all or nothing: ErrMgrNotCached if
// some group lacks the first page, ErrMgrPinLimit if some group's pins
// would pass its MaxPinnedPages. It returns the pin (the same in every
// group) and the tokens it covers.
func (h *HybridModel) Pin(ns string, tokens []int32) (uint64, int, error) {
	n := len(tokens) / h.pageSize
	for _, m := range h.groups {
		n = min(n, len(m.match(ns, tokens, n)))
	}
	if n == 0 {
		return 0, 0, ErrMgrNotCached
	}
	for _, m := range h.groups {
		if _, err := m.pinPath(ns, tokens[:n*h.pageSize]); err != nil {
			return 0, 0, err
		}
	}
	id, err := h.each(func(m *ManagerModel) (int, error) {
		id, _, err := m.Pin(ns, tokens[:n*h.pageSize])
		return int(id), err
	})
	return uint64(id), n * h.pageSize, err
}

// Unpin removes a pin from every group.
func (h *HybridModel) Unpin(id uint64) error {
	_, err := h.each(func(m *ManagerModel) (int, error) { return 0, m.Unpin(id) })
	return err
}
