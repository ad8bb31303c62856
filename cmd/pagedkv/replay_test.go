package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
		{[]string{"--trace", conversationTrace, "--hint-accuracy", "90,0"}, `accuracy "0"`},
		{[]string{"--trace", conversationTrace, "--hint-horizon", "-1"}, "--hint-horizon -1"},
		{[]string{"--trace", conversationTrace, "--curve-rate", "200"}, "--curve-rate 200"},
		{[]string{"--trace", conversationTrace, "--policies", "lru,mru"}, `"mru"`},
		{[]string{"--trace", conversationTrace, "--format", "csv"}, `--format "csv"`},
		{[]string{"--trace", conversationTrace, "--plot", "a.jpg"}, `--plot "a.jpg"`},
		{[]string{"--trace", conversationTrace, "--first", "-1"}, "--first -1"},
		{[]string{"--trace", conversationTrace, "--page-tokens", "0"}, `"0"`},
		{[]string{"--trace", conversationTrace, "--first", "10", "--replicas", "-3"}, "--replicas -3: want 1..1024"},
		{[]string{"--trace", conversationTrace, "--redis", "127.0.0.1:1"}, "--redis needs --host-capacity"},
		{[]string{"--trace", conversationTrace, "--first", "5", "--model", "gpt-5"}, `unknown model: "gpt-5"`},
		{[]string{"--trace", conversationTrace, "--first", "5", "--model", "qwen3-next-like", "--state-checkpoint-every", "-1"}, "--state-checkpoint-every -1"},
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

	// A model with state groups reports the pages its checkpoints held.
	out.Reset()
	require.Equal(t, exitOK, run([]string{"replay", "--trace", conversationTrace, "--first", "40", "--capacities", "50", "--policies", "lru",
		"--model", "qwen3-next-like", "--state-checkpoint-every", "2"}, &out, &errb), errb.String())
	require.Regexp(t, `state checkpoints \(every 2 pages, at prompt ends and junctions\), peak pool pages held: 50% lru [1-9]\d* \(`, out.String())

	// Its default interval is 8 pages; 0 turns it off.
	for flagValue, want := range map[string]string{"": "every 8 pages, at prompt ends and junctions", "0": "at prompt ends and junctions only"} {
		out.Reset()
		args := []string{"replay", "--trace", conversationTrace, "--first", "40", "--capacities", "50", "--policies", "lru", "--model", "qwen3-next-like"}
		if flagValue != "" {
			args = append(args, "--state-checkpoint-every", flagValue)
		}
		require.Equal(t, exitOK, run(args, &out, &errb), errb.String())
		require.Contains(t, out.String(), "state checkpoints ("+want+")")
	}
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

// Totals, not only per-item limits: each of these asked for minutes of
// work or more memory than the machine has (issue 35: --service on 16
// requests of 2^20 output tokens ran past 30 s and died out of memory,
// --replicas 100000 died out of memory in 3.6 s, a --plot path that
// cannot be written failed only after the sweep); each is refused at once
// (before any work: the test takes milliseconds), with exit 2 and one line
// naming the value and the limit.
func TestReplayRefusesHostileTotals(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, "long.jsonl")
	var b strings.Builder
	for i := range 16 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 512, "output_length": 1048576, "hash_ids": [%d]}`+"\n", i, i)
	}
	require.NoError(t, os.WriteFile(long, []byte(b.String()), 0o644))
	many := strings.TrimSuffix(strings.Repeat("lru,", 5000), ",")
	caps := strings.TrimSuffix(strings.Repeat("1,", 5000), ",")
	missing := filepath.Join(dir, "no", "such", "dir", "hits.svg")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--trace", long, "--service"}, []string{"21497303360 units of work", "over the limit of 17179869184", "--max-work"}},
		{[]string{"--trace", long, "--replicas", "100000"}, []string{"--replicas 100000: want 1..1024"}},
		// The whole trace, no --first: a sweep would take minutes.
		{[]string{"--trace", conversationTrace, "--plot", missing}, []string{`--plot "` + missing + `"`, "no such file or directory"}},
		{[]string{"--trace", long, "--replicas", "1024", "--capacities", "100"}, []string{"1024 replicas × 2050 pages × 512 tokens", "over the limit of 536870912"}},
		{[]string{"--trace", long, "--policies", many, "--capacities", caps}, []string{"× 5000 capacities × 5000 policies", "over the limit of 17179869184"}},
		{[]string{"--trace", long, "--service", "--max-batch", "1099511627776"}, []string{"MaxBatch 1099511627776, want 1..65536"}},
		{[]string{"--trace", long, "--max-work", "0"}, []string{"--max-work 0: want >= 1"}},
		{[]string{"--trace", sharedPrefixTrace, "--format", "sim", "--block-tokens", "1073741824", "--service"}, []string{"block of 1073741824 tokens, want 1..65536"}},
		{[]string{"--trace", long, "--max-work", "100000"}, []string{"16 requests", "over the limit of 100000"}},
	} {
		start := time.Now()
		var out, errb bytes.Buffer
		code := run(append([]string{"replay"}, c.args...), &out, &errb)
		require.Equal(t, exitUsage, code, "%.80v: %s", c.args, errb.String())
		require.Len(t, strings.Split(strings.TrimSpace(errb.String()), "\n"), 1, "%.80v: one line: %s", c.args, errb.String())
		for _, w := range c.want {
			require.Contains(t, errb.String(), w, "%.80v", c.args)
		}
		require.Empty(t, out.String())
		t.Logf("%.60v: refused in %v", c.args, time.Since(start))
	}
	_, err := os.Stat(filepath.Join(dir, "no"))
	require.ErrorIs(t, err, os.ErrNotExist)

	// A plot file the refused run created is removed again; an existing
	// one keeps its bytes.
	plot := filepath.Join(dir, "hits.svg")
	var out, errb bytes.Buffer
	require.Equal(t, exitUsage, run([]string{"replay", "--trace", long, "--service", "--plot", plot}, &out, &errb))
	_, err = os.Stat(plot)
	require.ErrorIs(t, err, os.ErrNotExist, "the refused run left its plot file")
	require.NoError(t, os.WriteFile(plot, []byte("an earlier plot"), 0o644))
	require.Equal(t, exitUsage, run([]string{"replay", "--trace", long, "--service", "--plot", plot}, &out, &errb))
	got, err := os.ReadFile(plot)
	require.NoError(t, err)
	require.Equal(t, "an earlier plot", string(got))
}
