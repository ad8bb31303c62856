//go:build !amd64 || purego

package cpu

// Without assembly (another architecture, or -tags purego) the pure-Go
// loops run everywhere; arm64 has no NEON version yet. The stubs below are
// never called: hasSIMD is a false constant, so the compiler drops every
// branch that would.
const hasSIMD = false

const noAsm = "cpu: no assembly in this build"

func widenF16Vec(dst *float32, src *byte, n int)                            { panic(noAsm) }
func widenBF16Vec(dst *float32, src *byte, n int)                           { panic(noAsm) }
func dot4Vec(q *float32, d int, k *float32, n int) (s0, s1, s2, s3 float32) { panic(noAsm) }
func axpy4Vec(acc *float32, v *float32, ts int, p *[4]float32, n int)       { panic(noAsm) }

func logits4F16Vec(s *float32, ss int, q *float32, qs int, d int, k *byte, ks int, hs int, T int, heads int) {
	panic(noAsm)
}
func logits4BF16Vec(s *float32, ss int, q *float32, qs int, d int, k *byte, ks int, hs int, T int, heads int) {
	panic(noAsm)
}
func attnV4F16Vec(acc *float32, as int, d int, v *byte, vs int, hs int, p *float32, ss int, T int, heads int) {
	panic(noAsm)
}
func attnV4BF16Vec(acc *float32, as int, d int, v *byte, vs int, hs int, p *float32, ss int, T int, heads int) {
	panic(noAsm)
}
func expBlock4Vec(s *float32, n int, m *[4]float32, l *[4]float32) { panic(noAsm) }
func prefetchSpan(p *byte, n int)                                  { panic(noAsm) }
