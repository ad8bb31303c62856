package ppl_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ppl"
)

// Decode over a quantised cache is compared with the cpu backend's decode
// over the same cache dequantised into an f32 FlashInfer cache. Both compute
// softmax(q·k*scale)·v over identical float32 keys and values, so they may
// differ only by float rounding; the bound is FlashInfer's fp16 decode
// tolerance, tighter than its fp8 one (atol 1e-2, rtol 2e-2).
const decodeAtol, decodeRtol = 1e-3, 1e-3

// TestDecodeMatchesCPUBackendOverDequantisedCache runs every layout and mode
// with int8 and int4 group caches (and an f16 one), a batch with an empty
// request and GQA (num_repeat 2).
func TestDecodeMatchesCPUBackendOverDequantisedCache(t *testing.T) {
	backend := cpu.New(cpu.Config{})
	var worstO, worstLSE float64
	for _, l := range allLayouts {
		for _, mode := range []ppl.Mode{ppl.ModeOffset, ppl.ModePageTable} {
			for _, name := range []string{"int8-g4", "int8-g1", "int4-g8", "int4-g16", "f16"} {
				t.Run(fmt.Sprintf("layout=%d/mode=%d/%s", l, mode, name), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(l)+51, uint64(mode)))
					g := ppl.Geometry{Layout: l, Mode: mode, NumLayers: 2, MaxTokens: 96, NumKVHeads: 2, HeadDim: 16,
						PageSize: 4, NumRepeat: 2}
					storages[name](&g)
					h := newHarness(t, rng, g, 1, []int{13, 0, 30, 1})
					h.step([]int{12, 0, 25, 1}, layout.F16, layout.F32)
					h.step([]int{1, 0, 5, 0}, layout.F16, layout.F32)
					o, lse := compareDecode(t, backend, h, rng)
					worstO, worstLSE = max(worstO, o), max(worstLSE, lse)
				})
			}
		}
	}
	t.Logf("largest |o_ppl - o_cpu| = %.3g, |lse_ppl - lse_cpu| = %.3g", worstO, worstLSE)
}

// compareDecode decodes random queries over the harness's cache with
// ppl.Decode and with the cpu backend over the dequantised cache, checks
// they agree and returns the largest absolute differences.
func compareDecode(t *testing.T, backend kernels.Backend, h *harness, rng *rand.Rand) (maxO, maxLSE float64) {
	t.Helper()
	g := h.g
	B, Hq, D := len(h.hist), g.NumKVHeads*g.NumRepeat, g.HeadDim
	a := h.addressing()

	// The same pages as a FlashInfer CSR: page_size N in page-table mode,
	// 1 (a page per slot) in offset mode.
	var table kernels.PageTable
	N := g.PageSize
	if g.Mode == ppl.ModePageTable {
		require.NoError(t, ppl.CSRFromPageTable(&table, &a, N))
	} else {
		N = 1
		require.NoError(t, ppl.CSRFromOffsets(&table, &a))
	}
	// Dequantise the layer into an f32 FlashInfer cache, slot s = page s/N, entry s%N.
	fi, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.HND, Form: layout.Fused, DType: layout.F32,
		NumPages: g.MaxTokens / N, PageSize: N, NumKVHeads: g.NumKVHeads, HeadDim: D})
	require.NoError(t, err)
	row := make([]float32, D)
	for s := 0; s < g.MaxTokens/N*N; s++ {
		for head := 0; head < g.NumKVHeads; head++ {
			h.c.LoadRow(row, h.layer, 0, s, head)
			layout.StoreRowF32(fi.Data[4*fi.Geometry.KOffset(s/N, s%N, head, 0):], layout.F32, row)
			h.c.LoadRow(row, h.layer, 1, s, head)
			layout.StoreRowF32(fi.Data[4*fi.Geometry.VOffset(s/N, s%N, head, 0):], layout.F32, row)
		}
	}

	qv := make([]float32, B*Hq*D)
	for i := range qv {
		qv[i] = float32(rng.NormFloat64())
	}
	q := kernels.TensorFromF32(layout.F16, qv, B, Hq, D)
	const smScale = 0.3
	want := &kernels.DecodeParams{Q: q, Cache: fi, Table: table,
		AttentionParams: kernels.AttentionParams{NumQOHeads: Hq, SMScale: smScale, WindowLeft: -1},
		O:               kernels.NewTensor(layout.F32, B, Hq, D), LSE: make([]float32, B*Hq)}
	require.NoError(t, backend.BatchDecode(want))
	got := &ppl.DecodeParams{Q: q, Addressing: a, LayerIdx: h.layer, SMScale: smScale,
		O: kernels.NewTensor(layout.F32, B, Hq, D), LSE: make([]float32, B*Hq)}
	require.NoError(t, ppl.Decode(&h.c, got))

	wo, gotO := want.O.F32(), got.O.F32()
	for i := range wo {
		require.InDelta(t, wo[i], gotO[i], decodeAtol+decodeRtol*math.Abs(float64(wo[i])), "o[%d] (request %d head %d)", i, i/(Hq*D), i/D%Hq)
		maxO = max(maxO, math.Abs(float64(wo[i]-gotO[i])))
	}
	for i := range want.LSE {
		w, gl := float64(want.LSE[i]), float64(got.LSE[i])
		if math.IsInf(w, -1) {
			require.True(t, math.IsInf(gl, -1), "lse[%d] = %g, want -inf (request %d has no keys)", i, gl, i/Hq)
			continue
		}
		require.InDelta(t, w, gl, decodeAtol+decodeRtol*math.Abs(w), "lse[%d]", i)
		maxLSE = max(maxLSE, math.Abs(w-gl))
	}
	return maxO, maxLSE
}

