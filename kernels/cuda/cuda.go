//go:build cuda

package cuda

// The driver calls of a step, bound here rather than through gorgonia.org/cu
// (which binds neither the capture nor cuMemAllocHost, and whose Launch
// mallocs two argument arrays per call). Each helper makes the backend's
// context current on the calling OS thread and then makes its call, both
// inside one cgo call: a goroutine may move between threads between two
// calls, never within one, so any goroutine may call the driver (see
// docs/kernels.md, "Threads and streams").

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdint.h>

// pkv_max_args bounds a launch's arguments (the widest entry point takes 27).
enum { pkv_max_args = 32 };

static CUresult pkv_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, unsigned smem, CUstream s, const uint64_t* args, int n) {
	void* params[pkv_max_args];
	if (n > pkv_max_args) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) params[i] = (void*)&args[i];
	CUresult r = cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r;
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, params, NULL);
}

static CUresult pkv_htod_async(CUcontext ctx, CUdeviceptr dst, const void* src, size_t n, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemcpyHtoDAsync(dst, src, n, s);
}

// pkv_htod and pkv_dtoh copy pageable memory in stream order and wait for
// the copy, so the host buffer is free when they return.
static CUresult pkv_htod(CUcontext ctx, CUdeviceptr dst, const void* src, size_t n, CUstream s) {
	CUresult r = pkv_htod_async(ctx, dst, src, n, s);
	return r != CUDA_SUCCESS ? r : cuStreamSynchronize(s);
}

static CUresult pkv_dtoh(CUcontext ctx, void* dst, CUdeviceptr src, size_t n, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	if (r == CUDA_SUCCESS) r = cuMemcpyDtoHAsync(dst, src, n, s);
	return r != CUDA_SUCCESS ? r : cuStreamSynchronize(s);
}

static CUresult pkv_dtod(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemcpyDtoDAsync(dst, src, n, s);
}

static CUresult pkv_memset(CUcontext ctx, CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemsetD8Async(dst, v, n, s);
}

static CUresult pkv_sync(CUcontext ctx, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamSynchronize(s);
}

static CUresult pkv_alloc(CUcontext ctx, CUdeviceptr* p, size_t n) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemAlloc(p, n);
}

static CUresult pkv_free(CUcontext ctx, CUdeviceptr p) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemFree(p);
}

static CUresult pkv_alloc_host(CUcontext ctx, void** p, size_t n) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemAllocHost(p, n);
}

static CUresult pkv_free_host(CUcontext ctx, void* p) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuMemFreeHost(p);
}

static CUresult pkv_stream_create(CUcontext ctx, CUstream* s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamCreate(s, CU_STREAM_NON_BLOCKING);
}

static CUresult pkv_stream_destroy(CUcontext ctx, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamDestroy(s);
}

// Relaxed capture: the capture belongs to the stream, not to the thread
// that began it, so work queued from any thread (any goroutine) is
// captured, and other threads' unrelated driver calls are not refused.
static CUresult pkv_begin_capture(CUcontext ctx, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
}

static CUresult pkv_end_capture(CUcontext ctx, CUstream s, CUgraphExec* exec) {
	CUgraph g = NULL;
	CUresult r = cuCtxSetCurrent(ctx);
	if (r == CUDA_SUCCESS) r = cuStreamEndCapture(s, &g);
	if (r != CUDA_SUCCESS) return r;
	r = cuGraphInstantiateWithFlags(exec, g, 0);
	cuGraphDestroy(g);
	return r;
}

static CUresult pkv_graph_launch(CUcontext ctx, CUgraphExec g, CUstream s) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuGraphLaunch(g, s);
}

static CUresult pkv_graph_destroy(CUcontext ctx, CUgraphExec g) {
	CUresult r = cuCtxSetCurrent(ctx);
	return r != CUDA_SUCCESS ? r : cuGraphExecDestroy(g);
}
*/
import "C"

