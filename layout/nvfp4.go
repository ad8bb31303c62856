package layout

import "math"

// NVFP4 geometry: FlashInfer's nvfp4_quantize_append_paged_kv_cache and the
// NVFP4 attention kernels (include/flashinfer/page.cuh, prefill.cuh) read a
// packed data tensor of the cache's shape with the last dimension head_dim/2
// (torch.uint8; element 2i in the low nibble of byte i, element 2i+1 in the
// high nibble) and a scale tensor kv_cache_sf of the same shape with the last
// dimension head_dim/16 (torch.float8_e4m3fn; scale byte i covers elements
// 16i..16i+15 of the head row). Both have the cache's form (one 5-D tensor
// with K at [:, 0] and V at [:, 1], or a K/V pair) and layout (NHD or HND).
//
// A Paged with DType NVFP4 keeps its element geometry (HeadDim is the
// logical head_dim, and KOffset/VOffset are element offsets); because every
// stride is a multiple of head_dim, which is a multiple of 16, the byte
// offset of an element's row in the data tensor is its element offset / 2
// and in the scale tensor its element offset / 16.

// NVFP4BlockSize is the number of consecutive elements of a head row that
// share one e4m3 block scale (FlashInfer's NVFP4_SF_VEC_SIZE).
const NVFP4BlockSize = 16

// DataBytes is the byte length of the one 5-D data tensor (Fused) or of each
// of the K and V data tensors (Split): elements * DType.Size, or elements/2
// for NVFP4.
func (p Paged) DataBytes() int64 {
	if p.DType == NVFP4 {
		return p.TensorElements() / 2
	}
	return p.TensorElements() * int64(p.DType.Size())
}

// ScaleBytes is the byte length of the one 5-D scale tensor (Fused) or of
// each of the K and V scale tensors (Split) of an NVFP4 cache: elements/16.
// It is 0 for every other dtype, which has no scale pages.
func (p Paged) ScaleBytes() int64 {
	if p.DType == NVFP4 {
		return p.TensorElements() / NVFP4BlockSize
	}
	return 0
}

// DataOffset is the byte offset in the data tensor of the element at element
// offset off (from [Paged.KOffset] or [Paged.VOffset]). For NVFP4 off must be
// even (a row start always is): the byte holds elements off and off+1.
func (p Paged) DataOffset(off int64) int64 {
	if p.DType == NVFP4 {
		return off / 2
	}
	return off * int64(p.DType.Size())
}

// ScaleOffset is the byte offset in the NVFP4 scale tensor of the scale of
// the block that starts at element offset off (a multiple of 16).
func (p Paged) ScaleOffset(off int64) int64 { return off / NVFP4BlockSize }

// RowBytes is the bytes of one head row (head_dim elements) in the data
// tensor.
func (p Paged) RowBytes() int {
	if p.DType == NVFP4 {
		return p.HeadDim / 2
	}
	return p.HeadDim * p.DType.Size()
}

// DataShape is the PyTorch shape of the data tensor(s): [Paged.Shape] with
// the last dimension head_dim/2 for NVFP4 (torch.uint8), unchanged otherwise.
func (p Paged) DataShape() []int {
	s := p.Shape()
	if p.DType == NVFP4 {
		s[len(s)-1] /= 2
	}
	return s
}

// ScaleShape is the PyTorch shape of an NVFP4 cache's kv_cache_sf tensor(s)
// (torch.float8_e4m3fn): [Paged.Shape] with the last dimension head_dim/16.
// It is nil for every other dtype.
func (p Paged) ScaleShape() []int {
	if p.DType != NVFP4 {
		return nil
	}
	s := p.Shape()
	s[len(s)-1] /= NVFP4BlockSize
	return s
}

// e2m1Values holds the value of each e2m1 code s.ee.m: exponent bias 1, no
// infinity or NaN, subnormal 0.5 at ee = 0.
var e2m1Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// E2M1ToF32 is the value of the e2m1 code in the low 4 bits of c (exact).
func E2M1ToF32(c uint8) float32 { return e2m1Values[c&0xf] }

// F32ToE2M1 rounds x to the nearest e2m1 value, ties to even, saturating at
// ±6 (infinities included), and returns its code. The sign bit is x's sign
// bit, so a negative x that rounds to zero gives 0x8 (negative zero). NaN
// gives 0x0: FlashInfer's quantiser rounds x*m, and the GPU's product of a
// NaN is the canonical NaN, whose sign bit is clear. It is the threshold
// ladder of FlashInfer's nvfp4_append_quantize_e2m1 (page.cuh): |x| <= 0.25
// -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5, <= 2.5 -> 2, < 3.5 -> 3,
// <= 5 -> 4, else 6; at each midpoint the code with an even mantissa bit
// wins.
func F32ToE2M1(x float32) uint8 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return 0
	}
	sign := uint8(b>>28) & 0x8
	mag := math.Float32frombits(b &^ (1 << 31))
	var c uint8
	switch {
	case mag <= 0.25:
		c = 0
	case mag < 0.75:
		c = 1
	case mag <= 1.25:
		c = 2
	case mag < 1.75:
		c = 3
	case mag <= 2.5:
		c = 4
	case mag < 3.5:
		c = 5
	case mag <= 5:
		c = 6
	default:
		c = 7
	}
	return sign | c
}

// LoadRowNVFP4 widens len(dst) elements (a multiple of 16) of an NVFP4 head
// row: e2m1(code)*e4m3(scale), with codes the row's packed bytes (element 2i
// in the low nibble of byte i) and scales its block scales. The product is
// exact in float32; the global scale is not applied.
func LoadRowNVFP4(dst []float32, codes, scales []byte) {
	n := len(dst) / NVFP4BlockSize
	codes, scales = codes[:n*NVFP4BlockSize/2], scales[:n]
	for blk, sb := range scales {
		s := E4M3ToF32(sb)
		out := dst[blk*NVFP4BlockSize:][:NVFP4BlockSize]
		in := codes[blk*NVFP4BlockSize/2:][:NVFP4BlockSize/2]
		for i, b := range in {
			out[2*i] = e2m1Values[b&0xf] * s
			out[2*i+1] = e2m1Values[b>>4] * s
		}
	}
}
