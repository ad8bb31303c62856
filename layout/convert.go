package layout

import (
	"fmt"
	"math"
)

// Scalar conversions between float32 and the narrow dtypes a cache may hold.
//
// Widening (X -> float32) is exact for every dtype here. Narrowing (float32 ->
// X) rounds to nearest, ties to even (RNE), on the exact float32 value, never
// through an intermediate format (f32 -> f16 -> e5m2 would round twice).
//
// Overflow and NaN follow PyTorch's CPU conversions (c10 Half, BFloat16,
// Float8_e4m3fn, Float8_e5m2, i.e. tensor.to(dtype)), which is what FlashInfer's
// tests use to build caches:
//
//	dtype  max finite  |x| rounds past max          NaN in        NaN out
//	f16    65504       +-inf (from 65520 up)        any           0x7E00 | sign
//	bf16   3.3895e38   +-inf                        any           0x7FC0 (sign dropped)
//	e4m3   448         NaN 0x7F|sign (above 464)    any, +-inf    0x7F | sign
//	e5m2   57344       +-inf 0x7C|sign (from 61440) any           0x7F | sign
//
// e4m3fn has no infinity, so PyTorch maps +-inf and every |x| > 464 to NaN.
// CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE (what FlashInfer's quantizing
// kernels use) instead clamps every non-NaN |x| beyond the largest finite value,
// infinities included, to +-max: that is [F32ToE4M3Sat] and [F32ToE5M2Sat].
// CUDA's __float2half and __float2bfloat16 return the NaN 0x7FFF where PyTorch
// returns 0x7E00 / 0x7FC0; only NaN bit patterns differ between them.

// f16ToF32Table holds the float32 value of every f16 bit pattern (256 KiB);
// NaN payloads are kept (shifted into the float32 mantissa).
var f16ToF32Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for h := range t {
		t[h] = f16ToF32Bits(uint16(h))
	}
	return &t
}()

// e4m3ToF32Table and e5m2ToF32Table hold the float32 value of every fp8 code.
var e4m3ToF32Table, e5m2ToF32Table = func() (a, b [256]float32) {
	for i := range 256 {
		a[i] = e4m3ToF32Bits(uint8(i))
		b[i] = f16ToF32Bits(uint16(i) << 8) // e5m2 is the top byte of an f16
	}
	return a, b
}()

// f16ToF32Bits decodes an f16 from its bit fields (used to fill the table).
func f16ToF32Bits(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN; keep the payload
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: mant * 2^-24 is exact in float32.
	v := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// e4m3ToF32Bits decodes an fp8 e4m3fn code from its bit fields.
func e4m3ToF32Bits(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	exp := uint32(b>>3) & 0xf
	mant := uint32(b) & 7
	switch {
	case exp == 0xf && mant == 7: // the only NaN; quiet float32 NaN with the sign
		return math.Float32frombits(sign | 0x7fc00000)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-7)<<23 | mant<<20)
	}
	v := float32(mant) * (1.0 / (1 << 9)) // subnormal: mant * 2^-9
	if sign != 0 {
		v = -v
	}
	return v
}

// F16ToF32 widens an IEEE binary16 value (exact; NaN payloads kept).
func F16ToF32(h uint16) float32 { return f16ToF32Table[h] }

// F32ToF16 rounds f to the nearest binary16 value, ties to even. Values whose
// magnitude rounds above 65504 (|f| >= 65520) become +-inf; NaN becomes the
// quiet NaN 0x7E00 with f's sign (PyTorch's rule; the payload is dropped).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00
	case abs >= 0x477ff000: // >= 65520 = 65504 + half an ulp, tie goes to the even inf
		return sign | 0x7c00
	case abs >= 0x38800000: // >= 2^-14: normal result
		return sign | uint16(roundNormal(abs, 23-10, 127-15))
	}
	// Subnormal or zero: adding 0.5 puts the value's 2^-24 units in the low
	// mantissa bits of a float32 and the FPU rounds to nearest even.
	return sign | uint16(roundSubnormal(abs, 0x3f000000))
}

