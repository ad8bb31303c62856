// prefill.cu: tiled tensor-core batch prefill over a paged KV cache,
// FlashInfer's BatchPrefillWithPagedKVCacheWrapper.run (see docs/kernels.md,
// "Prefill").
//
// Thread mapping of batch_prefill_paged_<kv>_d<D>:
//   grid  = (work items, num_kv_heads)
//   block = (32 * W), W = 1, 2 or 4 warps (the launcher's choice, by the
//           shared memory a launch needs)
// A work item is four int32 (q_row, request, kv_begin, kv_end): the query
// rows [q_row, min(q_row + rows_per_tile, qo_indptr[request+1])) of the
// request attend keys [kv_begin, kv_end) of its kv head blockIdx.y. The
// query heads of the GQA group are packed with the rows into the mma M
// dimension, as FlashInfer packs them: packed row p of a tile is query row
// q_row + p / group, query head blockIdx.y * group + p % group, so every K/V
// byte a CTA loads serves all of the group's heads. Warp w owns the packed
// rows [16w, 16w + 16) of a pass; a tile wider than 16*W packed rows is
// walked in passes (only where the launcher had to shrink W to fit shared
// memory).
//
// Per pass: Q (converted to the mma dtype, plus its rounding error as a
// second "lo" plane when split_q) is staged in shared memory and each
// fragment is read back with ldmatrix_x4 per k-step, as FlashInfer's
// compute_qk does. The KV range [kv_begin, kv_end) is cut by the pass's
// causal and window bounds (tiles wholly masked for every row are never
// loaded) and walked in kBc-key tiles through a two-stage cp.async pipeline
// into swizzled shared memory: the 16-byte chunk c of row r is stored at
// chunk c ^ (r % 8), so the 8 row addresses of an ldmatrix phase fall in 8
// different bank groups. S = Q K^T runs on mma.m16n8k16 (K fragments by
// ldmatrix_x4, which for K rows is exactly the col-major B fragment), then
// the per-element masks (bottom-right causal j <= kv_len - qo_len + i, left
// window, the item's range), the soft cap, and the online softmax of each
// row in the log2 domain (a lane holds rows lane/4 and lane/4 + 8 of its
// warp; row maxima are reduced over the 4 lanes of a quad). P is repacked
// from the S accumulators into A fragments in registers (FlashAttention-2's
// register reuse) and O += P V runs on mma with V fragments from
// ldmatrix_x4_trans. fp8 caches stay fp8 in shared memory (half the bytes)
// and are widened to f16 pairs in registers with cvt.rn.f16x2.{e4m3,e5m2}x2
// (the C twin below sm_89), the fragments gathered with 16-bit loads.
//
// Precision (flags): the tensor cores multiply f16 or bf16. split_q adds
// the rounding error of q as a second mma (q = hi + lo, both in the mma
// dtype), split_p the same for P, so an f32 q or an f32 output keeps
// float32-grade accuracy; the launcher sets them (see docs/kernels.md).
//
// Output: o = sum_j p_j v_j / sum_j p_j times v_scale, lse = m + log2(d)
// (base 2; -inf and o = 0 when a row sees no key). With partial, the state
// of (row, head) goes to partial row merge_indptr[row] + kv_chunk[item] of
// tmp_o/tmp_lse for merge_partial_states.
#include "tile_common.cuh"
#include "sink.cuh"

