// decode_tc.cu: batch decode over a paged KV cache on tensor cores for
// grouped-query attention (FlashInfer's decode with use_tensor_cores: the
// query heads of a GQA group are the rows of an mma.sync tile).
//
// Thread mapping of batch_decode_paged_tc_<kv>_d<D>:
//   grid  = (work items, num_kv_heads, ceil(group / 16))
//   block = (32, kWarps, 1)
// A work item is (q_row, request, kv_begin, kv_end), as for the CUDA-core
// kernel (decode.cu). The block owns kv head blockIdx.y and query heads
// [16*blockIdx.z, 16*blockIdx.z + 16) of its group: they are the 16 rows M
// of mma.m16n8k16 (rows past the group are zero and never written). Every
// K/V byte the block loads serves all of them.
//
// The KV range is walked in tiles of kKeys = 16*kWarps keys; warp w owns
// keys [16w, 16w+16) of every tile and keeps its own online-softmax state
// (m, d per row, o[16][D] in mma accumulators), in the log2 domain:
//   S[16x16] = Q[16xD] K^T        D/16 k-steps x 2 n-tiles of 8 keys
//   s = S * q_scale (sm_scale*log2e; or sm_scale, then cap*log2e*tanh(s/cap))
//   P = 2^(s - m) rounded to the mma type, the S accumulators re-packed in
//       registers as the A fragment of the next mma (FlashAttention-2)
//   O[16xD] += P[16x16] V[16xD]   D/8 n-tiles
// At the end the kWarps states are merged through shared memory.
//
// Tiles arrive through a kStages-deep cp.async pipeline (16-byte copies)
// through the page table, into a swizzled shared layout: the 16-byte chunk c
// of tile row r sits at r*kPitch + 16*(c ^ (r & 7)), kPitch = max(row bytes,
// 128). Every access the kernel makes to a tile (ldmatrix phases of 8 rows at
// one chunk, 4-byte fp8 K loads, 8/16-byte fp8 V loads, the cp.async writes)
// then touches distinct banks; tc_offsets below lists them and
// internal/cpuemu's TestTCDecodeSharedBanks counts the wavefronts.
//
// f16 and bf16 caches use the matching mma; K fragments come from ldmatrix
// (rows = keys) and V fragments from ldmatrix.trans (V rows are keys). fp8
// caches (e4m3, e5m2) widen to f16 in registers with the packed converts
// (cvt.rn.f16x2.e4m3x2 / e5m2x2 in the sm_90 PTX): a K fragment register is
// two adjacent bytes of a key row, so the kernel permutes the k dimension
// of Q·K^T (k-slots 2t, 2t+1, 2t+8, 2t+9 of k-step kk are the 4 consecutive
// dims 16kk+4t..16kk+4t+3; Q is stored permuted the same way), and a V
// fragment register pairs two keys at one dim, so the kernel permutes the n
// dimension of P·V (column c of n-tile j is dim 128*(j/W) + W*c + j%W, W =
// min(16, D/8)): a lane loads W consecutive bytes of each of its 4 key rows
// and pairs bytes of two rows per register.
//
// Output (same contract as decode.cu): o = sum_j p_j v_j / sum_j p_j times
// v_scale and the base-2 LSE m + log2(d) (-inf and o = 0 when no key is
// visible), or float32 partial states for merge_partial_states.
#include "decode_args.cuh"
#include "tile_common.cuh"

