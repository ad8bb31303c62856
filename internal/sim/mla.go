package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/mla"
	"github.com/pagedkv/pagedkv/tier"
)

// The simulator's MLA layers and DeepSeek sparse attention's indexer cache
// (the deepseek-v3.2-like preset).
//
// An MLA group's layer j keeps every token's compressed KV (ckv, mlaCKV
// features) and rope key (kpe, mlaKPE features) in mla.Cache j, fused
// ([pages, page_size, ckv+kpe], FlashInfer's paged_kv_mla layout), written
// by mla.AppendPlan (append_paged_mla_kv_cache) at the plan's pages. Its
// attention is MLA decode in absorbed form (mla.DecodePlan,
// BatchMLAPagedAttentionWrapper) run once per query row: row i of a request
// at position p is a decode over the request's first p+1 tokens (its first
// ceil((p+1)/page_size) pages, kv_len p+1), which is causal attention for
// prefill chunks and drafts alike. Sampled outputs are compared with
// float64 attention over the ckv/kpe rows rebuilt from the token ids, after
// the request's paged rows have been compared bit for bit.
//
// An indexer group's layer j is the lightning indexer of MLA layer j: each
// new token's indexer K (indexerHeadDim values of the model, quantised to
// fp8 e4m3 with one power-of-two float32 scale per indexerHeadDim/quant
// block, as vLLM's indexer_k_quant_and_cache with DeepSeek's ue8m0 scales)
// goes to the indexer page of the token's MLA page (layergroup.IndexerLayout:
// K token-major, then the scales). Every step then checks, per indexer
// layer, that the indexer plan's page arrays are its MLA plan's, and reads
// back every token of every request in the step through the MLA plan's page
// table: its bytes must equal the quantisation of that token's indexer K.
// So an indexer page that was not copied with its MLA page (copy-on-write,
// a host-tier round trip), or that belongs to another page, fails the run.
// The indexer's top-k selection is not simulated: the MLA attention is
// dense, which is what DeepSeek V3.2 computes while a sequence has at most
// index_topk tokens.

// The deepseek-v3.2-like preset's geometry, DeepSeek-V3.2's scaled down
// (docs/simulate.md).
const (
	mlaCKV  = 32 // kv_lora_rank 512 / 16
	mlaKPE  = 4  // qk_rope_head_dim 64 / 16
	mlaNope = 8  // qk_nope_head_dim 128 / 16: with mlaKPE, the softmax scale 1/sqrt(8+4)

	indexerHeadDim    = 16 // index_head_dim 128 / 8
	indexerQuantBlock = 16 // one scale per token, as DeepSeek's 128 of 128
)

// Row kinds of the MLA layers and the indexer (after model.go's).
const (
	kindCKV = kindSink + 1 + iota
	kindKPE
	kindQNope
	kindQPE
	kindIndexK
)

// mlaEngine is the engine's part for MLA and indexer groups.
type mlaEngine struct {
	caches []kernels.MLACache // [tensor j]: layer j of the MLA groups
	idx    [][]byte           // [tensor j]: layer j of the indexer groups, NumPages pages of lay.PageBytes()
	lay    layergroup.IndexerLayout
	smScal float64

	appendPlan          mla.AppendPlan
	decode              mla.DecodePlan
	ckv, kpe, qn, qp, o kernels.Tensor
	rowIndptr, rowPages []int32 // the per-row decode table
	rowLen              []int32
	vals                []float32 // one row of model values
	tok                 []byte    // one token's indexer bytes

	// tests: the engine leaves the indexer pages out of copy-on-write
	// copies, or out of host-tier round trips (SGLang #38031), which the
	// indexer read-back must notice.
	skipIndexerCopies, skipIndexerTier bool
}

// cacheBytes is the size of the MLA caches and indexer tensors.
func (e *mlaEngine) cacheBytes() int64 {
	var n int64
	for j := range e.caches {
		n += int64(len(e.caches[j].Data)) + int64(len(e.idx[j]))
	}
	return n
}