namespace pkv {
namespace tcprefill {

constexpr int64_t kFlagPartial = 1;
constexpr int64_t kFlagSplitQ = 2;
constexpr int64_t kFlagSplitP = 4;

// Tc describes a cache dtype for the tensor cores: the mma input type
// (bf16 for a bf16 cache, f16 otherwise), whether elements are fp8 (widened
// in registers), and widen2, the packed fp8 pair convert.
template <typename KV>
struct Tc;
template <>
struct Tc<KvF16> {
  static constexpr bool kBF16 = false, kFP8 = false, kFP4 = false;
  __device__ static __forceinline__ uint32_t widen2(uint16_t) { return 0; }
};
template <>
struct Tc<KvBF16> {
  static constexpr bool kBF16 = true, kFP8 = false, kFP4 = false;
  __device__ static __forceinline__ uint32_t widen2(uint16_t) { return 0; }
};
template <>
struct Tc<KvE4M3> {
  static constexpr bool kBF16 = false, kFP8 = true, kFP4 = false;
  __device__ static __forceinline__ uint32_t widen2(uint16_t pair) { return cvt_f16x2_e4m3x2(pair); }
};
template <>
struct Tc<KvE5M2> {
  static constexpr bool kBF16 = false, kFP8 = true, kFP4 = false;
  __device__ static __forceinline__ uint32_t widen2(uint16_t pair) { return cvt_f16x2_e5m2x2(pair); }
};
// NVFP4: f16 mma; fragments are gathered from the code bytes and scales and
// widened in registers (nvfp4_frag), as the fp8 ones are.
template <>
struct Tc<KvNVFP4> {
  static constexpr bool kBF16 = false, kFP8 = false, kFP4 = true;
};
// kGather: the cache's fragments are gathered and widened in registers
// (fp8, NVFP4) rather than read by ldmatrix.
template <typename KV>
constexpr bool kGather = Tc<KV>::kFP8 || Tc<KV>::kFP4;

// kKVRowOf is the bytes of a K/V tile row in shared memory: head_dim
// elements, or for NVFP4 the head_dim/2 code bytes plus 16 bytes of
// padding (unswizzled: with the padding the 8 rows a fragment gather
// reads start in 8 different banks, and rows stay 16-byte aligned for
// cp.async). kSFRowOf is an NVFP4 scale tile row: head_dim/16 bytes.
template <typename KV, int kD>
constexpr int kKVRowOf = Tc<KV>::kFP4 ? kD / 2 + 16 : kD * int(sizeof(typename KV::T));
template <typename KV, int kD>
constexpr int kSFRowOf = Tc<KV>::kFP4 ? kD / 16 : 0;

// kF16Unit2 is the f16 pair (2^14, 2^14).
constexpr uint32_t kF16Unit2 = 0x74007400u;

// nvfp4_frag is the f16 pair of x's two e2m1 codes (bits 0..3 and 16..19)
// times their scales (e4m3 codes s0 and s1): exact, since every such
// product has at most 6 significant bits and lies within f16's normal
// range (2^-10 .. 2688).
__device__ __forceinline__ uint32_t nvfp4_frag(uint32_t x, uint8_t s0, uint8_t s1) {
  const uint32_t sc = uint32_t(e4m3_to_f16_bits(s0)) | (uint32_t(e4m3_to_f16_bits(s1)) << 16);
  return hmul2_bits(hmul2_bits(e2m1_pair_bits(x), kF16Unit2), sc);
}

// swz is the byte offset of byte col of row r in a swizzled tile with
// rows of kRowBytes bytes: 16-byte chunk c lives at chunk c ^ (r % 8)
// (r % 4 for 64-byte rows).
template <int kRowBytes>
__device__ __forceinline__ uint32_t swz(uint32_t r, uint32_t col) {
  constexpr uint32_t kChunks = kRowBytes / 16;
  constexpr uint32_t kMask = (kChunks < 8 ? kChunks : 8) - 1;
  return r * kRowBytes + ((((col >> 4) ^ (r & kMask)) << 4) | (col & 15));
}

// CopyMap is the K/V copy's work split. The 128 threads of a 4-warp CTA
// (a CTA of fewer warps runs the slots of 128/nthreads of them) each copy
// the kCPT 16-byte chunks u = cl + kTPR*j (j < kCPT) of one tile row r, so
// a thread looks up one page per tile. With kCPT > 1 the 8 threads of a
// 16-byte access phase hold 8 consecutive rows at one chunk (8 distinct
// bank groups under the swizzle) and a warp reads 64 contiguous bytes of
// each of 8 rows; with one chunk per row slot (fp8 D=64, 64-byte rows)
// r = v / kUnits, u = v % kUnits (2 rows x 4 chunks per phase).
template <int kRowBytes, int kBc>
struct CopyMap {
  static constexpr int kUnits = kRowBytes / 16;     // 16-byte chunks of a row
  static constexpr int kTPR = 128 / kBc;            // row slots per row
  static constexpr int kCPT = kUnits / kTPR;        // chunks per row slot
  static_assert(kCPT >= 1 && kTPR * kCPT == kUnits, "copy map");
  __device__ static __forceinline__ int row(int v) { return kCPT == 1 ? v / kUnits : (v & 7) + 8 * (v / (8 * kTPR)); }
  __device__ static __forceinline__ int col(int v) { return kCPT == 1 ? v % kUnits : (v >> 3) % kTPR; }
  // dst is the swizzled offset of the slot's chunk j, given base =
  // dst(v, 0). Chunk cl + kTPR*j = cl ^ kTPR*j (cl < kTPR <= 8) and the
  // swizzle XORs only the chunk's low 3 bits with the row's, so chunk j
  // is at swz_xor(base, 16 * kTPR * j) (base's chunk is below 8).
  __device__ static __forceinline__ uint32_t dst(uint32_t base, int j) { return swz_xor(base, 16 * kTPR * j); }
  __device__ static __forceinline__ uint32_t base(int v) {
    return swz<kRowBytes>(uint32_t(row(v)), uint32_t(16 * col(v)));
  }
};

// copy_kv issues the copies of keys [t0, t0 + kBc) of one kv head into
// one stage (K tile, then V tile); keys at or past end (and pages out of
// range, which host validation excludes) are zero-filled, so that a masked
// key's p = 0 never multiplies stale or poisoned bytes. k_head and v_head
// point at the head's first element (h * stride_h); strides are in bytes.
template <typename T, int kD, int kBc>
__device__ __forceinline__ void copy_kv(unsigned char* __restrict__ ks, unsigned char* __restrict__ vs,
                                        const unsigned char* __restrict__ k_head,
                                        const unsigned char* __restrict__ v_head,
                                        const int32_t* __restrict__ page_row, int32_t t0, int32_t end,
                                        const PageDiv& pd, int64_t num_pages, int64_t page_bytes,
                                        int64_t entry_bytes, int tid, int nthreads) {
  constexpr int kRowBytes = kD * int(sizeof(T));
  using M = CopyMap<kRowBytes, kBc>;
  for (int v = tid; v < 128; v += nthreads) {
    const int r = M::row(v);
    const int cl = M::col(v);
    const uint32_t t = uint32_t(t0 + r);
    int64_t page = -1;
    uint32_t entry = 0;
    if (int32_t(t) < end) {
      const uint32_t pi = pd.div(t);
      entry = t - pi * pd.d;
      page = page_row[pi];
    }
    const uint32_t base = M::base(v);
    if (page < 0 || page >= num_pages) {
      const uint4 zero = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int j = 0; j < M::kCPT; j++) {
        *reinterpret_cast<uint4*>(ks + M::dst(base, j)) = zero;
        *reinterpret_cast<uint4*>(vs + M::dst(base, j)) = zero;
      }
      continue;
    }
    const int64_t off = page * page_bytes + int64_t(entry) * entry_bytes + cl * 16;
#pragma unroll
    for (int j = 0; j < M::kCPT; j++) {
      cp_async_16(ks + M::dst(base, j), k_head + off + M::kTPR * 16 * j);
      cp_async_16(vs + M::dst(base, j), v_head + off + M::kTPR * 16 * j);
    }
  }
  cp_async_commit();
}

// copy_kv_nvfp4 is copy_kv for an NVFP4 cache: the code rows (kD/2 bytes,
// 16-byte cp.async chunks) into the K and V code tiles (rows of
// kKVRowOf bytes) and the scale rows (kD/16 bytes, 4-byte copies) into
// the scale tiles ksf/vsf. k_head/v_head and k_sf/v_sf point at the
// head's codes and scales; page_elems and entry_elems are the page and
// entry strides in elements (codes at /2, scales at /16).
template <int kD, int kBc>
__device__ __forceinline__ void copy_kv_nvfp4(unsigned char* __restrict__ ks, unsigned char* __restrict__ vs,
                                              unsigned char* __restrict__ ksf, unsigned char* __restrict__ vsf,
                                              const unsigned char* __restrict__ k_head,
                                              const unsigned char* __restrict__ v_head,
                                              const unsigned char* __restrict__ k_sf,
                                              const unsigned char* __restrict__ v_sf,
                                              const int32_t* __restrict__ page_row, int32_t t0, int32_t end,
                                              const PageDiv& pd, int64_t num_pages, int64_t page_elems,
                                              int64_t entry_elems, int tid, int nthreads) {
  constexpr int kRow = kKVRowOf<KvNVFP4, kD>;
  constexpr int kChunks = kD / 32;  // 16-byte code chunks of a row
  constexpr int kWords = kD / 64;   // 4-byte scale words of a row
  constexpr int kPer = kChunks + kWords;
  for (int v = tid; v < kBc * kPer; v += nthreads) {
    const int r = v / kPer;
    const int u = v - r * kPer;
    const uint32_t t = uint32_t(t0 + r);
    int64_t page = -1;
    uint32_t entry = 0;
    if (int32_t(t) < end) {
      const uint32_t pi = pd.div(t);
      entry = t - pi * pd.d;
      page = page_row[pi];
    }
    const bool valid = page >= 0 && page < num_pages;
    const int64_t e = page * page_elems + int64_t(entry) * entry_elems;
    if (u < kChunks) {
      unsigned char* kd = ks + r * kRow + 16 * u;
      unsigned char* vd = vs + r * kRow + 16 * u;
      if (valid) {
        cp_async_16(kd, k_head + e / 2 + 16 * u);
        cp_async_16(vd, v_head + e / 2 + 16 * u);
      } else {
        const uint4 zero = {0u, 0u, 0u, 0u};
        *reinterpret_cast<uint4*>(kd) = zero;
        *reinterpret_cast<uint4*>(vd) = zero;
      }
    } else {
      const int w = 4 * (u - kChunks);
      uint32_t* kd = reinterpret_cast<uint32_t*>(ksf + r * (kD / 16) + w);
      uint32_t* vd = reinterpret_cast<uint32_t*>(vsf + r * (kD / 16) + w);
      *kd = valid ? *reinterpret_cast<const uint32_t*>(k_sf + e / 16 + w) : 0u;
      *vd = valid ? *reinterpret_cast<const uint32_t*>(v_sf + e / 16 + w) : 0u;
    }
  }
  cp_async_commit();
}

// window_lo is the first key position pos sees with a left window of
// window_left keys, in 64 bits (a window may exceed 2^31) and clamped at 0
// (keys are >= 0).
__device__ __forceinline__ int32_t window_lo(int32_t pos, int64_t window_left) {
  const int64_t lo = int64_t(pos) - window_left;
  return lo > 0 ? int32_t(lo) : 0;
}

// logits turns the tile's q·k sums into log2-domain logits (scale, and
// with kCap the soft cap) and, with kMask, sets the keys outside a row's
// [row_lo, row_hi) to -inf (element e of s[n]: row e / 2, key t0 + 8n +
// 2t + e % 2); mx gets each row's maximum over this lane's elements.
template <bool kMask, bool kCap, int kN>
__device__ __forceinline__ void logits(float (&s)[kN][4], float (&mx)[2], int32_t t0, int t4,
                                       const int32_t (&row_lo)[2], const int32_t (&row_hi)[2], float q_scale,
                                       float soft_cap, float cap_log2e) {
#pragma unroll
  for (int n = 0; n < kN; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = e >> 1;
      float x = s[n][e] * q_scale;
      if (kCap) x = cap_log2e * tanhf(x / soft_cap);
      if (kMask) {
        const int32_t key = t0 + 8 * n + 2 * t4 + (e & 1);
        if (key < row_lo[i] || key >= row_hi[i]) x = neg_inf();
      }
      s[n][e] = x;
      mx[i] = fmaxf(mx[i], x);
    }
  }
}

