// mla_tc.cu: MLA decode on tensor cores (FlashInfer's
// BatchMLAPagedAttentionWrapper.run for one query per request, absorbed
// form) for 16-bit and fp8 caches with head_dim_ckv = 512 and
// head_dim_kpe = 64. See docs/kernels.md, "MLA decode on tensor cores".
//
// One CTA of 4 warps per (work item, head tile of 16 heads). A work item is
// the quad (q_row, request, kv_begin, kv_end) of the split-k plan: the CTA
// attends keys [kv_begin, kv_end) of the request. The 16 heads are the rows
// (M) of mma.m16n8k16; the keys are walked in tiles of 16 that cp.async
// copies, through the page table, into a 2-stage ring of padded shared rows
// (576 elements + 16 bytes per key), and every ckv/kpe byte of the tile
// serves all 16 heads.
//
// Warp w owns ckv columns [128w, 128w + 128) and kpe columns
// [16w, 16w + 16): 9 k-steps of 16. For a tile it
//   1. computes its partial S = Q[:, cols_w] · K[keys, cols_w]^T (16 x 16,
//      2 n-tiles) with its Q fragments held in registers for the whole
//      kernel (36 registers; 72 with the hi/lo split below) and the K
//      fragments from ldmatrix (16-bit caches) or packed fp8 converts;
//   2. writes the partial to shared memory; after a barrier every warp sums
//      the 4 partials (same order in every warp, so every warp computes the
//      same S and the same softmax) and runs the online softmax in the log2
//      domain (S is scaled by sm_scale*log2(e) in f32 after the mma);
//   3. turns P (the C fragments of S) into an A fragment in registers and
//      accumulates O[:, cols_w] += P · V[keys, cols_w] (16 n-tiles, 64 f32
//      registers), V fragments from ldmatrix.trans (16-bit) or 32-bit loads,
//      one PRMT and one packed convert per register (fp8; see v_frags).
// Two barriers per tile: (A) the tile has landed (then the next tile's
// copies are issued into the other stage), (B) the partials are written.
//
// Precision. The mma type is the cache's: bf16 for a bf16 cache, f16 for
// f16, e4m3 and e5m2 (every fp8 value is an f16 value, widened exactly).
// kHiLo (the _hilo entries) carries q and P as hi + lo pairs of that type
// (two mmas each), which keeps about 22 (f16) or 16 (bf16) significant bits
// where q or o is finer than the mma type; without it q and P are rounded
// once to the mma type, as FlashInfer does. The launcher picks kHiLo when
// q_nope, q_pe or o carries more significant bits than the mma type (f32;
// f16 over a bf16 cache): see MLAKernelFor in step_mla.go.
#include "tile_common.cuh"