// hasMLA reports whether groups has an MLA group.
func hasMLA(groups []pagedkv.LayerGroup) bool {
	return slices.ContainsFunc(groups, func(g pagedkv.LayerGroup) bool { return g.Kind == pagedkv.MLAAttention })
}

// newMLAEngine allocates the MLA caches and indexer tensors of cfg's model
// (layers per group tensors of each).
func newMLAEngine(cfg *Config, tensors int) (*mlaEngine, error) {
	m := &cfg.Model
	e := &mlaEngine{lay: layergroup.IndexerLayout{PageSize: cfg.PageSize, HeadDim: indexerHeadDim, QuantBlock: indexerQuantBlock},
		smScal: mla.SMScale(mlaNope, mlaKPE), vals: make([]float32, m.NumQOHeads*mlaCKV)}
	e.tok = make([]byte, e.lay.TokenBytes())
	for range tensors {
		c, err := mla.NewCache(mla.Config{Form: layout.Fused, DType: m.DType, NumPages: cfg.NumPages, PageSize: cfg.PageSize,
			HeadDimCKV: mlaCKV, HeadDimKPE: mlaKPE})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		e.caches = append(e.caches, c)
		e.idx = append(e.idx, make([]byte, cfg.NumPages*e.lay.PageBytes()))
	}
	return e, nil
}

// validateMLAModel checks what the MLA path needs of the model.
func (c *Config) validateMLAModel() error {
	if c.Model.CacheDType() != c.Model.DType {
		return fmt.Errorf("%w: kv dtype %v with an MLA group: the simulator's MLA cache holds the model dtype %v", ErrBadConfig, c.Model.CacheDType(), c.Model.DType)
	}
	if c.Model.Sinks {
		return fmt.Errorf("%w: attention sinks with an MLA group: MLA decode takes none", ErrBadConfig)
	}
	for g, s := range c.Groups {
		if s.OwnsPages() && s.Kind != pagedkv.MLAAttention {
			// The host tier's page format is the MLA caches' and the
			// indexer's (mlaTierFormat): a page of another group would
			// travel without its K/V.
			return fmt.Errorf("%w: groups[%d] is %v beside an MLA group: the simulator runs models whose every page-owning group is MLA", ErrBadConfig, g, s.Kind)
		}
	}
	return nil
}

