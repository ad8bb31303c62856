// decode_args.cuh: the arguments every batch decode entry point takes, the
// CUDA-core batch_decode_paged_<kv>_v<VEC> (decode.cu) and the tensor-core
// batch_decode_paged_tc_<kv>_d<D> (decode_tc.cu), so that one launcher
// (kernels/cuda/step.go runLevel) serves both. Pointers: q [rows, Hq, D]
// (q_dtype), the K and V views of the cache (element strides
// stride_page/stride_n/stride_h), the page table, work [items][4] =
// (q_row, request, kv_begin, kv_end), o [rows, Hq, D] (o_dtype) and lse
// [rows*Hq] (may be null) when partial == 0, else tmp_o [items, Hq, D] and
// tmp_lse [items, Hq] (f32) for merge_partial_states. The float scalars
// are carried in doubles at the entry point (every argument is 8 bytes)
// and passed on as floats.
#ifndef PAGEDKV_DECODE_ARGS_CUH
#define PAGEDKV_DECODE_ARGS_CUH

#define PKV_DECODE_PARAMS(T, SCALAR)                                                                                \
  const void *__restrict__ q, const T *__restrict__ k_data, const T *__restrict__ v_data,                            \
      const int32_t *__restrict__ kv_indptr, const int32_t *__restrict__ kv_indices,                                 \
      const int32_t *__restrict__ kv_last_page_len, const int32_t *__restrict__ work, void *__restrict__ o,          \
      float *__restrict__ lse, float *__restrict__ tmp_o, float *__restrict__ tmp_lse, int64_t num_qo_heads,         \
      int64_t num_kv_heads, int64_t head_dim, int64_t page_size, int64_t num_pages, int64_t stride_page,             \
      int64_t stride_n, int64_t stride_h, int64_t q_dtype, int64_t o_dtype, SCALAR q_scale, SCALAR soft_cap,         \
      SCALAR v_scale, int64_t tile, int64_t copy_unit, int64_t partial

// PKV_DECODE_FORWARD passes an entry point's arguments on to its body.
#define PKV_DECODE_FORWARD                                                                                          \
  q, k_data, v_data, kv_indptr, kv_indices, kv_last_page_len, work, o, lse, tmp_o, tmp_lse, num_qo_heads,            \
      num_kv_heads, head_dim, page_size, num_pages, stride_page, stride_n, stride_h, q_dtype, o_dtype,               \
      float(q_scale), float(soft_cap), float(v_scale), tile, copy_unit, partial

namespace pkv {

// WorkItem is work item `item` (q_row, request, kv_begin, kv_end) with the
// request's first page and the key range clipped to the request's length
// (never needed after host planning; it keeps reads inside the request).
struct WorkItem {
  int64_t qrow, b, first_page, begin, end;
  // empty: the item names no keys (end <= begin as planned). In a split-KV
  // launch such an item is padding (a fixed grid's items past the plan's):
  // the scheduler gives no row an empty chunk, and a row without keys no
  // item, so the merge reads no state of it and the kernel may return at
  // once (the whole block sees the same item, so before any barrier).
  bool empty;
};

__device__ __forceinline__ WorkItem work_item(const int32_t* __restrict__ work, int64_t item,
                                              const int32_t* __restrict__ kv_indptr,
                                              const int32_t* __restrict__ kv_last_page_len, int64_t page_size) {
  WorkItem w;
  w.qrow = work[4 * item];
  w.b = work[4 * item + 1];
  w.begin = work[4 * item + 2];
  w.end = work[4 * item + 3];
  w.empty = w.end <= w.begin;
  w.first_page = kv_indptr[w.b];
  const int64_t pages = kv_indptr[w.b + 1] - w.first_page;
  const int64_t len = pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[w.b];
  if (w.end > len) w.end = len;
  if (w.begin < 0) w.begin = 0;
  return w;
}

}  // namespace pkv

#endif  // PAGEDKV_DECODE_ARGS_CUH
