// Package appendkv plans and runs one append step of a paged KV cache: it
// turns the step's per-request row counts (append_indptr) and the post-append
// sequence lengths into FlashInfer's COO arrays (batch_indices, positions),
// then runs flashinfer.page.append_paged_kv_cache on a [kernels.Backend]
// ([Plan.Run], the module's one append runner; stepglue's CPU step uses it),
// which writes row i to entry positions[i] % page_size of page
// kv_indices[kv_indptr[b] + positions[i] / page_size], b = batch_indices[i].
//
// The package (and its folder) is appendkv, not append: a package named
// append would shadow the builtin append in every file that imports it.
//
// # Invariants
//
//   - A [Plan] describes exactly one step: nnz == append_indptr[B], and row
//     i of request b has position seq_lens[b] - (append_indptr[b+1] - i), so
//     a request's new rows are its last tokens, in order.
//   - [Plan.Run] checks that the page table it is given has the plan's
//     seq_lens before the backend runs; the backend validates everything else
//     (shapes, dtypes, page ids) before writing, so a failed Run writes
//     nothing.
//   - Build and Run reuse the Plan's buffers: once they have grown to the
//     working set, a step allocates nothing (Run on a backend that does not
//     allocate itself, such as kernels/cpu with small steps or one worker).
//
// # Concurrency
//
// A Plan is not safe for concurrent use; it belongs to the goroutine that
// drives the engine's steps. Different Plans may run concurrently on one
// backend when their caches (or the slots they write) do not overlap.
package appendkv
