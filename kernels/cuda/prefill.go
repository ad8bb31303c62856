package cuda

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// The tiled tensor-core prefill (prefill.cu, docs/kernels.md "Prefill"):
// which shapes it takes, its work items and its launch.
const (
	// prefillPackedRows is the (query row, query head) pairs a work item
	// packs into the mma M dimension: 4 warps of 16.
	prefillPackedRows = 64
	prefillMaxWarps   = 4
	// prefillResident is the CTAs of the tiled prefill an SM holds, the
	// split-KV scheduler's slots per SM: the least over the entries (ptxas:
	// 125-253 registers x 128 threads; four CTAs at d64, three at f16 and
	// bf16 d128 (168), two at fp8 d128 and at d256).
	prefillResident = 2
	// prefillMinChunk is the scheduler's least chunk for the tiled
	// prefill, in keys (rounded up to the tile). A split tile's partial
	// states (64 packed rows x (D+1) floats, written and read back) are
	// about half of a 256-key chunk's K/V bytes at f16 and stay in L2,
	// while decode's 1/16 rule (minChunkKeys) would ask for 4,160 keys
	// at D=128: a chunked prefill of one tile over a long context would
	// then launch a few dozen CTAs on 132 SMs.
	prefillMinChunk = 256
	// prefillSmemLimit is the dynamic shared memory a launch may take
	// without the opt-in attribute (the emulator enforces the same).
	prefillSmemLimit = 48 << 10
	prefillArity     = 31
	// prefill.cu's flags argument.
	prefillFlagPartial = 1
	prefillFlagSplitQ  = 2
	prefillFlagSplitP  = 4
)

// prefillDims are the head dims the tiled kernels are built for, and
// prefillKVs the cache dtypes (every other dtype and head dim runs the
// per-row decode kernel; see planPrefillShape).
var (
	prefillDims = [...]int{64, 128, 256}
	prefillKVs  = [...]layout.DType{layout.F16, layout.BF16, layout.E4M3, layout.E5M2, layout.NVFP4}
)

func prefillKernel(kv string, d int) string { return fmt.Sprintf("batch_prefill_paged_%s_d%d", kv, d) }

// prefillKernels names the tiled prefill entry point of each cache dtype
// and head dim (built once: planning a step allocates nothing).
var prefillKernels = func() map[layout.DType]map[int]string {
	m := map[layout.DType]map[int]string{}
	for _, dt := range prefillKVs {
		m[dt] = map[int]string{}
		for _, d := range prefillDims {
			m[dt][d] = prefillKernel(kvSuffix[dt], d)
		}
	}
	return m
}()

// prefillShape is the launch shape of a tiled prefill.
type prefillShape struct {
	kernel      string
	rowsPerTile int // query rows per work item: max(1, 64 / group)
	packed      int // packed rows per full work item: rowsPerTile * group
	bc          int // keys per K/V tile (prefill.cu kBcFor)
}

// planPrefillShape reports whether the tiled kernel takes a prefill over
// cache geometry g with GQA group size group, and its shape: cache dtypes
// f16, bf16, e4m3 and e5m2 with head_dim 64, 128 or 256. Every other
// geometry (an f32 cache, any other head dim) runs the decode kernel with
// one work item per query row, the rule docs/kernels.md states.
func planPrefillShape(g layout.Paged, group int) (prefillShape, bool) {
	name, ok := prefillKernels[g.DType][g.HeadDim]
	if !ok || group < 1 {
		return prefillShape{}, false
	}
	sh := prefillShape{kernel: name, rowsPerTile: max(1, prefillPackedRows/group), bc: 32}
	if g.HeadDim > 128 {
		sh.bc = 16
	}
	sh.packed = sh.rowsPerTile * group
	return sh, true
}

// PrefillKernel names the kernel a prefill (or cascade level) over cache
// geometry g with num_qo_heads query heads launches: the tiled
// batch_prefill_paged_<kv>_d<D> where it applies, else the per-row decode
// entry point.
func PrefillKernel(g layout.Paged, numQOHeads int) (string, error) {
	if g.NumKVHeads < 1 || numQOHeads%g.NumKVHeads != 0 {
		return "", fmt.Errorf("cuda: prefill kernel: num_qo_heads %d is not a multiple of num_kv_heads %d: %w", numQOHeads, g.NumKVHeads, kernels.ErrInvalidAttention)
	}
	if sh, ok := planPrefillShape(g, numQOHeads/g.NumKVHeads); ok {
		return sh.kernel, nil
	}
	sh, err := planDecodeShape(g, numQOHeads/g.NumKVHeads)
	if err != nil {
		return "", err
	}
	return sh.kernel, nil
}

