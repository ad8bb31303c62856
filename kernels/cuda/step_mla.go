package cuda

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// MLAStepPlan is one MLA step's index arrays: the rows appended to the
// ckv/kpe cache, if any, and, with Decode, MLA decode over the same pages
// (FlashInfer's BatchMLAPagedAttentionWrapper.plan).
type MLAStepPlan struct {
	Geometry layout.MLA
	// KVIndptr/KVIndices are the CSR page table; KVLastPageLen is optional
	// (an append then checks positions against the reserved pages).
	KVIndptr, KVIndices, KVLastPageLen []int32
	BatchIndices, Positions            []int32 // appended rows (nil: none)

	Decode   bool
	KVLen    []int32 // Decode: keys per request [B]
	NumHeads int
	SMScale  float64
}

// mlaPlan is the MLA part of a step's current plan.
type mlaPlan struct {
	on                             bool
	g                              layout.MLA
	batch, heads                   int
	decode                         bool
	scale                          float64
	indptr, indices, kvLen, bi, po int
}

// mlaCK are the ckv features per lane the MLA decode kernels are built for.
var mlaCK = [...]int{1, 2, 4, 8, 16}

var mlaKernels = func() map[layout.DType][len(mlaCK)]string {
	m := map[layout.DType][len(mlaCK)]string{}
	for dt, sfx := range kvSuffix {
		var names [len(mlaCK)]string
		for i, ck := range mlaCK {
			names[i] = fmt.Sprintf("mla_decode_%s_c%d", sfx, ck)
		}
		m[dt] = names
	}
	return m
}()

// PlanMLA validates p on the host with the shared validator and uploads its
// arrays with one asynchronous copy, as [Step.Plan] does for a paged cache.
func (s *Step) PlanMLA(p *MLAStepPlan) error {
	if err := s.enter("plan MLA"); err != nil {
		return err
	}
	defer s.leave()
	s.planned, s.mla.on = false, false
	if s.lim.Fixed {
		return fmt.Errorf("%s: step: MLA plans in a fixed step (graph capture of MLA steps): %w", s.b.name, kernels.ErrUnsupported)
	}
	g := p.Geometry
	if err := g.Validate(); err != nil {
		return fmt.Errorf("%s: step: %w: %w", s.b.name, kernels.ErrInvalidCache, err)
	}
	if p.BatchIndices != nil || p.Positions != nil {
		if err := kernels.ValidateMLAAppendTable(g, p.KVIndptr, p.KVIndices, p.KVLastPageLen, p.BatchIndices, p.Positions); err != nil {
			return err
		}
		if err := kernels.ValidateMLAAppendRows(g, p.KVIndptr, p.KVIndices, p.KVLastPageLen, p.BatchIndices, p.Positions); err != nil {
			return err
		}
	}
	// The batch is kv_indptr's (q is checked against it at launch).
	B := max(len(p.KVIndptr)-1, 0)
	if p.Decode {
		if err := kernels.ValidateMLADecodeScalars(p.NumHeads, p.SMScale); err != nil {
			return err
		}
		if err := kernels.ValidateMLADecodeTable(g, B, p.KVIndptr, p.KVIndices, p.KVLen); err != nil {
			return err
		}
		if g.HeadDimCKV > 32*mlaCK[len(mlaCK)-1] {
			return fmt.Errorf("%s: mla decode: head_dim_ckv %d (want <= 512): %w", s.b.name, g.HeadDimCKV, kernels.ErrUnsupported)
		}
	} else if p.BatchIndices == nil {
		if err := kernels.ValidateMLAAppendTable(g, p.KVIndptr, p.KVIndices, p.KVLastPageLen, nil, nil); err != nil {
			return err
		}
	}
	if err := s.limit("batch", B, s.lim.MaxBatch); err != nil {
		return err
	}
	if err := s.limit("pages", int(p.KVIndptr[B]), s.lim.MaxPages); err != nil {
		return err
	}
	if err := s.limit("appended rows", len(p.BatchIndices), s.lim.MaxRows); err != nil {
		return err
	}
	if p.Decode {
		if err := s.limit("query rows", B, s.lim.MaxRows); err != nil {
			return err
		}
	}
	if err := s.reuseStaging(); err != nil {
		return err
	}
	s.cursor = 0
	m := mlaPlan{on: true, g: g, batch: B, heads: p.NumHeads, decode: p.Decode, scale: p.SMScale,
		kvLen: -1, bi: -1, po: -1}
	m.indptr = s.pack(p.KVIndptr)
	if p.Decode {
		m.kvLen = s.pack(p.KVLen)
	}
	s.nnz = len(p.BatchIndices)
	if s.nnz > 0 {
		m.bi = s.pack(p.BatchIndices)
		m.po = s.pack(p.Positions)
	}
	m.indices = s.pack(p.KVIndices[:p.KVIndptr[B]])
	if err := s.upload(); err != nil {
		return err
	}
	s.mla = m
	s.kind = NoAttention
	s.planned = true
	return nil
}

func (s *Step) checkMLA(op string, c *DeviceMLACache) error {
	if !s.planned || !s.mla.on {
		return fmt.Errorf("%s: %s: %w (call PlanMLA first)", s.b.name, op, ErrNotPlanned)
	}
	if len(c.allocs) == 0 {
		return fmt.Errorf("%s: %s: %w: the device cache is not allocated", s.b.name, op, kernels.ErrInvalidCache)
	}
	if c.Geometry != s.mla.g {
		return fmt.Errorf("%s: %s: %w: cache %+v, plan %+v", s.b.name, op, ErrNotPlanned, c.Geometry, s.mla.g)
	}
	return nil
}