namespace pkv {
namespace tc {

// kStages tiles in flight; kStageBudget bytes of K plus V per stage. The
// whole block stays within 48 KiB of dynamic shared memory, the limit a
// launch gets without cuFuncSetAttribute (see docs/kernels.md).
constexpr int kStages = 2;
constexpr int kStageBudget = 16 << 10;

// Shape is the compile-time geometry of one entry point.
template <typename KV, int D>
struct Shape {
  using T = typename KV::T;
  static constexpr bool kFp8 = sizeof(T) == 1;
  static constexpr int kRowBytes = D * int(sizeof(T));
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks of a K/V row
  static constexpr int kPitch = kRowBytes < 128 ? 128 : kRowBytes;
  static constexpr int kKeys = kStageBudget / (2 * kPitch) < 64 ? kStageBudget / (2 * kPitch) : 64;
  static constexpr int kWarps = kKeys / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTileBytes = kKeys * kPitch;  // one K or V tile
  static constexpr int kQPitch = 2 * D;              // Q tile rows: 16-bit mma type
  static constexpr int kQOff = kStages * 2 * kTileBytes;
  static constexpr int kQTile = 16 * kQPitch;
  static constexpr int kSmem = kQOff + 2 * kQTile;  // Q high and low parts
  static constexpr int kW = D / 8 < 16 ? D / 8 : 16;  // fp8 V: bytes a lane loads per row and segment
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  static_assert(kWarps >= 1 && kKeys % 16 == 0, "whole warps of 16 keys");
  // The merge of the warps' states fits in the stage buffers and the Q area.
  static_assert(kWarps * 16 * D * 4 <= kQOff && kWarps * 32 * 4 <= kQTile, "merge buffers");
  static_assert(kSmem <= 48 * 1024, "within the default dynamic shared memory limit");
};

// swz is the byte offset of 16-byte chunk c of row r in a swizzled tile.
__device__ __forceinline__ uint32_t swz(uint32_t r, uint32_t c, uint32_t pitch) {
  return r * pitch + ((c ^ (r & 7u)) << 4);
}

// Ops holds what depends on the mma input type: f16 for f16 and fp8
// caches, bf16 for bf16 caches.
template <typename KV>
struct Ops {
  static constexpr int64_t kType = kF16;
  static constexpr bool kIsBF16 = false;
  __device__ static __forceinline__ uint16_t narrow(float x) { return f32_to_f16(x); }
  __device__ static __forceinline__ float widen(uint16_t x) { return f16_to_f32(x); }
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_m16n8k16_f32_f16(d, a, b, d);
  }
};
template <>
struct Ops<KvBF16> {
  static constexpr int64_t kType = kBF16;
  static constexpr bool kIsBF16 = true;
  __device__ static __forceinline__ uint16_t narrow(float x) { return f32_to_bf16(x); }
  __device__ static __forceinline__ float widen(uint16_t x) { return bf16_to_f32(x); }
  __device__ static __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_m16n8k16_f32_bf16(d, a, b, d);
  }
};

// fp8x2 widens the two fp8 codes of pair into an f16x2 register (the
// packed hardware convert on sm_89+, its C twin elsewhere).
__device__ __forceinline__ uint32_t fp8x2(KvE4M3, uint32_t pair) { return cvt_f16x2_e4m3x2(uint16_t(pair)); }
__device__ __forceinline__ uint32_t fp8x2(KvE5M2, uint32_t pair) { return cvt_f16x2_e5m2x2(uint16_t(pair)); }

// q_slot is the Q tile column that holds dim d: d itself for 16-bit caches;
// for fp8 the k permutation above (dim 16kk + 4t + 2h + e at slot
// 16kk + 8h + 2t + e).
template <bool kFp8>
__device__ __forceinline__ uint32_t q_slot(uint32_t d) {
  if (!kFp8) return d;
  const uint32_t x = d & 15u;
  return (d & ~15u) | ((x >> 1 & 1u) << 3) | ((x >> 2) << 1) | (x & 1u);
}

// o_dim is the dim of column c of output n-tile j (see the header).
template <typename KV, int D>
__device__ __forceinline__ uint32_t o_dim(uint32_t j, uint32_t c) {
  using S = Shape<KV, D>;
  if (!S::kFp8) return 8 * j + c;
  return 128 * (j / S::kW) + S::kW * c + j % S::kW;
}

