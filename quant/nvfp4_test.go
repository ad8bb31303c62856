package quant_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/quant"
)

// nvfp4Iters is n, or a tenth of it under -race.
func nvfp4Iters(n int) int {
	if raceEnabled {
		return max(n/10, 1)
	}
	return n
}

// All 256 e4m3 scale codes times all 16 e2m1 codes dequantise to the exact
// product of the two values (NaN for the scale's NaN codes), and every
// positive finite scale code is the scale NVFP4BlockScale chooses for the
// block amax that maps its largest code to it (amax = 6*scale, global 1).
func TestNVFP4AllScaleCodes(t *testing.T) {
	codes := make([]byte, 8)
	got := make([]float32, 16)
	for s := 0; s < 256; s++ {
		var sb [1]byte
		sb[0] = byte(s)
		sv := reference.Float(layout.E4M3, sb[:], 0)
		for c := byte(0); c < 16; c++ {
			for i := range codes {
				codes[i] = c | c<<4
			}
			quant.DequantizeNVFP4(got, codes, sb[:])
			want := reference.E2M1(c) * sv
			for i, g := range got {
				if math.IsNaN(want) {
					require.True(t, math.IsNaN(float64(g)), "scale %#x code %#x element %d: got %v, want NaN", s, c, i, g)
					continue
				}
				require.Equal(t, want, float64(g), "scale %#x code %#x element %d", s, c, i)
			}
		}
		if s == 0 || s >= 0x7f { // zero, NaN and the negative codes are never chosen for amax > 0
			continue
		}
		require.Equal(t, byte(s), quant.NVFP4BlockScale(float32(6*sv), 1), "scale code %#x (%v)", s, sv)
	}
	assert.Equal(t, byte(0), quant.NVFP4BlockScale(0, 1), "an all-zero block stores scale 0")
	assert.Equal(t, byte(0x7e), quant.NVFP4BlockScale(float32(math.Inf(1)), 1), "an infinite amax saturates the scale at 448")
	assert.Equal(t, byte(0), quant.NVFP4BlockScale(1, 0), "a zero global scale stores 0 (the kernels map 0 to 1 first)")
}

// refQuantize is the reference model's quantisation of one head row: a
// one-page, one-head NHD cache appended through reference.Append.
func refQuantize(src []float32, g float32) (codes, scales []byte) {
	d := len(src)
	c := reference.PagedKV{Layout: layout.NHD, Form: layout.Split, DType: layout.NVFP4, NumPages: 1, PageSize: 1, NumKVHeads: 1, HeadDim: d,
		K: make([]byte, d/2), V: make([]byte, d/2), KSF: make([]byte, d/16), VSF: make([]byte, d/16)}
	row := make([]byte, 4*d)
	for i, x := range src {
		layout.StoreF32(layout.F32, row, i, x)
	}
	reference.Append(c, reference.AppendInput{Key: row, Value: row, SrcDType: layout.F32, BatchIndices: []int32{0}, Positions: []int32{0},
		KVIndptr: []int32{0, 1}, KVPageIndices: []int32{0}, KScale: float64(g), VScale: float64(g)})
	return c.K, c.KSF
}

// randomBlockValue draws an element: mostly from a per-block magnitude,
// sometimes a special (zeros, ±Inf, NaN, subnormals, exact ladder points).
func randomBlockValue(r *rand.Rand, mag float64) float32 {
	switch r.IntN(40) {
	case 0:
		return 0
	case 1:
		return float32(math.Copysign(0, -1))
	case 2:
		return float32(math.NaN())
	case 3:
		return float32(math.Inf(1 - 2*r.IntN(2)))
	case 4:
		return math.Float32frombits(r.Uint32() & 0x807fffff) // subnormal
	case 5: // an e2m1 midpoint times a power of two
		mids := []float64{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}
		return float32(mids[r.IntN(len(mids))] * math.Ldexp(1, r.IntN(9)-4) * float64(1-2*r.IntN(2)))
	}
	return float32((2*r.Float64() - 1) * mag)
}