namespace pkv {
namespace mlatc {

constexpr int kDCKV = 512;                      // head_dim_ckv
constexpr int kDKPE = 64;                       // head_dim_kpe
constexpr int kWarps = 4;                       // warps per CTA
constexpr int kHeads = 16;                      // heads per CTA (mma M)
constexpr int kKeys = 16;                       // keys per tile
constexpr int kStages = 2;                      // cp.async ring
constexpr int kCols = kDCKV / kWarps;           // ckv columns per warp (128)
constexpr int kPeCols = kDKPE / kWarps;         // kpe columns per warp (16)
constexpr int kKSteps = (kCols + kPeCols) / 16; // k-steps of a warp's S (9)
constexpr int kNTiles = kCols / 8;              // n-tiles of a warp's O (16)

// Cache traits: the mma type (bf16 or f16) and, for fp8, the packed convert.
template <typename KV>
struct Tc {
  static constexpr bool kFp8 = false;
  static constexpr bool kBF16 = false;
};
template <>
struct Tc<KvBF16> {
  static constexpr bool kFp8 = false;
  static constexpr bool kBF16 = true;
};
template <>
struct Tc<KvE4M3> {
  static constexpr bool kFp8 = true;
  static constexpr bool kBF16 = false;
  __device__ static __forceinline__ uint32_t cvt(uint16_t pair) { return cvt_f16x2_e4m3x2(pair); }
};
template <>
struct Tc<KvE5M2> {
  static constexpr bool kFp8 = true;
  static constexpr bool kBF16 = false;
  __device__ static __forceinline__ uint32_t cvt(uint16_t pair) { return cvt_f16x2_e5m2x2(pair); }
};

// Shared memory of a CTA. kRow: one padded key row, 576 elements and 16
// bytes, so the 8 rows an ldmatrix phase (or an fp8 fragment load) reads
// start in 8 different 4-bank groups (row stride 1168 B = 292 words,
// 292 mod 32 = 4; fp8: 592 B = 148 words, 148 mod 32 = 20). kBytes: the
// stages, one valid flag per key and stage, and the S partials (4 warps x
// 32 lanes x 8 floats).
template <typename KV>
struct Smem {
  static constexpr int kRow = (kDCKV + kDKPE) * int(sizeof(typename KV::T)) + 16;
  static constexpr int kStage = kKeys * kRow;
  static constexpr int kBytes = kStages * kStage + kStages * kKeys + kWarps * 32 * 8 * 4;
};

// The launcher passes these sizes (mlaTCSmem in step_mla.go; a test checks
// the launches).
static_assert(Smem<KvF16>::kBytes == 41504 && Smem<KvBF16>::kBytes == 41504, "16-bit CTA shared memory");
static_assert(Smem<KvE4M3>::kBytes == 23072 && Smem<KvE5M2>::kBytes == 23072, "fp8 CTA shared memory");

template <bool kBF16>
__device__ __forceinline__ uint16_t to_bits(float x) {
  return kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
}

template <bool kBF16>
__device__ __forceinline__ float from_bits(uint16_t h) {
  return kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// pack_split rounds (x0, x1) to the mma type into hi and, with kHiLo, the
// rounding errors into lo; it returns x0 + x1 as carried (hi, + lo).
template <bool kBF16, bool kHiLo>
__device__ __forceinline__ float pack_split(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const uint16_t h0 = to_bits<kBF16>(x0), h1 = to_bits<kBF16>(x1);
  hi = uint32_t(h0) | uint32_t(h1) << 16;
  float sum = from_bits<kBF16>(h0) + from_bits<kBF16>(h1);
  if constexpr (kHiLo) {
    const uint16_t l0 = to_bits<kBF16>(x0 - from_bits<kBF16>(h0));
    const uint16_t l1 = to_bits<kBF16>(x1 - from_bits<kBF16>(h1));
    lo = uint32_t(l0) | uint32_t(l1) << 16;
    sum += from_bits<kBF16>(l0) + from_bits<kBF16>(l1);
  }
  return sum;
}

// The fp8 fragments are read as 32-bit words (4 codes each; the shared
// rows are bytes, which ldmatrix cannot transpose) with the k and n indices
// of the mma permuted within a tile, which a dot product and a column order
// allow:
//   - S: lane (g, t)'s B fragment of k-step ks is K[key g][4t..4t+3] (one
//     word: its low half is the logical k = 2t, 2t+1, its high half 2t+8,
//     2t+9), and the Q fragments are loaded with the same permutation;
//   - O: n-tile n of a 32-column group c holds columns c + 4j + n (j = 0..7,
//     the mma's n index), so lane g reads one word V[key][c + 4g..+3] per key
//     row and gets its B values of 4 n-tiles from it (kp_col maps back).
// Both read 32 distinct banks per warp instruction (row stride 148 words).

// q_col is the dims offset, within a k-step, of element e (0, 1) of Q
// fragment register r of lane quad t.
template <typename KV>
__device__ __forceinline__ int q_col(int t, int r, int e) {
  return Tc<KV>::kFp8 ? 4 * t + 2 * (r >> 1) + e : 2 * t + 8 * (r >> 1) + e;
}

// out_col is the column, within the warp's 128, of the mma's column j of
// n-tile n.
template <typename KV>
__device__ __forceinline__ int out_col(int n, int j) {
  return Tc<KV>::kFp8 ? 32 * (n / 4) + 4 * j + n % 4 : 8 * n + j;
}

// k_frags loads the B fragments of K^T for k-step ks of warp w: b[2j],
// b[2j+1] for keys 8j..8j+7 of the tile (column-major B = row-major K rows).
template <typename KV>
__device__ __forceinline__ void k_frags(const unsigned char* tile, int ks, int warp, int lane, uint32_t (&b)[4]) {
  const int col = ks < kCols / 16 ? kCols * warp + 16 * ks : kDCKV + kPeCols * warp;  // element column
  constexpr int rb = Smem<KV>::kRow;
  if constexpr (Tc<KV>::kFp8) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(tile + (8 * j + g) * rb + col + 4 * t);
      b[2 * j] = Tc<KV>::cvt(uint16_t(w));
      b[2 * j + 1] = Tc<KV>::cvt(uint16_t(w >> 16));
    }
  } else {
    // matrices: (keys 0-7, cols +0), (keys 0-7, cols +8), (keys 8-15, +0), (keys 8-15, +8)
    const int i = lane / 8;
    const int key = lane % 8 + 8 * (i >> 1);
    ldmatrix_x4(b, tile + key * rb + (col + 8 * (i & 1)) * 2);
  }
}

// v_frags loads the B fragments of V for the 32 columns from c of the
// tile: b[2n], b[2n+1] for n-tile n = 0..3 (columns out_col).
template <typename KV>
__device__ __forceinline__ void v_frags(const unsigned char* tile, int c, int lane, uint32_t (&b)[8]) {
  constexpr int rb = Smem<KV>::kRow;
  if constexpr (Tc<KV>::kFp8) {
    const int g = lane / 4, t = lane % 4;
    uint32_t w[4];  // keys 2t, 2t+1, 2t+8, 2t+9
#pragma unroll
    for (int r = 0; r < 4; r++) w[r] = *reinterpret_cast<const uint32_t*>(tile + (2 * t + (r & 1) + 8 * (r >> 1)) * rb + c + 4 * g);
#pragma unroll
    for (int n = 0; n < 4; n++) {
      b[2 * n] = Tc<KV>::cvt(pair_bytes(w[0], w[1], n));
      b[2 * n + 1] = Tc<KV>::cvt(pair_bytes(w[2], w[3], n));
    }
  } else {
    // matrices: (keys 0-7, cols +0), (keys 8-15, +0), (keys 0-7, +8), (keys 8-15, +8)
    const int i = lane / 8;
    const int key = lane % 8 + 8 * (i & 1);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, tile + key * rb + (c + 16 * h + 8 * (i >> 1)) * 2);
#pragma unroll
      for (int k = 0; k < 4; k++) b[4 * h + k] = r[k];
    }
  }
}

