package main

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/golden"
	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/internal/sim"
)

// hostileWords are the index values a hostile case file plants: the audit's
// wrapping kv_indptr (MaxInt32 then -5), the int32 extremes, a negative.
var hostileWords = [][]int32{{math.MaxInt32, -5}, {math.MinInt32}, {math.MaxInt32}, {-1}, {-5, 10}}

// hostileMeta are metadata values planted in every key of a case.
var hostileMeta = []string{"-1", "0", "2147483647", "9223372036854775807", "1e308", "NaN", "x"}

// writeHostileCases writes, for every valid case in src, variants with
// hostile words in each int32 tensor (at index 1 onwards, so kv_indptr
// keeps its leading 0 and wraps) and hostile values in each metadata key.
func writeHostileCases(t *testing.T, src, dst string) int {
	t.Helper()
	files, err := golden.Find(src)
	require.NoError(t, err)
	n := 0
	write := func(name string, meta map[string]string, ts []safetensors.Tensor) {
		if err := safetensors.WriteFile(filepath.Join(dst, fmt.Sprintf("%s_%03d.safetensors", name, n)), meta, ts); err == nil {
			n++
		}
	}
	for _, f := range files {
		c, base := readGolden(t, f)
		for i, tn := range c.Tensors() {
			if tn.DType != safetensors.I32 || len(tn.Data) < 8 {
				continue
			}
			for _, words := range hostileWords {
				ts := slices.Clone(c.Tensors())
				data := slices.Clone(tn.Data)
				for k, w := range words {
					if at := 4 * (1 + k); at+4 <= len(data) {
						binary.LittleEndian.PutUint32(data[at:], uint32(w))
					}
				}
				ts[i].Data = data
				write(base+"_"+strings.ReplaceAll(tn.Name, ".", "_"), c.Meta, ts)
			}
		}
		for key := range c.Meta {
			if key == "format" || key == "op" || key == "case" {
				continue
			}
			for _, v := range hostileMeta {
				meta := map[string]string{}
				for k, x := range c.Meta {
					meta[k] = x
				}
				meta[key] = v
				write(base+"_meta_"+key, meta, c.Tensors())
			}
		}
	}
	return n
}

// Malformed case files (crafted index arrays, out-of-range metadata) make
// verify exit 1 with one line per case naming what is wrong: never a
// panic report, never a goroutine dump (the CPU backend runs with every
// core's worker, where a panic would end the process).
func TestVerifyHostileCases(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	writeNewCases(t, src, 1)
	n := writeHostileCases(t, src, dst)
	require.Greater(t, n, 100)
	verifyEveryBackend(t, dst, n, func(t *testing.T, out, errOut string) {
		require.NotContains(t, errOut, "panic")
		require.Contains(t, out, "2147483647", "the error lines name the bad values")
	})
}

func backends2stub(name string) bool { return backends[name].stub }

// verifyEveryBackend runs verify over the n cases in dir on cpu and, where
// this binary has it, on emu (with the cpu fallback). Each run must exit 1
// with one line per case and a summary, and no case line may mention a
// panic or a goroutine; check then sees the run's stdout and stderr.
func verifyEveryBackend(t *testing.T, dir string, n int, check func(t *testing.T, out, errOut string)) {
	backends := []string{"cpu"}
	if !backends2stub("emu") {
		backends = append(backends, "emu")
	}
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			args := []string{"verify", "--backend", b, dir}
			if b != "cpu" {
				args = []string{"verify", "--backend", b, "--fallback", "cpu", dir}
			}
			code, out, errOut := runCLI(args...)
			if testing.Verbose() {
				t.Log(out)
			}
			require.Equal(t, exitFailure, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			ls := lines(out)
			require.Len(t, ls, n+1, "one line per case and a summary")
			for _, l := range ls[:n] {
				require.NotContains(t, l, "panic", "a malformed case must be rejected, not crash the op")
				require.NotContains(t, l, "goroutine")
			}
			check(t, out, errOut)
		})
	}
}

