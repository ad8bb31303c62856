package cpu

import (
	"encoding/binary"
	"math"
	"sync"

	"github.com/pagedkv/pagedkv/layout"
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

// dot4 returns the dot products of the four rows q[0:d], q[d:2d], q[2d:3d],
// q[3d:4d] with k[:d]. Reading k once for four queries is what makes GQA
// decode cheaper than four separate dots. With AVX2+FMA the first d&^7
// elements go through dot4Vec (eight lanes, fused multiply-adds: the sums
// differ from dot4Go's in the last bits).
func dot4(q, k []float32, d int) (s0, s1, s2, s3 float32) {
	if !hasSIMD || d < 8 {
		return dot4Go(q, k, d)
	}
	k = k[:d]
	q = q[:4*d]
	n := d &^ 7
	s0, s1, s2, s3 = dot4Vec(&q[0], d, &k[0], n)
	for i := n; i < d; i++ {
		kv := k[i]
		s0 += q[i] * kv
		s1 += q[d+i] * kv
		s2 += q[2*d+i] * kv
		s3 += q[3*d+i] * kv
	}
	return
}

// dot4Go is dot4 in pure Go: the fallback, and the model dot4Vec is tested
// against.
func dot4Go(q, k []float32, d int) (s0, s1, s2, s3 float32) {
	k = k[:d]
	q0, q1, q2, q3 := q[:d:d], q[d:2*d:2*d], q[2*d:3*d:3*d], q[3*d:4*d:4*d]
	q0, q1, q2, q3 = q0[:len(k)], q1[:len(k)], q2[:len(k)], q3[:len(k)] // lets the compiler drop the bounds checks below
	for i, kv := range k {
		s0 += q0[i] * kv
		s1 += q1[i] * kv
		s2 += q2[i] * kv
		s3 += q3[i] * kv
	}
	return
}

// dotRows writes out[j] = q[j*d:(j+1)*d] · k[:d] for j < len(out).
func dotRows(out, q, k []float32, d int) {
	j := 0
	for ; j+4 <= len(out); j += 4 {
		out[j], out[j+1], out[j+2], out[j+3] = dot4(q[j*d:(j+4)*d], k, d)
	}
	for ; j < len(out); j++ {
		out[j] = dot(q[j*d:(j+1)*d], k[:d])
	}
}

// axpy4 does acc[j*d:(j+1)*d] += p[j]*v[:d] for j < 4, reading v once.
func axpy4(p0, p1, p2, p3 float32, v, acc []float32, d int) {
	v = v[:d]
	a0, a1, a2, a3 := acc[:d:d], acc[d:2*d:2*d], acc[2*d:3*d:3*d], acc[3*d:4*d:4*d]
	a0, a1, a2, a3 = a0[:len(v)], a1[:len(v)], a2[:len(v)], a3[:len(v)] // lets the compiler drop the bounds checks below
	for i, x := range v {
		a0[i] += p0 * x
		a1[i] += p1 * x
		a2[i] += p2 * x
		a3[i] += p3 * x
	}
}

// axpyRows does acc[j*d:(j+1)*d] += p[j]*v[:d] for j < len(p).
func axpyRows(p, v, acc []float32, d int) {
	j := 0
	for ; j+4 <= len(p); j += 4 {
		axpy4(p[j], p[j+1], p[j+2], p[j+3], v, acc[j*d:(j+4)*d], d)
	}
	for ; j < len(p); j++ {
		axpy(p[j], v[:d], acc[j*d:(j+1)*d])
	}
}

// widenRow converts len(dst) elements of dtype dt at the start of src to
// float32, exactly (the same values as layout.LoadRowF32, except that the
// F16C path returns a signalling f16 NaN quieted). With F16C/AVX2
// f16 and bf16 rows go eight elements per instruction (widenF16Vec,
// widenBF16Vec); otherwise the narrow dtypes are read eight bytes at a
// time, f16 and fp8 through layout's lookup tables.
func widenRow(dst []float32, dt layout.DType, src []byte) {
	n := len(dst)
	if hasSIMD && n >= 8 && (dt == layout.F16 || dt == layout.BF16) {
		src = src[:2*n]
		n8 := n &^ 7
		if dt == layout.F16 {
			widenF16Vec(&dst[0], &src[0], n8)
		} else {
			widenBF16Vec(&dst[0], &src[0], n8)
		}
		widenRowGo(dst[n8:], dt, src[2*n8:])
		return
	}
	widenRowGo(dst, dt, src)
}

// widenRowGo is widenRow in pure Go: the fallback, and the model the
// assembly is tested against.
func widenRowGo(dst []float32, dt layout.DType, src []byte) {
	n := len(dst)
	i := 0
	switch dt {
	case layout.F16:
		src = src[:2*n]
		for ; i+4 <= n; i += 4 {
			w := binary.LittleEndian.Uint64(src[2*i:])
			d := dst[i : i+4 : i+4]
			d[0] = layout.F16ToF32(uint16(w))
			d[1] = layout.F16ToF32(uint16(w >> 16))
			d[2] = layout.F16ToF32(uint16(w >> 32))
			d[3] = layout.F16ToF32(uint16(w >> 48))
		}
	case layout.BF16:
		src = src[:2*n]
		for ; i+4 <= n; i += 4 {
			w := binary.LittleEndian.Uint64(src[2*i:])
			d := dst[i : i+4 : i+4]
			d[0] = math.Float32frombits(uint32(w) << 16)
			d[1] = math.Float32frombits(uint32(w>>16) << 16)
			d[2] = math.Float32frombits(uint32(w>>32) << 16)
			d[3] = math.Float32frombits(uint32(w>>48) << 16)
		}
	case layout.F32:
		src = src[:4*n]
		for ; i < n; i++ {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case layout.E4M3:
		src = src[:n]
		for ; i < n; i++ {
			dst[i] = layout.E4M3ToF32(src[i])
		}
	case layout.E5M2:
		src = src[:n]
		for ; i < n; i++ {
			dst[i] = layout.E5M2ToF32(src[i])
		}
	}
	if i < n {
		layout.LoadRowF32(dst[i:], dt, src[i*dt.Size():])
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

// exp2Neg is 2^x for x <= 0 in float32, the only range the online softmax
// needs (a logit minus the running maximum). It rounds x to n + f with
// |f| <= 1/2 and evaluates 2^f as the degree-7 Taylor series of e^(f ln 2)
// (truncation error below 5e-9), then scales by 2^n through the exponent
// bits; the result is within a few float32 ulps of math.Exp2 (tested).
// Below 2^-126 it returns the exact math.Exp2 value rounded to float32
// (subnormal weights are negligible but cheap to get right), 0 below
// 2^-150, and NaN for NaN.
func exp2Neg(x float32) float32 {
	if !(x >= -126) { // also catches NaN and -Inf
		if x != x {
			return x
		}
		return exp2f(x)
	}
	n := int32(x - 0.5) // round half down; x - 0.5 <= -0.5, so truncation is ceil
	f := (x - float32(n)) * math.Ln2
	p := 1 + f*(1+f*(1.0/2+f*(1.0/6+f*(1.0/24+f*(1.0/120+f*(1.0/720+f*(1.0/5040)))))))
	return p * math.Float32frombits(uint32(n+127)<<23)
}
func log2f(x float32) float32 { return float32(math.Log2(float64(x))) }

var negInf = float32(math.Inf(-1))

// onlineState is the running softmax of one query row in the base-2 domain
// (FlashInfer's state_t): m is the largest logit*log2(e) seen, l is
// sum_j 2^(s_j - m), and acc (held by the caller) is sum_j 2^(s_j - m) v_j.
// With m == -inf nothing has been seen and acc is all zero.
type onlineState struct {
	m, l float32
}

// raise makes m (> st.m) the running maximum: l and acc, weighted against
// the old maximum, are rescaled by 2^(old-m) (nothing to rescale before
// the first finite logit).
func (st *onlineState) raise(m float32, acc []float32) {
	if st.m != negInf {
		r := exp2Neg(st.m - m)
		st.l *= r
		scaleInPlace(r, acc)
	}
	st.m = m
}

// weight folds key logit s2 (base 2) into the state and returns the key's
// weight p = 2^(s2 - m) under the new maximum m; the caller adds p*v to
// acc. acc is rescaled only when the maximum grows, which on typical data
// happens O(log L) times per row.
func (st *onlineState) weight(s2 float32, acc []float32) float32 {
	if s2 == negInf {
		return 0
	}
	if s2 > st.m {
		st.raise(s2, acc)
		st.l++
		return 1
	}
	p := exp2Neg(s2 - st.m)
	st.l += p
	return p
}

// update is weight followed by acc += p*v.
func (st *onlineState) update(s2 float32, v, acc []float32) {
	axpy(st.weight(s2, acc), v, acc)
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

// weightBlock folds a block of key logits s (base 2) into the state, as
// weight does key by key but with one maximum update for the block, and
// overwrites s with the keys' weights 2^(s - m) under the new maximum m;
// the caller adds sum_t s[t]*v_t to acc.
func (st *onlineState) weightBlock(s []float32, acc []float32) {
	mb := st.m
	for _, x := range s {
		if x > mb {
			mb = x
		}
	}
	if mb > st.m {
		st.raise(mb, acc)
	}
	if st.m == negInf { // every logit is -inf (or NaN with nothing seen yet)
		for t, x := range s {
			if x == negInf {
				s[t] = 0
			} else {
				s[t] = x - x // NaN stays NaN
			}
		}
		return
	}
	l := st.l
	for t, x := range s {
		p := exp2Neg(x - st.m)
		s[t] = p
		l += p
	}
	st.l = l
}

// logitsBlock writes s[j*T+t] = q[j*d:(j+1)*d] · k[t*ts:t*ts+d] for the
// g query rows of q and T key rows of k at stride ts.
func logitsBlock(s, q, k []float32, ts, g, T, d int) {
	j := 0
	for ; j+4 <= g; j += 4 {
		qj := q[j*d : (j+4)*d]
		for t := 0; t < T; t++ {
			s[j*T+t], s[(j+1)*T+t], s[(j+2)*T+t], s[(j+3)*T+t] = dot4(qj, k[t*ts:t*ts+d], d)
		}
	}
	for ; j < g; j++ {
		for t := 0; t < T; t++ {
			s[j*T+t] = dot(q[j*d:(j+1)*d], k[t*ts:t*ts+d])
		}
	}
}

// axpyBlock does acc[:d] += sum_t p[t]*v[t*ts:t*ts+d], four keys at a
// time, so acc is loaded and stored once per four keys. With AVX2+FMA the
// first d&^7 elements of each four-key pass go through axpy4Vec.
func axpyBlock(acc, p, v []float32, ts, d int) {
	if !hasSIMD || d < 8 {
		axpyBlockGo(acc, p, v, ts, d)
		return
	}
	acc = acc[:d]
	n := d &^ 7
	t := 0
	for ; t+4 <= len(p); t += 4 {
		pp := (*[4]float32)(p[t : t+4])
		v0, v3 := v[t*ts:t*ts+d], v[(t+3)*ts:(t+3)*ts+d] // bounds for all four rows
		axpy4Vec(&acc[0], &v0[0], ts, pp, n)
		if n < d {
			v1, v2 := v[(t+1)*ts:(t+1)*ts+d], v[(t+2)*ts:(t+2)*ts+d]
			for i := n; i < d; i++ {
				acc[i] += (pp[0]*v0[i] + pp[1]*v1[i]) + (pp[2]*v2[i] + pp[3]*v3[i])
			}
		}
	}
	for ; t < len(p); t++ {
		axpy(p[t], v[t*ts:t*ts+d], acc)
	}
}

// axpyBlockGo is axpyBlock in pure Go: the fallback, and the model
// axpy4Vec is tested against.
func axpyBlockGo(acc, p, v []float32, ts, d int) {
	acc = acc[:d]
	t := 0
	for ; t+4 <= len(p); t += 4 {
		p0, p1, p2, p3 := p[t], p[t+1], p[t+2], p[t+3]
		v0, v1, v2, v3 := v[t*ts:t*ts+d], v[(t+1)*ts:(t+1)*ts+d], v[(t+2)*ts:(t+2)*ts+d], v[(t+3)*ts:(t+3)*ts+d]
		v0, v1, v2, v3 = v0[:len(acc)], v1[:len(acc)], v2[:len(acc)], v3[:len(acc)]
		for i := range acc {
			acc[i] += (p0*v0[i] + p1*v1[i]) + (p2*v2[i] + p3*v3[i])
		}
	}
	for ; t < len(p); t++ {
		axpy(p[t], v[t*ts:t*ts+d], acc)
	}
}
