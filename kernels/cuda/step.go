package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// ErrStepLimit is wrapped when a step's arrays exceed the [StepLimits] its
// [Step] was sized for.
var ErrStepLimit = errors.New("cuda: step exceeds its limits")

// ErrNotPlanned is wrapped when a step runs an operation its last plan did
// not prepare (or with a cache of another geometry).
var ErrNotPlanned = errors.New("cuda: operation not planned for this step")

// Level is one level of a cascade step: cascade.Level, the one
// cascade-level type.
type Level = kernels.CascadeLevel

// StepLimits size a [Step]'s device buffers once; every plan must fit.
type StepLimits struct {
	MaxBatch     int // requests (or groups of a cascade level)
	MaxPages     int // kv_indices entries of one level
	MaxRows      int // query rows (nnz_qo) and appended rows (nnz)
	MaxLevels    int // cascade levels (0 means 1)
	MaxQOHeads   int // num_qo_heads
	MaxHeadDim   int // head_dim
	MaxWorkItems int // split-KV work items per level (0: 2*MaxRows + 4*SMs)
	// Fixed pads every plan to the limits, which a CUDA graph of the step
	// needs ([Step.BeginCapture]): each array at an offset set by the
	// limits, one upload of a fixed size, launches of a fixed grid, and
	// the rows beyond a plan's own padding that reads and writes nothing
	// of the cache. With MaxWorkItems > MaxRows (and split-KV not turned
	// off by Config.MaxChunkTokens < 0) the attention launches
	// MaxWorkItems work items whatever the batch, the split-KV schedule's
	// items first and empty items the kernel skips after them, and always
	// merges (grid MaxRows x num_qo_heads); otherwise one item per row,
	// no split. The tensors of a fixed step's Append and Attention have
	// MaxRows rows; the rows past the plan's hold unspecified values in o
	// and lse.
	Fixed bool
}

// StepPlan is one step's index arrays and the scalars that shape its
// launches (FlashInfer's plan): the rows to append, if any, and one
// attention over the same cache geometry.
type StepPlan struct {
	Geometry layout.Paged
	// Table is the step's page table, after the append: the append's and,
	// for Decode and Prefill, the attention's.
	Table kernels.PageTable
	// BatchIndices and Positions name the appended rows (nil: no append).
	BatchIndices, Positions []int32

	Attention kernels.AttentionKind
	Rows      int     // query rows: B for Decode, nnz_qo for Prefill and Cascade
	QOIndptr  []int32 // Prefill: [B+1]
	Levels    []Level // Cascade, level 0 (most shared) first
	Causal    bool    // Prefill; Cascade: last level only
	kernels.AttentionParams
}

// levelPlan is one attention launch (a decode, a prefill or one cascade
// level) as planned: offsets of its arrays in the index buffer.
type levelPlan struct {
	indptr, indices, last, work, merge int // byte offsets (merge: -1 without split-k)
	items                              int
	// the tiled prefill kernel (prefill.go): qo_indptr and kv_chunk
	// offsets (kv_chunk: -1 without split-k), partial states, causal
	qo, chunk, parts int
	tc, causal       bool
}

// appendPlan holds the byte offsets of an append's arrays in the index
// buffer (-1: absent).
type appendPlan struct{ indptr, indices, bi, pos int }

// Step owns the fixed device buffers a step's index arrays are uploaded to
// (sized once by [StepLimits]), their pinned host staging, and scratch for
// split-k partial states and cascade accumulators. [Step.Plan] validates a
// step's arrays on the host with the shared validator, packs them into the
// staging buffer and uploads them with one asynchronous copy; [Step.Append]
// and [Step.Attention] then launch on the device with no host traffic. The
// addresses of the buffers never change, and a plan places every array at an
// offset that depends only on the step's sizes, so two steps of the same
// shape launch identical kernel arguments (what a CUDA graph replay needs;
// see docs/kernels.md).
//
// A Step is not safe for concurrent use; use one per stream.
type Step struct {
	b        *Backend
	lim      StepLimits
	staging  []byte
	idx      DevicePtr
	scratch  DevicePtr
	scratchN int

	// the current plan
	planned  bool
	g        layout.Paged
	kind     kernels.AttentionKind
	rows     int
	hq       int
	ap       kernels.AttentionParams
	shape    decodePlan
	nnz      int
	app      appendPlan
	mla      mlaPlan
	levels   []levelPlan
	sinks    int // byte offset of the plan's sinks [hq] (float32) in the index buffer; -1: none
	uploaded int
	inflight bool   // the last upload may still be reading the staging buffer
	uploadAt uint64 // b.waits when it was queued
	cursor   int
	lo, hi   []int
	req      []int32
	sched    kvSchedule
	args     []uint64
	// fixedSplit: a fixed step whose attention always runs split-KV over
	// MaxWorkItems items and merges (see StepLimits.Fixed)
	fixedSplit bool
	pf         prefillShape // the tiled prefill's shape (prefill.go)
	pfRow      []int32      // first query row of each prefill tile
	pfChunk    []int32      // kv_chunk of each prefill work item
	pfMerge    []int32      // merge_indptr of a split prefill level's query rows

	busy       atomic.Bool // a method is running (enter/leave)
	capturing  bool        // between BeginCapture and EndCapture
	captureErr error       // the first failure while capturing
	graphShape stepShape   // the plan captured
}

