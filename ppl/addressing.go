package ppl

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/kernels"
)

// Addressing is where the keys and values of a batch of B requests live: the
// kvstarts and cachestarts inputs of the PPL operator.
//
// Request b has kv_len_b = KVStarts[b+1] - KVStarts[b] keys, at positions
// 0..kv_len_b-1 of its sequence; they are rows KVStarts[b]:KVStarts[b+1] of
// the operator's packed outputs. Position p lives in token slot
//
//	ModeOffset:    CacheStarts[b] + p
//	ModePageTable: CacheStarts[b*MaxPages + p/page_size] + p%page_size
//
// of the cache (per layer, K and V alike). In ModePageTable only the first
// ceil(kv_len_b/page_size) columns of row b are read.
type Addressing struct {
	KVStarts    []int64 // [B+1], KVStarts[0] == 0, non-decreasing
	CacheStarts []int64 // ModeOffset: [B]; ModePageTable: [B*MaxPages], row-major (B, MaxP)
	MaxPages    int     // MaxP: columns of CacheStarts in ModePageTable; 0 in ModeOffset
}

// BatchSize is B, len(KVStarts)-1 (0 for an empty KVStarts).
func (a *Addressing) BatchSize() int { return max(len(a.KVStarts)-1, 0) }

// KVLen is kv_len of request b (no validation).
func (a *Addressing) KVLen(b int) int64 { return a.KVStarts[b+1] - a.KVStarts[b] }

// Slot is the token slot of position pos of request b (no validation).
func (g Geometry) Slot(a *Addressing, b int, pos int64) int64 {
	if g.Mode == ModeOffset {
		return a.CacheStarts[b] + pos
	}
	n := int64(g.PageSize)
	return a.CacheStarts[int64(b)*int64(a.MaxPages)+pos/n] + pos%n
}

// validateStarts checks that starts has length B+1, starts at 0 and does not
// decrease: the shape of seqstarts and kvstarts.
func validateStarts(name string, starts []int64, B int) error {
	if len(starts) != B+1 {
		return fmt.Errorf("%w: %s has length %d, want batch+1 = %d", ErrInvalidStarts, name, len(starts), B+1)
	}
	if starts[0] != 0 {
		return fmt.Errorf("%w: %s[0] = %d, want 0", ErrInvalidStarts, name, starts[0])
	}
	for b := 0; b < B; b++ {
		if starts[b+1] < starts[b] {
			return fmt.Errorf("%w: %s decreases at request %d: %d > %d", ErrInvalidStarts, name, b, starts[b], starts[b+1])
		}
	}
	return nil
}

// pageCount is ceil(n/size) for n >= 0 (without overflow near MaxInt64).
func pageCount(n int64, size int) int64 {
	q := n / int64(size)
	if n%int64(size) != 0 {
		q++
	}
	return q
}

// ValidateAddressing checks a against the geometry for a batch of B
// requests: KVStarts well-formed, CacheStarts of the mode's length, and every
// slot a request's keys occupy inside [0, MaxT). In ModePageTable a request
// may not need more than MaxPages pages. It does not read unused
// CacheStarts columns and does not reject requests that share slots.
func (g Geometry) ValidateAddressing(a *Addressing, B int) error {
	maxT := int64(g.MaxTokens)
	if g.Mode == ModePageTable {
		return checkPageTable(a, B, g.PageSize, func(b int, j, start, used int64) error {
			if start < 0 || start > maxT-used {
				return fmt.Errorf("%w: request %d: cachestarts[%d, %d] = %d, a page holding %d tokens, leaves [0, MaxT %d)", ErrOutOfRange, b, b, j, start, used, maxT)
			}
			return nil
		})
	}
	if err := validateStarts("kvstarts", a.KVStarts, B); err != nil {
		return err
	}
	if len(a.CacheStarts) != B {
		return fmt.Errorf("%w: cachestarts has length %d, want batch %d (offset mode)", ErrInvalidStarts, len(a.CacheStarts), B)
	}
	for b := 0; b < B; b++ {
		start, n := a.CacheStarts[b], a.KVLen(b)
		if n > 0 && (start < 0 || start > maxT-n) {
			return fmt.Errorf("%w: request %d: cachestarts[%d] = %d with kv_len %d leaves [0, MaxT %d)", ErrOutOfRange, b, b, start, n, maxT)
		}
	}
	return nil
}

