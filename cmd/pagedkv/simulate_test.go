package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
)

const sharedPrefixTrace = "../../testdata/traces/shared-prefix.jsonl"

// A smaller model than the default, for speed under -race.
var smallModel = []string{"--layers", "2", "--qo-heads", "4", "--kv-heads", "2", "--head-dim", "16"}

// corruptBackend is the CPU backend with a bug: every append's first row
// gets a wrong K value in the cache.
type corruptBackend struct{ kernels.Backend }

func (corruptBackend) Name() string { return "corrupt" }
func (c corruptBackend) AppendPagedKVCache(p *kernels.AppendParams) error {
	if err := c.Backend.AppendPagedKVCache(p); err != nil {
		return err
	}
	g := p.Cache.Geometry
	page, entry, err := p.Table.Locate(int(p.BatchIndices[0]), int(p.Positions[0]), g.PageSize)
	if err != nil {
		return err
	}
	off := g.KOffset(page, entry, 0, 0)
	if g.DType == layout.NVFP4 { // flip a magnitude bit of the first e2m1 code
		p.Cache.KBuf()[g.DataOffset(off)] ^= 0x02
		return nil
	}
	layout.StoreF32(g.DType, p.Cache.KBuf(), int(off), layout.LoadF32(g.DType, p.Cache.KBuf(), int(off))+0.25)
	return nil
}

func init() {
	registerBackend("corrupt-test", backendFactory{
		summary: "test only: cpu whose append corrupts one K value",
		open:    func() (kernels.Backend, error) { return corruptBackend{cpu.New(cpu.Config{})}, nil },
	})
}

// summaryField returns the value of the summary line "name: value".
func summaryField(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `:\s+(.*)$`).FindStringSubmatch(out)
	require.NotNil(t, m, "no %q line in\n%s", name, out)
	return m[1]
}

// TestSimulateTrace runs the shared-prefix trace; internal/sim's
// TestTraceSummary derives these numbers from the trace line by line:
// 514 prompt tokens, of which 64+32+48+16+64 = 224 are served from the
// cache, and 514-224 prompt + 22 decode tokens computed.
func TestSimulateTrace(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--trace", sharedPrefixTrace}, smallModel...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Equal(t, "8 (+2 parallel samples), 514 prompt tokens, 32 output tokens", summaryField(t, out, "requests"))
	assert.Equal(t, "224 of 514 prompt tokens (43.6%)", summaryField(t, out, "prefix hits"))
	// No preemption: every hit is one read from the device cache.
	assert.Regexp(t, `^224 tokens read \(device 224, host 0, disk 0, remote 0\), [1-9]\d* written$`, summaryField(t, out, "cache usage"))
	assert.Regexp(t, `^\d+, 312 tokens computed \(0 recomputed after preemption\)$`, summaryField(t, out, "steps"))
	assert.Equal(t, "0; 0 computed tokens lost, 0 of them found in the cache on resume", summaryField(t, out, "preemptions"))
	assert.Equal(t, "2 pages copied", summaryField(t, out, "copy-on-write"))
	assert.Regexp(t, `^passed: \d+ outputs in \d+ checked steps`, summaryField(t, out, "verification"))
	// Not a terminal: plain progress lines, the last when all are done.
	assert.Regexp(t, `simulate: step \d+: 10/10 requests finished, 0 running, 0 waiting \(0 preempted\)\n$`, errOut)
}

func TestSimulateBuiltIn(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--requests", "10", "--pages", "24", "--quiet"}, smallModel...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Empty(t, errOut, "--quiet prints no progress")
	for _, name := range []string{"requests", "model", "steps", "pages", "prefix hits", "prefix cache", "cache usage", "evictions",
		"preemptions", "copy-on-write", "cascade", "time/step", "wall time", "verification"} {
		summaryField(t, out, name)
	}
	assert.Regexp(t, `^[1-9]\d* pages evicted`, summaryField(t, out, "evictions"))
	assert.Regexp(t, `^[1-9]\d*;`, summaryField(t, out, "preemptions"))
	assert.Regexp(t, `\((\d\d|[1-9])\.\d%\)$`, summaryField(t, out, "prefix hits"))
	assert.Regexp(t, `^manager \S+, attention \S+, append \S+, model \S+, verification \S+, total \S+$`, summaryField(t, out, "time/step"))
	assert.Equal(t, "peak 24 of 24 in use by requests", summaryField(t, out, "pages"))
}

