//go:build cuda

package cuda

// gorgonia.org/cu v0.9.6 binds cuMemFreeHost but not cuMemAllocHost; this
// file binds the one missing call against the same cuda.h and libcuda.

// #cgo LDFLAGS: -lcuda
// #include <cuda.h>
import "C"

import (
	"fmt"
	"unsafe"
)

// memAllocHost is cuMemAllocHost; the context must be current on the
// calling thread.
func memAllocHost(bytes int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if r := C.cuMemAllocHost(&p, C.size_t(bytes)); r != C.CUDA_SUCCESS {
		return nil, fmt.Errorf("CUresult %d", int(r))
	}
	return p, nil
}
