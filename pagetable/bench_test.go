package pagetable_test

import (
	"testing"
)

// The decode benchmarks use 256 sequences of 4096 tokens with page size 16
// (256 pages each, 65536 in all).
const benchSeqs, benchTokens, benchPageSize = 256, 4096, 16

// benchmarkSteps runs a decode step per iteration and rewinds the batch
// every rewindEvery steps (outside the timer), so sequences stay near 4k.
func newBenchBatch(b *testing.B) *decodeBatch {
	const rewindEvery = 1024
	d := newDecodeBatch(b, benchSeqs, benchTokens, benchPageSize, benchSeqs*(benchTokens+2*rewindEvery)/benchPageSize+benchSeqs)
	for range rewindEvery { // grow buffers and page lists
		if err := d.step(); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.rewind(); err != nil {
		b.Fatal(err)
	}
	return d
}

// exportBytes is what ExportTo writes for the batch: KVIndptr, KVPageIndices,
// KVLastPageLen and SeqLens, 4 bytes per element.
func exportBytes(d *decodeBatch) int64 {
	return 4 * int64(len(d.csr.KVIndptr)+len(d.csr.KVPageIndices)+len(d.csr.KVLastPageLen)+len(d.csr.SeqLens))
}

// BenchmarkDecodeStep is one decode step for 256 requests: Reserve one slot
// each, ExportTo and ExportAppendTo. ns/request is the per-running-request
// cost (goal < 1000).
func BenchmarkDecodeStep(b *testing.B) {
	d := newBenchBatch(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%1024 == 1023 {
			b.StopTimer()
			if err := d.rewind(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if err := d.step(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchSeqs), "ns/request")
}

// BenchmarkExport compares ExportTo for the 256-request batch with a
// memmove of the same number of bytes (the physical limit of producing the
// arrays); both report MB/s via SetBytes.
func BenchmarkExport(b *testing.B) {
	d := newBenchBatch(b)
	if err := d.step(); err != nil {
		b.Fatal(err)
	}
	n := exportBytes(d)
	b.Run("ExportTo", func(b *testing.B) {
		b.SetBytes(n)
		b.ReportAllocs()
		for range b.N {
			if err := d.tab.ExportTo(&d.csr, d.ids); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("memmove", func(b *testing.B) {
		src := make([]int32, n/4)
		dst := make([]int32, n/4)
		b.SetBytes(n)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			copy(dst, src)
		}
	})
}

// BenchmarkReserve is the Reserve part of a decode step alone.
func BenchmarkReserve(b *testing.B) {
	d := newBenchBatch(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%1024 == 1023 {
			b.StopTimer()
			if err := d.rewind(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		var err error
		if d.ops, err = d.tab.Reserve(d.ops[:0], d.ids, d.ones); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchSeqs), "ns/request")
}
