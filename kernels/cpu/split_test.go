package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv/kernels/kernelstest"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// TestSplitDecodeMatchesOneWorker: a decode of few long requests on four
// workers is split into page ranges whose partial states are merged; it
// must give what one worker (no split) gives, with and without a window,
// with and without attention sinks (random, of the weight of ~150-8000
// keys: a sink counted once per split would move O far off).
func TestSplitDecodeMatchesOneWorker(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 1))
	for _, window := range []int{-1, 700, 5} {
		for _, sinks := range [][]float32{nil, kernelstest.RandomSinks(rng, 8)} {
			testSplitDecode(t, window, sinks)
		}
	}
}

func testSplitDecode(t *testing.T, window int, sinks []float32) {
	t.Helper()
	bench := newDecodeBench(t, 2, 1000+window, 8, 2, 64, 16)
	bench.p.WindowLeft = window
	for h := range sinks {
		sinks[h] += 4 // the 1000 keys' mass is ~e^7
	}
	bench.p.Sinks = sinks
	bench.p.O = kernels.NewTensor(layout.F32, 2, 8, 64)
	run := func(workers int) ([]float32, []float32) {
		be := New(Config{Workers: workers})
		if workers > 1 {
			j := newAttnJob(bench.p.Q, &bench.p.Cache, &bench.p.Table, &bench.p.AttentionParams, bench.p.O, bench.p.LSE)
			j.rowsPerTask = 1
			if s := be.decodeSplits(&j); s < 2 {
				t.Fatalf("workers=%d: %d splits, want a split decode", workers, s)
			}
		}
		if err := be.BatchDecode(bench.p); err != nil {
			t.Fatal(err)
		}
		o := make([]float32, 2*8*64)
		layout.LoadRowF32(o, layout.F32, bench.p.O.Data)
		return o, append([]float32(nil), bench.p.LSE...)
	}
	o1, l1 := run(1)
	o4, l4 := run(4)
	for i := range o1 {
		// !(d <= tol), not d > tol: a NaN on either side must fail.
		if !(math.Abs(float64(o4[i]-o1[i])) <= 1e-5*(1+math.Abs(float64(o1[i])))) {
			t.Fatalf("window %d sinks %v: O[%d] = %v split, %v on one worker", window, sinks, i, o4[i], o1[i])
		}
	}
	for i := range l1 {
		if l4[i] != l1[i] && !(math.Abs(float64(l4[i]-l1[i])) <= 1e-5*(1+math.Abs(float64(l1[i])))) { // -inf == -inf
			t.Fatalf("window %d sinks %v: LSE[%d] = %v split, %v on one worker", window, sinks, i, l4[i], l1[i])
		}
	}
}
