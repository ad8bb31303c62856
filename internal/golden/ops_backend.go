package golden

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ragged"
)

// Operations that run on a kernels.Backend. Every float output is requested
// as F32 (the cases' expected dtype), so the comparison sees the backend's
// own precision, not a rounding to the input dtype.

var attentionParams = []string{"kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "window_left", "logits_soft_cap"}

func init() {
	register("append_paged_kv_cache", &opSpec{
		inputs:  []string{"append_key", "append_value", "batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len", "paged_kv_cache"},
		outputs: []string{"paged_kv_cache"},
		params:  []string{"kv_layout", "page_size"},
		exact:   []string{"paged_kv_cache"},
		backend: true,
		run:     runAppend,
	})
	register("append_paged_mla_kv_cache", &opSpec{
		inputs:  []string{"append_ckv", "append_kpe", "batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len", "ckv_cache", "kpe_cache"},
		outputs: []string{"ckv_cache", "kpe_cache"},
		params:  []string{"page_size"},
		exact:   []string{"ckv_cache", "kpe_cache"},
		backend: true,
		run:     runMLAAppend,
	})
	register("batch_decode", &opSpec{
		inputs:   []string{"q", "paged_kv_cache", "kv_indptr", "kv_indices", "kv_last_page_len"},
		optional: []string{"sinks"},
		outputs:  []string{"o", "lse"},
		params:   attentionParams,
		backend:  true,
		run:      runDecode,
	})
	// FlashInfer's trtllm_batch_decode_with_kv_cache (trtllm-gen, XQA): the
	// padded contract, block_tables [B, max_pages] and seq_lens [B]. One
	// query row per request; no LSE; no soft cap. kv_layout is required
	// (FlashInfer's default for this call is HND, the format's NHD).
	register("trtllm_batch_decode", &opSpec{
		inputs:  []string{"q", "paged_kv_cache", "block_tables", "seq_lens"},
		outputs: []string{"o"},
		params:  []string{"kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "window_left", "max_seq_len"},
		backend: true,
		run:     runTRTLLMDecode,
	})
	register("batch_prefill_paged", &opSpec{
		inputs:   []string{"q", "qo_indptr", "paged_kv_cache", "kv_indptr", "kv_indices", "kv_last_page_len"},
		optional: []string{"sinks"},
		outputs:  []string{"o", "lse"},
		params:   append(append([]string{}, attentionParams...), "causal"),
		backend:  true,
		run:      runPrefill,
	})
	register("merge_state", &opSpec{
		inputs:  []string{"v_a", "s_a", "v_b", "s_b"},
		outputs: []string{"v", "s"},
		backend: true,
		run:     runMergeState,
	})
	register("merge_states", &opSpec{
		inputs:  []string{"v", "s"},
		outputs: []string{"v", "s"},
		backend: true,
		run:     runMergeStates,
	})
	register("mla_decode", &opSpec{
		inputs:  []string{"q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indptr", "kv_indices", "kv_len"},
		outputs: []string{"o", "lse"},
		params:  []string{"page_size", "num_heads", "head_dim_ckv", "head_dim_kpe", "sm_scale"},
		backend: true,
		run:     runMLADecode,
	})
}

// pagedCache copies in.paged_kv_cache (5-D, K at [:,0], V at [:,1]) into a
// fused host cache, checking its shape against kv_layout and page_size.
func (x *exec) pagedCache(name string) (kernels.PagedKVCache, error) {
	t := x.tensor(name)
	dt, ok := layoutDType(t.DType)
	if !ok || !dt.IsFloat() || len(t.Shape) != 5 || t.Shape[1] != 2 {
		return kernels.PagedKVCache{}, badTensor(t, "want a 5-D floating-point paged cache [pages, 2, ...]")
	}
	g, err := x.fusedGeometry(t, dt, t.Shape[4])
	if err != nil {
		return kernels.PagedKVCache{}, err
	}
	return kernels.PagedKVCache{Geometry: g, Data: append([]byte(nil), t.Data...)}, nil
}

// fusedGeometry is the geometry of the 5-D cache tensor t ([pages, 2, N, H,
// x] for NHD, [pages, 2, H, N, x] for HND, x holding headDim elements of
// dt), checked against the kv_layout and page_size parameters.
func (x *exec) fusedGeometry(t safetensors.Tensor, dt layout.DType, headDim int) (layout.Paged, error) {
	kvl, err := x.p.kvLayout()
	if err != nil {
		return layout.Paged{}, err
	}
	pageSize, err := x.p.intReq("page_size")
	if err != nil {
		return layout.Paged{}, err
	}
	g := layout.Paged{Layout: kvl, Form: layout.Fused, DType: dt, NumPages: t.Shape[0], PageSize: t.Shape[2], NumKVHeads: t.Shape[3], HeadDim: headDim}
	entryDim := 2
	if kvl == layout.HND {
		g.PageSize, g.NumKVHeads = t.Shape[3], t.Shape[2]
		entryDim = 3
	}
	return g, x.wantDim("page_size", pageSize, t, entryDim)
}

// mlaCache copies in.ckv_cache [pages, page_size, head_dim_ckv] and
// in.kpe_cache [pages, page_size, head_dim_kpe] into a split MLA host cache,
// checking that the two agree in dtype, page count and page size.
func (x *exec) mlaCache() (kernels.MLACache, error) {
	ckv, kpe := x.tensor("in.ckv_cache"), x.tensor("in.kpe_cache")
	dt, ok := layoutDType(ckv.DType)
	switch {
	case !ok || !dt.IsFloat() || len(ckv.Shape) != 3:
		return kernels.MLACache{}, badTensor(ckv, "want a 3-D floating-point cache [pages, page_size, head_dim_ckv]")
	case kpe.DType != ckv.DType || len(kpe.Shape) != 3 || kpe.Shape[0] != ckv.Shape[0] || kpe.Shape[1] != ckv.Shape[1]:
		return kernels.MLACache{}, badTensor(kpe, "want %v [%d, %d, head_dim_kpe] like %s", ckv.DType, ckv.Shape[0], ckv.Shape[1], ckv.Name)
	}
	return kernels.MLACache{
		Geometry: layout.MLA{Form: layout.Split, DType: dt, NumPages: ckv.Shape[0], PageSize: ckv.Shape[1], HeadDimCKV: ckv.Shape[2], HeadDimKPE: kpe.Shape[2]},
		CKV:      append([]byte(nil), ckv.Data...),
		KPE:      append([]byte(nil), kpe.Data...),
	}, nil
}

// appendTargets reads where an append writes: batch_indices and positions
// (one entry per appended token) and the page table they address.
func (x *exec) appendTargets() (batchIndices, positions []int32, table kernels.PageTable, err error) {
	if batchIndices, err = x.indices("in.batch_indices"); err != nil {
		return
	}
	if positions, err = x.indices("in.positions"); err != nil {
		return
	}
	table, err = x.pageTable("")
	return
}

// pageTable reads kv_indptr, kv_indices, kv_last_page_len (with an optional
// per-level suffix such as ".1").
func (x *exec) pageTable(suffix string) (kernels.PageTable, error) {
	var t kernels.PageTable
	var err error
	if t.KVIndptr, err = x.indices("in.kv_indptr" + suffix); err != nil {
		return t, err
	}
	if t.KVPageIndices, err = x.indices("in.kv_indices" + suffix); err != nil {
		return t, err
	}
	t.KVLastPageLen, err = x.indices("in.kv_last_page_len" + suffix)
	return t, err
}

func runAppend(x *exec) (map[string]safetensors.Tensor, error) {
	cache, err := x.pagedCache("in.paged_kv_cache")
	if err != nil {
		return nil, err
	}
	p := kernels.AppendParams{Cache: cache}
	if err := x.runAppendRows(&p); err != nil {
		return nil, err
	}
	in := x.tensor("in.paged_kv_cache")
	return map[string]safetensors.Tensor{
		"paged_kv_cache": {Name: "paged_kv_cache", DType: in.DType, Shape: in.Shape, Data: p.Cache.Data},
	}, nil
}

// runAppendRows reads append_key, append_value and the append targets into
// p (whose cache and scales are set) and runs the backend's append.
func (x *exec) runAppendRows(p *kernels.AppendParams) (err error) {
	if p.AppendKey, err = x.host("in.append_key", 3); err != nil {
		return err
	}
	if p.AppendValue, err = x.host("in.append_value", 3); err != nil {
		return err
	}
	if p.BatchIndices, p.Positions, p.Table, err = x.appendTargets(); err != nil {
		return err
	}
	return x.b.AppendPagedKVCache(p)
}

func runMLAAppend(x *exec) (map[string]safetensors.Tensor, error) {
	cache, err := x.mlaCache()
	if err != nil {
		return nil, err
	}
	ckv, kpe := x.tensor("in.ckv_cache"), x.tensor("in.kpe_cache")
	pageSize, err := x.p.intReq("page_size")
	if err != nil {
		return nil, err
	}
	if err := x.wantDim("page_size", pageSize, ckv, 1); err != nil {
		return nil, err
	}
	p := kernels.MLAAppendParams{Cache: cache}
	if p.AppendCKV, err = x.host("in.append_ckv", 2); err != nil {
		return nil, err
	}
	if p.AppendKPE, err = x.host("in.append_kpe", 2); err != nil {
		return nil, err
	}
	var table kernels.PageTable
	if p.BatchIndices, p.Positions, table, err = x.appendTargets(); err != nil {
		return nil, err
	}
	p.KVIndptr, p.KVPageIndices, p.KVLastPageLen = table.KVIndptr, table.KVPageIndices, table.KVLastPageLen
	if err := x.b.AppendPagedMLAKVCache(&p); err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{
		"ckv_cache": {Name: "ckv_cache", DType: ckv.DType, Shape: ckv.Shape, Data: p.Cache.CKV},
		"kpe_cache": {Name: "kpe_cache", DType: kpe.DType, Shape: kpe.Shape, Data: p.Cache.KPE},
	}, nil
}

// attention reads q, the cache and the scalar parameters shared by decode,
// prefill and cascade, checking the head counts and head_dim parameters
// against the tensors.
func (x *exec) attention() (q kernels.Tensor, cache kernels.PagedKVCache, a kernels.AttentionParams, err error) {
	if q, err = x.host("in.q", 3); err != nil {
		return
	}
	nvfp4 := x.c.Op == "batch_decode_nvfp4"
	if nvfp4 {
		cache, err = x.nvfp4Cache()
	} else {
		cache, err = x.pagedCache("in.paged_kv_cache")
	}
	if err != nil {
		return
	}
	qt, ct := x.tensor("in.q"), x.tensor("in.paged_kv_cache")
	hq, err := x.p.intReq("num_qo_heads")
	if err != nil {
		return
	}
	if err = x.wantDim("num_qo_heads", hq, qt, 1); err != nil {
		return
	}
	hkv, err := x.p.intReq("num_kv_heads")
	if err != nil {
		return
	}
	if hkv != cache.Geometry.NumKVHeads {
		err = fmt.Errorf("%w: parameter num_kv_heads = %d but %s %v has %d kv heads", ErrBadCase, hkv, ct.Name, ct.Shape, cache.Geometry.NumKVHeads)
		return
	}
	d, err := x.p.intReq("head_dim")
	if err != nil {
		return
	}
	if err = x.wantDim("head_dim", d, qt, 2); err != nil {
		return
	}
	if d != cache.Geometry.HeadDim {
		err = fmt.Errorf("%w: parameter head_dim = %d but %s %v holds head_dim %d", ErrBadCase, d, ct.Name, ct.Shape, cache.Geometry.HeadDim)
		return
	}
	a.NumQOHeads = hq
	if nvfp4 {
		if a.KScale, a.VScale, err = x.globalScales(); err != nil {
			return
		}
	}
	if a.SMScale, err = x.p.floatOr("sm_scale", 0); err != nil { // absent: 1/sqrt(head_dim)
		return
	}
	if _, ok := x.p.meta["sm_scale"]; ok && a.SMScale == 0 {
		// The kernels read 0 as the default; FlashInfer would scale every
		// logit by 0. A case meaning the default omits the key.
		err = x.p.bad("sm_scale", x.p.meta["sm_scale"], "want > 0 (omit it for 1/sqrt(head_dim))")
		return
	}
	if a.WindowLeft, err = x.p.intOr("window_left", -1); err != nil {
		return
	}
	if a.LogitsSoftCap, err = x.p.floatOr("logits_soft_cap", 0); err != nil {
		return
	}
	a.Sinks, err = x.sinks(hq)
	return
}

// sinks reads the optional in.sinks: FlashInfer's float32 [num_qo_heads]
// (nil when the case has none). The kernels' validation checks the values.
func (x *exec) sinks(hq int) ([]float32, error) {
	t, ok := x.c.Tensor("in.sinks")
	if !ok {
		return nil, nil
	}
	if t.DType != safetensors.F32 || len(t.Shape) != 1 || t.Shape[0] != hq {
		return nil, badTensor(t, "want F32 [num_qo_heads = %d]", hq)
	}
	s := make([]float32, hq)
	for i := range s {
		s[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return s, nil
}

func runDecode(x *exec) (map[string]safetensors.Tensor, error) {
	q, cache, a, err := x.attention()
	if err != nil {
		return nil, err
	}
	table, err := x.pageTable("")
	if err != nil {
		return nil, err
	}
	b, hq, d := q.Shape[0], q.Shape[1], q.Shape[2]
	p := kernels.DecodeParams{Q: q, Cache: cache, Table: table, AttentionParams: a,
		O: kernels.NewTensor(layout.F32, b, hq, d), LSE: make([]float32, b*hq)}
	if err := x.b.BatchDecode(&p); err != nil {
		return nil, err
	}
	return stateOutputs("o", p.O, "lse", p.LSE), nil
}

// runTRTLLMDecode runs a padded-table decode as an engine holding only
// block_tables and seq_lens would on a CSR backend: request b's keys are
// the first seq_lens[b] slots of the pages block_tables[b,
// :ceil(seq_lens[b]/page_size)] (ragged.BlockTables.ToPagedKV); the
// padding past them is never read but must name pages of the cache.
func runTRTLLMDecode(x *exec) (map[string]safetensors.Tensor, error) {
	if _, ok := x.p.meta["kv_layout"]; !ok {
		return nil, x.p.bad("kv_layout", "", `required for trtllm_batch_decode ("HND" is FlashInfer's default for it, "NHD" the format's)`)
	}
	q, cache, a, err := x.attention()
	if err != nil {
		return nil, err
	}
	maxSeqLen, err := x.p.intReq("max_seq_len")
	if err != nil {
		return nil, err
	}
	bt := x.tensor("in.block_tables")
	b := q.Shape[0]
	if bt.DType != safetensors.I32 || len(bt.Shape) != 2 || bt.Shape[0] != b || bt.Shape[1] < 1 {
		return nil, badTensor(bt, "want I32 [%d, max_pages >= 1] (one row per query)", b)
	}
	data, err := bt.Int32s()
	if err != nil {
		return nil, err
	}
	for i, id := range data {
		if id < 0 || int(id) >= cache.Geometry.NumPages {
			return nil, badTensor(bt, "entry [%d, %d] = %d is not a page of the %d-page cache (padding too: a kernel may fetch it)",
				i/bt.Shape[1], i%bt.Shape[1], id, cache.Geometry.NumPages)
		}
	}
	seqLens, err := x.indices("in.seq_lens")
	if err != nil {
		return nil, err
	}
	if len(seqLens) != b {
		return nil, badTensor(x.tensor("in.seq_lens"), "want %d entries, one per query", b)
	}
	for i, n := range seqLens {
		if n < 1 || int(n) > maxSeqLen {
			return nil, badTensor(x.tensor("in.seq_lens"), "seq_lens[%d] = %d, want 1..max_seq_len = %d", i, n, maxSeqLen)
		}
	}
	indptr, indices, last, err := ragged.BlockTables{Rows: b, Cols: bt.Shape[1], Data: data}.ToPagedKV(seqLens, cache.Geometry.PageSize)
	if err != nil {
		return nil, fmt.Errorf("%w: block_tables and seq_lens: %w", ErrBadCase, err)
	}
	hq, d := q.Shape[1], q.Shape[2]
	p := kernels.DecodeParams{Q: q, Cache: cache, Table: kernels.PageTable{KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last},
		AttentionParams: a, O: kernels.NewTensor(layout.F32, b, hq, d)}
	if err := x.b.BatchDecode(&p); err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{"o": outTensor("o", p.O)}, nil
}

func runPrefill(x *exec) (map[string]safetensors.Tensor, error) {
	q, cache, a, err := x.attention()
	if err != nil {
		return nil, err
	}
	table, err := x.pageTable("")
	if err != nil {
		return nil, err
	}
	qoIndptr, err := x.indices("in.qo_indptr")
	if err != nil {
		return nil, err
	}
	causal, err := x.p.boolOr("causal", false)
	if err != nil {
		return nil, err
	}
	n, hq, d := q.Shape[0], q.Shape[1], q.Shape[2]
	p := kernels.PrefillParams{Q: q, QOIndptr: qoIndptr, Cache: cache, Table: table, Causal: causal, AttentionParams: a,
		O: kernels.NewTensor(layout.F32, n, hq, d), LSE: make([]float32, n*hq)}
	if err := x.b.BatchPrefill(&p); err != nil {
		return nil, err
	}
	return stateOutputs("o", p.O, "lse", p.LSE), nil
}

func runMergeState(x *exec) (map[string]safetensors.Tensor, error) {
	va, err := x.host("in.v_a", 3)
	if err != nil {
		return nil, err
	}
	vb, err := x.host("in.v_b", 3)
	if err != nil {
		return nil, err
	}
	n, h, d := va.Shape[0], va.Shape[1], va.Shape[2]
	sa, err := x.lse("in.s_a", n, h)
	if err != nil {
		return nil, err
	}
	sb, err := x.lse("in.s_b", n, h)
	if err != nil {
		return nil, err
	}
	p := kernels.MergeStateParams{VA: va, SA: sa, VB: vb, SB: sb, V: kernels.NewTensor(layout.F32, n, h, d), S: make([]float32, n*h)}
	if err := x.b.MergeState(&p); err != nil {
		return nil, err
	}
	return stateOutputs("v", p.V, "s", p.S), nil
}

func runMergeStates(x *exec) (map[string]safetensors.Tensor, error) {
	v, err := x.host("in.v", 4)
	if err != nil {
		return nil, err
	}
	n, ns, h, d := v.Shape[0], v.Shape[1], v.Shape[2], v.Shape[3]
	s, err := x.lse("in.s", n, ns, h)
	if err != nil {
		return nil, err
	}
	p := kernels.MergeStatesParams{V: v, S: s, OutV: kernels.NewTensor(layout.F32, n, h, d), OutS: make([]float32, n*h)}
	if err := x.b.MergeStates(&p); err != nil {
		return nil, err
	}
	return stateOutputs("v", p.OutV, "s", p.OutS), nil
}

func runMLADecode(x *exec) (map[string]safetensors.Tensor, error) {
	qNope, err := x.host("in.q_nope", 3)
	if err != nil {
		return nil, err
	}
	qPE, err := x.host("in.q_pe", 3)
	if err != nil {
		return nil, err
	}
	cache, err := x.mlaCache()
	if err != nil {
		return nil, err
	}
	ckv, kpe := x.tensor("in.ckv_cache"), x.tensor("in.kpe_cache")
	for _, c := range []struct {
		param  string
		t      safetensors.Tensor
		dim    int
		defVal int
	}{
		{"page_size", ckv, 1, -1},
		{"num_heads", x.tensor("in.q_nope"), 1, -1},
		{"head_dim_ckv", ckv, 2, ckv.Shape[2]},
		{"head_dim_kpe", kpe, 2, kpe.Shape[2]},
	} {
		var v int
		if c.defVal < 0 {
			v, err = x.p.intReq(c.param)
		} else {
			v, err = x.p.intOr(c.param, c.defVal)
		}
		if err != nil {
			return nil, err
		}
		if err := x.wantDim(c.param, v, c.t, c.dim); err != nil {
			return nil, err
		}
	}
	smScale, err := x.p.floatOr("sm_scale", 0)
	if err != nil {
		return nil, err
	}
	if _, ok := x.p.meta["sm_scale"]; !ok {
		return nil, fmt.Errorf("%w: missing parameter sm_scale (MLA has no default)", ErrBadCase)
	}
	p := kernels.MLADecodeParams{
		QNope: qNope, QPE: qPE,
		Cache:    cache,
		NumHeads: qNope.Shape[1],
		SMScale:  smScale,
	}
	if p.KVIndptr, err = x.indices("in.kv_indptr"); err != nil {
		return nil, err
	}
	if p.KVPageIndices, err = x.indices("in.kv_indices"); err != nil {
		return nil, err
	}
	if p.KVLen, err = x.indices("in.kv_len"); err != nil {
		return nil, err
	}
	b, h, dc := qNope.Shape[0], qNope.Shape[1], qNope.Shape[2]
	p.O = kernels.NewTensor(layout.F32, b, h, dc)
	p.LSE = make([]float32, b*h)
	if err := x.b.MLADecode(&p); err != nil {
		return nil, err
	}
	return stateOutputs("o", p.O, "lse", p.LSE), nil
}
