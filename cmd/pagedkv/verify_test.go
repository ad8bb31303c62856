package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
)

const shippedDir = "../../testdata/golden"

// partialBackend is the CPU backend without batch prefill, standing in for
// a backend that implements only some operations.
type partialBackend struct{ kernels.Backend }

func (partialBackend) Name() string { return "partial" }
func (partialBackend) BatchPrefill(*kernels.PrefillParams) error {
	return kernels.ErrUnsupported
}

func init() {
	registerBackend("partial-test", backendFactory{
		summary: "test only: cpu without prefill",
		open:    func() (kernels.Backend, error) { return partialBackend{cpu.New(cpu.Config{})}, nil },
	})
}

// runCLI runs the command line in-process.
func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func lines(s string) []string { return strings.Split(strings.TrimRight(s, "\n"), "\n") }

var (
	passLine = regexp.MustCompile(`^PASS \S+ max_abs=\S+ max_rel=\S+$`)
	failLine = regexp.MustCompile(`^FAIL \S+`)
)

func TestVerifyShippedCases(t *testing.T) {
	code, out, errOut := runCLI("verify", shippedDir)
	ls := lines(out)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.Len(t, ls, 58)
	for _, l := range ls[:57] {
		assert.Regexp(t, passLine, l)
	}
	assert.Equal(t, "verify: 57 passed, 0 failed", ls[57])
	assert.Empty(t, errOut)
}

// The acceptance test for cases the project has never seen: other seeds and
// sizes, computed independently, pass.
func TestVerifyNewCases(t *testing.T) {
	dir := t.TempDir()
	n := writeNewCases(t, dir, 4)
	code, out, errOut := runCLI("verify", "-v", dir)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	summary := lines(out)[len(lines(out))-1]
	assert.Equal(t, "verify: "+strconv.Itoa(n)+" passed, 0 failed", summary)
	assert.Contains(t, out, "  ok   o (atol=0.0001 rtol=0.0001): ")
	assert.Contains(t, out, "  ok   paged_kv_cache (exact): ")
}

func TestVerifyReportsFailures(t *testing.T) {
	dir := t.TempDir()
	writeNewCases(t, dir, 1)
	// A decode case whose expected o is off by 0.5 at [0, 0, 3].
	c, err := safetensors.ReadFile(filepath.Join(dir, "batch_decode_seed1.safetensors"))
	require.NoError(t, err)
	tensors := append([]safetensors.Tensor(nil), c.Tensors...)
	for i := range tensors {
		if tensors[i].Name == "out.o" {
			o, _ := tensors[i].Float32s()
			o[3] += 0.5
			tensors[i] = safetensors.F32Tensor("out.o", tensors[i].Shape, o)
		}
	}
	require.NoError(t, safetensors.WriteFile(filepath.Join(dir, "batch_decode_seed1.safetensors"), c.Metadata, tensors))
	// A file that is not a case, and a case of an op nobody knows.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.safetensors"), []byte("\xff\xff\xff\xff\xff\xff\xff\xff{}"), 0o644))
	require.NoError(t, safetensors.WriteFile(filepath.Join(dir, "rope.safetensors"),
		map[string]string{"format": "pagedkv-golden/1", "op": "apply_rope"}, nil))

	code, out, _ := runCLI("verify", dir)
	assert.Equal(t, exitFailure, code)
	ls := lines(out)
	assert.Equal(t, "verify: 8 passed, 3 failed", ls[len(ls)-1])
	assert.Contains(t, out, "FAIL batch_decode_seed1 max_abs=0.5")
	assert.Contains(t, out, "worst at o[0,0,3]: got ")
	assert.Contains(t, out, "(1 of ")
	assert.Contains(t, out, "FAIL broken: ")
	assert.Contains(t, out, "header length")
	assert.Contains(t, out, `FAIL rope: golden: unknown op "apply_rope"`)
	for _, l := range ls[:len(ls)-1] {
		assert.True(t, passLine.MatchString(l) || failLine.MatchString(l), "line %q", l)
	}
}