// MLAAppend is append_paged_mla_kv_cache for the planned rows: ckv
// [nnz, head_dim_ckv] and kpe [nnz, head_dim_kpe] device tensors in the
// cache's dtype.
func (s *Step) MLAAppend(cache *DeviceMLACache, ckv, kpe DeviceTensor) error {
	if err := s.enter("MLAAppend"); err != nil {
		return err
	}
	defer s.leave()
	const op = "mla append"
	if err := s.checkMLA(op, cache); err != nil {
		return err
	}
	if s.nnz == 0 {
		return nil
	}
	g := s.mla.g
	if err := ckv.check("append_ckv", s.nnz, g.HeadDimCKV); err != nil {
		return fmt.Errorf("%s: %w (nnz = len(batch_indices), head_dim_ckv)", op, err)
	}
	if err := kpe.check("append_kpe", s.nnz, g.HeadDimKPE); err != nil {
		return fmt.Errorf("%s: %w (nnz = len(batch_indices), head_dim_kpe)", op, err)
	}
	if ckv.DType != g.DType || kpe.DType != g.DType {
		return fmt.Errorf("%s: %w: append_ckv %v and append_kpe %v into a %v cache (want equal dtypes)", op, kernels.ErrInvalidTensor, ckv.DType, kpe.DType, g.DType)
	}
	es := int64(g.DType.Size())
	if tok := int64(g.HeadDimCKV+g.HeadDimKPE) * es; tok > math.MaxInt32 {
		return fmt.Errorf("%s: mla append: %d bytes per token exceed the kernels' 32-bit token indexing: %w", s.b.name, tok, kernels.ErrUnsupported)
	}
	kpeOff := int64(0)
	if g.Form == layout.Fused {
		kpeOff = g.KPEOffset(0, 0, 0) * es
	}
	ckvRow, kpeRow := int64(g.HeadDimCKV)*es, int64(g.HeadDimKPE)*es
	ckvStride, kpeStride := g.RowCKV()*es, g.RowKPE()*es
	u := copyUnit(ckvRow, kpeRow, ckvStride, kpeStride, kpeOff)
	a := append(s.args[:0],
		uint64(ckv.Ptr), uint64(kpe.Ptr), s.at(s.mla.bi), s.at(s.mla.po),
		uint64(cache.CKV), uint64(cache.KPE), s.at(s.mla.indices), s.at(s.mla.indptr),
		uint64(s.nnz), uint64(ckvRow), uint64(kpeRow), uint64(g.PageSize), uint64(g.NumPages),
		uint64(ckvStride), uint64(kpeStride))
	s.args = a
	return s.b.launch(mlaAppendKernels[u], Dim3{s.b.gridFor(s.nnz), 1, 1},
		Dim3{threadsFor((ckvRow + kpeRow) / int64(u)), 1, 1}, 0, a)
}

var mlaAppendKernels = map[int]string{16: "append_paged_mla_kv_cache_u16", 8: "append_paged_mla_kv_cache_u8",
	4: "append_paged_mla_kv_cache_u4", 2: "append_paged_mla_kv_cache_u2", 1: "append_paged_mla_kv_cache_u1"}

// MLADecode is MLA decode over the planned pages: q_nope [B, H, ckv] and
// q_pe [B, H, kpe] in, o [B, H, ckv] and (when lse.Ptr != 0) lse [B*H] out,
// all device tensors.
func (s *Step) MLADecode(cache *DeviceMLACache, qNope, qPE, o, lse DeviceTensor) error {
	if err := s.enter("MLADecode"); err != nil {
		return err
	}
	defer s.leave()
	const op = "mla decode"
	if err := s.checkMLA(op, cache); err != nil {
		return err
	}
	if !s.mla.decode {
		return fmt.Errorf("%s: %s: %w: the plan has no decode", s.b.name, op, ErrNotPlanned)
	}
	g := s.mla.g
	B, H := s.mla.batch, s.mla.heads
	if err := qNope.checkActivation(op, "q_nope", B, H, g.HeadDimCKV); err != nil {
		return err
	}
	if err := qPE.checkActivation(op, "q_pe", B, H, g.HeadDimKPE); err != nil {
		return err
	}
	if err := o.checkActivation(op, "o", B, H, g.HeadDimCKV); err != nil {
		return err
	}
	if err := checkLSE(op, "lse", lse, B*H); err != nil {
		return err
	}
	if B == 0 {
		return nil
	}
	ck := 0
	for ck < len(mlaCK)-1 && 32*mlaCK[ck] < g.HeadDimCKV {
		ck++
	}
	qCode, _ := dtypeCode(qNope.DType)
	qpeCode, _ := dtypeCode(qPE.DType)
	oCode, _ := dtypeCode(o.DType)
	a := append(s.args[:0],
		uint64(qNope.Ptr), uint64(qPE.Ptr), uint64(cache.CKV), uint64(cache.KPE),
		s.at(s.mla.indptr), s.at(s.mla.indices), s.at(s.mla.kvLen), uint64(o.Ptr), uint64(lse.Ptr),
		uint64(H), uint64(g.HeadDimCKV), uint64(g.HeadDimKPE), uint64(g.PageSize), uint64(g.NumPages),
		uint64(g.RowCKV()), uint64(g.RowKPE()), uint64(qCode), uint64(qpeCode), uint64(oCode), f64Arg(s.mla.scale*math.Log2E))
	s.args = a
	hpb := min(H, 8)
	return s.b.launch(mlaKernels[g.DType][ck], Dim3{B, (H + hpb - 1) / hpb, 1}, Dim3{32, hpb, 1}, 0, a)
}
