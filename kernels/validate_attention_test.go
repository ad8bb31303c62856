package kernels

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// A small valid decode: 2 requests over a fused NHD f16 cache of 4 pages
// (page_size 2, 2 kv heads, head_dim 4), 4 query heads (GQA group 2).
func validDecodeParams(t *testing.T) *DecodeParams {
	cache, err := NewPagedKVCache(layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 4, PageSize: 2, NumKVHeads: 2, HeadDim: 4})
	require.NoError(t, err)
	return &DecodeParams{
		Q:               NewTensor(layout.BF16, 2, 4, 4),
		Cache:           cache,
		Table:           PageTable{KVIndptr: []int32{0, 2, 3}, KVPageIndices: []int32{3, 0, 2}, KVLastPageLen: []int32{1, 2}},
		AttentionParams: AttentionParams{NumQOHeads: 4, WindowLeft: -1},
		O:               NewTensor(layout.F32, 2, 4, 4),
		LSE:             make([]float32, 8),
	}
}

// Each case names the bad value; the error must wrap want and its message
// must contain every string of mention (the value, and the index when
// there is one).
func TestDecodeParamsValidate(t *testing.T) {
	require.NoError(t, validDecodeParams(t).Validate())
	tests := map[string]struct {
		mutate  func(p *DecodeParams)
		want    error
		mention []string
	}{
		"heads not divisible": {func(p *DecodeParams) {
			p.Q, p.O, p.NumQOHeads, p.LSE = NewTensor(layout.F16, 2, 3, 4), NewTensor(layout.F16, 2, 3, 4), 3, nil
		}, ErrInvalidAttention, []string{"num_qo_heads = 3", "num_kv_heads = 2"}},
		"num_qo_heads 0":         {func(p *DecodeParams) { p.NumQOHeads = 0 }, ErrInvalidAttention, []string{"num_qo_heads = 0", "4 heads"}},
		"head_dim mismatch":      {func(p *DecodeParams) { p.Q = NewTensor(layout.F16, 2, 4, 8) }, ErrInvalidTensor, []string{"head_dim 8", "head_dim 4"}},
		"sm_scale NaN":           {func(p *DecodeParams) { p.SMScale = math.NaN() }, ErrInvalidScale, []string{"sm_scale = NaN"}},
		"sm_scale overflows f32": {func(p *DecodeParams) { p.SMScale, p.KScale = 1e30, 1e30 }, ErrInvalidScale, []string{"sm_scale*k_scale"}},
		"v_scale -1":             {func(p *DecodeParams) { p.VScale = -1 }, ErrInvalidScale, []string{"v_scale = -1"}},
		"window -2":              {func(p *DecodeParams) { p.WindowLeft = -2 }, ErrInvalidAttention, []string{"window_left = -2"}},
		"soft cap -1":            {func(p *DecodeParams) { p.LogitsSoftCap = -1 }, ErrInvalidAttention, []string{"logits_soft_cap = -1"}},
		// 1e308 is a finite float64 but +Inf in the kernels' float32:
		// every logit became NaN and lse -inf (a crafted case file).
		"soft cap past f32":  {func(p *DecodeParams) { p.LogitsSoftCap = 1e308 }, ErrInvalidAttention, []string{"logits_soft_cap = 1e+308"}},
		"soft cap below f32": {func(p *DecodeParams) { p.LogitsSoftCap = 1e-300 }, ErrInvalidAttention, []string{"logits_soft_cap = 1e-300"}},
		"indptr vs q": {func(p *DecodeParams) {
			p.Q, p.O, p.LSE = NewTensor(layout.F16, 3, 4, 4), NewTensor(layout.F16, 3, 4, 4), nil
		}, ErrInvalidPageTable, []string{"length 3", "3 rows"}},
		"last_page_len 0": {func(p *DecodeParams) { p.Table.KVLastPageLen = []int32{0, 2} }, ErrInvalidPageTable, []string{"kv_last_page_len[0] = 0"}},
		"page id 4":       {func(p *DecodeParams) { p.Table.KVPageIndices = []int32{3, 4, 2} }, ErrIndexOutOfRange, []string{"kv_indices[1] = 4"}},
		"q fp8":           {func(p *DecodeParams) { p.Q = NewTensor(layout.E4M3, 2, 4, 4) }, ErrInvalidTensor, []string{"q is e4m3"}},
		"o dtype i32":     {func(p *DecodeParams) { p.O = NewTensor(layout.I32, 2, 4, 4) }, ErrInvalidTensor, []string{"o is i32"}},
		"lse length":      {func(p *DecodeParams) { p.LSE = make([]float32, 9) }, ErrInvalidTensor, []string{"9 values", "want 8"}},
		"cache bytes":     {func(p *DecodeParams) { p.Cache.Data = p.Cache.Data[:10] }, ErrInvalidCache, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := validDecodeParams(t)
			tc.mutate(p)
			err := p.Validate()
			require.ErrorIs(t, err, tc.want)
			for _, m := range tc.mention {
				require.Contains(t, err.Error(), m)
			}
		})
	}
}

