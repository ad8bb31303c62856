package kernels

import (
	"fmt"
	"slices"

	"github.com/pagedkv/pagedkv/layout"
)

// The functions of this file are the index-array halves of the Validate
// methods, which call them, for backends whose tensors are not CPU slices
// (kernels/cuda's device steps keep q, o and the cache in device memory and
// check their shapes themselves). The page table itself is checked once per
// call or step by [PageTable.Validate], which is [ragged.ValidatePageTable];
// the checks here assume it has passed or come before it, in the order the
// Validate methods run them, so an index array one backend rejects is
// rejected by every backend with the same error.

// ValidateBatch checks that t's kv_indptr has batch+1 entries, batch being
// the rows of q of a decode (op names the call).
func (t *PageTable) ValidateBatch(op string, batch int) error {
	if len(t.KVIndptr) != batch+1 {
		return fmt.Errorf("%s: %w: kv_indptr has length %d but q has %d rows (want batch+1 = %d)", op, ErrInvalidPageTable, len(t.KVIndptr), batch, batch+1)
	}
	return nil
}

// ValidateAppendIndices checks that batch_indices and positions have the
// same length, the check [AppendParams.Validate] makes after the page
// table; [ValidateAppendRows] checks their values.
func ValidateAppendIndices(batchIndices, positions []int32) error {
	if len(positions) != len(batchIndices) {
		return fmt.Errorf("append: %w: batch_indices has %d entries, positions %d", ErrInvalidTensor, len(batchIndices), len(positions))
	}
	return nil
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
	return ValidateMLAKVLen(g, kvIndptr, kvLen)
}

// ValidateMLAKVLen is the last check of [ValidateMLADecodeTable]: kv_len
// has one value per request of the (already validated) kv_indptr, each
// fitting in that request's pages. A step that appends and decodes
// through one CSR, already checked by [ValidateMLAAppendTable], checks
// only this.
func ValidateMLAKVLen(g layout.MLA, kvIndptr, kvLen []int32) error {
	const op = "mla decode"
	batch := max(len(kvIndptr)-1, 0)
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