// The shared-memory byte offsets each lane reads or writes (relative to the
// Q tile, or to a K or V tile); the kernel addresses shared memory only
// through these, and TestTCDecodeSharedBanks counts their wavefronts.
//   q_frag: ldmatrix.x4 of Q's A fragment for k-step kk
//   k_frag: ldmatrix.x4 (16-bit) of K rows key0.., k-step kk, or for fp8
//           the 4 bytes of key key0 + 8*half + g at dims 16kk + 4t
//   v_frag: ldmatrix.x4.trans (16-bit) of V rows key0.., dims 16jj..; or
//           for fp8 the kW bytes of segment jj of key row key0 + kv_row(i)
//   copy_dst: where the cp.async copy k of thread tid lands
// A k-step (or n-tile pair) kk moves a fragment by 2kk chunks (16-bit
// types) or kk chunks (fp8 K) from its chunk at step 0, which is below 8:
// swz_xor(offset at step 0, 32kk or 16kk), so ptxas computes a lane's
// offsets once and each step is an XOR or an address immediate.
template <typename KV, int D>
__device__ __forceinline__ uint32_t q_frag(uint32_t lane, uint32_t kk) {
  return swz_xor(swz((lane & 7u) + 8u * (lane >> 3 & 1u), lane >> 4, Shape<KV, D>::kQPitch), int(32 * kk));
}
template <typename KV, int D>
__device__ __forceinline__ uint32_t k_frag(uint32_t lane, uint32_t key0, uint32_t kk, uint32_t half) {
  using S = Shape<KV, D>;
  if (S::kFp8) return swz_xor(swz(key0 + 8u * half + (lane >> 2), 0, S::kPitch) + 4u * (lane & 3u), int(16 * kk));
  return swz_xor(swz(key0 + (lane & 7u) + 8u * (lane >> 4), lane >> 3 & 1u, S::kPitch), int(32 * kk));
}
// kv_row is the key (within the warp's 16) of fp8 V load i of lane: 2t,
// 2t+1, 2t+8, 2t+9.
__device__ __forceinline__ uint32_t kv_row(uint32_t lane, uint32_t i) {
  return 2u * (lane & 3u) + (i & 1u) + 8u * (i >> 1);
}
template <typename KV, int D>
__device__ __forceinline__ uint32_t v_frag(uint32_t lane, uint32_t key0, uint32_t jj, uint32_t i) {
  using S = Shape<KV, D>;
  if (S::kFp8) {
    const uint32_t x = 128u * jj + uint32_t(S::kW) * (lane >> 2);
    return swz(key0 + kv_row(lane, i), x >> 4, S::kPitch) + (x & 15u);
  }
  return swz_xor(swz(key0 + (lane & 7u) + 8u * (lane >> 3 & 1u), lane >> 4, S::kPitch), int(32 * jj));
}
// Thread tid copies row tid % kKeys of a tile, chunks tid / kKeys + 2k
// (kThreads = 2*kKeys): one page lookup per thread and tile, and 8
// consecutive threads write one chunk of 8 consecutive rows. Chunk
// c + 2k = c ^ 2k (c < 2) and the swizzle XORs only a chunk's low 3 bits,
// so copy k lands at swz_xor(copy_dst(tid, 0), 32k): an XOR below 128
// bytes, an address immediate above.
template <typename KV, int D>
__device__ __forceinline__ uint32_t copy_dst(uint32_t tid, uint32_t k) {
  using S = Shape<KV, D>;
  return swz_xor(swz(tid % uint32_t(S::kKeys), tid / uint32_t(S::kKeys), S::kPitch), int(32 * k));
}

// copy_tile issues the copies of tokens [t0, t0 + kKeys) of one kv head
// into one stage (K tile, then V tile) and commits them as one group. Rows
// at or past end, and rows whose page id is out of range (never after host
// validation), are zero-filled: the mma reads all 16 keys of a warp, and
// 0 * NaN would poison the output. k_head and v_head point at the head's
// first byte (h * stride_h), page_row at the request's first page-table
// entry; strides are in bytes; pd divides by page_size.
template <typename KV, int D>
__device__ __forceinline__ void copy_tile(unsigned char* __restrict__ ks, unsigned char* __restrict__ vs,
                                          const unsigned char* __restrict__ k_head,
                                          const unsigned char* __restrict__ v_head,
                                          const int32_t* __restrict__ page_row, int32_t t0, int32_t end,
                                          const PageDiv& pd, int64_t num_pages, int64_t page_bytes,
                                          int64_t entry_bytes, uint32_t tid) {
  using S = Shape<KV, D>;
  static_assert(S::kThreads == 2 * S::kKeys && S::kChunks % 2 == 0, "two threads a row");
  const uint32_t r = tid % uint32_t(S::kKeys);
  // Unsigned: t0 < end <= 2^31-1 and r < 64, so t never wraps.
  const uint32_t t = uint32_t(t0) + r;
  int64_t page = -1;
  uint32_t entry = 0;
  if (t < uint32_t(end)) {
    // Lengths fit in 32 bits (checked by the launcher): t < 2^31.
    const uint32_t pi = pd.div(t);
    entry = t - pi * pd.d;
    page = page_row[pi];
  }
  const uint32_t base = copy_dst<KV, D>(tid, 0);
  if (page < 0 || page >= num_pages) {  // never for a visible key after host validation
#pragma unroll
    for (uint32_t k = 0; k < uint32_t(S::kChunks / 2); k++) {
      *reinterpret_cast<uint4*>(ks + swz_xor(base, int(32 * k))) = uint4{0u, 0u, 0u, 0u};
      *reinterpret_cast<uint4*>(vs + swz_xor(base, int(32 * k))) = uint4{0u, 0u, 0u, 0u};
    }
  } else {
    // 64 bits: page * page_bytes can exceed 2^31.
    const int64_t off = page * page_bytes + int64_t(entry) * entry_bytes + 16 * (tid / uint32_t(S::kKeys));
#pragma unroll
    for (uint32_t k = 0; k < uint32_t(S::kChunks / 2); k++) {
      cp_async_16(ks + swz_xor(base, int(32 * k)), k_head + off + 32 * k);
      cp_async_16(vs + swz_xor(base, int(32 * k)), v_head + off + 32 * k);
    }
  }
  cp_async_commit();
}

