package quant

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// NVFP4 (see the package doc, "NVFP4"): blocks of [layout.NVFP4BlockSize]
// elements, each stored as 8 bytes of e2m1 codes and one e4m3 block scale,
// dequantised as e2m1 * scale * global.

// NVFP4BlockScale is the e4m3 block scale FlashInfer stores for a block
// whose largest magnitude is amax under global scale g:
// F32ToE4M3Sat(amax / (6*g)) in float32 (round to nearest even, saturating
// at 448), and 0 when amax or g is not positive.
func NVFP4BlockScale(amax, g float32) uint8 {
	var sf float32
	if amax > 0 && g > 0 {
		sf = amax / (6 * g)
	}
	return layout.F32ToE4M3Sat(sf)
}

// nvfp4Multiplier is the factor each element is multiplied by before its
// e2m1 rounding: 1/(scale*g) in float32, or 0 when amax, the stored scale or
// g is not positive.
func nvfp4Multiplier(amax float32, sf uint8, g float32) float32 {
	s := layout.E4M3ToF32(sf)
	if amax > 0 && s > 0 && g > 0 {
		return 1 / (s * g)
	}
	return 0
}

// blockAmax is FlashInfer's fmaxf reduction of |x| from 0: NaN is skipped,
// ±Inf gives +Inf.
func blockAmax(src []float32) float32 {
	var amax float32
	for _, x := range src {
		if a := float32(math.Abs(float64(x))); a > amax {
			amax = a
		}
	}
	return amax
}

// QuantizeNVFP4 quantises n = len(src) elements (n a multiple of 16) under
// the global scale g into the first n/2 bytes of codes (element 2i in the low
// nibble of byte i, 2i+1 in the high one) and the first n/16 bytes of scales,
// exactly as FlashInfer's nvfp4_append_quantize_block does for each block:
//
//	amax = max |x| (NaN skipped)
//	sf   = NVFP4BlockScale(amax, g)           stored e4m3 byte
//	m    = 1/(e4m3(sf)*g) in float32, or 0 when amax, e4m3(sf) or g <= 0
//	code = layout.F32ToE2M1(x*m)                     x*m in float32
//
// It does not allocate; it panics when n is not a multiple of 16 or a buffer
// is too short.
func QuantizeNVFP4(codes, scales []byte, src []float32, g float32) {
	n := len(src)
	checkNVFP4("QuantizeNVFP4", n, len(codes), len(scales))
	for blk := 0; blk < n/layout.NVFP4BlockSize; blk++ {
		x := src[blk*layout.NVFP4BlockSize:][:layout.NVFP4BlockSize]
		amax := blockAmax(x)
		sf := NVFP4BlockScale(amax, g)
		scales[blk] = sf
		mul := nvfp4Multiplier(amax, sf, g)
		out := codes[blk*layout.NVFP4BlockSize/2:][:layout.NVFP4BlockSize/2]
		for i := range out {
			out[i] = layout.F32ToE2M1(x[2*i]*mul) | layout.F32ToE2M1(x[2*i+1]*mul)<<4
		}
	}
}

// DequantizeNVFP4 writes e2m1(code)*e4m3(scale) for n = len(dst) elements (a
// multiple of 16) read from codes and scales (as [QuantizeNVFP4] writes them)
// into dst: [layout.LoadRowNVFP4] after checking the lengths. The product is
// exact in float32; the global scale is not applied (attention folds it into
// k_scale/v_scale, as FlashInfer does). It does not allocate.
func DequantizeNVFP4(dst []float32, codes, scales []byte) {
	checkNVFP4("DequantizeNVFP4", len(dst), len(codes), len(scales))
	layout.LoadRowNVFP4(dst, codes, scales)
}

func checkNVFP4(op string, n, codeBytes, scaleBytes int) {
	switch {
	case n%layout.NVFP4BlockSize != 0:
		panic(fmt.Sprintf("quant: %s of %d elements, not a multiple of the nvfp4 block of %d", op, n, layout.NVFP4BlockSize))
	case codeBytes < n/2:
		panic(fmt.Sprintf("quant: %s of %d nvfp4 elements needs %d code bytes, has %d", op, n, n/2, codeBytes))
	case scaleBytes < n/layout.NVFP4BlockSize:
		panic(fmt.Sprintf("quant: %s of %d nvfp4 elements needs %d scale bytes, has %d", op, n, n/layout.NVFP4BlockSize, scaleBytes))
	}
}
