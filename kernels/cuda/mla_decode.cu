// mla_decode.cu: MLA decode on CUDA cores (FlashInfer's
// BatchMLAPagedAttentionWrapper.run for one query per request): every cache
// dtype and head_dim_ckv up to 512. The tensor-core kernels of mla_tc.cu take
// the 16-bit and fp8 caches with FlashInfer's head dims (512 + 64);
// MLAKernelFor (step_mla.go) picks one.
//
// Every entry point takes device pointers and 64-bit scalars only.
#include "compat.cuh"

namespace pkv {

// mla_decode_body: one warp per (request, head); lane l owns ckv features
// l, l+32, ... (CK of them, CK = ceil(head_dim_ckv/32) <= 16), so a warp's
// loads of one ckv row are coalesced. Per key: the lane's partial
// q_nope·ckv + q_pe·kpe, a 5-step xor-shuffle sum, one online-softmax update
// in the log2 domain (q pre-scaled by sm_scale*log2(e)), and o += p*ckv. The
// heads of a block (blockDim.y warps) read the same ckv/kpe rows, which the
// caches keep on chip.
template <typename KV, int CK>
__device__ __forceinline__ void mla_decode_body(const void* __restrict__ q_nope, const void* __restrict__ q_pe,
                                                const typename KV::T* __restrict__ ckv,
                                                const typename KV::T* __restrict__ kpe,
                                                const int32_t* __restrict__ kv_indptr,
                                                const int32_t* __restrict__ kv_indices,
                                                const int32_t* __restrict__ kv_len, void* __restrict__ o,
                                                float* __restrict__ lse, int64_t num_heads, int64_t dckv, int64_t dkpe,
                                                int64_t page_size, int64_t num_pages, int64_t row_ckv, int64_t row_kpe,
                                                int64_t q_dtype, int64_t qpe_dtype, int64_t o_dtype,
                                                float q_scale) {
  const int lane = int(threadIdx.x);
  const int64_t b = blockIdx.x;
  const int64_t h = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  if (h >= num_heads) return;  // whole warp: no collective below is split
  const int64_t qrow = b * num_heads + h;
  float qn[CK], acc[CK];
#pragma unroll
  for (int i = 0; i < CK; i++) {
    const int64_t f = lane + 32 * i;
    qn[i] = f < dckv ? load_f32(q_nope, qrow * dckv + f, q_dtype) * q_scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = neg_inf(), d = 0.0f;
  const int64_t first = kv_indptr[b];
  const int64_t n = kv_len[b];
  for (int64_t t = 0; t < n; t++) {
    const int64_t page = kv_indices[first + t / page_size];
    if (page < 0 || page >= num_pages) continue;  // never after host validation (warp-uniform)
    const int64_t tok = page * page_size + t % page_size;
    const typename KV::T* crow = ckv + tok * row_ckv;
    const typename KV::T* krow = kpe + tok * row_kpe;
    float part = 0.0f;
    float cv[CK];
#pragma unroll
    for (int i = 0; i < CK; i++) {
      const int64_t f = lane + 32 * i;
      cv[i] = f < dckv ? KV::widen(crow[f]) : 0.0f;
      part += qn[i] * cv[i];
    }
    for (int64_t f = lane; f < dkpe; f += 32) part += load_f32(q_pe, qrow * dkpe + f, qpe_dtype) * q_scale * KV::widen(krow[f]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    const float m_new = fmaxf(m, part);
    const float corr = exp2_approx(m - m_new);
    const float p = exp2_approx(part - m_new);
    d = d * corr + p;
#pragma unroll
    for (int i = 0; i < CK; i++) acc[i] = acc[i] * corr + p * cv[i];
    m = m_new;
  }
  const bool empty = !(d > 0.0f);
  const float inv = empty ? 0.0f : rcp_approx(d);
#pragma unroll
  for (int i = 0; i < CK; i++) {
    const int64_t f = lane + 32 * i;
    if (f < dckv) store_f32(o, qrow * dckv + f, o_dtype, acc[i] * inv);
  }
  if (lse != nullptr && lane == 0) lse[qrow] = empty ? neg_inf() : m + log2_approx(d);
}

}  // namespace pkv

// mla_decode_<kv>_c<CK>. Pointers: q_nope [B, H, dckv], q_pe [B, H, dkpe]
// (q_dtype and qpe_dtype), the ckv and kpe views of the cache (row_ckv/row_kpe elements per
// token: the fused row or the split tensors), kv_indptr [B+1], kv_indices,
// kv_len [B], o [B, H, dckv] (o_dtype), lse [B*H] (may be null). q_scale is
// sm_scale*log2(e). grid = (B, ceil(H / heads_per_block)), block = (32,
// heads_per_block).
// The names this macro builds are written out in doc.go's entry-point table.
#define PKV_MLA_ENTRY(NAME, KV, CK)                                                                                 \
  extern "C" __global__ void __launch_bounds__(256) NAME(                                                           \
      const void* __restrict__ q_nope, const void* __restrict__ q_pe, const KV::T* __restrict__ ckv,                \
      const KV::T* __restrict__ kpe, const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices, \
      const int32_t* __restrict__ kv_len, void* __restrict__ o, float* __restrict__ lse, int64_t num_heads,         \
      int64_t dckv, int64_t dkpe, int64_t page_size, int64_t num_pages, int64_t row_ckv, int64_t row_kpe,           \
      int64_t q_dtype, int64_t qpe_dtype, int64_t o_dtype, double q_scale) {                                        \
    pkv::mla_decode_body<KV, CK>(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, kv_len, o, lse, num_heads, dckv,    \
                                 dkpe, page_size, num_pages, row_ckv, row_kpe, q_dtype, qpe_dtype, o_dtype,         \
                                 float(q_scale));                                                                   \
  }

#define PKV_MLA_DTYPE(SUFFIX, KV)                     \
  PKV_MLA_ENTRY(mla_decode_##SUFFIX##_c1, KV, 1)      \
  PKV_MLA_ENTRY(mla_decode_##SUFFIX##_c2, KV, 2)      \
  PKV_MLA_ENTRY(mla_decode_##SUFFIX##_c4, KV, 4)      \
  PKV_MLA_ENTRY(mla_decode_##SUFFIX##_c8, KV, 8)      \
  PKV_MLA_ENTRY(mla_decode_##SUFFIX##_c16, KV, 16)

PKV_MLA_DTYPE(f32, pkv::KvF32)
PKV_MLA_DTYPE(f16, pkv::KvF16)
PKV_MLA_DTYPE(bf16, pkv::KvBF16)
PKV_MLA_DTYPE(e4m3, pkv::KvE4M3)
PKV_MLA_DTYPE(e5m2, pkv::KvE5M2)