// kBcFor is the keys per K/V tile: 32 up to head_dim 128, 16 for 256.
template <int kD>
constexpr int kBcFor = kD <= 128 ? 32 : 16;

// frag_off is the swizzled offset of 16-byte chunk c (0 or 1) of row r in
// a tile of kRowBytes-byte rows (>= 128): chunk 2*kt + c of the same row
// is at swz_xor(frag_off, 32 * kt), at most one LOP3 per ldmatrix (0 for
// rows under 128 bytes, fp8 at D=64, which the fp8 gathers serve).
template <int kRowBytes>
__device__ __forceinline__ uint32_t frag_off(int r, int c) {
  return kRowBytes >= 128 ? swz<kRowBytes>(uint32_t(r), uint32_t(16 * c)) : 0u;
}

// The ldmatrix_x4 row a lane addresses: Q (A operand, the warp's 16 packed
// rows, matrices ordered rows 0-7 / 8-15 by k 0-7 / 8-15), K (B operand
// from K rows: keys 0-7 / 8-15 by k 0-7 / 8-15, non-transposed) and V (B
// operand from V rows, .trans: keys 0-7 / 8-15 by features 0-7 / 8-15),
// at k-step (feature block) 0.
template <int kQRow>
__device__ __forceinline__ uint32_t q_frag_at(int warp, int lane) {
  return frag_off<kQRow>(warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4);
}
template <int kRowBytes>
__device__ __forceinline__ uint32_t k_frag_at(int lane) {
  return frag_off<kRowBytes>((lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1);
}
template <int kRowBytes>
__device__ __forceinline__ uint32_t v_frag_at(int lane) {
  return frag_off<kRowBytes>((lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4);
}

// mma_pair accumulates c0 += A B(b[0], b[1]) and c1 += A B(b[2], b[3]),
// two n8 blocks of one k16 step, and with lo the same for alo (a lo plane).
template <bool kBF16>
__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                         const uint32_t (&alo)[4], bool lo, const uint32_t (&b)[4]) {
  mma_m16n8k16_acc<kBF16>(c0, a, b[0], b[1]);
  mma_m16n8k16_acc<kBF16>(c1, a, b[2], b[3]);
  if (lo) {
    mma_m16n8k16_acc<kBF16>(c0, alo, b[0], b[1]);
    mma_m16n8k16_acc<kBF16>(c1, alo, b[2], b[3]);
  }
}

// qk accumulates s += Q K^T over the tile's keys for one plane of Q (qs,
// q_frag this lane's ldmatrix offset in it, the warp's 16 packed rows),
// ks the K tile, k_frag this lane's K ldmatrix offset. With lo it adds
// the product of the lo plane qlo in the same pass, sharing each K
// fragment: the fp8 caches do, whose K fragments are gathered and widened
// (a second pass would gather twice and, at D=64 and 256, spill).
template <typename KV, int kD>
__device__ __forceinline__ void qk(float (&s)[kBcFor<kD> / 8][4], const unsigned char* qs, const unsigned char* qlo,
                                   bool lo, uint32_t q_frag, const unsigned char* ks, const unsigned char* ksf,
                                   uint32_t k_frag, int lane) {
  using TC = Tc<KV>;
  constexpr int kBc = kBcFor<kD>;
  constexpr int kKVRow = kKVRowOf<KV, kD>;
  const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int kt = 0; kt < kD / 16; kt++) {
    uint32_t a[4], alo[4];
    ldmatrix_x4(a, qs + swz_xor(q_frag, 32 * kt));
    if (lo) ldmatrix_x4(alo, qlo + swz_xor(q_frag, 32 * kt));
#pragma unroll
    for (int kk = 0; kk < kBc / 16; kk++) {
      uint32_t bk[4];
      if constexpr (TC::kFP4) {
        // b[0] = K[key g][feat 2t, 2t+1]: one code byte; the 16 features
        // of k-step kt are one scale block of the key.
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const uint32_t kr = uint32_t(kk * 16 + g4 + 8 * (j >> 1));
          const uint8_t sc = ksf[kr * (kD / 16) + kt];
          const uint32_t b = ks[kr * kKVRow + kt * 8 + t4 + 4 * (j & 1)];
          bk[j] = nvfp4_frag((b & 0xfu) | ((b & 0xf0u) << 12), sc, sc);
        }
      } else if constexpr (TC::kFP8) {
        // b[0] = K[key g][feat 2t, 2t+1], b[1] = feats + 8: one fp8 pair each.
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const uint32_t kr = uint32_t(kk * 16 + g4 + 8 * (j >> 1));
          const uint32_t col = uint32_t(kt * 16 + 2 * t4 + 8 * (j & 1));
          bk[j] = TC::widen2(*reinterpret_cast<const uint16_t*>(ks + swz<kKVRow>(kr, col)));
        }
      } else {
        ldmatrix_x4(bk, ks + kk * 16 * kKVRow + swz_xor(k_frag, 32 * kt));
      }
      mma_pair<TC::kBF16>(s[2 * kk], s[2 * kk + 1], a, alo, lo, bk);
    }
  }
}

