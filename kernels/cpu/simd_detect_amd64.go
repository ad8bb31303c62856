//go:build !purego

package cpu

import xcpu "golang.org/x/sys/cpu"

// hasSIMD reports whether the assembly in simd_amd64.s may run: AVX2 and
// FMA with the OS saving YMM state (x/sys/cpu checks both), and F16C.
// Build with -tags purego to use the pure-Go loops everywhere.
var hasSIMD = xcpu.X86.HasAVX2 && xcpu.X86.HasFMA && hasF16C()