// Bad flags and traces fail fast with exit 2 and one line naming the value,
// before anything large is allocated (the audit's --head-dim 1000000000
// died with "fatal error: runtime: out of memory").
func TestSimulateBadInputFailsFast(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.jsonl")
	var b strings.Builder
	for range 2000 {
		b.WriteString(`{"output":65536,"prompt_len":65536,"samples":64}` + "\n")
	}
	require.NoError(t, os.WriteFile(big, []byte(b.String()), 0o644))
	dup := filepath.Join(dir, "dup.jsonl")
	require.NoError(t, os.WriteFile(dup, []byte("\n{\"output\":4,\"prompt_len\":8}\n{\"output\":4,\"prompt_len\":8,\"output\":5}\n"), 0o644))
	long := filepath.Join(dir, "long.jsonl")
	require.NoError(t, os.WriteFile(long, []byte(`{"output":4,"prompt":[`+strings.Repeat("1,", 9<<20)+"1]}\n"), 0o644))
	many := filepath.Join(dir, "many.jsonl")
	require.NoError(t, os.WriteFile(many, []byte(strings.Repeat(`{"output":1,"prompt_len":1}`+"\n", 11)), 0o644))

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--head-dim", "1000000000"}, "head dim = 1000000000, want a multiple of 4 in 4..1024"},
		{[]string{"--layers", "1000000"}, "layers = 1000000, want 1..1024"},
		{[]string{"--qo-heads", "4096", "--kv-heads", "2048"}, "kv heads = 2048, want 1..1024"},
		{[]string{"--pages", "16000000"}, "more than the simulator's 8589934592"},
		{[]string{"--requests", "1000000000"}, "workload requests = 1000000000, want 1..100000"},
		{[]string{"--page-size", "-3"}, "PageSize"},
		{[]string{"--verify-samples", "1000000000"}, "1000000000 samples: want >= 1 each, at most 4096 samples"},
		{[]string{"--trace", big}, "line 4: the request's 4259840 tokens"},
		{[]string{"--trace", dup}, `line 3: field "output" appears twice`},
		{[]string{"--trace", long}, "line 1: longer than 16777216 bytes"},
		{[]string{"--trace", many, "--trace-max-requests", "10"}, "line 11: more than 10 requests"},
		{[]string{"--trace", many, "--trace-max-tokens", "0"}, "trace limits 100000 requests, 0 tokens"},
	} {
		code, out, errOut := runCLI(append([]string{"simulate", "--quiet"}, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v: stdout %s stderr %s", tc.args, out, errOut)
		require.Len(t, lines(errOut), 1, "%v: one line: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
}

// version lists only the backends this binary can run: not cuda in a build
// without -tags cuda, not emu without cgo.
func TestVersionListsOnlyBuiltBackends(t *testing.T) {
	code, out, _ := runCLI("version")
	require.Equal(t, exitOK, code)
	for name, f := range backends {
		if f.stub {
			require.NotContains(t, out, name, "the stub backend %s is listed", name)
		} else {
			require.Contains(t, out, name)
		}
	}
}

// On a terminal the bar is the progressbar library's: a count, a
// percentage and elapsed:remaining time; done erases it.
func TestProgressBarOnTerminal(t *testing.T) {
	var buf strings.Builder
	p := &progress{w: &buf, term: true}
	p.update(sim.Progress{Step: 3, Finished: 3, Total: 10, Running: 2, Waiting: 1})
	time.Sleep(150 * time.Millisecond) // past the redraw throttle
	p.update(sim.Progress{Step: 9, Finished: 10, Total: 10})
	p.done()
	out := buf.String()
	require.Contains(t, out, "(3/10)")
	require.Contains(t, out, "step 3, 2 running, 1 waiting (0 preempted)")
	require.Regexp(t, `\[\d+s:\d+s\]`, out, "elapsed and ETA")
	require.True(t, strings.HasSuffix(out, "\r"), "the bar is erased at the end: %q", out[max(0, len(out)-40):])
}

// Every op of the shipped cases (prefill, MLA decode and append, cascade
// included, which the generated cases above lack) with an int32 extreme
// planted in each index array at its first, second and last element, or
// the array replaced by a wrapping indptr: every case must fail with one
// line and no panic, on every backend. (A hand sweep of 3,671 such files,
// plus dtype, shape, truncation and header mutations, found one that
// passed: logits_soft_cap = 1e308, now refused by the kernels.)
func TestVerifyHostileShippedCases(t *testing.T) {
	src, err := filepath.Glob(filepath.Join(shippedDir, "*_0_00.safetensors"))
	require.NoError(t, err)
	seeds, err := filepath.Glob(filepath.Join(shippedDir, "seed_*.safetensors"))
	require.NoError(t, err)
	src = append(src, seeds...)
	require.Greater(t, len(src), 12)
	dst := t.TempDir()
	n := 0
	write := func(name string, c *golden.Case, ts []safetensors.Tensor) {
		require.NoError(t, safetensors.WriteFile(filepath.Join(dst, fmt.Sprintf("%s_%04d.safetensors", name, n)), c.Meta, ts))
		n++
	}
	words := []int32{math.MaxInt32, math.MinInt32, -1}
	wraps := [][]int32{{0, math.MaxInt32, -5}, {0, math.MaxInt32, -5, 10}}
	for _, f := range src {
		c, base := readGolden(t, f)
		for i, tn := range c.Tensors() {
			if tn.DType != safetensors.I32 || !strings.HasPrefix(tn.Name, "in.") || len(tn.Data) == 0 {
				continue
			}
			name := base + "_" + strings.ReplaceAll(tn.Name, ".", "_")
			count := len(tn.Data) / 4
			for _, at := range slices.Compact([]int{0, min(1, count-1), count - 1}) {
				for _, w := range words {
					ts := slices.Clone(c.Tensors())
					ts[i].Data = slices.Clone(tn.Data)
					binary.LittleEndian.PutUint32(ts[i].Data[4*at:], uint32(w))
					write(name, c, ts)
				}
			}
			for _, wrap := range wraps {
				ts := slices.Clone(c.Tensors())
				ts[i] = safetensors.I32Tensor(tn.Name, []int{len(wrap)}, wrap)
				write(name+"_wrap", c, ts)
			}
		}
		// A soft cap that is finite in float64 but not in the kernels'
		// float32 made every output NaN; it must be refused by name.
		if _, ok := c.Meta["logits_soft_cap"]; ok {
			meta := maps.Clone(c.Meta)
			meta["logits_soft_cap"] = "1e308"
			require.NoError(t, safetensors.WriteFile(filepath.Join(dst, fmt.Sprintf("%s_softcap_%04d.safetensors", base, n)), meta, c.Tensors()))
			n++
		}
	}
	t.Logf("%d hostile cases", n)
	require.Greater(t, n, 300)
	verifyEveryBackend(t, dst, n, func(t *testing.T, out, errOut string) {
		require.Empty(t, errOut)
		ls := lines(out)
		for _, l := range ls[:n] {
			require.True(t, strings.HasPrefix(l, "FAIL "), "a hostile case passed: %s", l)
			if strings.Contains(l, "_softcap_") {
				require.Contains(t, l, "logits_soft_cap = 1e+308")
			}
		}
		require.Equal(t, fmt.Sprintf("verify: 0 passed, %d failed", n), ls[n])
	})
}

// readGolden parses the golden case file f; base is its name without the
// directory and the .safetensors suffix.
func readGolden(t *testing.T, f string) (c *golden.Case, base string) {
	t.Helper()
	buf, err := os.ReadFile(f)
	require.NoError(t, err)
	c, err = golden.Parse(f, buf)
	require.NoError(t, err)
	return c, strings.TrimSuffix(filepath.Base(f), ".safetensors")
}
