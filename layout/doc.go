// Package layout owns the byte-level geometry of paged KV storage: the NHD and
// HND layouts of FlashInfer's paged_kv_t (one 5-D tensor or a K/V pair of 4-D
// tensors), the MLA ckv/kpe layout (fused or split), element offsets in 64-bit
// arithmetic, and the scalar dtypes a cache may hold with their conversions
// to float32 (exact) and from float32 (round to nearest even, with PyTorch's
// overflow and NaN rules, or CUDA's saturating ones for the *Sat fp8
// encoders), and FlashInfer's NVFP4 pages (packed e2m1 codes with e4m3
// block scales in separate scale pages).
//
// Everything here is a pure function of its arguments; the package's only
// state is decode tables filled at init and read-only after, so it is safe
// for concurrent use. It imports only the standard library.
//
// # Invariants
//
//   - Offsets are element offsets (multiply by [DType.Size] for bytes) and are
//     computed in int64, so no product of strides can wrap.
//   - In the single 5-D tensor, K is [:, 0] and V is [:, 1]; V starts
//     PageSize*NumKVHeads*HeadDim elements after K within each page.
//   - An NVFP4 geometry keeps element offsets; its data byte is the element
//     offset / 2 and its scale byte the element offset / 16 (HeadDim is a
//     multiple of 16), in the data and kv_cache_sf tensors of FlashInfer's
//     page.cuh (nvfp4.go). [DType.Size] is 0 for NVFP4: byte lengths come
//     from [Paged.DataBytes] and [Paged.ScaleBytes].
//
// See docs/layout.md for worked examples.
package layout
