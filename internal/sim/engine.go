package sim

import (
	"fmt"
	"slices"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/appendkv"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/stepglue"
)

// engine is the simulated model runner: one paged K/V cache per layer and
// the buffers of a step. For each step it performs the plan's
// copy-on-write copies, synthesises the step's K/V/Q rows from the model,
// appends K/V with appendkv and computes attention with the backend
// (batch decode, batch prefill, or cascade when the plan has levels).
type engine struct {
	model   Model
	backend kernels.Backend
	// caches [layer of a group]: model layer l of group g (l % G == g, G
	// groups) lives in caches[l/G]; a dense model is one group.
	caches []kernels.PagedKVCache
	geom   layout.Paged

	appendPlan appendkv.Plan
	k, v, q, o kernels.Tensor // [nnz, Hkv|Hq, D]; Data reused across steps
	qc, oc     kernels.Tensor // cascade row order
	rows       []float32      // one token's rows, widest of K/V/Q
	ctx        []uint64       // [nnz] context hash of each row's token

	skipCopies bool // tests: leave out copy-on-write, which verification must notice
	// tests: leave out the state groups' copies (a runner that ignores the
	// copy list of a checkpoint restore), which verification must notice.
	skipStateCopies bool
	// skipOnloads, for tests: complete onload tier copies without their
	// bytes (a restore from the host tier then reads a stale page).
	skipOnloads bool

	stateOut []float32            // [nnz] the recurrent layer's outputs of the current layer
	xRow     [stateFloats]float32 // one token's recurrent input
	// tests: attend with window_left -1 over the append table, ignoring the
	// groups' windows and a chunked group's Attn arrays (a runner that
	// drops the per-group attention), which verification must notice.
	ignoreWindows bool

	sinks []float32 // the model's sink logits (nil: none), every attention's

	mla *mlaEngine // the MLA caches and indexer tensors (nil: no MLA group)

	dev     *deviceEngine // the device-resident path, for a *cuda.Backend
	devPlan cuda.StepPlan // the device step, reused
	calls   stepglue.CPU  // the step's backend calls on CPU memory, reused
}

// newEngine makes the engine of model m in ngroups layer groups (1 for a
// dense model; m.Layers is a multiple of it).
func newEngine(m Model, b kernels.Backend, kvLayout layout.KVLayout, numPages, pageSize, ngroups int) (*engine, error) {
	g := layout.Paged{Layout: kvLayout, Form: layout.Fused, DType: m.CacheDType(), NumPages: numPages,
		PageSize: pageSize, NumKVHeads: m.NumKVHeads, HeadDim: m.HeadDim}
	e := &engine{model: m, backend: b, geom: g, rows: make([]float32, m.NumQOHeads*m.HeadDim), sinks: m.SinkLogits()}
	for range m.Layers / ngroups {
		c, err := kernels.NewPagedKVCache(g)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		e.caches = append(e.caches, c)
	}
	if db, ok := b.(*cuda.Backend); ok {
		if g.DType != m.DType {
			return nil, fmt.Errorf("%w: kv dtype %v on the %s backend: its device path keeps the cache in the model dtype %v (use --backend cpu)", ErrBadConfig, g.DType, b.Name(), m.DType)
		}
		d, err := newDeviceEngine(db, g, m.Layers, m)
		if err != nil {
			return nil, err
		}
		e.dev = d
	}
	return e, nil
}

// cacheBytes is the size of the K/V caches of every cache tensor (every
// layer of a dense model; one group's layers of a hybrid one, whose groups
// share the tensors page by page).
func (e *engine) cacheBytes() int64 {
	return int64(len(e.caches)) * (e.geom.DataBytes() + e.geom.ScaleBytes())
}

// pageBytes is the K and V bytes (data and, for NVFP4, scales) of one page
// in one layer.
func (e *engine) pageBytes() int64 {
	return int64(e.geom.PageSize) * e.model.KVBytesPerToken()
}

// resize points t at the first n*heads*D elements of its buffer, growing it.
func resize(t *kernels.Tensor, dt layout.DType, n, heads, d int) {
	need := n * heads * d * dt.Size()
	if cap(t.Data) < need {
		t.Data = make([]byte, need, need+need/2)
	}
	t.DType, t.Data = dt, t.Data[:need]
	t.Shape = append(t.Shape[:0], n, heads, d)
}

