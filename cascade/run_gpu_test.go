//go:build cuda

package cascade

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/cuda"
)

// Cascade attention with 2, 3 and 4 levels on the GPU equals flat
// attention, as on the CPU and the emulator (TestCascadeEqualsFlatOnDevice):
// Run over the device backend, and one device step with every level and
// merge on the device. Run with: go test -tags cuda ./cascade (see
// docs/kernels.md); skips when the device does not exist.
func TestCascadeEqualsFlatOnGPU(t *testing.T) {
	flat := cpu.New(cpu.Config{Workers: 2})
	for _, split := range []int{0, 3} {
		dev, err := cuda.New(cuda.Config{MaxChunkTokens: split})
		if errors.Is(err, kernels.ErrNoDevice) {
			t.Skipf("no CUDA device: %v", err)
		}
		require.NoError(t, err)
		defer dev.Close()
		t.Run("Run", func(t *testing.T) {
			checkCascadeEqualsFlat(t, 8, flat, func(p *Params) error { return Run(dev, p) })
		})
		t.Run("Step", func(t *testing.T) {
			checkCascadeEqualsFlat(t, 8, flat, func(p *Params) error {
				if err := p.Validate(); err != nil {
					return err
				}
				return dev.CascadeLevels(p.Levels, p.Q, &p.Cache, p.Causal, p.AttentionParams, p.O, p.LSE)
			})
		})
	}
}
