//go:build cuda

package cuda_test

// Run on a machine with a GPU: go test -tags cuda ./kernels/...
// (see docs/kernels.md). Without a device these tests skip; note that
// gorgonia.org/cu's init exits the process when the driver finds no GPU at
// all, so a machine without one cannot even start this test binary.

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/golden"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
)

var (
	gpuOnce  sync.Once
	gpu      *cuda.Backend
	gpuSplit *cuda.Backend
	gpuErr   error
)

// initGPU makes the device backends once per test binary.
func initGPU() {
	gpu, gpuErr = cuda.New(cuda.Config{})
	if gpuErr == nil {
		gpuSplit, gpuErr = cuda.New(cuda.Config{MaxChunkTokens: 19})
	}
}

// gpuBackend returns the device backend, or skips the test when there is no
// device.
func gpuBackend(t *testing.T) *cuda.Backend {
	t.Helper()
	gpuOnce.Do(initGPU)
	if errors.Is(gpuErr, kernels.ErrNoDevice) {
		t.Skipf("no CUDA device: %v", gpuErr)
	}
	require.NoError(t, gpuErr)
	return gpu
}

// gpuBackends adds the device, planned for its own SM count and with
// split-k forced, to the backends of the shared tests of this package
// (none, without skipping the emulator runs, when there is no device).
func gpuBackends(t *testing.T) []backend {
	gpuOnce.Do(initGPU)
	if errors.Is(gpuErr, kernels.ErrNoDevice) {
		t.Logf("no CUDA device: %v", gpuErr)
		return nil
	}
	require.NoError(t, gpuErr)
	return []backend{{gpu, "cuda"}, {gpuSplit, "cuda-split19"}}
}

func TestGPUConformanceAppend(t *testing.T) { kernelstest.TestAppend(t, gpuBackend(t)) }

func TestGPUConformanceMLAAppend(t *testing.T) { kernelstest.TestMLAAppend(t, gpuBackend(t)) }

func TestGPUConformanceDecode(t *testing.T) { kernelstest.TestDecode(t, gpuBackend(t)) }

func TestGPUConformanceDecodeSplitK(t *testing.T) {
	gpuBackend(t)
	kernelstest.TestDecode(t, gpuSplit)
}

func TestGPUConformancePrefill(t *testing.T) { kernelstest.TestPrefill(t, gpuBackend(t)) }

func TestGPUConformancePrefillSplitK(t *testing.T) {
	gpuBackend(t)
	kernelstest.TestPrefill(t, gpuSplit)
}

func TestGPUConformanceMLADecode(t *testing.T) { kernelstest.TestMLADecode(t, gpuBackend(t)) }

func TestGPUConformanceMergeState(t *testing.T) { kernelstest.TestMergeState(t, gpuBackend(t)) }

func TestGPUConformanceMergeStates(t *testing.T) { kernelstest.TestMergeStates(t, gpuBackend(t)) }

func TestGPUHostileIndices(t *testing.T) { kernelstest.TestHostileIndices(t, gpuBackend(t)) }

// The shipped FlashInfer reference cases on the device, with no fallback:
// every backend operation of every case must run on the GPU (as on the
// emulator, internal/golden's TestShippedCasesOnEmu).
func TestGPUGoldenCases(t *testing.T) {
	b := gpuBackend(t)
	paths, err := golden.Find("../../testdata/golden")
	require.NoError(t, err)
	r := &golden.Runner{Backend: b}
	onGPU := map[string]int{}
	var failures []string
	for _, p := range paths {
		res := r.RunFile(p)
		if !res.Passed() {
			failures = append(failures, res.String())
			failures = append(failures, res.Details()...)
			continue
		}
		if res.Backend != "" {
			assert.Equal(t, "cuda", res.Backend, res.Name)
			onGPU[res.Op]++
		}
	}
	require.Empty(t, failures, "failed cases:\n%s", strings.Join(failures, "\n"))
	for _, op := range []string{"append_paged_kv_cache", "append_paged_mla_kv_cache", "batch_decode", "batch_prefill_paged",
		"mla_decode", "merge_state", "merge_states", "cascade_attention"} {
		assert.Positive(t, onGPU[op], "no %s case ran on the GPU", op)
	}
}

func TestGPUBadOrdinal(t *testing.T) {
	gpuBackend(t)
	_, err := cuda.New(cuda.Config{Device: 1 << 20})
	require.ErrorIs(t, err, kernels.ErrNoDevice)
}

// gpuDevice is the device backend for benchmarks, or nil without a device.
func gpuDevice(tb testing.TB) *cuda.Backend {
	gpuOnce.Do(initGPU)
	if errors.Is(gpuErr, kernels.ErrNoDevice) {
		tb.Logf("no CUDA device: %v", gpuErr)
		return nil
	}
	require.NoError(tb, gpuErr)
	return gpu
}
