// append.cu: append_paged_kv_cache and append_paged_mla_kv_cache.
//
// Every entry point takes device pointers and 64-bit scalars only (the Go
// launcher passes each argument as 8 bytes). Strides and row lengths are in
// bytes, so the byte-copy kernels serve every storage dtype: f32, f16, bf16,
// fp8 e4m3/e5m2 rows are copied bit for bit, as FlashInfer does.
//
// Thread mapping (all append kernels): a 1-D grid strides over the appended
// rows (tokens); for row i the block's threads stride over the
// num_heads * row_bytes/U copy units of K and of V, so consecutive threads
// copy consecutive U-byte units of one head row: coalesced on both sides in
// NHD (a token's heads are adjacent) and within each head row in HND. U is a
// template parameter (16, 8, 4, 2, 1 bytes); the launcher picks the largest U
// that divides every row length, stride and base offset.
//
// Host validation ((*kernels.AppendParams).Validate) guarantees every index
// is in range; the kernels still skip a row whose page id falls outside the
// pool rather than write out of bounds.
#include "compat.cuh"

namespace pkv {

template <int U>
struct CopyUnit;
template <>
struct CopyUnit<16> {
  using T = uint4;
};
template <>
struct CopyUnit<8> {
  using T = uint2;
};
template <>
struct CopyUnit<4> {
  using T = uint32_t;
};
template <>
struct CopyUnit<2> {
  using T = uint16_t;
};
template <>
struct CopyUnit<1> {
  using T = uint8_t;
};

// slot maps appended row i to its physical page and entry:
// page = kv_indices[kv_indptr[b] + pos / page_size], entry = pos % page_size.
// It returns false when the page id is outside [0, num_pages).
__device__ __forceinline__ bool slot(const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices,
                                     const int32_t* __restrict__ batch_indices, const int32_t* __restrict__ positions,
                                     int64_t i, int64_t page_size, int64_t num_pages, int64_t* page, int64_t* entry) {
  const int64_t b = batch_indices[i];
  const int64_t pos = positions[i];
  const int64_t p = kv_indices[int64_t(kv_indptr[b]) + pos / page_size];
  *page = p;
  *entry = pos % page_size;
  return p >= 0 && p < num_pages;
}

template <int U>
__device__ __forceinline__ void append_rows(const unsigned char* __restrict__ append_key,
                                            const unsigned char* __restrict__ append_value,
                                            const int32_t* __restrict__ batch_indices,
                                            const int32_t* __restrict__ positions, unsigned char* __restrict__ k_data,
                                            unsigned char* __restrict__ v_data, const int32_t* __restrict__ kv_indices,
                                            const int32_t* __restrict__ kv_indptr, int64_t nnz, int64_t num_heads,
                                            int64_t row_bytes, int64_t page_size, int64_t num_pages,
                                            int64_t stride_page, int64_t stride_n, int64_t stride_h) {
  using T = typename CopyUnit<U>::T;
  // Per-token index math in 32 bits (the launcher checks that a token's
  // copy units fit): 64-bit division costs dozens of instructions on a GPU.
  const uint32_t units = uint32_t(row_bytes / U);
  const uint32_t per_token = uint32_t(num_heads) * units;
  for (int64_t i = blockIdx.x; i < nnz; i += gridDim.x) {
    int64_t page, entry;
    if (!slot(kv_indptr, kv_indices, batch_indices, positions, i, page_size, num_pages, &page, &entry)) continue;
    const int64_t dst_token = page * stride_page + entry * stride_n;
    const int64_t src_token = i * num_heads * row_bytes;
    for (uint32_t c = threadIdx.x; c < per_token; c += blockDim.x) {
      const uint32_t h = c / units;
      const uint32_t u = c - h * units;
      const int64_t dst = dst_token + int64_t(h) * stride_h + int64_t(u) * U;
      const int64_t src = src_token + int64_t(h) * row_bytes + int64_t(u) * U;
      *reinterpret_cast<T*>(k_data + dst) = *reinterpret_cast<const T*>(append_key + src);
      *reinterpret_cast<T*>(v_data + dst) = *reinterpret_cast<const T*>(append_value + src);
    }
  }
}

template <int U>
__device__ __forceinline__ void append_mla_rows(const unsigned char* __restrict__ append_ckv,
                                                const unsigned char* __restrict__ append_kpe,
                                                const int32_t* __restrict__ batch_indices,
                                                const int32_t* __restrict__ positions,
                                                unsigned char* __restrict__ ckv_data,
                                                unsigned char* __restrict__ kpe_data,
                                                const int32_t* __restrict__ kv_indices,
                                                const int32_t* __restrict__ kv_indptr, int64_t nnz,
                                                int64_t ckv_row_bytes, int64_t kpe_row_bytes, int64_t page_size,
                                                int64_t num_pages, int64_t ckv_stride_n, int64_t kpe_stride_n) {
  using T = typename CopyUnit<U>::T;
  const uint32_t ckv_units = uint32_t(ckv_row_bytes / U);
  const uint32_t units = ckv_units + uint32_t(kpe_row_bytes / U);
  for (int64_t i = blockIdx.x; i < nnz; i += gridDim.x) {
    int64_t page, entry;
    if (!slot(kv_indptr, kv_indices, batch_indices, positions, i, page_size, num_pages, &page, &entry)) continue;
    const int64_t row = page * page_size + entry;
    for (uint32_t c = threadIdx.x; c < units; c += blockDim.x) {
      if (c < ckv_units) {
        *reinterpret_cast<T*>(ckv_data + row * ckv_stride_n + int64_t(c) * U) =
            *reinterpret_cast<const T*>(append_ckv + i * ckv_row_bytes + int64_t(c) * U);
      } else {
        const int64_t u = c - ckv_units;
        *reinterpret_cast<T*>(kpe_data + row * kpe_stride_n + u * U) =
            *reinterpret_cast<const T*>(append_kpe + i * kpe_row_bytes + u * U);
      }
    }
  }
}

// append_quant_rows converts f32/f16/bf16 rows into an fp8 cache:
// cache = fp8_satfinite(float(x) / scale), k_scale for keys, v_scale for values.
// One thread per element; this is the rarely used converting path.
__device__ __forceinline__ void append_quant_rows(
    const void* __restrict__ append_key, const void* __restrict__ append_value,
    const int32_t* __restrict__ batch_indices, const int32_t* __restrict__ positions, uint8_t* __restrict__ k_data,
    uint8_t* __restrict__ v_data, const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ kv_indptr,
    int64_t nnz, int64_t num_heads, int64_t head_dim, int64_t page_size, int64_t num_pages, int64_t stride_page,
    int64_t stride_n, int64_t stride_h, int64_t src_dtype, int64_t dst_dtype, float k_scale, float v_scale) {
  const uint32_t per_token = uint32_t(num_heads * head_dim);
  for (int64_t i = blockIdx.x; i < nnz; i += gridDim.x) {
    int64_t page, entry;
    if (!slot(kv_indptr, kv_indices, batch_indices, positions, i, page_size, num_pages, &page, &entry)) continue;
    const int64_t dst_token = page * stride_page + entry * stride_n;
    for (uint32_t c = threadIdx.x; c < per_token; c += blockDim.x) {
      const int64_t h = c / uint32_t(head_dim);
      const int64_t d = c - uint32_t(h) * uint32_t(head_dim);
      const int64_t dst = dst_token + h * stride_h + d;
      const float k = load_f32(append_key, i * per_token + c, src_dtype) / k_scale;
      const float v = load_f32(append_value, i * per_token + c, src_dtype) / v_scale;
      if (dst_dtype == kE4M3) {
        k_data[dst] = f32_to_e4m3_sat(k);
        v_data[dst] = f32_to_e4m3_sat(v);
      } else {
        k_data[dst] = f32_to_e5m2_sat(k);
        v_data[dst] = f32_to_e5m2_sat(v);
      }
    }
  }
}

// nvfp4_quant_block quantises the 16 elements of src starting at element
// i0 (dtype src_dtype) under global scale g into 8 code bytes at codes and
// one e4m3 scale at *sf, exactly as quant.QuantizeNVFP4 (FlashInfer's
// nvfp4_append_quantize_block): amax = max |x| (NaN skipped), sf =
// e4m3_satfinite(amax / (6g)), m = 1/(e4m3(sf) g) (0 when amax, the scale
// or g is not positive), code = e2m1(x m). Both divisions are IEEE (nvcc's
// default -prec-div), so the bytes are the CPU backend's bit for bit.
__device__ __forceinline__ void nvfp4_quant_block(const void* __restrict__ src, int64_t i0, int64_t src_dtype, float g,
                                                  uint8_t* __restrict__ codes, uint8_t* __restrict__ sf) {
  float x[16];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; i++) {
    x[i] = load_f32(src, i0 + i, src_dtype);
    // Not fmaxf: the C library's returns NaN for a signalling NaN (IEEE
    // maxNum), so the emulator would differ from the GPU's max.f32.
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
  }
  const uint8_t s = f32_to_e4m3_sat(amax > 0.0f && g > 0.0f ? amax / (6.0f * g) : 0.0f);
  const float sv = e4m3_to_f32(s);
  const float m = amax > 0.0f && sv > 0.0f && g > 0.0f ? 1.0f / (sv * g) : 0.0f;
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    w[h] = 0u;
#pragma unroll
    for (int i = 0; i < 8; i++) w[h] |= f32_to_e2m1(__fmul_rn(x[8 * h + i], m)) << (4 * i);
  }
  uint2 packed;
  packed.x = w[0];
  packed.y = w[1];
  *reinterpret_cast<uint2*>(codes) = packed;
  *sf = s;
}