// qk accumulates s += Q K^T for the warp's 16 keys (key0..key0+15 of the
// tile ks) with the Q plane qp (the Q tile or its low part), and with lo
// the product of the plane qlo in the same pass, sharing each K fragment:
// the fp8 caches do, whose K fragments are gathered and widened (a second
// pass spills at fp8 D=128 under the 128-register bound).
template <typename KV, int D>
__device__ __forceinline__ void qk(float (&s)[2][4], const unsigned char* qp, const unsigned char* qlo, bool lo,
                                   const unsigned char* ks, uint32_t lane, uint32_t key0) {
  using S = Shape<KV, D>;
  using Op = Ops<KV>;
#pragma unroll
  for (uint32_t kk = 0; kk < D / 16; kk++) {
    uint32_t a[4];
    ldmatrix_x4(a, qp + q_frag<KV, D>(lane, kk));
    uint32_t b0[2], b1[2];
    if constexpr (S::kFp8) {
      const uint32_t w0 = *reinterpret_cast<const uint32_t*>(ks + k_frag<KV, D>(lane, key0, kk, 0));
      const uint32_t w1 = *reinterpret_cast<const uint32_t*>(ks + k_frag<KV, D>(lane, key0, kk, 1));
      b0[0] = fp8x2(KV{}, w0 & 0xffffu);
      b0[1] = fp8x2(KV{}, w0 >> 16);
      b1[0] = fp8x2(KV{}, w1 & 0xffffu);
      b1[1] = fp8x2(KV{}, w1 >> 16);
    } else {
      uint32_t r[4];
      ldmatrix_x4(r, ks + k_frag<KV, D>(lane, key0, kk, 0));
      b0[0] = r[0];
      b0[1] = r[1];
      b1[0] = r[2];
      b1[1] = r[3];
    }
    Op::mma(s[0], a, b0);
    Op::mma(s[1], a, b1);
    if (lo) {
      ldmatrix_x4(a, qlo + q_frag<KV, D>(lane, kk));
      Op::mma(s[0], a, b0);
      Op::mma(s[1], a, b1);
    }
  }
}

