//go:build !amd64 || purego

package cpu

// Without assembly (another architecture, or -tags purego) the pure-Go
// loops run everywhere; arm64 has no NEON version yet. The stubs below are
// never called: hasSIMD is a false constant, so the compiler drops every
// branch that would.
const hasSIMD = false

const noAsm = "cpu: no assembly in this build"

func widenF16AVX(dst *float32, src *byte, n int)                            { panic(noAsm) }
func widenBF16AVX(dst *float32, src *byte, n int)                           { panic(noAsm) }
func dot4AVX(q *float32, d int, k *float32, n int) (s0, s1, s2, s3 float32) { panic(noAsm) }
func axpy4AVX(acc *float32, v *float32, ts int, p *[4]float32, n int)       { panic(noAsm) }

func dot4F16AVX(q *float32, d int, k *byte, n int) (s0, s1, s2, s3 float32)  { panic(noAsm) }
func dot4BF16AVX(q *float32, d int, k *byte, n int) (s0, s1, s2, s3 float32) { panic(noAsm) }
func axpy4F16AVX(acc *float32, v *byte, ts int, p *[4]float32, n int)        { panic(noAsm) }
func axpy4BF16AVX(acc *float32, v *byte, ts int, p *[4]float32, n int)       { panic(noAsm) }
func axpy1F16AVX(acc *float32, v *byte, p float32, n int)                    { panic(noAsm) }
func axpy1BF16AVX(acc *float32, v *byte, p float32, n int)                   { panic(noAsm) }
