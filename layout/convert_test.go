package layout_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/layout"
)

// narrow describes one narrow float dtype's conversions under test.
type narrow struct {
	dt    layout.DType
	bits  int
	toF32 func(uint32) float32
	enc   func(float32) uint32 // PyTorch rules
	sat   func(float32) uint32 // saturating (CUDA SATFINITE); nil when none
}

var narrows = []narrow{
	{layout.F16, 16, func(c uint32) float32 { return layout.F16ToF32(uint16(c)) },
		func(f float32) uint32 { return uint32(layout.F32ToF16(f)) }, nil},
	{layout.BF16, 16, func(c uint32) float32 { return layout.BF16ToF32(uint16(c)) },
		func(f float32) uint32 { return uint32(layout.F32ToBF16(f)) }, nil},
	{layout.E4M3, 8, func(c uint32) float32 { return layout.E4M3ToF32(uint8(c)) },
		func(f float32) uint32 { return uint32(layout.F32ToE4M3(f)) },
		func(f float32) uint32 { return uint32(layout.F32ToE4M3Sat(f)) }},
	{layout.E5M2, 8, func(c uint32) float32 { return layout.E5M2ToF32(uint8(c)) },
		func(f float32) uint32 { return uint32(layout.F32ToE5M2(f)) },
		func(f float32) uint32 { return uint32(layout.F32ToE5M2Sat(f)) }},
}

// slowDecode is the reference decoder applied to a code.
func slowDecode(dt layout.DType, code uint32) float64 {
	buf := []byte{byte(code), byte(code >> 8)}
	return reference.Float(dt, buf[:dt.Size()], 0)
}

// Every code of every narrow dtype widens to the value its bit fields say.
func TestDecodeExhaustive(t *testing.T) {
	for _, n := range narrows {
		t.Run(n.dt.String(), func(t *testing.T) {
			for code := uint32(0); code < 1<<n.bits; code++ {
				got, want := float64(n.toF32(code)), slowDecode(n.dt, code)
				if math.IsNaN(want) {
					if !math.IsNaN(got) {
						t.Fatalf("code %#x: got %v, want NaN", code, got)
					}
					if sign := code>>(n.bits-1) == 1; math.Signbit(got) != sign {
						t.Fatalf("code %#x: NaN sign %v, want %v", code, math.Signbit(got), sign)
					}
					continue
				}
				if got != want || math.Signbit(got) != math.Signbit(want) {
					t.Fatalf("code %#x: got %v, want %v", code, got, want)
				}
			}
		})
	}
}

// probes returns float32 inputs around every code of n: the code's value, one
// float32 ulp either side, the exact midpoint to the next larger code (a
// tie) and one float32 ulp either side of it, each with both signs.
func probes(n narrow) []float32 {
	var xs []float32
	add := func(v float64) {
		f := float32(v)
		if float64(f) != v {
			panic(fmt.Sprintf("probe %v is not a float32", v))
		}
		for _, g := range []float32{f, math.Nextafter32(f, float32(math.Inf(1))), math.Nextafter32(f, float32(math.Inf(-1)))} {
			xs = append(xs, g, -g)
		}
	}
	positive := uint32(1) << (n.bits - 1)
	for code := uint32(0); code < positive; code++ {
		v := slowDecode(n.dt, code)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		add(v)
		next := slowDecode(n.dt, code+1)
		if math.IsNaN(next) || math.IsInf(next, 0) {
			// Past the largest finite value: the midpoint to the value the
			// next binade step would have had.
			next = v + (v - slowDecode(n.dt, code-1))
		}
		add((v + next) / 2)
	}
	inf := float32(math.Inf(1))
	xs = append(xs, inf, -inf, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, float32(math.NaN()),
		math.Float32frombits(0xffc00000), math.Float32frombits(0x7f800001), math.Float32frombits(0xff812345))
	return xs
}