// copyPages performs copy-on-write copies in every layer: entries
// [0, Entries) of page Src to page Dst, K and V, every head.
func (e *engine) copyPages(copies []pagedkv.CopyOp) {
	g := e.geom
	rowBytes := int64(g.RowBytes())
	sfBytes := int64(g.HeadDim / layout.NVFP4BlockSize) // NVFP4's scale bytes per row
	for _, c := range copies {
		for l := range e.caches {
			kb, vb := e.caches[l].KBuf(), e.caches[l].VBuf()
			ks, vs := e.caches[l].KSFBuf(), e.caches[l].VSFBuf()
			for h := range g.NumKVHeads {
				for n := range int(c.Entries) {
					srcK, dstK := g.KOffset(int(c.Src), n, h, 0), g.KOffset(int(c.Dst), n, h, 0)
					srcV, dstV := g.VOffset(int(c.Src), n, h, 0), g.VOffset(int(c.Dst), n, h, 0)
					copy(kb[g.DataOffset(dstK):][:rowBytes], kb[g.DataOffset(srcK):])
					copy(vb[g.DataOffset(dstV):][:rowBytes], vb[g.DataOffset(srcV):])
					if g.DType == layout.NVFP4 {
						copy(ks[g.ScaleOffset(dstK):][:sfBytes], ks[g.ScaleOffset(srcK):])
						copy(vs[g.ScaleOffset(dstV):][:sfBytes], vs[g.ScaleOffset(srcV):])
					}
				}
			}
		}
	}
}

// sample is one output checked against dense attention: query row row of
// group group's plan (request Requests[batch]), in model layer layer (one
// of the group's), query head head.
type sample struct {
	group, batch, row, layer, head int
}

// stepTimes accumulates where a step's time went.
type stepTimes struct {
	model, append, attention, verify time.Duration
}

// run executes a step's plan (one group's for a dense model): the
// pool-wide copies, then each group's plan over the group's layers.
// reqs[b] is the simulator's record of Requests[b]. Samples are verified
// against the dense model after the layer that computes them.
func (e *engine) run(hp *pagedkv.HybridPlan, reqs []*reqState, samples []sample, v *verifier, st *stepTimes, cs *cascadeStats) error {
	t0 := time.Now()
	if e.skipStateCopies {
		for g, plan := range hp.Groups {
			if v.specs[g].Kind != pagedkv.StateLayers {
				if err := e.copies(plan.Copies); err != nil {
					return err
				}
			}
		}
	} else if err := e.copies(hp.Copies); err != nil {
		return err
	}
	st.append += time.Since(t0)
	for g, plan := range hp.Groups {
		var err error
		switch v.specs[g].Kind {
		case pagedkv.StateLayers:
			err = e.runState(g, plan, reqs, samples, v, st)
		case pagedkv.MLAAttention:
			err = e.runMLA(g, plan, reqs, samples, v, st)
		case pagedkv.IndexerAttention:
			err = e.runIndexer(g, plan, hp.Groups[v.specs[g].Target], reqs, v, st)
		default:
			err = e.runGroup(g, plan, reqs, samples, v, st, cs)
		}
		if err != nil {
			if len(hp.Groups) == 1 {
				return err
			}
			return fmt.Errorf("group %d (%s): %w", g, groupString(v.specs[g]), err)
		}
	}
	return nil
}

// copies performs a step's copy-on-write copies in every cache tensor, on
// the device for the device path.
func (e *engine) copies(copies []pagedkv.CopyOp) error {
	switch {
	case e.skipCopies:
	case e.dev != nil:
		before := e.dev.b.Traffic()
		if err := e.dev.copyPages(copies); err != nil {
			return err
		}
		e.dev.traffic.Copies += e.dev.b.Traffic().Sub(before).DtoDBytes
	default:
		e.copyPages(copies)
		if e.mla != nil {
			e.mla.copyPages(copies)
		}
	}
	return nil
}

// rowContexts checks that the plan's rows are the simulator's tokens at
// their positions and sets e.ctx to their context hashes.
func (e *engine) rowContexts(plan *pagedkv.Plan, reqs []*reqState) error {
	nnz := len(plan.TokenIDs)
	e.ctx = slices.Grow(e.ctx[:0], nnz)[:nnz]
	for i := range nnz {
		r, pos := reqs[plan.BatchIndices[i]], int(plan.TokenPositions[i])
		if pos >= len(r.tokens) || r.tokens[pos] != plan.TokenIDs[i] {
			return fmt.Errorf("%w: plan row %d: request %s has token %d at position %d, the simulator has %v",
				ErrCheck, i, r.name(), plan.TokenIDs[i], pos, tokenAt(r.tokens, pos))
		}
		e.ctx[i] = r.ctx[pos]
	}
	return nil
}

