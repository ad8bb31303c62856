//go:build cuda

package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/pkg/errors"
	"gorgonia.org/cu"

	"github.com/pagedkv/pagedkv/kernels"
)

// New returns the GPU backend on device cfg.Device: a CUDA context on a
// dedicated OS thread, the embedded PTX modules loaded (the driver
// JIT-compiles them for the device), and every entry point resolved. It fails
// with an error wrapping kernels.ErrNoDevice when the device does not exist.
// Close releases the context.
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
	g := &gpu{calls: make(chan func(), 1)}
	started := make(chan error)
	go g.serve(cfg.Device, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return NewWithDriver("cuda", g, cfg), nil
}

// gpu is the Driver over gorgonia.org/cu. A CUDA context is current on one
// OS thread, so every driver call runs on the goroutine serve locks to its
// thread; callers hand it closures through calls.
type gpu struct {
	calls chan func()
	sms   int
	name  string
	ctx   cu.CUContext
	fns   map[string]cu.Function
}

func (g *gpu) serve(ordinal int, started chan<- error) {
	runtime.LockOSThread()
	err := g.init(ordinal)
	if err != nil && g.ctx != (cu.CUContext{}) {
		_ = g.ctx.Destroy() // a module failed to load: release what init made
	}
	started <- err
	if err != nil {
		return
	}
	for f := range g.calls {
		f()
	}
}

func (g *gpu) init(ordinal int) error {
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return fmt.Errorf("cuda: cuDeviceGet(%d): %w: %w", ordinal, err, kernels.ErrNoDevice)
	}
	if g.name, err = dev.Name(); err != nil {
		return fmt.Errorf("cuda: cuDeviceGetName: %w", err)
	}
	if g.sms, err = dev.Attribute(cu.MultiprocessorCount); err != nil {
		return fmt.Errorf("cuda: cuDeviceGetAttribute(MULTIPROCESSOR_COUNT): %w", err)
	}
	if g.ctx, err = dev.MakeContext(cu.SchedAuto); err != nil {
		return fmt.Errorf("cuda: cuCtxCreate on %s: %w", g.name, err)
	}
	g.fns = map[string]cu.Function{}
	for file, ptx := range Modules {
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
			g.fns[name] = fn
		}
	}
	for name := range KernelArity {
		if _, ok := g.fns[name]; !ok {
			return fmt.Errorf("cuda: entry point %s is in no embedded PTX module", name)
		}
	}
	return nil
}

// Close destroys the context (and with it every module and allocation) and
// ends the context's goroutine.
func (g *gpu) Close() error {
	err := g.do(func() error { return g.ctx.Destroy() })
	close(g.calls)
	return errors.Wrap(err, "cuda: cuCtxDestroy")
}

// do runs f on the context's thread and returns its error.
func (g *gpu) do(f func() error) error {
	done := make(chan error, 1)
	g.calls <- func() { done <- f() }
	return <-done
}

func (g *gpu) NumSMs() int { return g.sms }

func (g *gpu) Alloc(bytes int) (DevicePtr, error) {
	var p cu.DevicePtr
	err := g.do(func() (err error) {
		p, err = cu.MemAlloc(int64(bytes))
		return err
	})
	if err != nil {
		return 0, errors.Wrapf(err, "cuda: cuMemAlloc(%d)", bytes)
	}
	return DevicePtr(p), nil
}

func (g *gpu) Free(p DevicePtr) error {
	return errors.Wrap(g.do(func() error { return cu.MemFree(cu.DevicePtr(p)) }), "cuda: cuMemFree")
}

func (g *gpu) HtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	err := g.do(func() error {
		return cu.MemcpyHtoD(cu.DevicePtr(dst), unsafe.Pointer(&src[0]), int64(len(src)))
	})
	return errors.Wrapf(err, "cuda: cuMemcpyHtoD(%d bytes)", len(src))
}

func (g *gpu) DtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	err := g.do(func() error {
		return cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), cu.DevicePtr(src), int64(len(dst)))
	})
	return errors.Wrapf(err, "cuda: cuMemcpyDtoH(%d bytes)", len(dst))
}

// Launch passes args as gorgonia's Launch wants them: one pointer per
// argument, each read as 8 bytes. It queues the kernel on the context's
// default (legacy) stream and returns; a fault in the kernel is reported by
// the next Synchronize or DtoH (cuMemcpyDtoH waits for the stream).
func (g *gpu) Launch(kernel string, grid, block Dim3, sharedBytes int, args []uint64) error {
	fn, ok := g.fns[kernel]
	if !ok {
		return fmt.Errorf("cuda: no entry point %s", kernel)
	}
	params := make([]unsafe.Pointer, len(args))
	for i := range args {
		params[i] = unsafe.Pointer(&args[i])
	}
	return g.do(func() error {
		if err := fn.Launch(grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, sharedBytes, cu.Stream{}, params); err != nil {
			return fmt.Errorf("cuLaunchKernel: %w", err)
		}
		return nil
	})
}

// Synchronize waits for the context's work (cuCtxSynchronize).
func (g *gpu) Synchronize() error {
	return errors.Wrap(g.do(cu.Synchronize), "cuda: cuCtxSynchronize")
}

// HtoDAsync queues a copy from pinned memory on the default stream
// (cuMemcpyHtoDAsync): it returns before the copy is done, so src must not
// change until the work queued after it has run.
func (g *gpu) HtoDAsync(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	err := g.do(func() error {
		return cu.MemcpyHtoDAsync(cu.DevicePtr(dst), unsafe.Pointer(&src[0]), int64(len(src)), cu.Stream{})
	})
	return errors.Wrapf(err, "cuda: cuMemcpyHtoDAsync(%d bytes)", len(src))
}

// DtoD copies within device memory (cuMemcpyDtoD).
func (g *gpu) DtoD(dst, src DevicePtr, bytes int) error {
	if bytes == 0 {
		return nil
	}
	return errors.Wrap(g.do(func() error { return cu.MemcpyDtoD(cu.DevicePtr(dst), cu.DevicePtr(src), int64(bytes)) }), "cuda: cuMemcpyDtoD")
}

// Memset queues cuMemsetD8.
func (g *gpu) Memset(dst DevicePtr, value byte, bytes int) error {
	if bytes == 0 {
		return nil
	}
	return errors.Wrap(g.do(func() error { return cu.MemsetD8(cu.DevicePtr(dst), value, int64(bytes)) }), "cuda: cuMemsetD8")
}

// HostAlloc returns page-locked host memory (cuMemAllocHost), which the
// DMA engines read directly, so an asynchronous copy from it overlaps with
// the host.
func (g *gpu) HostAlloc(bytes int) ([]byte, error) {
	if bytes <= 0 {
		return nil, nil
	}
	var p unsafe.Pointer
	err := g.do(func() error {
		var err error
		p, err = memAllocHost(bytes)
		return err
	})
	if err != nil {
		return nil, errors.Wrapf(err, "cuda: cuMemAllocHost(%d)", bytes)
	}
	return unsafe.Slice((*byte)(p), bytes), nil
}

// HostFree releases memory from HostAlloc (cuMemFreeHost).
func (g *gpu) HostFree(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return errors.Wrap(g.do(func() error { return cu.MemFreeHost(unsafe.Pointer(&b[0])) }), "cuda: cuMemFreeHost")
}
