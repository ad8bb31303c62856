// Package ppl owns PPL.LLM's dynamic_batching.KeyValueCache storage, so that
// an engine built on PPL's cache can use pagedkv: the four cache layouts
// with a layer dimension, the offset and page-table addressing modes, int8 or
// int4 group quantisation with a scale tensor beside the cache (package
// quant), the operator itself as a CPU function ([KeyValueCache]), a decode
// that dequantises on read ([Decode]), and the conversion between PPL's page
// table and FlashInfer's CSR page table for the same pages.
//
// # Vocabulary (the seed's names)
//
//	L = num_layer, MaxT = token slots, MaxP = cachestarts columns (page mode),
//	H = heads in the cache, Dh = head dim, G = quant_group, B = batch size.
//	seqstarts [B+1]   new tokens of request b: rows seqstarts[b]:seqstarts[b+1]
//	                  of current_key/current_value [seqstarts[B], H, Dh]
//	start_pos [B]     sequence position of request b's first new token
//	kvstarts  [B+1]   request b's keys: rows kvstarts[b]:kvstarts[b+1] of the
//	                  outputs key/value [kvstarts[B], H*num_repeat, Dh];
//	                  kv_len_b = start_pos[b] + seqlen_b
//	cachestarts       mode 0: [B], slot of position p = cachestarts[b] + p;
//	                  mode 1: [B, MaxP] page starts (slots),
//	                  slot of position p = cachestarts[b, p/page_size] + p%page_size
//
// A slot is an index into the MaxT dimension; the element (layer, kv, slot,
// head, feat) of the cache tensor is at [Geometry.Offset] for the
// [Geometry.Layout] (0..3), and its scale at [Geometry.ScaleOffset], which
// is always the element offset divided by G. FlashInfer's page id of a PPL
// page is its start slot / page_size ([CSRFromPageTable]); for layout 2 a
// layer's K and V planes are FlashInfer NHD pages in place
// ([Cache.FlashInferCache]). docs/quantisation.md has worked examples.
//
// # Invariants
//
//   - Offsets are computed in int64; a valid [Geometry] has at most
//     layout.MaxElements cache elements, so no offset can wrap.
//   - The feature dimension is innermost in every layout: one (layer, kv,
//     slot, head) row of Dh features (Dh/2 bytes for int4, which needs an
//     even Dh) and its Dh/G scales are contiguous.
//   - Operators validate every input before writing anything; a failed call
//     changes neither the cache nor the outputs.
//   - Conversions fill caller slices, reusing their capacity, and leave them
//     unchanged on error.
//
// # Concurrency
//
// The package has no state. Functions run on the calling goroutine; calls on
// different caches (or disjoint outputs that only read one cache) may run
// concurrently. A [Cache] is not safe for concurrent writes.
package ppl
