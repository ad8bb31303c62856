package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv/layout"
)

// The assembly against its pure-Go models (widenRowGo, dot4Go,
// axpyBlockGo): widening bit for bit (but for a signalling f16 NaN, which
// the hardware quiets), sums within float32 rounding of the Go order (the
// assembly sums in eight lanes with fused multiply-adds), on every length
// and every byte offset of the inputs, so unaligned loads and tails run.

func needSIMD(t testing.TB) {
	t.Helper()
	if !hasSIMD {
		t.Skip("no AVX2+FMA+F16C, or built with -tags purego: the assembly does not run here, the pure-Go loops do")
	}
}

// closeSum reports whether got is within float32 rounding of want, where
// mag is the sum of the magnitudes of the terms.
func closeSum(got, want, mag float32) bool {
	if want != want || got != got {
		return want != want && got != got
	}
	return math.Abs(float64(got-want)) <= 1e-5*float64(mag)+1e-30
}

// randF16 returns n random f16 or bf16 values of moderate size (finite, so
// sums compare), with a few exact zeros and subnormals.
func randNarrow(rng *rand.Rand, dt layout.DType, n int) []byte {
	b := make([]byte, 2*n)
	for i := range n {
		x := float32(rng.NormFloat64())
		switch rng.IntN(16) {
		case 0:
			x = 0
		case 1:
			x = 1e-6 // an f16 subnormal
		}
		var h uint16
		if dt == layout.F16 {
			h = layout.F32ToF16(x)
		} else {
			h = uint16(math.Float32bits(x) >> 16)
		}
		binary.LittleEndian.PutUint16(b[2*i:], h)
	}
	return b
}