template <typename KV, int D>
__device__ __forceinline__ void decode_tc_body(PKV_DECODE_PARAMS(typename KV::T, float)) {
  using S = Shape<KV, D>;
  using Op = Ops<KV>;
  // The launcher and this entry agree on the shape, or nothing runs.
  if (head_dim != D || tile != S::kKeys || copy_unit != 16 || blockDim.x != 32 || blockDim.y != S::kWarps ||
      blockDim.z != 1)
    __trap();
  const uint32_t lane = threadIdx.x;
  const uint32_t warp = threadIdx.y;
  const uint32_t tid = warp * 32u + lane;
  const uint32_t g = lane >> 2, t = lane & 3u;
  const int64_t item = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int32_t group = int32_t(num_qo_heads / num_kv_heads);
  const int32_t m0 = int32_t(blockIdx.z) * 16;  // first group head of the block

  const WorkItem wi = work_item(work, item, kv_indptr, kv_last_page_len, page_size);
  if (partial && wi.empty) return;  // split-KV padding (WorkItem::empty)
  const int64_t qrow = wi.qrow, first_page = wi.first_page;
  const int32_t begin = int32_t(wi.begin), end = int32_t(wi.end);  // lengths fit 32 bits (the launcher checks)

  PKV_DYN_SMEM(unsigned char, smem);
  unsigned char* qs = smem + S::kQOff;

  // Q tile: 16 rows (group heads m0..m0+15, zero past the group) in the mma
  // type, unscaled (the scale multiplies S in f32). A q of another dtype
  // than the mma's (f32 q, f16 q with a bf16 cache) is split into a high
  // and a low part, q = hi + lo, and S takes one mma of each: Q then loses
  // nothing to the mma type but what a second rounding leaves (2^-16 of q
  // for bf16, 2^-22 for f16).
  const bool q_split = q_dtype != Op::kType;
  // One element an iteration (not unrolled): the code stays small, and
  // the K/V tile loop stays the main loop of scripts/ptx-report.sh.
#pragma unroll 1
  for (uint32_t i = tid; i < 16u * D; i += S::kThreads) {
    const uint32_t m = i / D, d = i % D;
    float v = 0.0f;
    if (m0 + int32_t(m) < group)
      v = load_f32(q, (qrow * num_qo_heads + h * group + m0 + m) * D + d, q_dtype);
    const uint32_t col = q_slot<S::kFp8>(d);
    const uint32_t at = swz(m, col >> 3, S::kQPitch) + 2 * (col & 7u);
    const uint16_t hi = Op::narrow(v);
    *reinterpret_cast<uint16_t*>(qs + at) = hi;
    *reinterpret_cast<uint16_t*>(qs + S::kQTile + at) = Op::narrow(v - Op::widen(hi));
  }

  float acc[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float row_m[2] = {neg_inf(), neg_inf()};  // rows g and g+8
  float row_d[2] = {0.0f, 0.0f};            // this lane's part of the row sums
  const float cap_log2e = soft_cap * kLog2e;
  const float q_over_cap = soft_cap > 0.0f ? q_scale / soft_cap : 0.0f;  // once, not per logit
  const uint32_t key0 = warp * 16u;
  // The copy's invariants: the request's page-table row, the head's first
  // byte, strides in bytes, the page-size divider.
  const int32_t* __restrict__ page_row = kv_indices + first_page;
  const unsigned char* __restrict__ k_head =
      reinterpret_cast<const unsigned char*>(k_data) + h * stride_h * int64_t(sizeof(typename KV::T));
  const unsigned char* __restrict__ v_head =
      reinterpret_cast<const unsigned char*>(v_data) + h * stride_h * int64_t(sizeof(typename KV::T));
  const int64_t page_bytes = stride_page * int64_t(sizeof(typename KV::T));
  const int64_t entry_bytes = stride_n * int64_t(sizeof(typename KV::T));
  const PageDiv pd(page_size);

  const int32_t n = end > begin ? int32_t((uint32_t(end - begin) + S::kKeys - 1) / S::kKeys) : 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) {
    if (s < n) {
      unsigned char* st = smem + 2 * s * S::kTileBytes;
      copy_tile<KV, D>(st, st + S::kTileBytes, k_head, v_head, page_row, begin + s * S::kKeys, end, pd, num_pages,
                       page_bytes, entry_bytes, tid);
    } else {
      cp_async_commit();
    }
  }
  for (int32_t i = 0; i < n; i++) {
    const int32_t next = i + kStages - 1;
    if (next < n) {
      unsigned char* st = smem + 2 * (next % kStages) * S::kTileBytes;
      copy_tile<KV, D>(st, st + S::kTileBytes, k_head, v_head, page_row, begin + next * S::kKeys, end, pd,
                       num_pages, page_bytes, entry_bytes, tid);
    } else {
      cp_async_commit();
    }
    cp_async_wait<kStages - 1>();
    __syncthreads();  // (A) tile i is in shared memory (and, at i = 0, the Q tile)
    const int32_t t0 = begin + i * S::kKeys;
    if (uint32_t(t0) + key0 < uint32_t(end)) {  // warp-uniform: the warp has keys in this tile
      const unsigned char* ks = smem + 2 * (i % kStages) * S::kTileBytes;
      const unsigned char* vs = ks + S::kTileBytes;
      // S = Q K^T: s[nt] is n-tile nt (keys 8nt..8nt+7 of the warp's 16).
      // The low part of a split q is a second pass behind a uniform branch
      // (a kernel argument), off the common path (fp8: in the same pass).
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      if constexpr (S::kFp8) {
        qk<KV, D>(s, qs, qs + S::kQTile, q_split, ks, lane, key0);
      } else {
        qk<KV, D>(s, qs, qs, false, ks, lane, key0);
        if (q_split) qk<KV, D>(s, qs + S::kQTile, qs, false, ks, lane, key0);
      }
      // Scale, cap, mask; online softmax for rows g (e = 0, 1) and g+8 (e = 2, 3).
      const uint32_t kbase = uint32_t(t0) + key0 + 2u * t;  // unsigned: never wraps (as t in copy_tile)
      if (soft_cap > 0.0f) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) s[nt][e] = cap_log2e * tanhf(s[nt][e] * q_over_cap);
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) s[nt][e] *= q_scale;
      }
      // Keys past end exist only in the last tile: a warp whose 16 keys are
      // all visible (warp-uniform) skips the per-element mask.
      if (uint32_t(t0) + key0 + 16u > uint32_t(end)) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            if (kbase + 8u * nt + (e & 1u) >= uint32_t(end)) s[nt][e] = neg_inf();
      }
      float corr[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {
        float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(row_m[r], mx);
        const float base = m_new == neg_inf() ? 0.0f : m_new;
        corr[r] = exp2_approx(row_m[r] - base);  // exactly 1 when the max stays
        row_m[r] = m_new;
        row_d[r] *= corr[r];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; e++) {
            s[nt][e] = exp2_approx(s[nt][e] - base);
            row_d[r] += s[nt][e];
          }
      }
      // Rescale o only when some row's max moved (D/2 multiplies a lane):
      // past the first tiles of a request it rarely does.
      if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
          acc[j][0] *= corr[0];
          acc[j][1] *= corr[0];
          acc[j][2] *= corr[1];
          acc[j][3] *= corr[1];
        }
      }
      // P as the A fragment: a[0] row g keys 2t..2t+1, a[1] row g+8,
      // a[2], a[3] the same for keys 8+2t..9+2t. P is split into a high
      // and a low part in the mma type, P = p + p_lo, and P·V takes one mma
      // of each: one rounding of P to f16 (2^-11 relative a weight) or
      // bf16 (2^-9) moves o by up to ~2e-4, past the conformance suites'
      // f32 tolerance (FlashInfer accepts the single rounding); the second
      // mma costs tensor-core cycles a memory-bound decode leaves idle.
      uint32_t p[4], p_lo[4];
