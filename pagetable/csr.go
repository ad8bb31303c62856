package pagetable

import (
	"fmt"
	"slices"

	"github.com/pagedkv/pagedkv/ragged"
)

// checkPageSize is the Table's bound on page_size, which the shared
// validator (any page_size >= 1) does not know.
func checkPageSize(pageSize int) error {
	if pageSize < 1 || pageSize > MaxPageSize {
		return fmt.Errorf("pagetable: %w: page_size = %d, want 1..%d", ErrBadCSR, pageSize, MaxPageSize)
	}
	return nil
}

// maxTokenSlots bounds kv_indptr[B]*page_size: FlashInfer's kernels compute
// token offsets in 32-bit unsigned arithmetic.
const maxTokenSlots = 1 << 32

// ValidateCSR checks a paged KV page table from outside against every rule
// FlashInfer's kernels assume but do not check: [ragged.ValidatePageTable]'s
// (kv_indptr has length B+1, starts at 0 and never decreases;
// len(kv_page_indices) == kv_indptr[B]; len(kv_last_page_len) == B, with 0
// for a request with 0 pages and 1..pageSize otherwise; every page ID is in
// [0, numPages); seq lengths fit int32), page_size <= [MaxPageSize], and
// kv_indptr[B]*pageSize < 2^32 (the kernels compute token offsets in 32-bit
// unsigned arithmetic). The error wraps [ErrBadCSR] and names the request
// index and the value.
func ValidateCSR(kvIndptr, kvPageIndices, kvLastPageLen []int32, pageSize, numPages int) error {
	if err := checkPageSize(pageSize); err != nil {
		return err
	}
	err := ragged.ValidatePageTable(kvIndptr, kvPageIndices, kvLastPageLen, ragged.PageTableCheck{PageSize: pageSize, NumPages: numPages})
	if err != nil {
		return fmt.Errorf("pagetable: %w", err)
	}
	b := len(kvIndptr) - 1
	if n := int64(kvIndptr[b]) * int64(pageSize); n >= maxTokenSlots {
		return fmt.Errorf("pagetable: %w: kv_indptr[%d]*page_size = %d*%d = %d, want < 2^32 (32-bit token offsets)",
			ErrBadCSR, b, kvIndptr[b], pageSize, n)
	}
	return nil
}

// GetSeqLensTo computes flashinfer.page.get_seq_lens into dst (reset to [:0]
// and grown if needed) and returns it:
//
//	seq_lens[b] = max(kv_indptr[b+1]-kv_indptr[b]-1, 0)*pageSize + kv_last_page_len[b]
//
// The inputs are validated as by [ValidateCSR] (without page IDs) first; on
// error dst is returned unchanged.
func GetSeqLensTo(dst, kvIndptr, kvLastPageLen []int32, pageSize int) ([]int32, error) {
	if err := checkPageSize(pageSize); err != nil {
		return dst, err
	}
	if err := ragged.ValidatePagedKVLens(kvIndptr, kvLastPageLen, pageSize); err != nil {
		return dst, fmt.Errorf("pagetable: %w", err)
	}
	b := len(kvLastPageLen)
	out := slices.Grow(dst[:0], b)[:b]
	for i := range out {
		out[i] = ragged.PagedKVLen(kvIndptr, kvLastPageLen, pageSize, i)
	}
	return out, nil
}

// GetBatchIndicesPositionsTo computes flashinfer.page.get_batch_indices_positions
// (the CSR -> COO step of an append) into batchIndices and positions (each
// reset to [:0] and grown if needed) and returns them: for each request b and
// each row i in [appendIndptr[b], appendIndptr[b+1]),
//
//	batch_indices[i] = b
//	positions[i]     = seqLens[b] - (appendIndptr[b+1] - i)
//
// seqLens are the lengths after the append. appendIndptr must be a valid
// indptr (length B+1, starting at 0, non-decreasing), len(seqLens) == B,
// nnz == appendIndptr[B] (FlashInfer leaves rows past appendIndptr[B] as -1,
// which would corrupt an append), and every seqLens[b] must be at least the
// rows request b appends, so no position is negative. On error the buffers
// are returned unchanged and the error wraps [ErrBadCSR].
func GetBatchIndicesPositionsTo(batchIndices, positions, appendIndptr, seqLens []int32, nnz int) (bi, pos []int32, err error) {
	if err := ragged.CheckIndptr("append_indptr", appendIndptr); err != nil {
		return batchIndices, positions, fmt.Errorf("pagetable: %w: %w", ErrBadCSR, err)
	}
	b := len(appendIndptr) - 1
	if len(seqLens) != b {
		return batchIndices, positions, fmt.Errorf("pagetable: %w: seq_lens has length %d, want %d (len(append_indptr)-1)", ErrBadCSR, len(seqLens), b)
	}
	if int64(nnz) != int64(appendIndptr[b]) {
		return batchIndices, positions, fmt.Errorf("pagetable: %w: nnz = %d, want append_indptr[%d] = %d", ErrBadCSR, nnz, b, appendIndptr[b])
	}
	for i, n := range seqLens {
		if rows := appendIndptr[i+1] - appendIndptr[i]; n < rows {
			return batchIndices, positions, fmt.Errorf("pagetable: %w: request %d appends %d rows but seq_lens[%d] = %d (positions would be negative)",
				ErrBadCSR, i, rows, i, n)
		}
	}
	bi = slices.Grow(batchIndices[:0], nnz)[:nnz]
	pos = slices.Grow(positions[:0], nnz)[:nnz]
	for r := 0; r < b; r++ {
		start, end := appendIndptr[r], appendIndptr[r+1]
		for i := start; i < end; i++ {
			bi[i] = int32(r)
			pos[i] = seqLens[r] - (end - i)
		}
	}
	return bi, pos, nil
}