// NewStep allocates a step's device buffers and pinned staging.
func (b *Backend) NewStep(lim StepLimits) (*Step, error) {
	if lim.MaxLevels == 0 {
		lim.MaxLevels = 1
	}
	if lim.MaxWorkItems == 0 {
		lim.MaxWorkItems = 2*lim.MaxRows + 4*max(b.drv.NumSMs(), 1)
	}
	if lim.Fixed && lim.MaxWorkItems < lim.MaxRows {
		return nil, fmt.Errorf("%s: step limits: max_work_items = %d below max_rows = %d in a fixed step (one work item per row): %w",
			b.name, lim.MaxWorkItems, lim.MaxRows, ErrStepLimit)
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"max_batch", lim.MaxBatch}, {"max_pages", lim.MaxPages}, {"max_rows", lim.MaxRows}, {"max_levels", lim.MaxLevels},
		{"max_qo_heads", lim.MaxQOHeads}, {"max_head_dim", lim.MaxHeadDim}, {"max_work_items", lim.MaxWorkItems}} {
		if v.n < 0 || v.n > math.MaxInt32 {
			return nil, fmt.Errorf("%s: step limits: %s = %d outside [0, 2^31)", b.name, v.name, v.n)
		}
	}
	idxInts := int64(lim.MaxQOHeads) + // sinks
		int64(lim.MaxLevels)*(3*int64(lim.MaxBatch)+2+int64(lim.MaxPages)+4*int64(lim.MaxWorkItems)+int64(lim.MaxRows)+1) +
		// the append's own table (a cascade's levels are not the per-request table) and rows
		3*int64(lim.MaxBatch) + 2 + int64(lim.MaxPages) + 2*int64(lim.MaxRows) +
		// a fixed layout's padding: one request and one page per table
		int64(lim.MaxLevels+1)*3
	hd := int64(lim.MaxHeadDim) + 1
	scratch := int64(lim.MaxWorkItems) * int64(lim.MaxQOHeads) * hd * 4
	if lim.MaxLevels > 1 {
		scratch += 2 * int64(lim.MaxRows) * int64(lim.MaxQOHeads) * hd * 4
	}
	if idxInts*4 > math.MaxInt32 || scratch > math.MaxInt/2 {
		return nil, fmt.Errorf("%s: step limits %+v need %d index bytes and %d scratch bytes: %w", b.name, lim, idxInts*4, scratch, ErrStepLimit)
	}
	s := &Step{b: b, lim: lim, scratchN: int(scratch)}
	s.fixedSplit = lim.Fixed && lim.MaxWorkItems > lim.MaxRows && b.cfg.MaxChunkTokens >= 0
	var err error
	if s.staging, err = b.drv.PinnedAlloc(int(idxInts*4) + 16); err != nil {
		return nil, fmt.Errorf("%s: pinned staging: %w", b.name, err)
	}
	if s.idx, err = b.drv.Alloc(len(s.staging)); err != nil {
		s.Free()
		return nil, fmt.Errorf("%s: step index buffer: %w", b.name, err)
	}
	if s.scratch, err = b.drv.Alloc(max(int(scratch), 256)); err != nil {
		s.Free()
		return nil, fmt.Errorf("%s: step scratch: %w", b.name, err)
	}
	s.levels = make([]levelPlan, 0, lim.MaxLevels)
	s.args = make([]uint64, 0, 32)
	return s, nil
}

// Free releases the step's buffers.
func (s *Step) Free() {
	if s.idx != 0 {
		_ = s.b.drv.Free(s.idx)
	}
	if s.scratch != 0 {
		_ = s.b.drv.Free(s.scratch)
	}
	if s.staging != nil {
		_ = s.b.drv.PinnedFree(s.staging)
	}
	s.idx, s.scratch, s.staging, s.planned = 0, 0, nil, false
}

// Limits returns the limits the step was sized for (defaults filled in).
func (s *Step) Limits() StepLimits { return s.lim }

// UploadedBytes is the size of the last plan's one host-to-device copy.
func (s *Step) UploadedBytes() int { return s.uploaded }

// reuseStaging waits for the device when the last plan's asynchronous copy
// may still be reading the staging buffer (no Synchronize or download since
// it was queued); an engine that downloads its logits every step never
// waits here.
func (s *Step) reuseStaging() error {
	if s.inflight && s.b.waits.Load() == s.uploadAt {
		if err := s.b.Synchronize(); err != nil {
			return fmt.Errorf("%s: step: waiting for the previous step: %w", s.b.name, err)
		}
	}
	s.inflight = false
	return nil
}

