package reference

import (
	"errors"
	"fmt"
	"slices"
)

// This file models the root package's Manager together with the prefix
// cache it drives: which pages each request holds, which prefixes are
// cached, what eviction takes, and the counters Stats reports. It is
// written for being checked by eye: the cache is a map from the whole token
// prefix (as text) to its page, eviction scans every entry for the least
// recently idled one, reference counts are a map, and free pages are found
// by scanning from page 0. Page IDs therefore differ from the real ones;
// tests compare the two up to a renaming of pages.

// Errors of the Manager model, one per class of failure of the real
// Manager.
var (
	ErrMgrOutOfPages     = errors.New("reference: manager out of pages")
	ErrMgrUnknownRequest = errors.New("reference: unknown request")
	ErrMgrRequestExists  = errors.New("reference: request exists")
	ErrMgrPreempted      = errors.New("reference: request preempted")
	ErrMgrNotPreempted   = errors.New("reference: request not preempted")
	ErrMgrStepPending    = errors.New("reference: step pending")
	ErrMgrNoStep         = errors.New("reference: no step")
	ErrMgrBadArgument    = errors.New("reference: bad argument")
	ErrMgrNotCached      = errors.New("reference: prefix not cached")
	ErrMgrPinLimit       = errors.New("reference: pin limit")
	ErrMgrUnknownPin     = errors.New("reference: unknown pin")
)

// ManagerModelConfig mirrors the Manager's Config.
type ManagerModelConfig struct {
	NumPages, PageSize, WindowTokens, Priorities, MaxPinnedPages int
	// ChunkTokens > 0 models a chunked-attention layer group (a multiple
	// of PageSize): a query reads only the keys of its own chunk, so the
	// pages of finished chunks are released (see HybridModel).
	ChunkTokens int
}

// mgrEntry is one cached page: the prefix of Depth+1 pages ending in it.
type mgrEntry struct {
	key    string // namespace and every token of the prefix
	parent *mgrEntry
	page   int32
	prio   int
	pins   int
	idle   bool  // the cache was its only holder at its last recheck
	tick   int64 // when it last became idle and unpinned
	gone   bool  // evicted
}

// MgrRequestModel is one request as the model sees it.
type MgrRequestModel struct {
	NS       string
	Prio     int
	NoCache  bool
	Tokens   []int32
	Computed int
	Running  bool
	Length   int     // tokens on pages (computed, plus reserved during a step)
	Start    int     // first held token
	Pages    []int32 // held pages in token order

	chain       *mgrEntry // cache entry of page CachedPages-1 (nil: root)
	CachedPages int
	ChainCut    bool
	lost        int

	// Cache accounting (pagedkv.CacheUsage): tokens read at every
	// admission (the matched prefix; the model has no tiers, so all from
	// the device) and tokens of the pages the request added to the cache.
	ReadTokens, WriteTokens int64
}

// ManagerModelStats mirrors the Manager's Stats.
type ManagerModelStats struct {
	TotalPages, FreePages, UsedPages, EvictablePages, PinnedIdlePages int
	CachedPages, PinnedPages, SharedPages                             int
	Requests, PreemptedRequests                                       int

	PromptTokens, PromptHitTokens, ComputedTokens, ResumedTokens, ResumeHitTokens int64

	Steps, Preemptions, CopiedPages, PublishedPages, DuplicatePages     int64
	EvictedPages, EvictionFreedPages, InnerVictims, WindowReleasedPages int64
	ChainsCut                                                           int64
	DraftTokens, AcceptedDraftTokens                                    int64
	CacheReadTokens, CacheWriteTokens                                   int64
}

// ManagerModel is the slow twin of pagedkv.Manager.
type ManagerModel struct {
	cfg     ManagerModelConfig
	refs    map[int32]int // allocated pages -> holders (requests and the cache)
	entries map[string]*mgrEntry
	byPage  map[int32]*mgrEntry
	reqs    map[uint64]*MgrRequestModel
	tick    int64
	pins    map[uint64]*mgrEntry // pin -> deepest pinned entry
	nextPin uint64

	// limited caps the prefix admit matches at limit pages (a HybridModel
	// admits on the prefix every group serves).
	limited bool
	limit   int

	pending    bool
	stepIDs    []uint64
	stepTokens []int32   // tokens reserved, drafts included
	stepDrafts [][]int32 // the step's drafts per member
	snapshot   *mgrSnapshot

	st ManagerModelStats // counters only; occupancy is computed in Stats

	// released holds released requests' reads and writes until Usage
	// reads them.
	released map[uint64][2]int64
}

