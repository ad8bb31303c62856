//go:build cuda

// This file must be kept in sync with backend_nocuda.go.

package main

import (
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
)

func init() {
	registerBackend("cuda", backendFactory{
		summary: "the CUDA kernels on GPU 0 (kernels/cuda)",
		open: func() (kernels.Backend, error) {
			b, err := cuda.New(cuda.Config{})
			if err != nil {
				return nil, err
			}
			return b, nil
		},
	})
}
