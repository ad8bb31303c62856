//go:build !cgo

// This file must be kept in sync with backend_emu.go.

package main

import (
	"errors"

	"github.com/pagedkv/pagedkv/kernels"
)

func init() {
	registerBackend("emu", backendFactory{
		stub:    true,
		summary: "the CUDA kernels compiled for the CPU (needs a cgo build)",
		open: func() (kernels.Backend, error) {
			return nil, errors.New("this pagedkv was built with CGO_ENABLED=0; the emulator needs cgo and g++")
		},
	})
}