// checkPageTable checks a as page-table addressing of B requests with pages
// of pageSize slots (kvstarts well-formed, cachestarts (B, MaxPages), no
// request needing more than MaxPages pages) and calls page for every page
// the requests' keys use: column j of request b, its start slot and the
// number of keys on it. It stops at the first error.
func checkPageTable(a *Addressing, B, pageSize int, page func(b int, j, start, used int64) error) error {
	if err := validateStarts("kvstarts", a.KVStarts, B); err != nil {
		return err
	}
	if a.MaxPages < 0 || (B > 0 && a.MaxPages > math.MaxInt/B) || len(a.CacheStarts) != B*a.MaxPages {
		return fmt.Errorf("%w: cachestarts has length %d, want batch %d x MaxP %d (page-table mode)", ErrInvalidStarts, len(a.CacheStarts), B, a.MaxPages)
	}
	N := int64(pageSize)
	for b := 0; b < B; b++ {
		n := a.KVLen(b)
		pages := pageCount(n, pageSize)
		if pages > int64(a.MaxPages) {
			return fmt.Errorf("%w: request %d: kv_len %d needs %d pages of %d, cachestarts has MaxP %d columns", ErrOutOfRange, b, n, pages, N, a.MaxPages)
		}
		for j := int64(0); j < pages; j++ {
			if err := page(b, j, a.CacheStarts[int64(b)*int64(a.MaxPages)+j], min(N, n-j*N)); err != nil {
				return err
			}
		}
	}
	return nil
}

// CSRFromPageTable converts page-table addressing (ModePageTable, pages of
// pageSize slots) into FlashInfer's CSR page table for the same pages: page
// id = page start / pageSize, KVIndptr[b+1]-KVIndptr[b] = ceil(kv_len_b /
// pageSize), and KVLastPageLen[b] = kv_len_b - (pages-1)*pageSize (0 for a
// request with no keys). Page starts must be multiples of pageSize
// (ErrUnalignedPage) and page ids and counts must fit int32 (ErrOutOfRange).
//
// dst's slices are overwritten, reusing their capacity (no allocation when
// it suffices). On error dst is unchanged.
func CSRFromPageTable(dst *kernels.PageTable, a *Addressing, pageSize int) error {
	if pageSize < 1 {
		return fmt.Errorf("%w: page_size %d < 1", ErrInvalidGeometry, pageSize)
	}
	B := a.BatchSize()
	N := int64(pageSize)
	var total int64
	err := checkPageTable(a, B, pageSize, func(b int, j, start, _ int64) error {
		switch {
		case start < 0:
			return fmt.Errorf("%w: request %d: cachestarts[%d, %d] = %d < 0", ErrOutOfRange, b, b, j, start)
		case start%N != 0:
			return fmt.Errorf("%w: request %d: cachestarts[%d, %d] = %d, page_size %d", ErrUnalignedPage, b, b, j, start, N)
		case start/N > math.MaxInt32:
			return fmt.Errorf("%w: request %d: cachestarts[%d, %d] = %d is page %d, past int32", ErrOutOfRange, b, b, j, start, start/N)
		}
		if total++; total > math.MaxInt32 {
			return fmt.Errorf("%w: more than 2^31-1 pages in the batch by request %d, past int32 kv_indptr", ErrOutOfRange, b)
		}
		return nil
	})
	if err != nil {
		return err
	}
	indptr := append(dst.KVIndptr[:0], 0)
	indices := dst.KVPageIndices[:0]
	last := dst.KVLastPageLen[:0]
	for b := 0; b < B; b++ {
		n := a.KVLen(b)
		pages := pageCount(n, pageSize)
		for j := int64(0); j < pages; j++ {
			indices = append(indices, int32(a.CacheStarts[int64(b)*int64(a.MaxPages)+j]/N))
		}
		indptr = append(indptr, int32(len(indices)))
		l := int32(0)
		if pages > 0 {
			l = int32(n - (pages-1)*N)
		}
		last = append(last, l)
	}
	dst.KVIndptr, dst.KVPageIndices, dst.KVLastPageLen = indptr, indices, last
	return nil
}