// launch returns the warps per CTA, the dynamic shared memory and the
// precision flags of a launch with q of dtype qDT writing oDT. The tensor
// cores multiply the cache's dtype (bf16 for a bf16 cache, f16 otherwise):
// split_q when q is another dtype (its rounding error runs as a second
// mma), split_p when the output is f32, or f16 from bf16 probabilities.
// The K/V stages and the Q planes of every warp must fit the 48 KiB
// default: W shrinks (the kernel then walks a work item in passes).
func (sh *prefillShape) launch(g layout.Paged, qDT, oDT layout.DType) (warps, smem int, flags uint64) {
	mmaDT := layout.F16
	if g.DType == layout.BF16 {
		mmaDT = layout.BF16
	}
	planes := 1
	if qDT != mmaDT {
		planes, flags = 2, flags|prefillFlagSplitQ
	}
	if oDT == layout.F32 || (mmaDT == layout.BF16 && oDT == layout.F16) {
		flags |= prefillFlagSplitP
	}
	row := tileRowBytes(g)
	if g.DType == layout.NVFP4 {
		row += 16 // prefill.cu kKVRowOf pads the code rows
	}
	kv := 2 * 2 * sh.bc * row
	perWarp := 16 * g.HeadDim * 2 * planes
	warps = min(prefillMaxWarps, (prefillSmemLimit-kv)/perWarp, (sh.packed+15)/16)
	return warps, kv + warps*perWarp, flags
}

// planPrefillLevel is planLevel for a prefill or cascade level the tiled
// kernel takes: one tile per rowsPerTile query rows of a request, over the
// keys its rows' causal mask and window leave (the union: the first row's
// window bound, the last row's causal bound), cut into split-k chunks by
// the split-KV scheduler (schedule.go; the kernel takes any (q_row,
// request, kv_begin, kv_end) items with their chunk index and the rows'
// merge CSR). A row's partial states are
// merge_indptr[row] + kv_chunk[item], so merge_partial_states merges them
// as it merges the decode kernel's.
func (s *Step) planPrefillLevel(t *kernels.PageTable, qoIndptr []int32, causal bool, sh prefillShape) error {
	g := s.g
	B := t.BatchSize()
	win := s.ap.WindowLeft
	s.lo, s.hi, s.req, s.pfRow = s.lo[:0], s.hi[:0], s.req[:0], s.pfRow[:0]
	for b := range B {
		n := t.SeqLen(b, g.PageSize)
		if n > math.MaxInt32-64 {
			return fmt.Errorf("%s: prefill: request %d has %d keys, more than the tiled kernel's 2^31-65: %w", s.b.name, b, n, kernels.ErrUnsupported)
		}
		q0, q1 := int(qoIndptr[b]), int(qoIndptr[b+1])
		for qa := q0; qa < q1; qa += sh.rowsPerTile {
			qb := min(qa+sh.rowsPerTile, q1)
			lo, hi := 0, n
			if causal {
				hi = min(hi, qb-1-q0+n-(q1-q0)+1) // the last row's bottom-right bound
			}
			if win >= 0 {
				lo = max(lo, qa-q0+n-(q1-q0)-win) // the first row's window
			}
			hi = max(hi, lo)
			s.lo, s.hi = append(s.lo, lo), append(s.hi, hi)
			s.req, s.pfRow = append(s.req, int32(b)), append(s.pfRow, int32(qa))
		}
	}
	// The split-KV scheduler over the tiles: a tile is a row of the
	// schedule (its CTAs: one per kv head). Every query row of a split
	// tile has one partial state per chunk, so the items are held to
	// capItems / (the most rows a tile has) and the partial states to
	// capItems.
	capItems, tileRows := s.lim.MaxWorkItems, 1
	for i := range s.lo {
		q1 := int(qoIndptr[s.req[i]+1])
		tileRows = max(tileRows, min(sh.rowsPerTile, q1-int(s.pfRow[i])))
	}
	lim := schedLimits{CTAsPerItem: g.NumKVHeads, Slots: max(s.b.drv.NumSMs(), 1) * prefillResident, Tile: sh.bc,
		MinChunk: (prefillMinChunk + sh.bc - 1) / sh.bc * sh.bc, Capacity: capItems / tileRows, Force: s.b.cfg.MaxChunkTokens}
	if s.lim.Fixed || lim.Capacity < len(s.lo) {
		lim.Force, lim.Capacity = -1, capItems // one item per tile
	}
	if err := s.sched.plan(s.lo, s.hi, s.req, lim); err != nil {
		return fmt.Errorf("%s: prefill: %v: %w", s.b.name, err, ErrStepLimit)
	}
	sc := &s.sched
	s.pfChunk = s.pfChunk[:0]
	var mrg []int32
	if sc.merge != nil {
		mrg = append(s.pfMerge[:0], 0)
	}
	parts := 0
	for i := 0; i < sc.items(); i++ {
		tile := sc.work[4*i]
		c := int32(0)
		if sc.merge != nil {
			c = int32(i) - sc.merge[tile]
		}
		sc.work[4*i] = s.pfRow[tile]
		s.pfChunk = append(s.pfChunk, c)
	}
	if mrg != nil {
		for tile := range s.lo {
			nc := sc.merge[tile+1] - sc.merge[tile]
			q1 := int(qoIndptr[s.req[tile]+1])
			for r := int(s.pfRow[tile]); r < min(int(s.pfRow[tile])+sh.rowsPerTile, q1); r++ {
				mrg = append(mrg, mrg[len(mrg)-1]+nc)
				parts += int(nc)
			}
		}
		s.pfMerge = mrg
	}
	if s.lim.Fixed { // padding items: the padding request, which has no query rows
		for sc.items() < s.lim.MaxRows {
			sc.work = append(sc.work, int32(s.rows), int32(s.lim.MaxBatch), 0, 0)
		}
	}
	if err := s.limit("work items", sc.items(), capItems); err != nil {
		return err
	}
	if err := s.limit("partial states", parts, capItems); err != nil {
		return err
	}
	lp := levelPlan{merge: -1, chunk: -1, tc: true, causal: causal, parts: parts}
	lp.indptr = s.packIndptr(t.KVIndptr)
	lp.last = s.packPadded(t.KVLastPageLen, s.lim.MaxBatch+1, 1)
	lp.qo = s.packPadded(qoIndptr, s.lim.MaxBatch+2, qoIndptr[B])
	lp.work = s.pack(sc.work)
	lp.items = sc.items()
	if mrg != nil {
		lp.chunk = s.pack(s.pfChunk)
		lp.merge = s.pack(mrg)
	}
	s.levels = append(s.levels, lp)
	return nil
}