// addressing is the harness's addressing of every request's whole history.
func (h *harness) addressing() ppl.Addressing {
	kv := []int64{0}
	for b := range h.hist {
		kv = append(kv, kv[b]+int64(len(h.hist[b])))
	}
	return ppl.Addressing{KVStarts: kv, CacheStarts: h.starts, MaxPages: h.maxP}
}

// TestDecodeWorkedExample is the reference's worked example (one head, D=2,
// sm_scale 1, the query [1,0] over four keys, non-causal row 0): o =
// [1.000000, 0.768941], lse = 2.894636 (base 2), here stored in an f32 cache
// in layout 3, page-table mode, pages at slots 6 and 2.
func TestDecodeWorkedExample(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutL2HTD, Mode: ppl.ModePageTable, NumLayers: 1, MaxTokens: 8, NumKVHeads: 1,
		HeadDim: 2, PageSize: 2, NumRepeat: 1, DType: layout.F32}
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	a := ppl.Addressing{KVStarts: []int64{0, 4}, CacheStarts: []int64{6, 2}, MaxPages: 2}
	kv := &ppl.KeyValueCacheParams{
		CurrentKey:   kernels.TensorFromF32(layout.F32, []float32{1, 0, 0, 1, 1, 1, 0, 0}, 4, 1, 2),
		CurrentValue: kernels.TensorFromF32(layout.F32, []float32{1, 0, 0, 1, 1, 1, 2, 2}, 4, 1, 2),
		SeqStarts:    []int64{0, 4}, StartPos: []int64{0}, Addressing: a,
		Key: kernels.NewTensor(layout.F32, 4, 1, 2), Value: kernels.NewTensor(layout.F32, 4, 1, 2)}
	require.NoError(t, ppl.KeyValueCache(&c, kv))
	p := &ppl.DecodeParams{Q: kernels.TensorFromF32(layout.F32, []float32{1, 0}, 1, 1, 2), Addressing: a, SMScale: 1,
		O: kernels.NewTensor(layout.F32, 1, 1, 2), LSE: make([]float32, 1)}
	require.NoError(t, ppl.Decode(&c, p))
	o := p.O.F32()
	assert.InDelta(t, 1.000000, o[0], 1e-6)
	assert.InDelta(t, 0.768941, o[1], 1e-6)
	assert.InDelta(t, 2.894636, p.LSE[0], 1e-6)
}