// upload queues the one copy of the packed staging prefix.
func (s *Step) upload() error {
	if s.cursor > 0 {
		if err := s.b.drv.HtoDAsync(s.idx, s.staging[:s.cursor]); err != nil {
			return fmt.Errorf("%s: step upload: %w", s.b.name, err)
		}
		s.inflight, s.uploadAt = true, s.b.waits.Load()
	}
	s.uploaded = s.cursor
	return nil
}

// pack appends an int32 array to the staging buffer and returns its byte
// offset in the index buffer.
func (s *Step) pack(a []int32) int {
	off := s.cursor
	if s.cursor+4*len(a) <= len(s.staging) { // else prepare fails on the cursor
		copy(s.staging[off:], i32Bytes(a))
	}
	s.cursor += 4 * len(a)
	return off
}

// put appends one int32 to the staging buffer.
func (s *Step) put(v int32) {
	if s.cursor+4 <= len(s.staging) {
		binary.LittleEndian.PutUint32(s.staging[s.cursor:], uint32(v))
	}
	s.cursor += 4
}

// packPadded packs a; in a fixed step it fills the array's region up to n
// entries with fill, so that the next array's offset depends on the limits
// only.
func (s *Step) packPadded(a []int32, n int, fill int32) int {
	off := s.pack(a)
	if s.lim.Fixed {
		for range n - len(a) {
			s.put(fill)
		}
	}
	return off
}

// packIndptr packs a kv_indptr of B+1 entries; in a fixed step padded to
// MaxBatch+2: requests B..MaxBatch-1 have no pages and the padding request
// MaxBatch, which the padding rows and work items name, has one page whose
// id (-1, from the kv_indices padding) every kernel skips.
func (s *Step) packIndptr(indptr []int32) int {
	off := s.pack(indptr)
	if s.lim.Fixed {
		end := indptr[len(indptr)-1]
		for range s.lim.MaxBatch + 1 - len(indptr) {
			s.put(end)
		}
		s.put(end + 1)
	}
	return off
}

func (s *Step) limit(what string, n, max int) error {
	if n > max {
		return fmt.Errorf("%s: step: %s = %d exceeds the step's limit %d: %w", s.b.name, what, n, max, ErrStepLimit)
	}
	return nil
}

