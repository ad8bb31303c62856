// decode.cu: batch decode over a paged KV cache (one query token per request),
// FlashInfer's BatchDecodeWithPagedKVCacheWrapper.run, on CUDA cores. Its
// split-k partial states are merged by merge_partial_states (merge.cu).
//
// Thread mapping of batch_decode_paged_<kv>_v<VEC>:
//   grid  = (work items, num_kv_heads, ceil(group / heads_per_block))
//   block = (32, heads_per_block, nz)
// A work item is (q_row, request, kv_begin, kv_end): query row q_row of q
// attends keys [kv_begin, kv_end) of its request (clipped to the request's
// length), a whole request's visible range or one chunk of it when the
// launcher splits the KV sequence (split-k). The launcher computes the range
// on the host, so the same kernel serves decode (q_row = request, the keys
// inside the window) and prefill (one item per query row, the range cut by
// the bottom-right causal mask and the window). The
// block owns kv head blockIdx.y and the query heads of its GQA group that
// share it (threadIdx.y picks one), so every K/V byte a block loads from
// global memory serves all of them. One warp holds one query head vector: lane
// l owns features [l*VEC, l*VEC+VEC) (VEC = 2, 4, 8 for head_dim 64, 128,
// 256; other dims take the smallest VEC with 32*VEC >= head_dim and leave
// the features past head_dim idle), so q·k is VEC multiply-adds per lane and
// a 5-step xor-shuffle sum.
//
// The KV range is walked in tiles of tile_tokens tokens through the page
// table (kv_indptr/kv_indices/kv_last_page_len). Tiles are double-buffered
// in shared memory: while the block computes on one stage, cp.async fills
// the other. Within a tile, warp z (threadIdx.z) takes rows
// [z*tile/nz, (z+1)*tile/nz) and keeps its own online-softmax state
// (m, d, o) in the log2 domain, scoring kRows keys at a time; at the end the nz states of a query head are
// merged through shared memory. Output: o = sum_j p_j v_j / sum_j p_j times
// v_scale, and the base-2 LSE m + log2(d) (-inf and o = 0 when no key is
// visible).
//
// Logits: s = (q·k) * sm_scale, or cap * tanh(s / cap) with a soft cap.
#include "compat.cuh"
#include "decode_args.cuh"

namespace pkv {

// kRows is how many keys a warp scores at once.
constexpr int kRows = 4;

// copy_unit_bytes copies unit (16, 8, 4, 2 or 1) bytes from global src to
// shared dst, both unit-aligned: cp.async for 16, a plain load and store
// otherwise.
__device__ __forceinline__ void copy_unit_bytes(unsigned char* dst, const unsigned char* src, int64_t unit) {
  switch (unit) {
    case 16:
      cp_async_16(dst, src);
      break;
    case 8:
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
      break;
    case 4:
      *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
      break;
    case 2:
      *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src);
      break;
    default:
      *dst = *src;
  }
}

// copy_tile issues the copies of tokens [t0, min(t0+tile, end)) of kv head h
// into one stage (K tile, then V tile, each tile rows of pitch bytes). Rows at
// or past end are left as they are: the compute loop never reads them.
template <typename T>
__device__ __forceinline__ void copy_tile(unsigned char* __restrict__ k_stage, unsigned char* __restrict__ v_stage,
                                          const T* __restrict__ k_data, const T* __restrict__ v_data,
                                          const int32_t* __restrict__ kv_indices, int64_t first_page, int64_t t0,
                                          int64_t end, int64_t h, int64_t tile, int64_t pitch, int64_t row_bytes,
                                          int64_t copy_unit, int64_t page_size, int64_t num_pages,
                                          int64_t stride_page, int64_t stride_n, int64_t stride_h, int tid,
                                          int nthreads) {
  // Index math in 32 bits (a tile has at most 32 rows of at most 1 KiB):
  // 64-bit division costs dozens of instructions on a GPU.
  const uint32_t units = uint32_t(row_bytes / copy_unit);
  const uint32_t total = uint32_t(tile) * units;
  for (uint32_t c = tid; c < total; c += uint32_t(nthreads)) {
    const int64_t r = c / units;
    const int64_t u = c - uint32_t(r) * units;
    const int64_t t = t0 + r;
    if (t >= end) continue;
    // Token t lives in entry t % page_size of page kv_indices[first + t / page_size];
    // lengths fit in 32 bits (checked by the launcher), so divide in 32 bits.
    const uint32_t pi = uint32_t(t) / uint32_t(page_size);
    const int64_t entry = int64_t(uint32_t(t) - pi * uint32_t(page_size));
    const int64_t page = kv_indices[first_page + pi];
    if (page < 0 || page >= num_pages) continue;  // never after host validation
    const int64_t off = (page * stride_page + h * stride_h + entry * stride_n) * int64_t(sizeof(T)) + u * copy_unit;
    const unsigned char* ks = reinterpret_cast<const unsigned char*>(k_data) + off;
    const unsigned char* vs = reinterpret_cast<const unsigned char*>(v_data) + off;
    copy_unit_bytes(k_stage + r * pitch + u * copy_unit, ks, copy_unit);
    copy_unit_bytes(v_stage + r * pitch + u * copy_unit, vs, copy_unit);
  }
  cp_async_commit();
}

