package quant_test

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/quant"
)

var (
	int8F16 = quant.Config{Bits: 8, Group: 8, ScaleDType: layout.F16}
	int8F32 = quant.Config{Bits: 8, Group: 8, ScaleDType: layout.F32}
	int4F16 = quant.Config{Bits: 4, Group: 8, ScaleDType: layout.F16}
	int4F32 = quant.Config{Bits: 4, Group: 4, ScaleDType: layout.F32}
)

// TestQuantizeWorkedExamples pins the format byte by byte on groups whose
// scales are powers of two, so every quotient and tie is exact by hand.
func TestQuantizeWorkedExamples(t *testing.T) {
	const s64 = 1.0 / 64 // f16 0x2400
	tests := map[string]struct {
		cfg        quant.Config
		x          []float32
		wantCodes  []byte
		wantScales []float32
		wantX      []float32
	}{
		// amax 127/64 -> s = 1/64. Quotients 127, -0.5, 1.5, 2.5, -64, 0, 0.25, -127:
		// ties go to even (-0.5 -> 0, 1.5 -> 2, 2.5 -> 2).
		"int8/ties-to-even": {
			cfg:        int8F16,
			x:          []float32{127 * s64, -s64 / 2, 1.5 * s64, 2.5 * s64, -1, 0, s64 / 4, -127 * s64},
			wantCodes:  []byte{0x7f, 0x00, 0x02, 0x02, 0xc0, 0x00, 0x00, 0x81},
			wantScales: []float32{s64},
			wantX:      []float32{127 * s64, 0, 2 * s64, 2 * s64, -1, 0, 0, -127 * s64},
		},
		// Two groups of 4, s = 1.75/7 = 0.25 each. Codes 7 0 2 -2 | 4 -7 0 2;
		// element 2k is the low nibble of byte k: 0x07 0xE2 | 0x94 0x20.
		"int4/nibble-order": {
			cfg:        int4F32,
			x:          []float32{1.75, -0.125, 0.375, -0.625, 1, -1.75, 0.0625, 0.5},
			wantCodes:  []byte{0x07, 0xe2, 0x94, 0x20},
			wantScales: []float32{0.25, 0.25},
			wantX:      []float32{1.75, 0, 0.5, -0.5, 1, -1.75, 0, 0.5},
		},
		// An all-zero group stores PPL's eps (1e-5 as f16) and zero codes.
		"int8/zero-group": {
			cfg:        int8F16,
			x:          make([]float32, 8),
			wantCodes:  make([]byte, 8),
			wantScales: []float32{1.0013580322265625e-05},
			wantX:      make([]float32, 8),
		},
		// NaN is skipped by amax and quantises to 0; +inf saturates the f16
		// scale at 65504 and its code at 127.
		"int8/nan-and-inf": {
			cfg:        int8F16,
			x:          []float32{float32(math.NaN()), float32(math.Inf(1)), 1, -70000, 0, 0, 0, 0},
			wantCodes:  []byte{0x00, 0x7f, 0x00, 0xff, 0, 0, 0, 0},
			wantScales: []float32{65504},
			wantX:      []float32{0, 127 * 65504, 0, -65504, 0, 0, 0, 0},
		},
		// amax 1e7 needs a scale of 78740, past f16: the scale saturates and the
		// clamp binds (the error bound only holds for amax <= 127*65504).
		"int8/f16-scale-saturates": {
			cfg:        int8F16,
			x:          []float32{1e7, -1e7, 65504, 0, 0, 0, 0, 0},
			wantCodes:  []byte{0x7f, 0x81, 0x01, 0, 0, 0, 0, 0},
			wantScales: []float32{65504},
			wantX:      []float32{127 * 65504, -127 * 65504, 65504, 0, 0, 0, 0, 0},
		},
		// int4 with f16 scales: amax 3.5 -> s = 0.5. Quotients -7 1 2.5 -1.5
		// 0.4 6.8 -2 3 give codes -7 1 2 -2 0 7 -2 3.
		"int4/f16-scale": {
			cfg:        int4F16,
			x:          []float32{-3.5, 0.5, 1.25, -0.75, 0.2, 3.4, -1, 1.5},
			wantCodes:  []byte{0x19, 0xe2, 0x70, 0x3e},
			wantScales: []float32{0.5},
			wantX:      []float32{-3.5, 0.5, 1, -1, 0, 3.5, -1, 1.5},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := len(tc.x)
			require.NoError(t, tc.cfg.Validate(n))
			codes := make([]byte, tc.cfg.CodeBytes(n))
			scales := make([]byte, tc.cfg.ScaleBytes(n))
			tc.cfg.Quantize(codes, scales, tc.x)
			assert.Equal(t, hexBytes(tc.wantCodes), hexBytes(codes), "codes")
			gotScales := make([]float32, tc.cfg.NumGroups(n))
			for g := range gotScales {
				gotScales[g] = tc.cfg.ScaleAt(scales, g)
			}
			assert.Equal(t, tc.wantScales, gotScales, "scales")
			got := make([]float32, n)
			tc.cfg.Dequantize(got, codes, scales)
			assert.Equal(t, tc.wantX, got, "dequantised")
		})
	}
}

