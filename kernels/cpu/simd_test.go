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
	if got == want {
		return true // infinities too
	}
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
			kn := make([]byte, 2*T*d+2*d)
			for j, x := range v {
				binary.LittleEndian.PutUint16(kn[2*j:], layout.F32ToF16(x)) // exact: multiples of 1/16 in [-8, 8)
			}
			c := fusedCase{d: d, ks: 2 * d, T: T + 1, heads: 1, dt: layout.F16}
			checkLogits4(t, c, q, 4*d, kn)
			p4 := make([]float32, 4*(T+1))
			for j := range p4 {
				p4[j] = next(i + j)
			}
			checkAttnV4(t, c, make([]float32, 4*d), 4*d, kn, p4, 4*(T+1))
			m, s := [4]float32{next(i), next(i + 1), next(i + 2), next(i + 3)}, p4
			for j := range s {
				s[j] = min(s[j], m[j%4])
			}
			checkExpBlock4(t, s, m, [4]float32{})
		}
	})
}

// logits4NarrowGo and attnV4NarrowGo are the models of the fused-path
// kernels: widen each row with widenRowGo, then the pure-Go loops.
func logits4NarrowGo(s []float32, ss int, q []float32, qs, d int, k []byte, ks, hs, T, heads int, dt layout.DType) {
	row := make([]float32, d)
	for h := range heads {
		for t := range T {
			widenRowGo(row, dt, k[h*hs+t*ks:])
			o := s[h*ss+4*t:]
			o[0], o[1], o[2], o[3] = dot4Go(q[h*qs:], row, d)
		}
	}
}

func attnV4NarrowGo(acc []float32, as, d int, v []byte, vs, hs int, p []float32, ss, T, heads int, dt layout.DType) {
	row := make([]float32, d)
	for h := range heads {
		for t := range T {
			widenRowGo(row, dt, v[h*hs+t*vs:])
			for j := range 4 {
				axpy(p[h*ss+4*t+j], row, acc[h*as+j*d:][:d])
			}
		}
	}
}

// fusedCase is one call of the fused-path kernels: heads groups of four
// query rows (qs elements apart) against T rows of d 16-bit values per
// head (ks bytes apart, heads hs bytes apart) in k.
type fusedCase struct {
	d, ks, hs, T, heads int
	dt                  layout.DType
}

// checkLogits4 compares logits4Narrow with its model.
func checkLogits4(t *testing.T, c fusedCase, q []float32, qs int, k []byte) {
	t.Helper()
	ss := 4*c.T + 3 // a gap between the heads' blocks
	got, want := make([]float32, c.heads*ss), make([]float32, c.heads*ss)
	logits4Narrow(got, ss, q, qs, c.d, k, c.ks, c.hs, c.T, c.heads, c.dt == layout.BF16)
	logits4NarrowGo(want, ss, q, qs, c.d, k, c.ks, c.hs, c.T, c.heads, c.dt)
	row := make([]float32, c.d)
	for h := range c.heads {
		for tt := range c.T {
			widenRowGo(row, c.dt, k[h*c.hs+tt*c.ks:])
			for j := range 4 {
				mag := float32(0)
				for i := range c.d {
					mag += float32(math.Abs(float64(q[h*qs+j*c.d+i] * row[i])))
				}
				if i := h*ss + 4*tt + j; !closeSum(got[i], want[i], mag) {
					t.Fatalf("logits4 %+v head %d key %d query %d: asm %v, Go %v", c, h, tt, j, got[i], want[i])
				}
			}
		}
	}
	for h := range c.heads {
		for i := 4 * c.T; i < ss; i++ {
			if got[h*ss+i] != 0 {
				t.Fatalf("logits4 %+v wrote s[%d] between the heads' blocks", c, h*ss+i)
			}
		}
	}
}

// checkAttnV4 compares attnV4Narrow with its model; acc0 holds the
// starting accumulators, as elements apart per head; p the weights, ss
// elements apart per head.
func checkAttnV4(t *testing.T, c fusedCase, acc0 []float32, as int, v []byte, p []float32, ss int) {
	t.Helper()
	got, want := append([]float32(nil), acc0...), append([]float32(nil), acc0...)
	attnV4Narrow(got, as, c.d, v, c.ks, c.hs, p, ss, c.T, c.heads, c.dt == layout.BF16)
	attnV4NarrowGo(want, as, c.d, v, c.ks, c.hs, p, ss, c.T, c.heads, c.dt)
	rows := make([]float32, c.T*c.d)
	for h := range c.heads {
		for tt := range c.T {
			widenRowGo(rows[tt*c.d:(tt+1)*c.d], c.dt, v[h*c.hs+tt*c.ks:])
		}
		for j := range 4 {
			for i := range c.d {
				x := h*as + j*c.d + i
				mag := float32(math.Abs(float64(acc0[x])))
				for tt := range c.T {
					mag += float32(math.Abs(float64(p[h*ss+4*tt+j] * rows[tt*c.d+i])))
				}
				if !closeSum(got[x], want[x], mag) {
					t.Fatalf("attnV4 %+v head %d row %d [%d]: asm %v, Go %v", c, h, j, i, got[x], want[x])
				}
			}
		}
	}
	for i := range acc0 {
		if i%as >= 4*c.d && got[i] != acc0[i] {
			t.Fatalf("attnV4 %+v wrote acc[%d] between the heads' rows", c, i)
		}
	}
}

