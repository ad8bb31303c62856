package ppl_test

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ppl"
)

// storage variants the layout/mode tests run with.
var storages = map[string]func(g *ppl.Geometry){
	"f16":       func(g *ppl.Geometry) { g.DType = layout.F16 },
	"int8-g4":   func(g *ppl.Geometry) { g.QuantBits, g.QuantGroup, g.ScaleDType = 8, 4, layout.F16 },
	"int4-g8":   func(g *ppl.Geometry) { g.QuantBits, g.QuantGroup, g.ScaleDType = 4, 8, layout.F32 },
	"bf16":      func(g *ppl.Geometry) { g.DType = layout.BF16 },
	"int8-g1":   func(g *ppl.Geometry) { g.QuantBits, g.QuantGroup, g.ScaleDType = 8, 1, layout.F32 },
	"int4-g16":  func(g *ppl.Geometry) { g.QuantBits, g.QuantGroup, g.ScaleDType = 4, 16, layout.F16 },
	"f32-cache": func(g *ppl.Geometry) { g.DType = layout.F32 },
}

// TestKeyValueCacheEveryLayoutAndMode builds a small cache (3 layers, 2 kv
// heads repeated twice, Dh 16) in each layout and mode, runs the operator
// twice on layer 1 (a prefill of 5, 0, 9 tokens, then 1, 3, 2 more), and
// checks the packed outputs against a direct gather from the cache bytes,
// against the quantised inputs, and that nothing outside the written rows
// moved.
func TestKeyValueCacheEveryLayoutAndMode(t *testing.T) {
	for _, l := range allLayouts {
		for _, mode := range []ppl.Mode{ppl.ModeOffset, ppl.ModePageTable} {
			for name, storage := range storages {
				t.Run(fmt.Sprintf("layout=%d/mode=%d/%s", l, mode, name), func(t *testing.T) {
					g := ppl.Geometry{Layout: l, Mode: mode, NumLayers: 3, MaxTokens: 64, NumKVHeads: 2, HeadDim: 16,
						PageSize: 4, NumRepeat: 2}
					storage(&g)
					h := newHarness(t, rand.New(rand.NewPCG(uint64(l), uint64(mode))), g, 1, []int{12, 4, 16})
					h.step([]int{5, 0, 9}, layout.F16, layout.F32)
					h.step([]int{1, 3, 2}, layout.F16, layout.F32)
				})
			}
		}
	}
}

// TestKeyValueCacheRandom runs random geometries (every layout, mode and
// storage), batches and step sequences against the model.
func TestKeyValueCacheRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	dts := []layout.DType{layout.F32, layout.F16, layout.BF16}
	iters := 250
	if testing.Short() {
		iters = 100
	}
	for i := 0; i < iters; i++ {
		g := randomGeometry(rng)
		B := rng.IntN(5)
		capacity := make([]int, B)
		for b := range capacity {
			capacity[b] = rng.IntN(12)
		}
		g.MaxTokens = 0 // newHarness sizes it
		h := newHarness(t, rng, g, rng.IntN(g.NumLayers), capacity)
		for s := 0; s < 3; s++ {
			add := make([]int, B)
			for b := range add {
				add[b] = rng.IntN(capacity[b] - h.len(b) + 1)
			}
			h.step(add, dts[rng.IntN(3)], dts[rng.IntN(3)])
			if t.Failed() {
				t.Fatalf("geometry %+v", g)
			}
		}
	}
}

