package cuda

import "embed"

// Regenerate the PTX after changing a .cu or .cuh file (needs only apt and
// dpkg; see scripts/nvcc.sh). CI regenerates it and fails when it differs.
//go:generate bash ../../scripts/nvcc.sh ptx

// Modules are the PTX modules of the kernels, by file name, for sm_80
// (the driver JIT-compiles them for newer GPUs).
var Modules = map[string]string{
	"append.ptx": appendPTX,
	"decode.ptx": decodePTX,
	"states.ptx": statesPTX,
}

//go:embed append.ptx
var appendPTX string

//go:embed decode.ptx
var decodePTX string

//go:embed states.ptx
var statesPTX string

// Sources holds the .cu and .cuh files the PTX is made from. internal/cpuemu
// compiles the same files with g++; embedding them here also makes any
// change to them change this package, so Go's build cache rebuilds the
// emulator (cgo does not track headers outside a package's directory).
//
//go:embed *.cu *.cuh
var Sources embed.FS
