// Package quant owns the quantisation of KV-cache rows: FlashInfer's NVFP4
// blocks ([QuantizeNVFP4], see "NVFP4" below) and symmetric group
// quantisation to int8 or int4, as PPL.LLM's
// dynamic_batching.KeyValueCache stores them: one scale per
// quant_group consecutive features, codes in a cache tensor and scales in a
// scale tensor beside it. The addressing of those tensors (cache layouts,
// offset and page-table modes) lives in package ppl; this package only turns
// one row of float32 values into codes and scales and back.
//
// # Format
//
// For a group x[0:G] of G = [Config.Group] features and qmax = 127 (int8) or 7
// (int4):
//
//	amax  = max |x[i]| over the finite x[i] (NaN is skipped)
//	s32   = float32(amax) / float32(qmax)        IEEE float32 division, RNE
//	s     = max(round(s32), MinScale)            round: RNE to Config.ScaleDType;
//	                                             a result past the dtype's largest
//	                                             finite value saturates to it (for
//	                                             f32: the largest s with
//	                                             float32(qmax*s) finite)
//	code  = clamp(RNE(x / s), -qmax, qmax)       x/s the exact real quotient; NaN -> 0
//	x'    = float32(code) * float32(s)           the dequantised value
//
// MinScale is 1e-5 rounded to the scale dtype (PPL's eps), so an all-zero
// group stores that scale and zero codes. The scale is rounded to its storage
// dtype before the codes are computed, so the codes are those of the stored
// scale and dequantisation reproduces x' exactly from the stored bytes.
//
// Codes are two's complement: an int8 cache byte is the code itself; an int4
// cache byte packs two codes, element 2k in the low nibble and element 2k+1 in
// the high nibble (the order of FlashInfer's NVFP4 cache and of little-endian
// memory: element i is in byte i/2, nibble i%2). A group never produces -128
// or -8; both decode to themselves when read.
//
// # Error bound
//
// For a finite x whose group has amax <= qmax * maxScale (maxScale = 65504
// for f16 scales, which every f16 input satisfies), |x/s| < qmax + 0.5, so the
// clamp never binds and
//
//	|x - code*s| <= s/2
//
// with x' = code*s exactly for f16 scales (a 7-bit integer times an 11-bit
// significand fits float32); for f32 scales x' adds at most half an ulp of
// float32. docs/quantisation.md gives the derivation and the differences from
// PPL's CUDA kernel (which divides in half precision and does not clamp).
//
// # NVFP4
//
// [QuantizeNVFP4] is FlashInfer's nvfp4_append_quantize_block (page.cuh):
// for each block of 16 elements x under global scale g,
//
//	amax  = max |x| (NaN skipped)
//	scale = e4m3_satfinite(amax / (6*g))          float32, RNE; 0 when amax is 0
//	m     = 1 / (e4m3(scale)*g)                   float32; 0 when amax or scale is 0
//	code  = e2m1(x*m)                             RNE on the e2m1 grid, saturating at
//	                                              ±6, sign kept, NaN -> 0
//
// codes packed two per byte (element 2i in the low nibble) and the scale
// byte stored apart (FlashInfer's kv_cache_sf; layout.Paged's NVFP4
// methods address both). [DequantizeNVFP4] gives e2m1*scale exactly; the
// global scale is the attention's k_scale/v_scale. For a block with
// amax/(6g) in [2^-6, 448], |x - x'*g| <= scale*g*(1+2^-20) < 0.178*amax.
// docs/quantisation.md §1a has the derivation and the differences from
// FlashInfer's fast-math build.
//
// # Concurrency
//
// The package has no state. A [Config] is a value; its methods may be called
// from any number of goroutines on non-overlapping destination buffers.
//
// # Invariants
//
//   - A valid Config has Bits 8 or 4, Group a power of two and ScaleDType F16
//     or F32; [Config.Validate] checks Group against a head dimension.
//   - Quantize and Dequantize never allocate; lengths that disagree with the
//     Config are programming errors and panic with the numbers involved.
//   - QuantizeNVFP4 and DequantizeNVFP4 never allocate and panic on a length
//     that is not a multiple of 16 or a short buffer; QuantizeNVFP4 is a
//     pure function of the block and g, so an append followed by a read
//     returns DequantizeNVFP4(QuantizeNVFP4(x)) exactly.
package quant