// checkExpBlock4 compares expBlock4Vec with expBlock4Go on logits s (each
// at most its query's maximum m[i%4], or NaN), starting from sums l.
func checkExpBlock4(t *testing.T, s []float32, m, l [4]float32) {
	t.Helper()
	got, want := append([]float32(nil), s...), append([]float32(nil), s...)
	lg, lw := l, l
	if len(s) > 0 {
		expBlock4Vec(&got[0], len(got), &m, &lg)
	}
	expBlock4Go(want, &m, &lw)
	for i := range want {
		// A few float32 ulps, or below the normal range (the assembly
		// flushes weights under 2^-126 to zero).
		if !(quietNaN(got[i]) == quietNaN(want[i]) || math.Abs(float64(got[i]-want[i])) <= 4e-7*float64(want[i])+0x1p-125) {
			t.Fatalf("exp n=%d [%d]: 2^(%v - %v) = %v by the assembly, %v by Go", len(s), i, s[i], m[i%4], got[i], want[i])
		}
	}
	for j := range 4 {
		mag := l[j]
		for i := j; i < len(want); i += 4 {
			mag += want[i]
		}
		if !closeSum(lg[j], lw[j], mag) {
			t.Fatalf("exp n=%d l[%d]: asm %v, Go %v", len(s), j, lg[j], lw[j])
		}
	}
}

// TestFusedKernelsMatchGo runs the fused decode kernels against their
// models on every head_dim that is a multiple of 8 up to 264, key counts
// 0..17 (odd ones leave a one-key tail), one to three heads per call, key
// and head strides of NHD and HND pages (and others), and every 2-byte
// offset of the cache rows against a 16-byte vector.
func TestFusedKernelsMatchGo(t *testing.T) {
	needSIMD(t)
	t.Parallel()
	rng := rand.New(rand.NewPCG(21, 5))
	for d := 8; d <= 264; d += 8 {
		for T := 0; T <= 17; T++ {
			if T > 9 && T < 16 && d%32 != 8 {
				continue
			}
			for _, dt := range []layout.DType{layout.F16, layout.BF16} {
				c := fusedCase{d: d, T: T, heads: 1 + rng.IntN(3), dt: dt}
				switch rng.IntN(3) {
				case 0: // NHD: a token's heads contiguous
					c.hs, c.ks = 2*d, 2*d*(c.heads+rng.IntN(2))
				case 1: // HND: a head's tokens contiguous
					c.ks, c.hs = 2*d, 2*d*(T+rng.IntN(3))
				default:
					c.ks, c.hs = 2*d+2*rng.IntN(9), 2*rng.IntN(4*d)
				}
				off := 2 * rng.IntN(8) // rows of a 16-bit cache start at even bytes; any vector alignment
				n := c.heads*c.hs + T*c.ks + 2*d
				raw := randNarrow(rng, dt, n/2+8)[off:]
				qs := 4*d + rng.IntN(9)
				qoff := rng.IntN(8)
				q := randF32(rng, c.heads*qs+qoff)[qoff:]
				checkLogits4(t, c, q, qs, raw)
				as, ss := 4*d+8*rng.IntN(2), 4*T+rng.IntN(5)
				checkAttnV4(t, c, randF32(rng, c.heads*as), as, raw, randF32(rng, c.heads*ss), ss)
			}
		}
	}
}

// TestExpBlock4MatchesGo checks the weights on every block length up to
// 68 values, with -inf, NaN, ties with the maximum, and logits far below
// it (into the subnormal and zero range of 2^x).
func TestExpBlock4MatchesGo(t *testing.T) {
	needSIMD(t)
	rng := rand.New(rand.NewPCG(21, 6))
	for n := 0; n <= 68; n += 4 {
		for rep := range 20 {
			var m [4]float32
			for j := range m {
				m[j] = float32(rng.NormFloat64() * 20)
			}
			s := make([]float32, n)
			for i := range s {
				switch rng.IntN(12) {
				case 0:
					s[i] = negInf
				case 1:
					s[i] = float32(math.NaN())
				case 2:
					s[i] = m[i%4]
				case 3:
					s[i] = m[i%4] - 120 - float32(rng.Float64()*40)
				default:
					s[i] = m[i%4] - float32(rng.ExpFloat64()*8)
				}
			}
			l := [4]float32{float32(rep), 1, 0, 2.5}
			checkExpBlock4(t, s, m, l)
		}
	}
}