func randF32(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

func TestWidenAsmMatchesGo(t *testing.T) {
	needSIMD(t)
	rng := rand.New(rand.NewPCG(21, 1))
	for _, dt := range []layout.DType{layout.F16, layout.BF16} {
		for n := 0; n <= 72; n++ {
			for off := 0; off < 8; off++ {
				raw := make([]byte, 2*n+2*off+5)
				for i := range raw {
					raw[i] = byte(rng.Uint32()) // every bit pattern: NaN, Inf, subnormals
				}
				src := raw[2*off+off%2:] // odd byte offsets too
				got := make([]float32, n+off)[off:]
				want := make([]float32, n)
				widenRow(got, dt, src)
				widenRowGo(want, dt, src)
				for i := range want {
					if quietNaN(got[i]) != quietNaN(want[i]) {
						t.Fatalf("%v n=%d off=%d [%d]: asm %#08x, Go %#08x", dt, n, off, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
					}
				}
			}
		}
	}
}

func TestDot4AsmMatchesGo(t *testing.T) {
	needSIMD(t)
	rng := rand.New(rand.NewPCG(21, 2))
	for d := 1; d <= 140; d++ {
		for off := 0; off < 8; off += 3 {
			q := randF32(rng, 4*d+off)[off:]
			k := randF32(rng, d+off)[off:]
			checkDot4(t, q, k, d, "f32", func() (a, b, c, e float32) { return dot4(q, k, d) })
			for _, dt := range []layout.DType{layout.F16, layout.BF16} {
				if d%8 != 0 {
					continue // the narrow kernels take whole vectors; their callers ensure it
				}
				kn := randNarrow(rng, dt, d+off)[2*off:]
				kw := make([]float32, d)
				widenRowGo(kw, dt, kn)
				fn := dot4F16AVX
				if dt == layout.BF16 {
					fn = dot4BF16AVX
				}
				checkDot4(t, q, kw, d, dt.String(), func() (a, b, c, e float32) { return fn(&q[0], d, &kn[0], d) })
			}
		}
	}
}

func checkDot4(t *testing.T, q, k []float32, d int, what string, asm func() (a, b, c, e float32)) {
	t.Helper()
	var got [4]float32
	got[0], got[1], got[2], got[3] = asm()
	var want [4]float32
	want[0], want[1], want[2], want[3] = dot4Go(q, k, d)
	for j := range 4 {
		mag := float32(0)
		for i := range d {
			mag += float32(math.Abs(float64(q[j*d+i] * k[i])))
		}
		if !closeSum(got[j], want[j], mag) {
			t.Fatalf("%s d=%d row %d: asm %v, Go %v (sum of |terms| %v)", what, d, j, got[j], want[j], mag)
		}
	}
}

func TestAxpyAsmMatchesGo(t *testing.T) {
	needSIMD(t)
	rng := rand.New(rand.NewPCG(21, 3))
	for d := 1; d <= 140; d++ {
		for T := 0; T <= 9; T++ {
			ts := d + rng.IntN(9)
			v := randF32(rng, T*ts+d)
			p := randF32(rng, T)
			acc0 := randF32(rng, d)
			got, want := append([]float32(nil), acc0...), append([]float32(nil), acc0...)
			axpyBlock(got, p, v, ts, d)
			axpyBlockGo(want, p, v, ts, d)
			checkAxpy(t, got, want, acc0, p, v, ts, d, "f32")
			if d%8 != 0 {
				continue
			}
			for _, dt := range []layout.DType{layout.F16, layout.BF16} {
				vn := randNarrow(rng, dt, T*ts+d)
				vw := make([]float32, T*ts+d)
				widenRowGo(vw, dt, vn)
				got := append([]float32(nil), acc0...)
				want := append([]float32(nil), acc0...)
				tt := 0
				for ; tt+4 <= T; tt += 4 {
					if dt == layout.F16 {
						axpy4F16AVX(&got[0], &vn[2*tt*ts], ts, (*[4]float32)(p[tt:tt+4]), d)
					} else {
						axpy4BF16AVX(&got[0], &vn[2*tt*ts], ts, (*[4]float32)(p[tt:tt+4]), d)
					}
				}
				for ; tt < T; tt++ {
					if dt == layout.F16 {
						axpy1F16AVX(&got[0], &vn[2*tt*ts], p[tt], d)
					} else {
						axpy1BF16AVX(&got[0], &vn[2*tt*ts], p[tt], d)
					}
				}
				axpyBlockGo(want, p, vw, ts, d)
				checkAxpy(t, got, want, acc0, p, vw, ts, d, dt.String())
			}
		}
	}
}

func checkAxpy(t *testing.T, got, want, acc0, p, v []float32, ts, d int, what string) {
	t.Helper()
	for i := range d {
		mag := float32(math.Abs(float64(acc0[i])))
		for tt := range p {
			mag += float32(math.Abs(float64(p[tt] * v[tt*ts+i])))
		}
		if !closeSum(got[i], want[i], mag) {
			t.Fatalf("%s d=%d T=%d ts=%d [%d]: asm %v, Go %v", what, d, len(p), ts, i, got[i], want[i])
		}
	}
}

// FuzzWidenAsm widens raw bytes as f16 and bf16 rows with the assembly and
// with the Go loops.
func FuzzWidenAsm(f *testing.F) {
	f.Add([]byte{0x00, 0x7c, 0x01, 0x7c, 0x00, 0xfc, 0xff, 0x7f, 0x01, 0x00, 0x00, 0x80, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, raw []byte) {
		needSIMD(t)
		for _, dt := range []layout.DType{layout.F16, layout.BF16} {
			n := len(raw) / 2
			got, want := make([]float32, n), make([]float32, n)
			widenRow(got, dt, raw)
			widenRowGo(want, dt, raw)
			for i := range want {
				if quietNaN(got[i]) != quietNaN(want[i]) {
					t.Fatalf("%v [%d]: asm %#08x, Go %#08x", dt, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
				}
			}
		}
	})
}

// FuzzDotAxpyAsm reads q, k, the weights and v from raw bytes (as bounded
// float32s, so sums compare) and checks dot4 and axpyBlock, and their
// narrow-cache versions, against the Go loops.
func FuzzDotAxpyAsm(f *testing.F) {
	f.Add(uint8(16), uint8(3), []byte("some bytes to make floats from, long enough for a few rows of q and k"))
	f.Add(uint8(9), uint8(5), []byte{0xff, 0x00, 0x80, 0x7f})
	f.Fuzz(func(t *testing.T, dim, keys uint8, raw []byte) {
		needSIMD(t)
		d, T := 1+int(dim)%136, int(keys)%10
		next := func(i int) float32 { // bytes -> [-8, 8)
			if len(raw) == 0 {
				return 0
			}
			return float32(int8(raw[i%len(raw)])) / 16
		}
		q, k, p := make([]float32, 4*d), make([]float32, d), make([]float32, T)
		v := make([]float32, T*d+d)
		i := 0
		for _, s := range [][]float32{q, k, p, v} {
			for j := range s {
				s[j] = next(i)
				i++
			}
		}
		checkDot4(t, q, k, d, "f32", func() (a, b, c, e float32) { return dot4(q, k, d) })
		acc0 := make([]float32, d)
		got, want := make([]float32, d), make([]float32, d)
		axpyBlock(got, p, v, d, d)
		axpyBlockGo(want, p, v, d, d)
		checkAxpy(t, got, want, acc0, p, v, d, d, "f32")
		if d%8 == 0 {
			kn := make([]byte, 2*d)
			for j, x := range k {
				binary.LittleEndian.PutUint16(kn[2*j:], layout.F32ToF16(x)) // exact: multiples of 1/16 in [-8, 8)
			}
			checkDot4(t, q, k, d, "f16", func() (a, b, c, e float32) { return dot4F16AVX(&q[0], d, &kn[0], d) })
		}
	})
}
