package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
)

func TestSimulateHostTier(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--requests", "16", "--pages", "24", "--host-pages", "48", "--quiet"}, smallModel...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Regexp(t, `^48 pages \(.*\); \d+ prompt tokens served from host; offloaded [1-9]\d* pages \(.* device->host\), onloaded \d+ \(.* host->device\); \d+ evicted pages dropped, \d+ offloads skipped \(host full\)$`,
		summaryField(t, out, "host tier"))
	assert.Regexp(t, `, tier copies \S+, total \S+$`, summaryField(t, out, "time/step"))
	assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))
	assert.NotContains(t, out, "remote tier:")
}

// Two runs against one real server (which the test starts: simulate starts
// nothing): the second is served from Redis.
func TestSimulateRedis(t *testing.T) {
	srv := redistest.Start(t)
	remote := redisRuns(t, append([]string{"simulate", "--requests", "12", "--pages", "32", "--host-pages", "32", "--redis", srv.Addr(),
		"--redis-deadline", "5s", "--quiet"}, smallModel...))
	// The first run may be served pages it stored itself (evicted, then
	// reclaimed from its host tier); the second starts with all of them.
	assert.Regexp(t, `; [1-9]\d* pages stored`, remote[0])
	assert.Regexp(t, `^[1-9]\d* prompt tokens served from the store .* errors \d+ \(\d+ timeouts\), 0 values rejected$`, remote[1])
	served := func(s string) int {
		n, err := strconv.Atoi(s[:strings.IndexByte(s, ' ')])
		require.NoError(t, err)
		return n
	}
	assert.Greater(t, served(remote[1]), served(remote[0]))
}

// redisRuns runs args twice (against one Redis server): both must pass
// verification; it returns their remote tier lines.
func redisRuns(t *testing.T, args []string) []string {
	var remote []string
	for range 2 {
		code, out, errOut := runCLI(args...)
		require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
		remote = append(remote, summaryField(t, out, "remote tier"))
		assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))
	}
	return remote
}

func TestSimulateTierFlagsRejected(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--redis", "127.0.0.1:1"}, "--redis needs --host-pages"},
		{[]string{"--host-pages", "-1"}, "--host-pages: -1 is negative"},
		{[]string{"--host-pages", "8", "--redis", "no-port"}, `--redis: address "no-port"`},
		{[]string{"--host-pages", "8", "--redis-deadline", "-1s"}, "--redis-deadline: -1s is negative"},
	} {
		code, _, errOut := runCLI(append([]string{"simulate", "--quiet"}, c.args...)...)
		assert.Equal(t, exitUsage, code, strings.Join(c.args, " "))
		assert.Contains(t, errOut, c.msg)
	}
}

// --disaggregated: a prefill and a decode side over loopback, compared
// with a single-process run.
func TestSimulateDisaggregated(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--disaggregated", "--requests", "12", "--pages", "48", "--quiet"}, smallModel...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Regexp(t, `^[1-9]\d* requests handed off over loopback TCP \(HMAC-SHA256\), 0 refused, 0 already held; [1-9]\d* pages in [1-9]\d* descriptors`, summaryField(t, out, "handoff"))
	assert.Regexp(t, `tokens equal to the single-process run$`, summaryField(t, out, "decode side"))
	assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))

	// deepseek-v3.2-like: MLA pages hand off with their indexer pages.
	code, out, errOut = runCLI("simulate", "--disaggregated", "--model", "deepseek-v3.2-like", "--requests", "12", "--pages", "48", "--quiet")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Regexp(t, `^[1-9]\d* prompt tokens received as prefix hits .*tokens equal to the single-process run$`, summaryField(t, out, "decode side"))
	assert.Regexp(t, `\([1-9]\d* at positions a prefix hit served\)$`, summaryField(t, out, "mla, indexer"))
	assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))

	for _, bad := range [][]string{{"--replicas", "2"}, {"--model", "gemma-3-like"}, {"--window", "32"}} {
		code, _, errOut = runCLI(append([]string{"simulate", "--disaggregated", "--requests", "4", "--quiet"}, bad...)...)
		assert.Equal(t, exitUsage, code, "%v: %s", bad, errOut)
		assert.Contains(t, errOut, "disaggregated", "%v", bad)
	}
}

// TestSimulateModelTiers: hybrid presets with a host tier, and over a real
// Redis (two runs, the second served from the store): the groups' pages
// go down and come back through the tier copies, and every group's
// attention verifies.
func TestSimulateModelTiers(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--model", "gpt-oss-like", "--requests", "12", "--pages", "48", "--host-pages", "64"}, smallHybrid...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Regexp(t, `^64 pages \(.*\); [1-9]\d* prompt tokens served from host; offloaded [1-9]\d* pages \(.* device->host\), onloaded [1-9]\d* \(.* host->device\)`,
		summaryField(t, out, "host tier"))
	assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))

	srv := redistest.Start(t)
	remote := redisRuns(t, append([]string{"simulate", "--model", "llama-4-like", "--requests", "8", "--pages", "64", "--host-pages", "16",
		"--redis", srv.Addr(), "--redis-deadline", "5s"}, smallHybrid...))
	assert.Regexp(t, `; [1-9]\d* pages stored`, remote[0])
	assert.Regexp(t, `^[1-9]\d* prompt tokens served from the store `, remote[1])
}