// NewManagerModel returns an empty model.
func NewManagerModel(cfg ManagerModelConfig) *ManagerModel {
	if cfg.Priorities == 0 {
		cfg.Priorities = 4
	}
	return &ManagerModel{cfg: cfg, refs: map[int32]int{}, entries: map[string]*mgrEntry{},
		byPage: map[int32]*mgrEntry{}, reqs: map[uint64]*MgrRequestModel{}, pins: map[uint64]*mgrEntry{}}
}

// Request returns the model of request id, or nil. It must not be changed.
func (m *ManagerModel) Request(id uint64) *MgrRequestModel { return m.reqs[id] }

// RequestIDs returns every request ID, sorted.
func (m *ManagerModel) RequestIDs() []uint64 {
	ids := make([]uint64, 0, len(m.reqs))
	for id := range m.reqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (m *ManagerModel) prefixKey(ns string, tokens []int32) string {
	return fmt.Sprintf("%q|%v", ns, tokens)
}

// ---- pages ----

func (m *ManagerModel) numFree() int { return m.cfg.NumPages - len(m.refs) }

func (m *ManagerModel) allocPage() int32 {
	for p := int32(0); int(p) < m.cfg.NumPages; p++ {
		if m.refs[p] == 0 {
			m.refs[p] = 1
			return p
		}
	}
	panic("reference: allocPage with no free page")
}

// unref drops one holder of p and reports whether p became free.
func (m *ManagerModel) unref(p int32) bool {
	m.refs[p]--
	if m.refs[p] == 0 {
		delete(m.refs, p)
		return true
	}
	return false
}

// ---- cache ----

func (m *ManagerModel) listed(e *mgrEntry) bool { return e.idle && e.pins == 0 }

// recheck re-reads page p's holders, as the real cache does when told.
func (m *ManagerModel) recheck(p int32) {
	e := m.byPage[p]
	if e == nil {
		return
	}
	idle := m.refs[p] == 1
	if idle == e.idle {
		return
	}
	e.idle = idle
	if m.listed(e) {
		m.tick++
		e.tick = m.tick
	}
}

func (m *ManagerModel) recheckDeepestFirst(pages []int32) {
	for i := len(pages) - 1; i >= 0; i-- {
		m.recheck(pages[i])
	}
}

func (m *ManagerModel) evictable() int {
	n := 0
	for _, e := range m.entries {
		if m.listed(e) {
			n++
		}
	}
	return n
}

// evict removes the least recently idled entry of the lowest priority,
// with every entry below it, until npages pages are freed or none is left.
func (m *ManagerModel) evict(npages int) int {
	freed := 0
	for freed < npages {
		var v *mgrEntry
		for _, e := range m.entries {
			if m.listed(e) && (v == nil || e.prio < v.prio || e.prio == v.prio && e.tick < v.tick) {
				v = e
			}
		}
		if v == nil {
			break
		}
		m.st.InnerVictims += int64(min(1, m.children(v)))
		for _, e := range m.entries {
			for a := e; a != nil; a = a.parent {
				if a == v {
					e.gone = true
					delete(m.entries, e.key)
					delete(m.byPage, e.page)
					if m.unref(e.page) {
						freed++
						m.st.EvictionFreedPages++
					}
					m.st.EvictedPages++
					break
				}
			}
		}
	}
	return freed
}

func (m *ManagerModel) children(v *mgrEntry) int {
	n := 0
	for _, e := range m.entries {
		if e.parent == v {
			n++
		}
	}
	return n
}

// match returns the cached entries for tokens' leading full pages, at most
// maxPages.
func (m *ManagerModel) match(ns string, tokens []int32, maxPages int) []*mgrEntry {
	var out []*mgrEntry
	ps := m.cfg.PageSize
	for d := 0; d < maxPages && (d+1)*ps <= len(tokens); d++ {
		e := m.entries[m.prefixKey(ns, tokens[:(d+1)*ps])]
		if e == nil {
			break
		}
		out = append(out, e)
	}
	return out
}

// ---- requests ----

func (m *ManagerModel) admit(r *MgrRequestModel) int {
	ps := m.cfg.PageSize
	var matched []*mgrEntry
	if !r.NoCache && len(r.Tokens) > 1 {
		maxPages := (len(r.Tokens) - 1) / ps
		if m.limited {
			maxPages = min(maxPages, m.limit)
		}
		matched = m.match(r.NS, r.Tokens, maxPages)
	}
	r.Pages = nil
	for _, e := range matched {
		m.refs[e.page]++
		r.Pages = append(r.Pages, e.page)
	}
	for _, e := range matched {
		m.recheck(e.page)
		if r.Prio > e.prio {
			e.prio = r.Prio
			if m.listed(e) {
				m.tick++
				e.tick = m.tick
			}
		}
	}
	r.Running = true
	r.ReadTokens += int64(len(matched) * ps)
	m.st.CacheReadTokens += int64(len(matched) * ps)
	r.Computed, r.Length, r.Start = len(matched)*ps, len(matched)*ps, 0
	r.chain, r.CachedPages, r.ChainCut = nil, len(matched), false
	if len(matched) > 0 {
		r.chain = matched[len(matched)-1]
	}
	m.releaseWindow(r)
	return r.Computed
}

// keepFrom returns the first token a request with n tokens on pages must
// still hold: its next query, at n, reads keys from n-W+1 under a window
// of W (the page holding n-W on), and from its chunk's start n/C*C under
// chunked attention of C; everything otherwise.
func (m *ManagerModel) keepFrom(n int) int {
	ps := m.cfg.PageSize
	if w := m.cfg.WindowTokens; w > 0 && n-w > 0 {
		return (n - w) / ps * ps
	}
	if c := m.cfg.ChunkTokens; c > 0 {
		return n / c * c
	}
	return 0
}

func (m *ManagerModel) releaseWindow(r *MgrRequestModel) {
	drop := (m.keepFrom(r.Length) - r.Start) / m.cfg.PageSize
	if drop <= 0 {
		return
	}
	dropped := slices.Clone(r.Pages[:drop])
	r.Pages = slices.Clone(r.Pages[drop:])
	r.Start += drop * m.cfg.PageSize
	for _, p := range dropped {
		m.unref(p)
	}
	m.recheckDeepestFirst(dropped)
	m.st.WindowReleasedPages += int64(drop)
}

func (m *ManagerModel) dropPages(r *MgrRequestModel) {
	held := r.Pages
	for _, p := range held {
		m.unref(p)
	}
	m.recheckDeepestFirst(held)
	r.Pages = nil
}

func validTokens(tokens []int32) error {
	for i, t := range tokens {
		if t < 0 {
			return fmt.Errorf("%w: token %d = %d", ErrMgrBadArgument, i, t)
		}
	}
	return nil
}

// Add admits a request and returns the tokens matched in the cache.
func (m *ManagerModel) Add(id uint64, ns string, prompt []int32, prio int, noCache bool) (int, error) {
	switch {
	case m.pending:
		return 0, ErrMgrStepPending
	case m.reqs[id] != nil:
		return 0, ErrMgrRequestExists
	case prio < 0 || prio >= m.cfg.Priorities:
		return 0, ErrMgrBadArgument
	}
	if err := validTokens(prompt); err != nil {
		return 0, err
	}
	r := &MgrRequestModel{NS: ns, Prio: prio, NoCache: noCache, Tokens: slices.Clone(prompt)}
	matched := m.admit(r)
	m.reqs[id] = r
	delete(m.released, id) // the ID names a new request

	m.st.PromptTokens += int64(len(prompt))
	m.st.PromptHitTokens += int64(matched)
	return matched, nil
}

// existing returns request id for an operation on a request that must
// exist. It makes the checks every such operation makes first, in this
// order: no step pending (ErrMgrStepPending), then the request known
// (ErrMgrUnknownRequest).
func (m *ManagerModel) existing(id uint64) (*MgrRequestModel, error) {
	r := m.reqs[id]
	switch {
	case m.pending:
		return nil, ErrMgrStepPending
	case r == nil:
		return nil, ErrMgrUnknownRequest
	}
	return r, nil
}

// Extend appends known tokens.
func (m *ManagerModel) Extend(id uint64, tokens []int32) error {
	r, err := m.existing(id)
	if err != nil {
		return err
	}
	if err := validTokens(tokens); err != nil {
		return err
	}
	r.Tokens = append(r.Tokens, tokens...)
	return nil
}

// Fork copies a running request, sharing its pages.
func (m *ManagerModel) Fork(parent, child uint64) error {
	p, err := m.existing(parent)
	if err != nil {
		return err
	}
	switch {
	case !p.Running:
		return ErrMgrPreempted
	case m.reqs[child] != nil:
		return ErrMgrRequestExists
	}
	c := *p
	c.ReadTokens, c.WriteTokens = 0, 0
	c.Tokens = slices.Clone(p.Tokens)
	c.Pages = slices.Clone(p.Pages)
	for _, pg := range c.Pages {
		m.refs[pg]++
	}
	m.reqs[child] = &c
	return nil
}

// Release ends a request.
func (m *ManagerModel) Release(id uint64) error {
	r, err := m.existing(id)
	if err != nil {
		return err
	}
	if r.Running {
		m.dropPages(r)
	}
	delete(m.reqs, id)
	if m.released == nil {
		m.released = map[uint64][2]int64{}
	}
	m.released[id] = [2]int64{r.ReadTokens, r.WriteTokens}
	return nil
}

// Usage returns request id's tokens read from and written to the cache:
// a request's so far, or a released one's, which it then forgets.
func (m *ManagerModel) Usage(id uint64) (read, write int64, ok bool) {
	if r := m.reqs[id]; r != nil {
		return r.ReadTokens, r.WriteTokens, true
	}
	u, ok := m.released[id]
	delete(m.released, id)
	return u[0], u[1], ok
}

// Preempt drops a running request's pages and keeps the request.
func (m *ManagerModel) Preempt(id uint64) error {
	r, err := m.existing(id)
	if err != nil {
		return err
	}
	if !r.Running {
		return ErrMgrPreempted
	}
	m.dropPages(r)
	r.Running = false
	r.lost = r.Computed
	r.Computed, r.Length, r.Start = 0, 0, 0
	r.chain, r.CachedPages, r.ChainCut = nil, 0, false
	m.st.Preemptions++
	return nil
}

// Resume re-admits a preempted request.
func (m *ManagerModel) Resume(id uint64) (int, error) {
	r, err := m.existing(id)
	if err != nil {
		return 0, err
	}
	if r.Running {
		return 0, ErrMgrNotPreempted
	}
	matched := m.admit(r)
	m.st.ResumedTokens += int64(r.lost)
	m.st.ResumeHitTokens += int64(min(matched, r.lost))
	r.lost = 0
	return matched, nil
}

// Evict frees idle cached pages until npages pages are free (or none is
// left to evict) and returns how many it freed.
func (m *ManagerModel) Evict(npages int) int {
	if need := npages - m.numFree(); need > 0 {
		return m.evict(need)
	}
	return 0
}

// Pin pins the cached prefix of tokens and returns the pin and the tokens
// it covers.
func (m *ManagerModel) Pin(ns string, tokens []int32) (uint64, int, error) {
	path, err := m.pinPath(ns, tokens)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range path {
		e.pins++
	}
	m.nextPin++
	m.pins[m.nextPin] = path[len(path)-1]
	return m.nextPin, len(path) * m.cfg.PageSize, nil
}

// pinPath returns the entries Pin would pin, or its error.
func (m *ManagerModel) pinPath(ns string, tokens []int32) ([]*mgrEntry, error) {
	path := m.match(ns, tokens, len(tokens)/m.cfg.PageSize)
	if len(path) == 0 {
		return nil, ErrMgrNotCached
	}
	fresh, pinned := 0, 0
	for _, e := range path {
		if e.pins == 0 {
			fresh++
		}
	}
	for _, e := range m.entries {
		if e.pins > 0 {
			pinned++
		}
	}
	if m.cfg.MaxPinnedPages > 0 && pinned+fresh > m.cfg.MaxPinnedPages {
		return nil, ErrMgrPinLimit
	}
	return path, nil
}

// Unpin removes a pin.
func (m *ManagerModel) Unpin(id uint64) error {
	e, ok := m.pins[id]
	if !ok {
		return ErrMgrUnknownPin
	}
	delete(m.pins, id)
	for ; e != nil; e = e.parent {
		e.pins--
		if m.listed(e) {
			m.tick++
			e.tick = m.tick
		}
	}
	return nil
}

// ---- steps ----

// Reserve reserves a step and returns the number of copy-on-write copies.
func (m *ManagerModel) Reserve(ids []uint64, ntokens []int32) (copies int, err error) {
	return m.ReserveSpec(ids, ntokens, nil)
}

// ReserveSpec reserves a speculative step: ntokens[i] known tokens, then
// the draft tokens drafts[i], of request ids[i].
func (m *ManagerModel) ReserveSpec(ids []uint64, ntokens []int32, drafts [][]int32) (copies int, err error) {
	if m.pending {
		return 0, ErrMgrStepPending
	}
	if len(ids) != len(ntokens) || drafts != nil && len(drafts) != len(ids) {
		return 0, ErrMgrBadArgument
	}
	seen := map[uint64]bool{}
	for i, id := range ids {
		r := m.reqs[id]
		switch {
		case r == nil:
			return 0, ErrMgrUnknownRequest
		case !r.Running:
			return 0, ErrMgrPreempted
		case seen[id]:
			return 0, ErrMgrBadArgument
		case ntokens[i] < 0 || r.Computed+int(ntokens[i]) > len(r.Tokens):
			return 0, ErrMgrBadArgument
		}
		if drafts != nil && len(drafts[i]) > 0 {
			if r.Computed+int(ntokens[i]) != len(r.Tokens) || len(drafts[i]) > 1<<12 {
				return 0, ErrMgrBadArgument
			}
			if err := validTokens(drafts[i]); err != nil {
				return 0, err
			}
		}
		seen[id] = true
	}
	counts := slices.Clone(ntokens)
	m.stepDrafts = make([][]int32, len(ids))
	for i := range ids {
		if drafts != nil {
			counts[i] += int32(len(drafts[i]))
			m.stepDrafts[i] = slices.Clone(drafts[i])
		}
	}
	need, cow := m.stepNeed(ids, counts)
	if need > m.numFree() {
		if need > m.numFree()+m.evictable() {
			return 0, ErrMgrOutOfPages
		}
		m.evict(need - m.numFree())
		need, cow = m.stepNeed(ids, counts) // an evicted partial page needs no copy
	}
	m.snapshot = m.save(ids)
	for i, id := range ids {
		r := m.reqs[id]
		r.Tokens = append(r.Tokens, m.stepDrafts[i]...)
	}
	return m.reserve(ids, counts, cow), nil
}

// stepNeed returns the pages a step takes and which members copy.
func (m *ManagerModel) stepNeed(ids []uint64, ntokens []int32) (need int, cow []bool) {
	// Which requests copy their shared partial last page: with the counts
	// before the step, of k members sharing one, the first k-1 copy unless
	// holders outside the step keep it shared anyway.
	ps := m.cfg.PageSize
	cow = make([]bool, len(ids))
	copiedAway := map[int32]int{}
	for i, id := range ids {
		r := m.reqs[id]
		n := int(ntokens[i])
		held := r.Length - r.Start
		need += (held+n+ps-1)/ps - len(r.Pages)
		if n > 0 && held%ps != 0 {
			last := r.Pages[len(r.Pages)-1]
			if m.refs[last]-copiedAway[last] > 1 {
				cow[i] = true
				copiedAway[last]++
				need++
			}
		}
	}
	return need, cow
}

// reserve applies a step that has its pages.
func (m *ManagerModel) reserve(ids []uint64, ntokens []int32, cow []bool) (copies int) {
	ps := m.cfg.PageSize
	for i, id := range ids {
		r := m.reqs[id]
		n := int(ntokens[i])
		if cow[i] {
			old := r.Pages[len(r.Pages)-1]
			r.Pages[len(r.Pages)-1] = m.allocPage()
			m.unref(old)
			m.recheck(old)
			copies++
		}
		for (r.Length-r.Start+n+ps-1)/ps > len(r.Pages) {
			r.Pages = append(r.Pages, m.allocPage())
		}
		r.Length += n
	}
	m.pending = true
	m.stepIDs, m.stepTokens = slices.Clone(ids), slices.Clone(ntokens)
	m.st.CopiedPages += int64(copies)
	return copies
}

// checkSampled refuses sampled tokens that do not fit the current step:
// not one per request (nil: none), or a token (not -1) for a request the
// step does not complete.
func (m *ManagerModel) checkSampled(sampled []int32) error {
	if sampled != nil && len(sampled) != len(m.stepIDs) {
		return ErrMgrBadArgument
	}
	for b, t := range sampled {
		r := m.reqs[m.stepIDs[b]]
		if t != -1 && (t < 0 || r.Computed+int(m.stepTokens[b]) != len(r.Tokens)) {
			return ErrMgrBadArgument
		}
	}
	return nil
}

// Commit records the reserved step.
func (m *ManagerModel) Commit(sampled []int32) error {
	if !m.pending {
		return ErrMgrNoStep
	}
	for _, d := range m.stepDrafts {
		if len(d) > 0 {
			return ErrMgrBadArgument
		}
	}
	if err := m.checkSampled(sampled); err != nil {
		return err
	}
	for b, id := range m.stepIDs {
		r := m.reqs[id]
		r.Computed += int(m.stepTokens[b])
		m.st.ComputedTokens += int64(m.stepTokens[b])
		m.publish(r)
		if sampled != nil && sampled[b] != -1 {
			r.Tokens = append(r.Tokens, sampled[b])
		}
		m.releaseWindow(r)
	}
	m.pending = false
	m.st.Steps++
	return nil
}

// publish caches r's newly filled pages in order.
func (m *ManagerModel) publish(r *MgrRequestModel) {
	if r.NoCache || r.ChainCut {
		return
	}
	ps := m.cfg.PageSize
	for d := r.CachedPages; d < r.Computed/ps; d++ {
		if r.chain != nil && r.chain.gone {
			r.ChainCut = true
			m.st.ChainsCut++
			return
		}
		key := m.prefixKey(r.NS, r.Tokens[:(d+1)*ps])
		if e := m.entries[key]; e != nil {
			m.st.DuplicatePages++
			r.chain = e
		} else {
			page := r.Pages[d-r.Start/ps]
			e := &mgrEntry{key: key, parent: r.chain, page: page, prio: r.Prio}
			m.entries[key] = e
			m.byPage[page] = e
			m.refs[page]++
			m.recheck(page)
			m.st.PublishedPages++
			r.WriteTokens += int64(ps)
			m.st.CacheWriteTokens += int64(ps)
			r.chain = e
		}
		r.CachedPages++
	}
}

// Abort undoes the reserved step.
func (m *ManagerModel) Abort() error {
	if !m.pending {
		return ErrMgrNoStep
	}
	ps := m.cfg.PageSize
	for b, id := range m.stepIDs {
		r := m.reqs[id]
		r.Length -= int(m.stepTokens[b])
		keep := (r.Length - r.Start + ps - 1) / ps
		for _, p := range r.Pages[keep:] {
			m.unref(p)
		}
		r.Pages = slices.Clone(r.Pages[:keep])
		r.Tokens = r.Tokens[:len(r.Tokens)-len(m.stepDrafts[b])]
	}
	m.pending = false
	return nil
}

// Stats returns the model's view of the Manager's Stats.
func (m *ManagerModel) Stats() ManagerModelStats {
	s := m.st
	s.TotalPages = m.cfg.NumPages
	s.FreePages = m.numFree()
	for _, e := range m.entries {
		switch {
		case e.idle && e.pins == 0:
			s.EvictablePages++
		case e.idle:
			s.PinnedIdlePages++
		}
		if e.pins > 0 {
			s.PinnedPages++
		}
	}
	s.CachedPages = len(m.entries)
	s.UsedPages = len(m.refs) - s.EvictablePages - s.PinnedIdlePages
	for _, n := range m.refs {
		if n >= 2 {
			s.SharedPages++
		}
	}
	s.Requests = len(m.reqs)
	for _, r := range m.reqs {
		if !r.Running {
			s.PreemptedRequests++
		}
	}
	return s
}