// TestScaleBytesAreF16 checks the scale tensor's bytes, not just its values:
// PPL's kernels store half scales, little-endian.
func TestScaleBytesAreF16(t *testing.T) {
	codes, scales := make([]byte, 8), make([]byte, 2)
	int8F16.Quantize(codes, scales, []float32{127.0 / 64, 0, 0, 0, 0, 0, 0, 0})
	assert.Equal(t, "00 24", hexBytes(scales), "1/64 as f16 is 0x2400")
	scales32 := make([]byte, 4)
	int8F32.Quantize(codes, scales32, []float32{127.0 / 64, 0, 0, 0, 0, 0, 0, 0})
	assert.Equal(t, "00 00 80 3c", hexBytes(scales32), "1/64 as f32 is 0x3c800000")
}

func TestValidate(t *testing.T) {
	tests := []struct {
		cfg     quant.Config
		headDim int
		want    string // "" = valid; otherwise a substring of the error
	}{
		{quant.Config{Bits: 8, Group: 8, ScaleDType: layout.F16}, 128, ""},
		{quant.Config{Bits: 4, Group: 1, ScaleDType: layout.F32}, 2, ""},
		{quant.Config{Bits: 8, Group: 128, ScaleDType: layout.F16}, 128, ""},
		{quant.Config{Bits: 0, Group: 8, ScaleDType: layout.F16}, 128, "quant_bit 0, want 8 or 4"},
		{quant.Config{Bits: 16, Group: 8, ScaleDType: layout.F16}, 128, "quant_bit 16"},
		{quant.Config{Bits: 8, Group: 0, ScaleDType: layout.F16}, 128, "quant_group 0 is not a power of two"},
		{quant.Config{Bits: 8, Group: 12, ScaleDType: layout.F16}, 96, "quant_group 12 is not a power of two"},
		{quant.Config{Bits: 8, Group: -8, ScaleDType: layout.F16}, 128, "quant_group -8"},
		{quant.Config{Bits: 8, Group: 256, ScaleDType: layout.F16}, 128, "quant_group 256 does not divide head_dim 128"},
		{quant.Config{Bits: 8, Group: 8, ScaleDType: layout.F16}, 100, "quant_group 8 does not divide head_dim 100"},
		{quant.Config{Bits: 8, Group: 8, ScaleDType: layout.BF16}, 128, "scale dtype bf16, want f16 or f32"},
		{quant.Config{Bits: 8, Group: 8}, 128, "scale dtype"},
		{quant.Config{Bits: 4, Group: 1, ScaleDType: layout.F16}, 3, "head_dim 3 is odd"},
		{quant.Config{Bits: 8, Group: 1, ScaleDType: layout.F16}, 0, "head_dim 0"},
	}
	for _, tc := range tests {
		err := tc.cfg.Validate(tc.headDim)
		if tc.want == "" {
			assert.NoError(t, err, "%+v head_dim %d", tc.cfg, tc.headDim)
			continue
		}
		if assert.Error(t, err, "%+v head_dim %d", tc.cfg, tc.headDim) {
			assert.True(t, errors.Is(err, quant.ErrInvalidConfig))
			assert.Contains(t, err.Error(), tc.want)
		}
	}
}