#pragma unroll
      for (int x = 0; x < 4; x++) {
        const float* src = s[x >> 1] + 2 * (x & 1);
        p[x] = pack2<Op::kIsBF16>(src[0], src[1]);
        p_lo[x] = pack2_lo<Op::kIsBF16>(src[0], src[1], p[x]);
      }
      // O += P V.
      if constexpr (S::kFp8) {
#pragma unroll
        for (uint32_t seg = 0; seg < D / 8 / S::kW; seg++) {
          uint32_t w[4][S::kW / 4];  // keys 2t, 2t+1, 2t+8, 2t+9; kW bytes each
#pragma unroll
          for (uint32_t i4 = 0; i4 < 4; i4++) {
            const unsigned char* src = vs + v_frag<KV, D>(lane, key0, seg, i4);
            if constexpr (S::kW == 16) {
              const uint4 v4 = *reinterpret_cast<const uint4*>(src);
              w[i4][0] = v4.x;
              w[i4][1] = v4.y;
              w[i4][2] = v4.z;
              w[i4][3] = v4.w;
            } else {
              const uint2 v2 = *reinterpret_cast<const uint2*>(src);
              w[i4][0] = v2.x;
              w[i4][1] = v2.y;
            }
          }
#pragma unroll
          for (uint32_t jl = 0; jl < uint32_t(S::kW); jl++) {
            const uint32_t wi = jl >> 2;
            uint32_t bv[2];
            bv[0] = fp8x2(KV{}, pair_bytes(w[0][wi], w[1][wi], int(jl & 3u)));
            bv[1] = fp8x2(KV{}, pair_bytes(w[2][wi], w[3][wi], int(jl & 3u)));
            Op::mma(acc[seg * S::kW + jl], p, bv);
            Op::mma(acc[seg * S::kW + jl], p_lo, bv);
          }
        }
      } else {
#pragma unroll
        for (uint32_t jj = 0; jj < D / 16; jj++) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, vs + v_frag<KV, D>(lane, key0, jj, 0));
          const uint32_t bv0[2] = {r[0], r[1]};
          const uint32_t bv1[2] = {r[2], r[3]};
          Op::mma(acc[2 * jj], p, bv0);
          Op::mma(acc[2 * jj + 1], p, bv1);
          Op::mma(acc[2 * jj], p_lo, bv0);
          Op::mma(acc[2 * jj + 1], p_lo, bv1);
        }
      }
    }
    __syncthreads();  // (B) every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();  // only empty groups can remain; nothing writes the stages after this
  __syncthreads();

  // Merge the warps' states: o in the stage buffers, m and d in the Q area.
  float* mo = reinterpret_cast<float*>(smem);  // [kWarps][16][D]
  float* mm = reinterpret_cast<float*>(qs);    // [kWarps][16]
  float* md = mm + S::kWarps * 16;             // [kWarps][16]
