package cpu

import (
	"math"
	"sync"
)

// Small float32 loops shared by decode, prefill and MLA decode. Go has no
// SIMD intrinsics; four independent accumulators let the CPU overlap the
// multiply-adds, and the re-slicing up front removes the bounds checks from
// the loop bodies.

// dot returns sum_i a[i]*b[i] over len(a) (b must be at least as long).
func dot(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		aa, bb := a[i:i+4:i+4], b[i:i+4:i+4]
		s0 += aa[0] * bb[0]
		s1 += aa[1] * bb[1]
		s2 += aa[2] * bb[2]
		s3 += aa[3] * bb[3]
	}
	for ; i < n; i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy does y[i] += alpha*x[i] over len(y) (x must be at least as long).
func axpy(alpha float32, x, y []float32) {
	n := len(y)
	x = x[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		xx, yy := x[i:i+4:i+4], y[i:i+4:i+4]
		yy[0] += alpha * xx[0]
		yy[1] += alpha * xx[1]
		yy[2] += alpha * xx[2]
		yy[3] += alpha * xx[3]
	}
	for ; i < n; i++ {
		y[i] += alpha * x[i]
	}
}

// scaleTo does y[i] = alpha*x[i].
func scaleTo(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] = alpha * x[i]
	}
}

func scaleInPlace(alpha float32, y []float32) {
	for i := range y {
		y[i] *= alpha
	}
}

func exp2f(x float32) float32 { return float32(math.Exp2(float64(x))) }
func log2f(x float32) float32 { return float32(math.Log2(float64(x))) }

var negInf = float32(math.Inf(-1))

// onlineState is the running softmax of one query row in the base-2 domain
// (FlashInfer's state_t): m is the largest logit*log2(e) seen, l is
// sum_j 2^(s_j - m), and acc (held by the caller) is sum_j 2^(s_j - m) v_j.
// With m == -inf nothing has been seen and acc is all zero.
type onlineState struct {
	m, l float32
}

// update folds key logit s2 (base 2) with value row v into the state and acc.
// acc is rescaled only when the maximum grows, which on typical data happens
// O(log L) times per row, so the cost per key is one exp2 and one axpy.
func (st *onlineState) update(s2 float32, v, acc []float32) {
	var p float32 = 1
	switch {
	case s2 > st.m:
		if st.m != negInf {
			r := exp2f(st.m - s2)
			st.l *= r
			scaleInPlace(r, acc)
		}
		st.m = s2
	default:
		p = exp2f(s2 - st.m)
	}
	st.l += p
	axpy(p, v, acc)
}

// finish writes o = acc * vScale / l into out and returns the base-2 LSE
// m + log2(l); a state that saw no key gives o = 0 and -inf.
func (st *onlineState) finish(out, acc []float32, vScale float32) float32 {
	if st.m == negInf || st.l == 0 {
		clear(out)
		return negInf
	}
	scaleTo(out, vScale/st.l, acc)
	return st.m + log2f(st.l)
}

// floatPool hands out []float32 scratch. Entries are *[]float32 so Put does
// not allocate.
var floatPool = sync.Pool{New: func() any { return new([]float32) }}

// getFloats returns a zeroed scratch slice of length n; give it back with
// putFloats.
func getFloats(n int) *[]float32 {
	p := floatPool.Get().(*[]float32)
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	*p = (*p)[:n]
	clear(*p)
	return p
}

func putFloats(p *[]float32) { floatPool.Put(p) }