// The helpers above call driver entry points that no Go line names as
// C.cuX. A link against a stub driver library (../shared/gpu/build.sh
// collects the names written as C.cuX from this package's Go files;
// scripts/cuda-stub.sh also reads the helpers) needs them named here:
// C.cuGraphInstantiateWithFlags C.cuGraphLaunch C.cuMemAllocHost
// C.cuStreamBeginCapture C.cuStreamEndCapture.

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/pagedkv/pagedkv/kernels"
)

// New returns the GPU backend on device cfg.Device: the device's primary
// context (the one PyTorch and CuPy use, so their device pointers are valid
// here), the embedded PTX modules loaded into it (the driver JIT-compiles
// them for the device), every entry point resolved, and the stream every
// operation is queued on: cfg.Stream when given (a CUstream of that
// context, which the backend never destroys), else a non-blocking stream of
// its own. It fails with an error wrapping kernels.ErrNoDevice when the
// device does not exist. Close releases the stream it made and the context.
//
// Driver calls run on the calling goroutine's thread, each making the
// context current first; no call hands work to another thread (see
// docs/kernels.md, "Threads and streams").
//
// Note that gorgonia.org/cu's init exits the process when the CUDA driver
// finds no GPU at all, before New can report anything.
func New(cfg Config) (*Backend, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("cuda: cuDeviceGetCount: %w: %w", err, kernels.ErrNoDevice)
	}
	if cfg.Device < 0 || cfg.Device >= n {
		return nil, fmt.Errorf("cuda: device %d of %d: %w", cfg.Device, n, kernels.ErrNoDevice)
	}
	g := &gpu{}
	if err := g.init(cfg.Device, cfg.Stream); err != nil {
		return nil, err
	}
	return NewWithDriver("cuda", g, cfg), nil
}

// gpu is the Driver over the CUDA driver API: gorgonia.org/cu to find the
// device and load the modules, the cgo helpers of this file for everything a
// step does.
type gpu struct {
	dev       cu.Device
	sms       int
	name      string
	ctx       C.CUcontext
	stream    C.CUstream
	ownStream bool
	fns       map[string]C.CUfunction

	closeOnce sync.Once
}

func (g *gpu) init(ordinal int, stream uintptr) (err error) {
	if g.dev, err = cu.GetDevice(ordinal); err != nil {
		return fmt.Errorf("cuda: cuDeviceGet(%d): %w: %w", ordinal, err, kernels.ErrNoDevice)
	}
	if g.name, err = g.dev.Name(); err != nil {
		return fmt.Errorf("cuda: cuDeviceGetName: %w", err)
	}
	if g.sms, err = g.dev.Attribute(cu.MultiprocessorCount); err != nil {
		return fmt.Errorf("cuda: cuDeviceGetAttribute(MULTIPROCESSOR_COUNT): %w", err)
	}
	ccMajor, err := g.dev.Attribute(cu.ComputeCapabilityMajor)
	if err != nil {
		return fmt.Errorf("cuda: cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR): %w", err)
	}
	ccMinor, err := g.dev.Attribute(cu.ComputeCapabilityMinor)
	if err != nil {
		return fmt.Errorf("cuda: cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR): %w", err)
	}
	ctx, err := g.dev.RetainPrimaryCtx()
	if err != nil {
		return fmt.Errorf("cuda: cuDevicePrimaryCtxRetain on %s: %w", g.name, err)
	}
	// cu.CUContext holds the CUcontext as its only field.
	g.ctx = *(*C.CUcontext)(unsafe.Pointer(&ctx))
	defer func() {
		if err != nil {
			_ = g.dev.ReleasePrimaryCtx()
		}
	}()
	// gorgonia's module calls act on the current context: hold this thread
	// while they run.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(ctx); err != nil {
		return fmt.Errorf("cuda: cuCtxSetCurrent on %s: %w", g.name, err)
	}
	g.fns = map[string]C.CUfunction{}
	// From compute capability 9.0 on the sm_90 builds (hardware fp8 pair
	// conversions) where a module has one, else its sm_80 build.
	for file, ptx := range ModulesFor(ccMajor, ccMinor) {
		mod, err := cu.LoadData(ptx)
		if err != nil {
			return fmt.Errorf("cuda: cuModuleLoadData(%s) on %s: %w", file, g.name, err)
		}
		for name := range KernelArity {
			if !strings.Contains(ptx, ".entry "+name+"(") {
				continue
			}
			fn, err := mod.Function(name)
			if err != nil {
				return fmt.Errorf("cuda: cuModuleGetFunction(%s): %w", name, err)
			}
			g.fns[name] = *(*C.CUfunction)(unsafe.Pointer(&fn)) // cu.Function holds the CUfunction only
		}
	}
	for name := range KernelArity {
		if _, ok := g.fns[name]; !ok {
			return fmt.Errorf("cuda: entry point %s is in no embedded PTX module", name)
		}
	}
	if stream != 0 {
		g.stream = *(*C.CUstream)(unsafe.Pointer(&stream)) // a handle the caller owns, not Go memory
		return nil
	}
	if err := check("cuStreamCreate(CU_STREAM_NON_BLOCKING)", C.pkv_stream_create(g.ctx, &g.stream)); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	g.ownStream = true
	return nil
}