// TestKeyValueCacheBitExactCopy: with f16 inputs, an f16 cache and f16
// outputs, bytes pass through unchanged (NaN payloads included).
func TestKeyValueCacheBitExactCopy(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutLT2HD, NumLayers: 1, MaxTokens: 4, NumKVHeads: 1, HeadDim: 4, NumRepeat: 1, DType: layout.F16}
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	key := kernels.Tensor{DType: layout.F16, Shape: []int{2, 1, 4}, Data: []byte{
		0x01, 0x7c, 0x00, 0x3c, 0xff, 0xff, 0x00, 0x80, // NaN (payload 1), 1, NaN (all ones), -0
		0x00, 0x7c, 0x01, 0x00, 0xff, 0x7b, 0x55, 0x35}} // +inf, smallest subnormal, 65504, 0.333
	value := kernels.NewTensor(layout.F16, 2, 1, 4)
	p := &ppl.KeyValueCacheParams{CurrentKey: key, CurrentValue: value, SeqStarts: []int64{0, 2}, StartPos: []int64{0},
		Addressing: ppl.Addressing{KVStarts: []int64{0, 2}, CacheStarts: []int64{1}},
		Key:        kernels.NewTensor(layout.F16, 2, 1, 4), Value: kernels.NewTensor(layout.F16, 2, 1, 4)}
	require.NoError(t, ppl.KeyValueCache(&c, p))
	assert.Equal(t, key.Data, p.Key.Data)
	// Layout 1 (L, MaxT, 2, H, Dh): slot 1's K row starts at element 8, slot 2's at 16.
	assert.Equal(t, key.Data[:8], c.Data[16:24])
	assert.Equal(t, key.Data[8:], c.Data[32:40])
}

// TestKeyValueCacheNumRepeat pins the GQA expansion on a picture: cache heads
// A and B with num_repeat 3 become output heads A A A B B B.
func TestKeyValueCacheNumRepeat(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutL2HTD, NumLayers: 1, MaxTokens: 2, NumKVHeads: 2, HeadDim: 2, NumRepeat: 3, DType: layout.F32}
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	p := &ppl.KeyValueCacheParams{
		CurrentKey:   kernels.TensorFromF32(layout.F32, []float32{1, 2, 3, 4}, 1, 2, 2),
		CurrentValue: kernels.TensorFromF32(layout.F32, []float32{5, 6, 7, 8}, 1, 2, 2),
		SeqStarts:    []int64{0, 1}, StartPos: []int64{0},
		Addressing: ppl.Addressing{KVStarts: []int64{0, 1}, CacheStarts: []int64{1}},
		Key:        kernels.NewTensor(layout.F32, 1, 6, 2), Value: kernels.NewTensor(layout.F16, 1, 6, 2)}
	require.NoError(t, ppl.KeyValueCache(&c, p))
	assert.Equal(t, []float32{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}, p.Key.F32())
	assert.Equal(t, []float32{5, 6, 5, 6, 5, 6, 7, 8, 7, 8, 7, 8}, p.Value.F32())
}

// TestKeyValueCacheUnalignedPages: PPL page starts need not be multiples of
// page_size (only the CSR conversion needs that).
func TestKeyValueCacheUnalignedPages(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutTL2HD, Mode: ppl.ModePageTable, NumLayers: 1, MaxTokens: 16, NumKVHeads: 1,
		HeadDim: 8, PageSize: 3, NumRepeat: 1, QuantBits: 8, QuantGroup: 8, ScaleDType: layout.F16}
	h := newHarnessWithStarts(t, rand.New(rand.NewPCG(41, 42)), g, 0, []int{5}, []int64{7, 1, x})
	h.step([]int{4}, layout.F32, layout.F32)
	h.step([]int{1}, layout.F32, layout.F32)
}

