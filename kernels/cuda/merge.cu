// merge.cu: the merges of attention states. merge_state and merge_states
// are FlashInfer's flashinfer.merge_state and merge_states, the kernels a
// cascade step merges its levels with; merge_partial_states merges the
// split-k (split-KV) partial states of the decode, prefill and MLA kernels.
//
// Attention states are (v, s) with base-2 LSEs s: the merge of (v_i, s_i) is
// s = log2 sum_i 2^{s_i}, v = sum_i 2^{s_i - s} v_i, in float32. A state with
// s = -inf carries no mass and is skipped (its v is never read, so it may
// hold anything); no live state gives v = 0, s = -inf.
//
// Every entry point takes device pointers and 64-bit scalars only.
#include "compat.cuh"

// merge_state merges (va, sa) with (vb, sb) into (v, s) for rows = n*H
// (row, head) pairs of head_dim features; va/vb/v dtypes are runtime codes
// (f32, f16, bf16). v may alias va or vb and s may alias sa or sb: every
// thread reads both LSEs, the block synchronises, and only then thread 0
// writes s; each feature is read and written by the same thread.
// grid = min(rows, 8*SMs) blocks striding over the rows, block = threads
// over head_dim.
extern "C" __global__ void __launch_bounds__(256)
    merge_state(const void* va, const float* sa, const void* vb, const float* sb, void* v,
                float* s, int64_t rows, int64_t head_dim, int64_t va_dtype, int64_t vb_dtype, int64_t v_dtype) {
  const float ninf = pkv::neg_inf();
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float a = sa[row];
    const float b = sb[row];
    __syncthreads();  // every thread has read sa/sb before s (which may alias them) is written
    float wa = 0.0f, wb = 0.0f, out = ninf;
    if (a != ninf || b != ninf) {
      const float m = fmaxf(a, b);
      wa = a == ninf ? 0.0f : pkv::exp2_approx(a - m);
      wb = b == ninf ? 0.0f : pkv::exp2_approx(b - m);
      const float l = wa + wb;
      const float inv = pkv::rcp_approx(l);
      wa *= inv;
      wb *= inv;
      out = m + pkv::log2_approx(l);
    }
    for (int64_t f = threadIdx.x; f < head_dim; f += blockDim.x) {
      const int64_t i = row * head_dim + f;
      float x = 0.0f;
      if (wa != 0.0f) x += wa * pkv::load_f32(va, i, va_dtype);
      if (wb != 0.0f) x += wb * pkv::load_f32(vb, i, vb_dtype);
      pkv::store_f32(v, i, v_dtype, x);
    }
    if (threadIdx.x == 0) s[row] = out;
  }
}

// merge_states merges the num_states states of each (row, head): v is
// [n, num_states, H, D] (v_dtype), s [n*num_states*H]; out_v [n, H, D]
// (out_dtype) and out_s [n*H] must not overlap the inputs. grid = min(n*H,
// 8*SMs) blocks striding over the (row, head) pairs, block = threads over D.
extern "C" __global__ void __launch_bounds__(256)
    merge_states(const void* __restrict__ v, const float* __restrict__ s, void* __restrict__ out_v,
                 float* __restrict__ out_s, int64_t n, int64_t num_states, int64_t num_heads, int64_t head_dim,
                 int64_t v_dtype, int64_t out_dtype) {
  const float ninf = pkv::neg_inf();
  for (int64_t pair = blockIdx.x; pair < n * num_heads; pair += gridDim.x) {
    const int64_t r = pair / num_heads;
    const int64_t h = pair - r * num_heads;
    float mx = ninf;
    for (int64_t i = 0; i < num_states; i++) mx = fmaxf(mx, s[(r * num_states + i) * num_heads + h]);
    if (mx == ninf) {
      for (int64_t f = threadIdx.x; f < head_dim; f += blockDim.x) pkv::store_f32(out_v, pair * head_dim + f, out_dtype, 0.0f);
      if (threadIdx.x == 0) out_s[pair] = ninf;
      continue;
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < num_states; i++) {
      const float si = s[(r * num_states + i) * num_heads + h];
      if (si != ninf) sum += pkv::exp2_approx(si - mx);
    }
    const float inv = pkv::rcp_approx(sum);
    for (int64_t f = threadIdx.x; f < head_dim; f += blockDim.x) {
      float acc = 0.0f;
      for (int64_t i = 0; i < num_states; i++) {
        const int64_t row = (r * num_states + i) * num_heads + h;
        const float si = s[row];
        if (si == ninf) continue;  // no mass: its v is not read
        acc += pkv::exp2_approx(si - mx) * pkv::load_f32(v, row * head_dim + f, v_dtype);
      }
      pkv::store_f32(out_v, pair * head_dim + f, out_dtype, acc * inv);
    }
    if (threadIdx.x == 0) out_s[pair] = mx + pkv::log2_approx(sum);
  }
}

// merge_partial_states combines the split-k partial states of each (query
// row, query head): rows merge_indptr[b]..merge_indptr[b+1] of tmp_o/tmp_lse,
// weighted by 2^(lse_r - max), into o [rows, Hq, D] (o_dtype, times v_scale)
// and lse [rows*Hq] (may be null). sinks [Hq] (may be null) is folded in
// here, once, as one more state of value zero and LSE sinks[hq]*log2(e): the
// partial states never hold it. grid = (rows, Hq), block = (threads over D).
extern "C" __global__ void __launch_bounds__(256)
    merge_partial_states(const float* __restrict__ tmp_o, const float* __restrict__ tmp_lse,
                         const int32_t* __restrict__ merge_indptr, void* __restrict__ o, float* __restrict__ lse,
                         const float* __restrict__ sinks, int64_t num_qo_heads, int64_t head_dim, int64_t o_dtype,
                         double v_scale) {
  const int64_t b = blockIdx.x;
  const int64_t hq = blockIdx.y;
  const int64_t beg = merge_indptr[b];
  const int64_t end = merge_indptr[b + 1];
  const float sink = sinks == nullptr ? pkv::neg_inf() : sinks[hq] * pkv::kLog2e;
  float mx = sink;
  for (int64_t r = beg; r < end; r++) mx = fmaxf(mx, tmp_lse[r * num_qo_heads + hq]);
  const int64_t out = b * num_qo_heads + hq;
  if (mx == pkv::neg_inf()) {
    for (int64_t f = threadIdx.x; f < head_dim; f += blockDim.x) pkv::store_f32(o, out * head_dim + f, o_dtype, 0.0f);
    if (lse != nullptr && threadIdx.x == 0) lse[out] = mx;
    return;
  }
  float sum = sinks == nullptr ? 0.0f : pkv::exp2_approx(sink - mx);
  for (int64_t r = beg; r < end; r++) sum += pkv::exp2_approx(tmp_lse[r * num_qo_heads + hq] - mx);
  const float scale = float(v_scale) / sum;
  for (int64_t f = threadIdx.x; f < head_dim; f += blockDim.x) {
    float acc = 0.0f;
    for (int64_t r = beg; r < end; r++) {
      const int64_t row = r * num_qo_heads + hq;
      acc += pkv::exp2_approx(tmp_lse[row] - mx) * tmp_o[row * head_dim + f];
    }
    pkv::store_f32(o, out * head_dim + f, o_dtype, acc * scale);
  }
  if (lse != nullptr && threadIdx.x == 0) lse[out] = mx + pkv::log2_approx(sum);
}