// validate runs the shared validator over every array of p, in the order
// the CPU backends' Validate methods check them, then the limits. The page
// table is checked once ([kernels.PageTable.Validate], i.e.
// ragged.ValidatePageTable), for the first call that reads it (the append,
// else the attention); a cascade's levels are each their own table.
func (s *Step) validate(p *StepPlan) error {
	g := p.Geometry
	if _, _, err := planeBytes(g); err != nil {
		return fmt.Errorf("%s: step: %w", s.b.name, err)
	}
	appends := p.BatchIndices != nil || p.Positions != nil
	if appends || p.Attention == kernels.NoAttention {
		op := "append"
		if !appends {
			op = "step"
		}
		if err := p.Table.Validate(g.PageSize, g.NumPages); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	if appends {
		if err := kernels.ValidateAppendIndices(p.BatchIndices, p.Positions); err != nil {
			return err
		}
		if err := kernels.ValidateAppendRows(&p.Table, p.BatchIndices, p.Positions, g.PageSize, false); err != nil {
			return err
		}
	}
	switch p.Attention {
	case kernels.NoAttention:
	case kernels.Decode:
		if err := p.AttentionParams.ValidateScalars("decode", p.NumQOHeads, g.NumKVHeads, g.HeadDim); err != nil {
			return err
		}
		if err := p.Table.ValidateBatch("decode", p.Rows); err != nil {
			return err
		}
		if !appends {
			if err := p.Table.Validate(g.PageSize, g.NumPages); err != nil {
				return fmt.Errorf("decode: %w", err)
			}
		}
	case kernels.Prefill:
		if err := p.AttentionParams.ValidateScalars("prefill", p.NumQOHeads, g.NumKVHeads, g.HeadDim); err != nil {
			return err
		}
		if !appends {
			if err := p.Table.Validate(g.PageSize, g.NumPages); err != nil {
				return fmt.Errorf("prefill: %w", err)
			}
		}
		if err := kernels.ValidateQOIndptr("prefill", p.QOIndptr, len(p.Table.KVIndptr)-1, p.Rows); err != nil {
			return err
		}
	case kernels.Cascade:
		if len(p.Levels) == 0 {
			return fmt.Errorf("cascade: %w: no levels", kernels.ErrInvalidAttention)
		}
		if p.WindowLeft != -1 {
			return fmt.Errorf("cascade: %w: window_left = %d; cascade attention takes no window (want -1)", kernels.ErrInvalidAttention, p.WindowLeft)
		}
		for l, lv := range p.Levels {
			err := p.AttentionParams.ValidateScalars("prefill", p.NumQOHeads, g.NumKVHeads, g.HeadDim)
			if err == nil {
				t := lv.Table()
				if err = t.Validate(g.PageSize, g.NumPages); err != nil {
					err = fmt.Errorf("prefill: %w", err)
				} else {
					err = kernels.ValidateQOIndptr("prefill", lv.QOIndptr, len(t.KVIndptr)-1, p.Rows)
				}
			}
			if err != nil {
				return fmt.Errorf("cascade level %d of %d: %w", l, len(p.Levels), err)
			}
		}
	default:
		return fmt.Errorf("%s: step: %w: attention kind %d", s.b.name, kernels.ErrInvalidAttention, p.Attention)
	}
	if p.Rows < 0 {
		return fmt.Errorf("%s: step: %w: rows = %d", s.b.name, kernels.ErrInvalidAttention, p.Rows)
	}

	// Limits, after validation: a malformed array gets the validator's error.
	lim := s.lim
	if len(p.Table.KVIndptr) > 0 { // validated above unless a cascade without append leaves it empty
		if err := s.limit("batch", p.Table.BatchSize(), lim.MaxBatch); err != nil {
			return err
		}
		if err := s.limit("pages", int(p.Table.KVIndptr[p.Table.BatchSize()]), lim.MaxPages); err != nil {
			return err
		}
	}
	if err := s.limit("appended rows", len(p.BatchIndices), lim.MaxRows); err != nil {
		return err
	}
	if p.Attention == kernels.NoAttention {
		return nil
	}
	if err := s.limit("query rows", p.Rows, lim.MaxRows); err != nil {
		return err
	}
	if err := s.limit("num_qo_heads", p.NumQOHeads, lim.MaxQOHeads); err != nil {
		return err
	}
	if err := s.limit("head_dim", g.HeadDim, lim.MaxHeadDim); err != nil {
		return err
	}
	if p.Attention == kernels.Cascade {
		if err := s.limit("levels", len(p.Levels), lim.MaxLevels); err != nil {
			return err
		}
		for _, lv := range p.Levels {
			B := len(lv.KVIndptr) - 1
			if err := s.limit("batch", B, lim.MaxBatch); err != nil {
				return err
			}
			if err := s.limit("pages", int(lv.KVIndptr[B]), lim.MaxPages); err != nil {
				return err
			}
		}
	}
	return nil
}

// Plan validates p on the host (nothing reaches the device when it
// fails), plans the launches (split-k chunks, causal and window ranges per
// query row), packs every index array into the pinned staging buffer and
// uploads it with one asynchronous copy into the step's index buffer. On an
// error the step has no plan.
func (s *Step) Plan(p *StepPlan) error {
	if err := s.enter("plan"); err != nil {
		return err
	}
	defer s.leave()
	if err := s.prepare(p); err != nil {
		return err
	}
	if err := s.upload(); err != nil {
		s.planned = false
		return err
	}
	return nil
}

// prepare validates p, plans its launches and packs its arrays into the
// staging buffer (Plan without the upload).
func (s *Step) prepare(p *StepPlan) error {
	s.planned = false
	if err := s.validate(p); err != nil {
		return err
	}
	if err := s.reuseStaging(); err != nil {
		return err
	}
	g := p.Geometry
	s.g, s.kind, s.rows, s.hq, s.ap = g, p.Attention, p.Rows, p.NumQOHeads, p.AttentionParams
	s.mla.on = false
	s.nnz = len(p.BatchIndices)
	s.levels = s.levels[:0]
	s.cursor = 0
	// Sinks first: hq floats, so every later offset still depends on the
	// step's sizes only (a graph holds hq and whether there are sinks).
	s.sinks = -1
	if p.Attention != kernels.NoAttention && p.Sinks != nil {
		s.sinks = s.cursor
		for _, x := range p.Sinks {
			s.put(int32(math.Float32bits(x)))
		}
	}
	if p.Attention != kernels.NoAttention {
		shape, err := planDecodeShape(g, p.NumQOHeads/g.NumKVHeads)
		if err != nil {
			return fmt.Errorf("%s: %w", s.b.name, err)
		}
		// Decode runs on tensor cores where decode_tc.cu serves the shape;
		// prefill and cascade levels keep the CUDA-core kernel.
		if tc, ok := planDecodeTC(g, p.NumQOHeads/g.NumKVHeads); ok && p.Attention == kernels.Decode {
			shape = tc
		}
		s.shape = shape
	}
	// B-sized arrays first, kv_indices last: every offset but the page
	// arrays' depends on the batch and row counts only.
	switch p.Attention {
	case kernels.Decode, kernels.Prefill:
		if err := s.planLevel(&p.Table, p.QOIndptr, p.Causal, p.Attention == kernels.Decode); err != nil {
			return err
		}
	case kernels.Cascade:
		for l, lv := range p.Levels {
			t := lv.Table()
			if err := s.planLevel(&t, lv.QOIndptr, p.Causal && l == len(p.Levels)-1, false); err != nil {
				return err
			}
		}
	}
	s.app = appendPlan{indptr: -1, indices: -1, bi: -1, pos: -1}
	// Decode and prefill append through the attention's own table (shared
	// = same arrays, uploaded once); a cascade's levels are not the
	// per-request table, so an append packs its own.
	shared := p.Attention == kernels.Decode || p.Attention == kernels.Prefill
	if s.nnz > 0 {
		if shared {
			s.app.indptr = s.levels[0].indptr
		} else {
			s.app.indptr = s.packIndptr(p.Table.KVIndptr)
		}
		s.app.bi = s.packPadded(p.BatchIndices, s.lim.MaxRows, int32(s.lim.MaxBatch))
		s.app.pos = s.packPadded(p.Positions, s.lim.MaxRows, 0)
	}
	// page arrays
	for i := range s.levels {
		lv := &s.levels[i]
		var ind []int32
		if p.Attention == kernels.Cascade {
			ind = p.Levels[i].KVPageIndices
			ind = ind[:p.Levels[i].KVIndptr[len(p.Levels[i].KVIndptr)-1]]
		} else {
			ind = p.Table.KVPageIndices[:p.Table.KVIndptr[p.Table.BatchSize()]]
		}
		lv.indices = s.packPadded(ind, s.lim.MaxPages+1, -1)
	}
	if s.nnz > 0 {
		if shared {
			s.app.indices = s.levels[0].indices
		} else {
			s.app.indices = s.packPadded(p.Table.KVPageIndices[:p.Table.KVIndptr[p.Table.BatchSize()]], s.lim.MaxPages+1, -1)
		}
	}
	if s.cursor > len(s.staging) {
		return fmt.Errorf("%s: step: %d index bytes exceed the staging buffer of %d: %w", s.b.name, s.cursor, len(s.staging), ErrStepLimit)
	}
	s.planned = true
	return nil
}

// planLevel packs one attention launch's B-sized arrays and work items:
// for decode one query row per request over the keys in its window;
// otherwise one query row per query token over the keys its causal mask and
// window leave; the rows cut into split-KV chunks by the scheduler
// (schedule.go).
func (s *Step) planLevel(t *kernels.PageTable, qoIndptr []int32, causal, decode bool) error {
	g := s.g
	if !decode {
		if sh, ok := planPrefillShape(g, s.hq/g.NumKVHeads); ok {
			s.pf = sh
			return s.planPrefillLevel(t, qoIndptr, causal, sh)
		}
	}
	B := t.BatchSize()
	rows := s.rows
	s.lo, s.hi = resizeInts(s.lo, rows), resizeInts(s.hi, rows)
	if cap(s.req) < rows {
		s.req = make([]int32, rows)
	}
	s.req = s.req[:rows]
	win := s.ap.WindowLeft
	if decode {
		for r := range B {
			n := t.SeqLen(r, g.PageSize)
			if n > math.MaxInt32 {
				return fmt.Errorf("%s: decode: request %d has %d keys, more than the kernels' 2^31-1: %w", s.b.name, r, n, kernels.ErrUnsupported)
			}
			s.hi[r] = n
			s.lo[r] = 0
			s.req[r] = int32(r)
			if win >= 0 {
				s.lo[r] = max(0, n-1-win)
			}
		}
	} else {
		for b := range B {
			n := t.SeqLen(b, g.PageSize)
			if n > math.MaxInt32 {
				return fmt.Errorf("%s: prefill: request %d has %d keys, more than the kernels' 2^31-1: %w", s.b.name, b, n, kernels.ErrUnsupported)
			}
			q0, q1 := int(qoIndptr[b]), int(qoIndptr[b+1])
			for r := q0; r < q1; r++ {
				pos := r - q0 + n - (q1 - q0) // absolute position, bottom-right aligned
				lo, hi := 0, n
				if causal {
					hi = min(hi, pos+1)
				}
				if win >= 0 {
					lo = max(lo, pos-win)
				}
				hi = max(hi, lo)
				s.lo[r], s.hi[r], s.req[r] = lo, hi, int32(b)
			}
		}
	}
	lim := schedLimits{CTAsPerItem: g.NumKVHeads * s.shape.gz, Slots: max(s.b.drv.NumSMs(), 1) * s.shape.resident,
		Tile: s.shape.tile, MinChunk: s.shape.minChunk, Capacity: s.lim.MaxWorkItems, Force: s.b.cfg.MaxChunkTokens,
		Merge: s.fixedSplit || s.ap.Sinks != nil}
	if s.lim.Fixed && !s.fixedSplit {
		lim.Force = -1 // one item per row: the grid is MaxRows items
	}
	if err := s.sched.plan(s.lo, s.hi, s.req, lim); err != nil {
		return fmt.Errorf("%s: step: %v: %w", s.b.name, err, ErrStepLimit)
	}
	sc := &s.sched
	if s.lim.Fixed && sc.merge != nil { // empty items up to the fixed grid; padding rows merge no item
		n := s.lim.MaxRows // sinks without split-KV: one item per row, merged
		if s.fixedSplit {
			n = s.lim.MaxWorkItems
		}
		for sc.items() < n {
			sc.work = append(sc.work, 0, int32(s.lim.MaxBatch), 0, 0)
		}
		for range s.lim.MaxRows - rows {
			sc.merge = append(sc.merge, sc.merge[len(sc.merge)-1])
		}
		sc.mbuf = sc.merge
	} else if s.lim.Fixed { // padding rows: no keys of the padding request
		for r := rows; r < s.lim.MaxRows; r++ {
			sc.work = append(sc.work, int32(r), int32(s.lim.MaxBatch), 0, 0)
		}
	}
	lp := levelPlan{merge: -1}
	lp.indptr = s.packIndptr(t.KVIndptr)
	lp.last = s.packPadded(t.KVLastPageLen, s.lim.MaxBatch+1, 1)
	lp.work = s.pack(sc.work)
	lp.items = sc.items()
	if sc.merge != nil {
		lp.merge = s.pack(sc.merge)
	}
	s.levels = append(s.levels, lp)
	return nil
}

func resizeInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}