// TestSimulateDefault is README's first command as it is: the default
// workload and model. It takes seconds, so it runs without -race and
// -short only.
func TestSimulateDefault(t *testing.T) {
	if testing.Short() || invariants.Enabled {
		t.Skip("the full default run is for plain `go test` (it takes seconds)")
	}
	code, out, errOut := runCLI("simulate")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	t.Log("\n" + out)
	assert.Regexp(t, `^[1-9]\d* pages evicted`, summaryField(t, out, "evictions"))
	assert.Regexp(t, `^[1-9]\d*;`, summaryField(t, out, "preemptions"))
	assert.Regexp(t, `^[1-9]\d* steps \(`, summaryField(t, out, "cascade"))
	assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))
}

func TestSimulateWindow(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--requests", "12", "--pages", "32", "--window", "48", "--quiet"}, smallModel...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Regexp(t, `^48 tokens; [1-9]\d* pages released$`, summaryField(t, out, "window"))
	assert.Equal(t, "not used", summaryField(t, out, "cascade"))
}

func TestSimulateVerificationFails(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--trace", sharedPrefixTrace, "--backend", "corrupt-test", "--verify-every", "1", "--quiet"}, smallModel...)...)
	assert.Equal(t, exitFailure, code)
	assert.Regexp(t, `^FAILED: sim: verification failed at step \d+: request line \d+, layer \d+: paged K of token`, summaryField(t, out, "verification"))
	assert.Contains(t, errOut, "pagedkv simulate: sim: verification failed at step ")
}

// TestSimulateNVFP4 runs the shared-prefix trace with FlashInfer's NVFP4
// pages: K/V quantised on append, every held row compared bit for bit with
// quant.QuantizeNVFP4 of the model's row, outputs with float64 attention
// over the dequantised K/V; copy-on-write copies carry the scale pages.
func TestSimulateNVFP4(t *testing.T) {
	code, out, errOut := runCLI(append([]string{"simulate", "--trace", sharedPrefixTrace, "--kv-dtype", "nvfp4", "--quiet"}, smallModel...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Contains(t, summaryField(t, out, "model"), "f16 (cache nvfp4) NHD")
	assert.Equal(t, "2 pages copied", summaryField(t, out, "copy-on-write"))
	assert.Regexp(t, `^passed: [1-9]\d* outputs in \d+ checked steps.*; [1-9]\d* paged K/V rows bit-exact$`, summaryField(t, out, "verification"))

	code, out, _ = runCLI(append([]string{"simulate", "--trace", sharedPrefixTrace, "--kv-dtype", "nvfp4", "--backend", "corrupt-test", "--verify-every", "1", "--quiet"}, smallModel...)...)
	assert.Equal(t, exitFailure, code)
	assert.Regexp(t, `^FAILED: sim: verification failed at step \d+: request line \d+, layer \d+: paged K of token`, summaryField(t, out, "verification"))
}

func TestSimulateBadTraces(t *testing.T) {
	dir := t.TempDir()
	good := `{"prompt_len": 20, "output": 2}` + "\n"
	for _, tc := range []struct{ name, second, want string }{
		{"malformed", `{"prompt_len": 20, "output": 2`, "line 2: unexpected EOF"},
		{"negative", `{"prompt_len": -20, "output": 2}`, "line 2: prompt_len = -20, want 1..65536"},
		{"unknown", `{"prompt_len": 20, "output": 2, "temperature": 0.7}`, `line 2: json: unknown field "temperature"`},
	} {
		path := filepath.Join(dir, tc.name+".jsonl")
		require.NoError(t, os.WriteFile(path, []byte(good+tc.second+"\n"), 0o644))
		code, out, errOut := runCLI("simulate", "--trace", path)
		assert.Equal(t, exitUsage, code, tc.name)
		assert.Empty(t, out, tc.name)
		assert.Equal(t, "pagedkv simulate: "+path+": sim: bad trace: "+tc.want+"\n", errOut, tc.name)
	}
	code, _, errOut := runCLI("simulate", "--trace", filepath.Join(dir, "missing.jsonl"))
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "missing.jsonl: no such file")
}

func TestSimulateBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dtype", "e4m3"}, "dtype e4m3, want f16, bf16 or f32"},
		{[]string{"--dtype", "f64"}, `--dtype: layout: unknown dtype "f64"`},
		{[]string{"--kv-dtype", "e4m3"}, "kv dtype e4m3, want the dtype f16 or nvfp4"},
		{[]string{"--kv-dtype", "fp3"}, `--kv-dtype: layout: unknown dtype "fp3"`},
		{[]string{"--kv-dtype", "nvfp4", "--head-dim", "24"}, "kv dtype nvfp4 needs a head dim that is a multiple of 16, have 24"},
		{[]string{"--kv-layout", "XYZ"}, "--kv-layout: "},
		{[]string{"--pages", "0"}, "NumPages"},
		{[]string{"--qo-heads", "3"}, "qo heads = 3, want a positive multiple of kv heads 2"},
		{[]string{"--backend", "nope"}, `unknown backend "nope"`},
		{[]string{"--frobnicate"}, "flag provided but not defined: -frobnicate"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
	} {
		code, out, errOut := runCLI(append([]string{"simulate"}, tc.args...)...)
		assert.Equal(t, exitUsage, code, "%v", tc.args)
		assert.Empty(t, out, "%v", tc.args)
		assert.Contains(t, errOut, tc.want, "%v", tc.args)
	}
	code, out, _ := runCLI("help", "simulate")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "usage: pagedkv simulate [--trace FILE] [flags]")
	assert.Contains(t, out, "-metrics-addr")
}

