//go:build cgo

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The acceptance run on the emulated CUDA backend: every shipped case
// passes on emu itself, through the device-resident path, the NVFP4 cases
// included (quantising append and dequantising decode in the CUDA
// kernels), with and without --fallback cpu, which then never runs.
func TestVerifyShippedCasesOnEmu(t *testing.T) {
	nvfp4 := []string{"batch_decode_nvfp4_py37_HND", "batch_decode_nvfp4_py37_NHD",
		"nvfp4_quantize_append_paged_kv_cache_py37_HND", "nvfp4_quantize_append_paged_kv_cache_py37_NHD"}
	for _, args := range [][]string{
		{"verify", "--backend", "emu", shippedDir},
		{"verify", "--backend", "emu", "--fallback", "cpu", shippedDir},
	} {
		code, out, _ := runCLI(args...)
		assert.Equal(t, exitOK, code, out)
		assert.Contains(t, out, "verify: 57 passed, 0 failed")
		assert.Equal(t, 0, strings.Count(out, "(cpu fallback)"), out)
		for _, n := range nvfp4 {
			assert.Regexp(t, `(?m)^PASS `+n+` max_abs=`, out)
		}
		assert.Regexp(t, `(?m)^PASS batch_decode_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS batch_prefill_paged_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS merge_state_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS mla_decode_0_00 max_abs=`, out)
		assert.Regexp(t, `(?m)^PASS append_paged_mla_kv_cache_0_01 max_abs=0 max_rel=0$`, out)
	}
}