func (s *Step) at(off int) uint64 {
	if off < 0 {
		return 0
	}
	return uint64(s.idx) + uint64(off)
}

// checkCache checks that the plan covers cache.
func (s *Step) checkCache(op string, g layout.Paged, ok bool) error {
	if !s.planned {
		return fmt.Errorf("%s: %s: %w (call Plan first)", s.b.name, op, ErrNotPlanned)
	}
	if !ok {
		return fmt.Errorf("%s: %s: %w: the device cache is not allocated", s.b.name, op, kernels.ErrInvalidCache)
	}
	if g != s.g {
		return fmt.Errorf("%s: %s: %w: cache %+v, plan %+v", s.b.name, op, ErrNotPlanned, g, s.g)
	}
	return nil
}

// Append is append_paged_kv_cache for the planned rows: key and value rows
// [nnz, H, D] (device tensors) are written into cache (converted into an
// fp8 cache with kScale/vScale, as [kernels.AppendParams] describes). It
// launches one kernel and moves no host memory.
func (s *Step) Append(cache *DeviceKVCache, key, value DeviceTensor, kScale, vScale float64) error {
	const op = "append"
	if err := s.enter(op); err != nil {
		return err
	}
	defer s.leave()
	err := s.append(cache, key, value, kScale, vScale)
	s.noteCaptureErr(err)
	return err
}

