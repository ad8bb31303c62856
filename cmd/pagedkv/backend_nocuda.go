//go:build !cuda

// This file must be kept in sync with backend_cuda.go.

package main

import (
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
)

func init() {
	registerBackend("cuda", backendFactory{
		stub:    true,
		summary: "the CUDA kernels on a GPU (needs a build with -tags cuda)",
		open: func() (kernels.Backend, error) {
			return nil, fmt.Errorf("this pagedkv was built without -tags cuda (go build -tags cuda ./cmd/pagedkv on a machine with the CUDA driver): %w", kernels.ErrNoDevice)
		},
	})
}
