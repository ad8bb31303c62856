package cuda

import (
	"fmt"

	"github.com/pagedkv/pagedkv/layout"
)

// DevicePtr is an address in device memory (0 is the null pointer).
type DevicePtr uint64

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z int }

// Driver is the device the launcher runs on: a GPU through gorgonia.org/cu
// (build tag cuda) or the CPU emulator of internal/cpuemu.
type Driver interface {
	// NumSMs is the number of streaming multiprocessors launches are sized
	// for (grid sizes and the split-k decision depend on it).
	NumSMs() int
	// Alloc returns bytes > 0 bytes of device memory, aligned to 256 bytes.
	Alloc(bytes int) (DevicePtr, error)
	// Free releases memory returned by Alloc.
	Free(p DevicePtr) error
	// HtoD copies src to device memory at dst, after the work queued
	// before it.
	HtoD(dst DevicePtr, src []byte) error
	// HtoDAsync queues a copy of src (memory from PinnedAlloc, which must not
	// change until the copy is done: until the next Synchronize, DtoH or
	// HtoDAsync into the same buffer) to dst behind the queued work.
	HtoDAsync(dst DevicePtr, src []byte) error
	// DtoH copies len(dst) bytes of device memory at src to dst once the
	// work queued before it has finished, and reports a failure of that
	// work.
	DtoH(dst []byte, src DevicePtr) error
	// DtoD queues a copy of bytes bytes of device memory from src to dst.
	DtoD(dst, src DevicePtr, bytes int) error
	// Memset queues setting bytes bytes at dst to value.
	Memset(dst DevicePtr, value byte, bytes int) error
	// PinnedAlloc returns bytes of pinned (page-locked) host memory, the
	// staging buffer of asynchronous copies; PinnedFree releases it.
	PinnedAlloc(bytes int) ([]byte, error)
	PinnedFree(p []byte) error
	// Launch queues kernel (an entry point of [KernelArity]). Each argument
	// is 8 bytes: a DevicePtr, an int64 or the bits of a float64. A failure
	// of the kernel itself may be reported by a later Synchronize or DtoH.
	Launch(kernel string, grid, block Dim3, sharedBytes int, args []uint64) error
	// Synchronize waits for all queued work and reports its failures.
	Synchronize() error

	// BeginCapture starts capturing the work queued on the driver's stream
	// into a graph (cuStreamBeginCapture): until EndCapture, HtoDAsync,
	// DtoD, Memset and Launch are recorded, not run, and every call that
	// waits for the stream (HtoD, DtoH, Synchronize) fails. The capture is
	// relaxed (CU_STREAM_CAPTURE_MODE_RELAXED): work queued from any thread
	// is captured.
	BeginCapture() error
	// EndCapture ends the capture and returns the instantiated graph
	// (cuStreamEndCapture, cuGraphInstantiate).
	EndCapture() (GraphExec, error)
	// LaunchGraph queues one replay of g behind the queued work
	// (cuGraphLaunch): its copies read the host memory they were captured
	// with as it is when the copy runs.
	LaunchGraph(g GraphExec) error
	// DestroyGraph releases g (cuGraphExecDestroy).
	DestroyGraph(g GraphExec) error
}

// GraphExec is an instantiated CUDA graph (a CUgraphExec) of a Driver.
type GraphExec uint64

// Kernel dtype codes, passed as int64 arguments; they mirror pkv::Dtype in
// compat.cuh (a test reads the header and compares).
const (
	codeF32  = 0
	codeF16  = 1
	codeBF16 = 2
	codeE4M3 = 3
	codeE5M2 = 4
)

// dtypeCode maps a float dtype to its kernel code.
func dtypeCode(dt layout.DType) (int64, error) {
	switch dt {
	case layout.F32:
		return codeF32, nil
	case layout.F16:
		return codeF16, nil
	case layout.BF16:
		return codeBF16, nil
	case layout.E4M3:
		return codeE4M3, nil
	case layout.E5M2:
		return codeE5M2, nil
	}
	return 0, fmt.Errorf("cuda: no kernel dtype code for %v", dt)
}

// Argument counts of the entry points (every argument 8 bytes).
const (
	appendArity      = 16
	appendMLAArity   = 15
	appendQuantArity = 20
	appendNVFP4Arity = 21
	decodeArity      = 27
	mergeArity       = 10
	mergeStateArity  = 11
	mergeStatesArity = 10
	mlaDecodeArity   = 20
	mlaTCArity       = 21
)

// KernelArity maps every kernel entry point of the embedded PTX to its number
// of (8-byte) arguments.
var KernelArity = func() map[string]int {
	m := map[string]int{
		"append_paged_kv_cache_quant": appendQuantArity,
		"append_paged_kv_cache_nvfp4": appendNVFP4Arity,
		"merge_partial_states":        mergeArity,
		"merge_state":                 mergeStateArity,
		"merge_states":                mergeStatesArity,
	}
	for _, names := range mlaKernels {
		for _, n := range names {
			m[n] = mlaDecodeArity
		}
	}
	for _, names := range mlaTCKernels {
		for _, n := range names {
			m[n] = mlaTCArity
		}
	}
	for _, u := range copyUnits {
		m[fmt.Sprintf("append_paged_kv_cache_u%d", u)] = appendArity
		m[fmt.Sprintf("append_paged_mla_kv_cache_u%d", u)] = appendMLAArity
	}
	for _, kv := range []string{"f32", "f16", "bf16", "e4m3", "e5m2"} {
		for _, vec := range decodeVecs {
			m[decodeKernel(kv, vec)] = decodeArity
		}
	}
	for _, vec := range decodeVecs[1:] {
		m[decodeKernel("nvfp4", vec)] = decodeArity + 2 // then k_sf, v_sf
	}
	for _, dt := range prefillKVs {
		for _, d := range prefillDims {
			m[prefillKernel(kvSuffix[dt], d)] = prefillArity
			if dt == layout.NVFP4 {
				m[prefillKernel(kvSuffix[dt], d)] = prefillArity + 2 // then k_sf, v_sf
			}
		}
	}
	for _, names := range tcDecodeKernels {
		for _, n := range names {
			m[n] = decodeArity // the CUDA-core decode's arguments
		}
	}
	return m
}()

// copyUnits are the copy widths in bytes the append kernels are built for,
// widest first.
var copyUnits = [...]int{16, 8, 4, 2, 1}

// decodeVecs are the features per lane the decode kernels are built for:
// head_dim up to 32*vec.
var decodeVecs = [...]int{1, 2, 4, 8}

func decodeKernel(kv string, vec int) string {
	return fmt.Sprintf("batch_decode_paged_%s_v%d", kv, vec)
}

// copyUnit is the widest copy unit that divides every one of sizes (bytes).
func copyUnit(sizes ...int64) int {
	for _, u := range copyUnits {
		ok := true
		for _, s := range sizes {
			if s%int64(u) != 0 {
				ok = false
				break
			}
		}
		if ok {
			return u
		}
	}
	return 1
}
