package cpu

import (
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv/kernels/kernelstest"
)

// The audit's crafted tables (a wrapping kv_indptr, int32 extremes) on one
// and on several workers: a rejected call, never a panic in a worker
// goroutine or a write into another request's page.
func TestHostileIndices(t *testing.T) {
	for name, b := range backends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestHostileIndices(t, b) })
	}
}

func TestRawSeedsRoundTrip(t *testing.T) {
	for i, s := range kernelstest.RawSeeds() {
		g, ix := kernelstest.DecodeRaw(s)
		if got := kernelstest.EncodeRaw(g, ix); string(got) != string(s) {
			t.Fatalf("seed %d does not round-trip: %v -> %v", i, s, got)
		}
	}
}

// FuzzCPURawIndices feeds raw index arrays (any lengths, any int32) into
// every paged operation of the CPU backend with three workers; see
// kernelstest.CheckRawIndices for the canary property.
func FuzzCPURawIndices(f *testing.F) {
	for _, s := range kernelstest.RawSeeds() {
		f.Add(s)
	}
	b := New(Config{Workers: 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		g, ix := kernelstest.DecodeRaw(data)
		if err := kernelstest.CheckRawIndices(b, g, ix); err != nil {
			t.Fatal(err)
		}
	})
}

// A panic in a worker (a bug: validation leaves callers nothing to panic
// on) reaches the caller's goroutine, where recover sees it, instead of
// ending the process from a goroutine nobody can recover.
func TestWorkerPanicReachesTheCaller(t *testing.T) {
	b := New(Config{Workers: 4})
	var got any
	func() {
		defer func() { got = recover() }()
		b.parallelFor(64, func(i int) {
			if i == 37 {
				panic("task 37")
			}
		})
	}()
	if s, _ := got.(string); !strings.Contains(s, "task 37") {
		t.Fatalf("recovered %v, want the worker's panic", got)
	}
}
