package reference

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
)

// This file models the page allocator and the page table (packages allocator
// and pagetable). Pages are plain int32 IDs and sequences plain uint64 IDs,
// so the model does not depend on the types it checks. Where the real code
// is free to pick any free page, the model picks the lowest free ID; tests
// compare the two up to a renaming of pages.

// Errors returned by the models, one per class of failure of the real code.
var (
	ErrModelOutOfPages  = errors.New("reference: out of pages")
	ErrModelBadPage     = errors.New("reference: bad page")
	ErrModelUnknownSeq  = errors.New("reference: unknown sequence")
	ErrModelSeqExists   = errors.New("reference: sequence exists")
	ErrModelBadArgument = errors.New("reference: bad argument")
	ErrModelBadCSR      = errors.New("reference: bad CSR")
)

// PageAllocModel is a pool of NumPages pages with reference counts.
type PageAllocModel struct {
	NumPages int
	// Refs holds the allocated pages and their holder counts (>= 1); a page
	// absent from the map is free.
	Refs map[int32]int
}

// NewPageAllocModel returns a pool of numPages free pages.
func NewPageAllocModel(numPages int) *PageAllocModel {
	return &PageAllocModel{NumPages: numPages, Refs: map[int32]int{}}
}

// Clone returns an independent copy.
func (m *PageAllocModel) Clone() *PageAllocModel {
	return &PageAllocModel{NumPages: m.NumPages, Refs: maps.Clone(m.Refs)}
}

// NumFree returns the number of free pages.
func (m *PageAllocModel) NumFree() int { return m.NumPages - len(m.Refs) }

// NumShared returns the number of pages with two or more holders.
func (m *PageAllocModel) NumShared() int {
	n := 0
	for _, r := range m.Refs {
		if r >= 2 {
			n++
		}
	}
	return n
}

// RefCount returns the holders of page p (0 if free or outside the pool).
func (m *PageAllocModel) RefCount(p int32) int { return m.Refs[p] }

// Alloc allocates the n lowest free pages with one holder each, or none.
func (m *PageAllocModel) Alloc(n int) ([]int32, error) {
	if n > m.NumFree() {
		return nil, fmt.Errorf("%w: need %d, %d free", ErrModelOutOfPages, n, m.NumFree())
	}
	var out []int32
	for p := int32(0); len(out) < n; p++ {
		if m.Refs[p] == 0 {
			out = append(out, p)
		}
	}
	for _, p := range out {
		m.Refs[p] = 1
	}
	return out, nil
}

// Retain adds a holder to each listed page; all must be allocated.
func (m *PageAllocModel) Retain(pages ...int32) error {
	for _, p := range pages {
		if m.Refs[p] == 0 {
			return fmt.Errorf("%w: retain page %d: not allocated", ErrModelBadPage, p)
		}
	}
	for _, p := range pages {
		m.Refs[p]++
	}
	return nil
}

// Release removes a holder from each listed page (a page listed k times
// loses k) and frees pages left with none; all-or-nothing.
func (m *PageAllocModel) Release(pages ...int32) (freed int, err error) {
	count := map[int32]int{}
	for _, p := range pages {
		count[p]++
	}
	for p, k := range count {
		if m.Refs[p] < k {
			return 0, fmt.Errorf("%w: release page %d %d times, it has %d holders", ErrModelBadPage, p, k, m.Refs[p])
		}
	}
	for p, k := range count {
		m.Refs[p] -= k
		if m.Refs[p] == 0 {
			delete(m.Refs, p)
			freed++
		}
	}
	return freed, nil
}

// SeqModel is one sequence: Pages hold tokens [Start, Len) in order.
type SeqModel struct {
	Pages      []int32
	Len, Start int
}

// CopyOpModel is a copy-on-write page copy: entries [0, Entries) of Src to Dst.
type CopyOpModel struct {
	Src, Dst, Entries int32
}

// CSRModel is FlashInfer's page table for a batch.
type CSRModel struct {
	KVIndptr, KVPageIndices, KVLastPageLen, SeqLens []int32
}

// AppendCSRModel is the row layout of an append step.
type AppendCSRModel struct {
	AppendIndptr, BatchIndices, Positions []int32
}

