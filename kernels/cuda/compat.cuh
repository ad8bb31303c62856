// compat.cuh: the one header every kernel includes.
//
// With nvcc it pulls in the CUDA headers; with g++ it pulls in the CPU shim
// (internal/cpuemu/cuemu.h, on the include path internal/cpuemu's cgo flags
// set). Everything that differs between the two lives here:
//
//   - PKV_DYN_SMEM: dynamic shared memory (an extern __shared__ array on the
//     GPU, a per-worker buffer in the shim);
//   - the inline-PTX wrappers (ex2/lg2/rcp approximations and cp.async) with
//     a plain C++ twin each, the only inline PTX in the project;
//   - scalar conversions between float and the storage dtypes (f16, bf16,
//     fp8 e4m3/e5m2), written once for both compilers;
//   - the dtype codes the Go launcher passes (mirrored in dtype.go; a Go test
//     checks that the two agree).
#ifndef PAGEDKV_COMPAT_CUH
#define PAGEDKV_COMPAT_CUH

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#define PKV_DYN_SMEM(T, name)                                  \
  extern __shared__ __align__(128) unsigned char name##_raw[]; \
  T* name = reinterpret_cast<T*>(name##_raw)
#else
#include "cuemu.h"
#define PKV_DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(::cuemu::dyn_smem())
#endif

namespace pkv {

// Dtype codes passed as int64 kernel arguments (see dtype.go).
enum Dtype : int64_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kE4M3 = 3,
  kE5M2 = 4,
};

constexpr float kLog2e = 1.4426950408889634f;

// neg_inf is -infinity: the LSE of a state that carries no mass.
__device__ __forceinline__ float neg_inf() { return -__uint_as_float(0x7f800000u); }

// ---- inline PTX wrappers ------------------------------------------------------

// exp2_approx is 2^x (ex2.approx.ftz: about 2 ulp; exp2(-inf) = 0).
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// log2_approx is log2(x) (lg2.approx.ftz).
__device__ __forceinline__ float log2_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return log2f(x);
#endif
}

// rcp_approx is 1/x (rcp.approx.ftz).
__device__ __forceinline__ float rcp_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return 1.0f / x;
#endif
}

// cp_async_16 copies 16 bytes from global to shared memory asynchronously
// (sm_80 cp.async.cg; both addresses 16-byte aligned). The copy is complete
// for the calling thread after cp_async_wait<n> has retired its group, and
// visible to the block after a __syncthreads that follows. The shim's twins
// keep it in flight until then (cuemu.h): the destination reads as NaN.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src));
#elif defined(__CUDACC__)
  *static_cast<uint4*>(smem_dst) = *static_cast<const uint4*>(gmem_src);
#else
  ::cuemu::cp_async_16(smem_dst, gmem_src);
#endif
}

// PKV_SYNC_SITE is, in the shim only, a defaulted parameter that tells the
// twins of the two calls below where they were called from (so a test can
// drop one call site: CUEMU_DROP_SYNC in cuemu.h).
#if defined(__CUDACC__)
#define PKV_SYNC_SITE
#else
#define PKV_SYNC_SITE std::source_location site = std::source_location::current()
#endif

// cp_async_commit closes the group of cp.async copies issued so far.
__device__ __forceinline__ void cp_async_commit(PKV_SYNC_SITE) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#elif !defined(__CUDACC__)
  ::cuemu::cp_async_commit(site);
#endif
}

// cp_async_wait waits until at most n groups of this thread are in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait(PKV_SYNC_SITE) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
#elif !defined(__CUDACC__)
  ::cuemu::cp_async_wait(unsigned(n), site);
#endif
}
#undef PKV_SYNC_SITE

// ---- conversions ----------------------------------------------------------------

__device__ __forceinline__ float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ uint16_t f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }

