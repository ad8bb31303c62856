//go:build !cuda && cgo

package cuda_test

import "testing"

// gpuBackends is empty without -tags cuda.
func gpuBackends(*testing.T) []backend { return nil }
