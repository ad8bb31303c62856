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
	// KVIndptr/KVPageIndices are the CSR page table; KVLastPageLen is optional
	// (an append then checks positions against the reserved pages).
	KVIndptr, KVPageIndices, KVLastPageLen []int32
	BatchIndices, Positions                []int32 // appended rows (nil: none)

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
	// tc: decode runs mla_decode_tc_* over the work items at offset work
	// (items of them; merge >= 0: split-KV, merged by merge_partial_states).
	tc                 bool
	work, merge, items int
}

// The tensor-core MLA decode (mla_tc.cu) is built for FlashInfer's MLA
// shape: head_dim_ckv 512, head_dim_kpe 64, 16 heads per CTA, key tiles of
// 16.
const (
	mlaTCCKV, mlaTCKPE = 512, 64
	mlaTCHeads         = 16
	mlaTCKeys          = 16
	// mlaTCResident is the CTAs of mla_decode_tc_* an SM holds (ptxas:
	// 166-168 registers x 128 threads, three CTAs; the _hilo entries hold
	// two): the scheduler's slots per SM.
	mlaTCResident = 3
	// mlaTCMinChunk is the scheduler's least chunk for MLA, 256 keys.
	// minChunkKeys' rule (partial state at most 1/16 of the chunk's K/V)
	// would give 1824 keys at f16: a 16-head partial state is 16*513
	// floats, written and read back, against 1152 bytes of ckv and kpe per
	// key, so a B=1 request would get a few dozen CTAs on 132 SMs. At 256
	// keys the merge traffic is about a fifth of the chunk's reads, which
	// the GPU filling up pays back.
	mlaTCMinChunk = 256
)

// mlaTCKernels are the tensor-core MLA decode entries by cache dtype: [0]
// rounds q and P once to the mma type, [1] (_hilo) carries them as hi + lo
// pairs. f32 caches have none (see MLAKernelFor).
var mlaTCKernels = map[layout.DType][2]string{
	layout.F16: {"mla_decode_tc_f16", "mla_decode_tc_f16_hilo"}, layout.BF16: {"mla_decode_tc_bf16", "mla_decode_tc_bf16_hilo"},
	layout.E4M3: {"mla_decode_tc_e4m3", "mla_decode_tc_e4m3_hilo"}, layout.E5M2: {"mla_decode_tc_e5m2", "mla_decode_tc_e5m2_hilo"},
}

// mlaTC reports whether MLA decode over g runs on the tensor-core kernels:
// a 16-bit or fp8 cache, head_dim_ckv 512 and head_dim_kpe 64 (every row
// and the fused kpe offset are then whole 16-byte chunks, which cp.async
// copies).
func mlaTC(g layout.MLA) bool {
	_, ok := mlaTCKernels[g.DType]
	return ok && g.HeadDimCKV == mlaTCCKV && g.HeadDimKPE == mlaTCKPE
}

// mlaTCSmem is the dynamic shared memory of an mla_decode_tc CTA for
// elements of es bytes (mla_tc.cu, Smem::kBytes): two stages of 16 padded
// rows of 576 elements + 16 bytes, a flag per key and stage, and the S
// partials of 4 warps x 32 lanes x 8 floats.
func mlaTCSmem(es int) int {
	return 2*mlaTCKeys*((mlaTCCKV+mlaTCKPE)*es+16) + 2*mlaTCKeys + 4*32*8*4
}

// MLAKernelFor names the MLA decode entry point a decode over g with q_nope,
// q_pe and o of the given dtypes launches: where mlaTC holds,
// mla_decode_tc_<kv> (tensor cores), or mla_decode_tc_<kv>_hilo when q_nope,
// q_pe or o carries more significant bits than the mma type (bf16 for a
// bf16 cache, f16 for f16 and fp8 caches): f32 always, f16 over a bf16
// cache. A bf16 q enters an f16 mma exactly (8 significant bits in 11). Else
// the CUDA-core mla_decode_<kv>_c<CK> (f32 caches, other head dims), or ""
// for head_dim_ckv above 512.
func MLAKernelFor(g layout.MLA, qNope, qPE, o layout.DType) string {
	if mlaTC(g) {
		finer := func(dt layout.DType) bool { return dt == layout.F32 || (dt == layout.F16 && g.DType == layout.BF16) }
		hilo := 0
		if finer(qNope) || finer(qPE) || finer(o) {
			hilo = 1
		}
		return mlaTCKernels[g.DType][hilo]
	}
	for i, ck := range mlaCK {
		if 32*ck >= g.HeadDimCKV {
			return mlaKernels[g.DType][i]
		}
	}
	return ""
}

