package ppl_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ppl"
	"github.com/pagedkv/pagedkv/quant"
)

var allLayouts = []ppl.Layout{ppl.LayoutTL2HD, ppl.LayoutLT2HD, ppl.LayoutL2THD, ppl.LayoutL2HTD}

// TestOffsetWorkedExample: L=2, MaxT=5, H=3, Dh=4 (240 elements), the element
// layer 1, V, slot 3, head 2, feature 1 in each layout, computed by hand from
// the seed's shapes (row-major, innermost last).
func TestOffsetWorkedExample(t *testing.T) {
	tests := []struct {
		layout ppl.Layout
		shape  []int
		// nested row-major index, outermost first
		by   string
		want int64
	}{
		{ppl.LayoutTL2HD, []int{5, 2, 2, 3, 4}, "((((3*2+1)*2+1)*3+2)*4+1", 189},
		{ppl.LayoutLT2HD, []int{2, 5, 2, 3, 4}, "((((1*5+3)*2+1)*3+2)*4+1", 213},
		{ppl.LayoutL2THD, []int{2, 2, 5, 3, 4}, "((((1*2+1)*5+3)*3+2)*4+1", 225},
		{ppl.LayoutL2HTD, []int{2, 2, 3, 5, 4}, "((((1*2+1)*3+2)*5+3)*4+1", 233},
	}
	for _, tc := range tests {
		g := ppl.Geometry{Layout: tc.layout, NumLayers: 2, MaxTokens: 5, NumKVHeads: 3, HeadDim: 4, NumRepeat: 1,
			QuantBits: 8, QuantGroup: 2, ScaleDType: layout.F16}
		require.NoError(t, g.Validate())
		assert.Equal(t, tc.shape, g.Shape(), "layout %v shape", tc.layout)
		assert.Equal(t, int64(240), g.Elements())
		assert.Equal(t, tc.want, g.Offset(1, 1, 3, 2, 1), "layout %v: %s", tc.layout, tc.by)
		// The scale tensor has Dh/G = 2 per row: feature 1 is in group 0.
		assert.Equal(t, (tc.want-1)/2, g.ScaleOffset(1, 1, 3, 2, 0), "layout %v scale", tc.layout)
		scaleShape := append(append([]int(nil), tc.shape[:4]...), 2)
		assert.Equal(t, scaleShape, g.ScaleShape())
	}
}

// layoutDims names each layout's dimensions outermost first: L layer, K the
// K/V dimension of size 2, T token slot, H head, D feature (or scale group).
var layoutDims = map[ppl.Layout]string{
	ppl.LayoutTL2HD: "TLKHD",
	ppl.LayoutLT2HD: "LTKHD",
	ppl.LayoutL2THD: "LKTHD",
	ppl.LayoutL2HTD: "LKHTD",
}

// slowOffset is the row-major linear index of (layer, kv, token, head, last)
// in a tensor whose dimensions are in the layout's order and whose last
// dimension has lastSize entries.
func slowOffset(g ppl.Geometry, lastSize, layer, kv, token, head, last int) int64 {
	size := map[byte]int{'L': g.NumLayers, 'K': 2, 'T': g.MaxTokens, 'H': g.NumKVHeads, 'D': lastSize}
	idx := map[byte]int{'L': layer, 'K': kv, 'T': token, 'H': head, 'D': last}
	var off int64
	for _, d := range []byte(layoutDims[g.Layout]) {
		off = off*int64(size[d]) + int64(idx[d])
	}
	return off
}

