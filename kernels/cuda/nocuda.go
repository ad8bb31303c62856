//go:build !cuda

package cuda

import (
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
)

// New returns the GPU backend. This build has no CUDA support (build with
// -tags cuda on a machine with the CUDA driver), so it always fails with an
// error wrapping kernels.ErrNoDevice.
func New(cfg Config) (*Backend, error) {
	return nil, fmt.Errorf("cuda: built without -tags cuda: %w", kernels.ErrNoDevice)
}