// QuantizeNVFP4 writes exactly the bytes of the reference model
// (internal/reference: float64 arithmetic and a nearest-value search, not
// the threshold ladder) over random rows, magnitudes from 1e-6 to 1e6,
// global scales from 2^-20 to 2^10, and specials.
func TestQuantizeNVFP4MatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 4))
	for it := range nvfp4Iters(3000) {
		d := 16 * (1 + r.IntN(8))
		mag := math.Pow(10, r.Float64()*12-6)
		g := float32(math.Ldexp(0.5+r.Float64(), r.IntN(31)-20))
		if it%7 == 0 {
			g = 1
		}
		src := make([]float32, d)
		for i := range src {
			src[i] = randomBlockValue(r, mag)
		}
		if it%3 == 0 {
			// Aligned: g and the block scale are powers of two, so the
			// ladder's midpoints are hit exactly (ties to even).
			g = float32(math.Ldexp(1, r.IntN(11)-5))
			unit := math.Ldexp(1, r.IntN(13)-6) * float64(g)
			mids := []float64{0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6}
			for i := range src {
				if i%16 == 0 {
					src[i] = float32(6 * unit * float64(1-2*r.IntN(2)))
				} else {
					src[i] = float32(mids[r.IntN(len(mids))] * unit * float64(1-2*r.IntN(2)))
				}
			}
		}
		codes, scales := make([]byte, d/2), make([]byte, d/16)
		quant.QuantizeNVFP4(codes, scales, src, g)
		wc, ws := refQuantize(src, g)
		require.Equal(t, ws, scales, "iteration %d: block scales (g=%v, src=%v)", it, g, src)
		require.Equal(t, wc, codes, "iteration %d: codes (g=%v, src=%v)", it, g, src)
	}
}

// The documented per-element bound (quant package doc, "NVFP4"): when a
// block's amax/(6g) is in e4m3's normal range [2^-6, 448], every finite
// element x reads back as x' = e2m1*s*g with |x - x'| <= s*g*(1+2^-20), and
// s*g <= amax/6 * (1 + 2^-4), so |x - x'| <= 0.178*amax.
func TestNVFP4ErrorBound(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 5))
	got := make([]float32, 16)
	worst := 0.0
	for it := range nvfp4Iters(5000) {
		g := float32(math.Ldexp(0.5+r.Float64(), r.IntN(21)-10))
		lo, hi := math.Log(6*math.Ldexp(1, -6)*float64(g)), math.Log(6*448*float64(g))
		amax := math.Exp(lo + r.Float64()*(hi-lo))
		src := make([]float32, 16)
		for i := range src {
			src[i] = float32((2*r.Float64() - 1) * amax)
		}
		src[r.IntN(16)] = float32(amax * float64(1-2*r.IntN(2)))
		a := 0.0
		for _, x := range src {
			a = max(a, math.Abs(float64(x)))
		}
		if a/(6*float64(g)) < 0x1p-6 || a/(6*float64(g)) > 448 {
			continue
		}
		codes, scales := make([]byte, 8), make([]byte, 1)
		quant.QuantizeNVFP4(codes, scales, src, g)
		quant.DequantizeNVFP4(got, codes, scales)
		sg := float64(layout.E4M3ToF32(scales[0])) * float64(g)
		require.LessOrEqual(t, sg, a/6*(1+0x1p-4)*(1+0x1p-20), "iteration %d: scale*g", it)
		for i, x := range src {
			e := math.Abs(float64(x) - float64(got[i])*float64(g))
			require.LessOrEqual(t, e, sg*(1+0x1p-20), "iteration %d element %d: x=%v x'=%v s*g=%v", it, i, x, float64(got[i])*float64(g), sg)
			worst = max(worst, e/a)
		}
	}
	t.Logf("largest |x - x'|/amax seen: %.4f (bound 0.178)", worst)
}

func TestNVFP4LengthPanics(t *testing.T) {
	assert.PanicsWithValue(t, "quant: QuantizeNVFP4 of 24 elements, not a multiple of the nvfp4 block of 16",
		func() { quant.QuantizeNVFP4(make([]byte, 12), make([]byte, 2), make([]float32, 24), 1) })
	assert.PanicsWithValue(t, "quant: DequantizeNVFP4 of 32 nvfp4 elements needs 2 scale bytes, has 1",
		func() { quant.DequantizeNVFP4(make([]float32, 32), make([]byte, 16), make([]byte, 1)) })
	assert.PanicsWithValue(t, "quant: QuantizeNVFP4 of 16 nvfp4 elements needs 8 code bytes, has 7",
		func() { quant.QuantizeNVFP4(make([]byte, 7), make([]byte, 1), make([]float32, 16), 1) })
}