func TestPrefillParamsValidate(t *testing.T) {
	valid := func() *PrefillParams {
		d := validDecodeParams(t)
		return &PrefillParams{Q: NewTensor(layout.F16, 5, 4, 4), QOIndptr: []int32{0, 2, 5}, Cache: d.Cache, Table: d.Table,
			Causal: true, AttentionParams: d.AttentionParams, O: NewTensor(layout.F16, 5, 4, 4)}
	}
	require.NoError(t, valid().Validate())
	tests := map[string]struct {
		qo      []int32
		mention []string
	}{
		"ends before q":           {[]int32{0, 2, 4}, []string{"qo_indptr[2] = 4", "5 rows"}},
		"batch differs":           {[]int32{0, 5}, []string{"qo_indptr has length 2", "kv_indptr has 3"}},
		"decreasing":              {[]int32{0, 3, 2}, []string{"request 1"}},
		"first not 0":             {[]int32{1, 2, 5}, []string{"qo_indptr[0] = 1"}},
		"more queries than kv ok": {nil, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := valid()
			if tc.qo == nil {
				// 5 queries over 3 and 2 keys: allowed (first rows see nothing).
				p.QOIndptr = []int32{0, 4, 5}
				require.NoError(t, p.Validate())
				return
			}
			p.QOIndptr = tc.qo
			err := p.Validate()
			require.ErrorIs(t, err, ErrInvalidAttention)
			for _, m := range tc.mention {
				require.Contains(t, err.Error(), m)
			}
		})
	}
}

func TestMLADecodeParamsValidate(t *testing.T) {
	valid := func() *MLADecodeParams {
		c, err := NewMLACache(layout.MLA{Form: layout.Fused, DType: layout.BF16, NumPages: 3, PageSize: 4, HeadDimCKV: 8, HeadDimKPE: 2})
		require.NoError(t, err)
		return &MLADecodeParams{QNope: NewTensor(layout.BF16, 2, 2, 8), QPE: NewTensor(layout.BF16, 2, 2, 2), Cache: c,
			KVIndptr: []int32{0, 2, 3}, KVPageIndices: []int32{2, 0, 1}, KVLen: []int32{5, 4}, NumHeads: 2, SMScale: 0.1,
			O: NewTensor(layout.F32, 2, 2, 8)}
	}
	require.NoError(t, valid().Validate())
	p := valid()
	p.KVLen = []int32{9, 4}
	err := p.Validate()
	require.ErrorIs(t, err, ErrInvalidPageTable)
	require.Contains(t, err.Error(), "kv_len[0] = 9")
	p = valid()
	p.KVLen = []int32{5, 3} // fewer tokens than pages: the tail is not read
	require.NoError(t, p.Validate())
	p = valid()
	p.SMScale = -0.1
	require.ErrorIs(t, p.Validate(), ErrInvalidScale)
}

func TestMergeParamsValidate(t *testing.T) {
	ms := &MergeStateParams{VA: NewTensor(layout.F16, 3, 2, 4), VB: NewTensor(layout.BF16, 3, 2, 4), SA: make([]float32, 6), SB: make([]float32, 6),
		V: NewTensor(layout.F32, 3, 2, 4), S: make([]float32, 6)}
	require.NoError(t, ms.Validate())
	ms.SB[5] = float32(math.Inf(1))
	err := ms.Validate()
	require.ErrorIs(t, err, ErrInvalidAttention)
	require.Contains(t, err.Error(), "s_b[5] (row 2, head 1) = +Inf")
	ms.SB[5] = float32(math.Inf(-1)) // the empty state is fine
	require.NoError(t, ms.Validate())

	mss := &MergeStatesParams{V: NewTensor(layout.F16, 2, 0, 3, 4), S: nil, OutV: NewTensor(layout.F16, 2, 3, 4), OutS: make([]float32, 6)}
	require.NoError(t, mss.Validate(), "zero states per row is allowed")
	mss.OutV = NewTensor(layout.F16, 2, 3, 5)
	require.ErrorIs(t, mss.Validate(), ErrInvalidTensor)
}

func TestEffectiveScales(t *testing.T) {
	a := AttentionParams{}
	require.Equal(t, 1/math.Sqrt(64), a.EffectiveSMScale(64))
	require.Equal(t, 1.0, a.EffectiveVScale())
	a = AttentionParams{SMScale: 0.5, KScale: 0.25, VScale: 3}
	require.Equal(t, 0.125, a.EffectiveSMScale(64))
	require.Equal(t, 3.0, a.EffectiveVScale())
}
