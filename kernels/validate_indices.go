package kernels

import (
	"fmt"
	"slices"

	"github.com/pagedkv/pagedkv/layout"
)

// The functions of this file are the index-array and scalar halves of the
// Validate methods, which call them, for backends whose tensors are not host
// slices (the device-resident API of kernels/cuda keeps q, o and the cache
// in device memory and checks their shapes itself). A Validate method runs
// its tensor checks and these in a fixed order, so an index array one
// backend rejects is rejected by every backend with the same error.

// ValidateAttentionScalars checks the scalar attention parameters as
// [DecodeParams.Validate] and [PrefillParams.Validate] do (op "decode" or
// "prefill"): num_qo_heads against q's heads and the cache's kv heads,
// window, soft cap and scales.
func ValidateAttentionScalars(op string, a *AttentionParams, qHeads, numKVHeads, headDim int) error {
	return a.validate(op, qHeads, numKVHeads, headDim)
}

// ValidateDecodeTable checks decode's page table for a batch of batch
// requests over a cache of geometry g, as [DecodeParams.Validate] does.
func ValidateDecodeTable(g layout.Paged, batch int, t *PageTable) error {
	const op = "decode"
	if len(t.KVIndptr) != batch+1 {
		return fmt.Errorf("%s: %w: kv_indptr has length %d but q has %d rows (want batch+1 = %d)", op, ErrInvalidPageTable, len(t.KVIndptr), batch, batch+1)
	}
	if err := t.Validate(g.PageSize, g.NumPages); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// ValidatePrefillTable checks prefill's page table and qo_indptr for nnz
// query rows over a cache of geometry g, as [PrefillParams.Validate] does.
func ValidatePrefillTable(g layout.Paged, nnz int, qoIndptr []int32, t *PageTable) error {
	const op = "prefill"
	if err := t.Validate(g.PageSize, g.NumPages); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return validateQOIndptr(op, qoIndptr, len(t.KVIndptr)-1, nnz)
}

// ValidateAppendTable checks an append's page table and that batch_indices
// and positions have the same length, the checks [AppendParams.Validate]
// makes before the row tensors; [ValidateAppendRows] makes the rest.
func ValidateAppendTable(g layout.Paged, t *PageTable, batchIndices, positions []int32) error {
	if err := t.Validate(g.PageSize, g.NumPages); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	if len(positions) != len(batchIndices) {
		return fmt.Errorf("append: %w: batch_indices has %d entries, positions %d", ErrInvalidTensor, len(batchIndices), len(positions))
	}
	return nil
}

// ValidateAppendRows checks that every appended row targets a request of
// the batch and a position below its seq_len, the last check of
// [AppendParams.Validate]. The table must have passed [ValidateAppendTable].
func ValidateAppendRows(g layout.Paged, t *PageTable, batchIndices, positions []int32) error {
	return validateRows(t, batchIndices, positions, g.PageSize, false)
}

// ValidateMLAAppendTable checks an MLA append's CSR (kv_last_page_len
// optional) and the length of positions, the checks
// [MLAAppendParams.Validate] makes before the row tensors.
func ValidateMLAAppendTable(g layout.MLA, kvIndptr, kvPageIndices, kvLastPageLen, batchIndices, positions []int32) error {
	if err := validateCSR(kvIndptr, kvPageIndices, kvLastPageLen, false, g.PageSize, g.NumPages); err != nil {
		return fmt.Errorf("mla append: %w", err)
	}
	if len(positions) != len(batchIndices) {
		return fmt.Errorf("mla append: %w: batch_indices has %d entries, positions %d", ErrInvalidTensor, len(batchIndices), len(positions))
	}
	return nil
}

// ValidateMLAAppendRows is [ValidateAppendRows] for an MLA append (without
// kv_last_page_len a position must lie below the reserved pages*page_size).
func ValidateMLAAppendRows(g layout.MLA, kvIndptr, kvPageIndices, kvLastPageLen, batchIndices, positions []int32) error {
	t := PageTable{KVIndptr: kvIndptr, KVPageIndices: kvPageIndices, KVLastPageLen: kvLastPageLen}
	if err := validateRows(&t, batchIndices, positions, g.PageSize, kvLastPageLen == nil); err != nil {
		return fmt.Errorf("mla %w", err)
	}
	return nil
}

// ValidateMLADecodeTable checks MLA decode's kv_indptr, kv_indices and
// kv_len for a batch of batch requests, as [MLADecodeParams.Validate] does
// after its tensors and sm_scale.
func ValidateMLADecodeTable(g layout.MLA, batch int, kvIndptr, kvPageIndices, kvLen []int32) error {
	const op = "mla decode"
	if len(kvIndptr) != batch+1 {
		return fmt.Errorf("%s: %w: kv_indptr has length %d but q has %d rows (want batch+1 = %d)", op, ErrInvalidPageTable, len(kvIndptr), batch, batch+1)
	}
	if err := validateCSR(kvIndptr, kvPageIndices, nil, false, g.PageSize, g.NumPages); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if len(kvLen) != batch {
		return fmt.Errorf("%s: %w: kv_len has %d values, want batch %d", op, ErrInvalidPageTable, len(kvLen), batch)
	}
	for b, n := range kvLen {
		pages := int64(kvIndptr[b+1]) - int64(kvIndptr[b])
		if n < 0 || int64(n) > pagesTokens(pages, g.PageSize) {
			return fmt.Errorf("%s: %w: kv_len[%d] = %d does not fit in its %d pages of %d tokens", op, ErrInvalidPageTable, b, n, pages, g.PageSize)
		}
	}
	return nil
}

// CheckDims is [Tensor.CheckShape]'s shape comparison for a tensor known
// only by its shape (a device tensor): the same error when shape is not
// exactly want.
func CheckDims(name string, shape []int, want ...int) error {
	// The errors format a copy of want so that the variadic slice does not
	// escape: a successful check does not allocate.
	if len(shape) != len(want) {
		return fmt.Errorf("%w: %s has shape %v, want %v", ErrInvalidTensor, name, shape, slices.Clone(want))
	}
	for i := range want {
		if shape[i] != want[i] {
			return fmt.Errorf("%w: %s has shape %v, want %v (dim %d)", ErrInvalidTensor, name, shape, slices.Clone(want), i)
		}
	}
	return nil
}

// ValidateMLADecodeScalars checks MLA decode's num_heads and sm_scale as
// [MLADecodeParams.Validate] does once q_nope has numHeads heads.
func ValidateMLADecodeScalars(numHeads int, smScale float64) error {
	const op = "mla decode"
	switch {
	case numHeads <= 0:
		return fmt.Errorf("%s: %w: num_heads = %d, want > 0", op, ErrInvalidAttention, numHeads)
	case badFloat(smScale) || smScale <= 0 || float32(smScale) == 0 || badFloat(float64(float32(smScale))):
		return fmt.Errorf("%s: %w: sm_scale = %v, want a finite float32 > 0 (MLA has no default)", op, ErrInvalidScale, smScale)
	}
	return nil
}