// Close destroys the stream the backend made and releases its hold on the
// primary context (which lives on while PyTorch or another holder retains
// it; memory the backend allocated and did not free stays allocated then).
func (g *gpu) Close() error {
	var err error
	g.closeOnce.Do(func() {
		if g.ownStream {
			err = check("cuStreamDestroy", C.pkv_stream_destroy(g.ctx, g.stream))
		}
		if e := g.dev.ReleasePrimaryCtx(); e != nil {
			err = errors.Join(err, fmt.Errorf("cuDevicePrimaryCtxRelease: %w", e))
		}
		if err != nil {
			err = fmt.Errorf("cuda: close: %w", err)
		}
	})
	return err
}

func (g *gpu) NumSMs() int { return g.sms }

func (g *gpu) Alloc(bytes int) (DevicePtr, error) {
	var p C.CUdeviceptr
	if err := check("cuMemAlloc", C.pkv_alloc(g.ctx, &p, C.size_t(bytes))); err != nil {
		return 0, fmt.Errorf("cuda: %d bytes: %w", bytes, err)
	}
	return DevicePtr(p), nil
}

func (g *gpu) Free(p DevicePtr) error {
	return wrap(check("cuMemFree", C.pkv_free(g.ctx, ptr(p))))
}

// HtoD copies pageable host memory in stream order and waits for it.
func (g *gpu) HtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return wrap(check("cuMemcpyHtoDAsync+cuStreamSynchronize", C.pkv_htod(g.ctx, ptr(dst), bytesPtr(src), C.size_t(len(src)), g.stream)))
}

// DtoH copies in stream order (after the queued work) and waits for it.
func (g *gpu) DtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return wrap(check("cuMemcpyDtoHAsync+cuStreamSynchronize", C.pkv_dtoh(g.ctx, bytesPtr(dst), ptr(src), C.size_t(len(dst)), g.stream)))
}

