package cuda

import "embed"

// Regenerate the PTX after changing a .cu or .cuh file (needs only apt and
// dpkg; see scripts/nvcc.sh). CI regenerates it and fails when it differs.
//go:generate bash ../../scripts/nvcc.sh ptx

// The PTX of each kernel source <k>.cu is ptx/<k>.ptx, built for sm_80, and,
// only where nvcc's sm_90 build differs from it in more than the .target
// line, ptx/<k>_sm90.ptx. scripts/nvcc.sh decides which sm_90 builds exist;
// TestPTXFilesAreTheEmbeddedModules checks that the files of ptx/ and the
// modules below agree.

// Modules are the PTX modules of the kernels for sm_80, by file name
// (<k>.ptx for <k>.cu); the driver JIT-compiles them for newer GPUs.
var Modules = map[string]string{
	"append.ptx":     appendPTX,
	"decode.ptx":     decodePTX,
	"decode_tc.ptx":  decodeTCPTX,
	"prefill.ptx":    prefillPTX,
	"merge.ptx":      mergePTX,
	"mla_decode.ptx": mlaDecodePTX,
	"mla_tc.ptx":     mlaTCPTX,
}

// sm90Builds are the modules with an sm_90 build of their own: those whose
// code differs on sm_90, where fp8 K/V widen with the packed hardware
// converts (cvt.rn.f16x2.e4m3x2). Same file names as Modules.
var sm90Builds = map[string]string{
	"decode.ptx":    decodeSM90PTX,
	"decode_tc.ptx": decodeTCSM90PTX,
	"prefill.ptx":   prefillSM90PTX,
	"mla_tc.ptx":    mlaTCSM90PTX,
}

// modulesSM90 are the modules loaded from compute capability 9.0 on: the
// sm_90 build where there is one, else the sm_80 build (whose sm_90 build
// would differ only in its .target line), JIT-compiled by the driver.
var modulesSM90 = func() map[string]string {
	m := map[string]string{}
	for file, ptx := range Modules {
		m[file] = ptx
		if ptx90, ok := sm90Builds[file]; ok {
			m[file] = ptx90
		}
	}
	return m
}()

// ModulesFor returns the PTX modules to load on a device of compute
// capability major.minor: from 9.0 on the sm_90 builds where they exist
// (modulesSM90), else the sm_80 builds (Modules). The maps are shared: do
// not modify them.
func ModulesFor(major, minor int) map[string]string {
	if major >= 9 {
		return modulesSM90
	}
	return Modules
}

//go:embed ptx/append.ptx
var appendPTX string

//go:embed ptx/decode.ptx
var decodePTX string

//go:embed ptx/decode_tc.ptx
var decodeTCPTX string

//go:embed ptx/prefill.ptx
var prefillPTX string

//go:embed ptx/merge.ptx
var mergePTX string

//go:embed ptx/mla_decode.ptx
var mlaDecodePTX string

//go:embed ptx/mla_tc.ptx
var mlaTCPTX string

//go:embed ptx/decode_sm90.ptx
var decodeSM90PTX string

//go:embed ptx/decode_tc_sm90.ptx
var decodeTCSM90PTX string

//go:embed ptx/prefill_sm90.ptx
var prefillSM90PTX string

//go:embed ptx/mla_tc_sm90.ptx
var mlaTCSM90PTX string

// Sources holds the .cu and .cuh files the PTX is made from. internal/cpuemu
// compiles the same files with g++; embedding them here also makes any
// change to them change this package, so Go's build cache rebuilds the
// emulator (cgo does not track headers outside a package's directory).
//
//go:embed *.cu *.cuh
var Sources embed.FS
