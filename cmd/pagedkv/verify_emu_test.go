//go:build cgo

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The acceptance run on the emulated CUDA backend: every shipped case
// passes on emu itself, through the device-resident path, except the four
// NVFP4 cases, which the CUDA kernels decline (no e2m1 path yet, issue 37):
// without --fallback they fail as unsupported, with --fallback cpu exactly
// they run on the CPU backend.
func TestVerifyShippedCasesOnEmu(t *testing.T) {
	nvfp4 := []string{"batch_decode_nvfp4_py37_HND", "batch_decode_nvfp4_py37_NHD",
		"nvfp4_quantize_append_paged_kv_cache_py37_HND", "nvfp4_quantize_append_paged_kv_cache_py37_NHD"}
	for _, args := range [][]string{
		{"verify", "--backend", "emu", shippedDir},
		{"verify", "--backend", "emu", "--fallback", "cpu", shippedDir},
	} {
		code, out, _ := runCLI(args...)
		if len(args) == 4 { // no --fallback
			assert.Equal(t, exitFailure, code, out)
			assert.Contains(t, out, "verify: 53 passed, 4 failed")
			for _, n := range nvfp4 {
				assert.Contains(t, out, "FAIL "+n+": unsupported on emu: ")
			}
		} else {
			assert.Equal(t, exitOK, code, out)
			assert.Contains(t, out, "verify: 57 passed, 0 failed")
			assert.Equal(t, len(nvfp4), strings.Count(out, " (cpu fallback) "), out)
			for _, n := range nvfp4 {
				assert.Contains(t, out, "PASS "+n+" (cpu fallback) ")
			}
		}
		assert.Regexp(t, `(?m)^PASS batch_decode_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS batch_prefill_paged_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS merge_state_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS mla_decode_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS append_paged_mla_kv_cache_0_01 max_abs=0 max_rel=0$`, out)
	}
}
