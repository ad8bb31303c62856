package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// ErrInvalidConfig is wrapped by every error [Config.Validate] returns.
var ErrInvalidConfig = errors.New("quant: invalid config")

// Config describes one group-quantised format. The zero value is not valid;
// call [Config.Validate] once before using a Config.
type Config struct {
	// Bits is PPL's quant_bit: 8 (one int8 code per byte) or 4 (two int4
	// codes per byte).
	Bits int
	// Group is PPL's quant_group: the number of consecutive features that
	// share one scale. It must be a power of two and divide the head dim.
	Group int
	// ScaleDType is the dtype of the scale tensor: layout.F16 (what PPL's
	// CUDA kernels store) or layout.F32 (the seed also allows float32).
	ScaleDType layout.DType
}

// Largest scales; a scale that would round past them saturates. An f16
// scale is at most 65504 (qmax*65504 is far from float32's limit); an f32
// scale is at most the largest s with float32(qmax*s) finite, so that no
// code dequantises to ±Inf.
const maxScaleF16 = 65504

var (
	maxScaleF32Int8 = maxFiniteScaleF32(127)
	maxScaleF32Int4 = maxFiniteScaleF32(7)
)

func maxFiniteScaleF32(qmax float32) float32 {
	s := float32(math.MaxFloat32 / float64(qmax))
	for math.IsInf(float64(qmax*s), 0) {
		s = math.Nextafter32(s, 0)
	}
	return s
}

// minScaleF16 and minScaleF32 are PPL's eps, 1e-5, rounded to the scale
// dtype: the smallest scale a group stores (an all-zero group stores it).
var (
	minScaleF16 = layout.F16ToF32(layout.F32ToF16(1e-5)) // 1.0013580322265625e-05
	minScaleF32 = float32(1e-5)
)

// Validate checks the config for rows of headDim features: Bits is 8 or 4,
// Group is a power of two that divides headDim, ScaleDType is F16 or F32, and
// for int4 headDim is even (two codes share a byte).
func (c Config) Validate(headDim int) error {
	switch {
	case c.Bits != 8 && c.Bits != 4:
		return fmt.Errorf("%w: quant_bit %d, want 8 or 4", ErrInvalidConfig, c.Bits)
	case c.Group <= 0 || c.Group&(c.Group-1) != 0:
		return fmt.Errorf("%w: quant_group %d is not a power of two", ErrInvalidConfig, c.Group)
	case c.ScaleDType != layout.F16 && c.ScaleDType != layout.F32:
		return fmt.Errorf("%w: scale dtype %v, want f16 or f32", ErrInvalidConfig, c.ScaleDType)
	case headDim <= 0:
		return fmt.Errorf("%w: head_dim %d <= 0", ErrInvalidConfig, headDim)
	case headDim%c.Group != 0:
		return fmt.Errorf("%w: quant_group %d does not divide head_dim %d", ErrInvalidConfig, c.Group, headDim)
	case c.Bits == 4 && headDim%2 != 0:
		return fmt.Errorf("%w: int4 packs two features per byte, head_dim %d is odd", ErrInvalidConfig, headDim)
	}
	return nil
}

// QMax is the largest code magnitude: 127 for int8, 7 for int4.
func (c Config) QMax() int {
	if c.Bits == 4 {
		return 7
	}
	return 127
}

// MinScale is the smallest scale a group stores: 1e-5 rounded to ScaleDType.
func (c Config) MinScale() float32 {
	if c.ScaleDType == layout.F16 {
		return minScaleF16
	}
	return minScaleF32
}

// CodeBytes is the number of cache bytes that hold n features: n for int8,
// n/2 for int4.
func (c Config) CodeBytes(n int) int {
	if c.Bits == 4 {
		return n / 2
	}
	return n
}

// NumGroups is the number of scales for n features, n/Group.
func (c Config) NumGroups(n int) int { return n / c.Group }

// ScaleBytes is the number of scale-tensor bytes for n features.
func (c Config) ScaleBytes(n int) int { return n / c.Group * c.ScaleDType.Size() }

// ScaleFor returns the scale a group with largest magnitude amax stores (see
// the package doc): float32(amax)/qmax rounded to ScaleDType, saturated at the
// dtype's largest finite value (for f32, the largest with qmax*s finite) and
// raised to [Config.MinScale]. A NaN amax
// gives MinScale.
func (c Config) ScaleFor(amax float32) float32 {
	s := amax / float32(c.QMax())
	if c.ScaleDType == layout.F16 {
		s = layout.F16ToF32(layout.F32ToF16(s))
		if s > maxScaleF16 {
			s = maxScaleF16
		}
	} else {
		maxS := maxScaleF32Int8
		if c.Bits == 4 {
			maxS = maxScaleF32Int4
		}
		if s > maxS {
			s = maxS
		}
	}
	if min := c.MinScale(); !(s >= min) {
		s = min
	}
	return s
}

// CodeFor returns clamp(RNE(x/s), -QMax, QMax), with x/s the exact quotient,
// and 0 for a NaN x. s must be positive.
func (c Config) CodeFor(x, s float32) int {
	return code(x, float64(s), float64(c.QMax()))
}

