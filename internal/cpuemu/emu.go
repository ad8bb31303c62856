package cpuemu

// #cgo CXXFLAGS: -std=c++20 -O2 -fno-strict-aliasing -Wno-unknown-pragmas -Wall -I${SRCDIR}
// #cgo LDFLAGS: -lstdc++ -lpthread
// #include <stdlib.h>
// #include "emu.h"
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
)

// Config configures the emulated device.
type Config struct {
	// NumSMs is the SM count launches are planned for; 0 means 132, an
	// H100 SXM, so the emulator takes the same grid and split-k decisions.
	NumSMs int
	// MaxChunkTokens is passed to the launcher (see cuda.Config): > 0
	// forces decode split-k with chunks of at most this many keys.
	MaxChunkTokens int
}

// New returns the emulator backend (Name "emu") as a kernels.Backend.
func New(cfg Config) kernels.Backend { return NewDevice(cfg) }

// NewDevice returns the emulator backend with its device-resident API
// (caches, tensors and steps in emulated device memory, which is C memory
// of this process).
func NewDevice(cfg Config) *cuda.Backend {
	return cuda.NewWithDriver("emu", NewDriver(cfg.NumSMs), cuda.Config{MaxChunkTokens: cfg.MaxChunkTokens})
}

// Driver is the emulated device: C memory and kernels compiled for the CPU.
type Driver struct {
	sms int
	g   graphs
}

// NewDriver returns the emulated device planning for numSMs SMs (0: 132).
func NewDriver(numSMs int) *Driver {
	if numSMs <= 0 {
		numSMs = 132
	}
	return &Driver{sms: numSMs}
}

var _ cuda.Driver = (*Driver)(nil)

// ErrLaunch is wrapped by every launch failure the emulator reports
// (deadlock, partial-warp collective, __trap, invalid configuration).
var ErrLaunch = errors.New("cpuemu: launch failed")

// NumSMs returns the planned SM count.
func (d *Driver) NumSMs() int { return d.sms }

// Alloc returns bytes of C memory, 256-byte aligned, filled with 0xFF.
func (d *Driver) Alloc(bytes int) (cuda.DevicePtr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cpuemu: alloc of %d bytes", bytes)
	}
	p := C.cuemu_alloc(C.size_t(bytes))
	if p == 0 {
		return 0, fmt.Errorf("cpuemu: out of memory allocating %d bytes", bytes)
	}
	return cuda.DevicePtr(p), nil
}

// Free releases memory from Alloc.
func (d *Driver) Free(p cuda.DevicePtr) error {
	C.cuemu_free(C.uint64_t(p))
	return nil
}

// HtoD copies src to dst.
func (d *Driver) HtoD(dst cuda.DevicePtr, src []byte) error {
	if err := d.g.refuseWhileCapturing("HtoD"); err != nil {
		return err
	}
	d.htod(dst, src)
	return nil
}

func (d *Driver) htod(dst cuda.DevicePtr, src []byte) {
	if len(src) > 0 {
		C.cuemu_htod(C.uint64_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)))
	}
}

// HtoDAsync copies src to dst (the emulator runs every operation when it
// is queued), or records the copy during a capture.
func (d *Driver) HtoDAsync(dst cuda.DevicePtr, src []byte) error {
	if !d.g.record(op{kind: opHtoD, dst: dst, host: src}) {
		d.htod(dst, src)
	}
	return nil
}

// DtoD copies bytes bytes from src to dst (memmove: they may overlap).
func (d *Driver) DtoD(dst, src cuda.DevicePtr, bytes int) error {
	if !d.g.record(op{kind: opDtoD, dst: dst, src: src, bytes: bytes}) {
		d.dtod(dst, src, bytes)
	}
	return nil
}

func (d *Driver) dtod(dst, src cuda.DevicePtr, bytes int) {
	if bytes > 0 {
		C.cuemu_dtod(C.uint64_t(dst), C.uint64_t(src), C.size_t(bytes))
	}
}

// Memset sets bytes bytes at dst to value.
func (d *Driver) Memset(dst cuda.DevicePtr, value byte, bytes int) error {
	if !d.g.record(op{kind: opMemset, dst: dst, value: value, bytes: bytes}) {
		d.memset(dst, value, bytes)
	}
	return nil
}