// TestKeyValueCacheErrors: every bad input is reported with its sentinel and
// leaves the cache and the outputs as they were.
func TestKeyValueCacheErrors(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutL2THD, Mode: ppl.ModePageTable, NumLayers: 2, MaxTokens: 16, NumKVHeads: 2,
		HeadDim: 8, PageSize: 4, NumRepeat: 2, QuantBits: 8, QuantGroup: 4, ScaleDType: layout.F16}
	valid := func() *ppl.KeyValueCacheParams {
		return &ppl.KeyValueCacheParams{
			CurrentKey:   kernels.TensorFromF32(layout.F16, seq(3*2*8), 3, 2, 8),
			CurrentValue: kernels.TensorFromF32(layout.F16, seq(3*2*8), 3, 2, 8),
			SeqStarts:    []int64{0, 2, 3}, StartPos: []int64{0, 4},
			Addressing: ppl.Addressing{KVStarts: []int64{0, 2, 7}, CacheStarts: []int64{0, x, 8, 12}, MaxPages: 2},
			LayerIdx:   1,
			Key:        kernels.NewTensor(layout.F32, 7, 4, 8), Value: kernels.NewTensor(layout.F32, 7, 4, 8),
		}
	}
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	require.NoError(t, ppl.KeyValueCache(&c, valid()))

	tests := map[string]struct {
		edit func(p *ppl.KeyValueCacheParams, c *ppl.Cache)
		is   error
		want string
	}{
		"layer_idx":        {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.LayerIdx = 2 }, ppl.ErrOutOfRange, "layer_idx 2 outside [0, num_layer 2)"},
		"seqstarts length": {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.SeqStarts = p.SeqStarts[:2] }, ppl.ErrInvalidStarts, "seqstarts has length 2, want batch+1 = 3"},
		"start_pos < 0":    {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.StartPos[0] = -1 }, ppl.ErrInvalidStarts, "start_pos[0] = -1 < 0"},
		"kv_len mismatch":  {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.StartPos[1] = 3 }, ppl.ErrInvalidStarts, "request 1: kv_len 5 (kvstarts) != start_pos 3 + seqlen 1 (seqstarts)"},
		"page past MaxT":   {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.CacheStarts[3] = 16 }, ppl.ErrOutOfRange, "cachestarts[1, 1] = 16, a page holding 1 tokens, leaves [0, MaxT 16)"},
		"MaxP too small": {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) {
			p.CacheStarts, p.MaxPages = []int64{0, 8}, 1
		}, ppl.ErrOutOfRange, "request 1: kv_len 5 needs 2 pages of 4, cachestarts has MaxP 1 columns"},
		"key rows":          {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.Key = kernels.NewTensor(layout.F32, 6, 4, 8) }, kernels.ErrInvalidTensor, "key has shape [6 4 8], want [7 4 8]"},
		"value heads":       {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.Value = kernels.NewTensor(layout.F32, 7, 2, 8) }, kernels.ErrInvalidTensor, "value has shape [7 2 8], want [7 4 8]"},
		"current_key dtype": {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.CurrentKey.DType = layout.I8 }, kernels.ErrInvalidTensor, "current_key has dtype i8"},
		"short data":        {func(p *ppl.KeyValueCacheParams, _ *ppl.Cache) { p.CurrentValue.Data = p.CurrentValue.Data[1:] }, kernels.ErrInvalidTensor, "current_value"},
		"scale buffer":      {func(_ *ppl.KeyValueCacheParams, c *ppl.Cache) { c.Scale = c.Scale[:10] }, kernels.ErrInvalidCache, "scale [2 2 16 2 2] needs 512 bytes, has 10"},
		"geometry":          {func(_ *ppl.KeyValueCacheParams, c *ppl.Cache) { c.Geometry.QuantGroup = 3 }, ppl.ErrInvalidGeometry, "quant_group 3 is not a power of two"},
	}
	for name, tc := range tests {
		p, cc := valid(), c
		cc.Data, cc.Scale = bytes.Clone(c.Data), bytes.Clone(c.Scale)
		tc.edit(p, &cc)
		keyBefore, cacheBefore, scaleBefore := bytes.Clone(p.Key.Data), bytes.Clone(cc.Data), bytes.Clone(cc.Scale)
		err := ppl.KeyValueCache(&cc, p)
		if assert.Error(t, err, name) {
			assert.ErrorIs(t, err, tc.is, name)
			assert.Contains(t, err.Error(), tc.want, name)
		}
		assert.Equal(t, keyBefore, p.Key.Data, "%s: output changed", name)
		assert.True(t, bytes.Equal(cacheBefore, cc.Data) && bytes.Equal(scaleBefore, cc.Scale), "%s: cache changed", name)
	}
}

