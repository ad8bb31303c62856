// tile_common.cuh: helpers of the tensor-core tile kernels, shared by the
// tiled prefill (prefill.cu) and the tensor-core decode (decode_tc.cu):
// pairs of f32 rounded to the mma type, the swizzled-offset step that
// ptxas folds into an address immediate, and the page-size divider.
// Plain C++ for both compilers (the inline PTX stays in compat.cuh).
#ifndef PAGEDKV_TILE_COMMON_CUH
#define PAGEDKV_TILE_COMMON_CUH

#include "compat.cuh"

namespace pkv {

// from_mma widens an mma element (f16, or bf16 with kBF16) back to f32.
template <bool kBF16>
__device__ __forceinline__ float from_mma(uint16_t h) {
  return kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// pack2 rounds (x0, x1) to an mma pair (x0 in the low half) with one
// paired convert; pack2_lo gives the pair of rounding errors of hi =
// pack2(x0, x1), rounded the same way (the "lo" plane of a split operand).
template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float x0, float x1) {
  return f32x2_to_16x2<kBF16>(x0, x1);
}
template <bool kBF16>
__device__ __forceinline__ uint32_t pack2_lo(float x0, float x1, uint32_t hi) {
  return pack2<kBF16>(x0 - from_mma<kBF16>(uint16_t(hi)), x1 - from_mma<kBF16>(uint16_t(hi >> 16)));
}

// swz_xor is off ^ x for a swizzled offset whose 16-byte chunk is below 8
// (x a multiple of 16 within the row): the bits below 128 by XOR, whole
// 128-byte groups by an add, which ptxas folds into the address's
// immediate. Chunk 2kt + c = 2kt ^ c of a row (c < 2) is at
// swz_xor(swz(r, 16c), 32kt), chunk cl + 4j (cl < 4) at
// swz_xor(swz(r, 16cl), 64j): the swizzle XORs only the chunk's low 3 bits.
__device__ __forceinline__ uint32_t swz_xor(uint32_t off, int x) {
  return (off ^ uint32_t(x & 127)) + uint32_t(x & ~127);
}

// pair_bytes is the pair (byte n of lo, byte n of hi) as the low and high
// byte of a 16-bit value: one PRMT (__byte_perm, selector n | (n+4) << 4:
// byte n of {hi, lo} and byte 4 + n) on the GPU.
__device__ __forceinline__ uint16_t pair_bytes(uint32_t lo, uint32_t hi, int n) {
#if defined(__CUDA_ARCH__)
  return uint16_t(__byte_perm(lo, hi, unsigned(n | (n + 4) << 4)));
#else
  return uint16_t((lo >> (8 * n) & 0xff) | (hi >> (8 * n) & 0xff) << 8);
#endif
}

// PageDiv divides a key position t (0 <= t < 2^31) by page_size without a
// division instruction: t / page_size = (t * mul) >> shift, with shift =
// 31 + ceil(log2 d) and mul = ceil(2^shift / d) (d = page_size, clamped to
// 2^31: every t is then in page 0). The rounding error of mul is below
// 2^(shift - 31), so t * (mul * d - 2^shift) < 2^shift for every t < 2^31
// and the quotient is exact; mul < 2^32 for every d. Set once per CTA.
struct PageDiv {
  uint32_t d, mul, shift;
  __device__ __forceinline__ explicit PageDiv(int64_t page_size) {
    d = page_size < 1 ? 1u : page_size > (int64_t(1) << 31) ? (1u << 31) : uint32_t(page_size);
    const uint32_t l = d == 1 ? 0u : uint32_t(32 - __clz(d - 1));
    shift = 31 + l;
    mul = uint32_t(((uint64_t(1) << shift) + d - 1) / d);
  }
  __device__ __forceinline__ uint32_t div(uint32_t t) const { return uint32_t((uint64_t(t) * mul) >> shift); }
};

}  // namespace pkv

#endif  // PAGEDKV_TILE_COMMON_CUH
