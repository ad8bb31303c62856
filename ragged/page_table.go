package ragged

import (
	"errors"
	"fmt"
	"math"
)

// ErrBadPageTable: a paged-KV CSR page table (kv_indptr, kv_indices,
// kv_last_page_len) breaks a rule FlashInfer's kernels assume but do not
// check. It is the one sentinel of [ValidatePageTable], and the same error
// as pagetable.ErrBadCSR and kernels.ErrInvalidPageTable; its text names no
// package because all three return it.
var ErrBadPageTable = errors.New("invalid page table")

// AnyPageID is a [PageTableCheck.NumPages] for a table checked without a
// pool: it admits every non-negative int32 page id.
const AnyPageID = math.MaxInt32 + 1

// PageTableCheck is what [ValidatePageTable] checks a page table against.
// The zero value of each flag is the stricter rule.
type PageTableCheck struct {
	// PageSize is the tokens per page; it must be >= 1.
	PageSize int
	// NumPages is the pool: every page id of kv_indices[:kv_indptr[B]]
	// must lie in [0, NumPages) (AnyPageID: any id >= 0).
	NumPages int
	// IndicesMayBeLonger accepts a kv_indices longer than kv_indptr[B]
	// (FlashInfer reads only its first kv_indptr[B] ids, so a kernel may be
	// given a larger buffer); otherwise the lengths must be equal.
	IndicesMayBeLonger bool
	// LastPageLenOptional accepts a nil kv_last_page_len (MLA's kernels
	// take kv_len or positions instead); a non-nil one is checked in full.
	LastPageLenOptional bool
}

// PageTableError is the error of [ValidatePageTable] and
// [ValidatePagedKVLens]. It wraps [ErrBadPageTable] and Kind, so that
// errors.Is also tells which rule broke.
type PageTableError struct {
	// Kind is this package's sentinel for the broken rule: ErrBadIndptr
	// (kv_indptr malformed, or not matching len(kv_indices)),
	// ErrLengthMismatch (kv_last_page_len's length), ErrBadLastPageLen,
	// ErrNegativeLength (page_size or num_pages), ErrTooLarge (a seq_len
	// beyond int32) or ErrOutOfRange (a page id outside the pool).
	Kind error
	// Detail names the request, the array index and the bad value.
	Detail string
}

func (e *PageTableError) Error() string { return ErrBadPageTable.Error() + ": " + e.Detail }

// Unwrap lets errors.Is match both ErrBadPageTable and Kind.
func (e *PageTableError) Unwrap() []error { return []error{ErrBadPageTable, e.Kind} }

func pageTableError(kind error, format string, args ...any) error {
	return &PageTableError{Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

// ValidatePageTable checks a paged KV page table from outside against every
// rule FlashInfer's kernels assume but do not check: kv_indptr has length
// B+1, starts at 0 and never decreases; kv_last_page_len has length B, with
// 0 for a request with no pages and 1..page_size otherwise; every seq_len,
// (pages-1)*page_size + kv_last_page_len, fits int32; len(kv_indices) ==
// kv_indptr[B] (or >= under IndicesMayBeLonger); every page id used is in
// [0, NumPages). Every comparison is made on the int32 values themselves or
// in int64, so no hostile value (MinInt32, MaxInt32, a decreasing indptr)
// wraps into an accepted table. The error is a [*PageTableError] naming the
// request, the index and the value. It does not allocate unless it fails.
func ValidatePageTable(kvIndptr, kvPageIndices, kvLastPageLen []int32, c PageTableCheck) error {
	if err := validatePagedKVLens(kvIndptr, kvLastPageLen, c.PageSize, c.LastPageLenOptional); err != nil {
		return err
	}
	b := len(kvIndptr) - 1
	used := int64(kvIndptr[b]) // in [0, MaxInt32]: kv_indptr starts at 0 and never decreases
	if n := int64(len(kvPageIndices)); n < used || (n > used && !c.IndicesMayBeLonger) {
		return pageTableError(ErrBadIndptr, "kv_indptr[%d] = %d but kv_indices has length %d", b, used, n)
	}
	if c.NumPages < 0 {
		return pageTableError(ErrNegativeLength, "num_pages = %d is negative", c.NumPages)
	}
	for k, p := range kvPageIndices[:used] {
		if p < 0 || int64(p) >= int64(c.NumPages) {
			req := 0
			for int64(kvIndptr[req+1]) <= int64(k) {
				req++
			}
			return pageTableError(ErrOutOfRange, "request %d: kv_indices[%d] = %d outside the pool [0, %d)", req, k, p, c.NumPages)
		}
	}
	return nil
}

// ValidatePagedKVLens is the part of [ValidatePageTable] that needs no
// kv_indices: kv_indptr's shape, kv_last_page_len against it and pageSize,
// and every seq_len within int32.
func ValidatePagedKVLens(kvIndptr, kvLastPageLen []int32, pageSize int) error {
	return validatePagedKVLens(kvIndptr, kvLastPageLen, pageSize, false)
}

func validatePagedKVLens(kvIndptr, kvLastPageLen []int32, pageSize int, lastOptional bool) error {
	if pageSize < 1 {
		return pageTableError(ErrNegativeLength, "page_size = %d, want >= 1", pageSize)
	}
	if fault := indptrFault("kv_indptr", kvIndptr); fault != "" {
		return &PageTableError{Kind: ErrBadIndptr, Detail: fault}
	}
	b := len(kvIndptr) - 1
	if lastOptional && kvLastPageLen == nil {
		return nil
	}
	if len(kvLastPageLen) != b {
		return pageTableError(ErrLengthMismatch, "kv_last_page_len has length %d, want %d (len(kv_indptr)-1)", len(kvLastPageLen), b)
	}
	for i, last := range kvLastPageLen {
		pages := int64(kvIndptr[i+1]) - int64(kvIndptr[i])
		switch {
		case pages == 0 && last != 0:
			return pageTableError(ErrBadLastPageLen, "request %d has 0 pages but kv_last_page_len[%d] = %d, want 0", i, i, last)
		case pages > 0 && (last < 1 || int64(last) > int64(pageSize)):
			return pageTableError(ErrBadLastPageLen, "request %d: kv_last_page_len[%d] = %d, want 1..%d (page_size)", i, i, last, pageSize)
		case pages > 0 && pages-1 > (math.MaxInt32-int64(last))/int64(pageSize):
			return pageTableError(ErrTooLarge, "request %d: seq_len of %d pages of %d tokens (the last %d) exceeds %d (int32)",
				i, pages, pageSize, last, math.MaxInt32)
		}
	}
	return nil
}

// PagedKVLen is request b's seq_len in a page table that passed
// [ValidatePagedKVLens]: 0 without pages, else (pages-1)*pageSize +
// kv_last_page_len[b].
func PagedKVLen(kvIndptr, kvLastPageLen []int32, pageSize, b int) int32 {
	pages := kvIndptr[b+1] - kvIndptr[b]
	if pages == 0 {
		return 0
	}
	return (pages-1)*int32(pageSize) + kvLastPageLen[b]
}