// TestFlashInferCacheInPlace: layer 1 of a layout-2 f16 cache, seen through
// Cache.FlashInferCache, is a FlashInfer cache in place. The cpu backend
// appends into the PPL memory through it (with the CSR from
// CSRFromPageTable), the PPL operator reads those tokens back bit for bit,
// and the backend's decode over the same memory equals ppl.Decode.
func TestFlashInferCacheInPlace(t *testing.T) {
	backend := cpu.New(cpu.Config{})
	rng := rand.New(rand.NewPCG(61, 62))
	g := ppl.Geometry{Layout: ppl.LayoutL2THD, Mode: ppl.ModePageTable, NumLayers: 3, MaxTokens: 40, NumKVHeads: 2,
		HeadDim: 8, PageSize: 4, NumRepeat: 3, DType: layout.F16}
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	const layer = 1
	fi, err := c.FlashInferCache(layer, 4)
	require.NoError(t, err)
	assert.Equal(t, 10, fi.Geometry.NumPages)

	// Two requests of 6 and 3 tokens in pages {7, 2} and {9}.
	a := ppl.Addressing{KVStarts: []int64{0, 6, 9}, CacheStarts: []int64{28, 8, 36, x}, MaxPages: 2}
	var table kernels.PageTable
	require.NoError(t, ppl.CSRFromPageTable(&table, &a, 4))
	assert.Equal(t, kernels.PageTable{KVIndptr: []int32{0, 2, 3}, KVPageIndices: []int32{7, 2, 9}, KVLastPageLen: []int32{2, 3}}, table)

	vals := make([]float32, 2*9*2*8)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	keys, values := kernels.TensorFromF32(layout.F16, vals[:9*2*8], 9, 2, 8), kernels.TensorFromF32(layout.F16, vals[9*2*8:], 9, 2, 8)
	require.NoError(t, backend.AppendPagedKVCache(&kernels.AppendParams{AppendKey: keys, AppendValue: values,
		BatchIndices: []int32{0, 0, 0, 0, 0, 0, 1, 1, 1}, Positions: []int32{0, 1, 2, 3, 4, 5, 0, 1, 2},
		Cache: fi, Table: table}))

	// The PPL operator, with no new tokens, gathers what the backend appended.
	out := &ppl.KeyValueCacheParams{
		CurrentKey: kernels.NewTensor(layout.F16, 0, 2, 8), CurrentValue: kernels.NewTensor(layout.F16, 0, 2, 8),
		SeqStarts: []int64{0, 0, 0}, StartPos: []int64{6, 3}, Addressing: a, LayerIdx: layer,
		Key: kernels.NewTensor(layout.F16, 9, 6, 8), Value: kernels.NewTensor(layout.F16, 9, 6, 8)}
	require.NoError(t, ppl.KeyValueCache(&c, out))
	for tok := 0; tok < 9; tok++ {
		for j := 0; j < 6; j++ { // output head j is cache head j/3
			src := (tok*2 + j/3) * 16
			dst := (tok*6 + j) * 16
			require.Equal(t, keys.Data[src:src+16], out.Key.Data[dst:dst+16], "key token %d head %d", tok, j)
			require.Equal(t, values.Data[src:src+16], out.Value.Data[dst:dst+16], "value token %d head %d", tok, j)
		}
	}

	q := kernels.TensorFromF32(layout.F32, vals[:2*6*8], 2, 6, 8)
	want := &kernels.DecodeParams{Q: q, Cache: fi, Table: table, AttentionParams: kernels.AttentionParams{NumQOHeads: 6, WindowLeft: -1},
		O: kernels.NewTensor(layout.F32, 2, 6, 8), LSE: make([]float32, 12)}
	require.NoError(t, backend.BatchDecode(want))
	got := &ppl.DecodeParams{Q: q, Addressing: a, LayerIdx: layer, O: kernels.NewTensor(layout.F32, 2, 6, 8), LSE: make([]float32, 12)}
	require.NoError(t, ppl.Decode(&c, got))
	assert.InDeltaSlice(t, want.O.F32(), got.O.F32(), 1e-5)
	assert.InDeltaSlice(t, want.LSE, got.LSE, 1e-5)
}

func TestDecodeErrors(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutTL2HD, NumLayers: 1, MaxTokens: 8, NumKVHeads: 1, HeadDim: 8, NumRepeat: 2,
		QuantBits: 8, QuantGroup: 8, ScaleDType: layout.F16}
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	valid := func() *ppl.DecodeParams {
		return &ppl.DecodeParams{Q: kernels.NewTensor(layout.F16, 1, 2, 8), Addressing: ppl.Addressing{KVStarts: []int64{0, 3}, CacheStarts: []int64{5}},
			O: kernels.NewTensor(layout.F32, 1, 2, 8), LSE: make([]float32, 2)}
	}
	require.NoError(t, ppl.Decode(&c, valid()))
	tests := map[string]struct {
		edit func(p *ppl.DecodeParams)
		is   error
		want string
	}{
		"layer":     {func(p *ppl.DecodeParams) { p.LayerIdx = 1 }, ppl.ErrOutOfRange, "layer_idx 1"},
		"sm_scale":  {func(p *ppl.DecodeParams) { p.SMScale = math.Inf(1) }, ppl.ErrInvalidGeometry, "sm_scale +Inf is not finite"},
		"lse":       {func(p *ppl.DecodeParams) { p.LSE = p.LSE[:1] }, kernels.ErrInvalidTensor, "lse has length 1, want batch 1 x heads 2"},
		"slots":     {func(p *ppl.DecodeParams) { p.CacheStarts[0] = 6 }, ppl.ErrOutOfRange, "cachestarts[0] = 6 with kv_len 3"},
		"q heads":   {func(p *ppl.DecodeParams) { p.Q = kernels.NewTensor(layout.F16, 1, 1, 8) }, kernels.ErrInvalidTensor, "q has shape [1 1 8], want [1 2 8]"},
		"o dtype":   {func(p *ppl.DecodeParams) { p.O = kernels.NewTensor(layout.E4M3, 1, 2, 8) }, kernels.ErrInvalidTensor, "o has dtype e4m3"},
		"kvstarts0": {func(p *ppl.DecodeParams) { p.KVStarts[0] = 1 }, ppl.ErrInvalidStarts, "kvstarts[0] = 1"},
	}
	for name, tc := range tests {
		p := valid()
		tc.edit(p)
		p.O.Data[0] = 7
		err := ppl.Decode(&c, p)
		if assert.Error(t, err, name) {
			assert.ErrorIs(t, err, tc.is, name)
			assert.Contains(t, err.Error(), tc.want, name)
		}
		assert.Equal(t, byte(7), p.O.Data[0], "%s: output written", name)
	}
}