// runGroup executes group g's plan (the copies done) over the group's
// layers; reqs[b] is the simulator's record of Plan.Requests[b]. Samples
// of the group are verified after the layer that computes them.
func (e *engine) runGroup(g int, plan *pagedkv.Plan, reqs []*reqState, samples []sample, v *verifier, st *stepTimes, cs *cascadeStats) error {
	t0 := time.Now()
	nnz := len(plan.TokenIDs)
	// The plan's rows must be the simulator's tokens at their positions.
	if err := e.rowContexts(plan, reqs); err != nil {
		return err
	}
	// appendkv derives batch_indices/positions from qo_indptr and
	// seq_lens on its own: they must equal the Manager's.
	if err := e.appendPlan.Build(plan.QOIndptr, plan.SeqLens); err != nil {
		return fmt.Errorf("%w: appendkv plan: %w", ErrCheck, err)
	}
	if !slices.Equal(e.appendPlan.BatchIndices, plan.BatchIndices) || !slices.Equal(e.appendPlan.Positions, plan.Positions) {
		return fmt.Errorf("%w: appendkv derives batch_indices %v positions %v from qo_indptr %v seq_lens %v; the plan has %v %v",
			ErrCheck, e.appendPlan.BatchIndices, e.appendPlan.Positions, plan.QOIndptr, plan.SeqLens, plan.BatchIndices, plan.Positions)
	}
	m := &e.model
	hq, hkv, d := m.NumQOHeads, m.NumKVHeads, m.HeadDim
	cpuPlan := plan
	if e.ignoreWindows {
		// Full attention everywhere: no window, no chunks, no level windows.
		p := *plan
		p.WindowLeft, p.CascadeWindowLeft = -1, nil
		p.AttnQOIndptr, p.AttnKVIndptr, p.AttnKVPageIndices, p.AttnKVLastPageLen, p.AttnRequests = nil, nil, nil, nil, nil
		cpuPlan = &p
	}
	if err := stepglue.CPUStep(&e.calls, cpuPlan, kernels.AttentionParams{NumQOHeads: hq, KScale: m.kvScale(), VScale: m.kvScale(), Sinks: e.sinks}); err != nil {
		return fmt.Errorf("%w: %w", ErrCheck, err)
	}
	table := e.calls.Table
	resize(&e.k, m.DType, nnz, hkv, d)
	resize(&e.v, m.DType, nnz, hkv, d)
	resize(&e.q, m.DType, nnz, hq, d)
	resize(&e.o, m.DType, nnz, hq, d)
	var rows []int32
	if plan.Cascade != nil {
		rows = plan.Cascade.QueryRows()
		resize(&e.qc, m.DType, nnz, hq, d)
		resize(&e.oc, m.DType, nnz, hq, d)
		cs.record(plan, e.pageBytes()*int64(len(e.caches)))
	}
	if e.dev != nil {
		if err := e.planDevice(plan); err != nil {
			return err
		}
	}
	st.append += time.Since(t0)

	kvRowBytes, qRowBytes := hkv*d*m.DType.Size(), hq*d*m.DType.Size()
	groups := m.Layers / len(e.caches)
	for j := range e.caches {
		l := j*groups + g // the model layer
		t := time.Now()
		for i, c := range e.ctx {
			m.K(e.rows[:hkv*d], c, l)
			layout.StoreRowF32(e.k.Data[i*kvRowBytes:], m.DType, e.rows[:hkv*d])
			m.V(e.rows[:hkv*d], c, l)
			layout.StoreRowF32(e.v.Data[i*kvRowBytes:], m.DType, e.rows[:hkv*d])
			m.Q(e.rows[:hq*d], c, l)
			layout.StoreRowF32(e.q.Data[i*qRowBytes:], m.DType, e.rows[:hq*d])
		}
		t1 := time.Now()
		st.model += t1.Sub(t)
		if e.dev != nil {
			if err := e.layerDevice(l, rows, qRowBytes); err != nil {
				return fmt.Errorf("layer %d: %w", l, err)
			}
			t3 := time.Now()
			st.attention += t3.Sub(t1)
			for _, s := range samples {
				if s.layer != l {
					continue
				}
				if err := e.dev.mirror(&e.caches[j], j, &table, s.batch); err != nil {
					return err
				}
				if err := v.check(e, plan, reqs, &table, s); err != nil {
					return err
				}
			}
			st.verify += time.Since(t3)
			continue
		}
		if err := e.calls.AppendKV(e.backend, e.caches[j], e.k, e.v); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		t2 := time.Now()
		st.append += t2.Sub(t1)
		q, o := e.q, e.o
		if plan.Cascade != nil {
			for r, src := range rows {
				copy(e.qc.Data[r*qRowBytes:(r+1)*qRowBytes], e.q.Data[int(src)*qRowBytes:])
			}
			q, o = e.qc, e.oc
		}
		err := e.calls.Attention(e.backend, e.caches[j], q, o)
		for r, dst := range rows {
			copy(e.o.Data[int(dst)*qRowBytes:(int(dst)+1)*qRowBytes], e.oc.Data[r*qRowBytes:])
		}
		if err != nil {
			return fmt.Errorf("layer %d attention: %w", l, err)
		}
		t3 := time.Now()
		st.attention += t3.Sub(t2)
		for _, s := range samples {
			if s.group != g || s.layer != l {
				continue
			}
			if err := v.check(e, plan, reqs, &table, s); err != nil {
				return err
			}
		}
		st.verify += time.Since(t3)
	}
	return nil
}

