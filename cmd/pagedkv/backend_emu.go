//go:build cgo

// This file must be kept in sync with backend_noemu.go.

package main

import (
	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels"
)

func init() {
	registerBackend("emu", backendFactory{
		summary: "the CUDA kernels compiled for the CPU (internal/cpuemu); append, MLA append and decode",
		open:    func() (kernels.Backend, error) { return cpuemu.New(cpuemu.Config{}), nil },
	})
}