// PageTableModel is a page table over a PageAllocModel.
type PageTableModel struct {
	PageSize int
	Alloc    *PageAllocModel
	Seqs     map[uint64]*SeqModel
}

// NewPageTableModel returns an empty table over a fresh pool.
func NewPageTableModel(pageSize, numPages int) *PageTableModel {
	return &PageTableModel{PageSize: pageSize, Alloc: NewPageAllocModel(numPages), Seqs: map[uint64]*SeqModel{}}
}

// Clone returns an independent copy (allocator included).
func (m *PageTableModel) Clone() *PageTableModel {
	c := &PageTableModel{PageSize: m.PageSize, Alloc: m.Alloc.Clone(), Seqs: map[uint64]*SeqModel{}}
	for id, s := range m.Seqs {
		c.Seqs[id] = &SeqModel{Pages: slices.Clone(s.Pages), Len: s.Len, Start: s.Start}
	}
	return c
}

func (m *PageTableModel) seq(op string, id uint64) (*SeqModel, error) {
	s, ok := m.Seqs[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s %d", ErrModelUnknownSeq, op, id)
	}
	return s, nil
}

// Add adds an empty sequence.
func (m *PageTableModel) Add(id uint64) error {
	if _, ok := m.Seqs[id]; ok {
		return fmt.Errorf("%w: %d", ErrModelSeqExists, id)
	}
	m.Seqs[id] = &SeqModel{}
	return nil
}

// AddShared adds a sequence holding ntokens tokens on existing pages.
func (m *PageTableModel) AddShared(id uint64, pages []int32, ntokens int) error {
	if _, ok := m.Seqs[id]; ok {
		return fmt.Errorf("%w: %d", ErrModelSeqExists, id)
	}
	// The pages must be exactly enough for ntokens: the last one non-empty.
	if ntokens < 0 || ntokens > math.MaxInt32 || len(pages)*m.PageSize < ntokens ||
		(len(pages) > 0 && (len(pages)-1)*m.PageSize >= ntokens) {
		return fmt.Errorf("%w: %d tokens on %d pages", ErrModelBadArgument, ntokens, len(pages))
	}
	seen := map[int32]bool{}
	for _, p := range pages {
		if seen[p] {
			return fmt.Errorf("%w: page %d listed twice", ErrModelBadArgument, p)
		}
		seen[p] = true
	}
	if err := m.Alloc.Retain(pages...); err != nil {
		return err
	}
	m.Seqs[id] = &SeqModel{Pages: slices.Clone(pages), Len: ntokens}
	return nil
}

// Reserve appends ntokens[i] tokens to ids[i], one token at a time, on a copy
// of the model that replaces the model only if the whole batch succeeds. A
// token goes to a fresh page when the held tokens fill whole pages; otherwise
// it goes into the last page, which is first copied to a fresh page if
// anyone else holds it.
func (m *PageTableModel) Reserve(ids []uint64, ntokens []int32) ([]CopyOpModel, error) {
	if len(ids) != len(ntokens) {
		return nil, fmt.Errorf("%w: %d ids, %d counts", ErrModelBadArgument, len(ids), len(ntokens))
	}
	seen := map[uint64]bool{}
	for i, id := range ids {
		s, err := m.seq("reserve", id)
		if err != nil {
			return nil, err
		}
		if seen[id] || ntokens[i] < 0 || int64(s.Len)+int64(ntokens[i]) > math.MaxInt32 {
			return nil, fmt.Errorf("%w: ids[%d] = %d, ntokens %d", ErrModelBadArgument, i, id, ntokens[i])
		}
		seen[id] = true
	}
	c := m.Clone()
	var ops []CopyOpModel
	for i, id := range ids {
		s := c.Seqs[id]
		for range ntokens[i] {
			held := s.Len - s.Start
			if held%c.PageSize == 0 {
				p, err := c.Alloc.Alloc(1)
				if err != nil {
					return nil, err
				}
				s.Pages = append(s.Pages, p[0])
			} else if last := len(s.Pages) - 1; c.Alloc.RefCount(s.Pages[last]) > 1 {
				p, err := c.Alloc.Alloc(1)
				if err != nil {
					return nil, err
				}
				ops = append(ops, CopyOpModel{Src: s.Pages[last], Dst: p[0], Entries: int32(held % c.PageSize)})
				if _, err := c.Alloc.Release(s.Pages[last]); err != nil {
					return nil, err
				}
				s.Pages[last] = p[0]
			}
			s.Len++
		}
	}
	*m = *c
	return ops, nil
}

