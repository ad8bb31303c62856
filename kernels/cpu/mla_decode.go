package cpu

import (
	"math"
	"sync"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// MLA decode in absorbed form: every head of a request reads the same
// ckv/kpe rows, so a task takes (request, block of up to mlaHeadsPerTask
// heads), widens each ckv and kpe row once, and folds it into every head of
// the block with the online softmax of attention.go. Logits are
// (q_nope·ckv + q_pe·kpe)*sm_scale; the value is the ckv row itself.

const mlaHeadsPerTask = 16

type mlaScratch struct {
	qn, qp, acc []float32 // [heads][dc], [heads][dk], [heads][dc]
	st          []onlineState
	ckv, kpe    []float32
	s, spe      []float32 // [heads] logits: the ckv and kpe parts
	out         []float32
}

var mlaScratchPool = sync.Pool{New: func() any { return new(mlaScratch) }}

// MLADecode implements [kernels.Backend.MLADecode].
func (b *Backend) MLADecode(p *kernels.MLADecodeParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	g := p.Cache.Geometry
	B, H := p.QNope.Shape[0], p.QNope.Shape[1]
	dc, dk := g.HeadDimCKV, g.HeadDimKPE
	blocks := (H + mlaHeadsPerTask - 1) / mlaHeadsPerTask
	qScale := float32(p.SMScale * math.Log2E)
	es := int64(g.DType.Size())
	ckvBuf, kpeBuf := p.Cache.CKVBuf(), p.Cache.KPEBuf()
	b.parallelFor(B*blocks, func(task int) {
		req, h0 := task/blocks, (task%blocks)*mlaHeadsPerTask
		nh := min(mlaHeadsPerTask, H-h0)
		sc := mlaScratchPool.Get().(*mlaScratch)
		defer mlaScratchPool.Put(sc)
		sc.qn, sc.qp, sc.acc = growF(sc.qn, nh*dc), growF(sc.qp, nh*dk), growF(sc.acc, nh*dc)
		sc.ckv, sc.kpe, sc.out = growF(sc.ckv, dc), growF(sc.kpe, dk), growF(sc.out, dc)
		sc.s, sc.spe = growF(sc.s, nh), growF(sc.spe, nh)
		if cap(sc.st) < nh {
			sc.st = make([]onlineState, nh)
		}
		st := sc.st[:nh]
		for i := 0; i < nh; i++ {
			row := req*H + h0 + i
			qn, qp := sc.qn[i*dc:(i+1)*dc], sc.qp[i*dk:(i+1)*dk]
			widenRow(qn, p.QNope.DType, p.QNope.Data[row*dc*p.QNope.DType.Size():])
			widenRow(qp, p.QPE.DType, p.QPE.Data[row*dk*p.QPE.DType.Size():])
			scaleInPlace(qScale, qn)
			scaleInPlace(qScale, qp)
			clear(sc.acc[i*dc : (i+1)*dc])
			st[i] = onlineState{m: negInf}
		}
		n := int(p.KVLen[req])
		base := int(p.KVIndptr[req])
		acc := sc.acc[:nh*dc]
		for t := 0; t < n; t++ {
			page, entry := int(p.KVPageIndices[base+t/g.PageSize]), t%g.PageSize
			widenRow(sc.ckv, g.DType, ckvBuf[g.CKVOffset(page, entry, 0)*es:])
			widenRow(sc.kpe, g.DType, kpeBuf[g.KPEOffset(page, entry, 0)*es:])
			// Every head of the block against this one row: logits, then
			// weights, then acc += weight*ckv.
			dotRows(sc.s[:nh], sc.qn, sc.ckv, dc)
			dotRows(sc.spe[:nh], sc.qp, sc.kpe, dk)
			for i := 0; i < nh; i++ {
				sc.s[i] = st[i].weight(sc.s[i]+sc.spe[i], acc[i*dc:(i+1)*dc])
			}
			axpyRows(sc.s[:nh], sc.ckv, acc, dc)
		}
		oes := p.O.DType.Size()
		for i := 0; i < nh; i++ {
			row := req*H + h0 + i
			lse := st[i].finish(sc.out, sc.acc[i*dc:(i+1)*dc], 1)
			layout.StoreRowF32(p.O.Data[row*dc*oes:], p.O.DType, sc.out)
			if p.LSE != nil {
				p.LSE[row] = lse
			}
		}
	})
	return nil
}
