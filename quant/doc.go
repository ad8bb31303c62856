// Package quant owns symmetric group quantisation of KV-cache rows to int8 or
// int4, as PPL.LLM's dynamic_batching.KeyValueCache stores them: one scale per
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
package quant
