//go:build cgo

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The acceptance run on the emulated CUDA backend: every shipped case
// passes on emu itself, through the device-resident path; --fallback cpu
// is never taken.
func TestVerifyShippedCasesOnEmu(t *testing.T) {
	for _, args := range [][]string{
		{"verify", "--backend", "emu", shippedDir},
		{"verify", "--backend", "emu", "--fallback", "cpu", shippedDir},
	} {
		code, out, _ := runCLI(args...)
		assert.Equal(t, exitOK, code, out)
		assert.Contains(t, out, "verify: 51 passed, 0 failed")
		assert.Zero(t, strings.Count(out, " (cpu fallback) "), out)
		assert.Regexp(t, `(?m)^PASS batch_decode_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS batch_prefill_paged_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS merge_state_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS mla_decode_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS append_paged_mla_kv_cache_0_01 max_abs=0 max_rel=0$`, out)
	}
}