func (d *Driver) memset(dst cuda.DevicePtr, value byte, bytes int) {
	if bytes > 0 {
		C.cuemu_memset(C.uint64_t(dst), C.int(value), C.size_t(bytes))
	}
}

// PinnedAlloc returns Go memory: every host page is as good as pinned here.
func (d *Driver) PinnedAlloc(bytes int) ([]byte, error) {
	if bytes < 0 {
		return nil, fmt.Errorf("cpuemu: host alloc of %d bytes", bytes)
	}
	return make([]byte, bytes), nil
}

// PinnedFree releases memory from PinnedAlloc (the garbage collector does).
func (d *Driver) PinnedFree([]byte) error { return nil }

// Synchronize returns at once (launches and copies finish before they
// return), or fails during a capture.
func (d *Driver) Synchronize() error { return d.g.refuseWhileCapturing("Synchronize") }

// DtoH copies len(dst) bytes at src to dst.
func (d *Driver) DtoH(dst []byte, src cuda.DevicePtr) error {
	if err := d.g.refuseWhileCapturing("DtoH"); err != nil {
		return err
	}
	if len(dst) > 0 {
		C.cuemu_dtoh(unsafe.Pointer(&dst[0]), C.uint64_t(src), C.size_t(len(dst)))
	}
	return nil
}

// Launch runs kernel on the CPU and returns when every block has finished,
// or records the launch (with a copy of args) during a capture.
func (d *Driver) Launch(kernel string, grid, block cuda.Dim3, sharedBytes int, args []uint64) error {
	if d.g.active() && d.g.record(op{kind: opLaunch, kernel: kernel, grid: grid, block: block, shared: sharedBytes, args: append([]uint64(nil), args...)}) {
		return nil
	}
	return d.launch(kernel, grid, block, sharedBytes, args)
}

func (d *Driver) launch(kernel string, grid, block cuda.Dim3, sharedBytes int, args []uint64) error {
	name := C.CString(kernel)
	defer C.free(unsafe.Pointer(name))
	var errbuf [512]C.char
	var argp *C.uint64_t
	if len(args) > 0 {
		argp = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	rc := C.cuemu_launch(name, C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z), C.uint(block.X), C.uint(block.Y),
		C.uint(block.Z), C.size_t(sharedBytes), argp, C.int(len(args)), &errbuf[0], C.size_t(len(errbuf)))
	if rc != 0 {
		return fmt.Errorf("%w: %s", ErrLaunch, C.GoString(&errbuf[0]))
	}
	return nil
}

// Arity returns the argument count of the compiled entry point kernel, or
// -1 when the emulator has no such kernel.
func Arity(kernel string) int {
	name := C.CString(kernel)
	defer C.free(unsafe.Pointer(name))
	return int(C.cuemu_arity(name))
}

// The shim's testing switches (cuemu.h), for this package's tests; the
// environment variables CUEMU_DROP_SYNC and CUEMU_MMA set the same two for a
// whole process. They are global: a test that sets one must not run in
// parallel with other launches.

// dropSync makes the __syncthreads, cp_async_wait or cp_async_commit called
// at site ("decode.cu:150": the file's base name and the line) a no-op,
// until dropSync(""). Returns an error for a malformed site.
func dropSync(site string) error {
	v := C.CString(site)
	defer C.free(unsafe.Pointer(v))
	var errbuf [256]C.char
	return switchErr(C.cuemu_drop_sync(v, &errbuf[0], C.size_t(len(errbuf))), errbuf[:])
}

// setMMA selects how the mma twin sums: "exact" (in order, in f32) or
// "tc" (as a tensor core may: cuemu::tc_dot16).
func setMMA(mode string) error {
	v := C.CString(mode)
	defer C.free(unsafe.Pointer(v))
	var errbuf [256]C.char
	return switchErr(C.cuemu_set_mma(v, &errbuf[0], C.size_t(len(errbuf))), errbuf[:])
}

func switchErr(rc C.int, errbuf []C.char) error {
	if rc != 0 {
		return fmt.Errorf("cpuemu: %s", C.GoString(&errbuf[0]))
	}
	return nil
}