func TestVerifyUnsupportedAndFallback(t *testing.T) {
	code, out, _ := runCLI("verify", "--backend", "partial-test", shippedDir)
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, out, "FAIL batch_prefill_paged_0_00: unsupported on partial: ")
	assert.Contains(t, out, "FAIL cascade_attention_0_00: unsupported on partial: ")
	assert.Contains(t, out, "verify: 49 passed, 8 failed") // 4 prefill (one with sinks) + 3 cascade + the cascade figure

	code, out, _ = runCLI("verify", shippedDir, "--backend", "partial-test", "--fallback", "cpu")
	assert.Equal(t, exitOK, code, out)
	assert.Contains(t, out, "PASS batch_prefill_paged_0_00 (cpu fallback) max_abs=")
	assert.Contains(t, out, "PASS seed_flashinfer_cascade_figure (cpu fallback) max_abs=")
	assert.Regexp(t, `(?m)^PASS batch_decode_0_00 max_abs=`, out, "decode ran on the backend itself")
	assert.Equal(t, 8, strings.Count(out, "(cpu fallback)"))
	assert.Contains(t, out, "verify: 57 passed, 0 failed")
}

func TestVerifyUsage(t *testing.T) {
	tests := map[string]struct {
		args    []string
		code    int
		stderr  string
		summary string
	}{
		"no paths":            {[]string{"verify"}, exitUsage, "no directory or file given", ""},
		"unknown backend":     {[]string{"verify", "--backend", "tpu", shippedDir}, exitUsage, `unknown backend "tpu" (have `, ""},
		"unknown flag":        {[]string{"verify", "--fast", shippedDir}, exitUsage, "flag provided but not defined: -fast", ""},
		"fallback to itself":  {[]string{"verify", "--fallback", "cpu", shippedDir}, exitUsage, "--fallback cpu is the --backend itself", ""},
		"missing directory":   {[]string{"verify", filepath.Join(shippedDir, "nope")}, exitFailure, "no such file or directory", "verify: 0 passed, 1 failed"},
		"directory, no cases": {[]string{"verify", t.TempDir()}, exitFailure, "no *.safetensors case under", "verify: 0 passed, 1 failed"},
		"help":                {[]string{"verify", "-h"}, exitOK, "usage: pagedkv verify", ""},
		"one file, -- paths":  {[]string{"verify", "--", filepath.Join(shippedDir, "packbits_0_00.safetensors")}, exitOK, "", "verify: 1 passed, 0 failed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCLI(tc.args...)
			assert.Equal(t, tc.code, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Contains(t, errOut, tc.stderr)
			if tc.summary != "" {
				assert.Equal(t, tc.summary, lines(out)[len(lines(out))-1])
			}
		})
	}
}

func TestDispatch(t *testing.T) {
	code, out, _ := runCLI("help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "usage: pagedkv COMMAND [ARGS]")
	assert.Regexp(t, `(?m)^  verify +run FlashInfer reference cases`, out)
	assert.Regexp(t, `(?m)^  version +print the version`, out)

	code, _, errOut := runCLI()
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "usage: pagedkv COMMAND")

	code, _, errOut = runCLI("frobnicate")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, `pagedkv: unknown command "frobnicate"`)

	code, out, _ = runCLI("help", "verify")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "-backend string")
	assert.Contains(t, out, "-fallback string")

	assert.Panics(t, func() { register(&command{name: "verify", summary: "x", usage: "x", run: runVerify}) })
	assert.Panics(t, func() { register(&command{name: "incomplete"}) })
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI("version")
	assert.Equal(t, exitOK, code)
	assert.Regexp(t, `^pagedkv \S+.* go1\.\S+ \w+/\w+ backends: \[.*cpu.*\]\n$`, out)

	info := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"},
		}}, true
	}
	assert.Regexp(t, `^pagedkv v0\.3\.0 0123456789ab-dirty go`, versionString(info))
	version = "v9.9.9"
	defer func() { version = "" }()
	assert.Regexp(t, `^pagedkv v9\.9\.9 0123456789ab-dirty go`, versionString(info))
	assert.Regexp(t, `^pagedkv v9\.9\.9 go`, versionString(func() (*debug.BuildInfo, bool) { return nil, false }))

	code, _, errOut := runCLI("version", "extra")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "takes no arguments")
}