// Narrowing agrees with the reference's float64 rounding on every probe.
func TestEncodeExhaustiveProbes(t *testing.T) {
	for _, n := range narrows {
		t.Run(n.dt.String(), func(t *testing.T) {
			xs := probes(n)
			for _, x := range xs {
				if got, want := n.enc(x), reference.Encode(n.dt, float64(x), false); got != want {
					t.Fatalf("%v(%v = %#08x) = %#x, reference %#x", n.dt, x, math.Float32bits(x), got, want)
				}
				if n.sat == nil {
					continue
				}
				if got, want := n.sat(x), reference.Encode(n.dt, float64(x), true); got != want {
					t.Fatalf("%v sat(%v = %#08x) = %#x, reference %#x", n.dt, x, math.Float32bits(x), got, want)
				}
			}
			t.Logf("%d probes", len(xs))
		})
	}
}

// Random float32 bit patterns (all exponents, NaNs included).
func TestEncodeRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	count := 1 << 18
	if testing.Short() {
		count = 1 << 14
	}
	for range count {
		x := math.Float32frombits(r.Uint32())
		for _, n := range narrows {
			if got, want := n.enc(x), reference.Encode(n.dt, float64(x), false); got != want {
				t.Fatalf("%v(%v = %#08x) = %#x, reference %#x", n.dt, x, math.Float32bits(x), got, want)
			}
			if n.sat != nil {
				if got, want := n.sat(x), reference.Encode(n.dt, float64(x), true); got != want {
					t.Fatalf("%v sat(%v = %#08x) = %#x, reference %#x", n.dt, x, math.Float32bits(x), got, want)
				}
			}
		}
	}
}

// The overflow and NaN rules, written out (the comment table in convert.go).
func TestOverflowAndNaNRules(t *testing.T) {
	nan, negNaN := float32(math.NaN()), math.Float32frombits(0xffc00001)
	inf := float32(math.Inf(1))
	rows := []struct {
		name string
		got  uint32
		want uint32
	}{
		{"f16 65519 -> max", uint32(layout.F32ToF16(65519)), 0x7bff},
		{"f16 65520 -> inf", uint32(layout.F32ToF16(65520)), 0x7c00},
		{"f16 -inf", uint32(layout.F32ToF16(-inf)), 0xfc00},
		{"f16 -NaN keeps sign", uint32(layout.F32ToF16(negNaN)), 0xfe00},
		{"bf16 max f32 -> inf", uint32(layout.F32ToBF16(math.MaxFloat32)), 0x7f80},
		{"bf16 -NaN -> 0x7FC0", uint32(layout.F32ToBF16(negNaN)), 0x7fc0},
		{"e4m3 464 -> 448", uint32(layout.F32ToE4M3(464)), 0x7e},
		{"e4m3 465 -> NaN", uint32(layout.F32ToE4M3(465)), 0x7f},
		{"e4m3 inf -> NaN", uint32(layout.F32ToE4M3(inf)), 0x7f},
		{"e4m3 -inf -> -NaN", uint32(layout.F32ToE4M3(-inf)), 0xff},
		{"e4m3 NaN", uint32(layout.F32ToE4M3(nan)), 0x7f},
		{"e4m3sat 1e9 -> 448", uint32(layout.F32ToE4M3Sat(1e9)), 0x7e},
		{"e4m3sat -inf -> -448", uint32(layout.F32ToE4M3Sat(-inf)), 0xfe},
		{"e4m3sat -NaN", uint32(layout.F32ToE4M3Sat(negNaN)), 0xff},
		{"e5m2 61439 -> max", uint32(layout.F32ToE5M2(61439)), 0x7b},
		{"e5m2 61440 -> inf", uint32(layout.F32ToE5M2(61440)), 0x7c},
		{"e5m2 NaN", uint32(layout.F32ToE5M2(nan)), 0x7f},
		{"e5m2sat inf -> max", uint32(layout.F32ToE5M2Sat(inf)), 0x7b},
		{"e5m2sat -1e6 -> -max", uint32(layout.F32ToE5M2Sat(-1e6)), 0xfb},
		{"e4m3 smallest subnormal 2^-9", uint32(layout.F32ToE4M3(1.0 / 512)), 0x01},
		{"e4m3 2^-10 ties to 0", uint32(layout.F32ToE4M3(1.0 / 1024)), 0x00},
		{"e5m2 -0", uint32(layout.F32ToE5M2(float32(math.Copysign(0, -1)))), 0x80},
	}
	for _, r := range rows {
		assert.Equalf(t, r.want, r.got, "%s: got %#x want %#x", r.name, r.got, r.want)
	}
}

