package cuda

import "embed"

// Regenerate the PTX after changing a .cu or .cuh file (needs only apt and
// dpkg; see scripts/nvcc.sh). CI regenerates it and fails when it differs.
//go:generate bash ../../scripts/nvcc.sh ptx

// Modules are the PTX modules of the kernels, by file name, for sm_80
// (the driver JIT-compiles them for newer GPUs).
var Modules = map[string]string{
	"append.ptx":    appendPTX,
	"decode.ptx":    decodePTX,
	"decode_tc.ptx": decodeTCPTX,
	"prefill.ptx":   prefillPTX,
	"states.ptx":    statesPTX,
	"mla_tc.ptx":    mlaTCPTX,
}

// modulesSM90 are the same modules built for sm_90, where fp8 K/V widen
// with the packed hardware converts (cvt.rn.f16x2.e4m3x2); same file names
// as Modules.
var modulesSM90 = map[string]string{
	"append.ptx":    appendSM90PTX,
	"decode.ptx":    decodeSM90PTX,
	"decode_tc.ptx": decodeTCSM90PTX,
	"prefill.ptx":   prefillSM90PTX,
	"states.ptx":    statesSM90PTX,
	"mla_tc.ptx":    mlaTCSM90PTX,
}

// ModulesFor returns the PTX modules to load on a device of compute
// capability major.minor: the sm_90 build from 9.0 on, else the sm_80
// build (Modules). The maps are shared: do not modify them.
func ModulesFor(major, minor int) map[string]string {
	if major >= 9 {
		return modulesSM90
	}
	return Modules
}

//go:embed append.ptx
var appendPTX string

//go:embed decode.ptx
var decodePTX string

//go:embed prefill.ptx
var prefillPTX string

//go:embed decode_tc.ptx
var decodeTCPTX string

//go:embed states.ptx
var statesPTX string

//go:embed mla_tc.ptx
var mlaTCPTX string

//go:embed append_sm90.ptx
var appendSM90PTX string

//go:embed decode_sm90.ptx
var decodeSM90PTX string

//go:embed prefill_sm90.ptx
var prefillSM90PTX string

//go:embed decode_tc_sm90.ptx
var decodeTCSM90PTX string

//go:embed states_sm90.ptx
var statesSM90PTX string

//go:embed mla_tc_sm90.ptx
var mlaTCSM90PTX string

// Sources holds the .cu and .cuh files the PTX is made from. internal/cpuemu
// compiles the same files with g++; embedding them here also makes any
// change to them change this package, so Go's build cache rebuilds the
// emulator (cgo does not track headers outside a package's directory).
//
//go:embed *.cu *.cuh
var Sources embed.FS
