package quant_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/quant"
)

// The benchmarks process one head row of 128 features (SetBytes counts the
// float32 input or output). Baselines in the same run: narrowing the row to
// f16 (what an unquantised f16 cache does per row) and a plain copy.

const benchDh = 128

func benchRow() []float32 {
	rng := rand.New(rand.NewPCG(7, 8))
	x := make([]float32, benchDh)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

func BenchmarkQuantize(b *testing.B) {
	x := benchRow()
	for _, cfg := range []quant.Config{int8F16, int4F16, {Bits: 8, Group: 128, ScaleDType: layout.F32}} {
		b.Run(fmt.Sprintf("int%d-g%d-%v", cfg.Bits, cfg.Group, cfg.ScaleDType), func(b *testing.B) {
			codes, scales := make([]byte, cfg.CodeBytes(benchDh)), make([]byte, cfg.ScaleBytes(benchDh))
			b.SetBytes(4 * benchDh)
			b.ReportAllocs()
			for b.Loop() {
				cfg.Quantize(codes, scales, x)
			}
		})
	}
	b.Run("baseline-f16-narrow", func(b *testing.B) {
		dst := make([]byte, 2*benchDh)
		b.SetBytes(4 * benchDh)
		b.ReportAllocs()
		for b.Loop() {
			layout.StoreRowF32(dst, layout.F16, x)
		}
	})
	b.Run("baseline-copy", func(b *testing.B) {
		dst := make([]float32, benchDh)
		b.SetBytes(4 * benchDh)
		b.ReportAllocs()
		for b.Loop() {
			copy(dst, x)
		}
	})
}

func BenchmarkDequantize(b *testing.B) {
	x := benchRow()
	y := make([]float32, benchDh)
	for _, cfg := range []quant.Config{int8F16, int4F16} {
		b.Run(fmt.Sprintf("int%d-g%d-%v", cfg.Bits, cfg.Group, cfg.ScaleDType), func(b *testing.B) {
			codes, scales := make([]byte, cfg.CodeBytes(benchDh)), make([]byte, cfg.ScaleBytes(benchDh))
			cfg.Quantize(codes, scales, x)
			b.SetBytes(4 * benchDh)
			b.ReportAllocs()
			for b.Loop() {
				cfg.Dequantize(y, codes, scales)
			}
		})
	}
	b.Run("baseline-f16-widen", func(b *testing.B) {
		src := make([]byte, 2*benchDh)
		layout.StoreRowF32(src, layout.F16, x)
		b.SetBytes(4 * benchDh)
		b.ReportAllocs()
		for b.Loop() {
			layout.LoadRowF32(y, layout.F16, src)
		}
	})
}