func TestMisusePanics(t *testing.T) {
	x := make([]float32, 8)
	assert.PanicsWithValue(t, "quant: Quantize of 8 features needs 8 code bytes, has 7", func() {
		int8F16.Quantize(make([]byte, 7), make([]byte, 2), x)
	})
	assert.PanicsWithValue(t, "quant: Dequantize of 8 features needs 4 scale bytes, has 2", func() {
		int8F32.Dequantize(x, make([]byte, 8), make([]byte, 2))
	})
	assert.PanicsWithValue(t, "quant: Quantize of 6 features, not a multiple of quant_group 4", func() {
		int4F32.Quantize(make([]byte, 3), make([]byte, 8), x[:6])
	})
	assert.Panics(t, func() { quant.Config{}.Quantize(nil, nil, nil) })
}

// TestQuantizeMatchesSlowModel compares Quantize with an exact model built on
// math/big: scales rounded with big.Float, codes from rational quotients.
func TestQuantizeMatchesSlowModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cfgs := []quant.Config{int8F16, int8F32, int4F16, int4F32,
		{Bits: 8, Group: 1, ScaleDType: layout.F16}, {Bits: 4, Group: 2, ScaleDType: layout.F32}}
	const rows = 1500
	for _, cfg := range cfgs {
		n := 4 * cfg.Group
		if n < 2 {
			n = 2
		}
		x := make([]float32, n)
		codes := make([]byte, cfg.CodeBytes(n))
		scales := make([]byte, cfg.ScaleBytes(n))
		for r := 0; r < rows; r++ {
			if r%2 == 0 {
				randomRow(rng, x)
			} else {
				nearTieRow(rng, cfg, x)
			}
			cfg.Quantize(codes, scales, x)
			for g := 0; g < cfg.NumGroups(n); g++ {
				grp := x[g*cfg.Group : (g+1)*cfg.Group]
				wantS := slowScale(cfg, grp)
				if got := cfg.ScaleAt(scales, g); got != wantS {
					t.Fatalf("%+v group %v: scale %g, slow model %g", cfg, grp, got, wantS)
				}
				for i, v := range grp {
					e := g*cfg.Group + i
					want := slowCode(v, wantS, cfg.QMax())
					if got := cfg.CodeAt(codes, e); got != want {
						t.Fatalf("%+v x=%g (bits %#x) s=%g: code %d, slow model %d", cfg, v, math.Float32bits(v), wantS, got, want)
					}
					// docs/quantisation.md: with f16 scales a correctly rounded
					// float32 division gives the same codes (GPU kernels may use it).
					if cfg.ScaleDType == layout.F16 && !math.IsNaN(float64(v)) {
						q := math.RoundToEven(float64(v / wantS))
						q = math.Max(math.Min(q, float64(cfg.QMax())), -float64(cfg.QMax()))
						if int(q) != want {
							t.Fatalf("%+v x=%g s=%g: float32 division gives code %v, exact %d", cfg, v, wantS, q, want)
						}
					}
				}
			}
		}
	}
}

// TestErrorBound is the acceptance property: every finite element of a group
// whose scale does not saturate dequantises within scale/2 of itself. With
// f16 scales the dequantised float32 is exactly code*scale; with f32 scales
// the product may round by half an ulp, which is allowed for separately.
func TestErrorBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cfgs := []quant.Config{int8F16, int8F32, int4F16, int4F32, {Bits: 8, Group: 128, ScaleDType: layout.F16}}
	checked := 0
	for _, cfg := range cfgs {
		n := 2 * cfg.Group
		x := make([]float32, n)
		y := make([]float32, n)
		codes := make([]byte, cfg.CodeBytes(n))
		scales := make([]byte, cfg.ScaleBytes(n))
		for r := 0; r < 8000; r++ {
			if r%2 == 0 {
				randomF16Row(rng, x) // every f16 input satisfies the bound's precondition
			} else {
				randomRow(rng, x)
			}
			cfg.Quantize(codes, scales, x)
			cfg.Dequantize(y, codes, scales)
			checked += checkBound(t, cfg, x, y, codes, scales)
			if t.Failed() {
				return
			}
		}
	}
	t.Logf("%d elements within scale/2", checked)
	assert.Greater(t, checked, 1_000_000)
}

