package ppl_test

import (
	"testing"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ppl"
)

// A decode step of 8 requests with 255 past tokens each, 8 kv heads of 128
// repeated twice, one layer of a 4-layer layout-2 cache with pages of 16.
const (
	benchB, benchPast, benchH, benchD, benchR, benchN = 8, 255, 8, 128, 2, 16
	benchPages                                        = (benchPast + 1 + benchN - 1) / benchN
)

func benchGeometry(storage string) ppl.Geometry {
	g := ppl.Geometry{Layout: ppl.LayoutL2THD, Mode: ppl.ModePageTable, NumLayers: 4, MaxTokens: benchB * benchPages * benchN,
		NumKVHeads: benchH, HeadDim: benchD, PageSize: benchN, NumRepeat: benchR}
	storages[storage](&g)
	return g
}

func benchAddressing() ppl.Addressing {
	a := ppl.Addressing{KVStarts: []int64{0}, MaxPages: benchPages}
	for b := 0; b < benchB; b++ {
		a.KVStarts = append(a.KVStarts, a.KVStarts[b]+benchPast+1)
		for j := 0; j < benchPages; j++ {
			a.CacheStarts = append(a.CacheStarts, int64((j*benchB+b)*benchN)) // requests interleaved page by page
		}
	}
	return a
}

// BenchmarkKeyValueCache is one decode step of the operator: store one
// token per request and gather every request's keys and values (f16
// outputs). SetBytes counts the output bytes; the baseline moves the same
// bytes with copy.
func BenchmarkKeyValueCache(b *testing.B) {
	outRows := benchB * (benchPast + 1)
	outBytes := int64(2 * outRows * benchH * benchR * benchD * 2)
	for _, storage := range []string{"f16", "int8-g4", "int4-g16"} {
		b.Run(storage, func(b *testing.B) {
			c, err := ppl.NewCache(benchGeometry(storage))
			if err != nil {
				b.Fatal(err)
			}
			sp := make([]int64, benchB)
			seq := []int64{0}
			for i := range sp {
				sp[i] = benchPast
				seq = append(seq, int64(i+1))
			}
			p := &ppl.KeyValueCacheParams{
				CurrentKey: kernels.NewTensor(layout.F16, benchB, benchH, benchD), CurrentValue: kernels.NewTensor(layout.F16, benchB, benchH, benchD),
				SeqStarts: seq, StartPos: sp, Addressing: benchAddressing(), LayerIdx: 2,
				Key: kernels.NewTensor(layout.F16, outRows, benchH*benchR, benchD), Value: kernels.NewTensor(layout.F16, outRows, benchH*benchR, benchD)}
			b.SetBytes(outBytes)
			b.ReportAllocs()
			for b.Loop() {
				if err := ppl.KeyValueCache(&c, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("baseline-memmove", func(b *testing.B) {
		src, dst := make([]byte, outBytes), make([]byte, outBytes)
		b.SetBytes(outBytes)
		b.ReportAllocs()
		for b.Loop() {
			copy(dst, src)
		}
	})
}

// BenchmarkDecode compares ppl.Decode over group-quantised and f16 caches
// with the cpu backend's batch decode over the same f16 layer in place (the
// FlashInfer path an engine would take for an unquantised layout-2 cache).
// SetBytes counts the K and V bytes an f16 cache holds for the batch.
func BenchmarkDecode(b *testing.B) {
	kvBytes := int64(2 * benchB * (benchPast + 1) * benchH * benchD * 2)
	a := benchAddressing()
	q := kernels.NewTensor(layout.F16, benchB, benchH*benchR, benchD)
	for _, storage := range []string{"f16", "int8-g4", "int4-g16"} {
		b.Run("ppl-"+storage, func(b *testing.B) {
			c, err := ppl.NewCache(benchGeometry(storage))
			if err != nil {
				b.Fatal(err)
			}
			p := &ppl.DecodeParams{Q: q, Addressing: a, LayerIdx: 1, O: kernels.NewTensor(layout.F16, benchB, benchH*benchR, benchD)}
			b.SetBytes(kvBytes)
			b.ReportAllocs()
			for b.Loop() {
				if err := ppl.Decode(&c, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("baseline-cpu-backend-f16-in-place", func(b *testing.B) {
		c, err := ppl.NewCache(benchGeometry("f16"))
		if err != nil {
			b.Fatal(err)
		}
		fi, err := c.FlashInferCache(1, benchN)
		if err != nil {
			b.Fatal(err)
		}
		var table kernels.PageTable
		if err := ppl.CSRFromPageTable(&table, &a, benchN); err != nil {
			b.Fatal(err)
		}
		p := &kernels.DecodeParams{Q: q, Cache: fi, Table: table,
			AttentionParams: kernels.AttentionParams{NumQOHeads: benchH * benchR, WindowLeft: -1},
			O:               kernels.NewTensor(layout.F16, benchB, benchH*benchR, benchD)}
		backend := cpu.New(cpu.Config{Workers: 1})
		b.SetBytes(kvBytes)
		b.ReportAllocs()
		for b.Loop() {
			if err := backend.BatchDecode(p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCSRFromPageTable converts the batch's page table per step (into
// reused buffers); the baseline copies the same number of int32 page ids.
func BenchmarkCSRFromPageTable(b *testing.B) {
	a := benchAddressing()
	var dst kernels.PageTable
	b.Run("convert", func(b *testing.B) {
		b.SetBytes(int64(4 * len(a.CacheStarts)))
		b.ReportAllocs()
		for b.Loop() {
			if err := ppl.CSRFromPageTable(&dst, &a, benchN); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-copy-int32", func(b *testing.B) {
		src, out := make([]int32, len(a.CacheStarts)), make([]int32, len(a.CacheStarts))
		b.SetBytes(int64(4 * len(a.CacheStarts)))
		b.ReportAllocs()
		for b.Loop() {
			copy(out, src)
		}
	})
}
