package cpu

import (
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// The fused decode path: with the assembly available, a cache of f16 or
// bf16 values, head_dim a multiple of 8 and GQA groups of a multiple of
// four query heads, runRowByPage reads K and V straight from the cache and
// widens them in registers (dot4F16AVX and friends) instead of widening a
// page into float32 scratch first. That halves the bytes the loop moves
// through the caches: K and V are read once from memory and never written
// back as float32.

// fusedNarrow reports whether j's decode tasks take the fused path.
func (j *attnJob) fusedNarrow() bool {
	return hasSIMD && (j.cacheDT == layout.F16 || j.cacheDT == layout.BF16) && j.headDim%8 == 0 && j.group%4 == 0
}

// runRowByPageNarrow is runRowByPage on the fused path. Each page is read
// in address order (NHD: token by token, each token's heads contiguous), so
// the hardware prefetcher streams it: first every logit of the page's keys
// for every query of the task, then the online-softmax weights, then the V
// rows four keys at a time.
func (j *attnJob) runRowByPageNarrow(sc *attnScratch, b, kvh0, jlo, jhi int) {
	D, g, nkv, N := j.headDim, j.group, j.kvHeadsPerTask, j.pageSize
	nq := nkv * g
	sc.sblk = growF(sc.sblk, nq*N)
	bf := j.cacheDT == layout.BF16
	sN, sH := int(j.strideN), int(j.strideH)
	pageBase := int(j.kvIndptr[b])
	for t := jlo; t < jhi; {
		page := int64(j.kvIndices[pageBase+t/N])
		entry := t % N
		T := min(jhi, t-entry+N) - t
		base := (page*j.strideP + int64(kvh0)*j.strideH + int64(entry)*j.strideN) * 2
		span := int64((T-1)*sN+(nkv-1)*sH+D) * 2 // bytes from the first row read to the end of the last
		kb, vb := j.kbuf[base:base+span], j.vbuf[base:base+span]
		sblk := sc.sblk[:nq*T] // logits of query qi (= hh*g+gh) at qi*T+tt

		for tt := 0; tt < T; tt++ {
			for hh := 0; hh < nkv; hh++ {
				k := &kb[(tt*sN+hh*sH)*2]
				for jq := hh * g; jq < (hh+1)*g; jq += 4 {
					var s0, s1, s2, s3 float32
					if bf {
						s0, s1, s2, s3 = dot4BF16AVX(&sc.q[jq*D], D, k, D)
					} else {
						s0, s1, s2, s3 = dot4F16AVX(&sc.q[jq*D], D, k, D)
					}
					sblk[jq*T+tt], sblk[(jq+1)*T+tt], sblk[(jq+2)*T+tt], sblk[(jq+3)*T+tt] = s0, s1, s2, s3
				}
			}
		}
		if j.softCap {
			for i, x := range sblk {
				sblk[i] = j.capLog2e * float32(math.Tanh(float64(x*j.invCap)))
			}
		}
		for qi := 0; qi < nq; qi++ {
			sc.st[qi].weightBlock(sblk[qi*T:(qi+1)*T], sc.acc[qi*D:(qi+1)*D])
		}

		tt := 0
		for ; tt+4 <= T; tt += 4 {
			for hh := 0; hh < nkv; hh++ {
				v := &vb[(tt*sN+hh*sH)*2]
				for qi := hh * g; qi < (hh+1)*g; qi++ {
					p := (*[4]float32)(sblk[qi*T+tt : qi*T+tt+4])
					if bf {
						axpy4BF16AVX(&sc.acc[qi*D], v, sN, p, D)
					} else {
						axpy4F16AVX(&sc.acc[qi*D], v, sN, p, D)
					}
				}
			}
		}
		for ; tt < T; tt++ {
			for hh := 0; hh < nkv; hh++ {
				v := &vb[(tt*sN+hh*sH)*2]
				for qi := hh * g; qi < (hh+1)*g; qi++ {
					if bf {
						axpy1BF16AVX(&sc.acc[qi*D], v, sblk[qi*T+tt], D)
					} else {
						axpy1F16AVX(&sc.acc[qi*D], v, sblk[qi*T+tt], D)
					}
				}
			}
		}
		t += T
	}
}