// runPrefillLevel launches the tiled prefill kernel over one planned level
// (and the split-k merge when the level is split), writing o (dtype oDT)
// and lse.
func (s *Step) runPrefillLevel(cache *DeviceKVCache, lv *levelPlan, q DeviceTensor, o uint64, oDT layout.DType, lse, sinks uint64, vScale float64) error {
	g := s.g
	D := g.HeadDim
	qCode, oCode, qScale := s.launchScalars(q.DType, oDT)
	sh := s.pf
	warps, smem, flags := sh.launch(g, q.DType, oDT)
	var tmpO, tmpLSE uint64
	if lv.merge >= 0 {
		flags |= prefillFlagPartial
		tmpO = uint64(s.scratch)
		tmpLSE = tmpO + uint64(lv.parts*s.hq*D*4)
	}
	var causal uint64
	if lv.causal {
		causal = 1
	}
	a := append(s.args[:0],
		uint64(q.Ptr), uint64(cache.K), uint64(cache.V),
		s.at(lv.indptr), s.at(lv.indices), s.at(lv.last), s.at(lv.qo), s.at(lv.work), s.at(lv.chunk), s.at(lv.merge),
		o, lse, tmpO, tmpLSE, sinks,
		uint64(s.hq), uint64(g.NumKVHeads), uint64(g.PageSize), uint64(g.NumPages),
		uint64(g.StridePage()), uint64(g.StrideN()), uint64(g.StrideH()),
		uint64(qCode), uint64(oCode), f64Arg(qScale), f64Arg(s.ap.LogitsSoftCap), f64Arg(vScale),
		uint64(sh.rowsPerTile), causal, uint64(int64(s.ap.WindowLeft)), flags)
	if g.DType == layout.NVFP4 {
		a = append(a, uint64(cache.KSF), uint64(cache.VSF))
	}
	s.args = a
	if err := s.b.launch(sh.kernel, Dim3{lv.items, g.NumKVHeads, 1}, Dim3{32 * warps, 1, 1}, smem, a); err != nil {
		return err
	}
	if lv.merge < 0 {
		return nil
	}
	return s.mergePartial(lv, tmpO, tmpLSE, o, lse, sinks, oCode, vScale)
}

// mergePartial launches merge_partial_states over a split level's partial
// states (the decode and the prefill kernels' alike), folding in the sinks
// (0: none) once there.
func (s *Step) mergePartial(lv *levelPlan, tmpO, tmpLSE, o, lse, sinks uint64, oCode int64, vScale float64) error {
	D := s.g.HeadDim
	m := append(s.args[:0], tmpO, tmpLSE, s.at(lv.merge), o, lse, sinks, uint64(s.hq), uint64(D), uint64(oCode), f64Arg(vScale))
	s.args = m
	mergeRows := s.rows
	if s.lim.Fixed {
		mergeRows = s.lim.MaxRows // a fixed grid; the padding rows merge no item
	}
	return s.b.launch("merge_partial_states", Dim3{mergeRows, s.hq, 1}, Dim3{threadsFor(int64(D)), 1, 1}, 0, m)
}