// The float narrowings share two rounding steps on a float32 magnitude abs
// (sign bit clear); each returns the narrow code without its sign, and the
// caller has already handled NaN, overflow and which of the two applies.

// roundNormal rounds abs, which is normal in the narrow format, by dropping
// its low dropped mantissa bits, ties to even, and rebases the exponent from
// float32's bias 127 to the narrow format's (127 - rebias). Adding half an
// ulp less one, plus the kept mantissa's lowest bit, rounds a tie up exactly
// when that bit is odd; a mantissa that rounds up carries into the exponent,
// as IEEE rounding does.
func roundNormal(abs uint32, dropped uint, rebias uint32) uint32 {
	odd := (abs >> dropped) & 1
	halfUlpLessOne := uint32(1)<<(dropped-1) - 1
	return (abs - rebias<<23 + halfUlpLessOne + odd) >> dropped
}

// roundSubnormal rounds abs, which is below the narrow format's smallest
// normal, to a multiple of the format's subnormal step: magic is the bits
// of a power of two whose float32 ulp is that step, so the float32 addition
// rounds to nearest even and the sum's mantissa is the narrow code.
func roundSubnormal(abs, magic uint32) uint32 {
	return math.Float32bits(math.Float32frombits(abs)+math.Float32frombits(magic)) - magic
}

// BF16ToF32 widens a bfloat16 value (exact: the top half of a float32).
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even; values beyond the
// largest finite bfloat16 after rounding become +-inf. NaN becomes 0x7FC0
// (positive, payload dropped), as in PyTorch's c10::BFloat16.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return 0x7fc0
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// E4M3ToF32 widens an fp8 e4m3fn code (exact). 0x7F and 0xFF are NaN (with the
// sign); e4m3fn has no infinity.
func E4M3ToF32(b uint8) float32 { return e4m3ToF32Table[b] }

// F32ToE4M3 is PyTorch's float -> float8_e4m3fn: round to nearest even;
// magnitudes that round above 448 (|f| > 464), infinities and NaN all become
// the NaN code 0x7F with f's sign bit (0xFF when negative). |f| <= 464 rounds
// to at most 448.
func F32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	abs := b & 0x7fffffff
	switch {
	case abs >= 0x43f00000: // >= 480 (the first value past the NaN code), inf, NaN
		return sign | 0x7f
	case abs >= 0x3c800000: // >= 2^-6: normal result (may round up to 0x7F = NaN)
		return sign | uint8(roundNormal(abs, 23-3, 127-7))
	}
	// Subnormal or zero: add 2^14, whose float32 ulp is 2^-9, e4m3's subnormal step.
	return sign | uint8(roundSubnormal(abs, 141<<23))
}

// F32ToE4M3Sat is CUDA's __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3):
// round to nearest even, clamp every non-NaN magnitude above 448 (infinities
// included) to +-448 (0x7E / 0xFE); NaN becomes 0x7F with f's sign.
func F32ToE4M3Sat(f float32) uint8 {
	b := math.Float32bits(f)
	abs := b & 0x7fffffff
	if abs >= 0x43e00000 && abs <= 0x7f800000 { // 448 <= |f| <= inf
		return uint8(b>>24)&0x80 | 0x7e
	}
	return F32ToE4M3(f)
}

// E5M2ToF32 widens an fp8 e5m2 code (exact; NaN payloads kept). e5m2 is
// IEEE-like: 0x7C is +inf, 0x7D..0x7F are NaN.
func E5M2ToF32(b uint8) float32 { return e5m2ToF32Table[b] }

