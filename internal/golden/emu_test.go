//go:build cgo

package golden

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels/cpu"
)

// TestShippedCasesOnEmu runs every shipped case on the CUDA kernels compiled
// for the CPU, through the device-resident path (every host-API call of
// the emulator backend uploads into device objects, plans a step and
// launches), once with the launcher's own split-k plan and once with decode
// and prefill forced into chunks of 7 keys (so the split-k merge kernel runs
// on every attention case). Every backend op must run on the emulator: the
// CPU fallback is there only to report which op would have fallen back.
func TestShippedCasesOnEmu(t *testing.T) {
	cases := shippedCases(t)
	for _, cfg := range []cpuemu.Config{{}, {MaxChunkTokens: 7}} {
		r := &Runner{Backend: cpuemu.New(cfg), Fallback: cpu.New(cpu.Config{})}
		for _, res := range runAll(t, r, cases) {
			if !ops[res.Op].backend {
				continue
			}
			assert.False(t, res.Fallback, "%s ran on the fallback: %s", res.Name, res)
			assert.Equal(t, "emu", res.Backend, res.Name)
		}
	}
}
