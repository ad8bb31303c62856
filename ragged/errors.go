package ragged

import "errors"

// Sentinel errors. Every error this package returns wraps exactly one of them
// (test with errors.Is) and names the offending value and, where there is
// one, the request index. A page table's error ([PageTableError]) wraps
// [ErrBadPageTable] as well.
var (
	// ErrBadIndptr: an indptr array is empty, does not start at 0, decreases,
	// or does not end at the length of the data it indexes.
	ErrBadIndptr = errors.New("ragged: malformed indptr")

	// ErrLengthMismatch: arrays that describe the same batch disagree in
	// length (qo_indptr vs kv_indptr, q_seqlen vs kv_seqlen, a dst buffer of
	// the wrong size, a dense shape that is not rows*cols).
	ErrLengthMismatch = errors.New("ragged: inconsistent lengths")

	// ErrNegativeLength: a sequence length, page size, padding or width is
	// negative (or zero where zero is meaningless).
	ErrNegativeLength = errors.New("ragged: negative or zero length")

	// ErrInvalidWindow: a window size is below 1 (xFormers and the Ascend
	// seed both need window_size >= 1 for a mask in which every query sees
	// a key).
	ErrInvalidWindow = errors.New("ragged: invalid window size")

	// ErrMaskSize: a mask (boolean or packed) holds a number of bits or bytes
	// that disagrees with mask_indptr, i.e. with sum(qo_len*kv_len).
	ErrMaskSize = errors.New("ragged: mask size disagrees with indptr")

	// ErrNoVisibleKey: xFormers refuses to build a mask in which some query
	// of a block sees no key (a from-bottom-right mask with fewer keys than
	// queries, or a local mask whose window lies before the first key).
	ErrNoVisibleKey = errors.New("ragged: a query would see no key")

	// ErrOutOfRange: an index (request, query row, key column, position)
	// lies outside the array it indexes.
	ErrOutOfRange = errors.New("ragged: index out of range")

	// ErrTooLarge: a size does not fit FlashInfer's int32 index arrays, or a
	// dense matrix would exceed MaxDenseCells.
	ErrTooLarge = errors.New("ragged: size too large")

	// ErrBitOrder: a BitOrder other than BitOrderLittle or BitOrderBig.
	ErrBitOrder = errors.New("ragged: invalid bit order")

	// ErrBadLastPageLen: kv_last_page_len is outside 1..page_size for a
	// request with pages, or not 0 for a request without pages.
	ErrBadLastPageLen = errors.New("ragged: invalid kv_last_page_len")

	// ErrNotSorted: COO batch indices are not non-decreasing, or positions
	// within a request are not 0, 1, 2, ...
	ErrNotSorted = errors.New("ragged: COO entries out of order")

	// ErrUnknownMaskKind: a MaskConfig.Kind that is not one of the MaskKind
	// constants.
	ErrUnknownMaskKind = errors.New("ragged: unknown mask kind")

	// ErrNotPaged: a page-table conversion asked of a mask that is not one
	// of the paged kinds.
	ErrNotPaged = errors.New("ragged: mask is not paged")
)