// load_tile issues the copies of keys [k0, k0 + 16) ∩ [.., kv_end) into
// stage: thread tid copies key tid/8, 16-byte chunks tid%8 + 8j. A key
// past kv_end or on a page outside [0, num_pages) (never after host
// validation) is zero-filled and flagged invalid.
template <typename KV>
__device__ __forceinline__ void load_tile(unsigned char* stage, unsigned char* flags, const typename KV::T* ckv,
                                          const typename KV::T* kpe, const int32_t* kv_indices, int64_t first,
                                          int64_t k0, int64_t kv_end, int64_t page_size, int64_t num_pages,
                                          int64_t row_ckv, int64_t row_kpe) {
  using T = typename KV::T;
  constexpr int kPer = 16 / int(sizeof(T));                   // elements per chunk
  constexpr int kCkvChunks = kDCKV / kPer;                    // 64 (16-bit), 32 (fp8)
  constexpr int kChunks = (kDCKV + kDKPE) / kPer;             // 72, 36
  const int tid = int(threadIdx.x);
  const int key = tid / 8;
  // Positions are below kv_len < 2^31 and page_size fits 32 bits too: the
  // page lookup divides in 32 bits.
  const uint32_t pos = uint32_t(k0 + key), ps = uint32_t(page_size);
  int64_t page = -1;
  if (pos < kv_end) page = kv_indices[first + pos / ps];
  const bool valid = page >= 0 && page < num_pages;
  unsigned char* row = stage + key * Smem<KV>::kRow;
  if (tid % 8 == 0) flags[key] = valid;
  const int sub = tid % 8;
  if (!valid) {
    for (int c = sub; c < kChunks; c += 8) *reinterpret_cast<uint4*>(row + 16 * c) = uint4{0, 0, 0, 0};
    return;
  }
  const int64_t tok = page * page_size + pos % ps;
  const T* crow = ckv + tok * row_ckv;
#pragma unroll
  for (int j = 0; j < kCkvChunks / 8; j++) cp_async_16(row + 16 * (sub + 8 * j), crow + (sub + 8 * j) * kPer);
  const T* krow = kpe + tok * row_kpe;
#pragma unroll
  for (int c = sub; c < kChunks - kCkvChunks; c += 8) cp_async_16(row + 16 * (kCkvChunks + c), krow + c * kPer);
}

