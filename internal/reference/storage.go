package reference

import (
	"fmt"
	"math"
	"slices"

	"github.com/pagedkv/pagedkv/layout"
)

// This file is the slow model of paged storage and of append: where an
// element lives (row-major flattening of a PyTorch shape, written out here
// rather than taken from layout.Paged's strides), what append writes (one
// element at a time, through the CSR page table), what a request reads back
// (its tokens as raw bytes), and how a float is rounded into a narrow dtype
// (float64 arithmetic on the value, not bit tricks).

// FlatIndex is the row-major element index of index in a tensor of the given
// shape: sum_k index[k] * prod(shape[k+1:]). It panics when the ranks differ
// or an index is outside its dimension.
func FlatIndex(shape, index []int) int64 {
	// The panics format copies so that shape and index do not escape (the
	// callers' arrays stay on the stack).
	if len(shape) != len(index) {
		panic(fmt.Sprintf("reference: index %v for shape %v", slices.Clone(index), slices.Clone(shape)))
	}
	var flat int64
	for k := range shape {
		if index[k] < 0 || index[k] >= shape[k] {
			panic(fmt.Sprintf("reference: index %v outside shape %v (dim %d)", slices.Clone(index), slices.Clone(shape), k))
		}
		flat = flat*int64(shape[k]) + int64(index[k])
	}
	return flat
}

// Slot names one element of a paged GQA cache: kv is 0 for K and 1 for V.
type Slot struct{ KV, Page, Entry, Head, Feat int }

// Locate returns the buffer of c holding s and the element index of s in it,
// from the PyTorch shapes of FlashInfer's docs: one tensor [P, 2, N, H, D]
// (NHD) or [P, 2, H, N, D] (HND), or K and V tensors [P, N, H, D] /
// [P, H, N, D].
func (c PagedKV) Locate(s Slot) (buf []byte, elem int64) {
	P, N, H, D := c.NumPages, c.PageSize, c.NumKVHeads, c.HeadDim
	var page, in [3]int // the page's own shape and the index inside it
	if c.Layout == layout.NHD {
		page, in = [3]int{N, H, D}, [3]int{s.Entry, s.Head, s.Feat}
	} else {
		page, in = [3]int{H, N, D}, [3]int{s.Head, s.Entry, s.Feat}
	}
	if c.Form == layout.Fused {
		shape := [5]int{P, 2, page[0], page[1], page[2]}
		index := [5]int{s.Page, s.KV, in[0], in[1], in[2]}
		return c.Data, FlatIndex(shape[:], index[:])
	}
	shape := [4]int{P, page[0], page[1], page[2]}
	index := [4]int{s.Page, in[0], in[1], in[2]}
	buf = c.K
	if s.KV == 1 {
		buf = c.V
	}
	return buf, FlatIndex(shape[:], index[:])
}

// TokenBytes is one token of a request as raw elements of the cache dtype:
// K and V, each [H*D] in head-major order (head h, feature d at h*D+d).
type TokenBytes struct{ K, V []byte }

// TokenSlot returns the physical page and the entry of token t of request b:
// page kvPageIndices[kvIndptr[b] + t/pageSize], entry t % pageSize.
func TokenSlot(kvIndptr, kvPageIndices []int32, pageSize, b, t int) (page, entry int) {
	return int(kvPageIndices[int(kvIndptr[b])+t/pageSize]), t % pageSize
}

// GatherBytes returns the first n tokens of request b as raw bytes.
func GatherBytes(c PagedKV, kvIndptr, kvPageIndices []int32, b, n int) []TokenBytes {
	es := c.DType.Size()
	out := make([]TokenBytes, n)
	for t := range out {
		page, entry := TokenSlot(kvIndptr, kvPageIndices, c.PageSize, b, t)
		k := make([]byte, 0, c.NumKVHeads*c.HeadDim*es)
		v := make([]byte, 0, cap(k))
		for h := 0; h < c.NumKVHeads; h++ {
			for d := 0; d < c.HeadDim; d++ {
				buf, i := c.Locate(Slot{0, page, entry, h, d})
				k = append(k, buf[i*int64(es):(i+1)*int64(es)]...)
				buf, i = c.Locate(Slot{1, page, entry, h, d})
				v = append(v, buf[i*int64(es):(i+1)*int64(es)]...)
			}
		}
		out[t] = TokenBytes{K: k, V: v}
	}
	return out
}

// AppendInput is one append_paged_kv_cache call in the reference's terms.
type AppendInput struct {
	Key, Value     []byte       // [nnz, H, D] rows of dtype SrcDType
	SrcDType       layout.DType // the rows' dtype
	BatchIndices   []int32
	Positions      []int32
	KVIndptr       []int32
	KVPageIndices  []int32
	KScale, VScale float64 // 0 means 1; used only when SrcDType != c.DType
}

