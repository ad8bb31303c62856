//go:build cgo

package cpuemu

import (
	"testing"

	"github.com/pagedkv/pagedkv/kernels/kernelstest"
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
