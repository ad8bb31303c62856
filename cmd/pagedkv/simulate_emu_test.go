//go:build cgo

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSimulateOnEmuDeviceResident runs the shared-prefix trace with
// cascades forced (2- and 3-level steps) and copy-on-write on the emulated
// CUDA backend, whose caches stay in device memory for the whole run: it
// verifies exactly as the CPU run does (same steps, cascades, checked
// outputs and paged K/V rows) and reports the bytes each step moved, none
// of them cache bytes, and the host time of its plans and launches.
func TestSimulateOnEmuDeviceResident(t *testing.T) {
	args := append([]string{"simulate", "--trace", sharedPrefixTrace, "--cascade-min-saved", "1", "--verify-every", "1", "--quiet"}, smallModel...)
	outs := map[string]string{}
	for _, be := range []string{"cpu", "emu"} {
		code, out, errOut := runCLI(append(args, "--backend", be)...)
		require.Equal(t, exitOK, code, "%s stdout:\n%s\nstderr:\n%s", be, out, errOut)
		outs[be] = out
	}
	for _, f := range []string{"requests", "steps", "prefix hits", "copy-on-write", "cascade", "verification"} {
		assert.Equal(t, summaryField(t, outs["cpu"], f), summaryField(t, outs["emu"], f), f)
	}
	assert.Regexp(t, `^7 steps \(2 levels: \d+, 3 levels: \d+\)`, summaryField(t, outs["emu"], "cascade"))
	assert.Regexp(t, `^\S+ \S+ per step: index arrays \S+ \S+, activations \S+ \S+ \(k/v/q up, o down, 2 layers\), cache 0 B; `,
		summaryField(t, outs["emu"], "device bytes"))
	assert.NotContains(t, outs["cpu"], "device bytes:")
	assert.Regexp(t, `^\S+ per step: plan \S+, append and attention calls \S+ \(2 layers; `, summaryField(t, outs["emu"], "device host"))
	assert.NotContains(t, outs["cpu"], "device host:")
}

// TestSimulateModelDeviceBackend: hybrid models run on host backends; the
// device-resident one is a flag error.
func TestSimulateModelDeviceBackend(t *testing.T) {
	code, _, errOut := runCLI("simulate", "--quiet", "--model", "gpt-oss-like", "--backend", "emu")
	assert.Equal(t, exitUsage, code, errOut)
	assert.Contains(t, errOut, "--backend emu is not supported with --model gpt-oss-like")
}