// The reference writer's --check mode validates every shipped case, and the
// pure-Python cases it writes pass verify: the Python writer and the Go
// reader agree on the format.
func TestFlashInferReferenceTool(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed; CI runs tools/flashinfer_reference.py --check itself")
	}
	tool := filepath.Join("..", "..", "tools", "flashinfer_reference.py")
	files, err := filepath.Glob(filepath.Join(shippedDir, "*.safetensors"))
	require.NoError(t, err)
	out, err := exec.Command(py, append([]string{tool, "--check"}, files...)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "check: 57 ok, 0 bad")

	dir := t.TempDir()
	out, err = exec.Command(py, tool, "--synthetic", dir, "--seed", "7").CombinedOutput()
	require.NoError(t, err, "%s", out)
	written, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	require.NoError(t, err)
	require.NotEmpty(t, written)
	code, vout, verr := runCLI("verify", dir)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", vout, verr)

	// --check rejects a broken file and says why.
	bad := filepath.Join(dir, "bad.safetensors")
	require.NoError(t, os.WriteFile(bad, []byte("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":1}        "), 0o644))
	out, err = exec.Command(py, tool, "--check", bad).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "bad.safetensors")
	assert.Contains(t, string(out), "check: 0 ok, 1 bad")
}

// verify refuses, before reading a byte, what is not a regular file (a
// device, a FIFO, a symlink to one) and files over the size limit, naming
// the file and the limit; a text file is named as not a safetensors file
// (issue 28 finding 5, issue 29). /dev/zero once grew the process to 10 GB.
func TestVerifyRefusesFilesItCannotBound(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Symlink("/dev/zero", filepath.Join(dir, "zero.safetensors")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "fifo.safetensors"), 0o600))
	huge := filepath.Join(dir, "huge.safetensors")
	require.NoError(t, os.WriteFile(huge, nil, 0o644))
	require.NoError(t, os.Truncate(huge, safetensors.MaxFileBytes+1)) // sparse: costs no disk
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "readme.safetensors"), readme, 0o644))

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	code, out, _ := runCLI("verify", dir)
	runtime.ReadMemStats(&after)
	assert.Equal(t, exitFailure, code)
	limit := strconv.Itoa(safetensors.MaxFileBytes)
	for _, want := range []string{
		"FAIL fifo: " + filepath.Join(dir, "fifo.safetensors") + ": not a regular file",
		"FAIL huge: " + huge + ": file too large: " + strconv.Itoa(safetensors.MaxFileBytes+1) + " bytes exceeds the limit of " + limit + " bytes",
		"FAIL readme: " + filepath.Join(dir, "readme.safetensors") + ": safetensors: not a safetensors file: byte 8 is ",
		"FAIL zero: " + filepath.Join(dir, "zero.safetensors") + ": not a regular file",
		"verify: 0 passed, 4 failed",
	} {
		assert.Contains(t, out, want)
	}
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "refusals read nothing")

	require.EqualValues(t, 1<<30, safetensors.MaxFileBytes, "the help states the limit as 1 GiB")
	require.Contains(t, verifyHelp, "larger than 1 GiB")

	code, out, _ = runCLI("verify", "/dev/zero")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, out, "FAIL zero: /dev/zero: not a regular file")

	code, out, _ = runCLI("verify", "../../README.md")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, out, "FAIL README.md: ../../README.md: safetensors: not a safetensors file")
	assert.NotContains(t, out, "header length")
}
