package kernels

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// AppendConverts reports whether an append of rows of dtype src into a cache
// of dtype cache converts (f32/f16/bf16 rows into an fp8 cache, scaled and
// saturated, or quantised into an NVFP4 cache) rather than copying bytes
// (equal dtypes). Any other pair is rejected by [AppendParams.Validate].
func AppendConverts(src, cache layout.DType) bool {
	return src != cache && (cache == layout.E4M3 || cache == layout.E5M2 || cache == layout.NVFP4) &&
		(src == layout.F32 || src == layout.F16 || src == layout.BF16)
}

// EffectiveScale is the scale an append divides by: s, or 1 when s is 0.
func EffectiveScale(s float64) float32 {
	if s == 0 {
		return 1
	}
	return float32(s)
}

// Validate checks every input of an append before anything is written, so a
// backend that calls it first never writes out of bounds and a failed call
// writes nothing. It checks:
//   - the cache (geometry valid, buffers of exactly the geometry's length);
//   - the page table (well-formed CSR, last_page_len in range, page ids
//     below num_pages; see [PageTable.Validate]);
//   - append_key and append_value: [nnz, H, D] with the cache's H and D, one
//     dtype, equal to the cache's or (converting) f32/f16/bf16 into fp8;
//   - KScale, VScale: finite and >= 0, and 0 or 1 unless converting;
//   - batch_indices, positions: length nnz, every batch_indices[i] in
//     [0, B), every positions[i] in [0, seq_len) of its request, where
//     seq_len is computed from the (post-append) table.
//
// Validate does not check that the rows write distinct slots: two rows with
// the same destination make the result depend on the order of the copies.
func (p *AppendParams) Validate() error {
	if err := p.Cache.Validate(); err != nil {
		return fmt.Errorf("append: paged_kv_cache: %w", err)
	}
	g := p.Cache.Geometry
	if err := p.Table.Validate(g.PageSize, g.NumPages); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	if err := ValidateAppendIndices(p.BatchIndices, p.Positions); err != nil {
		return err
	}
	nnz := len(p.BatchIndices)
	if err := p.AppendKey.CheckShape("append_key", nnz, g.NumKVHeads, g.HeadDim); err != nil {
		return fmt.Errorf("append: %w (nnz = len(batch_indices), num_kv_heads, head_dim)", err)
	}
	if err := p.AppendValue.CheckShape("append_value", nnz, g.NumKVHeads, g.HeadDim); err != nil {
		return fmt.Errorf("append: %w (nnz = len(batch_indices), num_kv_heads, head_dim)", err)
	}
	if err := ValidateAppendDTypes(p.AppendKey.DType, p.AppendValue.DType, g.DType, p.KScale, p.VScale); err != nil {
		return err
	}
	return ValidateAppendRows(&p.Table, p.BatchIndices, p.Positions, g.PageSize, false)
}

// ValidateAppendRows checks that row i of an append targets a request of
// the batch and a position below that request's length (its capacity in
// pages*pageSize when capacityOnly, i.e. when kv_last_page_len is absent),
// the last check of [AppendParams.Validate]. t must have passed
// [PageTable.Validate] and the lengths [ValidateAppendIndices].
func ValidateAppendRows(t *PageTable, batchIndices, positions []int32, pageSize int, capacityOnly bool) error {
	B := int64(t.BatchSize())
	for i, b := range batchIndices {
		if b < 0 || int64(b) >= B {
			return fmt.Errorf("append: %w: batch_indices[%d] = %d outside [0, batch %d)", ErrIndexOutOfRange, i, b, B)
		}
		pages := int64(t.KVIndptr[b+1]) - int64(t.KVIndptr[b])
		var n int64
		switch {
		case capacityOnly:
			n = pagesTokens(pages, pageSize)
		case pages > 0:
			// validateCSR passed: pages >= 0 and this is at most MaxSeqLen.
			n = (pages-1)*int64(pageSize) + int64(t.KVLastPageLen[b])
		}
		if pos := positions[i]; pos < 0 || int64(pos) >= n {
			what := "seq_len"
			if capacityOnly {
				what = "reserved pages*page_size"
			}
			return fmt.Errorf("append: %w: positions[%d] = %d outside [0, %s %d) of request %d", ErrIndexOutOfRange, i, pos, what, n, b)
		}
	}
	return nil
}