template <typename KV, bool kHiLo>
__device__ __forceinline__ void body(const void* __restrict__ q_nope, const void* __restrict__ q_pe,
                                     const typename KV::T* __restrict__ ckv, const typename KV::T* __restrict__ kpe,
                                     const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices,
                                     const int32_t* __restrict__ work, void* __restrict__ o, float* __restrict__ lse,
                                     float* __restrict__ tmp_o, float* __restrict__ tmp_lse, int64_t num_heads,
                                     int64_t page_size, int64_t num_pages, int64_t row_ckv, int64_t row_kpe,
                                     int64_t q_dtype, int64_t qpe_dtype, int64_t o_dtype, float q_scale,
                                     int64_t partial) {
  constexpr bool kBF16 = Tc<KV>::kBF16;
  constexpr int kHl = kHiLo ? 2 : 1;
  PKV_DYN_SMEM(unsigned char, smem);
  unsigned char* flags = smem + kStages * Smem<KV>::kStage;
  float* xbuf = reinterpret_cast<float*>(flags + kStages * kKeys);

  const int tid = int(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t item = blockIdx.x;
  const int64_t qrow = work[4 * item], req = work[4 * item + 1];
  const int64_t kv_begin = work[4 * item + 2], kv_end = work[4 * item + 3];
  const int64_t h0 = int64_t(blockIdx.y) * kHeads;
  const int64_t first = kv_indptr[req];

  // Q fragments of the warp's 9 k-steps (rows past num_heads are 0).
  uint32_t qa[kHl][kKSteps][4];
#pragma unroll
  for (int ks = 0; ks < kKSteps; ks++) {
    const bool pe = ks == kKSteps - 1;
    const int col = pe ? kPeCols * warp : kCols * warp + 16 * ks;
    const int64_t dim = pe ? kDKPE : kDCKV;
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int64_t h = h0 + g + 8 * (r & 1);
      const int64_t at = (qrow * num_heads + h) * dim + col;
      float x0 = 0.0f, x1 = 0.0f;
      if (h < num_heads) {
        x0 = load_f32(pe ? q_pe : q_nope, at + q_col<KV>(t, r, 0), pe ? qpe_dtype : q_dtype);
        x1 = load_f32(pe ? q_pe : q_nope, at + q_col<KV>(t, r, 1), pe ? qpe_dtype : q_dtype);
      }
      pack_split<kBF16, kHiLo>(x0, x1, qa[0][ks][r], qa[kHl - 1][ks][r]);
    }
  }

  const float ninf = -__uint_as_float(0x7f800000u);
  float acc[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float m[2] = {ninf, ninf}, d[2] = {0.0f, 0.0f};  // rows g and g+8; d is this lane's part

  const int64_t tiles = (kv_end - kv_begin + kKeys - 1) / kKeys;
  if (tiles > 0)
    load_tile<KV>(smem, flags, ckv, kpe, kv_indices, first, kv_begin, kv_end, page_size, num_pages, row_ckv, row_kpe);
  cp_async_commit();
  for (int64_t it = 0; it < tiles; it++) {
    const int st = int(it & 1);
    const unsigned char* tile = smem + st * Smem<KV>::kStage;
    cp_async_wait<0>();
    __syncthreads();  // (A): tile `it` is in stage st; stage st^1 and xbuf are free
    if (it + 1 < tiles)
      load_tile<KV>(smem + (st ^ 1) * Smem<KV>::kStage, flags + (st ^ 1) * kKeys, ckv, kpe, kv_indices, first,
                    kv_begin + (it + 1) * kKeys, kv_end, page_size, num_pages, row_ckv, row_kpe);
    cp_async_commit();

    // 1. the warp's partial S (keys 0-7: s[0], keys 8-15: s[1]).
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ks++) {
      uint32_t b[4];
      k_frags<KV>(tile, ks, warp, lane, b);
#pragma unroll
      for (int h = 0; h < kHl; h++) {
        mma_m16n8k16_acc<kBF16>(s[0], qa[h][ks], b[0], b[1]);
        mma_m16n8k16_acc<kBF16>(s[1], qa[h][ks], b[2], b[3]);
      }
    }
    // 2. sum the 4 warps' partials, mask, online softmax.
    float4* mine = reinterpret_cast<float4*>(xbuf + (warp * 32 + lane) * 8);
    mine[0] = float4{s[0][0], s[0][1], s[0][2], s[0][3]};
    mine[1] = float4{s[1][0], s[1][1], s[1][2], s[1][3]};
    __syncthreads();  // (B)
#pragma unroll
    for (int j = 0; j < 2; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
      const float4* p = reinterpret_cast<const float4*>(xbuf + (w * 32 + lane) * 8);
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const float4 v = p[j];
        s[j][0] += v.x;
        s[j][1] += v.y;
        s[j][2] += v.z;
        s[j][3] += v.w;
      }
    }
    const unsigned char* fl = flags + st * kKeys;
    float mx[2] = {ninf, ninf};
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const uint32_t f = *reinterpret_cast<const uint16_t*>(fl + 8 * j + 2 * t);  // keys 8j+2t, 8j+2t+1
#pragma unroll
      for (int r = 0; r < 4; r++) {
        s[j][r] = (f >> (8 * (r & 1))) & 1 ? s[j][r] * q_scale : ninf;
        mx[r >> 1] = fmaxf(mx[r >> 1], s[j][r]);
      }
    }
    float corr[2], mu[2];