func tokenAt(tokens []int32, pos int) any {
	if pos < len(tokens) {
		return tokens[pos]
	}
	return fmt.Sprintf("only %d tokens", len(tokens))
}

// cascadeStats counts the steps that ran as cascades and the K/V reads
// their shared levels saved.
type cascadeStats struct {
	steps      int
	byLevels   map[int]int // levels -> steps
	savedPages int64       // page reads saved, per layer
	savedBytes int64       // K/V bytes not read, all layers
}

// record adds a cascade plan: a flat plan reads every request's pages
// (KVIndptr[B]); the cascade reads each level's groups' pages once.
func (c *cascadeStats) record(plan *pagedkv.Plan, bytesPerPageAllLayers int64) {
	if c.byLevels == nil {
		c.byLevels = map[int]int{}
	}
	flat := int64(plan.KVIndptr[len(plan.KVIndptr)-1])
	var read int64
	for _, lv := range plan.Cascade.Levels {
		read += int64(lv.KVIndptr[len(lv.KVIndptr)-1])
	}
	c.steps++
	c.byLevels[len(plan.Cascade.Levels)]++
	c.savedPages += flat - read
	c.savedBytes += (flat - read) * bytesPerPageAllLayers
}

// planDevice plans the step on the device: one upload of its index arrays
// (the append's rows and the attention's table, or the cascade's levels).
func (e *engine) planDevice(plan *pagedkv.Plan) error {
	m := &e.model
	if err := e.dev.tensors(m, len(plan.TokenIDs)); err != nil {
		return err
	}
	p := &e.devPlan
	if err := stepglue.Device(p, plan, e.geom, kernels.AttentionParams{NumQOHeads: m.NumQOHeads, Sinks: e.sinks}); err != nil {
		return fmt.Errorf("device step plan: %w", err)
	}
	before, start := e.dev.b.Traffic(), time.Now()
	if err := e.dev.plan(p); err != nil {
		return fmt.Errorf("device step plan: %w", err)
	}
	e.dev.traffic.PlanTime += time.Since(start)
	e.dev.traffic.Index += e.dev.b.Traffic().Sub(before).TransferBytes()
	return nil
}

// layerDevice runs one layer of the planned step on the device: upload the
// layer's K/V/Q rows (q in cascade row order for a cascade), append,
// attention, download o. Anything else crossing the boundary is counted as
// cache traffic.
func (e *engine) layerDevice(l int, rows []int32, qRowBytes int) error {
	d := e.dev
	nnz := e.q.Shape[0]
	k, v, q, o := rowsView(d.k, nnz), rowsView(d.v, nnz), rowsView(d.q, nnz), rowsView(d.o, nnz)
	t0 := d.b.Traffic()
	qCPU, oHost := e.q, e.o
	if rows != nil {
		for r, src := range rows {
			copy(e.qc.Data[r*qRowBytes:(r+1)*qRowBytes], e.q.Data[int(src)*qRowBytes:])
		}
		qCPU, oHost = e.qc, e.oc
	}
	for _, c := range []struct {
		dst cuda.DeviceTensor
		src kernels.Tensor
	}{{k, e.k}, {v, e.v}, {q, qCPU}} {
		if err := d.b.Upload(c.dst, c.src); err != nil {
			return err
		}
	}
	t1, start := d.b.Traffic(), time.Now()
	if err := d.step.Append(d.caches[l], k, v, 0, 0); err != nil {
		return err
	}
	if err := d.step.Attention(d.caches[l], q, o, cuda.DeviceTensor{}); err != nil {
		return err
	}
	d.traffic.LaunchTime += time.Since(start)
	t2 := d.b.Traffic()
	if err := d.b.Download(oHost, o); err != nil {
		return err
	}
	t3 := d.b.Traffic()
	if rows != nil {
		for r, dst := range rows {
			copy(e.o.Data[int(dst)*qRowBytes:(int(dst)+1)*qRowBytes], e.oc.Data[r*qRowBytes:])
		}
	}
	d.traffic.Activations += t1.Sub(t0).TransferBytes() + t3.Sub(t2).TransferBytes()
	d.traffic.Cache += t2.Sub(t1).TransferBytes()
	return nil
}