// X -> f32 -> X is the identity on every code, NaN codes mapping to the
// dtype's canonical NaN of the same sign (bf16: the positive 0x7FC0).
func TestRoundTripEveryCode(t *testing.T) {
	for _, n := range narrows {
		for code := uint32(0); code < 1<<n.bits; code++ {
			x := n.toF32(code)
			got := n.enc(x)
			if x != x {
				want := reference.Encode(n.dt, float64(x), false)
				require.Equalf(t, want, got, "%v NaN code %#x", n.dt, code)
				continue
			}
			require.Equalf(t, code, got, "%v code %#x -> %v", n.dt, code, x)
			if n.sat != nil && !math.IsInf(float64(x), 0) {
				require.Equalf(t, code, n.sat(x), "%v sat code %#x -> %v", n.dt, code, x)
			}
		}
	}
}

func TestLoadStore(t *testing.T) {
	vals := []float32{0, 1, -2.5, 0.1, 448, 1e-3, -65504, 3}
	for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		buf := make([]byte, len(vals)*dt.Size())
		for i, v := range vals {
			layout.StoreF32(dt, buf, i, v)
		}
		row := make([]float32, len(vals))
		layout.LoadRowF32(row, dt, buf)
		buf2 := make([]byte, len(buf))
		layout.StoreRowF32(buf2, dt, vals)
		assert.Equal(t, buf, buf2, "%v: StoreRowF32 equals StoreF32 element by element", dt)
		for i, v := range vals {
			var want float32
			switch dt {
			case layout.F32:
				want = v
			case layout.F16:
				want = layout.F16ToF32(layout.F32ToF16(v))
			case layout.BF16:
				want = layout.BF16ToF32(layout.F32ToBF16(v))
			case layout.E4M3:
				want = layout.E4M3ToF32(layout.F32ToE4M3(v))
			case layout.E5M2:
				want = layout.E5M2ToF32(layout.F32ToE5M2(v))
			}
			got := layout.LoadF32(dt, buf, i)
			if want != want {
				assert.True(t, got != got, "%v[%d] NaN", dt, i)
				continue
			}
			assert.Equal(t, want, got, "%v[%d] = %v", dt, i, v)
			assert.Equal(t, want, row[i], "%v LoadRowF32[%d]", dt, i)
		}
	}
	// f16 is little-endian: 1.0 = 0x3C00 stored as 00 3C.
	b := make([]byte, 4)
	layout.StoreF32(layout.F16, b, 1, 1)
	assert.Equal(t, []byte{0, 0, 0x00, 0x3c}, b)
}

func TestIntegerStores(t *testing.T) {
	for _, tc := range []struct {
		dt   layout.DType
		in   float32
		want float32
	}{
		{layout.I8, 2.5, 2}, {layout.I8, 3.5, 4}, {layout.I8, -2.5, -2}, {layout.I8, 300, 127},
		{layout.I8, -1000, -128}, {layout.I8, float32(math.NaN()), 0},
		{layout.U8, 254.5, 254}, {layout.U8, -3, 0}, {layout.U8, 1e6, 255},
		{layout.I32, 1e10, math.MaxInt32}, {layout.I32, -7.5, -8},
	} {
		buf := make([]byte, tc.dt.Size())
		layout.StoreF32(tc.dt, buf, 0, tc.in)
		assert.Equal(t, tc.want, layout.LoadF32(tc.dt, buf, 0), "%v(%v)", tc.dt, tc.in)
	}
	assert.Panics(t, func() { layout.LoadF32(layout.InvalidDType, []byte{0}, 0) })
	assert.Panics(t, func() { layout.StoreF32(layout.InvalidDType, []byte{0}, 0, 1) })
}