// Fork adds child as a copy of parent sharing all its pages.
func (m *PageTableModel) Fork(parent, child uint64) error {
	p, err := m.seq("fork", parent)
	if err != nil {
		return err
	}
	if _, ok := m.Seqs[child]; ok {
		return fmt.Errorf("%w: %d", ErrModelSeqExists, child)
	}
	if err := m.Alloc.Retain(p.Pages...); err != nil {
		return err
	}
	m.Seqs[child] = &SeqModel{Pages: slices.Clone(p.Pages), Len: p.Len, Start: p.Start}
	return nil
}

// Truncate shortens a sequence to ntokens tokens (Start <= ntokens <= Len),
// dropping one token at a time and releasing a page when it empties.
func (m *PageTableModel) Truncate(id uint64, ntokens int) error {
	s, err := m.seq("truncate", id)
	if err != nil {
		return err
	}
	if ntokens < s.Start || ntokens > s.Len {
		return fmt.Errorf("%w: truncate %d to %d", ErrModelBadArgument, id, ntokens)
	}
	for s.Len > ntokens {
		s.Len--
		if (s.Len-s.Start)%m.PageSize == 0 {
			last := len(s.Pages) - 1
			if _, err := m.Alloc.Release(s.Pages[last]); err != nil {
				return err
			}
			s.Pages = s.Pages[:last]
		}
	}
	return nil
}

// Release removes a sequence and releases its pages.
func (m *PageTableModel) Release(id uint64) error {
	s, err := m.seq("release", id)
	if err != nil {
		return err
	}
	if _, err := m.Alloc.Release(s.Pages...); err != nil {
		return err
	}
	delete(m.Seqs, id)
	return nil
}

// ReleaseWindow releases, one at a time, leading pages all of whose tokens
// come before the last windowTokens tokens.
func (m *PageTableModel) ReleaseWindow(id uint64, windowTokens int) (int, error) {
	s, err := m.seq("release window", id)
	if err != nil {
		return 0, err
	}
	if windowTokens < 0 {
		return 0, fmt.Errorf("%w: window %d", ErrModelBadArgument, windowTokens)
	}
	released := 0
	// The first held page covers tokens [Start, Start+PageSize).
	for len(s.Pages) > 0 && s.Start+m.PageSize <= s.Len-windowTokens {
		if _, err := m.Alloc.Release(s.Pages[0]); err != nil {
			return 0, err
		}
		s.Pages = s.Pages[1:]
		s.Start += m.PageSize
		released++
	}
	return released, nil
}

// Export returns FlashInfer's page table for the sequences ids, in order.
func (m *PageTableModel) Export(ids []uint64) (CSRModel, error) {
	out := CSRModel{KVIndptr: []int32{0}}
	for _, id := range ids {
		s, err := m.seq("export", id)
		if err != nil {
			return CSRModel{}, err
		}
		out.KVPageIndices = append(out.KVPageIndices, s.Pages...)
		out.KVIndptr = append(out.KVIndptr, int32(len(out.KVPageIndices)))
		held := s.Len - s.Start
		last := 0
		if len(s.Pages) > 0 {
			last = held - (len(s.Pages)-1)*m.PageSize
		}
		out.KVLastPageLen = append(out.KVLastPageLen, int32(last))
		out.SeqLens = append(out.SeqLens, int32(held))
	}
	return out, nil
}