func (s *Step) append(cache *DeviceKVCache, key, value DeviceTensor, kScale, vScale float64) error {
	const op = "append"
	if err := s.checkCache(op, cache.Geometry, len(cache.allocs) > 0); err != nil {
		return err
	}
	if s.nnz == 0 {
		if key.Bytes() != 0 || value.Bytes() != 0 {
			return fmt.Errorf("%s: %s: %w: the plan appends no rows", s.b.name, op, ErrNotPlanned)
		}
		return nil
	}
	g := s.g
	nnz, what := s.nnz, "nnz = len(batch_indices)"
	if s.lim.Fixed {
		nnz, what = s.lim.MaxRows, "max_rows of a fixed step"
	}
	if err := key.check("append_key", nnz, g.NumKVHeads, g.HeadDim); err != nil {
		return fmt.Errorf("%s: %w (%s, num_kv_heads, head_dim)", op, err, what)
	}
	if err := value.check("append_value", nnz, g.NumKVHeads, g.HeadDim); err != nil {
		return fmt.Errorf("%s: %w (%s, num_kv_heads, head_dim)", op, err, what)
	}
	if err := kernels.ValidateAppendDTypes(key.DType, value.DType, g.DType, kScale, vScale); err != nil {
		return err
	}
	es := int64(g.DType.Size())
	if tok := int64(g.NumKVHeads) * int64(g.HeadDim) * max(es, 1); tok > math.MaxInt32 {
		return fmt.Errorf("%s: append: %d bytes per token exceed the kernels' 32-bit token indexing: %w", s.b.name, tok, kernels.ErrUnsupported)
	}
	a := append(s.args[:0],
		uint64(key.Ptr), uint64(value.Ptr), s.at(s.app.bi), s.at(s.app.pos),
		uint64(cache.K), uint64(cache.V), s.at(s.app.indices), s.at(s.app.indptr),
		uint64(nnz), uint64(g.NumKVHeads))
	if g.DType == layout.NVFP4 { // quantise: one thread per 16-element block
		src, _ := dtypeCode(key.DType)
		a = append(a[:6], uint64(cache.KSF), uint64(cache.VSF), s.at(s.app.indices), s.at(s.app.indptr),
			uint64(nnz), uint64(g.NumKVHeads), uint64(g.HeadDim), uint64(g.PageSize), uint64(g.NumPages),
			uint64(g.StridePage()), uint64(g.StrideN()), uint64(g.StrideH()), uint64(src),
			f64Arg(float64(kernels.EffectiveScale(kScale))), f64Arg(float64(kernels.EffectiveScale(vScale))))
		s.args = a
		return s.b.launch("append_paged_kv_cache_nvfp4", Dim3{s.b.gridFor(nnz), 1, 1},
			Dim3{threadsFor(int64(g.NumKVHeads) * int64(g.HeadDim/layout.NVFP4BlockSize)), 1, 1}, 0, a)
	}
	if kernels.AppendConverts(key.DType, g.DType) {
		src, _ := dtypeCode(key.DType)
		dst, _ := dtypeCode(g.DType)
		a = append(a, uint64(g.HeadDim), uint64(g.PageSize), uint64(g.NumPages),
			uint64(g.StridePage()), uint64(g.StrideN()), uint64(g.StrideH()), uint64(src), uint64(dst),
			f64Arg(float64(kernels.EffectiveScale(kScale))), f64Arg(float64(kernels.EffectiveScale(vScale))))
		s.args = a
		return s.b.launch("append_paged_kv_cache_quant", Dim3{s.b.gridFor(nnz), 1, 1},
			Dim3{threadsFor(int64(g.NumKVHeads) * int64(g.HeadDim)), 1, 1}, 0, a)
	}
	rowBytes := int64(g.HeadDim) * es
	u := copyUnit(rowBytes)
	a = append(a, uint64(rowBytes), uint64(g.PageSize), uint64(g.NumPages),
		uint64(g.StridePage()*es), uint64(g.StrideN()*es), uint64(g.StrideH()*es))
	s.args = a
	return s.b.launch(appendKernels[u], Dim3{s.b.gridFor(nnz), 1, 1},
		Dim3{threadsFor(int64(g.NumKVHeads) * rowBytes / int64(u)), 1, 1}, 0, a)
}