#pragma unroll
    for (int r2 = 0; r2 < 2; r2++) {
      mx[r2] = fmaxf(mx[r2], __shfl_xor_sync(0xffffffffu, mx[r2], 1));
      mx[r2] = fmaxf(mx[r2], __shfl_xor_sync(0xffffffffu, mx[r2], 2));
      const float mn = fmaxf(m[r2], mx[r2]);
      mu[r2] = mn == ninf ? 0.0f : mn;  // no key yet: every p and corr is 0
      corr[r2] = exp2_approx(m[r2] - mu[r2]);
      m[r2] = mn;
      d[r2] *= corr[r2];
    }
    if (corr[0] != 1.0f || corr[1] != 1.0f) {  // the same in all 4 warps; rare once the maxima settle
#pragma unroll
      for (int n = 0; n < kNTiles; n++) {
        acc[n][0] *= corr[0];
        acc[n][1] *= corr[0];
        acc[n][2] *= corr[1];
        acc[n][3] *= corr[1];
      }
    }
    // 3. P as an A fragment (a[0]: row g, keys 2t..; a[1]: row g+8; a[2], a[3]: keys 8+2t..).
    uint32_t pa[kHl][4];
#pragma unroll
    for (int j = 0; j < 2; j++) {
#pragma unroll
      for (int r2 = 0; r2 < 2; r2++) {
        const float p0 = exp2_approx(s[j][2 * r2] - mu[r2]);
        const float p1 = exp2_approx(s[j][2 * r2 + 1] - mu[r2]);
        d[r2] += pack_split<kBF16, kHiLo>(p0, p1, pa[0][2 * j + r2], pa[kHl - 1][2 * j + r2]);
      }
    }