// TestSimulateMetrics serves metrics on 127.0.0.1:0 and scrapes them after
// the run, before the server stops: they agree with the summary.
func TestSimulateMetrics(t *testing.T) {
	scraped := scrapeWhenServed(t, func(url string) { assert.Regexp(t, `^http://127\.0\.0\.1:\d+/metrics$`, url) })
	code, out, errOut := runCLI(append([]string{"simulate", "--trace", sharedPrefixTrace, "--metrics-addr", "127.0.0.1:0", "--quiet"}, smallModel...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Regexp(t, `^simulate: serving metrics at http://127\.0\.0\.1:\d+/metrics\n$`, errOut)
	steps := strings.SplitN(summaryField(t, out, "steps"), ",", 2)[0]
	_, err := strconv.Atoi(steps)
	require.NoError(t, err)
	assert.Contains(t, *scraped, "\npagedkv_steps_total "+steps+"\n")
	assert.Contains(t, *scraped, "\npagedkv_prompt_hit_tokens_total 224\n")
	assert.Contains(t, *scraped, "\npagedkv_prompt_tokens_total 514\n")
	assert.Contains(t, *scraped, "\npagedkv_computed_tokens_total 312\n")
	assert.Contains(t, *scraped, "\npagedkv_requests 0\n")

	code, _, errOut = runCLI("simulate", "--metrics-addr", "256.0.0.1:0", "--quiet")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, errOut, "pagedkv simulate: --metrics-addr: ")
}

// scrapeWhenServed has the runs of this test that serve metrics fetch the
// page once it is served, before the server stops, and returns where the
// last page fetched lands. check, when not nil, first checks the URL.
func scrapeWhenServed(t *testing.T, check func(url string)) *string {
	var scraped string
	metricsServed = func(url string) {
		if check != nil {
			check(url)
		}
		resp, err := http.Get(url)
		if !assert.NoError(t, err) {
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		assert.NoError(t, err)
		scraped = string(b)
	}
	t.Cleanup(func() { metricsServed = nil })
	return &scraped
}