// Validate checks every input of an MLA append before anything is written:
// the cache; KVIndptr/KVPageIndices as CSR with page ids below num_pages and, when
// KVLastPageLen is given, last_page_len in range; append_ckv [nnz, ckv] and
// append_kpe [nnz, kpe] in the cache's dtype (no conversion); batch_indices and
// positions of length nnz, each row's request in the batch and its position
// below the request's seq_len (or, without KVLastPageLen, below its reserved
// pages*page_size). FlashInfer requires ckv = 512 and kpe = 64; these
// checks accept any positive dims so that tests can use small ones.
func (p *MLAAppendParams) Validate() error {
	if err := p.Cache.Validate(); err != nil {
		return fmt.Errorf("mla append: cache: %w", err)
	}
	g := p.Cache.Geometry
	if err := ValidateMLAAppendTable(g, p.KVIndptr, p.KVPageIndices, p.KVLastPageLen, p.BatchIndices, p.Positions); err != nil {
		return err
	}
	nnz := len(p.BatchIndices)
	if err := p.AppendCKV.CheckShape("append_ckv", nnz, g.HeadDimCKV); err != nil {
		return fmt.Errorf("mla append: %w (nnz = len(batch_indices), head_dim_ckv)", err)
	}
	if err := p.AppendKPE.CheckShape("append_kpe", nnz, g.HeadDimKPE); err != nil {
		return fmt.Errorf("mla append: %w (nnz = len(batch_indices), head_dim_kpe)", err)
	}
	if p.AppendCKV.DType != g.DType || p.AppendKPE.DType != g.DType {
		return fmt.Errorf("mla append: %w: append_ckv %v and append_kpe %v into a %v cache (want equal dtypes)", ErrInvalidTensor, p.AppendCKV.DType, p.AppendKPE.DType, g.DType)
	}
	t := PageTable{KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices, KVLastPageLen: p.KVLastPageLen}
	if err := ValidateAppendRows(&t, p.BatchIndices, p.Positions, g.PageSize, p.KVLastPageLen == nil); err != nil {
		return fmt.Errorf("mla %w", err)
	}
	return nil
}

// ValidateAppendDTypes checks the dtypes of an append's rows against the
// cache's and the scales, as [AppendParams.Validate] does: one row dtype,
// equal to the cache's or (converting) f32/f16/bf16 into fp8; KScale and
// VScale finite and >= 0, and 0 or 1 unless converting.
func ValidateAppendDTypes(kd, vd, cache layout.DType, kScale, vScale float64) error {
	if kd != vd {
		return fmt.Errorf("append: %w: append_key is %v but append_value is %v", ErrInvalidTensor, kd, vd)
	}
	converts := AppendConverts(kd, cache)
	if cache == layout.NVFP4 && !converts {
		return fmt.Errorf("append: %w: append rows of %v into an nvfp4 cache (want f32, f16 or bf16 rows, quantised on append)", ErrInvalidTensor, kd)
	}
	if kd != cache && !converts {
		return fmt.Errorf("append: %w: append rows of %v into a %v cache (want %v, or f32/f16/bf16 into an fp8 or nvfp4 cache)", ErrInvalidTensor, kd, cache, cache)
	}
	for _, s := range [...]struct {
		name string
		v    float64
	}{{"k_scale", kScale}, {"v_scale", vScale}} {
		switch {
		case math.IsNaN(s.v) || math.IsInf(s.v, 0) || s.v < 0:
			return fmt.Errorf("append: %w: %s = %v (want finite, >= 0; 0 means 1)", ErrInvalidScale, s.name, s.v)
		case !converts && s.v != 0 && s.v != 1:
			return fmt.Errorf("append: %w: %s = %v but %v rows are copied into the %v cache unscaled (want 0 or 1)", ErrInvalidScale, s.name, s.v, kd, cache)
		case converts && float32(s.v) == 0 && s.v != 0:
			return fmt.Errorf("append: %w: %s = %v is 0 in float32", ErrInvalidScale, s.name, s.v)
		case converts && math.IsInf(float64(float32(s.v)), 0):
			return fmt.Errorf("append: %w: %s = %v overflows float32", ErrInvalidScale, s.name, s.v)
		}
	}
	return nil
}
