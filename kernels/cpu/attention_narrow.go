package cpu

import (
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// The fused decode path: with the assembly available, a cache of f16 or
// bf16 values, head_dim a multiple of 8 and GQA groups of a multiple of
// four query heads, runRowByPage reads K and V straight from the cache and
// widens them in registers instead of widening a page into float32
// scratch first. That halves the bytes the loop moves through the caches:
// K and V are read once from memory and never written back as float32.
//
// The kernels work on groups of four query heads of one kv head, for one
// page's keys: logits4 (two keys per pass, so each query vector loaded
// serves two keys), expBlock4 (the online-softmax weights, eight at a
// time), and attnV4 (each V vector widened once for the four queries,
// rather than once per query, into a column chunk of the four
// accumulator rows held in registers over every key of the page). The
// logits and weights of a group are stored key-major, s[t*4+j], which is
// how the kernels produce and consume them.

// fusedNarrow reports whether j's decode tasks take the fused path.
func (j *attnJob) fusedNarrow() bool {
	return hasSIMD && (j.cacheDT == layout.F16 || j.cacheDT == layout.BF16) && j.headDim%8 == 0 && j.group%4 == 0
}

// runRowByPageNarrow is runRowByPage on the fused path, a page at a time:
// first every logit of the page's keys for every query of the task, then
// the online-softmax weights, then the V rows. Each kernel call reads the
// page in address order: with NHD (a token's heads contiguous) one call
// takes every kv head of the task, two keys at a time and every head for
// each pair; with HND one call takes one head's contiguous rows.
// Before a page is computed the next one's K and V are prefetched: the
// pages of a request are scattered, and a jump to an unrelated address is
// what the hardware prefetcher does not follow.
func (j *attnJob) runRowByPageNarrow(sc *attnScratch, b, kvh0, jlo, jhi int) {
	D, g, nkv, N := j.headDim, j.group, j.kvHeadsPerTask, j.pageSize
	nq := nkv * g
	sc.sblk = growF(sc.sblk, nq*N)
	bf := j.cacheDT == layout.BF16
	ks, hs := int(j.strideN)*2, int(j.strideH)*2 // bytes between keys, between heads
	heads := nkv                                 // kv heads per kernel call
	if hs > ks {
		heads = 1
	}
	if jlo >= jhi {
		return
	}
	base, span, T := j.narrowBlock(b, kvh0, jlo, jhi)
	for t := jlo; t < jhi; {
		kb, vb := j.kbuf[base:base+span], j.vbuf[base:base+span]
		// Pages are scattered, so the hardware prefetcher cannot follow
		// from one to the next: ask for the next block's K and V now, to
		// arrive while this one is computed.
		var nextBase, nextSpan int64
		nextT := 0
		if t+T < jhi {
			nextBase, nextSpan, nextT = j.narrowBlock(b, kvh0, t+T, jhi)
			prefetchSpan(&j.kbuf[nextBase : nextBase+nextSpan][0], int(nextSpan))
			prefetchSpan(&j.vbuf[nextBase : nextBase+nextSpan][0], int(nextSpan))
		}
		// Queries jq..jq+3 (jq%4 == 0; jq = hh*g + 4*gi) have their
		// logits, then weights, at jq*T, key-major.
		sblk := sc.sblk[:nq*T]

		for h0 := 0; h0 < nkv; h0 += heads {
			for jq := h0 * g; jq < h0*g+g; jq += 4 {
				logits4Narrow(sblk[jq*T:], g*T, sc.q[jq*D:], g*D, D, kb[h0*hs:], ks, hs, T, heads, bf)
			}
		}
		if j.softCap {
			for i, x := range sblk {
				sblk[i] = j.capLog2e * float32(math.Tanh(float64(x*j.invCap)))
			}
		}
		for jq := 0; jq < nq; jq += 4 {
			weightBlock4(sc.st[jq:jq+4], sblk[jq*T:(jq+4)*T], sc.acc[jq*D:(jq+4)*D], D)
		}
		for h0 := 0; h0 < nkv; h0 += heads {
			for jq := h0 * g; jq < h0*g+g; jq += 4 {
				attnV4Narrow(sc.acc[jq*D:], g*D, D, vb[h0*hs:], ks, hs, sblk[jq*T:], g*T, T, heads, bf)
			}
		}
		t += T
		base, span, T = nextBase, nextSpan, nextT
	}
}

// narrowBlock returns the block of keys of request b that starts at key t
// (before jhi), up to the end of its page, for kv heads kvh0.. of a task
// on the fused path: its offset in bytes into kbuf and vbuf, the bytes
// from its first row read to the end of its last, and its key count.
func (j *attnJob) narrowBlock(b, kvh0, t, jhi int) (base, span int64, T int) {
	N := j.pageSize
	page := int64(j.kvPageIndices[int(j.kvIndptr[b])+t/N])
	entry := t % N
	T = min(jhi, t-entry+N) - t
	base = (page*j.strideP + int64(kvh0)*j.strideH + int64(entry)*j.strideN) * 2
	span = (int64(T-1)*j.strideN + int64(j.kvHeadsPerTask-1)*j.strideH + int64(j.headDim)) * 2
	return base, span, T
}

// logits4Narrow writes s[h*ss+t*4+j] = q[h*qs+j*d:][:d] . k_{h,t} for
// h < heads, t < T and j < 4, where k_{h,t} is the row of d f16 (bf16 when
// bf) values at k[h*hs+t*ks:]; d is a positive multiple of 8. Assembly
// only.
func logits4Narrow(s []float32, ss int, q []float32, qs, d int, k []byte, ks, hs, T, heads int, bf bool) {
	if T == 0 || heads == 0 {
		return
	}
	if d <= 0 || d%8 != 0 {
		panic("cpu: logits4Narrow needs a positive multiple of 8 elements")
	}
	s = s[:(heads-1)*ss+4*T]
	q = q[:(heads-1)*qs+4*d]
	k = k[:(heads-1)*hs+(T-1)*ks+2*d]
	if bf {
		logits4BF16Vec(&s[0], ss, &q[0], qs, d, &k[0], ks, hs, T, heads)
	} else {
		logits4F16Vec(&s[0], ss, &q[0], qs, d, &k[0], ks, hs, T, heads)
	}
}

// attnV4Narrow does acc[h*as+j*d+i] += sum_t p[h*ss+t*4+j]*v_{h,t}[i] for
// h < heads, j < 4 and i < d, where v_{h,t} is the row of d f16 (bf16 when
// bf) values at v[h*hs+t*vs:]; d is a positive multiple of 8. Assembly
// only.
func attnV4Narrow(acc []float32, as, d int, v []byte, vs, hs int, p []float32, ss, T, heads int, bf bool) {
	if T == 0 || heads == 0 {
		return
	}
	if d <= 0 || d%8 != 0 {
		panic("cpu: attnV4Narrow needs a positive multiple of 8 elements")
	}
	acc = acc[:(heads-1)*as+4*d]
	v = v[:(heads-1)*hs+(T-1)*vs+2*d]
	p = p[:(heads-1)*ss+4*T]
	if bf {
		attnV4BF16Vec(&acc[0], as, d, &v[0], vs, hs, &p[0], ss, T, heads)
	} else {
		attnV4F16Vec(&acc[0], as, d, &v[0], vs, hs, &p[0], ss, T, heads)
	}
}

// weightBlock4 is weightBlock for four queries at once, their logits
// key-major in s (s[t*4+j] for query j): one maximum update per query for
// the block, then s[t*4+j] = 2^(s[t*4+j] - m_j) and l_j += those weights.
// acc holds the four queries' accumulator rows of d elements.
func weightBlock4(st []onlineState, s, acc []float32, d int) {
	st = st[:4]
	var m, l [4]float32
	for jj := range m {
		m[jj] = st[jj].m
	}
	for i := 0; i+4 <= len(s); i += 4 {
		x := s[i : i+4 : i+4]
		for jj := range m {
			if x[jj] > m[jj] {
				m[jj] = x[jj]
			}
		}
	}
	seen := true
	for jj := range m {
		if m[jj] > st[jj].m {
			if st[jj].m != negInf {
				r := exp2Neg(st[jj].m - m[jj])
				st[jj].l *= r
				scaleInPlace(r, acc[jj*d:(jj+1)*d])
			}
			st[jj].m = m[jj]
		}
		seen = seen && m[jj] != negInf
		l[jj] = st[jj].l
	}
	if seen && hasSIMD && len(s) > 0 {
		expBlock4Vec(&s[0], len(s), &m, &l)
	} else {
		expBlock4Go(s, &m, &l)
	}
	for jj := range l {
		st[jj].l = l[jj]
	}
}

// expBlock4Go is expBlock4Vec in pure Go (the fallback and the model it is
// tested against), also for a query that has seen only -inf logits
// (m_j == -inf), whose weights are 0 (NaN for a NaN logit) and whose l is
// left alone, as weightBlock does.
func expBlock4Go(s []float32, m, l *[4]float32) {
	for i, x := range s {
		jj := i & 3
		if m[jj] == negInf {
			if x == negInf {
				s[i] = 0
			} else {
				s[i] = x - x // NaN stays NaN
			}
			continue
		}
		p := exp2Neg(x - m[jj])
		s[i] = p
		l[jj] += p
	}
}