// CSRFromOffsets converts offset addressing (ModeOffset) into a FlashInfer
// CSR page table with page_size 1: request b's pages are the slots
// CacheStarts[b] .. CacheStarts[b]+kv_len_b-1, each its own page id. Slots
// must be non-negative and below 2^31. dst is reused as in
// [CSRFromPageTable] and unchanged on error.
func CSRFromOffsets(dst *kernels.PageTable, a *Addressing) error {
	B := a.BatchSize()
	if err := validateStarts("kvstarts", a.KVStarts, B); err != nil {
		return err
	}
	if len(a.CacheStarts) != B {
		return fmt.Errorf("%w: cachestarts has length %d, want batch %d (offset mode)", ErrInvalidStarts, len(a.CacheStarts), B)
	}
	if a.KVStarts[B] > math.MaxInt32 {
		return fmt.Errorf("%w: %d keys in the batch, past int32 kv_indptr", ErrOutOfRange, a.KVStarts[B])
	}
	for b := 0; b < B; b++ {
		start, n := a.CacheStarts[b], a.KVLen(b)
		if n > 0 && (start < 0 || start > math.MaxInt32+1-n) {
			return fmt.Errorf("%w: request %d: cachestarts[%d] = %d with kv_len %d leaves int32 page ids", ErrOutOfRange, b, b, start, n)
		}
	}
	indptr := append(dst.KVIndptr[:0], 0)
	indices := dst.KVPageIndices[:0]
	last := dst.KVLastPageLen[:0]
	for b := 0; b < B; b++ {
		n := a.KVLen(b)
		for p := int64(0); p < n; p++ {
			indices = append(indices, int32(a.CacheStarts[b]+p))
		}
		indptr = append(indptr, int32(len(indices)))
		last = append(last, int32(min(n, 1)))
	}
	dst.KVIndptr, dst.KVPageIndices, dst.KVLastPageLen = indptr, indices, last
	return nil
}

// PageTableFromCSR converts a FlashInfer CSR page table (pages of pageSize
// tokens) into page-table addressing with maxPages columns: page id p starts
// at slot p*pageSize, kv_len_b = get_length(b), and unused columns hold -1.
// maxPages 0 means the largest page count of any request. The table must be
// valid CSR (kernels.PageTable.Validate) and no request may have more than
// maxPages pages. dst's slices are reused as in [CSRFromPageTable] and dst is
// unchanged on error.
func PageTableFromCSR(dst *Addressing, csr *kernels.PageTable, pageSize, maxPages int) error {
	if pageSize < 1 {
		return fmt.Errorf("%w: page_size %d < 1", ErrInvalidGeometry, pageSize)
	}
	if maxPages < 0 {
		return fmt.Errorf("%w: MaxP %d < 0", ErrInvalidStarts, maxPages)
	}
	if err := csr.Validate(pageSize, math.MaxInt32+1); err != nil {
		return err
	}
	B := csr.BatchSize()
	need := 0
	for b := 0; b < B; b++ {
		need = max(need, int(csr.KVIndptr[b+1]-csr.KVIndptr[b]))
	}
	if maxPages == 0 {
		maxPages = need
	}
	if need > maxPages {
		return fmt.Errorf("%w: a request has %d pages, MaxP is %d", ErrOutOfRange, need, maxPages)
	}
	if B > 0 && maxPages > math.MaxInt/B {
		return fmt.Errorf("%w: batch %d x MaxP %d cachestarts entries do not fit in memory", ErrOutOfRange, B, maxPages)
	}
	starts := dst.KVStarts[:0]
	cache := dst.CacheStarts[:0]
	var kv int64
	starts = append(starts, 0)
	for b := 0; b < B; b++ {
		pages := csr.KVPageIndices[csr.KVIndptr[b]:csr.KVIndptr[b+1]]
		for _, p := range pages {
			cache = append(cache, int64(p)*int64(pageSize))
		}
		for j := len(pages); j < maxPages; j++ {
			cache = append(cache, -1)
		}
		kv += int64(csr.SeqLen(b, pageSize))
		starts = append(starts, kv)
	}
	dst.KVStarts, dst.CacheStarts, dst.MaxPages = starts, cache, maxPages
	return nil
}