#pragma unroll
  for (int r = 0; r < 2; r++) {
    row_d[r] += __shfl_xor_sync(0xffffffffu, row_d[r], 1);
    row_d[r] += __shfl_xor_sync(0xffffffffu, row_d[r], 2);
  }
#pragma unroll
  for (uint32_t j = 0; j < D / 8; j++)
#pragma unroll
    for (uint32_t e = 0; e < 4; e++)
      mo[(warp * 16u + g + 8u * (e >> 1)) * D + o_dim<KV, D>(j, 2u * t + (e & 1u))] = acc[j][e];
  if (t == 0) {
    mm[warp * 16u + g] = row_m[0];
    mm[warp * 16u + g + 8u] = row_m[1];
    md[warp * 16u + g] = row_d[0];
    md[warp * 16u + g + 8u] = row_d[1];
  }
  __syncthreads();
  for (uint32_t i = tid; i < 16u * D; i += S::kThreads) {
    const uint32_t m = i / D, d = i % D;
    if (m0 + int32_t(m) >= group) break;  // rows are in order: the rest are padding too
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < S::kWarps; w++) mx = fmaxf(mx, mm[w * 16 + m]);
    const float base = mx == neg_inf() ? 0.0f : mx;
    float den = 0.0f, num = 0.0f;
#pragma unroll
    for (int w = 0; w < S::kWarps; w++) {
      const float c = exp2_approx(mm[w * 16 + m] - base);
      den += md[w * 16 + m] * c;
      num += mo[(w * 16 + m) * D + d] * c;
    }
    const bool empty = !(den > 0.0f);
    const float inv = empty ? 0.0f : rcp_approx(den);
    const float out_lse = empty ? neg_inf() : mx + log2_approx(den);
    const int64_t hq = h * group + m0 + m;
    if (partial) {
      const int64_t row = item * num_qo_heads + hq;
      tmp_o[row * D + d] = num * inv;
      if (d == 0) tmp_lse[row] = out_lse;
    } else {
      const int64_t row = qrow * num_qo_heads + hq;
      store_f32(o, row * D + d, o_dtype, num * inv * v_scale);
      if (lse != nullptr && d == 0) lse[row] = out_lse;
    }
  }
}

}  // namespace tc
}  // namespace pkv

// batch_decode_paged_tc_<kv>_d<D>: the arguments of batch_decode_paged_<kv>_v<VEC>
// (decode.cu), so that one launcher serves both; tile must be the entry's
// kKeys and copy_unit 16 (the kernel traps otherwise), and the block
// (32, kWarps, 1). kWarps is 4 for 128-byte rows (D=64, and fp8 D=128), 2
// for 256-byte rows, 1 for 512-byte rows (f16/bf16 D=256).
//
// __launch_bounds__(kThreads, PKV_TC_MIN_BLOCKS): 5 blocks a SM at D=64
// (<= 96 registers; 36 KiB of shared memory allows 6), 4 elsewhere (the
// register bound that D=128 and 256 need without spilling).
#define PKV_TC_MIN_BLOCKS(D) ((D) == 64 ? 5 : 4)
// The names this macro builds are written out in doc.go's entry-point table.
#define PKV_TC_DECODE_ENTRY(SFX, KV, D)                                                                  \
  extern "C" __global__ void __launch_bounds__(pkv::tc::Shape<KV, D>::kThreads, PKV_TC_MIN_BLOCKS(D))    \
      batch_decode_paged_tc_##SFX##_d##D(PKV_DECODE_PARAMS(KV::T, double)) {                             \
    pkv::tc::decode_tc_body<KV, D>(PKV_DECODE_FORWARD);                                                  \
  }