// Append writes every row of in into c (mutating c's buffers) one element at
// a time: element (i, h, d) goes to Slot{kv, page, entry, h, d} with
// (page, entry) = TokenSlot(batch_indices[i], positions[i]). Equal dtypes copy
// the element's bytes; otherwise the value x becomes
// Encode(c.DType, float32(x)/float32(scale), saturate). It does no
// validation; give it valid input. Into an NVFP4 cache each head row is
// quantised block by block (KScale/VScale the global scales; nvfp4.go).
func Append(c PagedKV, in AppendInput) {
	es, ss := c.DType.Size(), in.SrcDType.Size()
	H, D := c.NumKVHeads, c.HeadDim
	for i := range in.BatchIndices {
		page, entry := TokenSlot(in.KVIndptr, in.KVPageIndices, c.PageSize, int(in.BatchIndices[i]), int(in.Positions[i]))
		if c.DType == layout.NVFP4 {
			for h := 0; h < H; h++ {
				c.appendNVFP4(in.Key, in.SrcDType, i, 0, page, entry, h, in.KScale)
				c.appendNVFP4(in.Value, in.SrcDType, i, 1, page, entry, h, in.VScale)
			}
			continue
		}
		for kv, src := range [][]byte{in.Key, in.Value} {
			scale := in.KScale
			if kv == 1 {
				scale = in.VScale
			}
			for h := 0; h < H; h++ {
				for d := 0; d < D; d++ {
					e := int64((i*H+h)*D + d)
					buf, j := c.Locate(Slot{kv, page, entry, h, d})
					dst := buf[j*int64(es) : (j+1)*int64(es)]
					if in.SrcDType == c.DType {
						copy(dst, src[e*int64(ss):(e+1)*int64(ss)])
						continue
					}
					putBits(dst, Encode(c.DType, ScaleDown(signedFloat(in.SrcDType, src, e), scale), true))
				}
			}
		}
	}
}

// signedFloat is Float that keeps the sign bit of a NaN (the fp8 NaN codes
// keep it: -NaN appends as 0xFF).
func signedFloat(dt layout.DType, data []byte, e int64) float64 {
	x := Float(dt, data, e)
	if math.IsNaN(x) && data[(e+1)*int64(dt.Size())-1]&0x80 != 0 {
		x = math.Copysign(x, -1)
	}
	return x
}

// ScaleDown is the value an append stores for x under scale s (0 means 1):
// x / s rounded to float32, which equals float32 division of float32(x) by
// float32(s) since float64 holds that quotient to more than twice float32's
// precision.
func ScaleDown(x, s float64) float64 {
	if s == 0 {
		s = 1
	}
	return float64(float32(x / float64(float32(s))))
}

// MLAAppendInput is one append_paged_mla_kv_cache call.
type MLAAppendInput struct {
	CKV, KPE      []byte // [nnz, DCKV] and [nnz, DKPE], of the cache dtype
	BatchIndices  []int32
	Positions     []int32
	KVIndptr      []int32
	KVPageIndices []int32
}

// mlaLocate returns the buffer and the element index of feature f of the ckv
// (part 0) or kpe (part 1) row of (page, entry): the fused tensor is
// [P, N, DCKV+DKPE] with kpe at [..., DCKV:], split ones are [P, N, DCKV] and
// [P, N, DKPE].
func (m MLACache) mlaLocate(numPages, part, page, entry, f int) ([]byte, int64) {
	if m.Form == layout.Fused {
		if part == 1 {
			f += m.DCKV
		}
		return m.Data, FlatIndex([]int{numPages, m.PageSize, m.DCKV + m.DKPE}, []int{page, entry, f})
	}
	if part == 0 {
		return m.CKV, FlatIndex([]int{numPages, m.PageSize, m.DCKV}, []int{page, entry, f})
	}
	return m.KPE, FlatIndex([]int{numPages, m.PageSize, m.DKPE}, []int{page, entry, f})
}

// MLANumPages is the page count implied by m's buffer lengths.
func (m MLACache) MLANumPages() int {
	row := m.DCKV * m.DType.Size()
	buf := m.CKV
	if m.Form == layout.Fused {
		row, buf = (m.DCKV+m.DKPE)*m.DType.Size(), m.Data
	}
	return len(buf) / (row * m.PageSize)
}

// MLAAppend copies every row of in into m one element at a time.
func MLAAppend(m MLACache, in MLAAppendInput) {
	es, P := int64(m.DType.Size()), m.MLANumPages()
	for i := range in.BatchIndices {
		page, entry := TokenSlot(in.KVIndptr, in.KVPageIndices, m.PageSize, int(in.BatchIndices[i]), int(in.Positions[i]))
		for part, src := range [][]byte{in.CKV, in.KPE} {
			width := m.DCKV
			if part == 1 {
				width = m.DKPE
			}
			for f := 0; f < width; f++ {
				buf, j := m.mlaLocate(P, part, page, entry, f)
				e := int64(i*width + f)
				copy(buf[j*es:(j+1)*es], src[e*es:(e+1)*es])
			}
		}
	}
}

