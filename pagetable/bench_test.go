package pagetable_test

import (
	"testing"
)

// The decode benchmarks use 256 sequences of 4096 tokens with page size 16
// (256 pages each, 65536 in all).
const benchSeqs, benchTokens, benchPageSize = 256, 4096, 16

// benchRewindEvery is how many steps a benchmark batch takes before
// timeSteps rewinds it to benchTokens tokens per sequence; its pool holds
// pages for twice that many.
const benchRewindEvery = 1024

// newBenchBatch builds the benchmark batch and runs benchRewindEvery steps
// once, so that its buffers and page lists have grown to their full size
// before any timing starts.
func newBenchBatch(b *testing.B) *decodeBatch {
	d := newDecodeBatch(b, benchSeqs, benchTokens, benchPageSize, benchSeqs*(benchTokens+2*benchRewindEvery)/benchPageSize+benchSeqs)
	for range benchRewindEvery { // grow buffers and page lists
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
	timeSteps(b, d, d.step)
}

// timeSteps times step b.N times on d, rewinding d (off the clock) every
// benchRewindEvery iterations so sequences stay near benchTokens, and
// reports allocations and ns/request.
func timeSteps(b *testing.B, d *decodeBatch, step func() error) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%benchRewindEvery == benchRewindEvery-1 {
			b.StopTimer()
			if err := d.rewind(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if err := step(); err != nil {
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
	timeSteps(b, d, func() error {
		var err error
		d.ops, err = d.tab.Reserve(d.ops[:0], d.ids, d.ones)
		return err
	})
}
