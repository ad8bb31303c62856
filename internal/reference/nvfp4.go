package reference

import (
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// This file is the slow model of an NVFP4 paged cache: where a packed e2m1
// code and its e4m3 block scale live (the PyTorch shapes of FlashInfer's
// nvfp4_quantize_append_paged_kv_cache: the cache's shape with the last
// dimension head_dim/2 for the uint8 data and head_dim/16 for kv_cache_sf),
// what an element decodes to, and what a quantising append writes (float64
// arithmetic and a nearest-value search, not the threshold ladder).

// E2M1 is the value of e2m1 code c (its low 4 bits): sign, 2 exponent bits
// (bias 1), 1 mantissa bit; exponent 0 is subnormal (0 or 0.5).
func E2M1(c byte) float64 {
	sign := 1.0
	if c&0x8 != 0 {
		sign = -1
	}
	e, m := int(c>>1)&3, float64(c&1)
	if e == 0 {
		return sign * m * 0.5
	}
	return sign * (1 + m/2) * math.Ldexp(1, e-1)
}

// NearestE2M1 is the e2m1 code nearest y: ties go to the code with mantissa
// bit 0, magnitudes past 6 give 6, the sign bit is y's, NaN gives 0x0 (the
// GPU's canonical NaN has its sign bit clear).
func NearestE2M1(y float64) byte {
	if math.IsNaN(y) {
		return 0
	}
	var sign byte
	if math.Signbit(y) {
		sign = 0x8
	}
	a := math.Abs(y)
	if a > 6 {
		return sign | 7
	}
	best, bestD := byte(0), math.Inf(1)
	for c := byte(0); c < 8; c++ {
		d := math.Abs(a - E2M1(c))
		if d < bestD || (d == bestD && c&1 == 0) {
			best, bestD = c, d
		}
	}
	return sign | best
}

// nvfp4Index is the flat element index of s in the data view of the cache
// and the flat index of its block scale in the scale view, from the shapes
// [P, 2, N, H, D/2] / [P, 2, N, H, D/16] (NHD; HND swaps N and H), or the
// 4-D K/V tensors without the 2.
func (c PagedKV) nvfp4Index(s Slot) (data, sf []byte, elem, scale int64) {
	P, N, H, D := c.NumPages, c.PageSize, c.NumKVHeads, c.HeadDim
	var page, in [2]int
	if c.Layout == layout.NHD {
		page, in = [2]int{N, H}, [2]int{s.Entry, s.Head}
	} else {
		page, in = [2]int{H, N}, [2]int{s.Head, s.Entry}
	}
	if c.Form == layout.Fused {
		row := [4]int{P, 2, page[0], page[1]}
		idx := [4]int{s.Page, s.KV, in[0], in[1]}
		r := FlatIndex(row[:], idx[:])
		return c.Data, c.SF, r*int64(D) + int64(s.Feat), r*int64(D/16) + int64(s.Feat/16)
	}
	row := [3]int{P, page[0], page[1]}
	idx := [3]int{s.Page, in[0], in[1]}
	r := FlatIndex(row[:], idx[:])
	data, sf = c.K, c.KSF
	if s.KV == 1 {
		data, sf = c.V, c.VSF
	}
	return data, sf, r*int64(D) + int64(s.Feat), r*int64(D/16) + int64(s.Feat/16)
}

// nvfp4At is element s of an NVFP4 cache: e2m1 * e4m3 block scale (the
// global scale is k_scale/v_scale's business).
func (c PagedKV) nvfp4At(s Slot) float64 {
	data, sf, e, g := c.nvfp4Index(s)
	code := data[e/2] >> (4 * (e % 2)) // element 2i low nibble, 2i+1 high
	return E2M1(code) * Float(layout.E4M3, sf, g)
}

// appendNVFP4 quantises element row (i, h) of src (dtype srcDT, [nnz, H, D])
// into slot (kv, page, entry, h) of c under global scale gs, block by block
// as FlashInfer's nvfp4_append_quantize_block: amax = max |x|, stored scale
// e4m3(amax/(6*gs)) saturating, multiplier 1/(scale*gs) in float32, code the
// e2m1 nearest float32(x*multiplier).
func (c PagedKV) appendNVFP4(src []byte, srcDT layout.DType, i int, kv, page, entry, h int, gs float64) {
	D := c.HeadDim
	g := float32(gs)
	if gs == 0 {
		g = 1
	}
	for blk := 0; blk < D/16; blk++ {
		x := make([]float64, 16)
		amax := 0.0
		for k := range x {
			x[k] = Float(srcDT, src, int64((i*c.NumKVHeads+h)*D+blk*16+k))
			if a := math.Abs(x[k]); a > amax { // NaN never is
				amax = a
			}
		}
		sfv := 0.0
		if amax > 0 && g > 0 {
			sfv = float64(float32(amax / float64(6*g))) // float32 quotient of float32 operands
		}
		var sfb [1]byte
		putBits(sfb[:], Encode(layout.E4M3, sfv, true))
		s := Float(layout.E4M3, sfb[:], 0)
		mul := 0.0
		if amax > 0 && s > 0 {
			mul = float64(float32(1 / float64(float32(s*float64(g)))))
		}
		for k := range x {
			slot := Slot{KV: kv, Page: page, Entry: entry, Head: h, Feat: blk*16 + k}
			data, sf, e, gi := c.nvfp4Index(slot)
			sf[gi] = sfb[0]
			code := NearestE2M1(float64(float32(x[k] * mul)))
			shift := 4 * (e % 2)
			data[e/2] = data[e/2]&^(0xf<<shift) | code<<shift
		}
	}
}