// append_nvfp4_rows quantises f32/f16/bf16 rows into an NVFP4 cache: one
// thread per 16-element block of a token's K and V head rows. Strides are
// in elements: the data byte of element offset e is e/2, its scale byte
// e/16 (layout.Paged.DataOffset/ScaleOffset).
__device__ __forceinline__ void append_nvfp4_rows(
    const void* __restrict__ append_key, const void* __restrict__ append_value,
    const int32_t* __restrict__ batch_indices, const int32_t* __restrict__ positions, uint8_t* __restrict__ k_data,
    uint8_t* __restrict__ v_data, uint8_t* __restrict__ k_sf, uint8_t* __restrict__ v_sf,
    const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ kv_indptr, int64_t nnz, int64_t num_heads,
    int64_t head_dim, int64_t page_size, int64_t num_pages, int64_t stride_page, int64_t stride_n, int64_t stride_h,
    int64_t src_dtype, float k_scale, float v_scale) {
  const uint32_t blocks = uint32_t(head_dim / 16);
  const uint32_t per_token = uint32_t(num_heads) * blocks;
  for (int64_t i = blockIdx.x; i < nnz; i += gridDim.x) {
    int64_t page, entry;
    if (!slot(kv_indptr, kv_indices, batch_indices, positions, i, page_size, num_pages, &page, &entry)) continue;
    const int64_t dst_token = page * stride_page + entry * stride_n;
    for (uint32_t c = threadIdx.x; c < per_token; c += blockDim.x) {
      const uint32_t h = c / blocks;
      const uint32_t blk = c - h * blocks;
      const int64_t e = dst_token + int64_t(h) * stride_h + int64_t(blk) * 16;  // element offset, a multiple of 16
      const int64_t src = (i * num_heads + h) * head_dim + int64_t(blk) * 16;
      nvfp4_quant_block(append_key, src, src_dtype, k_scale, k_data + e / 2, k_sf + e / 16);
      nvfp4_quant_block(append_value, src, src_dtype, v_scale, v_data + e / 2, v_sf + e / 16);
    }
  }
}

}  // namespace pkv

