//go:build cgo

// This file must be kept in sync with backend_noemu.go.

package main

import (
	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels"
)

func init() {
	registerBackend("emu", backendFactory{
		summary: "the CUDA kernels compiled for the CPU (internal/cpuemu), device-resident path; every op",
		open:    func() (kernels.Backend, error) { return cpuemu.New(cpuemu.Config{}), nil },
	})
}