// Launch queues kernel on the stream (cuLaunchKernel with a parameter array
// on the C stack: no allocation). A fault in the kernel is reported by a
// later Synchronize or DtoH.
func (g *gpu) Launch(kernel string, grid, block Dim3, sharedBytes int, args []uint64) error {
	fn, ok := g.fns[kernel]
	if !ok {
		return fmt.Errorf("cuda: no entry point %s", kernel)
	}
	var argp *C.uint64_t
	if len(args) > 0 {
		argp = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	return wrap(check("cuLaunchKernel", C.pkv_launch(g.ctx, fn, C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(sharedBytes), g.stream, argp, C.int(len(args)))))
}

// Synchronize waits for the stream's work (cuStreamSynchronize).
func (g *gpu) Synchronize() error {
	return wrap(check("cuStreamSynchronize", C.pkv_sync(g.ctx, g.stream)))
}

// HtoDAsync queues a copy from pinned memory on the stream: it returns
// before the copy is done, so src must not change until the work queued
// after it has run.
func (g *gpu) HtoDAsync(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return wrap(check("cuMemcpyHtoDAsync", C.pkv_htod_async(g.ctx, ptr(dst), bytesPtr(src), C.size_t(len(src)), g.stream)))
}

// DtoD queues a copy within device memory on the stream.
func (g *gpu) DtoD(dst, src DevicePtr, bytes int) error {
	if bytes == 0 {
		return nil
	}
	return wrap(check("cuMemcpyDtoDAsync", C.pkv_dtod(g.ctx, ptr(dst), ptr(src), C.size_t(bytes), g.stream)))
}

// Memset queues cuMemsetD8Async on the stream.
func (g *gpu) Memset(dst DevicePtr, value byte, bytes int) error {
	if bytes == 0 {
		return nil
	}
	return wrap(check("cuMemsetD8Async", C.pkv_memset(g.ctx, ptr(dst), C.uchar(value), C.size_t(bytes), g.stream)))
}

// PinnedAlloc returns page-locked host memory (cuMemAllocHost), which the
// DMA engines read directly, so an asynchronous copy from it overlaps with
// the host.
func (g *gpu) PinnedAlloc(bytes int) ([]byte, error) {
	if bytes <= 0 {
		return nil, nil
	}
	var p unsafe.Pointer
	if err := check("cuMemAllocHost", C.pkv_alloc_host(g.ctx, &p, C.size_t(bytes))); err != nil {
		return nil, fmt.Errorf("cuda: %d bytes: %w", bytes, err)
	}
	return unsafe.Slice((*byte)(p), bytes), nil
}

// PinnedFree releases memory from PinnedAlloc (cuMemFreeHost).
func (g *gpu) PinnedFree(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return wrap(check("cuMemFreeHost", C.pkv_free_host(g.ctx, bytesPtr(b))))
}

// BeginCapture starts a relaxed-mode capture of the stream.
func (g *gpu) BeginCapture() error {
	return wrap(check("cuStreamBeginCapture", C.pkv_begin_capture(g.ctx, g.stream)))
}

// EndCapture ends the capture and instantiates its graph.
func (g *gpu) EndCapture() (GraphExec, error) {
	var exec C.CUgraphExec
	if err := check("cuStreamEndCapture+cuGraphInstantiate", C.pkv_end_capture(g.ctx, g.stream, &exec)); err != nil {
		return 0, wrap(err)
	}
	return GraphExec(uintptr(unsafe.Pointer(exec))), nil
}

// LaunchGraph queues a replay of exec on the stream.
func (g *gpu) LaunchGraph(exec GraphExec) error {
	return wrap(check("cuGraphLaunch", C.pkv_graph_launch(g.ctx, graphExec(exec), g.stream)))
}

// DestroyGraph releases exec.
func (g *gpu) DestroyGraph(exec GraphExec) error {
	return wrap(check("cuGraphExecDestroy", C.pkv_graph_destroy(g.ctx, graphExec(exec))))
}

func graphExec(g GraphExec) C.CUgraphExec {
	return *(*C.CUgraphExec)(unsafe.Pointer(&g)) // a driver handle, not Go memory
}

// wrap prefixes a driver error with the backend's name (nil stays nil).
func wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cuda: %w", err)
}

// cuError is a failed driver call: the call's name and its CUresult.
type cuError struct {
	call string
	code C.CUresult
}

func (e cuError) Error() string {
	var name *C.char
	if C.cuGetErrorName(e.code, &name) == C.CUDA_SUCCESS && name != nil {
		return fmt.Sprintf("%s: %s (%d)", e.call, C.GoString(name), int(e.code))
	}
	return fmt.Sprintf("%s: CUresult %d", e.call, int(e.code))
}

// check turns a CUresult into an error naming call (nil on success). It
// allocates only on failure.
func check(call string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return cuError{call, r}
}

// ptr is p as the driver's CUdeviceptr.
func ptr(p DevicePtr) C.CUdeviceptr { return C.CUdeviceptr(p) }

// bytesPtr is the address of b's first byte (nil when b is empty).
func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}
