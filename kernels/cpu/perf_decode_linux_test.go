package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/kernels"
)

// BenchmarkBatchDecodeCPUTime is BenchmarkBatchDecode's shape on one worker,
// timed in thread CPU time against a memmove of the same K/V bytes from the
// same cache, alternated with it (see BenchCPUTimeVs): op-cpu-MB/s is bytes
// of K/V read per CPU second.
func BenchmarkBatchDecodeCPUTime(b *testing.B) {
	const B, tokens, hq, hkv, d, pageSize = 32, 4096, 32, 8, 128, 16
	bench := newDecodeBench(b, B, tokens, hq, hkv, d, pageSize)
	b.Run(fmt.Sprintf("B=%d/Hq=%d/Hkv=%d/D=%d/L=%d/f16", B, hq, hkv, d, tokens), func(b *testing.B) {
		be := New(Config{Workers: 1})
		src := bench.p.Cache.Data[:bench.kvBytes]
		dst := make([]byte, len(src))
		BenchCPUTimeVs(b, bench.kvBytes, func() {
			if err := be.BatchDecode(bench.p); err != nil {
				b.Fatal(err)
			}
		}, func() { copy(dst, src) })
	})
}

// BenchmarkDecodeWorkersCPUTime is the decode shape of
// BenchmarkBatchDecodeCPUTime, and a long-sequence one (two requests of
// 64K tokens, split into page ranges), on one worker and on two, in thread
// CPU time per worker (so that other load on the machine does not count).
// speedup-vs-1 is the one-worker CPU time over the busiest worker's time
// with two: the speedup two dedicated cores would see. overhead-% is the
// two workers' total CPU time over the one worker's, minus 100.
func BenchmarkDecodeWorkersCPUTime(b *testing.B) {
	for _, shape := range []struct{ B, L int }{{32, 4096}, {2, 65536}} {
		const hq, hkv, d, pageSize = 32, 8, 128, 16
		bench := newDecodeBench(b, shape.B, shape.L, hq, hkv, d, pageSize)
		b.Run(fmt.Sprintf("B=%d/L=%d", shape.B, shape.L), func(b *testing.B) {
			one, two := New(Config{Workers: 1}), New(Config{Workers: 2})
			var t1, busiest, total2 float64
			for b.Loop() {
				c1 := workerCPU(b, one, bench.p)
				c2 := workerCPU(b, two, bench.p)
				t1 += c1[0]
				busiest += max(c2[0], c2[1])
				total2 += c2[0] + c2[1]
			}
			b.ReportMetric(t1/busiest, "speedup-vs-1")
			b.ReportMetric(100*total2/t1-100, "overhead-%")
			b.ReportMetric(t1/float64(b.N), "cpu1-ns")
		})
	}
}

// workerCPU runs one decode on be and returns each worker's thread CPU
// time in it (worker 0 is this goroutine, on a locked thread).
func workerCPU(b *testing.B, be *Backend, p *kernels.DecodeParams) [2]float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var start [2]time.Duration
	var spent [2]float64
	var mu sync.Mutex
	workerHook = func(w int, begin bool) {
		now := threadCPUTime()
		mu.Lock()
		defer mu.Unlock()
		if begin {
			start[w] = now
		} else {
			spent[w] += float64(now - start[w])
		}
	}
	defer func() { workerHook = nil }()
	if err := be.BatchDecode(p); err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return spent
}