// checkBound asserts the error bound for every element of x (quantised into
// codes and scales, dequantised into y) that the bound covers and returns how
// many it checked.
func checkBound(t *testing.T, cfg quant.Config, x, y []float32, codes, scales []byte) int {
	t.Helper()
	maxScale := 65504.0
	if cfg.ScaleDType == layout.F32 {
		maxScale = math.MaxFloat32
	}
	checked := 0
	for g := 0; g < cfg.NumGroups(len(x)); g++ {
		s := float64(cfg.ScaleAt(scales, g))
		amax := 0.0
		for _, v := range x[g*cfg.Group : (g+1)*cfg.Group] {
			if !math.IsNaN(float64(v)) {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
		}
		covered := amax <= float64(cfg.QMax())*maxScale
		for i := g * cfg.Group; i < (g+1)*cfg.Group; i++ {
			v, got := float64(x[i]), float64(y[i])
			if math.IsNaN(v) {
				if got != 0 {
					t.Errorf("%+v: NaN dequantised to %g, want 0", cfg, got)
				}
				continue
			}
			if !covered || math.IsInf(v, 0) {
				continue
			}
			slack := 0.0
			if cfg.ScaleDType == layout.F32 {
				slack = ulp32(got) / 2
			} else if c := float64(cfg.CodeAt(codes, i)); got != c*s {
				t.Errorf("%+v: dequantised %g is not code*scale %g exactly", cfg, got, c*s)
			}
			if err := math.Abs(v - got); !(err <= s/2+slack) { // NaN fails too
				t.Errorf("%+v x[%d]=%g (group amax %g): |x - x'| = %g > scale/2 = %g", cfg, i, v, amax, err, s/2)
			}
			checked++
		}
	}
	return checked
}

// TestQuantizeIsIdempotent: with f16 scales, quantising the dequantised row
// gives back the same codes and scales (quantisation is a projection).
func TestQuantizeIsIdempotent(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, cfg := range []quant.Config{int8F16, int4F16} {
		n := 4 * cfg.Group
		x, y := make([]float32, n), make([]float32, n)
		c1, c2 := make([]byte, cfg.CodeBytes(n)), make([]byte, cfg.CodeBytes(n))
		s1, s2 := make([]byte, cfg.ScaleBytes(n)), make([]byte, cfg.ScaleBytes(n))
		for r := 0; r < 2500; r++ {
			randomF16Row(rng, x)
			cfg.Quantize(c1, s1, x)
			cfg.Dequantize(y, c1, s1)
			cfg.Quantize(c2, s2, y)
			require.Equal(t, hexBytes(c1), hexBytes(c2), "%+v codes of %v", cfg, x)
			require.Equal(t, hexBytes(s1), hexBytes(s2), "%+v scales of %v", cfg, x)
		}
	}
}

func TestScaleForEdges(t *testing.T) {
	assert.Equal(t, int8F16.MinScale(), int8F16.ScaleFor(float32(math.NaN())), "NaN amax")
	assert.Equal(t, int8F16.MinScale(), int8F16.ScaleFor(0), "zero amax")
	assert.Equal(t, float32(1e-5), int8F32.ScaleFor(0), "f32 eps")
	assert.Equal(t, float32(65504), int4F16.ScaleFor(float32(math.Inf(1))), "inf saturates f16")
	// f32 saturates at the largest scale whose qmax multiple is finite.
	for _, cfg := range []quant.Config{int4F32, int8F32} {
		s, qmax := cfg.ScaleFor(float32(math.Inf(1))), float32(cfg.QMax())
		assert.False(t, math.IsInf(float64(qmax*s), 0), "%+v: qmax*s of the saturated scale %g overflows", cfg, s)
		assert.True(t, math.IsInf(float64(qmax*math.Nextafter32(s, float32(math.Inf(1)))), 0), "%+v: %g is not the largest such scale", cfg, s)
		assert.Equal(t, s, cfg.ScaleFor(math.MaxFloat32), "%+v: MaxFloat32 amax", cfg)
	}
	assert.Equal(t, float32(0.5), int4F16.ScaleFor(3.5), "3.5/7")
	// 1/127 is not an f16 value: f32(1/127) = 0.007874016 rounds to f16 0.007873535.
	assert.Equal(t, layout.F16ToF32(0x2008), int8F16.ScaleFor(1))
}

func TestNibble(t *testing.T) {
	packed := []byte{0x07, 0xe2, 0x98, 0xf0}
	var got []int
	for i := 0; i < 8; i++ {
		got = append(got, quant.Nibble(packed, i))
	}
	assert.Equal(t, []int{7, 0, 2, -2, -8, -7, 0, -1}, got)
}

// --- slow model ---

// slowScale is the package doc's scale rule evaluated with big.Float.
func slowScale(cfg quant.Config, grp []float32) float32 {
	amax := 0.0
	for _, v := range grp {
		if !math.IsNaN(float64(v)) {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
	}
	var s float64
	if math.IsInf(amax, 1) {
		s = math.Inf(1)
	} else {
		q := new(big.Float).SetPrec(24).SetMode(big.ToNearestEven)
		q.Quo(big.NewFloat(amax), big.NewFloat(float64(cfg.QMax())))
		s, _ = q.Float64() // float32 precision (amax/qmax is far from float32's subnormals or capped below)
	}
	maxS, minS := math.MaxFloat32, float64(float32(1e-5))
	if cfg.ScaleDType == layout.F16 {
		s = slowRoundF16(s)
		maxS, minS = 65504, slowRoundF16(1e-5)
	}
	s = math.Min(s, maxS)
	// The largest code times an f32 scale must not round to +Inf in float32
	// (qmax*s is exact in float64): where it would, the scale is the largest
	// float32 at or below MaxFloat32/qmax for which it does not.
	qmax := float64(cfg.QMax())
	overflows := func(s float64) bool { return math.IsInf(float64(float32(qmax*s)), 1) }
	if cfg.ScaleDType == layout.F32 && overflows(s) {
		for s = float64(float32(math.MaxFloat32 / qmax)); overflows(s); {
			s = float64(math.Nextafter32(float32(s), 0))
		}
	}
	s = math.Max(s, minS)
	return float32(s)
}

// slowRoundF16 rounds v >= 0 to binary16 (11-bit significand above 2^-14,
// multiples of 2^-24 below), ties to even; overflow gives +inf.
func slowRoundF16(v float64) float64 {
	if math.IsInf(v, 1) {
		return v
	}
	if v < 0x1p-14 {
		return math.RoundToEven(v*0x1p24) / 0x1p24
	}
	f := new(big.Float).SetPrec(11).SetMode(big.ToNearestEven).SetFloat64(v)
	r, _ := f.Float64()
	if r > 65504 {
		return math.Inf(1)
	}
	return r
}

// slowCode is clamp(RNE(x/s)) on the exact rational quotient.
func slowCode(x, s float32, qmax int) int {
	switch {
	case math.IsNaN(float64(x)):
		return 0
	case math.IsInf(float64(x), 1):
		return qmax
	case math.IsInf(float64(x), -1):
		return -qmax
	}
	q := new(big.Rat).Quo(new(big.Rat).SetFloat64(float64(x)), new(big.Rat).SetFloat64(float64(s)))
	fl := new(big.Int).Div(q.Num(), q.Denom()) // floor: Euclidean division, positive denominator
	frac := new(big.Rat).Sub(q, new(big.Rat).SetInt(fl))
	switch frac.Cmp(big.NewRat(1, 2)) {
	case 1:
		fl.Add(fl, big.NewInt(1))
	case 0:
		if fl.Bit(0) == 1 {
			fl.Add(fl, big.NewInt(1))
		}
	}
	switch {
	case fl.Cmp(big.NewInt(int64(qmax))) > 0:
		return qmax
	case fl.Cmp(big.NewInt(int64(-qmax))) < 0:
		return -qmax
	}
	return int(fl.Int64())
}

// --- generators and helpers ---

// randomRow fills x with float32 values of varied magnitudes: a per-group
// binade, exact ties, zeros, and now and then NaN, inf or huge values.
func randomRow(rng *rand.Rand, x []float32) {
	exp := rng.IntN(60) - 40
	for i := range x {
		switch k := rng.IntN(40); {
		case k == 0:
			x[i] = 0
		case k == 1:
			x[i] = float32(math.NaN())
		case k == 2:
			x[i] = float32(math.Inf(1 - 2*rng.IntN(2)))
		case k == 3:
			x[i] = float32(rng.NormFloat64() * 1e30)
		case k < 8: // a half-integer multiple of a power of two: many exact ties
			x[i] = float32(math.Ldexp(float64(rng.IntN(512)-256)+0.5, exp-7))
		default:
			x[i] = float32(math.Ldexp(rng.NormFloat64(), exp))
		}
	}
	if rng.IntN(4) == 0 { // a clean row: the bound covers every element
		for i := range x {
			if v := float64(x[i]); math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e20 {
				x[i] = float32(math.Ldexp(rng.NormFloat64(), exp))
			}
		}
	}
}

// nearTieRow fills x with groups of a chosen scale s (the group holds
// amax = qmax*s0 for a random s0 and s = ScaleFor(amax)) whose other elements
// are half-integer multiples of s and their float32 neighbours. With 24-bit
// f32 scales a float32 division would round some of those quotients onto the
// tie; the exact quotient must not be.
func nearTieRow(rng *rand.Rand, cfg quant.Config, x []float32) {
	for g := 0; g < len(x)/cfg.Group; g++ {
		s0 := layout.F16ToF32(uint16(0x1800 + rng.IntN(0x3000))) // about 2^-9 .. 2^3
		if cfg.ScaleDType == layout.F32 {
			s0 = math.Float32frombits(0x3b000000 + rng.Uint32()%0x05000000) // about 2^-9 .. 2^1
		}
		amax := float32(cfg.QMax()) * s0
		s := float64(cfg.ScaleFor(amax))
		grp := x[g*cfg.Group : (g+1)*cfg.Group]
		for i := range grp {
			k := float64(rng.IntN(2*cfg.QMax()-1) - cfg.QMax() + 1)
			v := float32((k + 0.5) * s)
			switch rng.IntN(3) {
			case 0:
				v = math.Nextafter32(v, float32(math.Inf(1)))
			case 1:
				v = math.Nextafter32(v, float32(math.Inf(-1)))
			}
			grp[i] = v
		}
		grp[rng.IntN(len(grp))] = amax
	}
}

// randomF16Row fills x with random finite f16 values (raw bit patterns, so
// subnormals and extremes are as likely as anything else), sometimes scaled
// into one binade so that groups are dense rather than dominated by one value.
func randomF16Row(rng *rand.Rand, x []float32) {
	same := rng.IntN(2) == 0
	hi := uint16(rng.IntN(31)) << 10
	for i := range x {
		var h uint16
		for {
			h = uint16(rng.Uint32())
			if same {
				h = h&0x83ff | hi
			}
			if h&0x7c00 != 0x7c00 {
				break
			}
		}
		x[i] = layout.F16ToF32(h)
	}
}

func ulp32(v float64) float64 {
	f := float32(math.Abs(v))
	return float64(math.Nextafter32(f, float32(math.Inf(1))) - f)
}

func hexBytes(b []byte) string {
	var sb strings.Builder
	for i, c := range b {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%02x", c)
	}
	return sb.String()
}