// ExportAppend returns the row layout of the last appendLens[i] held tokens
// of each sequence ids[i].
func (m *PageTableModel) ExportAppend(ids []uint64, appendLens []int32) (AppendCSRModel, error) {
	if len(ids) != len(appendLens) {
		return AppendCSRModel{}, fmt.Errorf("%w: %d ids, %d lengths", ErrModelBadArgument, len(ids), len(appendLens))
	}
	out := AppendCSRModel{AppendIndptr: []int32{0}}
	for i, id := range ids {
		s, err := m.seq("export append", id)
		if err != nil {
			return AppendCSRModel{}, err
		}
		held := s.Len - s.Start
		n := int(appendLens[i])
		if n < 0 || n > held {
			return AppendCSRModel{}, fmt.Errorf("%w: appendLens[%d] = %d, %d held", ErrModelBadArgument, i, n, held)
		}
		for pos := held - n; pos < held; pos++ {
			out.BatchIndices = append(out.BatchIndices, int32(i))
			out.Positions = append(out.Positions, int32(pos))
		}
		out.AppendIndptr = append(out.AppendIndptr, int32(len(out.Positions)))
	}
	return out, nil
}

// CheckCSRSlow reports the first way in which a page table breaks FlashInfer's
// rules (see pagetable.ValidateCSR), checking each rule on its own.
func CheckCSRSlow(kvIndptr, kvPageIndices, kvLastPageLen []int32, pageSize, numPages int) error {
	if pageSize < 1 || pageSize > 1<<16 {
		return fmt.Errorf("%w: page size %d", ErrModelBadCSR, pageSize)
	}
	if len(kvIndptr) == 0 || kvIndptr[0] != 0 {
		return fmt.Errorf("%w: kv_indptr must start with 0", ErrModelBadCSR)
	}
	b := len(kvIndptr) - 1
	for i := range b {
		if kvIndptr[i+1] < kvIndptr[i] {
			return fmt.Errorf("%w: kv_indptr decreases at %d", ErrModelBadCSR, i)
		}
	}
	if len(kvLastPageLen) != b {
		return fmt.Errorf("%w: %d last page lengths for %d requests", ErrModelBadCSR, len(kvLastPageLen), b)
	}
	for i := range b {
		npages := int64(kvIndptr[i+1]) - int64(kvIndptr[i])
		last := int64(kvLastPageLen[i])
		if npages == 0 && last != 0 {
			return fmt.Errorf("%w: request %d has no pages, last page len %d", ErrModelBadCSR, i, last)
		}
		if npages > 0 && (last < 1 || last > int64(pageSize)) {
			return fmt.Errorf("%w: request %d last page len %d", ErrModelBadCSR, i, last)
		}
		if npages > 0 && (npages-1)*int64(pageSize)+last > math.MaxInt32 {
			return fmt.Errorf("%w: request %d too long", ErrModelBadCSR, i)
		}
	}
	if int(kvIndptr[b]) != len(kvPageIndices) {
		return fmt.Errorf("%w: %d page indices, kv_indptr ends at %d", ErrModelBadCSR, len(kvPageIndices), kvIndptr[b])
	}
	if int64(kvIndptr[b])*int64(pageSize) >= 1<<32 {
		return fmt.Errorf("%w: 32-bit token offsets overflow", ErrModelBadCSR)
	}
	for k, p := range kvPageIndices {
		if p < 0 || int(p) >= numPages {
			return fmt.Errorf("%w: page %d at %d", ErrModelBadCSR, p, k)
		}
	}
	return nil
}

// SeqLensSlow computes flashinfer.page.get_seq_lens by counting: a request
// with pages holds a full page for every page but the last, plus the last
// page's entries; a request with no pages holds kv_last_page_len tokens, as
// the Python function (not the kernel) says.
func SeqLensSlow(kvIndptr, kvLastPageLen []int32, pageSize int) []int32 {
	out := make([]int32, len(kvLastPageLen))
	for b := range kvLastPageLen {
		n := int32(0)
		for k := kvIndptr[b]; k+1 < kvIndptr[b+1]; k++ {
			n += int32(pageSize)
		}
		out[b] = n + kvLastPageLen[b]
	}
	return out
}

// BatchIndicesPositionsSlow computes flashinfer.page.get_batch_indices_positions
// row by row: the rows of request b are the last appendLen rows of its
// seqLens[b] tokens.
func BatchIndicesPositionsSlow(appendIndptr, seqLens []int32) (batchIndices, positions []int32) {
	for b := range seqLens {
		appendLen := appendIndptr[b+1] - appendIndptr[b]
		for k := range appendLen {
			batchIndices = append(batchIndices, int32(b))
			positions = append(positions, seqLens[b]-appendLen+k)
		}
	}
	return batchIndices, positions
}
