//go:build cgo

package golden

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels/cpu"
)

// emuOps are the operations the emulated CUDA kernels implement; every
// other backend op must fall back to the CPU.
var emuOps = map[string]bool{"append_paged_kv_cache": true, "append_paged_mla_kv_cache": true, "batch_decode": true}

// TestShippedCasesOnEmu runs every shipped case on the CUDA kernels compiled
// for the CPU, with the CPU backend as fallback, once with the launcher's
// own split-k plan and once with decode forced into chunks of 7 keys (so
// the split-k merge kernel runs on every decode case).
func TestShippedCasesOnEmu(t *testing.T) {
	cases := shippedCases(t)
	for _, cfg := range []cpuemu.Config{{}, {MaxChunkTokens: 7}} {
		r := &Runner{Backend: cpuemu.New(cfg), Fallback: cpu.New(cpu.Config{})}
		for _, res := range runAll(t, r, cases) {
			if !ops[res.Op].backend {
				continue
			}
			if emuOps[res.Op] {
				assert.False(t, res.Fallback, "%s ran on the fallback: %s", res.Name, res)
				assert.Equal(t, "emu", res.Backend, res.Name)
			} else {
				assert.True(t, res.Fallback, "%s: emu claims to support %s", res.Name, res.Op)
			}
		}
	}
}
