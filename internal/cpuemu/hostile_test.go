//go:build cgo

package cpuemu

import (
	"testing"

	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// The audit's crafted tables through the CUDA launch path on the emulated
// device: rejected on the host before any launch, nothing written.
func TestHostileIndices(t *testing.T) { kernelstest.TestHostileIndices(t, New(Config{})) }

// FuzzEmuRawIndices feeds raw index arrays (any lengths, any int32) into
// every paged operation of the CUDA launch path on the emulated device; see
// kernelstest.CheckRawIndices for the canary property.
func FuzzEmuRawIndices(f *testing.F) {
	for _, s := range kernelstest.RawSeeds() {
		f.Add(s)
	}
	b := New(Config{})
	f.Fuzz(func(t *testing.T, data []byte) {
		g, ix := kernelstest.DecodeRaw(data)
		if err := kernelstest.CheckRawIndices(b, g, ix); err != nil {
			t.Fatal(err)
		}
	})
}

// TestHostileIndicesTiledPrefill is the audit's tables on a geometry the
// tiled tensor-core prefill takes (f16, head_dim 64), plus valid but odd
// tables (a page named twice, requests without pages or without queries,
// more queries than keys): the rejected ones launch nothing, the accepted
// ones run the tiled kernel, and the canaries hold either way.
func TestHostileIndicesTiledPrefill(t *testing.T) {
	cd := &cuda.CountingDriver{Driver: NewDriver(0), Record: true}
	b := cuda.NewWithDriver("emu", cd, cuda.Config{})
	g := kernelstest.RawGeometry{Layout: layout.HND, Form: layout.Split, DType: layout.F16, NumPages: 4, PageSize: 4,
		NumKVHeads: 2, Group: 2, HeadDim: 64, HeadDimCKV: 8, HeadDimKPE: 4}
	odd := []kernelstest.RawIndices{
		{KVIndptr: []int32{0, 3, 3, 4}, KVPageIndices: []int32{1, 1, 3, 0}, KVLastPageLen: []int32{2, 0, 4}, QOIndptr: []int32{0, 5, 7, 7}},
		{KVIndptr: []int32{0, 1}, KVPageIndices: []int32{2}, KVLastPageLen: []int32{1}, QOIndptr: []int32{0, 9}},
	}
	for i, ix := range append(kernelstest.HostileTables(), odd...) {
		if err := kernelstest.CheckRawIndices(b, g, ix); err != nil {
			t.Fatalf("table %d: %v", i, err)
		}
	}
	tiled := 0
	for _, l := range cd.Launches() {
		if l.Kernel == "batch_prefill_paged_f16_d64" {
			tiled++
		}
	}
	if tiled != len(odd) {
		t.Fatalf("%d tiled prefill launches, want one per accepted table (%d)", tiled, len(odd))
	}
}