func TestConversionsDoNotAllocate(t *testing.T) {
	src := make([]byte, 256)
	dst := make([]float32, 128)
	allocs := testing.AllocsPerRun(100, func() {
		layout.LoadRowF32(dst, layout.F16, src)
		layout.StoreRowF32(src, layout.BF16, dst)
		_ = layout.LoadF32(layout.E4M3, src, 3)
		layout.StoreF32(layout.E5M2, src, 3, 1.5)
	})
	assert.Zero(t, allocs)
}

// FuzzConvertRoundTrip: for every dtype, F32 -> X -> F32 -> X is stable, the
// narrowing agrees with the reference rounding, and X -> F32 -> X is the
// identity on the code made of the input's low bits (NaN codes go to the
// canonical NaN).
func FuzzConvertRoundTrip(f *testing.F) {
	for _, b := range []uint32{0, 0x3f800000, 0x477ff000, 0x43e80000, 0x7f800000, 0xffc00000, 0x00000001, 0x38800000} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, bits uint32) {
		x := math.Float32frombits(bits)
		for _, n := range narrows {
			y := n.enc(x)
			if want := reference.Encode(n.dt, float64(x), false); y != want {
				t.Fatalf("%v(%#08x) = %#x, reference %#x", n.dt, bits, y, want)
			}
			if again := n.enc(n.toF32(y)); again != y {
				t.Fatalf("%v: %#08x -> %#x -> %v -> %#x", n.dt, bits, y, n.toF32(y), again)
			}
			if n.sat != nil {
				ys := n.sat(x)
				if want := reference.Encode(n.dt, float64(x), true); ys != want {
					t.Fatalf("%v sat(%#08x) = %#x, reference %#x", n.dt, bits, ys, want)
				}
				if again := n.sat(n.toF32(ys)); again != ys {
					t.Fatalf("%v sat: %#08x -> %#x -> %#x", n.dt, bits, ys, again)
				}
			}
			code := bits & (1<<n.bits - 1)
			w := n.toF32(code)
			back := n.enc(w)
			if w != w {
				if back != reference.Encode(n.dt, float64(w), false) {
					t.Fatalf("%v NaN code %#x -> %#x", n.dt, code, back)
				}
			} else if back != code {
				t.Fatalf("%v code %#x -> %v -> %#x", n.dt, code, w, back)
			}
		}
	})
}

func BenchmarkLoadRowF16(b *testing.B) {
	src := make([]byte, 2*4096)
	dst := make([]float32, 4096)
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		layout.LoadRowF32(dst, layout.F16, src)
	}
}

func BenchmarkStoreRowE4M3(b *testing.B) {
	src := make([]float32, 4096)
	for i := range src {
		src[i] = float32(i) * 0.01
	}
	dst := make([]byte, 4096)
	b.SetBytes(int64(len(dst)))
	b.ReportAllocs()
	for b.Loop() {
		layout.StoreRowF32(dst, layout.E4M3, src)
	}
}

func TestStoreRowF32Sat(t *testing.T) {
	src := []float32{0, 1e9, -1e9, float32(math.Inf(1)), float32(math.NaN()), 3.3, -0.001}
	for _, dt := range []layout.DType{layout.E4M3, layout.E5M2, layout.F16} {
		got := make([]byte, len(src)*dt.Size())
		layout.StoreRowF32Sat(got, dt, src)
		for i, v := range src {
			var want uint32
			switch dt {
			case layout.E4M3:
				want = uint32(layout.F32ToE4M3Sat(v))
			case layout.E5M2:
				want = uint32(layout.F32ToE5M2Sat(v))
			default:
				want = uint32(layout.F32ToF16(v)) // no saturating form: as StoreRowF32
			}
			have := uint32(got[i*dt.Size()])
			if dt.Size() == 2 {
				have |= uint32(got[i*2+1]) << 8
			}
			assert.Equal(t, want, have, "%v(%v)", dt, v)
		}
	}
}