// append_paged_kv_cache_u<U>: copy append_key/append_value [nnz, H, D] rows
// into the K and V views of a paged cache. Byte strides: stride_page between
// pages, stride_n between entries, stride_h between heads (NHD or HND).
// The names this macro builds are written out in doc.go's entry-point table.
#define PKV_APPEND_ENTRY(U)                                                                                       \
  extern "C" __global__ void __launch_bounds__(256) append_paged_kv_cache_u##U(                                   \
      const unsigned char* __restrict__ append_key, const unsigned char* __restrict__ append_value,               \
      const int32_t* __restrict__ batch_indices, const int32_t* __restrict__ positions,                           \
      unsigned char* __restrict__ k_data, unsigned char* __restrict__ v_data,                                     \
      const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ kv_indptr, int64_t nnz,                 \
      int64_t num_heads, int64_t row_bytes, int64_t page_size, int64_t num_pages, int64_t stride_page,            \
      int64_t stride_n, int64_t stride_h) {                                                                       \
    pkv::append_rows<U>(append_key, append_value, batch_indices, positions, k_data, v_data, kv_indices,           \
                        kv_indptr, nnz, num_heads, row_bytes, page_size, num_pages, stride_page, stride_n,         \
                        stride_h);                                                                                 \
  }
PKV_APPEND_ENTRY(16)
PKV_APPEND_ENTRY(8)
PKV_APPEND_ENTRY(4)
PKV_APPEND_ENTRY(2)
PKV_APPEND_ENTRY(1)