// appendKernels names the byte-copy append entry point of each copy unit.
var appendKernels = map[int]string{16: "append_paged_kv_cache_u16", 8: "append_paged_kv_cache_u8",
	4: "append_paged_kv_cache_u4", 2: "append_paged_kv_cache_u2", 1: "append_paged_kv_cache_u1"}

// Attention runs the planned attention over cache: q [rows, Hq, D] in,
// o [rows, Hq, D] and (when lse.Ptr != 0) lse [rows*Hq] (f32, base 2) out,
// all device tensors. A cascade runs each level into float32 accumulators
// in the step's scratch and merges them with merge_state on the device; the
// last merge writes o and lse. No host memory is read or written.
func (s *Step) Attention(cache *DeviceKVCache, q, o, lse DeviceTensor) error {
	if err := s.enter("attention"); err != nil {
		return err
	}
	defer s.leave()
	err := s.attention(cache, q, o, lse)
	s.noteCaptureErr(err)
	return err
}

func (s *Step) attention(cache *DeviceKVCache, q, o, lse DeviceTensor) error {
	op := "decode"
	if s.kind != kernels.Decode {
		op = "prefill"
	}
	if err := s.checkCache(op, cache.Geometry, len(cache.allocs) > 0); err != nil {
		return err
	}
	if s.kind == kernels.NoAttention {
		return fmt.Errorf("%s: attention: %w: the plan has no attention", s.b.name, ErrNotPlanned)
	}
	g := s.g
	rows := s.rows
	if s.lim.Fixed {
		rows = s.lim.MaxRows
	}
	err := q.checkActivation(op, "q", rows, s.hq, g.HeadDim)
	if err == nil {
		err = o.checkActivation(op, "o", rows, s.hq, g.HeadDim)
	}
	if err == nil {
		err = checkLSE(op, "lse", lse, rows*s.hq)
	}
	if err != nil && s.lim.Fixed {
		return fmt.Errorf("%w (a fixed step's tensors have max_rows = %d rows)", err, rows)
	}
	if err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	// The sinks join one launch only: the single level, or a cascade's last
	// level (every row has its group there), whose state every other level
	// is merged into; the other levels' states never hold them.
	sinks := s.at(s.sinks)
	if s.kind != kernels.Cascade {
		return s.runLevel(cache, &s.levels[0], q, uint64(o.Ptr), o.DType, uint64(lse.Ptr), sinks, s.ap.EffectiveVScale())
	}
	// Cascade: the last level into acc, every other level into tmp, each
	// merged into acc; the last merge writes o and lse.
	n := int64(rows) * int64(s.hq)
	D := int64(g.HeadDim)
	base := uint64(s.scratch) + uint64(int64(s.lim.MaxWorkItems)*int64(s.lim.MaxQOHeads)*(int64(s.lim.MaxHeadDim)+1)*4)
	acc, tmp := base, base+uint64(n*D*4)
	accLSE, tmpLSE := tmp+uint64(n*D*4), tmp+uint64(n*D*4)+uint64(n*4)
	L := len(s.levels)
	if L == 1 {
		return s.runLevel(cache, &s.levels[0], q, uint64(o.Ptr), o.DType, uint64(lse.Ptr), sinks, s.ap.EffectiveVScale())
	}
	if err := s.runLevel(cache, &s.levels[L-1], q, acc, layout.F32, accLSE, sinks, s.ap.EffectiveVScale()); err != nil {
		return err
	}
	for l := 0; l < L-1; l++ {
		if err := s.runLevel(cache, &s.levels[l], q, tmp, layout.F32, tmpLSE, 0, s.ap.EffectiveVScale()); err != nil {
			return err
		}
		outV, outS, outDT := acc, accLSE, layout.F32
		if l == L-2 {
			outV, outDT = uint64(o.Ptr), o.DType
			if lse.Ptr != 0 {
				outS = uint64(lse.Ptr)
			}
		}
		if err := s.b.mergeState(acc, accLSE, layout.F32, tmp, tmpLSE, layout.F32, outV, outS, outDT, n, D, &s.args); err != nil {
			return err
		}
	}
	return nil
}

