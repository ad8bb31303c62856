package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// The fast helpers of attention_math.go against their obvious twins.

func TestExp2NegMatchesMathExp2(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	xs := []float32{0, -0.5, -1, -1.5, -125.9, -126, -126.1, -140, -149, -149.5, -150, -151, -1000, float32(math.Inf(-1)), -1e-7, -0.49999997}
	for i := 0; i < 200000; i++ {
		xs = append(xs, -float32(rng.Float64()*160))
	}
	for _, x := range xs {
		got, want := exp2Neg(x), float32(math.Exp2(float64(x)))
		if want == 0 || x < -126 {
			require.Equal(t, want, got, "exp2Neg(%v)", x)
			continue
		}
		// Within 4 float32 ulps (relative 2^-21).
		require.InEpsilon(t, want, got, 0x1p-21, "exp2Neg(%v) = %v, want %v", x, got, want)
	}
	require.True(t, math.IsNaN(float64(exp2Neg(float32(math.NaN())))))
}

func TestWidenRowMatchesLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		for n := 0; n < 40; n++ {
			src := make([]byte, n*dt.Size()+7) // trailing bytes must not be read into dst
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			got, want := make([]float32, n), make([]float32, n)
			widenRow(got, dt, src)
			layout.LoadRowF32(want, dt, src)
			for i := range want {
				require.Equal(t, quietNaN(want[i]), quietNaN(got[i]), "%v n=%d element %d", dt, n, i)
			}
		}
	}
	// Every f16 bit pattern.
	src := make([]byte, 2<<16)
	for h := 0; h < 1<<16; h++ {
		src[2*h], src[2*h+1] = byte(h), byte(h>>8)
	}
	got := make([]float32, 1<<16)
	widenRow(got, layout.F16, src)
	for h := range got {
		require.Equal(t, quietNaN(layout.F16ToF32(uint16(h))), quietNaN(got[h]), "f16 %#04x", h)
	}
}

// quietNaN returns x's bits with the quiet bit set if x is a NaN: the
// hardware f16 conversion (VCVTPH2PS) quiets a signalling NaN, the lookup
// table keeps it; sign and payload agree.
func quietNaN(x float32) uint32 {
	b := math.Float32bits(x)
	if x != x {
		b |= 1 << 22
	}
	return b
}

func TestDotAndAxpyRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, d := range []int{1, 3, 4, 7, 64, 129} {
		for rows := 0; rows <= 9; rows++ {
			q := make([]float32, rows*d)
			k := make([]float32, d)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			for i := range k {
				k[i] = float32(rng.NormFloat64())
			}
			out := make([]float32, rows)
			dotRows(out, q, k, d)
			acc := append([]float32(nil), q...)
			axpyRows(out, k, acc, d)
			for r := 0; r < rows; r++ {
				want := 0.0
				for i := 0; i < d; i++ {
					want += float64(q[r*d+i]) * float64(k[i])
				}
				require.InDelta(t, want, out[r], 1e-4*(1+math.Abs(want)), "dot d=%d row %d", d, r)
				for i := 0; i < d; i++ {
					w := float64(q[r*d+i]) + float64(out[r])*float64(k[i])
					require.InDelta(t, w, acc[r*d+i], 1e-4*(1+math.Abs(w)), "axpy d=%d row %d elem %d", d, r, i)
				}
			}
		}
	}
}