// pack_p rounds the probabilities of keys 16kk .. 16kk + 15 (S blocks 2kk
// and 2kk + 1) into an mma A fragment.
template <bool kBF16, int kN>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[4], const float (&s)[kN][4], int kk) {
  pa[0] = pack2<kBF16>(s[2 * kk][0], s[2 * kk][1]);
  pa[1] = pack2<kBF16>(s[2 * kk][2], s[2 * kk][3]);
  pa[2] = pack2<kBF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  pa[3] = pack2<kBF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// pv accumulates acc += P V for 16 keys: pa is P's A fragment, vs the V
// tile's first of those 16 rows, v_frag this lane's ldmatrix offset. With
// lo it adds P's lo plane plo in the same pass, as qk does qlo.
template <typename KV, int kD>
__device__ __forceinline__ void pv(float (&acc)[kD / 8][4], const uint32_t (&pa)[4], const uint32_t (&plo)[4],
                                   bool lo, const unsigned char* vs, const unsigned char* vsf, uint32_t v_frag,
                                   int lane) {
  using TC = Tc<KV>;
  constexpr int kKVRow = kKVRowOf<KV, kD>;
  const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int fb = 0; fb < kD / 16; fb++) {
    uint32_t bv[4];
    if constexpr (TC::kFP4) {
      // b[0] = V[keys 2t, 2t+1][feat g]: the same nibble of two rows, each
      // with its own scale of block fb.
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint32_t vr = uint32_t(2 * t4 + 8 * (j & 1));
        const uint32_t col = uint32_t(fb * 16 + g4 + 8 * (j >> 1));
        const uint32_t sh = 4 * (col & 1);
        const uint32_t b0 = vs[vr * kKVRow + col / 2], b1 = vs[(vr + 1) * kKVRow + col / 2];
        bv[j] = nvfp4_frag(((b0 >> sh) & 0xfu) | (((b1 >> sh) & 0xfu) << 16), vsf[vr * (kD / 16) + fb],
                           vsf[(vr + 1) * (kD / 16) + fb]);
      }
    } else if constexpr (TC::kFP8) {
      // b[0] = V[keys 2t, 2t+1][feat g], b[1] = keys + 8; bv[2..3] feats + 8.
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint32_t vr = uint32_t(2 * t4 + 8 * (j & 1));
        const uint32_t col = uint32_t(fb * 16 + g4 + 8 * (j >> 1));
        const uint16_t pair = uint16_t(vs[swz<kKVRow>(vr, col)] | (vs[swz<kKVRow>(vr + 1, col)] << 8));
        bv[j] = TC::widen2(pair);
      }
    } else {
      ldmatrix_x4_trans(bv, vs + swz_xor(v_frag, 32 * fb));
    }
    mma_pair<TC::kBF16>(acc[2 * fb], acc[2 * fb + 1], pa, plo, lo, bv);
  }
}