// TestKeyValueCacheNoAllocs pins the per-step cost: no allocation.
func TestKeyValueCacheNoAllocs(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutTL2HD, Mode: ppl.ModePageTable, NumLayers: 4, MaxTokens: 256, NumKVHeads: 4,
		HeadDim: 128, PageSize: 16, NumRepeat: 2, QuantBits: 8, QuantGroup: 8, ScaleDType: layout.F16}
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	p := &ppl.KeyValueCacheParams{
		CurrentKey: kernels.NewTensor(layout.F16, 2, 4, 128), CurrentValue: kernels.NewTensor(layout.F16, 2, 4, 128),
		SeqStarts: []int64{0, 1, 2}, StartPos: []int64{20, 3},
		Addressing: ppl.Addressing{KVStarts: []int64{0, 21, 25}, CacheStarts: []int64{0, 16, 32, 48}, MaxPages: 2},
		LayerIdx:   3, Key: kernels.NewTensor(layout.F16, 25, 8, 128), Value: kernels.NewTensor(layout.F16, 25, 8, 128)}
	allocs := testing.AllocsPerRun(20, func() {
		if err := ppl.KeyValueCache(&c, p); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}

// --- the model ---

// harness drives a cache through operator steps and checks every step
// against a dense per-request history of the rows each request stored.
type harness struct {
	t       *testing.T
	rng     *rand.Rand
	g       ppl.Geometry
	c       ppl.Cache
	layer   int
	starts  []int64       // cachestarts (fixed for the harness's life)
	maxP    int           // MaxP (page mode)
	hist    [][][]float32 // hist[b][pos] = K row then V row ([2*H*Dh]) as stored (after input rounding)
	dtHist  [][]layout.DType
	initial ppl.Cache       // the cache before any step (random bytes)
	written map[[2]int]bool // (slot, head) rows of h.layer the steps wrote
}

// newHarness places len(capacity) requests, request b holding up to
// capacity[b] tokens, in a cache of geometry g (MaxT sized to fit when 0)
// filled with random bytes, with random disjoint slots.
func newHarness(t *testing.T, rng *rand.Rand, g ppl.Geometry, layer int, capacity []int) *harness {
	t.Helper()
	B := len(capacity)
	var starts []int64
	maxP := 0
	if g.Mode == ppl.ModeOffset {
		// Requests in random order with random gaps.
		order := rng.Perm(B)
		starts = make([]int64, B)
		next := int64(rng.IntN(3))
		for _, b := range order {
			starts[b] = next
			next += int64(capacity[b] + rng.IntN(3))
		}
		if g.MaxTokens < int(next) {
			g.MaxTokens = int(next)
		}
	} else {
		N := g.PageSize
		pages := 0
		for _, c := range capacity {
			maxP = max(maxP, (c+N-1)/N)
			pages += (c + N - 1) / N
		}
		pages += rng.IntN(3)
		if g.MaxTokens < pages*N {
			g.MaxTokens = pages * N
		}
		perm := rng.Perm(g.MaxTokens / N)
		starts = make([]int64, B*maxP)
		for b := range starts {
			starts[b] = int64(rng.IntN(1000) - 2000) // never read
		}
		k := 0
		for b, c := range capacity {
			for j := 0; j < (c+N-1)/N; j++ {
				starts[b*maxP+j] = int64(perm[k] * N)
				k++
			}
		}
	}
	return newHarnessWithStarts(t, rng, g, layer, capacity, starts)
}

func newHarnessWithStarts(t *testing.T, rng *rand.Rand, g ppl.Geometry, layer int, capacity []int, starts []int64) *harness {
	t.Helper()
	require.NoError(t, g.Validate(), "%+v", g)
	c, err := ppl.NewCache(g)
	require.NoError(t, err)
	for i := range c.Data {
		c.Data[i] = byte(rng.Uint32())
	}
	for i := range c.Scale {
		c.Scale[i] = byte(rng.Uint32())
	}
	maxP := 0
	if g.Mode == ppl.ModePageTable && len(capacity) > 0 {
		maxP = len(starts) / len(capacity)
	}
	return &harness{t: t, rng: rng, g: g, c: c, layer: layer, starts: starts, maxP: maxP,
		hist: make([][][]float32, len(capacity)), initial: ppl.Cache{Geometry: g, Data: bytes.Clone(c.Data), Scale: bytes.Clone(c.Scale)},
		written: map[[2]int]bool{}}
}

func (h *harness) len(b int) int { return len(h.hist[b]) }

// slot is the seed's slot formula, written out again.
func (h *harness) slot(b, pos int) int {
	if h.g.Mode == ppl.ModeOffset {
		return int(h.starts[b]) + pos
	}
	return int(h.starts[b*h.maxP+pos/h.g.PageSize]) + pos%h.g.PageSize
}

// step appends add[b] random tokens to each request (inputs of dtype inDT,
// outputs of dtype outDT), runs the operator and checks the result.
func (h *harness) step(add []int, inDT, outDT layout.DType) {
	t, g := h.t, h.g
	t.Helper()
	B, H, D, R := len(add), g.NumKVHeads, g.HeadDim, g.NumRepeat
	seqStarts, kvStarts, startPos := []int64{0}, []int64{0}, make([]int64, B)
	var keys, values []float32
	for b := 0; b < B; b++ {
		startPos[b] = int64(h.len(b))
		for i := 0; i < add[b]; i++ {
			row := make([]float32, 2*H*D)
			for j := range row {
				row[j] = float32(h.rng.NormFloat64() * math.Ldexp(1, h.rng.IntN(8)-4))
			}
			// The operator sees the values rounded to the input dtype.
			layout.LoadRowF32(row, inDT, kernels.TensorFromF32(inDT, row, len(row)).Data)
			keys, values = append(keys, row[:H*D]...), append(values, row[H*D:]...)
			h.hist[b] = append(h.hist[b], row)
		}
		seqStarts = append(seqStarts, seqStarts[b]+int64(add[b]))
		kvStarts = append(kvStarts, kvStarts[b]+int64(h.len(b)))
	}
	rows := int(seqStarts[B])
	p := &ppl.KeyValueCacheParams{
		CurrentKey:   kernels.TensorFromF32(inDT, keys, rows, H, D),
		CurrentValue: kernels.TensorFromF32(inDT, values, rows, H, D),
		SeqStarts:    seqStarts, StartPos: startPos,
		Addressing: ppl.Addressing{KVStarts: kvStarts, CacheStarts: h.starts, MaxPages: h.maxP},
		LayerIdx:   h.layer,
		Key:        kernels.NewTensor(outDT, int(kvStarts[B]), H*R, D),
		Value:      kernels.NewTensor(outDT, int(kvStarts[B]), H*R, D),
	}
	require.NoError(t, ppl.KeyValueCache(&h.c, p), "geometry %+v", g)
	for b := 0; b < B; b++ {
		for pos := range h.hist[b] {
			for head := 0; head < H; head++ {
				h.written[[2]int{h.slot(b, pos), head}] = true
			}
		}
	}

	// 1. Outputs equal a direct gather from the cache bytes.
	// 2. They equal each stored input after the cache's rounding or quantisation.
	row := make([]float32, D)
	for b := 0; b < B; b++ {
		for pos, hr := range h.hist[b] {
			out := int(kvStarts[b]) + pos
			for kv, tensor := range []kernels.Tensor{p.Key, p.Value} {
				for head := 0; head < H; head++ {
					gathered := h.gather(kv, h.slot(b, pos), head)
					want := stored(g, hr[(kv*H+head)*D:(kv*H+head+1)*D])
					for r := 0; r < R; r++ {
						off := ((out*H+head)*R + r) * D
						layout.LoadRowF32(row, outDT, tensor.Data[off*outDT.Size():])
						require.Equal(t, roundTo(outDT, gathered), row,
							"request %d pos %d kv %d head %d repeat %d (slot %d): output vs direct gather", b, pos, kv, head, r, h.slot(b, pos))
						require.Equal(t, roundTo(outDT, want), row,
							"request %d pos %d kv %d head %d: output vs stored input", b, pos, kv, head)
					}
				}
			}
		}
	}
	// 3. Every row the steps did not write still holds its initial bytes.
	h.checkUntouched()
}

// gather reads row (h.layer, kv, slot, head) straight from the cache bytes
// with the seed's shapes: code bytes or nibbles times the group's scale.
func (h *harness) gather(kv, slot, head int) []float32 {
	g, c := h.g, &h.c
	out := make([]float32, g.HeadDim)
	for d := range out {
		off := slowOffset(g, g.HeadDim, h.layer, kv, slot, head, d)
		switch g.QuantBits {
		case 0:
			out[d] = layout.LoadF32(g.DType, c.Data, int(off))
		default:
			var code int
			if g.QuantBits == 8 {
				code = int(int8(c.Data[off]))
			} else {
				code = int(c.Data[off/2]>>(4*(off%2))) & 0xf
				if code >= 8 {
					code -= 16
				}
			}
			s := layout.LoadF32(g.ScaleDType, c.Scale, int(slowOffset(g, g.HeadDim/g.QuantGroup, h.layer, kv, slot, head, d/g.QuantGroup)))
			out[d] = float32(code) * s
		}
	}
	return out
}

// stored is what a cache of geometry g holds for the row x.
func stored(g ppl.Geometry, x []float32) []float32 {
	if !g.Quantised() {
		return roundTo(g.DType, x)
	}
	q := g.Quant()
	codes, scales := make([]byte, q.CodeBytes(len(x))), make([]byte, q.ScaleBytes(len(x)))
	q.Quantize(codes, scales, x)
	out := make([]float32, len(x))
	q.Dequantize(out, codes, scales)
	return out
}

// roundTo rounds x to dtype dt and back.
func roundTo(dt layout.DType, x []float32) []float32 {
	out := make([]float32, len(x))
	layout.LoadRowF32(out, dt, kernels.TensorFromF32(dt, x, len(x)).Data)
	return out
}

// checkUntouched compares every row no step wrote with the initial cache.
func (h *harness) checkUntouched() {
	g, t := h.g, h.t
	t.Helper()
	b := h.initial
	rowBytes := g.RowBytes()
	for l := 0; l < g.NumLayers; l++ {
		for kv := 0; kv < 2; kv++ {
			for slot := 0; slot < g.MaxTokens; slot++ {
				for head := 0; head < g.NumKVHeads; head++ {
					if l == h.layer && h.written[[2]int{slot, head}] {
						continue
					}
					off := slowOffset(g, g.HeadDim, l, kv, slot, head, 0)
					if g.QuantBits == 4 {
						off /= 2
					} else {
						off *= int64(max(g.DType.Size(), 1))
					}
					require.Equal(t, b.Data[off:off+int64(rowBytes)], h.c.Data[off:off+int64(rowBytes)],
						"row (layer %d, kv %d, slot %d, head %d) was not written but changed", l, kv, slot, head)
					if g.Quantised() {
						so := slowOffset(g, g.HeadDim/g.QuantGroup, l, kv, slot, head, 0) * int64(g.ScaleDType.Size())
						n := int64(g.HeadDim / g.QuantGroup * g.ScaleDType.Size())
						require.Equal(t, b.Scale[so:so+n], h.c.Scale[so:so+n], "scales of row (layer %d, kv %d, slot %d, head %d) changed", l, kv, slot, head)
					}
				}
			}
		}
	}
}

func seq(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(i%13) - 6
	}
	return out
}