// F32ToE5M2 is PyTorch's float -> float8_e5m2: round to nearest even; values
// that round above 57344 (|f| >= 61440) and infinities become +-inf
// (0x7C / 0xFC); NaN becomes 0x7F with f's sign bit.
func F32ToE5M2(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000:
		return sign | 0x7f
	case abs >= 0x47700000: // >= 61440 = 57344 + half an ulp, tie goes to the even inf
		return sign | 0x7c
	case abs >= 0x38800000: // >= 2^-14: normal result
		return sign | uint8(roundNormal(abs, 23-2, 127-15))
	}
	// Subnormal or zero: add 2^7, whose float32 ulp is 2^-16, e5m2's subnormal step.
	return sign | uint8(roundSubnormal(abs, 134<<23))
}

// F32ToE5M2Sat is CUDA's __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2):
// round to nearest even, clamp every non-NaN magnitude above 57344
// (infinities included) to +-57344 (0x7B / 0xFB); NaN becomes 0x7F with f's
// sign (CUDA may return another NaN code, 0x7E or 0x7F).
func F32ToE5M2Sat(f float32) uint8 {
	b := math.Float32bits(f)
	abs := b & 0x7fffffff
	if abs >= 0x47600000 && abs <= 0x7f800000 { // 57344 <= |f| <= inf
		return uint8(b>>24)&0x80 | 0x7b
	}
	return F32ToE5M2(f)
}

// F32ToI8 rounds f to the nearest integer, ties to even, and clamps it to
// [-128, 127]; NaN becomes 0. (PyTorch's .to(torch.int8) truncates toward zero
// and leaves out-of-range values undefined; int8 here is a quantised format,
// so it rounds like the float narrowings.)
func F32ToI8(f float32) int8 {
	switch {
	case f != f:
		return 0
	case f >= 127:
		return 127
	case f <= -128:
		return -128
	}
	return int8(math.RoundToEven(float64(f)))
}

// LoadF32 returns element i of the little-endian buffer data of dtype dt,
// widened to float32 (exactly, except I32 beyond 2^24, which rounds to nearest
// even). It panics on an invalid dtype or an index outside data, like a slice
// access.
func LoadF32(dt DType, data []byte, i int) float32 {
	switch dt {
	case F32:
		d := data[4*i : 4*i+4]
		return math.Float32frombits(uint32(d[0]) | uint32(d[1])<<8 | uint32(d[2])<<16 | uint32(d[3])<<24)
	case F16:
		d := data[2*i : 2*i+2]
		return f16ToF32Table[uint16(d[0])|uint16(d[1])<<8]
	case BF16:
		d := data[2*i : 2*i+2]
		return math.Float32frombits((uint32(d[0]) | uint32(d[1])<<8) << 16)
	case E4M3:
		return e4m3ToF32Table[data[i]]
	case E5M2:
		return e5m2ToF32Table[data[i]]
	case I8:
		return float32(int8(data[i]))
	case U8:
		return float32(data[i])
	case I32:
		d := data[4*i : 4*i+4]
		return float32(int32(uint32(d[0]) | uint32(d[1])<<8 | uint32(d[2])<<16 | uint32(d[3])<<24))
	}
	panic(fmt.Sprintf("layout: LoadF32 of dtype %v", dt))
}

// StoreF32 writes v as element i of the little-endian buffer data of dtype dt,
// rounding to nearest even with PyTorch's .to() overflow and NaN rules for the
// float dtypes (see the table at the top of this file; fp8 e4m3 overflow is
// NaN, not saturation). Integer dtypes round to nearest even and clamp to
// their range, NaN storing 0. It panics on an invalid dtype or an index
// outside data.
func StoreF32(dt DType, data []byte, i int, v float32) {
	switch dt {
	case F32:
		putU32(data[4*i:4*i+4], math.Float32bits(v))
	case F16:
		putU16(data[2*i:2*i+2], F32ToF16(v))
	case BF16:
		putU16(data[2*i:2*i+2], F32ToBF16(v))
	case E4M3:
		data[i] = F32ToE4M3(v)
	case E5M2:
		data[i] = F32ToE5M2(v)
	case I8:
		data[i] = uint8(F32ToI8(v))
	case U8:
		switch {
		case v != v:
			data[i] = 0
		case v >= 255:
			data[i] = 255
		case v <= 0:
			data[i] = 0
		default:
			data[i] = uint8(math.RoundToEven(float64(v)))
		}
	case I32:
		var x int32
		switch {
		case v != v:
		case v >= 2147483648:
			x = math.MaxInt32
		case v <= -2147483648:
			x = math.MinInt32
		default:
			x = int32(math.RoundToEven(float64(v)))
		}
		putU32(data[4*i:4*i+4], uint32(x))
	default:
		panic(fmt.Sprintf("layout: StoreF32 of dtype %v", dt))
	}
}