// mlaCK are the ckv features per lane the MLA decode kernels are built for.
var mlaCK = [...]int{1, 2, 4, 8, 16}

var mlaKernels = func() map[layout.DType][len(mlaCK)]string {
	m := map[layout.DType][len(mlaCK)]string{}
	for dt, sfx := range kvSuffix {
		if dt == layout.NVFP4 { // MLA caches have no NVFP4 form
			continue
		}
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
	// One validation pass of the CSR per step: an append's check covers a
	// decode's (its kv_last_page_len only adds checks), so a step that
	// does both checks only kv_len again.
	appends := p.BatchIndices != nil || p.Positions != nil
	if appends {
		if err := kernels.ValidateMLAAppendTable(g, p.KVIndptr, p.KVPageIndices, p.KVLastPageLen, p.BatchIndices, p.Positions); err != nil {
			return err
		}
		t := kernels.PageTable{KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices, KVLastPageLen: p.KVLastPageLen}
		if err := kernels.ValidateAppendRows(&t, p.BatchIndices, p.Positions, g.PageSize, p.KVLastPageLen == nil); err != nil {
			return fmt.Errorf("mla %w", err)
		}
	}
	// The batch is kv_indptr's (q is checked against it at launch).
	B := max(len(p.KVIndptr)-1, 0)
	if p.Decode {
		if err := kernels.ValidateMLADecodeScalars(p.NumHeads, p.SMScale); err != nil {
			return err
		}
		if appends {
			if err := kernels.ValidateMLAKVLen(g, p.KVIndptr, p.KVLen); err != nil {
				return err
			}
		} else if err := kernels.ValidateMLADecodeTable(g, B, p.KVIndptr, p.KVPageIndices, p.KVLen); err != nil {
			return err
		}
		if g.HeadDimCKV > 32*mlaCK[len(mlaCK)-1] {
			return fmt.Errorf("%s: mla decode: head_dim_ckv %d (want <= 512): %w", s.b.name, g.HeadDimCKV, kernels.ErrUnsupported)
		}
	} else if p.BatchIndices == nil {
		if err := kernels.ValidateMLAAppendTable(g, p.KVIndptr, p.KVPageIndices, p.KVLastPageLen, nil, nil); err != nil {
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
		if mlaTC(g) {
			if err := s.planMLAWork(&m, p.KVLen); err != nil {
				return err
			}
		}
	}
	s.nnz = len(p.BatchIndices)
	if s.nnz > 0 {
		m.bi = s.pack(p.BatchIndices)
		m.po = s.pack(p.Positions)
	}
	m.indices = s.pack(p.KVPageIndices[:p.KVIndptr[B]])
	if err := s.upload(); err != nil {
		return err
	}
	s.mla = m
	s.kind = kernels.NoAttention
	s.planned = true
	return nil
}

// planMLAWork packs the work items (request, request, kv_begin, kv_end) of
// a tensor-core MLA decode: the split-KV scheduler (schedule.go) over
// ceil(H/16) CTAs per item and tiles of 16 keys, chunks merged by
// merge_partial_states. Split-KV needs the step's scratch for the partials
// (MaxQOHeads >= H, MaxHeadDim >= 512); a step sized without it runs one
// item per request.
func (s *Step) planMLAWork(m *mlaPlan, kvLen []int32) error {
	B := m.batch
	s.lo, s.hi = resizeInts(s.lo, B), resizeInts(s.hi, B)
	if cap(s.req) < B {
		s.req = make([]int32, B)
	}
	s.req = s.req[:B]
	for b, n := range kvLen {
		s.lo[b], s.hi[b], s.req[b] = 0, int(n), int32(b)
	}
	lim := schedLimits{CTAsPerItem: (m.heads + mlaTCHeads - 1) / mlaTCHeads,
		Slots: max(s.b.drv.NumSMs(), 1) * mlaTCResident, Tile: mlaTCKeys, MinChunk: mlaTCMinChunk,
		Capacity: s.lim.MaxWorkItems, Force: s.b.cfg.MaxChunkTokens}
	if s.lim.MaxQOHeads < m.heads || s.lim.MaxHeadDim < mlaTCCKV {
		lim.Force = -1
	}
	if err := s.sched.plan(s.lo, s.hi, s.req, lim); err != nil {
		return fmt.Errorf("%s: mla decode: %v: %w", s.b.name, err, ErrStepLimit)
	}
	m.work, m.items, m.merge, m.tc = s.pack(s.sched.work), s.sched.items(), -1, true
	if s.sched.merge != nil {
		m.merge = s.pack(s.sched.merge)
	}
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
	qCode, _ := dtypeCode(qNope.DType)
	qpeCode, _ := dtypeCode(qPE.DType)
	oCode, _ := dtypeCode(o.DType)
	kernel := MLAKernelFor(g, qNope.DType, qPE.DType, o.DType)
	if s.mla.tc {
		return s.mlaDecodeTC(kernel, cache, qNope, qPE, o, lse, qCode, qpeCode, oCode)
	}
	a := append(s.args[:0],
		uint64(qNope.Ptr), uint64(qPE.Ptr), uint64(cache.CKV), uint64(cache.KPE),
		s.at(s.mla.indptr), s.at(s.mla.indices), s.at(s.mla.kvLen), uint64(o.Ptr), uint64(lse.Ptr),
		uint64(H), uint64(g.HeadDimCKV), uint64(g.HeadDimKPE), uint64(g.PageSize), uint64(g.NumPages),
		uint64(g.RowCKV()), uint64(g.RowKPE()), uint64(qCode), uint64(qpeCode), uint64(oCode), f64Arg(s.mla.scale*math.Log2E))
	s.args = a
	hpb := min(H, 8)
	return s.b.launch(kernel, Dim3{B, (H + hpb - 1) / hpb, 1}, Dim3{32, hpb, 1}, 0, a)
}

// mlaDecodeTC launches the tensor-core MLA decode over the planned work
// items (grid (items, ceil(H/16)), 128 threads) and, with split-KV, the
// merge of the partial states in the step's scratch.
func (s *Step) mlaDecodeTC(kernel string, cache *DeviceMLACache, qNope, qPE, o, lse DeviceTensor, qCode, qpeCode, oCode int64) error {
	g, H, m := s.mla.g, s.mla.heads, &s.mla
	partial := m.merge >= 0
	var tmpO, tmpLSE, flag uint64
	if partial {
		tmpO = uint64(s.scratch)
		tmpLSE = tmpO + uint64(m.items*H*mlaTCCKV*4)
		flag = 1
	}
	a := append(s.args[:0],
		uint64(qNope.Ptr), uint64(qPE.Ptr), uint64(cache.CKV), uint64(cache.KPE),
		s.at(m.indptr), s.at(m.indices), s.at(m.work), uint64(o.Ptr), uint64(lse.Ptr), tmpO, tmpLSE,
		uint64(H), uint64(g.PageSize), uint64(g.NumPages), uint64(g.RowCKV()), uint64(g.RowKPE()),
		uint64(qCode), uint64(qpeCode), uint64(oCode), f64Arg(m.scale*math.Log2E), flag)
	s.args = a
	grid := Dim3{m.items, (H + mlaTCHeads - 1) / mlaTCHeads, 1}
	if err := s.b.launch(kernel, grid, Dim3{128, 1, 1}, mlaTCSmem(g.DType.Size()), a); err != nil || !partial {
		return err
	}
	mg := append(s.args[:0], tmpO, tmpLSE, s.at(m.merge), uint64(o.Ptr), uint64(lse.Ptr), 0 /* sinks */, uint64(H), uint64(mlaTCCKV), uint64(oCode), f64Arg(1))
	s.args = mg
	return s.b.launch("merge_partial_states", Dim3{m.batch, H, 1}, Dim3{threadsFor(mlaTCCKV), 1, 1}, 0, mg)
}
