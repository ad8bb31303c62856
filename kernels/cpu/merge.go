package cpu

import (
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Merging attention states (v, s) with base-2 LSEs s: the merged state of
// (v_i, s_i) is s = log2 sum_i 2^{s_i}, v = sum_i 2^{s_i - s} v_i, computed
// in float32. A state with s = -inf is skipped outright (so its v may hold
// anything, even NaN); no live state gives v = 0, s = -inf.

// mergeRowsPerTask rows of [H, D] states go to one parallel task.
const mergeRowsPerTask = 16

// MergeState implements [kernels.Backend.MergeState]. V may alias VA or VB
// and S may alias SA or SB: each (row, head) reads both inputs before it
// writes.
func (b *Backend) MergeState(p *kernels.MergeStateParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	n, h, d := p.VA.Shape[0], p.VA.Shape[1], p.VA.Shape[2]
	tasks := (n + mergeRowsPerTask - 1) / mergeRowsPerTask
	b.parallelFor(tasks, func(task int) {
		buf := getFloats(2 * d)
		va, vb := (*buf)[:d], (*buf)[d:]
		for r := task * mergeRowsPerTask; r < min(n, (task+1)*mergeRowsPerTask); r++ {
			for hh := 0; hh < h; hh++ {
				i := r*h + hh
				sa, sb := p.SA[i], p.SB[i]
				widenRow(va, p.VA.DType, p.VA.Data[i*d*p.VA.DType.Size():])
				widenRow(vb, p.VB.DType, p.VB.Data[i*d*p.VB.DType.Size():])
				s := mergePair(va, sa, vb, sb)
				layout.StoreRowF32(p.V.Data[i*d*p.V.DType.Size():], p.V.DType, va)
				p.S[i] = s
			}
		}
		putFloats(buf)
	})
	return nil
}

// mergePair merges (vb, sb) into (va, sa), leaving the merged v in va, and
// returns the merged s.
func mergePair(va []float32, sa float32, vb []float32, sb float32) float32 {
	switch {
	case sb == negInf && sa == negInf:
		clear(va)
		return negInf
	case sb == negInf:
		return sa
	case sa == negInf:
		copy(va, vb)
		return sb
	}
	m := max(sa, sb)
	wa, wb := exp2f(sa-m), exp2f(sb-m)
	l := wa + wb
	wa, wb = wa/l, wb/l
	for k := range va {
		va[k] = wa*va[k] + wb*vb[k]
	}
	return m + log2f(l)
}

// MergeStates implements [kernels.Backend.MergeStates] with an online merge
// over the states of each (row, head), so any number of states takes
// O(head_dim) scratch.
func (b *Backend) MergeStates(p *kernels.MergeStatesParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	n, ns, h, d := p.V.Shape[0], p.V.Shape[1], p.V.Shape[2], p.V.Shape[3]
	ves, oes := p.V.DType.Size(), p.OutV.DType.Size()
	tasks := (n + mergeRowsPerTask - 1) / mergeRowsPerTask
	b.parallelFor(tasks, func(task int) {
		buf := getFloats(3 * d)
		v, acc, out := (*buf)[:d], (*buf)[d:2*d], (*buf)[2*d:]
		for r := task * mergeRowsPerTask; r < min(n, (task+1)*mergeRowsPerTask); r++ {
			for hh := 0; hh < h; hh++ {
				st := onlineState{m: negInf}
				clear(acc)
				for si := 0; si < ns; si++ {
					i := (r*ns+si)*h + hh // index into s; v row i of [n*S*H, D]
					s := p.S[i]
					if s == negInf {
						continue
					}
					widenRow(v, p.V.DType, p.V.Data[i*d*ves:])
					// A state with LSE s stands for 2^s units of softmax mass
					// with mean v: exactly a key of logit s and value v.
					st.update(s, v, acc)
				}
				o := r*h + hh
				p.OutS[o] = st.finish(out, acc, 1)
				layout.StoreRowF32(p.OutV.Data[o*d*oes:], p.OutV.DType, out)
			}
		}
		putFloats(buf)
	})
	return nil
}