__device__ __forceinline__ float bf16_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// f32x2_to_16x2<kBF16> rounds (lo, hi) to a packed f16 (bf16) pair, lo in
// the low 16 bits, each half rounded as f32_to_f16 (f32_to_bf16) rounds
// it. nvcc's __floats2half2_rn / __floats2bfloat162_rn emit one
// cvt.rn.{f16,bf16}x2.f32 (ptxas packs two scalar converts with two extra
// byte permutes); the shim packs the scalar twins.
template <bool kBF16>
__device__ __forceinline__ uint32_t f32x2_to_16x2(float lo, float hi) {
  uint32_t r;
#if defined(__CUDACC__)
  if constexpr (kBF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  }
#else
  r = kBF16 ? uint32_t(f32_to_bf16(lo)) | (uint32_t(f32_to_bf16(hi)) << 16)
            : uint32_t(f32_to_f16(lo)) | (uint32_t(f32_to_f16(hi)) << 16);
#endif
  return r;
}

// e5m2 is the top byte of an f16, so widening is exact through f16.
__device__ __forceinline__ float e5m2_to_f32(uint8_t b) { return f16_to_f32(uint16_t(uint16_t(b) << 8)); }

// e4m3fn: bias 7, no infinity, S.1111.111 is NaN.
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24;
  const uint32_t exp = (b >> 3) & 0xf;
  const uint32_t mant = b & 7;
  if (exp == 0xf && mant == 7) return __uint_as_float(sign | 0x7fc00000u);
  if (exp != 0) return __uint_as_float(sign | ((exp + 120) << 23) | (mant << 20));
  const float v = float(mant) * (1.0f / 512.0f);  // subnormal: mant * 2^-9
  return sign ? -v : v;
}