#pragma unroll
    for (int q = 0; q < kNTiles / 4; q++) {
      uint32_t b[8];
      v_frags<KV>(tile, kCols * warp + 32 * q, lane, b);
#pragma unroll
      for (int n = 0; n < 4; n++) {
#pragma unroll
        for (int h = 0; h < kHl; h++) mma_m16n8k16_acc<kBF16>(acc[4 * q + n], pa[h], b[2 * n], b[2 * n + 1]);
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: rows g and g+8 of the head tile, the warp's 128 columns.
#pragma unroll
  for (int r2 = 0; r2 < 2; r2++) {
    float dt = d[r2];
    dt += __shfl_xor_sync(0xffffffffu, dt, 1);
    dt += __shfl_xor_sync(0xffffffffu, dt, 2);
    const int64_t h = h0 + g + 8 * r2;
    if (h >= num_heads) continue;
    const bool empty = !(dt > 0.0f);
    const float inv = empty ? 0.0f : rcp_approx(dt);
    const float l = empty ? ninf : m[r2] + log2_approx(dt);
    const int64_t out = partial ? item * num_heads + h : qrow * num_heads + h;
#pragma unroll
    for (int n = 0; n < kNTiles; n++) {
      const int64_t at = out * kDCKV + kCols * warp;
      const int64_t a0 = at + out_col<KV>(n, 2 * t), a1 = at + out_col<KV>(n, 2 * t + 1);
      const float v0 = acc[n][2 * r2] * inv, v1 = acc[n][2 * r2 + 1] * inv;
      if (partial) {
        tmp_o[a0] = v0;
        tmp_o[a1] = v1;
      } else {
        store_f32(o, a0, o_dtype, v0);
        store_f32(o, a1, o_dtype, v1);
      }
    }
    if (warp == 0 && t == 0) {
      if (partial) {
        tmp_lse[out] = l;
      } else if (lse != nullptr) {
        lse[out] = l;
      }
    }
  }
}

}  // namespace mlatc
}  // namespace pkv

// mla_decode_tc_<kv>[_hilo]. Pointers: q_nope [rows, H, 512] (q_dtype),
// q_pe [rows, H, 64] (qpe_dtype), the ckv and kpe views of the cache
// (row_ckv/row_kpe elements per token; 16-byte aligned rows), kv_indptr
// [B+1], kv_indices, work [items][4] = (q_row, request, kv_begin, kv_end),
// then o [rows, H, 512] (o_dtype) and lse [rows*H] (may be null) when
// partial == 0, else tmp_o [items, H, 512] and tmp_lse [items, H] (f32) for
// merge_partial_states. q_scale is sm_scale*log2(e). grid = (items,
// ceil(H/16)), block = 128, dynamic shared memory Smem<KV>::kBytes
// (mlaTCSmem in step_mla.go: 41,504 bytes
// for 16-bit caches, 23,072 for fp8).
//
// __launch_bounds__(128, MINB): with MINB = 4 (at most 128 registers) every
// entry spilled (92-944 bytes); with MINB = 3 (at most 168) the _hilo
// entries spilled 40-132 bytes. So 3 CTAs (12 warps) per SM for the plain
// entries (167 registers) and 2 (8 warps) for _hilo (at most 255; 226-231
// used). Shared memory would allow 5 (16-bit) or 9 (fp8).
// The names this macro builds are written out in doc.go's entry-point table.
#define PKV_MLA_TC_ENTRY(NAME, KV, HILO, MINB)                                                                      \
  extern "C" __global__ void __launch_bounds__(128, MINB) NAME(                                                       \
      const void* __restrict__ q_nope, const void* __restrict__ q_pe, const KV::T* __restrict__ ckv,               \
      const KV::T* __restrict__ kpe, const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices, \
      const int32_t* __restrict__ work, void* __restrict__ o, float* __restrict__ lse, float* __restrict__ tmp_o,   \
      float* __restrict__ tmp_lse, int64_t num_heads, int64_t page_size, int64_t num_pages, int64_t row_ckv,       \
      int64_t row_kpe, int64_t q_dtype, int64_t qpe_dtype, int64_t o_dtype, double q_scale, int64_t partial) {     \
    pkv::mlatc::body<KV, HILO>(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, work, o, lse, tmp_o, tmp_lse,       \
                               num_heads, page_size, num_pages, row_ckv, row_kpe, q_dtype, qpe_dtype, o_dtype,     \
                               float(q_scale), partial);                                                           \
  }

#define PKV_MLA_TC_DTYPE(SUFFIX, KV)                    \
  PKV_MLA_TC_ENTRY(mla_decode_tc_##SUFFIX, KV, false, 3) \
  PKV_MLA_TC_ENTRY(mla_decode_tc_##SUFFIX##_hilo, KV, true, 2)

PKV_MLA_TC_DTYPE(f16, pkv::KvF16)
PKV_MLA_TC_DTYPE(bf16, pkv::KvBF16)
PKV_MLA_TC_DTYPE(e4m3, pkv::KvE4M3)
PKV_MLA_TC_DTYPE(e5m2, pkv::KvE5M2)
