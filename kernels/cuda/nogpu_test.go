//go:build !cuda && cgo

package cuda_test

import (
	"testing"

	"github.com/pagedkv/pagedkv/kernels/cuda"
)

// gpuBackends is empty without -tags cuda.
func gpuBackends(*testing.T) []backend { return nil }

// gpuDevice is nil without -tags cuda.
func gpuDevice(testing.TB) *cuda.Backend { return nil }
