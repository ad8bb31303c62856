package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/internal/invariants"
)

// Every eviction policy runs the built-in workload under pressure (eviction
// and preemption happen) with verified attention and audits; a bad name is
// refused with the name in the message.
func TestSimulateEvictionPolicies(t *testing.T) {
	requests := "30"
	if invariants.Enabled {
		requests = "22"
	}
	for _, policy := range evict.Names() {
		var out, errb bytes.Buffer
		args := append([]string{"--eviction", policy, "--requests", requests}, smallModel...)
		require.Equal(t, exitOK, run(append([]string{"simulate"}, args...), &out, &errb), "%s: %s", policy, errb.String())
		require.Contains(t, summaryField(t, out.String(), "verification"), "passed", policy)
		require.NotRegexp(t, `^0 pages evicted`, summaryField(t, out.String(), "evictions"), policy)
	}
	var out, errb bytes.Buffer
	require.Equal(t, exitUsage, run([]string{"simulate", "--eviction", "bogus"}, &out, &errb))
	require.Contains(t, errb.String(), `unknown eviction policy "bogus"`)
}
