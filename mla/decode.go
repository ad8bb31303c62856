package mla

import (
	"math"

	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
)

// ErrBadDecodePlan is returned by [DecodePlan.Plan] for malformed arguments.
var ErrBadDecodePlan = errors.New("mla: bad decode plan")

// SMScale is the softmax scale DeepSeek uses with absorbed MLA:
// 1/sqrt(qkNopeHeadDim + qkRopeHeadDim), the query head dim before absorption
// (128 + 64 for DeepSeek-V2/V3), not the 512+64 of the absorbed dot product.
// FlashInfer's MLA wrapper has no default; pass it explicitly.
func SMScale(qkNopeHeadDim, qkRopeHeadDim int) float64 {
	return 1 / math.Sqrt(float64(qkNopeHeadDim+qkRopeHeadDim))
}

// DecodePlan holds the arguments of MLA decode that change once per step
// (FlashInfer's BatchMLAPagedAttentionWrapper.plan): the page table in pages
// (KVIndptr, KVPageIndices), each request's token count (KVLen, instead of
// kv_last_page_len), the head count and the softmax scale. Run then passes
// the per-call tensors (run). The zero value is ready for Plan.
type DecodePlan struct {
	KVIndptr      []int32 // [B+1], copied
	KVPageIndices []int32 // [KVIndptr[B]], copied
	KVLen         []int32 // [B], copied
	NumHeads      int
	SMScale       float64

	params kernels.MLADecodeParams
}

// Plan records a decode step, copying the arrays into the plan's reused
// buffers. It checks the shapes of the arrays and the scalars; the backend
// checks them against the cache in Run. On error the plan is unchanged.
func (d *DecodePlan) Plan(kvIndptr, kvPageIndices, kvLen []int32, numHeads int, smScale float64) error {
	switch {
	case len(kvIndptr) == 0 || len(kvLen) != len(kvIndptr)-1:
		return fmt.Errorf("kv_indptr has length %d, kv_len %d (want batch+1 and batch): %w", len(kvIndptr), len(kvLen), ErrBadDecodePlan)
	case int(kvIndptr[len(kvIndptr)-1]) > len(kvPageIndices) || kvIndptr[len(kvIndptr)-1] < 0:
		return fmt.Errorf("kv_indptr[%d] = %d but kv_indices has %d entries: %w", len(kvIndptr)-1, kvIndptr[len(kvIndptr)-1], len(kvPageIndices), ErrBadDecodePlan)
	case numHeads <= 0:
		return fmt.Errorf("num_heads = %d, want > 0: %w", numHeads, ErrBadDecodePlan)
	case math.IsNaN(smScale) || math.IsInf(smScale, 0) || smScale <= 0:
		return fmt.Errorf("sm_scale = %v, want finite and > 0 (MLA has no default; see SMScale): %w", smScale, ErrBadDecodePlan)
	}
	for b, n := range kvLen {
		if n < 0 {
			return fmt.Errorf("kv_len[%d] = %d < 0: %w", b, n, ErrBadDecodePlan)
		}
	}
	d.KVIndptr = append(d.KVIndptr[:0], kvIndptr...)
	d.KVPageIndices = append(d.KVPageIndices[:0], kvPageIndices[:kvIndptr[len(kvIndptr)-1]]...)
	d.KVLen = append(d.KVLen[:0], kvLen...)
	d.NumHeads, d.SMScale = numHeads, smScale
	return nil
}

// DecodeInput is the per-call data of MLA decode.
type DecodeInput struct {
	QNope kernels.Tensor // [B, H, head_dim_ckv]
	QPE   kernels.Tensor // [B, H, head_dim_kpe]
	Cache *kernels.MLACache
	O     kernels.Tensor // output [B, H, head_dim_ckv]
	LSE   []float32      // output [B*H] base-2 LSE, or nil
}

// Run computes, for every request b and head h,
// s_j = (q_nope·ckv_j + q_pe·kpe_j) * SMScale over the request's KVLen[b]
// tokens and o = softmax(s)·ckv, on backend b (Backend.MLADecode), which
// validates everything first.
func (d *DecodePlan) Run(b kernels.Backend, in DecodeInput) error {
	if in.Cache == nil {
		return fmt.Errorf("mla: decode: nil cache: %w", ErrBadDecodePlan)
	}
	d.params = kernels.MLADecodeParams{
		QNope: in.QNope, QPE: in.QPE, Cache: *in.Cache,
		KVIndptr: d.KVIndptr, KVPageIndices: d.KVPageIndices, KVLen: d.KVLen,
		NumHeads: d.NumHeads, SMScale: d.SMScale, O: in.O, LSE: in.LSE,
	}
	err := b.MLADecode(&d.params)
	d.params = kernels.MLADecodeParams{}
	if err != nil {
		return fmt.Errorf("mla: decode on backend %s: %w", b.Name(), err)
	}
	return nil
}
