package kernels

import (
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// Tensor is a dense, row-major, little-endian host tensor.
// len(Data) must equal product(Shape) * DType.Size().
type Tensor struct {
	DType layout.DType
	Shape []int
	Data  []byte
}

// PagedKVCache is FlashInfer's paged_kv_cache argument in host memory: one
// 5-D tensor (Geometry.Form == layout.Fused, in Data) or a K/V pair of 4-D
// tensors (layout.Split, in K and V). See layout.Paged for the offsets.
//
// An NVFP4 cache (Geometry.DType == layout.NVFP4) also has FlashInfer's
// kv_cache_sf in the same form: SF (Fused) or KSF and VSF (Split), e4m3
// block scales with the last dimension D/16, while the data buffers hold
// packed e2m1 with the last dimension D/2 (docs/layout.md, "NVFP4").
type PagedKVCache struct {
	Geometry layout.Paged
	Data     []byte // Fused: [pages, 2, N, H, D] (NHD) or [pages, 2, H, N, D] (HND)
	K, V     []byte // Split: [pages, N, H, D] (NHD) or [pages, H, N, D] (HND) each
	SF       []byte // NVFP4, Fused: [pages, 2, N, H, D/16] (NHD) or [pages, 2, H, N, D/16] (HND)
	KSF, VSF []byte // NVFP4, Split: [pages, N, H, D/16] (NHD) or [pages, H, N, D/16] (HND) each
}

// PageTable is FlashInfer's CSR page table for a batch of B requests.
//
// KVIndptr has length B+1 and KVIndptr[0] == 0; request b owns the pages
// KVPageIndices[KVIndptr[b]:KVIndptr[b+1]]; KVLastPageLen[b] is 0 for a request
// with no pages and 1..page_size otherwise. Token t of request b lives in
// entry t % page_size of page KVPageIndices[KVIndptr[b] + t/page_size].
type PageTable struct {
	KVIndptr      []int32 // [B+1]
	KVPageIndices []int32 // [KVIndptr[B]] physical page ids (may be longer; the tail is unused)
	KVLastPageLen []int32 // [B]
}

// CascadeLevel is one level of multi-level cascade attention, with
// FlashInfer's per-level arrays (MultiLevelCascadeAttentionWrapper's
// qo_indptr_arr[l], paged_kv_indptr_arr[l], paged_kv_indices_arr[l],
// paged_kv_last_page_len_arr[l]): the level's groups are a batch prefill
// whose query rows are QOIndptr and whose page table is [CascadeLevel.Table].
// cascade.Level and kernels/cuda's Level are this type.
type CascadeLevel struct {
	QOIndptr      []int32 // [groups+1]: group g's query rows are QOIndptr[g]:QOIndptr[g+1]
	KVIndptr      []int32 // [groups+1]: group g's pages are KVPageIndices[KVIndptr[g]:KVIndptr[g+1]]
	KVPageIndices []int32 // [KVIndptr[groups]] physical page ids
	KVLastPageLen []int32 // [groups]: 0 for a group without pages, else 1..page_size
}

// Table is the level's page table, its groups as the batch; it shares the
// level's arrays.
func (l *CascadeLevel) Table() PageTable {
	return PageTable{KVIndptr: l.KVIndptr, KVPageIndices: l.KVPageIndices, KVLastPageLen: l.KVLastPageLen}
}

// AppendParams are the arguments of append_paged_kv_cache.
//
// The page table describes the cache after the append (pages for the new
// tokens are already reserved). Row i of AppendKey/AppendValue goes to token
// Positions[i] of request BatchIndices[i].
//
// When AppendKey.DType equals the cache dtype the copy is bit-exact, as in
// FlashInfer. Otherwise (an extension of FlashInfer's API: f32/f16/bf16 rows
// into an fp8 cache) each value x is stored as convert(x / KScale) for keys
// and convert(x / VScale) for values, rounding to nearest even and
// saturating; a zero scale means 1. Into an NVFP4 cache, KScale and VScale
// are the global scales (FlashInfer's k_scale/v_scale of
// nvfp4_quantize_append_paged_kv_cache): each 16-element block stores
// e2m1 codes and an e4m3 scale with x ~ e2m1*scale*KScale (quant.QuantizeNVFP4).
type AppendParams struct {
	AppendKey, AppendValue Tensor  // [nnz, H, D]
	BatchIndices           []int32 // [nnz]
	Positions              []int32 // [nnz]
	Cache                  PagedKVCache
	Table                  PageTable
	KScale, VScale         float64
}

// MLACache is an MLA paged cache in host memory: ckv [pages, N, 512] and
// kpe [pages, N, 64], fused into one [pages, N, 576] tensor (Geometry.Form ==
// layout.Fused, in Data) or split (layout.Split, in CKV and KPE).
type MLACache struct {
	Geometry layout.MLA
	Data     []byte // Fused
	CKV, KPE []byte // Split
}

// MLAAppendParams are the arguments of append_paged_mla_kv_cache. The page
// table describes the cache after the append; KVLastPageLen is not read by
// the copy but, when given, must be consistent with KVIndptr.
type MLAAppendParams struct {
	AppendCKV     Tensor  // [nnz, head_dim_ckv]
	AppendKPE     Tensor  // [nnz, head_dim_kpe]
	BatchIndices  []int32 // [nnz]
	Positions     []int32 // [nnz]
	Cache         MLACache
	KVIndptr      []int32 // [B+1]
	KVPageIndices []int32 // [KVIndptr[B]]
	KVLastPageLen []int32 // [B], optional
}

// AttentionParams are the scalar parameters shared by decode and prefill.
type AttentionParams struct {
	NumQOHeads int // Hq; must be a multiple of the cache's num_kv_heads
	// SMScale multiplies q·k; 0 means FlashInfer's default 1/sqrt(head_dim).
	// It must be finite.
	SMScale float64
	// WindowLeft >= 0 keeps only keys j >= p - WindowLeft for a query at
	// absolute position p; -1 disables the window.
	WindowLeft int
	// LogitsSoftCap > 0 replaces each scaled logit s by cap*tanh(s/cap); 0
	// disables it. A cap whose cap*log2(e) or 1/cap is not a finite float32
	// (about 2.9e-39 .. 2.4e38) is refused.
	LogitsSoftCap float64
	// KScale and VScale dequantise an fp8 cache as FlashInfer does: KScale is
	// folded into the softmax scale, VScale multiplies the output. 0 means 1.
	KScale, VScale float64
	// Sinks is FlashInfer's `sinks` (gpt-oss's learned attention sinks):
	// nil, or one logit per query head ([NumQOHeads] float32) that joins
	// every softmax denominator of that head and contributes no value. A
	// sink is in the natural-log domain of the scaled logits s_j = x_j *
	// sm_scale (sm_scale, k_scale and the soft cap are not applied to it);
	// the returned LSE includes it. Each must be finite, with sink*log2(e)
	// a finite float32. See docs/attention.md, "Attention sinks".
	Sinks []float32
}

// SinkLog2 returns query head h's sink in the base-2 domain the kernels
// work in (sink*log2(e)), or -inf when there are no sinks: a key of that
// logit with value zero.
func (a *AttentionParams) SinkLog2(h int) float32 {
	if len(a.Sinks) == 0 {
		return float32(math.Inf(-1))
	}
	return float32(float64(a.Sinks[h]) * math.Log2E)
}

// DecodeParams are the arguments of batch decode: one query token per
// request, attending every key of its request (subject to WindowLeft).
type DecodeParams struct {
	Q     Tensor // [B, Hq, D], f32/f16/bf16
	Cache PagedKVCache
	Table PageTable
	AttentionParams
	O   Tensor    // output [B, Hq, D], f32/f16/bf16
	LSE []float32 // output [B*Hq] base-2 LSE, or nil
}

// PrefillParams are the arguments of batch prefill over a paged cache with
// ragged queries: request b's queries are rows QOIndptr[b]:QOIndptr[b+1] of Q
// and are the last qo_len tokens of its kv_len keys (bottom-right alignment).
type PrefillParams struct {
	Q        Tensor  // [nnz_qo, Hq, D]
	QOIndptr []int32 // [B+1]
	Cache    PagedKVCache
	Table    PageTable
	Causal   bool
	AttentionParams
	O   Tensor    // output [nnz_qo, Hq, D]
	LSE []float32 // output [nnz_qo*Hq], or nil
}

// MLADecodeParams are the arguments of MLA decode:
// s = (q_nope·ckv + q_pe·kpe) * SMScale, o = softmax(s)·ckv.
type MLADecodeParams struct {
	QNope         Tensor // [B, H, head_dim_ckv]
	QPE           Tensor // [B, H, head_dim_kpe]
	Cache         MLACache
	KVIndptr      []int32 // [B+1]
	KVPageIndices []int32 // [KVIndptr[B]]
	KVLen         []int32 // [B] tokens per request
	NumHeads      int
	SMScale       float64   // must be finite and non-zero
	O             Tensor    // output [B, H, head_dim_ckv]
	LSE           []float32 // output [B*H], or nil
}

// MergeStateParams are the arguments of merge_state: for every (row, head),
// the attention state (VA, SA) merged with (VB, SB) into (V, S). S may alias
// SA and V may alias VA (in-place merge).
type MergeStateParams struct {
	VA, VB Tensor    // [n, H, D]
	SA, SB []float32 // [n*H] base-2 LSE
	V      Tensor    // output [n, H, D]
	S      []float32 // output [n*H]
}

// MergeStatesParams are the arguments of merge_states: S states per row
// merged into one.
type MergeStatesParams struct {
	V    Tensor    // [n, S, H, D]
	S    []float32 // [n*S*H]
	OutV Tensor    // output [n, H, D]
	OutS []float32 // output [n*H]
}
