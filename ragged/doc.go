// Package ragged owns FlashInfer's ragged index arrays and attention masks:
// indptr arrays (validation, lengths, prefix sums, slicing, CSR⇄COO, padded
// ⇄ ragged copies), the 2-D ragged mask layout with its bit packing
// (packbits / segment_packbits, mask_indptr, the kernel's bit lookup), the
// xFormers attention-bias family that Mistral's rolling cache uses, and
// the Ascend sliding-window masks; and the one validator of FlashInfer's CSR
// page tables ([ValidatePageTable]) that pagetable and kernels call. It
// imports only the standard library.
//
// # Ragged tensors
//
// A batch of variable-length requests is stored without padding as one
// tensor data of shape [indptr[B], ...]; request i owns rows
// [indptr[i], indptr[i+1]). An indptr has length B+1 (B = batch size),
// starts at 0 and never decreases ([ValidateIndptr]). Like every FlashInfer
// index array it is []int32.
//
// # Masks
//
// FlashInfer stores request i's boolean mask [qo_len[i], kv_len[i]]
// row-major, concatenates the requests ([MaskIndptr] gives the bit offsets),
// and packs each request separately with little bit order, starting at a
// byte boundary ([SegmentPackBits], [PackCustomMask]); the kernel reads bit
// qo*kv_len+kv of the request ([MaskBit]). [SWAMask] and
// [CompressedSWAMask] are the Ascend masks. docs/masks.md has the three
// vocabularies side by side with worked examples drawn as grids.
//
// # xFormers' attention biases
//
// Every mask class of xFormers' attn_bias.py (maintained now in MSLK's
// mslk/attention/fmha/attn_bias.py) has a Go type of the same name and a
// [MaskKind]: the block-diagonal family, padded keys, paged keys over
// [BlockTables] (xFormers' padded block_tables), gappy keys, and the
// single-sequence masks bound to a shape ([SingleSequenceMask]). They are
// built by the xFormers-named constructors and methods (from_seqlens,
// make_causal, make_local_attention, make_paged, ...) or by
// [NewAttentionMask], with xFormers' preconditions; they materialise to the
// [Dense] matrix xFormers' materialize gives, convert to FlashInfer's packed
// layout ([FlashInferMask]), say whether FlashInfer's causal + window_left
// can express them ([FlashInferParams]), and, when paged, give FlashInfer's
// CSR page table ([PagedKV]; back with [MaskFromPagedKV] and
// [BlockTablesFromPagedKV]). [FromTensorList] and [Split] are xFormers'
// from_tensor_list and split. tools/xformers_crosscheck.py compares all of
// them with xFormers itself.
//
// # Invariants
//
//   - Every indptr a function accepts has been checked to start at 0 and be
//     non-decreasing before anything is written; every indptr it returns
//     satisfies the same and fits int32 (larger sizes are [ErrTooLarge]).
//   - Packed masks: segment i occupies exactly ceil(bits_i/8) bytes starting
//     at its byte indptr, and its pad bits are 0.
//   - Mask values are immutable after construction; the dense form of a
//     mask, its packed FlashInfer form and its At method agree cell for cell.
//   - A function that returns an error has written nothing to its dst
//     arguments. Errors wrap one of the package's sentinels (errors.Is) and
//     name the bad value and request.
//
// # Ownership
//
// Functions never retain or modify their input slices: mask constructors copy
// q_seqlen/kv_seqlen, and accessors return copies. Results are new slices
// owned by the caller, except [Slice], which returns a view into data. The
// ...To forms write only into the dst slices they are given.
//
// # Concurrency
//
// The package has no shared state. Functions are safe to call from many
// goroutines on distinct dst buffers; mask values are immutable and safe for
// concurrent use.
//
// # Costs
//
// PackBits and SegmentPackBits pack 8 booleans per multiply and allocate
// nothing in their ...To forms. Mask conversion is O(rows + packed bytes);
// materialising a dense mask is O(rows*cols) and capped at [MaxDenseCells].
package ragged