template <typename KV, int kD>
__device__ __forceinline__ void prefill_body(
    const void* __restrict__ q, const typename KV::T* __restrict__ k_data, const typename KV::T* __restrict__ v_data,
    const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices,
    const int32_t* __restrict__ kv_last_page_len, const int32_t* __restrict__ qo_indptr,
    const int32_t* __restrict__ work, const int32_t* __restrict__ kv_chunk, const int32_t* __restrict__ merge_indptr,
    void* __restrict__ o, float* __restrict__ lse, float* __restrict__ tmp_o, float* __restrict__ tmp_lse,
    const float* __restrict__ sinks, int64_t num_qo_heads, int64_t num_kv_heads, int64_t page_size, int64_t num_pages, int64_t stride_page,
    int64_t stride_n, int64_t stride_h, int64_t q_dtype, int64_t o_dtype, float q_scale, float soft_cap,
    float v_scale, int64_t rows_per_tile, int64_t causal, int64_t window_left, int64_t flags,
    const uint8_t* __restrict__ k_sf, const uint8_t* __restrict__ v_sf) {
  using T = typename KV::T;
  using TC = Tc<KV>;
  constexpr bool kBF16 = TC::kBF16;
  constexpr int kBc = kBcFor<kD>;
  constexpr int kKVRow = kKVRowOf<KV, kD>;  // bytes of a K/V row in shared memory
  constexpr int kSFRow = kSFRowOf<KV, kD>;  // bytes of an NVFP4 scale row (0 otherwise)
  constexpr int kQRow = kD * 2;                // bytes of a Q row (mma dtype)
  constexpr int kNB = kD / 8;                  // n8 blocks of O
  const int tid = int(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int nthreads = int(blockDim.x);
  const int W = nthreads >> 5;
  const int g4 = lane >> 2, t4 = lane & 3;
  const bool partial = (flags & kFlagPartial) != 0;
  const bool split_q = (flags & kFlagSplitQ) != 0;
  const bool split_p = (flags & kFlagSplitP) != 0;

  // Row, head and packed-row indices are int32 (qo_indptr and work are);
  // element offsets are formed in 64 bits where they are used.
  const int64_t item = blockIdx.x;
  const int32_t h = int32_t(blockIdx.y);
  const int32_t group = int32_t(num_qo_heads / num_kv_heads);
  const int32_t qa = work[4 * item];
  const int64_t b = work[4 * item + 1];
  int32_t begin = work[4 * item + 2];
  int32_t end = work[4 * item + 3];
  const int32_t q0 = qo_indptr[b];
  const int32_t q1 = qo_indptr[b + 1];
  const int32_t qb = int64_t(qa) + rows_per_tile < int64_t(q1) ? int32_t(qa + rows_per_tile) : q1;
  if (qa >= qb || qa < q0) return;  // a padding item (fixed steps): no rows
  const int64_t first_page = kv_indptr[b];
  const int64_t pages = kv_indptr[b + 1] - first_page;
  const int32_t kv_len = int32_t(pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[b]);
  const int32_t qo_len = int32_t(q1 - q0);
  if (end > kv_len) end = kv_len;  // never after host planning
  if (begin < 0) begin = 0;
  const int32_t packed = (qb - qa) * group;
  const int32_t chunk = partial ? kv_chunk[item] : 0;

  PKV_DYN_SMEM(unsigned char, smem);
  constexpr int kStage = 2 * kBc * (kKVRow + kSFRow);  // K and V tiles (and scale tiles) of one stage
  unsigned char* q_hi = smem + 2 * kStage;
  unsigned char* q_lo = q_hi + 16 * W * kQRow;
  const float cap_log2e = soft_cap * kLog2e;
  // The copy's invariants: the request's page-table row, the head's
  // first element, strides in bytes, the page-size divider.
  const int32_t* __restrict__ page_row = kv_indices + first_page;
  // (NVFP4: codes at element offset / 2, scales at / 16.)
  const int64_t head_bytes = TC::kFP4 ? int64_t(h) * stride_h / 2 : int64_t(h) * stride_h * int64_t(sizeof(T));
  const unsigned char* __restrict__ k_head = reinterpret_cast<const unsigned char*>(k_data) + head_bytes;
  const unsigned char* __restrict__ v_head = reinterpret_cast<const unsigned char*>(v_data) + head_bytes;
  const unsigned char* __restrict__ k_head_sf = TC::kFP4 ? k_sf + int64_t(h) * stride_h / 16 : nullptr;
  const unsigned char* __restrict__ v_head_sf = TC::kFP4 ? v_sf + int64_t(h) * stride_h / 16 : nullptr;
  const int64_t page_bytes = stride_page * int64_t(sizeof(T));
  const int64_t entry_bytes = stride_n * int64_t(sizeof(T));
  const PageDiv pd(page_size);

  // This lane's ldmatrix offsets for k-step (or V feature block) 0: step
  // kt is at swz_xor(offset, 32 * kt).
  const uint32_t q_frag = q_frag_at<kQRow>(warp, lane);
  const uint32_t k_frag = k_frag_at<kKVRow>(lane);
  const uint32_t v_frag = v_frag_at<kKVRow>(lane);

  for (int32_t pb = 0; pb < packed; pb += 16 * W) {
    const int32_t pe = pb + 16 * W < packed ? pb + 16 * W : packed;
    // Keys of the pass: the first row has the lowest window bound, the last
    // the highest causal bound (positions bottom-right aligned).
    const int32_t pos_first = int32_t(qa - q0 + pb / group) + kv_len - qo_len;
    const int32_t pos_last = int32_t(qa - q0 + (pe - 1) / group) + kv_len - qo_len;
    int32_t kb = begin, ke = end;
    if (window_left >= 0 && window_lo(pos_first, window_left) > kb) kb = window_lo(pos_first, window_left);
    if (causal && pos_last + 1 < ke) ke = pos_last + 1;
    // Keys [lo_max, hi_min) are visible to every row of the pass (the last
    // row's window bound, the first row's causal bound).
    const int32_t lo_max = window_left >= 0 ? window_lo(pos_last, window_left) : 0;
    const int32_t hi_min = causal && pos_first + 1 < ke ? pos_first + 1 : ke;

    // This lane's two rows (C fragment rows g4 and g4 + 8 of its warp).
    int32_t row_lo[2], row_hi[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int32_t p = pb + warp * 16 + g4 + 8 * i;
      const int32_t qi = p / group;
      const int32_t pos = int32_t(qa - q0 + qi) + kv_len - qo_len;
      row_lo[i] = window_left >= 0 ? window_lo(pos, window_left) : 0;
      row_hi[i] = causal && pos + 1 < ke ? pos + 1 : ke;
      if (p >= pe) row_hi[i] = row_lo[i] = 0;  // padding rows see no key
    }
    const bool warp_active = pb + warp * 16 < pe;

    __syncthreads();  // the previous pass is done with shared memory
    if (kb < ke) {
      // Stage Q: packed row r of the pass, feature pairs, rounded to the
      // mma dtype (and the rounding error when split_q).
      for (int e = tid; e < 16 * W * (kD / 2); e += nthreads) {
        const int r = e / (kD / 2);
        const int f = (e % (kD / 2)) * 2;
        const int32_t p = pb + r;
        float x0 = 0.0f, x1 = 0.0f;
        if (p < pe) {
          const int32_t qi = p / group;
          const int64_t idx = (int64_t(qa + qi) * num_qo_heads + (h * group + (p - qi * group))) * kD + f;
          x0 = load_f32(q, idx, q_dtype);
          x1 = load_f32(q, idx + 1, q_dtype);
        }
        const uint32_t hi = pack2<kBF16>(x0, x1);
        const uint32_t at = swz<kQRow>(uint32_t(r), uint32_t(f * 2));
        *reinterpret_cast<uint32_t*>(q_hi + at) = hi;
        if (split_q) *reinterpret_cast<uint32_t*>(q_lo + at) = pack2_lo<kBF16>(x0, x1, hi);
      }
      if constexpr (TC::kFP4) {
        copy_kv_nvfp4<kD, kBc>(smem, smem + kBc * kKVRow, smem + 2 * kBc * kKVRow, smem + 2 * kBc * kKVRow + kBc * kSFRow,
                               k_head, v_head, k_head_sf, v_head_sf, page_row, kb, ke, pd, num_pages, stride_page,
                               stride_n, tid, nthreads);
      } else {
        copy_kv<T, kD, kBc>(smem, smem + kBc * kKVRow, k_head, v_head, page_row, kb, ke, pd, num_pages, page_bytes,
                            entry_bytes, tid, nthreads);
      }
    }

    float m[2] = {neg_inf(), neg_inf()};
    float d[2] = {0.0f, 0.0f};
    float acc[kNB][4];
#pragma unroll
    for (int n = 0; n < kNB; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    int stage = 0;
    for (int32_t t0 = kb; t0 < ke; t0 += kBc) {
      if (t0 + kBc < ke) {
        unsigned char* next = smem + (stage ^ 1) * kStage;
        if constexpr (TC::kFP4) {
          copy_kv_nvfp4<kD, kBc>(next, next + kBc * kKVRow, next + 2 * kBc * kKVRow,
                                 next + 2 * kBc * kKVRow + kBc * kSFRow, k_head, v_head, k_head_sf, v_head_sf,
                                 page_row, t0 + kBc, ke, pd, num_pages, stride_page, stride_n, tid, nthreads);
        } else {
          copy_kv<T, kD, kBc>(next, next + kBc * kKVRow, k_head, v_head, page_row, t0 + kBc, ke, pd, num_pages,
                              page_bytes, entry_bytes, tid, nthreads);
        }
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // (A) the stage (and Q) is filled by every thread
      if (warp_active) {
        const unsigned char* ks = smem + stage * kStage;
        const unsigned char* vs = ks + kBc * kKVRow;
        const unsigned char* ksf = ks + 2 * kBc * kKVRow;  // NVFP4 scale tiles
        const unsigned char* vsf = ksf + kBc * kSFRow;
        // S = Q K^T: s[n] is keys t0 + 8n .. t0 + 8n + 7; the lo plane of
        // q (split_q) is a second pass, off the common path.
        float s[kBc / 8][4];
#pragma unroll
        for (int n = 0; n < kBc / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if constexpr (kGather<KV>) {
          qk<KV, kD>(s, q_hi, q_lo, split_q, q_frag, ks, ksf, k_frag, lane);
        } else {
          qk<KV, kD>(s, q_hi, q_lo, false, q_frag, ks, ksf, k_frag, lane);
          if (split_q) qk<KV, kD>(s, q_lo, q_lo, false, q_frag, ks, ksf, k_frag, lane);
        }
        // Logits, masks, online softmax. A tile every valid row of the
        // pass sees whole (block-uniform) skips the per-element masks; the
        // soft cap is one uniform branch per tile, not one per element.
        float mx[2] = {neg_inf(), neg_inf()};
        const bool whole = t0 >= lo_max && t0 + kBc <= hi_min;
        if (soft_cap > 0.0f) {
          if (whole) {
            logits<false, true>(s, mx, t0, t4, row_lo, row_hi, q_scale, soft_cap, cap_log2e);
          } else {
            logits<true, true>(s, mx, t0, t4, row_lo, row_hi, q_scale, soft_cap, cap_log2e);
          }
        } else if (whole) {
          logits<false, false>(s, mx, t0, t4, row_lo, row_hi, q_scale, soft_cap, cap_log2e);
        } else {
          logits<true, false>(s, mx, t0, t4, row_lo, row_hi, q_scale, soft_cap, cap_log2e);
        }
        // o and d are rescaled only when a row maximum of the warp grew
        // (a warp-uniform branch): otherwise every corr is exp2(0) = 1, or
        // the row has seen no key yet (m stays -inf, o and d are 0).
        float m_use[2], corr[2];
        bool grew = false;
#pragma unroll
        for (int i = 0; i < 2; i++) {
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
          const float m_new = fmaxf(m[i], mx[i]);
          m_use[i] = m_new == neg_inf() ? 0.0f : m_new;
          corr[i] = exp2_approx(m[i] - m_use[i]);
          grew = grew || m_new != m[i];
          m[i] = m_new;
        }
        if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
          for (int i = 0; i < 2; i++) {
            d[i] *= corr[i];
#pragma unroll
            for (int n = 0; n < kNB; n++) {
              acc[n][2 * i] *= corr[i];
              acc[n][2 * i + 1] *= corr[i];
            }
          }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
#pragma unroll
          for (int n = 0; n < kBc / 8; n++) {
            s[n][2 * i] = exp2_approx(s[n][2 * i] - m_use[i]);
            s[n][2 * i + 1] = exp2_approx(s[n][2 * i + 1] - m_use[i]);
            d[i] += s[n][2 * i] + s[n][2 * i + 1];
          }
        }
        // O += P V, 16 keys at a time; P's A fragment is two S blocks. The
        // lo plane of P (split_p) is a second product behind a uniform
        // branch, off the common path (fp8: in the same pass, see qk).
#pragma unroll
        for (int kk = 0; kk < kBc / 16; kk++) {
          uint32_t pa[4], plo[4] = {0u, 0u, 0u, 0u};
          pack_p<kBF16>(pa, s, kk);
          if (split_p) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
              plo[j] = pack2_lo<kBF16>(s[2 * kk + (j >> 1)][2 * (j & 1)], s[2 * kk + (j >> 1)][2 * (j & 1) + 1], pa[j]);
            }
          }
          const unsigned char* vk = vs + kk * 16 * kKVRow;
          const unsigned char* vksf = vsf + kk * 16 * kSFRow;
          if constexpr (kGather<KV>) {
            pv<KV, kD>(acc, pa, plo, split_p, vk, vksf, v_frag, lane);
          } else {
            pv<KV, kD>(acc, pa, plo, false, vk, vksf, v_frag, lane);
            if (split_p) pv<KV, kD>(acc, plo, plo, false, vk, vksf, v_frag, lane);
          }
        }
      }
      __syncthreads();  // (B) every warp is done with this stage before it is refilled
      stage ^= 1;
    }

    if (!warp_active) continue;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      d[i] += __shfl_xor_sync(0xffffffffu, d[i], 1);
      d[i] += __shfl_xor_sync(0xffffffffu, d[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int32_t p = pb + warp * 16 + g4 + 8 * i;
      if (p >= pe) continue;
      const int32_t qi = p / group;
      const int64_t qrow = qa + qi, qhead = h * group + (p - qi * group);
      const float sink_c = partial ? 1.0f : sink_fold(sinks, qhead, m[i], d[i]);  // the final state only
      const bool empty = !(d[i] > 0.0f);
      const float inv_d = empty ? 0.0f : sink_c * rcp_approx(d[i]);
      const float out_lse = empty ? neg_inf() : m[i] + log2_approx(d[i]);
      if (partial) {
        const int64_t row = (int64_t(merge_indptr[qrow]) + chunk) * num_qo_heads + qhead;
#pragma unroll
        for (int n = 0; n < kNB; n++) {
          tmp_o[row * kD + 8 * n + 2 * t4] = acc[n][2 * i] * inv_d;
          tmp_o[row * kD + 8 * n + 2 * t4 + 1] = acc[n][2 * i + 1] * inv_d;
        }
        if (t4 == 0) tmp_lse[row] = out_lse;
      } else {
        const int64_t row = qrow * num_qo_heads + qhead;
#pragma unroll
        for (int n = 0; n < kNB; n++) {
          store_f32(o, row * kD + 8 * n + 2 * t4, o_dtype, acc[n][2 * i] * inv_d * v_scale);
          store_f32(o, row * kD + 8 * n + 2 * t4 + 1, o_dtype, acc[n][2 * i + 1] * inv_d * v_scale);
        }
        if (lse != nullptr && t4 == 0) lse[row] = out_lse;
      }
    }
  }
}

}  // namespace tcprefill
}  // namespace pkv

