//go:build cgo

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The acceptance run on the emulated CUDA backend: the ops the kernels
// implement pass on emu itself; the others fail as unsupported, or pass on
// the CPU when --fallback cpu is given.
func TestVerifyShippedCasesOnEmu(t *testing.T) {
	code, out, _ := runCLI("verify", "--backend", "emu", shippedDir)
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, out, "FAIL batch_prefill_paged_0_00: unsupported on emu: ")
	assert.Contains(t, out, "FAIL merge_state_0_00: unsupported on emu: ")
	assert.Contains(t, out, "verify: 34 passed, 16 failed")

	code, out, _ = runCLI("verify", "--backend", "emu", "--fallback", "cpu", shippedDir)
	assert.Equal(t, exitOK, code, out)
	assert.Contains(t, out, "verify: 50 passed, 0 failed")
	assert.Equal(t, 16, strings.Count(out, " (cpu fallback) "))
	assert.Regexp(t, `(?m)^PASS batch_decode_0_00 max_abs=`, out)
	assert.Regexp(t, `(?m)^PASS append_paged_mla_kv_cache_0_01 max_abs=0 max_rel=0$`, out)
	assert.Regexp(t, `(?m)^PASS mla_decode_0_00 \(cpu fallback\) max_abs=`, out)
}
