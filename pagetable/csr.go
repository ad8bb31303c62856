package pagetable

import (
	"fmt"
	"math"
	"slices"
)

// validateIndptr checks an indptr array from outside: length B+1 >= 1,
// indptr[0] == 0, non-decreasing. name is the FlashInfer name used in errors.
func validateIndptr(name string, indptr []int32) error {
	if len(indptr) == 0 {
		return fmt.Errorf("%w: %s is empty, want length batch+1 >= 1", ErrBadCSR, name)
	}
	if indptr[0] != 0 {
		return fmt.Errorf("%w: %s[0] = %d, want 0", ErrBadCSR, name, indptr[0])
	}
	for b := 1; b < len(indptr); b++ {
		if indptr[b] < indptr[b-1] {
			return fmt.Errorf("%w: request %d: %s[%d] = %d < %s[%d] = %d (decreasing)",
				ErrBadCSR, b-1, name, b, indptr[b], name, b-1, indptr[b-1])
		}
	}
	return nil
}

// validateLastPageLens checks kv_last_page_len against kv_indptr: length B,
// 0 for a request with 0 pages, else 1..pageSize, and every seq_len fits
// int32.
func validateLastPageLens(kvIndptr, kvLastPageLen []int32, pageSize int) error {
	if pageSize < 1 || pageSize > MaxPageSize {
		return fmt.Errorf("%w: page_size = %d, want 1..%d", ErrBadCSR, pageSize, MaxPageSize)
	}
	if err := validateIndptr("kv_indptr", kvIndptr); err != nil {
		return err
	}
	b := len(kvIndptr) - 1
	if len(kvLastPageLen) != b {
		return fmt.Errorf("%w: kv_last_page_len has length %d, want %d (len(kv_indptr)-1)", ErrBadCSR, len(kvLastPageLen), b)
	}
	for i, last := range kvLastPageLen {
		npages := int64(kvIndptr[i+1]) - int64(kvIndptr[i])
		switch {
		case npages == 0 && last != 0:
			return fmt.Errorf("%w: request %d has 0 pages but kv_last_page_len[%d] = %d, want 0", ErrBadCSR, i, i, last)
		case npages > 0 && (last < 1 || int(last) > pageSize):
			return fmt.Errorf("%w: request %d: kv_last_page_len[%d] = %d, want 1..%d (page_size)", ErrBadCSR, i, i, last, pageSize)
		}
		if n := (npages-1)*int64(pageSize) + int64(last); npages > 0 && n > math.MaxInt32 {
			return fmt.Errorf("%w: request %d: seq_len = %d overflows int32 (%d pages of %d)", ErrBadCSR, i, n, npages, pageSize)
		}
	}
	return nil
}

// maxTokenSlots bounds kv_indptr[B]*page_size: FlashInfer's kernels compute
// token offsets in 32-bit unsigned arithmetic.
const maxTokenSlots = 1 << 32

// ValidateCSR checks a paged KV page table from outside against every rule
// FlashInfer's kernels assume but do not check: kv_indptr has length B+1,
// starts at 0 and never decreases; len(kv_page_indices) == kv_indptr[B];
// len(kv_last_page_len) == B, with 0 for a request with 0 pages and
// 1..pageSize otherwise; every page ID is in [0, numPages); seq lengths fit
// int32, and kv_indptr[B]*pageSize < 2^32 (the kernels compute token offsets
// in 32-bit unsigned arithmetic). The error wraps [ErrBadCSR] and names the
// request index and the value.
func ValidateCSR(kvIndptr, kvPageIndices, kvLastPageLen []int32, pageSize, numPages int) error {
	if err := validateLastPageLens(kvIndptr, kvLastPageLen, pageSize); err != nil {
		return err
	}
	b := len(kvIndptr) - 1
	if int(kvIndptr[b]) != len(kvPageIndices) {
		return fmt.Errorf("%w: kv_indptr[%d] = %d but kv_page_indices has length %d", ErrBadCSR, b, kvIndptr[b], len(kvPageIndices))
	}
	if n := int64(kvIndptr[b]) * int64(pageSize); n >= maxTokenSlots {
		return fmt.Errorf("%w: kv_indptr[%d]*page_size = %d*%d = %d, want < 2^32 (32-bit token offsets)",
			ErrBadCSR, b, kvIndptr[b], pageSize, n)
	}
	if numPages < 0 {
		return fmt.Errorf("%w: numPages = %d is negative", ErrBadCSR, numPages)
	}
	req := 0
	for k, p := range kvPageIndices {
		if p < 0 || int(p) >= numPages {
			for int(kvIndptr[req+1]) <= k {
				req++
			}
			return fmt.Errorf("%w: request %d: kv_page_indices[%d] = %d outside the pool [0, %d)", ErrBadCSR, req, k, p, numPages)
		}
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
	if err := validateLastPageLens(kvIndptr, kvLastPageLen, pageSize); err != nil {
		return dst, err
	}
	b := len(kvLastPageLen)
	out := slices.Grow(dst[:0], b)[:b]
	for i, last := range kvLastPageLen {
		full := max(kvIndptr[i+1]-kvIndptr[i]-1, 0)
		out[i] = full*int32(pageSize) + last
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
	if err := validateIndptr("append_indptr", appendIndptr); err != nil {
		return batchIndices, positions, err
	}
	b := len(appendIndptr) - 1
	if len(seqLens) != b {
		return batchIndices, positions, fmt.Errorf("%w: seq_lens has length %d, want %d (len(append_indptr)-1)", ErrBadCSR, len(seqLens), b)
	}
	if int64(nnz) != int64(appendIndptr[b]) {
		return batchIndices, positions, fmt.Errorf("%w: nnz = %d, want append_indptr[%d] = %d", ErrBadCSR, nnz, b, appendIndptr[b])
	}
	for i, n := range seqLens {
		if rows := appendIndptr[i+1] - appendIndptr[i]; n < rows {
			return batchIndices, positions, fmt.Errorf("%w: request %d appends %d rows but seq_lens[%d] = %d (positions would be negative)",
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