// batch_prefill_paged_<kv>_d<D>. Pointers: q [rows, Hq, D] (q_dtype), the K
// and V views of the cache (element strides stride_page/stride_n/stride_h),
// the page table, qo_indptr [B+1], work [items][4] = (q_row, request,
// kv_begin, kv_end), kv_chunk [items] and merge_indptr [rows+1] (read only
// when partial), o [rows, Hq, D] (o_dtype) and lse [rows*Hq] (may be null),
// tmp_o/tmp_lse (f32 partial states), sinks [Hq] (may be null; joins the
// final o and lse only, sink.cuh). q_scale multiplies q·k
// (sm_scale*k_scale*log2(e), or without log2(e) with a soft cap); soft_cap 0
// disables the cap; window_left < 0 disables the window; flags: 1 partial,
// 2 split_q, 4 split_p. The float scalars are carried in doubles.
//
// __launch_bounds__(128, PKV_PREFILL_MIN_CTAS): at most 4 warps, and the
// CTAs per SM ptxas must fit without spilling (docs/kernels.md, static
// report): 4 at d64 (<= 128 registers), 3 at f16/bf16 d128 (<= 168), 2
// for fp8 d128 (168 spills on sm_90) and d256 (128 f32 accumulators per
// lane).
#define PKV_PREFILL_MIN_CTAS(KV, D) ((D) <= 64 ? 4 : (D) <= 128 && !pkv::tcprefill::kGather<KV> ? 3 : 2)
// The names this macro builds are written out in doc.go's entry-point table.
#define PKV_PREFILL_ENTRY(NAME, KV, D)                                                                              \
  extern "C" __global__ void __launch_bounds__(128, PKV_PREFILL_MIN_CTAS(KV, D)) NAME(                                                        \
      const void* __restrict__ q, const KV::T* __restrict__ k_data, const KV::T* __restrict__ v_data,               \
      const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices,                                \
      const int32_t* __restrict__ kv_last_page_len, const int32_t* __restrict__ qo_indptr,                          \
      const int32_t* __restrict__ work, const int32_t* __restrict__ kv_chunk,                                       \
      const int32_t* __restrict__ merge_indptr, void* __restrict__ o, float* __restrict__ lse,                      \
      float* __restrict__ tmp_o, float* __restrict__ tmp_lse, const float* __restrict__ sinks,                    \
      int64_t num_qo_heads, int64_t num_kv_heads,                                                                   \
      int64_t page_size, int64_t num_pages, int64_t stride_page, int64_t stride_n, int64_t stride_h,                \
      int64_t q_dtype, int64_t o_dtype, double q_scale, double soft_cap, double v_scale, int64_t rows_per_tile,     \
      int64_t causal, int64_t window_left, int64_t flags) {                                                         \
    pkv::tcprefill::prefill_body<KV, D>(q, k_data, v_data, kv_indptr, kv_indices, kv_last_page_len, qo_indptr,      \
                                        work, kv_chunk, merge_indptr, o, lse, tmp_o, tmp_lse, sinks, num_qo_heads,  \
                                        num_kv_heads, page_size, num_pages, stride_page, stride_n, stride_h,        \
                                        q_dtype, o_dtype, float(q_scale), float(soft_cap), float(v_scale),          \
                                        rows_per_tile, causal, window_left, flags, nullptr, nullptr);               \
  }