// indexerK writes the indexer bytes of the token with context hash ctx in
// indexer layer layer into tok (lay.TokenBytes(): fp8 K, then the scales).
func (e *mlaEngine) indexerK(tok []byte, m *Model, ctx uint64, layer int) {
	k := e.vals[:indexerHeadDim]
	m.fillDim(k, ctx, layer, kindIndexK, 1, indexerHeadDim, 0)
	qb := e.lay.QuantBlock
	for blk := range e.lay.ScalesPerToken() {
		block := k[blk*qb : (blk+1)*qb]
		var amax float32
		for _, x := range block {
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		// vLLM: scale = max(amax, 1e-4) / 448, rounded up to a power of
		// two with ue8m0 scales (DeepSeek V3.2's scale_fmt).
		scale := float32(math.Exp2(math.Ceil(math.Log2(float64(max(amax, 1e-4)) / 448))))
		for i, x := range block {
			tok[blk*qb+i] = layout.F32ToE4M3(x / scale)
		}
		binary.LittleEndian.PutUint32(tok[e.lay.HeadDim+4*blk:], math.Float32bits(scale))
	}
}

// indexerEntry returns entry's K and scale bytes of page p in tensor j.
func (e *mlaEngine) indexerEntry(j int, p, entry int) (k, scales []byte) {
	page := e.idx[j][p*e.lay.PageBytes() : (p+1)*e.lay.PageBytes()]
	ko, so := e.lay.KOffset(entry), e.lay.ScaleOffset(entry)
	return page[ko : ko+e.lay.HeadDim], page[so : so+4*e.lay.ScalesPerToken()]
}

// copyPages performs copy-on-write copies in every MLA cache and indexer
// tensor: entries [0, Entries) of page Src to page Dst.
func (e *mlaEngine) copyPages(copies []pagedkv.CopyOp) {
	for _, c := range copies {
		for j := range e.caches {
			ckv, kpe := mla.CKV(&e.caches[j]), mla.KPE(&e.caches[j])
			for n := range int(c.Entries) {
				copy(ckv.Row(int(c.Dst), n), ckv.Row(int(c.Src), n))
				copy(kpe.Row(int(c.Dst), n), kpe.Row(int(c.Src), n))
				if !e.skipIndexerCopies {
					dk, ds := e.indexerEntry(j, int(c.Dst), n)
					sk, ss := e.indexerEntry(j, int(c.Src), n)
					copy(dk, sk)
					copy(ds, ss)
				}
			}
		}
	}
}

// mlaPage returns page p of MLA cache j (fused: the page's rows are
// contiguous) and of indexer tensor j.
func (e *mlaEngine) mlaPage(j, p int) (kv, idx []byte) {
	c := &e.caches[j]
	n := int64(c.Geometry.PageSize) * (int64(mlaCKV + mlaKPE)) * int64(c.Geometry.DType.Size())
	return c.Data[int64(p)*n : int64(p+1)*n], e.idx[j][p*e.lay.PageBytes() : (p+1)*e.lay.PageBytes()]
}

// mlaTierFormat is the page format of a model with MLA groups in the host
// tier: each tensor's fused MLA page (page_size x (ckv + kpe) elements)
// described as the two planes of one kv head of (ckv + kpe)/2 dims, then
// each indexer layer's page (docs/indexer-shared-kv.md: the indexer travels
// in the page).
func mlaTierFormat(cfg *Config) tier.PageFormat {
	tensors := cfg.Model.Layers / len(cfg.Groups)
	lay := layergroup.IndexerLayout{PageSize: cfg.PageSize, HeadDim: indexerHeadDim, QuantBlock: indexerQuantBlock}
	return tier.PageFormat{Layout: layout.NHD, DType: cfg.Model.DType, PageSize: cfg.PageSize, NumKVHeads: 1,
		HeadDim: (mlaCKV + mlaKPE) / 2, Layers: tensors, IndexerLayers: tensors, IndexerTokenBytes: lay.TokenBytes()}
}

// tierPage copies page p of every MLA cache and indexer tensor into buf (a
// page in format f), or from buf when toDevice. With skipIndexerTier the
// indexer pages stay behind.
func (e *mlaEngine) tierPage(f tier.PageFormat, buf []byte, p int, toDevice bool) {
	for j := range e.caches {
		kv, idx := e.mlaPage(j, p)
		hk := buf[f.LayerOffset(j):][:len(kv)]
		hi := buf[f.IndexerOffset(j):][:len(idx)]
		if toDevice {
			copy(kv, hk)
			if !e.skipIndexerTier {
				copy(idx, hi)
			}
			continue
		}
		copy(hk, kv)
		if !e.skipIndexerTier {
			copy(hi, idx)
		}
	}
}

// runMLA executes MLA group g's plan over the group's layers: append each
// row's ckv/kpe, MLA decode per query row, verify the group's samples.
func (e *engine) runMLA(g int, plan *pagedkv.Plan, reqs []*reqState, samples []sample, v *verifier, st *stepTimes) error {
	t0 := time.Now()
	me := e.mla
	if err := e.rowContexts(plan, reqs); err != nil {
		return err
	}
	if err := me.appendPlan.Build(plan.QOIndptr, plan.SeqLens); err != nil {
		return fmt.Errorf("%w: mla append plan: %w", ErrCheck, err)
	}
	if !slices.Equal(me.appendPlan.BatchIndices, plan.BatchIndices) || !slices.Equal(me.appendPlan.Positions, plan.Positions) {
		return fmt.Errorf("%w: mla append derives batch_indices %v positions %v from qo_indptr %v seq_lens %v; the plan has %v %v",
			ErrCheck, me.appendPlan.BatchIndices, me.appendPlan.Positions, plan.QOIndptr, plan.SeqLens, plan.BatchIndices, plan.Positions)
	}
	// One decode per query row over the tokens up to and including it.
	nnz := len(e.ctx)
	P := int32(e.geom.PageSize)
	me.rowIndptr = append(me.rowIndptr[:0], 0)
	me.rowPages, me.rowLen = me.rowPages[:0], me.rowLen[:0]
	for i := range nnz {
		b, pos := plan.BatchIndices[i], plan.Positions[i]
		lo := plan.KVIndptr[b]
		me.rowPages = append(me.rowPages, plan.KVPageIndices[lo:lo+(pos+P)/P]...)
		me.rowIndptr = append(me.rowIndptr, int32(len(me.rowPages)))
		me.rowLen = append(me.rowLen, pos+1)
	}
	m := &e.model
	H := m.NumQOHeads
	if err := me.decode.Plan(me.rowIndptr, me.rowPages, me.rowLen, H, me.smScal); err != nil {
		return fmt.Errorf("%w: mla decode plan: %w", ErrCheck, err)
	}
	resize(&me.ckv, m.DType, nnz, 1, mlaCKV)
	resize(&me.kpe, m.DType, nnz, 1, mlaKPE)
	me.ckv.Shape, me.kpe.Shape = append(me.ckv.Shape[:0], nnz, mlaCKV), append(me.kpe.Shape[:0], nnz, mlaKPE) // [nnz, dim]
	resize(&me.qn, m.DType, nnz, H, mlaCKV)
	resize(&me.qp, m.DType, nnz, H, mlaKPE)
	resize(&me.o, m.DType, nnz, H, mlaCKV)
	st.append += time.Since(t0)
	es := m.DType.Size()
	groups := m.Layers / len(e.caches)
	for j := range me.caches {
		l := j*groups + g
		t := time.Now()
		for i, c := range e.ctx {
			m.fillDim(me.vals[:mlaCKV], c, l, kindCKV, 1, mlaCKV, 0)
			layout.StoreRowF32(me.ckv.Data[i*mlaCKV*es:], m.DType, me.vals[:mlaCKV])
			m.fillDim(me.vals[:mlaKPE], c, l, kindKPE, 1, mlaKPE, 0)
			layout.StoreRowF32(me.kpe.Data[i*mlaKPE*es:], m.DType, me.vals[:mlaKPE])
			m.fillDim(me.vals[:H*mlaCKV], c, l, kindQNope, H, mlaCKV, 2)
			layout.StoreRowF32(me.qn.Data[i*H*mlaCKV*es:], m.DType, me.vals[:H*mlaCKV])
			m.fillDim(me.vals[:H*mlaKPE], c, l, kindQPE, H, mlaKPE, 2)
			layout.StoreRowF32(me.qp.Data[i*H*mlaKPE*es:], m.DType, me.vals[:H*mlaKPE])
		}
		t1 := time.Now()
		st.model += t1.Sub(t)
		err := me.appendPlan.Run(e.backend, mla.AppendInput{AppendCKV: me.ckv, AppendKPE: me.kpe, Cache: &me.caches[j],
			KVIndptr: plan.KVIndptr, KVPageIndices: plan.KVPageIndices, KVLastPageLen: plan.KVLastPageLen})
		if err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		t2 := time.Now()
		st.append += t2.Sub(t1)
		if err := me.decode.Run(e.backend, mla.DecodeInput{QNope: me.qn, QPE: me.qp, Cache: &me.caches[j], O: me.o}); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		t3 := time.Now()
		st.attention += t3.Sub(t2)
		for _, s := range samples {
			if s.group != g || s.layer != l {
				continue
			}
			if err := v.checkMLA(e, j, plan, reqs, s); err != nil {
				return err
			}
		}
		st.verify += time.Since(t3)
	}
	return nil
}

// runIndexer executes indexer group g's step: its plan must carry its MLA
// group's page arrays (target, the MLA group's plan); each new row's
// indexer K is written to the row's page and slot; then every token of
// every request of the step is read back through the MLA plan's page table
// and compared with what was written for it.
func (e *engine) runIndexer(g int, plan, target *pagedkv.Plan, reqs []*reqState, v *verifier, st *stepTimes) error {
	t0 := time.Now()
	me := e.mla
	switch {
	case plan.Indexer == nil || *plan.Indexer != me.lay:
		return fmt.Errorf("%w: indexer plan layout %v, want %+v", ErrCheck, plan.Indexer, me.lay)
	case !slices.Equal(plan.KVIndptr, target.KVIndptr) || !slices.Equal(plan.KVPageIndices, target.KVPageIndices) ||
		!slices.Equal(plan.KVLastPageLen, target.KVLastPageLen) || !slices.Equal(plan.SeqLens, target.SeqLens) ||
		!slices.Equal(plan.QOIndptr, target.QOIndptr) || !slices.Equal(plan.Positions, target.Positions):
		return fmt.Errorf("%w: the indexer plan's pages %v (indptr %v) are not its MLA group's %v (indptr %v)",
			ErrCheck, plan.KVPageIndices, plan.KVIndptr, target.KVPageIndices, target.KVIndptr)
	}
	if err := e.rowContexts(plan, reqs); err != nil {
		return err
	}
	m := &e.model
	P := e.geom.PageSize
	groups := m.Layers / len(e.caches)
	st.append += time.Since(t0)
	for j := range me.idx {
		l := j*groups + g
		t := time.Now()
		for i, c := range e.ctx {
			b, pos := int(plan.BatchIndices[i]), int(plan.Positions[i])
			k, sc := me.indexerEntry(j, int(plan.KVPageIndices[int(plan.KVIndptr[b])+pos/P]), pos%P)
			me.indexerK(me.tok, m, c, l)
			copy(k, me.tok)
			copy(sc, me.tok[me.lay.HeadDim:])
		}
		t1 := time.Now()
		st.append += t1.Sub(t)
		// Read back every token of the step's requests through the MLA
		// group's pages.
		for b := range target.SeqLens {
			r := reqs[b]
			for pos := range int(target.SeqLens[b]) {
				page := int(target.KVPageIndices[int(target.KVIndptr[b])+pos/P])
				k, sc := me.indexerEntry(j, page, pos%P)
				me.indexerK(me.tok, m, r.ctx[pos], l)
				if !bytes.Equal(k, me.tok[:me.lay.HeadDim]) || !bytes.Equal(sc, me.tok[me.lay.HeadDim:]) {
					return fmt.Errorf("%w at step %d: request %s, indexer layer %d: the indexer entry of position %d (MLA page %d, slot %d) holds K %x scales %x, the token's indexer K is %x scales %x%s",
						ErrVerify, v.step, r.name(), l, pos, page, pos%P, k, sc, me.tok[:me.lay.HeadDim], me.tok[me.lay.HeadDim:], hitTag(r))
				}
				v.indexerTokens++
				if pos < r.hit {
					v.indexerHitTokens++
				}
			}
		}
		st.verify += time.Since(t1)
	}
	return nil
}

// hitTag says in a message that r was admitted on a prefix hit.
func hitTag(r *reqState) string {
	if r.hit > 0 {
		return fmt.Sprintf(" (admitted on a prefix hit of %d tokens)", r.hit)
	}
	return ""
}

// checkMLA verifies sample s of MLA group s.group, computed in cache j:
// every ckv/kpe row the request holds bit for bit, then the output of
// query row s.row, head s.head, against float64 attention over the rows
// rebuilt from the request's tokens.
func (v *verifier) checkMLA(e *engine, j int, plan *pagedkv.Plan, reqs []*reqState, s sample) error {
	m := v.model
	me := e.mla
	r := reqs[s.batch]
	pos := int(plan.TokenPositions[s.row])
	v.ctx = m.Contexts(v.ctx[:0], r.ns, r.tokens[:pos+1])
	ckv, kpe := mla.CKV(&me.caches[j]), mla.KPE(&me.caches[j])
	P := e.geom.PageSize
	es := m.DType.Size()
	keys, vals := make([][]float64, pos+1), make([][]float64, pos+1)
	row := make([]float32, mlaCKV+mlaKPE)
	want := make([]byte, (mlaCKV+mlaKPE)*es)
	for t := 0; t <= pos; t++ {
		m.fillDim(row[:mlaCKV], v.ctx[t], s.layer, kindCKV, 1, mlaCKV, 0)
		m.fillDim(row[mlaCKV:], v.ctx[t], s.layer, kindKPE, 1, mlaKPE, 0)
		page := int(plan.KVPageIndices[int(plan.KVIndptr[s.batch])+t/P])
		layout.StoreRowF32(want, m.DType, row[:mlaCKV])
		layout.StoreRowF32(want[mlaCKV*es:], m.DType, row[mlaCKV:])
		if !bytes.Equal(ckv.Row(page, t%P), want[:mlaCKV*es]) || !bytes.Equal(kpe.Row(page, t%P), want[mlaCKV*es:]) {
			return fmt.Errorf("%w at step %d: request %s, layer %d%s: the paged ckv/kpe of position %d (page %d, slot %d) are not the token's%s",
				ErrVerify, v.step, r.name(), s.layer, v.groupTag(s.group), t, page, t%P, hitTag(r))
		}
		v.kvTokens++
		keys[t], vals[t] = make([]float64, mlaCKV+mlaKPE), make([]float64, mlaCKV)
		for f, x := range row {
			keys[t][f] = float64(x)
		}
		copy(vals[t], keys[t][:mlaCKV])
	}
	H := m.NumQOHeads
	qn, qp := make([]float32, H*mlaCKV), make([]float32, H*mlaKPE)
	m.fillDim(qn, v.ctx[pos], s.layer, kindQNope, H, mlaCKV, 2)
	m.fillDim(qp, v.ctx[pos], s.layer, kindQPE, H, mlaKPE, 2)
	q := make([]float64, 0, mlaCKV+mlaKPE)
	for _, x := range qn[s.head*mlaCKV : (s.head+1)*mlaCKV] {
		q = append(q, float64(x))
	}
	for _, x := range qp[s.head*mlaKPE : (s.head+1)*mlaKPE] {
		q = append(q, float64(x))
	}
	visible := make([]bool, pos+1)
	for i := range visible {
		visible[i] = true
	}
	wantO, _ := reference.Attend(q, keys, vals, visible, me.smScal, 0, mlaCKV)
	got := make([]float32, mlaCKV)
	layout.LoadRowF32(got, m.DType, me.o.Data[(s.row*H+s.head)*mlaCKV*es:])
	if at, worst := v.compare(got, wantO); at >= 0 {
		return fmt.Errorf("%w at step %d: request %s, layer %d%s, head %d, query at position %d over %d keys: feature %d is %.6g, dense float64 MLA gives %.6g (|diff| %.3g > %.3g + %.3g*|want|)%s",
			ErrVerify, v.step, r.name(), s.layer, v.groupTag(s.group), s.head, pos, pos+1, at, got[at], wantO[at], worst, v.atol, v.rtol, hitTag(r))
	}
	v.outputs++
	v.groupOutputs[s.group]++
	v.mlaOutputs++
	if r.hit > 0 {
		v.hitOutputs++
	}
	if s.row >= int(plan.QOIndptr[s.batch+1]-plan.Drafts[s.batch]) {
		v.drafts++
	}
	return nil
}
