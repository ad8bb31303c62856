package cuda

import (
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/pagedkv/pagedkv/kernels"
)

// Config configures a Backend.
type Config struct {
	// Device is the CUDA device ordinal ([New] only).
	Device int
	// MaxChunkTokens, when > 0, caps the keys one decode block walks: a
	// request with more visible keys is split into chunks of at most this
	// many (split-k) whose partial states are merged by a second kernel.
	// 0 lets the launcher decide from the SM count and the batch shape; < 0
	// never splits, so that the launch grid of a step depends on its batch
	// size only (what a CUDA graph captured per batch size needs).
	MaxChunkTokens int
	// Stream, when not 0, is the CUstream every operation of the backend
	// is queued on ([New] only): an engine's own stream, such as
	// torch.cuda.current_stream().cuda_stream, of the device's primary
	// context. The backend never destroys it. 0: a non-blocking stream the
	// backend creates (and destroys in Close).
	Stream uintptr
}

// Backend is a [kernels.Backend] that runs the CUDA kernels of this package
// on a [Driver].
type Backend struct {
	name string
	drv  Driver
	cnt  *CountingDriver // drv itself
	cfg  Config
	// waits counts the calls that waited for all queued device work
	// (Synchronize, downloads): a Step whose last upload is older than the
	// last wait may reuse its staging buffer without waiting again.
	waits atomic.Uint64
	// capturing is the step whose graph the stream is being captured
	// into (nil: none).
	capturing atomic.Pointer[Step]
}

var _ kernels.Backend = (*Backend)(nil)

// NewWithDriver returns a backend called name that launches on drv. The
// backend counts what crosses drv ([Backend.Traffic]); a drv that is a
// *CountingDriver already is used as it is.
func NewWithDriver(name string, drv Driver, cfg Config) *Backend {
	cd, ok := drv.(*CountingDriver)
	if !ok {
		cd = &CountingDriver{Driver: drv}
	}
	return &Backend{name: name, drv: cd, cnt: cd, cfg: cfg}
}

// Traffic returns what has crossed the host/device boundary so far.
func (b *Backend) Traffic() Traffic { return b.cnt.Traffic() }

// Close releases the device (the CUDA context of [New]); the backend must
// not be used afterwards. It is a no-op for drivers without a Close method.
func (b *Backend) Close() error {
	if c, ok := b.cnt.Driver.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// Name returns the name given to the backend ("cuda" for [New]).
func (b *Backend) Name() string { return b.name }

// i32Bytes views an int32 slice as its little-endian bytes (no copy).
func i32Bytes(s []int32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

// f32Bytes views a float32 slice as its little-endian bytes (no copy).
func f32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

func f64Arg(x float64) uint64 { return math.Float64bits(x) }

// launch checks the argument count against KernelArity and launches.
func (b *Backend) launch(kernel string, grid, block Dim3, smem int, args []uint64) error {
	if n, ok := KernelArity[kernel]; !ok || n != len(args) {
		return fmt.Errorf("%s: kernel %s launched with %d arguments, its entry point takes %d", b.name, kernel, len(args), n)
	}
	if err := b.drv.Launch(kernel, grid, block, smem, args); err != nil {
		return fmt.Errorf("%s: %s grid %v block %v: %w", b.name, kernel, grid, block, err)
	}
	return nil
}

// gridFor is the 1-D grid of a grid-stride loop over n items: enough blocks
// to fill every SM a few times, never more than n.
func (b *Backend) gridFor(n int) int {
	g := 8 * max(b.drv.NumSMs(), 1)
	return max(min(n, g), 1)
}

// threadsFor is a block size for units copy units per item: a whole number
// of warps, at most 256.
func threadsFor(units int64) int {
	t := (units + 31) / 32 * 32
	return int(min(max(t, 32), 256))
}