func randomGeometry(rng *rand.Rand) ppl.Geometry {
	g := ppl.Geometry{
		Layout: allLayouts[rng.IntN(4)], Mode: ppl.Mode(rng.IntN(2)),
		NumLayers: 1 + rng.IntN(4), MaxTokens: rng.IntN(40), NumKVHeads: 1 + rng.IntN(4),
		HeadDim: 2 << rng.IntN(5), NumRepeat: 1 + rng.IntN(3), PageSize: 1 + rng.IntN(8),
	}
	switch rng.IntN(4) {
	case 0:
		g.DType = []layout.DType{layout.F32, layout.F16, layout.BF16}[rng.IntN(3)]
	case 1, 2:
		g.QuantBits, g.QuantGroup, g.ScaleDType = 8, 1<<rng.IntN(4), layout.F16
	default:
		g.QuantBits, g.QuantGroup, g.ScaleDType = 4, 2<<rng.IntN(3), layout.F32
	}
	g.QuantGroup = min(g.QuantGroup, g.HeadDim)
	if !g.Quantised() {
		g.QuantGroup = 0
	}
	return g
}

// TestOffsetMatchesSlowModel compares Offset and ScaleOffset with the
// row-major index of the seed's shapes for random geometries and indices.
func TestOffsetMatchesSlowModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := 0; i < 2000; i++ {
		g := randomGeometry(rng)
		g.MaxTokens = max(g.MaxTokens, 1)
		require.NoError(t, g.Validate(), "%+v", g)
		for j := 0; j < 20; j++ {
			l, kv, tok, h, d := rng.IntN(g.NumLayers), rng.IntN(2), rng.IntN(g.MaxTokens), rng.IntN(g.NumKVHeads), rng.IntN(g.HeadDim)
			if got, want := g.Offset(l, kv, tok, h, d), slowOffset(g, g.HeadDim, l, kv, tok, h, d); got != want {
				t.Fatalf("%+v Offset(%d,%d,%d,%d,%d) = %d, slow model %d", g, l, kv, tok, h, d, got, want)
			}
			if !g.Quantised() {
				continue
			}
			G := g.QuantGroup
			if got, want := g.ScaleOffset(l, kv, tok, h, d/G), slowOffset(g, g.HeadDim/G, l, kv, tok, h, d/G); got != want {
				t.Fatalf("%+v ScaleOffset(%d,%d,%d,%d,%d) = %d, slow model %d", g, l, kv, tok, h, d/G, got, want)
			}
		}
	}
}

// checkBijection enumerates every element of g's cache (and scale) tensor
// and fails unless the offsets are exactly 0..n-1, each once.
func checkBijection(t testing.TB, g ppl.Geometry) {
	t.Helper()
	seen := make([]bool, g.Elements())
	var seenScale []bool
	if g.Quantised() {
		seenScale = make([]bool, g.ScaleElements())
	}
	for l := 0; l < g.NumLayers; l++ {
		for kv := 0; kv < 2; kv++ {
			for tok := 0; tok < g.MaxTokens; tok++ {
				for h := 0; h < g.NumKVHeads; h++ {
					for d := 0; d < g.HeadDim; d++ {
						off := g.Offset(l, kv, tok, h, d)
						if off < 0 || off >= int64(len(seen)) || seen[off] {
							t.Fatalf("%+v: Offset(%d,%d,%d,%d,%d) = %d is out of [0,%d) or taken twice", g, l, kv, tok, h, d, off, len(seen))
						}
						seen[off] = true
						if g.Quantised() && d%g.QuantGroup == 0 {
							so := g.ScaleOffset(l, kv, tok, h, d/g.QuantGroup)
							if so < 0 || so >= int64(len(seenScale)) || seenScale[so] {
								t.Fatalf("%+v: ScaleOffset(%d,%d,%d,%d,%d) = %d is out of [0,%d) or taken twice", g, l, kv, tok, h, d/g.QuantGroup, so, len(seenScale))
							}
							seenScale[so] = true
						}
					}
				}
			}
		}
	}
}

func TestOffsetIsBijection(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for i := 0; i < 300; i++ {
		checkBijection(t, randomGeometry(rng))
	}
}