// LoadRowF32 widens len(dst) consecutive elements of dtype dt, starting at
// element 0 of src, into dst. It is the bulk form of [LoadF32] and does not
// allocate. It panics when src holds fewer than len(dst) elements.
func LoadRowF32(dst []float32, dt DType, src []byte) {
	n := len(dst)
	switch dt {
	case F32:
		src = src[:4*n]
		for i := range dst {
			d := src[4*i : 4*i+4]
			dst[i] = math.Float32frombits(uint32(d[0]) | uint32(d[1])<<8 | uint32(d[2])<<16 | uint32(d[3])<<24)
		}
	case F16:
		src = src[:2*n]
		t := f16ToF32Table
		for i := range dst {
			dst[i] = t[uint16(src[2*i])|uint16(src[2*i+1])<<8]
		}
	case BF16:
		src = src[:2*n]
		for i := range dst {
			dst[i] = math.Float32frombits((uint32(src[2*i]) | uint32(src[2*i+1])<<8) << 16)
		}
	case E4M3:
		src = src[:n]
		for i := range dst {
			dst[i] = e4m3ToF32Table[src[i]]
		}
	case E5M2:
		src = src[:n]
		for i := range dst {
			dst[i] = e5m2ToF32Table[src[i]]
		}
	default:
		for i := range dst {
			dst[i] = LoadF32(dt, src, i)
		}
	}
}

// StoreRowF32 narrows src into len(src) consecutive elements of dtype dt at
// the start of dst, exactly as [StoreF32] does element by element. It does not
// allocate. It panics when dst is too short.
func StoreRowF32(dst []byte, dt DType, src []float32) {
	n := len(src)
	switch dt {
	case F32:
		dst = dst[:4*n]
		for i, v := range src {
			putU32(dst[4*i:4*i+4], math.Float32bits(v))
		}
	case F16:
		dst = dst[:2*n]
		for i, v := range src {
			putU16(dst[2*i:2*i+2], F32ToF16(v))
		}
	case BF16:
		dst = dst[:2*n]
		for i, v := range src {
			putU16(dst[2*i:2*i+2], F32ToBF16(v))
		}
	case E4M3:
		dst = dst[:n]
		for i, v := range src {
			dst[i] = F32ToE4M3(v)
		}
	case E5M2:
		dst = dst[:n]
		for i, v := range src {
			dst[i] = F32ToE5M2(v)
		}
	default:
		for i, v := range src {
			StoreF32(dt, dst, i, v)
		}
	}
}

// StoreRowF32Sat is [StoreRowF32] with saturating fp8 narrowing: for E4M3
// and E5M2 it uses [F32ToE4M3Sat] and [F32ToE5M2Sat] (CUDA __NV_SATFINITE);
// other dtypes store exactly as StoreRowF32 does.
func StoreRowF32Sat(dst []byte, dt DType, src []float32) {
	switch dt {
	case E4M3:
		dst = dst[:len(src)]
		for i, v := range src {
			dst[i] = F32ToE4M3Sat(v)
		}
	case E5M2:
		dst = dst[:len(src)]
		for i, v := range src {
			dst[i] = F32ToE5M2Sat(v)
		}
	default:
		StoreRowF32(dst, dt, src)
	}
}

func putU16(d []byte, v uint16) { d[0], d[1] = byte(v), byte(v>>8) }

func putU32(d []byte, v uint32) {
	d[0], d[1], d[2], d[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