// f32_to_e4m3_sat rounds to nearest even and clamps every non-NaN magnitude
// above 448 (infinities included) to +-448; NaN becomes 0x7F with the sign
// (CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE).
__device__ __forceinline__ uint8_t f32_to_e4m3_sat(float f) {
  uint32_t u = __float_as_uint(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448
  if (a >= 0x3c800000u) {                   // >= 2^-6: normal
    a = a - ((127u - 7u) << 23) + 0x7ffffu + ((a >> 20) & 1u);
    return sign | uint8_t(a >> 20);
  }
  // Subnormal or zero: adding 2^14 (float32 ulp 2^-9) rounds to e4m3's step.
  const float magic = __uint_as_float(141u << 23);
  const uint32_t r = __float_as_uint(__fadd_rn(__uint_as_float(a), magic));
  return sign | uint8_t(r - (141u << 23));
}

// f32_to_e5m2_sat rounds to nearest even and clamps every non-NaN magnitude
// above 57344 (infinities included) to +-57344; NaN becomes 0x7F with the sign.
__device__ __forceinline__ uint8_t f32_to_e5m2_sat(float f) {
  uint32_t u = __float_as_uint(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;
  if (a >= 0x47600000u) return sign | 0x7b;  // >= 57344
  if (a >= 0x38800000u) {                   // >= 2^-14: normal
    a = a - ((127u - 15u) << 23) + 0xfffffu + ((a >> 21) & 1u);
    return sign | uint8_t(a >> 21);
  }
  const float magic = __uint_as_float(134u << 23);  // 2^7, float32 ulp 2^-16
  const uint32_t r = __float_as_uint(__fadd_rn(__uint_as_float(a), magic));
  return sign | uint8_t(r - (134u << 23));
}

// load_f32 widens element i of an activation tensor (f32, f16 or bf16).
__device__ __forceinline__ float load_f32(const void* p, int64_t i, int64_t dtype) {
  switch (dtype) {
    case kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// store_f32 narrows v into element i of an activation tensor (round to
// nearest even).
__device__ __forceinline__ void store_f32(void* p, int64_t i, int64_t dtype, float v) {
  switch (dtype) {
    case kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    case kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// ---- tensor cores ---------------------------------------------------------------

// mma_m16n8k16_f32_f16 is one warp's mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
// (sm_80): D = A*B + C with A 16x16 f16 (row-major), B 16x8 f16
// (column-major), C and D 16x8 f32. Every lane of the warp calls it with
// its fragments; with g = lane/4 and t = lane%4 (PTX ISA, "Matrix
// fragments for mma.m16n8k16 with floating point type"):
//   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]   (low half: lower column)
//   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]     (low half: lower row)
//   c[0], c[1] = C[g][2t], C[g][2t+1]   c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
// and d like c. mma_m16n8k16_f32_bf16 is the same instruction with bf16
// inputs (.bf16.bf16), same fragments. The C twin gathers the row and
// column it needs with warp shuffles and sums the 16 products in order in
// f32 (the tensor core's summation order and rounding are not specified;
// exact for small integers, which is what the layout tests use), or, with
// CUEMU_MMA=tc, as cuemu::tc_dot16 models a tensor core.
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
template <bool kBF16>
inline void mma_m16n8k16_f32_twin(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  const auto widen = [](uint16_t h) { return kBF16 ? bf16_to_f32(h) : f16_to_f32(h); };
  const unsigned lane = ::cuemu::lane_id();
  const unsigned g = lane / 4, t = lane % 4;
  // arow[h][k]: row g + 8h of A; bcol[j][k]: column 2t + j of B.
  float arow[2][16], bcol[2][16];
  for (unsigned src = 0; src < 4; src++) {
    for (int r = 0; r < 4; r++) {
      const uint32_t v = __shfl_sync(0xffffffffu, a[r], int(4 * g + src));
      const int h = r & 1, k = int(2 * src) + 8 * (r >> 1);
      arow[h][k] = widen(uint16_t(v));
      arow[h][k + 1] = widen(uint16_t(v >> 16));
    }
    for (int j = 0; j < 2; j++) {
      for (int r = 0; r < 2; r++) {
        const uint32_t v = __shfl_sync(0xffffffffu, b[r], int(4 * (2 * t + j) + src));
        const int k = int(2 * src) + 8 * r;
        bcol[j][k] = widen(uint16_t(v));
        bcol[j][k + 1] = widen(uint16_t(v >> 16));
      }
    }
  }
  const bool tc = ::cuemu::mma_tc();
  for (int i = 0; i < 4; i++) {
    if (tc) {
      d[i] = ::cuemu::tc_dot16(c[i], arow[i >> 1], bcol[i & 1]);
      continue;
    }
    float sum = c[i];
    for (int k = 0; k < 16; k++) sum += arow[i >> 1][k] * bcol[i & 1][k];
    d[i] = sum;
  }
}
#endif

#define PKV_MMA_M16N8K16(NAME, TYPE, TWIN_BF16)                                                                    \
  __device__ __forceinline__ void NAME(float(&d)[4], const uint32_t(&a)[4], const uint32_t(&b)[2],                \
                                       const float(&c)[4]) {                                                      \
    PKV_MMA_M16N8K16_BODY(TYPE, TWIN_BF16)                                                                         \
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PKV_MMA_M16N8K16_BODY(TYPE, TWIN_BF16)                                                                    \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                                              \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"                                  \
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),          \
                 "f"(c[2]), "f"(c[3]));
#else
#define PKV_MMA_M16N8K16_BODY(TYPE, TWIN_BF16) mma_m16n8k16_f32_twin<TWIN_BF16>(d, a, b, c);
#endif
PKV_MMA_M16N8K16(mma_m16n8k16_f32_f16, "f16", false)
PKV_MMA_M16N8K16(mma_m16n8k16_f32_bf16, "bf16", true)
#undef PKV_MMA_M16N8K16
#undef PKV_MMA_M16N8K16_BODY

// mma_m16n8k16_acc<kBF16> accumulates in place, d += A*B, with f16 (or,
// with kBF16, bf16) inputs and B given as its two registers: the form the
// tensor-core kernels' inner loops use.
template <bool kBF16>
__device__ __forceinline__ void mma_m16n8k16_acc(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const uint32_t b[2] = {b0, b1};
  if constexpr (kBF16) {
    mma_m16n8k16_f32_bf16(d, a, b, d);
  } else {
    mma_m16n8k16_f32_f16(d, a, b, d);
  }
}

// ldmatrix_x4 is one warp's ldmatrix.sync.aligned.m8n8.x4.shared.b16
// (sm_75): it loads four 8x8 matrices of 16-bit elements from shared
// memory. Lanes 8i..8i+7 pass the addresses of rows 0..7 of matrix i (16
// bytes each, 16-byte aligned); lane l receives in r[i] row l/4 of matrix
// i, elements 2(l%4) (low half) and 2(l%4)+1 (PTX ISA, "Warp-level matrix
// load instruction: ldmatrix"), which is exactly an mma.m16n8k16 A
// fragment when the four matrices are A's quadrants in the order
// (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
// (rows 8-15, cols 8-15). ldmatrix_x4_trans (.trans) delivers each matrix
// transposed: r[i] holds element (2(l%4), l/4) of matrix i (low half) and
// (2(l%4)+1, l/4), i.e. column l/4, rows 2(l%4) and 2(l%4)+1, which is a B
// fragment of a row-major (k x n) tile. The C twin exchanges the row
// addresses with warp shuffles and reads the elements.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
#define PKV_LDMATRIX_X4(NAME, TRANS)                                                                              \
  __device__ __forceinline__ void NAME(uint32_t(&r)[4], const void* row) {                                        \
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));                                   \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" TRANS ".shared.b16 {%0,%1,%2,%3}, [%4];\n"                      \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                                                 \
                 : "r"(addr));                                                                                    \
  }
PKV_LDMATRIX_X4(ldmatrix_x4, "")
PKV_LDMATRIX_X4(ldmatrix_x4_trans, ".trans")
#undef PKV_LDMATRIX_X4
#else
template <bool kTrans>
inline void ldmatrix_x4_twin(uint32_t (&r)[4], const void* row) {
  const unsigned lane = ::cuemu::lane_id();
  const uint64_t mine = uint64_t(reinterpret_cast<uintptr_t>(row));
  const auto at = [](uint64_t p, unsigned col) {
    return uint32_t(reinterpret_cast<const uint16_t*>(uintptr_t(p))[col]);
  };
  for (unsigned i = 0; i < 4; i++) {
    if (!kTrans) {
      const uint64_t p = __shfl_sync(0xffffffffu, mine, int(8 * i + lane / 4));
      r[i] = at(p, 2 * (lane % 4)) | at(p, 2 * (lane % 4) + 1) << 16;
    } else {
      const uint64_t lo = __shfl_sync(0xffffffffu, mine, int(8 * i + 2 * (lane % 4)));
      const uint64_t hi = __shfl_sync(0xffffffffu, mine, int(8 * i + 2 * (lane % 4) + 1));
      r[i] = at(lo, lane / 4) | at(hi, lane / 4) << 16;
    }
  }
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) { ldmatrix_x4_twin<false>(r, row); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  ldmatrix_x4_twin<true>(r, row);
}
#endif

// ---- fp8 pairs ------------------------------------------------------------------
//
// sm_89 and later widen two fp8 values at once: cvt.rn.f16x2.e4m3x2 and
// cvt.rn.f16x2.e5m2x2 take a .b16 holding two fp8 codes and give a .b32
// holding two f16, the upper byte's value in the upper half (PTX ISA 7.8).
// Every e4m3 and e5m2 value is an f16 value, so the conversion is exact.
// The C twins below have the same semantics; they run in the emulator
// (which takes the pair path, so that the conformance suites exercise it)
// and, on a GPU, only where PKV_FP8_PAIRS is off.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
#define PKV_FP8_PAIRS 1
#else
#define PKV_FP8_PAIRS 0
#endif

// e4m3_to_f16_bits is the f16 encoding of e4m3 code b; a NaN code gives
// the f16 NaN 0x7fff with b's sign.
__device__ __forceinline__ uint16_t e4m3_to_f16_bits(uint8_t b) {
  const uint16_t sign = uint16_t(uint16_t(b & 0x80) << 8);
  const uint32_t exp = (b >> 3) & 0xf;
  uint32_t mant = b & 7;
  if (exp == 0xf && mant == 7) return sign | 0x7fff;
  if (exp != 0) return sign | uint16_t(((exp + 8) << 10) | (mant << 7));  // bias 7 -> 15
  if (mant == 0) return sign;
  // Subnormal, mant * 2^-9: an f16 normal. Shift the leading 1 to bit 3.
  int e = 15 - 9 + 3;  // f16 biased exponent of 2^-6 (the value with mant = 8)
  while (mant < 8) {
    mant <<= 1;
    e--;
  }
  return sign | uint16_t((uint32_t(e) << 10) | ((mant & 7) << 7));
}

// PKV_CVT_F16X2_FP8 defines cvt_f16x2_<FMT>x2, which is
// cvt.rn.f16x2.<FMT>x2: the fp8 codes in the low and high byte of pair
// become the f16 values in the low and high half; TWIN(pair) is the C twin.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define PKV_CVT_F16X2_FP8(FMT, TWIN)                                           \
  __device__ __forceinline__ uint32_t cvt_f16x2_##FMT##x2(uint16_t pair) {     \
    uint32_t d;                                                                \
    asm("cvt.rn.f16x2." #FMT "x2 %0, %1;" : "=r"(d) : "h"(pair));              \
    return d;                                                                  \
  }
#else
#define PKV_CVT_F16X2_FP8(FMT, TWIN) \
  __device__ __forceinline__ uint32_t cvt_f16x2_##FMT##x2(uint16_t pair) { return TWIN(pair); }
#endif

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_bits(uint16_t pair) {
  return uint32_t(e4m3_to_f16_bits(uint8_t(pair))) | (uint32_t(e4m3_to_f16_bits(uint8_t(pair >> 8))) << 16);
}

// An e5m2 code is the upper byte of its f16 encoding.
__device__ __forceinline__ uint32_t e5m2x2_to_f16x2_bits(uint16_t pair) {
  return (uint32_t(pair & 0xff) << 8) | (uint32_t(pair >> 8) << 24);
}

PKV_CVT_F16X2_FP8(e4m3, e4m3x2_to_f16x2_bits)
PKV_CVT_F16X2_FP8(e5m2, e5m2x2_to_f16x2_bits)

// f16x2_to_f32 widens both halves of an f16 pair.
__device__ __forceinline__ void f16x2_to_f32(uint32_t h2, float& lo, float& hi) {
  lo = f16_to_f32(uint16_t(h2));
  hi = f16_to_f32(uint16_t(h2 >> 16));
}

// Storage types of a paged cache: the raw element and its widening.
// kPairs: widen_pair widens two adjacent elements with one packed convert.
struct KvF32 {
  using T = float;
  static constexpr bool kPairs = false;
  __device__ static __forceinline__ float widen(T x) { return x; }
};
struct KvF16 {
  using T = uint16_t;
  static constexpr bool kPairs = false;
  __device__ static __forceinline__ float widen(T x) { return f16_to_f32(x); }
};
struct KvBF16 {
  using T = uint16_t;
  static constexpr bool kPairs = false;
  __device__ static __forceinline__ float widen(T x) { return bf16_to_f32(x); }
};
struct KvE4M3 {
  using T = uint8_t;
  static constexpr bool kPairs = PKV_FP8_PAIRS;
  __device__ static __forceinline__ float widen(T x) { return e4m3_to_f32(x); }
  __device__ static __forceinline__ void widen_pair(const T* p, float& lo, float& hi) {
    f16x2_to_f32(cvt_f16x2_e4m3x2(uint16_t(p[0] | (p[1] << 8))), lo, hi);
  }
};
struct KvE5M2 {
  using T = uint8_t;
  // No packed path: an e5m2 code is its f16's upper byte, so the scalar
  // widening is already one shift and one convert per element, and the
  // packed convert's register pressure made the sm_90 decode (v2) spill.
  static constexpr bool kPairs = false;
  __device__ static __forceinline__ float widen(T x) { return e5m2_to_f32(x); }
};

// ---- NVFP4 (layout.NVFP4, docs/kernels.md "NVFP4") -------------------------
//
// An NVFP4 row is head_dim/2 bytes of e2m1 codes (element 2i in the low
// nibble of byte i) and head_dim/16 e4m3 block scales. sm_80/sm_90 have no
// e2m1 convert, so codes are widened by bit arithmetic: the 3 magnitude
// bits ee.m of a code placed at f16 bits 11..9 and its sign at bit 15 make
// the f16 whose value is e2m1 * 2^-14 exactly (ee = 0 lands on the f16
// subnormal m * 2^-15, which is what e2m1's subnormal 0.5m becomes), so
// two codes are 4 logic ops into one f16 pair, with no table and no
// shared-memory load.
struct KvNVFP4 {
  using T = uint8_t;  // the data tensor's bytes; the scales come separately
  static constexpr bool kPairs = false;
};
template <typename KV>
constexpr bool kIsNVFP4 = false;
template <>
constexpr bool kIsNVFP4<KvNVFP4> = true;

// kE2M1Unit is 2^14: an f16 from e2m1_pair_bits times it is the e2m1 value.
constexpr float kE2M1Unit = 16384.0f;

// e2m1_pair_bits turns x, e2m1 codes at bits 0..3 and 16..19 (other bits
// zero), into the f16 pair of their values times 2^-14 (exact).
__device__ __forceinline__ uint32_t e2m1_pair_bits(uint32_t x) {
  return ((x & 0x00070007u) << 9) | ((x & 0x00080008u) << 12);
}

// e2m1x2_bits is e2m1_pair_bits of the two codes of byte b: element 2i
// (low nibble) in the low half, 2i+1 in the high half.
__device__ __forceinline__ uint32_t e2m1x2_bits(uint32_t b) {
  return e2m1_pair_bits((b & 0xfu) | ((b & 0xf0u) << 12));
}

// hmul2_bits multiplies two f16 pairs (round to nearest; mul.f16x2, which
// keeps subnormals).
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
#if defined(__CUDACC__)
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
#else
  return uint32_t(f32_to_f16(f16_to_f32(uint16_t(a)) * f16_to_f32(uint16_t(b)))) |
         (uint32_t(f32_to_f16(f16_to_f32(uint16_t(a >> 16)) * f16_to_f32(uint16_t(b >> 16)))) << 16);
#endif
}

// nvfp4_widen widens the VEC (even, <= 8) codes starting at byte row[0]
// into w: e2m1 * 2^-14 (multiply by the block scale times kE2M1Unit).
template <int VEC>
__device__ __forceinline__ void nvfp4_widen(const uint8_t* row, float (&w)[VEC]) {
  static_assert(VEC % 2 == 0 && VEC <= 8, "nvfp4 lanes hold whole bytes");
  uint32_t bytes;
  if constexpr (VEC == 8) {
    bytes = *reinterpret_cast<const uint32_t*>(row);
  } else if constexpr (VEC == 4) {
    bytes = *reinterpret_cast<const uint16_t*>(row);
  } else {
    bytes = row[0];
  }
#pragma unroll
  for (int i = 0; i < VEC / 2; i++) f16x2_to_f32(e2m1x2_bits((bytes >> (8 * i)) & 0xffu), w[2 * i], w[2 * i + 1]);
}

// f32_to_e2m1 rounds x to the nearest e2m1 code, ties to even, saturating
// at +-6; the sign bit is x's (a negative x that rounds to 0 gives 0x8);
// NaN gives 0. FlashInfer's threshold ladder, as layout.F32ToE2M1.
__device__ __forceinline__ uint32_t f32_to_e2m1(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;
  const float a = __uint_as_float(u & 0x7fffffffu);
  const uint32_t c = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) + uint32_t(a >= 1.75f) +
                     uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.0f);
  return ((u >> 28) & 0x8u) | c;
}

// widen_vec widens the first `valid` of VEC elements of row into w (all
// of them when full), in pairs where the storage type has a packed
// convert; elements past `valid` are not read and their w is 0.
template <typename KV, int VEC>
__device__ __forceinline__ void widen_vec(const typename KV::T* row, bool full, int64_t valid, float (&w)[VEC]) {
  if constexpr (KV::kPairs && VEC % 2 == 0) {
    if (full) {
#pragma unroll
      for (int i = 0; i < VEC; i += 2) KV::widen_pair(row + i, w[i], w[i + 1]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; i++) w[i] = (full || i < valid) ? KV::widen(row[i]) : 0.0f;
}

}  // namespace pkv

#endif  // PAGEDKV_COMPAT_CUH