// copy_tile_nvfp4 is copy_tile for an NVFP4 cache: a tile row holds the
// token's head_dim/2 code bytes and, behind them, its head_dim/16 scale
// bytes (pitch bytes in all). Element offset e of the row's first element
// has its codes at byte e/2 of the data tensors and its scales at byte e/16
// of the scale tensors (every stride is a multiple of head_dim, itself a
// multiple of 16). Codes go in copy_unit-byte units (cp.async for 16), the
// scales in the widest unit dividing head_dim/16 (at most 16).
__device__ __forceinline__ void copy_tile_nvfp4(unsigned char* __restrict__ k_stage,
                                                unsigned char* __restrict__ v_stage,
                                                const uint8_t* __restrict__ k_data, const uint8_t* __restrict__ v_data,
                                                const uint8_t* __restrict__ k_sf, const uint8_t* __restrict__ v_sf,
                                                const int32_t* __restrict__ kv_indices, int64_t first_page, int64_t t0,
                                                int64_t end, int64_t h, int64_t tile, int64_t pitch, int64_t head_dim,
                                                int64_t copy_unit, int64_t page_size, int64_t num_pages,
                                                int64_t stride_page, int64_t stride_n, int64_t stride_h, int tid,
                                                int nthreads) {
  const uint32_t code_bytes = uint32_t(head_dim / 2), sf_bytes = uint32_t(head_dim / 16);
  const uint32_t sf_unit = (sf_bytes & (0u - sf_bytes)) < 16u ? (sf_bytes & (0u - sf_bytes)) : 16u;
  const uint32_t code_units = code_bytes / uint32_t(copy_unit);
  const uint32_t units = code_units + sf_bytes / sf_unit;
  const uint32_t total = uint32_t(tile) * units;
  for (uint32_t c = tid; c < total; c += uint32_t(nthreads)) {
    const uint32_t r = c / units;
    const uint32_t u = c - r * units;
    const int64_t t = t0 + r;
    if (t >= end) continue;
    const uint32_t pi = uint32_t(t) / uint32_t(page_size);
    const int64_t entry = int64_t(uint32_t(t) - pi * uint32_t(page_size));
    const int64_t page = kv_indices[first_page + pi];
    if (page < 0 || page >= num_pages) continue;  // never after host validation
    const int64_t e = page * stride_page + h * stride_h + entry * stride_n;
    unsigned char* kd = k_stage + int64_t(r) * pitch;
    unsigned char* vd = v_stage + int64_t(r) * pitch;
    if (u < code_units) {
      const int64_t off = e / 2 + int64_t(u) * copy_unit;
      copy_unit_bytes(kd + u * copy_unit, k_data + off, copy_unit);
      copy_unit_bytes(vd + u * copy_unit, v_data + off, copy_unit);
    } else {
      const uint32_t b = (u - code_units) * sf_unit;
      copy_unit_bytes(kd + code_bytes + b, k_sf + e / 16 + b, sf_unit);
      copy_unit_bytes(vd + code_bytes + b, v_sf + e / 16 + b, sf_unit);
    }
  }
  cp_async_commit();
}

