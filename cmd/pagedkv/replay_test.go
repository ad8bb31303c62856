package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/internal/redistest"
)

const conversationTrace = "../../testdata/traces/mooncake_conversation_trace.jsonl.gz"

// The CLI prints every policy and Belady at every capacity, the unlimited
// line, and writes the plot.
func TestReplayCommand(t *testing.T) {
	// Under -race (invariants on: the Manager checks itself after every
	// call) a shorter prefix of the trace.
	first := "800"
	if invariants.Enabled {
		first = "120"
	}
	plot := filepath.Join(t.TempDir(), "hits.svg")
	var out, errb bytes.Buffer
	code := run([]string{"replay", "--trace", conversationTrace, "--first", first, "--capacities", "5,25", "--plot", plot}, &out, &errb)
	require.Equal(t, exitOK, code, errb.String())
	for _, c := range []string{"5%", "25%"} {
		for _, p := range []string{"lru", "slru", "srrip", "belady"} {
			require.Regexp(t, `(?m)^\s+`+c+`\s+\d+\s+`+p+`\s+\d+\.\d%`, out.String())
		}
	}
	require.Contains(t, out.String(), "unlimited capacity: ")
	require.Contains(t, out.String(), "trace: "+first+" requests")
	fi, err := os.Stat(plot)
	require.NoError(t, err)
	require.Greater(t, fi.Size(), int64(5000))

	out.Reset()
	code = run([]string{"replay", "--trace", conversationTrace, "--first", "40", "--capacities", "10", "--service", "--policies", "lru"}, &out, &errb)
	require.Equal(t, exitOK, code, errb.String())
	require.Contains(t, out.String(), "mode: service model")

	out.Reset()
	code = run([]string{"replay", "--trace", conversationTrace, "--first", "100", "--capacities", "10", "--model", "gpt-oss-like", "--policies", "lru"}, &out, &errb)
	require.Equal(t, exitOK, code, errb.String())
	require.Regexp(t, `(?m)^\s+10%\s+\d+\s+lru\s+\d+\.\d%`, out.String())

	out.Reset()
	code = run([]string{"replay", "--trace", conversationTrace, "--first", "60", "--capacities", "1", "--replicas", "3"}, &out, &errb)
	require.Equal(t, exitOK, code, errb.String())
	for _, r := range []string{"prefix", "round-robin", "least-loaded"} {
		require.Regexp(t, `(?m)^\s*`+r+`\s+\d+\.\d%\s+\d+/\d+/\d+`, out.String())
	}
}

func TestReplayRefusesBadFlagsByName(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--trace is required"},
		{[]string{"--trace", conversationTrace, "--capacities", "0"}, `capacity "0"`},
		{[]string{"--trace", conversationTrace, "--capacities", "5,x"}, `capacity "x"`},
		{[]string{"--trace", conversationTrace, "--policies", "lru,mru"}, `"mru"`},
		{[]string{"--trace", conversationTrace, "--format", "csv"}, `--format "csv"`},
		{[]string{"--trace", conversationTrace, "--plot", "a.jpg"}, `--plot "a.jpg"`},
		{[]string{"--trace", conversationTrace, "--first", "-1"}, "--first -1"},
		{[]string{"--trace", conversationTrace, "--page-tokens", "0"}, `"0"`},
		{[]string{"--trace", conversationTrace, "--first", "10", "--replicas", "-3"}, "-3 replicas"},
		{[]string{"--trace", conversationTrace, "--redis", "127.0.0.1:1"}, "--redis needs --host-capacity"},
		{[]string{"--trace", conversationTrace, "--first", "5", "--model", "gpt-5"}, `unknown model: "gpt-5"`},
		{[]string{"--trace", "no/such/file"}, "no/such/file"},
		{[]string{"--trace", sharedPrefixTrace}, "line 1"}, // a sim trace read as Mooncake
	} {
		var out, errb bytes.Buffer
		require.Equal(t, exitUsage, run(append([]string{"replay"}, c.args...), &out, &errb), "%v", c.args)
		require.Contains(t, errb.String(), c.want, "%v", c.args)
	}
	var out, errb bytes.Buffer
	require.Equal(t, exitOK, run([]string{"replay", "--trace", sharedPrefixTrace, "--format", "sim", "--capacities", "50,100"}, &out, &errb), errb.String())
	require.Contains(t, out.String(), "trace: 8 requests")
}

// --redis puts a real redis-server below the host tier: the tier table
// reports remote hits.
func TestReplayRedisTier(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "16mb", "--maxmemory-policy", "allkeys-lru")
	var out, errb bytes.Buffer
	code := run([]string{"replay", "--trace", conversationTrace, "--first", "600", "--capacities", "2", "--policies", "lru",
		"--host-capacity", "2", "--redis", srv.Addr()}, &out, &errb)
	require.Equal(t, exitOK, code, errb.String())
	m := regexp.MustCompile(`(?m)^\s+2%\s+lru\s+\d+\.\d%\s+\d+\.\d%\s+(\d+\.\d)%`).FindStringSubmatch(out.String())
	require.NotNil(t, m, "no tier line in\n%s", out.String())
	require.NotEqual(t, "0.0", m[1], "no remote hit")
}