func TestStridesAndRowBytes(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutL2HTD, NumLayers: 2, MaxTokens: 5, NumKVHeads: 3, HeadDim: 4, NumRepeat: 1, DType: layout.F16}
	assert.Equal(t, ppl.Strides{Layer: 120, KV: 60, Head: 20, Token: 4}, g.Strides())
	assert.Equal(t, 8, g.RowBytes())
	assert.Equal(t, int64(480), g.Bytes())
	g.DType, g.QuantBits, g.QuantGroup, g.ScaleDType = layout.InvalidDType, 4, 2, layout.F32
	assert.Equal(t, 2, g.RowBytes(), "int4: Dh/2 bytes")
	assert.Equal(t, int64(120), g.Bytes())
	assert.Equal(t, int64(120*4), g.ScaleBytes(), "240/2 f32 scales")
}

func TestValidateGeometry(t *testing.T) {
	ok := ppl.Geometry{Layout: ppl.LayoutL2THD, Mode: ppl.ModePageTable, NumLayers: 2, MaxTokens: 64,
		NumKVHeads: 2, HeadDim: 16, PageSize: 8, NumRepeat: 1, QuantBits: 8, QuantGroup: 8, ScaleDType: layout.F16}
	require.NoError(t, ok.Validate())
	tests := map[string]struct {
		edit func(g *ppl.Geometry)
		want string
		is   error
	}{
		"layout 4":           {func(g *ppl.Geometry) { g.Layout = 4 }, "cache_layout 4, want 0..3", nil},
		"mode 2":             {func(g *ppl.Geometry) { g.Mode = 2 }, "cache_mode 2", nil},
		"no layers":          {func(g *ppl.Geometry) { g.NumLayers = 0 }, "num_layer 0 < 1", nil},
		"negative MaxT":      {func(g *ppl.Geometry) { g.MaxTokens = -1 }, "MaxT -1 < 0", nil},
		"no heads":           {func(g *ppl.Geometry) { g.NumKVHeads = 0 }, "num_heads 0 < 1", nil},
		"no head dim":        {func(g *ppl.Geometry) { g.HeadDim = 0 }, "head_dim 0 < 1", nil},
		"num_repeat 0":       {func(g *ppl.Geometry) { g.NumRepeat = 0 }, "num_repeat 0 < 1", nil},
		"page_size 0":        {func(g *ppl.Geometry) { g.PageSize = 0 }, "page_size 0 < 1 in page-table mode", nil},
		"quant_bit 2":        {func(g *ppl.Geometry) { g.QuantBits = 2 }, "quant_bit 2, want 0, 8 or 4", nil},
		"group 6":            {func(g *ppl.Geometry) { g.QuantGroup = 6 }, "quant_group 6 is not a power of two", quant.ErrInvalidConfig},
		"group 32 > Dh":      {func(g *ppl.Geometry) { g.QuantGroup = 32 }, "quant_group 32 does not divide head_dim 16", quant.ErrInvalidConfig},
		"bf16 scales":        {func(g *ppl.Geometry) { g.ScaleDType = layout.BF16 }, "scale dtype bf16", quant.ErrInvalidConfig},
		"dtype when int8":    {func(g *ppl.Geometry) { g.DType = layout.F16 }, "dtype f16 given for an int8 cache", nil},
		"fp8 unquantised":    {func(g *ppl.Geometry) { g.QuantBits, g.ScaleDType, g.DType = 0, 0, layout.E4M3 }, "unquantised cache dtype e4m3", nil},
		"scale unquantised":  {func(g *ppl.Geometry) { g.QuantBits, g.DType = 0, layout.F16 }, "scale dtype f16 given for an unquantised cache", nil},
		"int4 odd head dim":  {func(g *ppl.Geometry) { g.QuantBits, g.QuantGroup, g.HeadDim = 4, 1, 15 }, "head_dim 15 is odd", quant.ErrInvalidConfig},
		"too large":          {func(g *ppl.Geometry) { g.MaxTokens = 1 << 40 }, "exceeds 1099511627776 elements", nil},
		"overflowing dims":   {func(g *ppl.Geometry) { g.NumLayers, g.NumKVHeads, g.MaxTokens = 1<<62, 1<<62, 4 }, "exceeds", nil},
		"page_size 0 mode 0": {func(g *ppl.Geometry) { g.Mode, g.PageSize = ppl.ModeOffset, 0 }, "", nil},
	}
	for name, tc := range tests {
		g := ok
		tc.edit(&g)
		err := g.Validate()
		if tc.want == "" {
			assert.NoError(t, err, name)
			continue
		}
		if assert.Error(t, err, name) {
			assert.ErrorIs(t, err, ppl.ErrInvalidGeometry, name)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is, name)
			}
			assert.Contains(t, err.Error(), tc.want, name)
		}
	}
}