// append_paged_mla_kv_cache_u<U>: copy append_ckv [nnz, ckv] and append_kpe
// [nnz, kpe] rows into ckv[page, entry, :] and kpe[page, entry, :]. The byte
// row strides say whether the caches are split or one fused [P, N, ckv+kpe]
// tensor (kpe_data then points ckv*esize bytes into it).
// The names this macro builds are written out in doc.go's entry-point table.
#define PKV_APPEND_MLA_ENTRY(U)                                                                                  \
  extern "C" __global__ void __launch_bounds__(256) append_paged_mla_kv_cache_u##U(                              \
      const unsigned char* __restrict__ append_ckv, const unsigned char* __restrict__ append_kpe,               \
      const int32_t* __restrict__ batch_indices, const int32_t* __restrict__ positions,                          \
      unsigned char* __restrict__ ckv_data, unsigned char* __restrict__ kpe_data,                                \
      const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ kv_indptr, int64_t nnz,                \
      int64_t ckv_row_bytes, int64_t kpe_row_bytes, int64_t page_size, int64_t num_pages, int64_t ckv_stride_n,  \
      int64_t kpe_stride_n) {                                                                                    \
    pkv::append_mla_rows<U>(append_ckv, append_kpe, batch_indices, positions, ckv_data, kpe_data, kv_indices,    \
                            kv_indptr, nnz, ckv_row_bytes, kpe_row_bytes, page_size, num_pages, ckv_stride_n,    \
                            kpe_stride_n);                                                                        \
  }
PKV_APPEND_MLA_ENTRY(16)
PKV_APPEND_MLA_ENTRY(8)
PKV_APPEND_MLA_ENTRY(4)
PKV_APPEND_MLA_ENTRY(2)
PKV_APPEND_MLA_ENTRY(1)

// append_paged_kv_cache_quant: f32/f16/bf16 rows (src_dtype) into an fp8
// cache (dst_dtype); element strides (= byte strides for fp8). The scales
// are float32 values carried in doubles.
extern "C" __global__ void __launch_bounds__(256) append_paged_kv_cache_quant(
    const void* __restrict__ append_key, const void* __restrict__ append_value,
    const int32_t* __restrict__ batch_indices, const int32_t* __restrict__ positions, uint8_t* __restrict__ k_data,
    uint8_t* __restrict__ v_data, const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ kv_indptr,
    int64_t nnz, int64_t num_heads, int64_t head_dim, int64_t page_size, int64_t num_pages, int64_t stride_page,
    int64_t stride_n, int64_t stride_h, int64_t src_dtype, int64_t dst_dtype, double k_scale, double v_scale) {
  pkv::append_quant_rows(append_key, append_value, batch_indices, positions, k_data, v_data, kv_indices, kv_indptr,
                         nnz, num_heads, head_dim, page_size, num_pages, stride_page, stride_n, stride_h, src_dtype,
                         dst_dtype, float(k_scale), float(v_scale));
}

// append_paged_kv_cache_nvfp4: f32/f16/bf16 rows (src_dtype) quantised into
// an NVFP4 cache: data k_data/v_data (packed e2m1) and scales k_sf/v_sf
// (e4m3 per 16 elements), element strides, k_scale/v_scale the global
// scales (float32 values carried in doubles).
extern "C" __global__ void __launch_bounds__(256) append_paged_kv_cache_nvfp4(
    const void* __restrict__ append_key, const void* __restrict__ append_value,
    const int32_t* __restrict__ batch_indices, const int32_t* __restrict__ positions, uint8_t* __restrict__ k_data,
    uint8_t* __restrict__ v_data, uint8_t* __restrict__ k_sf, uint8_t* __restrict__ v_sf,
    const int32_t* __restrict__ kv_indices, const int32_t* __restrict__ kv_indptr, int64_t nnz, int64_t num_heads,
    int64_t head_dim, int64_t page_size, int64_t num_pages, int64_t stride_page, int64_t stride_n, int64_t stride_h,
    int64_t src_dtype, double k_scale, double v_scale) {
  pkv::append_nvfp4_rows(append_key, append_value, batch_indices, positions, k_data, v_data, k_sf, v_sf, kv_indices,
                         kv_indptr, nnz, num_heads, head_dim, page_size, num_pages, stride_page, stride_n, stride_h,
                         src_dtype, float(k_scale), float(v_scale));
}
