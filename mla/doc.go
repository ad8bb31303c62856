// Package mla owns the multi-head latent attention (DeepSeek MLA) side of a
// paged cache: storage of the compressed KV (ckv, 512 features per token) and
// the rope part of K (kpe, 64 features) as FlashInfer lays them out, either
// fused in one [pages, page_size, 576] tensor with ckv = [..., :512] and
// kpe = [..., 512:], or split in two tensors [pages, page_size, 512] and
// [pages, page_size, 64]; planning and running an MLA append step
// (flashinfer.page.append_paged_mla_kv_cache); and building the arguments of
// MLA decode (BatchMLAPagedAttentionWrapper.run) for a backend.
//
// MLA has no head dimension in the cache and no NHD/HND distinction: every
// query head reads the same ckv/kpe rows.
//
// # Invariants
//
//   - Token t of request b lives in entry t % page_size of page
//     kv_indices[kv_indptr[b] + t / page_size], in both forms; the forms
//     differ only in row strides (576 vs 512 and 64) and kpe's base (+512
//     elements when fused). [CKV] and [KPE] expose those strides.
//   - An [AppendPlan] describes one step (as appendkv.Plan does); Run checks
//     the page table against the plan, the backend validates the rest before
//     writing, so a failed Run writes nothing.
//   - Plans reuse their buffers; a step allocates nothing once they have
//     grown (on a backend that does not allocate itself).
//
// # Concurrency
//
// Plans are not safe for concurrent use; they belong to the goroutine that
// drives the steps. The storage functions have no state; [CopyCache] may run
// concurrently with other readers of src.
package mla