#define PKV_TC_DECODE_DTYPE(SFX, KV) \
  PKV_TC_DECODE_ENTRY(SFX, KV, 64)   \
  PKV_TC_DECODE_ENTRY(SFX, KV, 128)  \
  PKV_TC_DECODE_ENTRY(SFX, KV, 256)

PKV_TC_DECODE_DTYPE(f16, pkv::KvF16)
PKV_TC_DECODE_DTYPE(bf16, pkv::KvBF16)
PKV_TC_DECODE_DTYPE(e4m3, pkv::KvE4M3)
PKV_TC_DECODE_DTYPE(e5m2, pkv::KvE5M2)

#if !defined(__CUDACC__)
// cuemu_test_tc_offsets (the emulator only: not in the PTX) lists the
// shared-memory accesses of batch_decode_paged_tc_<kv>_d<D> for kind 0
// (f16 and bf16: the same layout) or 1 (e4m3 and e5m2), as records of
// 33 words: the access width in bytes (16 for ldmatrix, whose 4 phases
// are 8 lanes each, like a 16-byte load), then the byte offset each of the
// 32 lanes touches. Every k-step and n-tile of two warps' keys, and every
// cp.async write of every warp; a width of 0 ends the list.
// internal/cpuemu's TestTCDecodeSharedBanks counts their wavefronts.
namespace pkv {
namespace tc {
template <typename KV, int D>
inline uint32_t* offsets(uint32_t* out) {
  using S = Shape<KV, D>;
  const auto rec = [&out](uint32_t width, const auto& off) {
    *out++ = width;
    for (uint32_t l = 0; l < 32; l++) *out++ = off(l);
  };
  for (uint32_t kk = 0; kk < D / 16; kk++) rec(16, [&](uint32_t l) { return q_frag<KV, D>(l, kk); });
  for (uint32_t key0 = 0; key0 < 32; key0 += 16) {
    for (uint32_t kk = 0; kk < D / 16; kk++)
      for (uint32_t half = 0; half < (S::kFp8 ? 2u : 1u); half++)
        rec(S::kFp8 ? 4 : 16, [&](uint32_t l) { return k_frag<KV, D>(l, key0, kk, half); });
    if (S::kFp8) {
      for (uint32_t seg = 0; seg < D / 8 / S::kW; seg++)
        for (uint32_t i = 0; i < 4; i++) rec(S::kW, [&](uint32_t l) { return v_frag<KV, D>(l, key0, seg, i); });
    } else {
      for (uint32_t jj = 0; jj < D / 16; jj++) rec(16, [&](uint32_t l) { return v_frag<KV, D>(l, key0, jj, 0); });
    }
  }
  for (uint32_t w = 0; w < uint32_t(S::kWarps); w++)
    for (uint32_t k = 0; k < uint32_t(S::kChunks / 2); k++)
      rec(16, [&](uint32_t l) { return copy_dst<KV, D>(32 * w + l, k); });
  return out;
}
}  // namespace tc
}  // namespace pkv

extern "C" __global__ void cuemu_test_tc_offsets(int64_t kind, int64_t head_dim, uint32_t* out) {
  uint32_t* end = out;
  switch (kind * 1000 + head_dim) {
    case 64: end = pkv::tc::offsets<pkv::KvF16, 64>(out); break;
    case 128: end = pkv::tc::offsets<pkv::KvF16, 128>(out); break;
    case 256: end = pkv::tc::offsets<pkv::KvF16, 256>(out); break;
    case 1064: end = pkv::tc::offsets<pkv::KvE4M3, 64>(out); break;
    case 1128: end = pkv::tc::offsets<pkv::KvE4M3, 128>(out); break;
    case 1256: end = pkv::tc::offsets<pkv::KvE4M3, 256>(out); break;
    default: __trap();
  }
  *end = 0;
}
#endif