// batch_prefill_paged_nvfp4_d<D>: the same arguments, k_data/v_data the
// NVFP4 code tensors, then k_sf and v_sf, their scale tensors.
#define PKV_PREFILL_NVFP4_ENTRY(D)                                                                                  \
  extern "C" __global__ void __launch_bounds__(128, PKV_PREFILL_MIN_CTAS(pkv::KvNVFP4, D))                        \
      batch_prefill_paged_nvfp4_d##D(                                                                             \
          const void* __restrict__ q, const uint8_t* __restrict__ k_data, const uint8_t* __restrict__ v_data,     \
          const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices,                          \
          const int32_t* __restrict__ kv_last_page_len, const int32_t* __restrict__ qo_indptr,                    \
          const int32_t* __restrict__ work, const int32_t* __restrict__ kv_chunk,                                 \
          const int32_t* __restrict__ merge_indptr, void* __restrict__ o, float* __restrict__ lse,                \
          float* __restrict__ tmp_o, float* __restrict__ tmp_lse, const float* __restrict__ sinks,                \
          int64_t num_qo_heads, int64_t num_kv_heads, int64_t page_size, int64_t num_pages, int64_t stride_page,  \
          int64_t stride_n, int64_t stride_h, int64_t q_dtype, int64_t o_dtype, double q_scale, double soft_cap,  \
          double v_scale, int64_t rows_per_tile, int64_t causal, int64_t window_left, int64_t flags,              \
          const uint8_t* __restrict__ k_sf, const uint8_t* __restrict__ v_sf) {                                   \
    pkv::tcprefill::prefill_body<pkv::KvNVFP4, D>(                                                                \
        q, k_data, v_data, kv_indptr, kv_indices, kv_last_page_len, qo_indptr, work, kv_chunk, merge_indptr, o,   \
        lse, tmp_o, tmp_lse, sinks, num_qo_heads, num_kv_heads, page_size, num_pages, stride_page, stride_n,      \
        stride_h, q_dtype, o_dtype, float(q_scale), float(soft_cap), float(v_scale), rows_per_tile, causal,       \
        window_left, flags, k_sf, v_sf);                                                                          \
  }