template <typename KV, int VEC>
__device__ __forceinline__ void decode_body(PKV_DECODE_PARAMS(typename KV::T, float), const uint8_t* __restrict__ k_sf,
                                            const uint8_t* __restrict__ v_sf) {
  using T = typename KV::T;
  const int lane = int(threadIdx.x);
  const int hpb = int(blockDim.y);
  const int nz = int(blockDim.z);
  const int warp = int(threadIdx.z) * hpb + int(threadIdx.y);
  const int nwarps = hpb * nz;
  const int tid = warp * 32 + lane;
  const int64_t item = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t group = num_qo_heads / num_kv_heads;
  const int64_t qh = int64_t(blockIdx.z) * hpb + threadIdx.y;
  const bool active = qh < group;  // the last block of a group may have idle warps
  const int64_t hq = h * group + qh;
  const int64_t D = head_dim;
  const int64_t f0 = int64_t(lane) * VEC;
  const bool lane_full = f0 + VEC <= D;  // all VEC features of this lane exist

  const WorkItem wi = work_item(work, item, kv_indptr, kv_last_page_len, page_size);
  if (partial && wi.empty) return;  // split-KV padding (WorkItem::empty)
  const int64_t qrow = wi.qrow, first_page = wi.first_page, begin = wi.begin, end = wi.end;

  constexpr bool kFP4 = kIsNVFP4<KV>;
  // An NVFP4 tile row is D/2 code bytes, then D/16 scale bytes.
  const int64_t row_bytes = kFP4 ? D / 2 + D / 16 : D * int64_t(sizeof(T));
  const int64_t pitch = (row_bytes + 15) / 16 * 16;
  const int64_t tile_bytes = tile * pitch;
  PKV_DYN_SMEM(unsigned char, smem);
  float* merge_m = reinterpret_cast<float*>(smem + 4 * tile_bytes);
  float* merge_d = merge_m + nwarps;
  float* merge_o = merge_d + nwarps;  // [nwarps][D]

  float qv[VEC], ov[VEC];
#pragma unroll
  for (int i = 0; i < VEC; i++) {
    qv[i] = active && f0 + i < D ? load_f32(q, (qrow * num_qo_heads + hq) * D + f0 + i, q_dtype) * q_scale : 0.0f;
    ov[i] = 0.0f;
  }
  float m = neg_inf();  // running max of the log2-domain logits
  float d = 0.0f;       // running sum of 2^(s - m)

  const int64_t rows = tile / nz;
  const int64_t r0 = int64_t(threadIdx.z) * rows;
  const float cap_log2e = soft_cap * kLog2e;
  int stage = 0;
  if (begin < end) {
    if constexpr (kFP4) {
      copy_tile_nvfp4(smem, smem + tile_bytes, k_data, v_data, k_sf, v_sf, kv_indices, first_page, begin, end, h,
                      tile, pitch, D, copy_unit, page_size, num_pages, stride_page, stride_n, stride_h, tid,
                      32 * nwarps);
    } else {
      copy_tile(smem, smem + tile_bytes, k_data, v_data, kv_indices, first_page, begin, end, h, tile, pitch,
                row_bytes, copy_unit, page_size, num_pages, stride_page, stride_n, stride_h, tid, 32 * nwarps);
    }
  }
  for (int64_t t0 = begin; t0 < end; t0 += tile) {
    if (t0 + tile < end) {
      unsigned char* next = smem + 2 * (stage ^ 1) * tile_bytes;
      if constexpr (kFP4) {
        copy_tile_nvfp4(next, next + tile_bytes, k_data, v_data, k_sf, v_sf, kv_indices, first_page, t0 + tile, end,
                        h, tile, pitch, D, copy_unit, page_size, num_pages, stride_page, stride_n, stride_h, tid,
                        32 * nwarps);
      } else {
        copy_tile(next, next + tile_bytes, k_data, v_data, kv_indices, first_page, t0 + tile, end, h, tile, pitch,
                  row_bytes, copy_unit, page_size, num_pages, stride_page, stride_n, stride_h, tid, 32 * nwarps);
      }
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // (A) this stage is filled by every thread's copies
    if (active) {
      const unsigned char* ks = smem + 2 * stage * tile_bytes;
      const unsigned char* vs = ks + tile_bytes;
      const int64_t r_end = r0 + rows < end - t0 ? r0 + rows : end - t0;  // warp-uniform
      // kRows keys at a time: their dot products and shuffle sums are
      // independent, so the shuffle latency overlaps instead of adding up.
      for (int64_t r = r0; r < r_end; r += kRows) {
        float s[kRows];
#pragma unroll
        for (int j = 0; j < kRows; j++) {
          s[j] = 0.0f;
          if (r + j >= r_end) continue;
          if constexpr (kFP4) {
            // VEC (even) features of one 16-element block: their scale
            // (times 2^14, the codes' unit) multiplies the lane's sum once.
            if (!lane_full) continue;  // D is a multiple of 16: a lane is all in or all out
            const unsigned char* krow = ks + (r + j) * pitch;
            float kw[VEC];
            nvfp4_widen<VEC>(krow + f0 / 2, kw);
#pragma unroll
            for (int i = 0; i < VEC; i++) s[j] += qv[i] * kw[i];
            s[j] *= e4m3_to_f32(krow[D / 2 + f0 / 16]) * kE2M1Unit;
          } else if constexpr (KV::kPairs) {  // fp8 on sm_89+ and in the emulator: packed converts
            const T* krow = reinterpret_cast<const T*>(ks + (r + j) * pitch) + f0;
            float kw[VEC];
            widen_vec<KV, VEC>(krow, lane_full, D - f0, kw);
#pragma unroll
            for (int i = 0; i < VEC; i++)
              if (lane_full || f0 + i < D) s[j] += qv[i] * kw[i];
          } else {
            const T* krow = reinterpret_cast<const T*>(ks + (r + j) * pitch) + f0;
#pragma unroll
            for (int i = 0; i < VEC; i++)
              if (lane_full || f0 + i < D) s[j] += qv[i] * KV::widen(krow[i]);
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
          for (int j = 0; j < kRows; j++)
            if (r + j < r_end) s[j] += __shfl_xor_sync(0xffffffffu, s[j], off);  // warp-uniform test
        }
        float m_new = m;
#pragma unroll
        for (int j = 0; j < kRows; j++) {
          if (r + j >= r_end) continue;
          if (soft_cap > 0.0f) s[j] = cap_log2e * tanhf(s[j] / soft_cap);
          m_new = fmaxf(m_new, s[j]);
        }
        const float corr = exp2_approx(m - m_new);
        d *= corr;
#pragma unroll
        for (int i = 0; i < VEC; i++) ov[i] *= corr;
#pragma unroll
        for (int j = 0; j < kRows; j++) {
          if (r + j >= r_end) continue;
          const float p = exp2_approx(s[j] - m_new);
          d += p;
          if constexpr (kFP4) {
            if (!lane_full) continue;
            const unsigned char* vrow = vs + (r + j) * pitch;
            float vw[VEC];
            nvfp4_widen<VEC>(vrow + f0 / 2, vw);
            const float ps = p * (e4m3_to_f32(vrow[D / 2 + f0 / 16]) * kE2M1Unit);
#pragma unroll
            for (int i = 0; i < VEC; i++) ov[i] += ps * vw[i];
          } else if constexpr (KV::kPairs) {
            const T* vrow = reinterpret_cast<const T*>(vs + (r + j) * pitch) + f0;
            float vw[VEC];
            widen_vec<KV, VEC>(vrow, lane_full, D - f0, vw);
#pragma unroll
            for (int i = 0; i < VEC; i++)
              if (lane_full || f0 + i < D) ov[i] += p * vw[i];
          } else {
            const T* vrow = reinterpret_cast<const T*>(vs + (r + j) * pitch) + f0;
#pragma unroll
            for (int i = 0; i < VEC; i++)
              if (lane_full || f0 + i < D) ov[i] += p * KV::widen(vrow[i]);
          }
        }
        m = m_new;
      }
    }
    __syncthreads();  // (B) every warp is done with this stage before it is refilled
    stage ^= 1;
  }

  // Merge the nz states of each query head into warp z == 0.
  if (nz > 1) {
    if (active) {
#pragma unroll
      for (int i = 0; i < VEC; i++)
        if (f0 + i < D) merge_o[warp * D + f0 + i] = ov[i];
      if (lane == 0) {
        merge_m[warp] = m;
        merge_d[warp] = d;
      }
    }
    __syncthreads();
    if (threadIdx.z == 0 && active) {
      for (int z = 1; z < nz; z++) {
        const int wz = z * hpb + int(threadIdx.y);
        const float mz = merge_m[wz];
        if (mz == neg_inf()) continue;  // that warp saw no key
        const float m_new = fmaxf(m, mz);
        const float c_self = exp2_approx(m - m_new);
        const float c_other = exp2_approx(mz - m_new);
        d = d * c_self + merge_d[wz] * c_other;
#pragma unroll
        for (int i = 0; i < VEC; i++)
          if (f0 + i < D) ov[i] = ov[i] * c_self + merge_o[wz * D + f0 + i] * c_other;
        m = m_new;
      }
    }
  }

  if (threadIdx.z != 0 || !active) return;
  const bool empty = !(d > 0.0f);
  const float inv_d = empty ? 0.0f : rcp_approx(d);
  const float out_lse = empty ? neg_inf() : m + log2_approx(d);
  if (partial) {
    const int64_t row = item * num_qo_heads + hq;
#pragma unroll
    for (int i = 0; i < VEC; i++)
      if (f0 + i < D) tmp_o[row * D + f0 + i] = ov[i] * inv_d;
    if (lane == 0) tmp_lse[row] = out_lse;
  } else {
    const int64_t row = qrow * num_qo_heads + hq;
#pragma unroll
    for (int i = 0; i < VEC; i++)
      if (f0 + i < D) store_f32(o, row * D + f0 + i, o_dtype, ov[i] * inv_d * v_scale);
    if (lse != nullptr && lane == 0) lse[row] = out_lse;
  }
}

}  // namespace pkv

// batch_decode_paged_<kv>_v<VEC>. Pointers: q [rows, Hq, D] (q_dtype), the K
// and V views of the cache (element strides stride_page/stride_n/stride_h),
// the page table, work [items][4] = (q_row, request, kv_begin, kv_end),
// o [rows, Hq, D] (o_dtype) and lse [rows*Hq] (may be null) when
// partial == 0, else
// tmp_o [items, Hq, D] and tmp_lse [items, Hq] (f32) for merge_partial_states.
// q_scale multiplies q (sm_scale*log2(e), or sm_scale with a soft cap);
// soft_cap 0 disables the cap; the float scalars are carried in doubles.
//
// __launch_bounds__(256, 4): at most 64 registers, four 256-thread blocks per
// SM. With no minimum ptxas picked 48 registers for some entries and spilled
// (e4m3_v4 on sm_80: 56 bytes; e5m2_v2: 20 bytes) and 69-79 for the v8
// entries (three blocks per SM); with it every entry fits 64 without spills.
// The names this macro builds are written out in doc.go's entry-point table.
#define PKV_DECODE_ENTRY(NAME, KV, VEC)                                                                    \
  extern "C" __global__ void __launch_bounds__(256, 4) NAME(PKV_DECODE_PARAMS(KV::T, double)) { \
    pkv::decode_body<KV, VEC>(PKV_DECODE_FORWARD, nullptr, nullptr);                                   \
  }

// batch_decode_paged_nvfp4_v<VEC>: the same arguments, k_data/v_data the
// NVFP4 code tensors, then k_sf and v_sf, their scale tensors (strides in
// elements as for every dtype). VEC >= 2: a lane holds whole code bytes.
#define PKV_DECODE_NVFP4_ENTRY(VEC)                                                                       \
  extern "C" __global__ void __launch_bounds__(256, 4) batch_decode_paged_nvfp4_v##VEC(                   \
      PKV_DECODE_PARAMS(uint8_t, double), const uint8_t* __restrict__ k_sf, const uint8_t* __restrict__ v_sf) { \
    pkv::decode_body<pkv::KvNVFP4, VEC>(PKV_DECODE_FORWARD, k_sf, v_sf);                                  \
  }

#define PKV_DECODE_DTYPE(SUFFIX, KV)                   \
  PKV_DECODE_ENTRY(batch_decode_paged_##SUFFIX##_v1, KV, 1) \
  PKV_DECODE_ENTRY(batch_decode_paged_##SUFFIX##_v2, KV, 2) \
  PKV_DECODE_ENTRY(batch_decode_paged_##SUFFIX##_v4, KV, 4) \
  PKV_DECODE_ENTRY(batch_decode_paged_##SUFFIX##_v8, KV, 8)

PKV_DECODE_DTYPE(f32, pkv::KvF32)
PKV_DECODE_DTYPE(f16, pkv::KvF16)
PKV_DECODE_DTYPE(bf16, pkv::KvBF16)
PKV_DECODE_DTYPE(e4m3, pkv::KvE4M3)
PKV_DECODE_DTYPE(e5m2, pkv::KvE5M2)
PKV_DECODE_NVFP4_ENTRY(2)
PKV_DECODE_NVFP4_ENTRY(4)
PKV_DECODE_NVFP4_ENTRY(8)
