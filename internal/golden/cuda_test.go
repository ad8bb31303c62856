//go:build cuda

package golden

import (
	"errors"
	"testing"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/cuda"
)

// TestShippedCasesOnCUDA runs every shipped case on the GPU (with the CPU
// backend as fallback for the operations the kernels do not cover).
func TestShippedCasesOnCUDA(t *testing.T) {
	b, err := cuda.New(cuda.Config{})
	if errors.Is(err, kernels.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	runAll(t, &Runner{Backend: b, Fallback: cpu.New(cpu.Config{})}, shippedCases(t))
}
