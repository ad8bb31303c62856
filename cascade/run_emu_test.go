//go:build cgo

package cascade

import (
	"testing"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/cuda"
)

// Cascade attention with 2, 3 and 4 levels on the device path (the CUDA
// kernels on the emulated device) equals flat attention, as on the CPU:
// once as Run over the device backend (every level's prefill and every
// merge_state a device launch), once as one device step that plans every
// level in a single upload and merges the levels on the device.
func TestCascadeEqualsFlatOnDevice(t *testing.T) {
	flat := cpu.New(cpu.Config{Workers: 2})
	for _, split := range []int{0, 3} {
		dev := cpuemu.NewDevice(cpuemu.Config{MaxChunkTokens: split})
		t.Run("Run", func(t *testing.T) {
			checkCascadeEqualsFlat(t, 8, flat, func(p *Params) error { return Run(dev, p) })
		})
		t.Run("Step", func(t *testing.T) {
			checkCascadeEqualsFlat(t, 8, flat, func(p *Params) error {
				if err := p.Validate(); err != nil {
					return err
				}
				levels := make([]cuda.Level, len(p.Levels))
				for i, lv := range p.Levels {
					levels[i] = cuda.Level{QOIndptr: lv.QOIndptr, KVIndptr: lv.KVIndptr, KVIndices: lv.KVIndices, KVLastPageLen: lv.KVLastPageLen}
				}
				return dev.CascadeLevels(levels, p.Q, &p.Cache, p.Causal, p.AttentionParams, p.O, p.LSE)
			})
		})
	}
}