// code is CodeFor with float64 operands. Rounding the float64 quotient rounds
// the exact one. With 2^e <= s < 2^(e+1) and x near a half-integer multiple
// (m/2)*s, |m| >= 1, both x (at least about s/2, a float32) and (m/2)*s are
// multiples of 2^(e-25), so an exact quotient that is not a tie lies more than
// 2^(e-25)/s > 2^-26 from m/2, while the float64 quotient (at most a few
// hundred) is within 2^-44 of the exact one.
func code(x float32, s, qmax float64) int {
	if x != x {
		return 0
	}
	q := math.RoundToEven(float64(x) / s)
	if q > qmax {
		q = qmax
	} else if q < -qmax {
		q = -qmax
	}
	return int(q)
}

// Quantize quantises src (n features, n a multiple of Group, and even for
// int4) into the first CodeBytes(n) bytes of dstCodes and the first
// NumGroups(n) scales of dstScales (little-endian ScaleDType). It does not
// allocate. It panics when the Config is invalid or a buffer is too short.
func (c Config) Quantize(dstCodes, dstScales []byte, src []float32) {
	n := len(src)
	c.check("Quantize", n, len(dstCodes), len(dstScales))
	G := c.Group
	qmax := float64(c.QMax())
	for g := 0; g < n/G; g++ {
		grp := src[g*G : (g+1)*G]
		var amax float32
		for _, x := range grp {
			if a := float32(math.Abs(float64(x))); a > amax { // NaN is never > amax
				amax = a
			}
		}
		s := c.ScaleFor(amax)
		layout.StoreF32(c.ScaleDType, dstScales, g, s)
		s64 := float64(s)
		if c.Bits == 8 {
			out := dstCodes[g*G : (g+1)*G]
			for i, x := range grp {
				out[i] = byte(int8(code(x, s64, qmax)))
			}
			continue
		}
		for i, x := range grp {
			putNibble(dstCodes, g*G+i, code(x, s64, qmax))
		}
	}
}

// Dequantize writes code*scale for n = len(dst) features read from codes and
// scales (laid out as [Config.Quantize] writes them) into dst. It does not
// allocate. It panics when the Config is invalid or a buffer is too short.
func (c Config) Dequantize(dst []float32, codes, scales []byte) {
	n := len(dst)
	c.check("Dequantize", n, len(codes), len(scales))
	G := c.Group
	f16 := c.ScaleDType == layout.F16
	for g, e := 0, 0; e < n; g, e = g+1, e+G {
		var s float32
		if f16 { // the scale dtype is hoisted out of LoadF32: this is decode's inner loop
			s = layout.F16ToF32(binary.LittleEndian.Uint16(scales[2*g:]))
		} else {
			s = math.Float32frombits(binary.LittleEndian.Uint32(scales[4*g:]))
		}
		out := dst[e : e+G]
		if c.Bits == 8 {
			in := codes[e : e+G]
			in = in[:len(out)]
			for i, b := range in {
				out[i] = float32(int8(b)) * s
			}
			continue
		}
		for i := range out {
			out[i] = float32(Nibble(codes, e+i)) * s
		}
	}
}

// CodeAt returns the signed code of feature i of codes (an int8 byte, or the
// nibble i%2 of byte i/2 for int4).
func (c Config) CodeAt(codes []byte, i int) int {
	if c.Bits == 4 {
		return Nibble(codes, i)
	}
	return int(int8(codes[i]))
}

// ScaleAt returns scale g of scales (little-endian ScaleDType).
func (c Config) ScaleAt(scales []byte, g int) float32 {
	return layout.LoadF32(c.ScaleDType, scales, g)
}

// Nibble returns int4 code i of packed: the low nibble of byte i/2 for even
// i, the high nibble for odd i, sign-extended from 4 bits (-8..7).
func Nibble(packed []byte, i int) int {
	b := packed[i>>1]
	if i&1 == 0 {
		b <<= 4
	}
	return int(int8(b) >> 4)
}

// putNibble stores the low 4 bits of code as int4 code i of packed, leaving
// the other nibble of the byte as it is.
func putNibble(packed []byte, i, code int) {
	b := &packed[i>>1]
	if i&1 == 0 {
		*b = *b&0xf0 | byte(code)&0x0f
	} else {
		*b = *b&0x0f | byte(code)<<4
	}
}

// check panics unless c is a valid format and n features fit the buffers.
func (c Config) check(op string, n, codeBytes, scaleBytes int) {
	if (c.Bits != 8 && c.Bits != 4) || c.Group <= 0 || c.Group&(c.Group-1) != 0 ||
		(c.ScaleDType != layout.F16 && c.ScaleDType != layout.F32) {
		panic(fmt.Sprintf("quant: %s with invalid %+v (call Validate first)", op, c))
	}
	switch {
	case n%c.Group != 0:
		panic(fmt.Sprintf("quant: %s of %d features, not a multiple of quant_group %d", op, n, c.Group))
	case c.Bits == 4 && n%2 != 0:
		panic(fmt.Sprintf("quant: %s of %d int4 features, not even", op, n))
	case codeBytes < c.CodeBytes(n):
		panic(fmt.Sprintf("quant: %s of %d features needs %d code bytes, has %d", op, n, c.CodeBytes(n), codeBytes))
	case scaleBytes < c.ScaleBytes(n):
		panic(fmt.Sprintf("quant: %s of %d features needs %d scale bytes, has %d", op, n, c.ScaleBytes(n), scaleBytes))
	}
}