// MLAGatherBytes returns the first n tokens of request b as raw bytes: K is
// the ckv row, V the kpe row.
func MLAGatherBytes(m MLACache, kvIndptr, kvPageIndices []int32, b, n int) []TokenBytes {
	es, P := int64(m.DType.Size()), m.MLANumPages()
	out := make([]TokenBytes, n)
	for t := range out {
		page, entry := TokenSlot(kvIndptr, kvPageIndices, m.PageSize, b, t)
		for part, width := range []int{m.DCKV, m.DKPE} {
			row := make([]byte, 0, int64(width)*es)
			for f := 0; f < width; f++ {
				buf, j := m.mlaLocate(P, part, page, entry, f)
				row = append(row, buf[j*es:(j+1)*es]...)
			}
			if part == 0 {
				out[t].K = row
			} else {
				out[t].V = row
			}
		}
	}
	return out
}

// format describes a binary floating-point format by its fields.
type format struct {
	expBits, mantBits int
	bias              int
	// maxFinite is the largest finite value; above it a result overflows.
	maxFinite float64
	// hasInf: the all-ones exponent with mantissa 0 is infinity (IEEE style).
	// e4m3fn has no infinity and uses all-ones exponent and mantissa for NaN.
	hasInf bool
	// nan is the code PyTorch produces for NaN, without the sign bit;
	// nanSigned says whether the input's sign is kept.
	nan       uint32
	nanSigned bool
}

func formatOf(dt layout.DType) format {
	switch dt {
	case layout.F16:
		return format{5, 10, 15, 65504, true, 0x7e00, true}
	case layout.BF16:
		return format{8, 7, 127, math.Ldexp(2-math.Ldexp(1, -7), 127), true, 0x7fc0, false}
	case layout.E4M3:
		return format{4, 3, 7, 448, false, 0x7f, true}
	case layout.E5M2:
		return format{5, 2, 15, 57344, true, 0x7f, true}
	}
	panic(fmt.Sprintf("reference: no narrow float format %v", dt))
}

// Encode rounds x to the nearest value of dtype dt (f16, bf16, e4m3, e5m2),
// ties to the even significand, and returns its bit pattern. Past the
// largest finite value it gives infinity (or NaN for e4m3, which has no
// infinity), or with saturate the largest finite value of x's sign. NaN gives
// PyTorch's NaN code (f16 0x7E00 and fp8 0x7F with x's sign, bf16 0x7FC0).
// The rounding is done in float64 on the value: with q the spacing of dt's
// values at x's binade, x/q is exact and math.RoundToEven rounds it.
func Encode(dt layout.DType, x float64, saturate bool) uint32 {
	f := formatOf(dt)
	width := 1 + f.expBits + f.mantBits
	var sign uint32
	if math.Signbit(x) {
		sign = 1 << (width - 1)
	}
	if math.IsNaN(x) {
		if f.nanSigned {
			return sign | f.nan
		}
		return f.nan
	}
	maxCode := uint32(1)<<(width-1) - 1 // all ones but the sign: e4m3's NaN
	if f.hasInf {
		maxCode = (1<<f.expBits-1)<<f.mantBits - 1 // below the infinity code
	} else {
		maxCode--
	}
	overflow := func() uint32 {
		switch {
		case saturate:
			return sign | maxCode
		case f.hasInf:
			return sign | (1<<f.expBits-1)<<f.mantBits
		}
		return sign | f.nan
	}
	a := math.Abs(x)
	if math.IsInf(a, 0) {
		return overflow()
	}
	eMin := 1 - f.bias // exponent of the smallest normal
	e := eMin
	if a != 0 {
		_, exp := math.Frexp(a) // a = frac * 2^exp, frac in [0.5, 1)
		e = max(exp-1, eMin)
	}
	q := math.Ldexp(1, e-f.mantBits) // spacing of representable values near a
	v := math.RoundToEven(a/q) * q
	if v > f.maxFinite {
		return overflow()
	}
	if v == 0 {
		return sign
	}
	_, exp := math.Frexp(v)
	if e = exp - 1; e < eMin { // subnormal: exponent field 0
		return sign | uint32(v/math.Ldexp(1, eMin-f.mantBits))
	}
	mant := uint32(v/math.Ldexp(1, e-f.mantBits)) - 1<<f.mantBits
	return sign | uint32(e+f.bias)<<f.mantBits | mant
}

// putBits stores the low len(dst)*8 bits of v little-endian.
func putBits(dst []byte, v uint32) {
	for i := range dst {
		dst[i] = byte(v >> (8 * i))
	}
}