#define PKV_PREFILL_DTYPE(SUFFIX, KV)                     \
  PKV_PREFILL_ENTRY(batch_prefill_paged_##SUFFIX##_d64, KV, 64)   \
  PKV_PREFILL_ENTRY(batch_prefill_paged_##SUFFIX##_d128, KV, 128) \
  PKV_PREFILL_ENTRY(batch_prefill_paged_##SUFFIX##_d256, KV, 256)

PKV_PREFILL_DTYPE(f16, pkv::KvF16)
PKV_PREFILL_DTYPE(bf16, pkv::KvBF16)
PKV_PREFILL_DTYPE(e4m3, pkv::KvE4M3)
PKV_PREFILL_DTYPE(e5m2, pkv::KvE5M2)
PKV_PREFILL_NVFP4_ENTRY(64)
PKV_PREFILL_NVFP4_ENTRY(128)
PKV_PREFILL_NVFP4_ENTRY(256)

#if !defined(__CUDACC__)
// Emulator-only entries (not in the PTX) for internal/cpuemu's tests.
//
// cuemu_test_page_div writes PageDiv(page_size).div(t[i]) to q[i].
extern "C" __global__ void cuemu_test_page_div(int64_t page_size, const uint32_t* t, int64_t n, uint32_t* q) {
  const pkv::PageDiv pd(page_size);
  for (int64_t i = 0; i < n; i++) q[i] = pd.div(t[i]);
}

// cuemu_test_prefill_offsets lists the shared-memory offsets of
// batch_prefill_paged_<kv>_d<D> for kind 0 (f16 and bf16) or 1 (fp8), as
// records of 35 words: what (0 Q ldmatrix at k-step a; 1 K ldmatrix at
// k-step a, keys 16b; 2 V ldmatrix.trans at feature block a, keys 16b; 3
// the cp.async writes of warp a's chunk b), a, b, then the byte offset
// each of the 32 lanes addresses, computed by the kernel's own offset
// functions (warp 0 for Q). A record of what = 0xffffffff ends the list.
namespace pkv {
namespace tcprefill {
template <typename KV, int kD>
inline uint32_t* offsets(uint32_t* out) {
  constexpr int kKVRow = kD * int(sizeof(typename KV::T));
  constexpr int kQRow = kD * 2;
  constexpr int kBc = kBcFor<kD>;
  using M = CopyMap<kKVRow, kBc>;
  const auto rec = [&out](uint32_t what, uint32_t a, uint32_t b, const auto& off) {
    *out++ = what;
    *out++ = a;
    *out++ = b;
    for (int l = 0; l < 32; l++) *out++ = off(l);
  };
  if (!Tc<KV>::kFP8) {
    for (int kt = 0; kt < kD / 16; kt++) {
      rec(0, kt, 0, [&](int l) { return swz_xor(q_frag_at<kQRow>(0, l), 32 * kt); });
      for (int kk = 0; kk < kBc / 16; kk++)
        rec(1, kt, kk, [&](int l) { return uint32_t(kk * 16 * kKVRow) + swz_xor(k_frag_at<kKVRow>(l), 32 * kt); });
    }
    for (int fb = 0; fb < kD / 16; fb++)
      for (int kk = 0; kk < kBc / 16; kk++)
        rec(2, fb, kk, [&](int l) { return uint32_t(kk * 16 * kKVRow) + swz_xor(v_frag_at<kKVRow>(l), 32 * fb); });
  }
  for (int w = 0; w < 4; w++)
    for (int j = 0; j < M::kCPT; j++) rec(3, w, j, [&](int l) { return M::dst(M::base(32 * w + l), j); });
  *out++ = 0xffffffffu;
  return out;
}
}  // namespace tcprefill
}  // namespace pkv

extern "C" __global__ void cuemu_test_prefill_offsets(int64_t kind, int64_t head_dim, uint32_t* out) {
  switch (kind * 1000 + head_dim) {
    case 64: pkv::tcprefill::offsets<pkv::KvF16, 64>(out); break;
    case 128: pkv::tcprefill::offsets<pkv::KvF16, 128>(out); break;
    case 256: pkv::tcprefill::offsets<pkv::KvF16, 256>(out); break;
    case 1064: pkv::tcprefill::offsets<pkv::KvE4M3, 64>(out); break;
    case 1128: pkv::tcprefill::offsets<pkv::KvE4M3, 128>(out); break;
    case 1256: pkv::tcprefill::offsets<pkv::KvE4M3, 256>(out); break;
    default: __trap();
  }
}
#endif