// runLevel launches the decode kernel (the tiled prefill kernel for a level
// planned for it) over one planned level (and the
// split-k merge when the level is split) writing o (dtype oDT) and lse.
// sinks (0: none) join once: the decode kernels take none, so a plan with
// sinks always merges (planLevel) and merge_partial_states folds them in.
func (s *Step) runLevel(cache *DeviceKVCache, lv *levelPlan, q DeviceTensor, o uint64, oDT layout.DType, lse, sinks uint64, vScale float64) error {
	if lv.tc {
		return s.runPrefillLevel(cache, lv, q, o, oDT, lse, sinks, vScale)
	}
	g := s.g
	D := g.HeadDim
	qCode, oCode, qScale := s.launchScalars(q.DType, oDT)
	partial := lv.merge >= 0
	if sinks != 0 && !partial {
		return fmt.Errorf("%s: attention: %w: sinks on a level planned without a merge", s.b.name, ErrNotPlanned)
	}
	var tmpO, tmpLSE uint64
	if partial {
		tmpO = uint64(s.scratch)
		tmpLSE = tmpO + uint64(lv.items*s.hq*D*4)
	}
	var flag uint64
	if partial {
		flag = 1
	}
	a := append(s.args[:0],
		uint64(q.Ptr), uint64(cache.K), uint64(cache.V),
		s.at(lv.indptr), s.at(lv.indices), s.at(lv.last), s.at(lv.work),
		o, lse, tmpO, tmpLSE,
		uint64(s.hq), uint64(g.NumKVHeads), uint64(D), uint64(g.PageSize), uint64(g.NumPages),
		uint64(g.StridePage()), uint64(g.StrideN()), uint64(g.StrideH()),
		uint64(qCode), uint64(oCode), f64Arg(qScale), f64Arg(s.ap.LogitsSoftCap),
		f64Arg(vScale), uint64(s.shape.tile), uint64(s.shape.unit), flag)
	if g.DType == layout.NVFP4 {
		a = append(a, uint64(cache.KSF), uint64(cache.VSF))
	}
	s.args = a
	sh := s.shape
	if err := s.b.launch(sh.kernel, Dim3{lv.items, g.NumKVHeads, sh.gz}, Dim3{32, sh.hpb, sh.nz}, sh.smem, a); err != nil {
		return err
	}
	if !partial {
		return nil
	}
	return s.mergePartial(lv, tmpO, tmpLSE, o, lse, sinks, oCode, vScale)
}

// launchScalars are the dtype codes of q and o and the factor of q·k
// (sm_scale * k_scale, times log2(e) unless a soft cap applies it after the
// cap) that the attention kernels take.
func (s *Step) launchScalars(qDT, oDT layout.DType) (qCode, oCode int64, qScale float64) {
	qCode, _ = dtypeCode(qDT)
	oCode, _ = dtypeCode(oDT)
	scale := s.ap.EffectiveSMScale(s.g.HeadDim)
	qScale = scale * math.Log2E
	if s.ap.LogitsSoftCap > 0 {
		qScale = scale // the cap is applied before the change of base
	}
	return qCode, oCode, qScale
}

// mergeState launches merge_state over n (row, head) states of d features.
func (b *Backend) mergeState(va, sa uint64, vaDT layout.DType, vb, sb uint64, vbDT layout.DType, v, s uint64, vDT layout.DType, n, d int64, args *[]uint64) error {
	if n == 0 {
		return nil
	}
	ca, _ := dtypeCode(vaDT)
	cb, _ := dtypeCode(vbDT)
	cv, _ := dtypeCode(vDT)
	a := append((*args)[:0], va, sa, vb, sb, v, s, uint64(n), uint64(d), uint64(ca), uint64(cb), uint64(cv))
	*args = a
	return b.launch("merge_state", Dim3{b.gridFor(int(n)), 1, 1}, Dim3{threadsFor(d), 1, 1}, 0, a)
}
