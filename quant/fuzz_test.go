package quant_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/quant"
)

// FuzzQuantizeBound decodes a format (first byte) and a row of raw float32
// bit patterns (the rest), quantises and dequantises it, and checks the
// package's contract: scales and codes equal the exact model's, codes stay in
// [-qmax, qmax], NaN gives 0, and every element the error bound covers is
// within scale/2.
func FuzzQuantizeBound(f *testing.F) {
	f.Add([]byte{0x00, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xbf})                                  // int8 f16 g1: 1, -0.5
	f.Add([]byte{0x13, 0, 0, 0xc0, 0x7f, 0, 0, 0x80, 0x7f, 0, 0, 0x80, 0xff, 1, 0, 0, 0}) // int4 f32 g8: NaN, +inf, -inf, tiny
	f.Add([]byte{0x05, 0x6b, 0x80, 0xd4, 0x3e, 0x00, 0x00, 0x7f, 0x4b})                   // int8 f32 g2
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		sel := data[0]
		cfg := quant.Config{Bits: 8, Group: 1 << (sel >> 2 & 3), ScaleDType: layout.F16}
		if sel&1 != 0 {
			cfg.ScaleDType = layout.F32
		}
		if sel&2 != 0 {
			cfg.Bits = 4
		}
		raw := data[1:]
		n := min(len(raw)/4, 64)   // rows longer than a few groups add nothing but minimisation time
		n -= n % max(cfg.Group, 2) // whole groups, even for int4
		if n == 0 {
			return
		}
		if err := cfg.Validate(n); err != nil {
			t.Fatalf("%+v rejected n=%d: %v", cfg, n, err)
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		codes := make([]byte, cfg.CodeBytes(n))
		scales := make([]byte, cfg.ScaleBytes(n))
		y := make([]float32, n)
		cfg.Quantize(codes, scales, x)
		cfg.Dequantize(y, codes, scales)
		for g := 0; g < cfg.NumGroups(n); g++ {
			grp := x[g*cfg.Group : (g+1)*cfg.Group]
			if got, want := cfg.ScaleAt(scales, g), slowScale(cfg, grp); got != want {
				t.Fatalf("%+v group %v: scale %g, model %g", cfg, grp, got, want)
			}
		}
		for i, v := range x {
			c := cfg.CodeAt(codes, i)
			if c < -cfg.QMax() || c > cfg.QMax() {
				t.Fatalf("%+v x[%d]=%g: code %d outside +-%d", cfg, i, v, c, cfg.QMax())
			}
			if want := slowCode(v, cfg.ScaleAt(scales, i/cfg.Group), cfg.QMax()); c != want {
				t.Fatalf("%+v x[%d]=%g: code %d, model %d", cfg, i, v, c, want)
			}
		}
		checkBound(t, cfg, x, y, codes, scales)
	})
}