// TestFlashInferViewLayout2IsNHD: a layer of layout 2 is FlashInfer's split
// NHD cache with MaxT/N pages; the view's strides equal layout.Paged's.
func TestFlashInferViewLayout2IsNHD(t *testing.T) {
	g := ppl.Geometry{Layout: ppl.LayoutL2THD, NumLayers: 3, MaxTokens: 20, NumKVHeads: 2, HeadDim: 8, NumRepeat: 1, DType: layout.F16}
	v, err := g.FlashInferView(1, 4)
	require.NoError(t, err)
	pg := layout.Paged{Layout: layout.NHD, Form: layout.Split, DType: layout.F16, NumPages: 5, PageSize: 4, NumKVHeads: 2, HeadDim: 8}
	assert.Equal(t, ppl.FlashInferView{StridePage: pg.StridePage(), StrideN: pg.StrideN(), StrideH: pg.StrideH(),
		KData: 2 * 20 * 16, VData: 3 * 20 * 16, NumPages: 5}, v)
	// Every element of the view is the PPL element of the same slot.
	for p := 0; p < 5; p++ {
		for e := 0; e < 4; e++ {
			for h := 0; h < 2; h++ {
				require.Equal(t, g.Offset(1, 0, p*4+e, h, 3), v.KData+pg.KOffset(p, e, h, 3))
				require.Equal(t, g.Offset(1, 1, p*4+e, h, 3), v.VData+pg.KOffset(p, e, h, 3))
			}
		}
	}

	// Other layouts are strided views; the same identity holds with their strides.
	for _, l := range allLayouts {
		g.Layout = l
		v, err := g.FlashInferView(2, 4)
		require.NoError(t, err)
		for tok := 0; tok < 20; tok++ {
			p, e := tok/4, tok%4
			assert.Equal(t, g.Offset(2, 0, tok, 1, 5), v.KData+int64(p)*v.StridePage+int64(e)*v.StrideN+v.StrideH+5, "layout %v K slot %d", l, tok)
			assert.Equal(t, g.Offset(2, 1, tok, 1, 5), v.VData+int64(p)*v.StridePage+int64(e)*v.StrideN+v.StrideH+5, "layout %v V slot %d", l, tok)
		}
	}

	_, err = g.FlashInferView(3, 4)
	assert.ErrorIs(t, err, ppl.ErrOutOfRange)
	big := ppl.Geometry{Layout: ppl.LayoutTL2HD, NumLayers: 64, MaxTokens: 1 << 12, NumKVHeads: 64, HeadDim: 128, NumRepeat: 1, DType: layout.F16}
	_, err = big.FlashInferView(0, 8192)
	assert.ErrorIs(t, err, ppl.ErrOutOfRange, "stride_page 8192*2^20 does not fit uint32")
	q := g
	q.DType, q.QuantBits, q.QuantGroup, q.ScaleDType = 0, 8, 8, layout.F16
	_, err = q.FlashInferView(0, 4)
	assert.ErrorIs(t, err, ppl.ErrQuantised)

	c, err := ppl.NewCache(q)
	require.NoError(t, err)
	_, err = c.FlashInferCache(0, 4)
	assert.True(t, errors.Is(err, ppl.ErrQuantised))
	g.Layout = ppl.LayoutLT2HD
	c, err = ppl.NewCache(g)
	require.NoError(t, err)
	_, err = c.FlashInferCache(0, 4)
	assert.ErrorIs(t, err, ppl.ErrInvalidGeometry)
	c.Data = c.Data[1:]
	_, err = c.FlashInferCache(0, 4)
	assert.ErrorIs(t, err, kernels.ErrInvalidCache)
}
