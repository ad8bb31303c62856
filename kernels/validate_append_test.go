package kernels_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/ragged"
)

// validAppend is the worked append of flashinfer-semantics §2.3 (page_size 2,
// kv_indptr [0,2,4], kv_indices [3,0,2,1], kv_last_page_len [2,2]; rows
// (b, pos) = (0,3), (1,2), (1,3)) on an HND split f16 cache, H=2, D=4.
func validAppend(t *testing.T) kernels.AppendParams {
	t.Helper()
	cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.HND, Form: layout.Split, DType: layout.F16, NumPages: 4, PageSize: 2, NumKVHeads: 2, HeadDim: 4})
	require.NoError(t, err)
	p := kernels.AppendParams{
		AppendKey:    kernels.NewTensor(layout.F16, 3, 2, 4),
		AppendValue:  kernels.NewTensor(layout.F16, 3, 2, 4),
		BatchIndices: []int32{0, 1, 1},
		Positions:    []int32{3, 2, 3},
		Cache:        cache,
		Table:        kernels.PageTable{KVIndptr: []int32{0, 2, 4}, KVPageIndices: []int32{3, 0, 2, 1}, KVLastPageLen: []int32{2, 2}},
	}
	require.NoError(t, p.Validate())
	return p
}

// Each row breaks one rule; the error must wrap the sentinel and name the
// offending value (and index where there is one).
func TestAppendValidateNamesTheBadValue(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(p *kernels.AppendParams)
		want error
		msg  []string // substrings of the error
	}{
		{"position past seq_len", func(p *kernels.AppendParams) { p.Positions[2] = 4 }, kernels.ErrIndexOutOfRange,
			[]string{"positions[2] = 4", "seq_len 4", "request 1"}},
		{"negative position", func(p *kernels.AppendParams) { p.Positions[0] = -1 }, kernels.ErrIndexOutOfRange, []string{"positions[0] = -1"}},
		{"batch index past B", func(p *kernels.AppendParams) { p.BatchIndices[1] = 2 }, kernels.ErrIndexOutOfRange,
			[]string{"batch_indices[1] = 2", "batch 2"}},
		{"page id past the pool", func(p *kernels.AppendParams) { p.Table.KVPageIndices[3] = 4 }, kernels.ErrIndexOutOfRange,
			[]string{"kv_indices[3] = 4", "outside the pool [0, 4)"}},
		{"negative page id", func(p *kernels.AppendParams) { p.Table.KVPageIndices[0] = -2 }, kernels.ErrIndexOutOfRange, []string{"kv_indices[0] = -2"}},
		{"last_page_len above page_size", func(p *kernels.AppendParams) { p.Table.KVLastPageLen[1] = 3 }, kernels.ErrInvalidPageTable,
			[]string{"kv_last_page_len[1] = 3", "want 1..2 (page_size)"}},
		{"last_page_len 0 with pages", func(p *kernels.AppendParams) { p.Table.KVLastPageLen[0] = 0 }, kernels.ErrInvalidPageTable,
			[]string{"kv_last_page_len[0] = 0"}},
		{"no pages but last_page_len", func(p *kernels.AppendParams) {
			p.Table.KVIndptr = []int32{0, 2, 2, 4}
			p.Table.KVLastPageLen = []int32{2, 1, 2}
		}, kernels.ErrInvalidPageTable, []string{"request 1 has 0 pages but kv_last_page_len[1] = 1, want 0"}},
		{"kv_indptr decreasing", func(p *kernels.AppendParams) { p.Table.KVIndptr[1] = 5 }, kernels.ErrInvalidPageTable,
			[]string{"decreases at request 1", "kv_indptr[1] = 5 > kv_indptr[2] = 4"}},
		{"kv_indptr[0] != 0", func(p *kernels.AppendParams) { p.Table.KVIndptr[0] = 1 }, kernels.ErrInvalidPageTable, []string{"kv_indptr[0] = 1"}},
		{"kv_indices too short", func(p *kernels.AppendParams) { p.Table.KVPageIndices = p.Table.KVPageIndices[:3] }, kernels.ErrInvalidPageTable,
			[]string{"kv_indptr[2] = 4", "kv_indices has length 3"}},
		{"kv_last_page_len length", func(p *kernels.AppendParams) { p.Table.KVLastPageLen = []int32{2} }, kernels.ErrInvalidPageTable,
			[]string{"kv_last_page_len has length 1"}},
		{"empty kv_indptr", func(p *kernels.AppendParams) { p.Table = kernels.PageTable{} }, kernels.ErrInvalidPageTable, []string{"kv_indptr is empty"}},
		{"positions length", func(p *kernels.AppendParams) { p.Positions = p.Positions[:2] }, kernels.ErrInvalidTensor,
			[]string{"batch_indices has 3 entries, positions 2"}},
		{"append_key rows", func(p *kernels.AppendParams) { p.AppendKey = kernels.NewTensor(layout.F16, 2, 2, 4) }, kernels.ErrInvalidTensor,
			[]string{"append_key has shape [2 2 4], want [3 2 4]"}},
		{"append_value head_dim", func(p *kernels.AppendParams) { p.AppendValue = kernels.NewTensor(layout.F16, 3, 2, 8) }, kernels.ErrInvalidTensor,
			[]string{"append_value has shape [3 2 8], want [3 2 4]"}},
		{"append_key bytes", func(p *kernels.AppendParams) { p.AppendKey.Data = p.AppendKey.Data[:10] }, kernels.ErrInvalidTensor,
			[]string{"needs 48 bytes, has 10"}},
		{"bf16 rows into f16", func(p *kernels.AppendParams) {
			p.AppendKey.DType, p.AppendValue.DType = layout.BF16, layout.BF16
		}, kernels.ErrInvalidTensor, []string{"bf16 into a f16 cache"}},
		{"key/value dtypes differ", func(p *kernels.AppendParams) { p.AppendValue.DType = layout.BF16 }, kernels.ErrInvalidTensor,
			[]string{"append_key is f16 but append_value is bf16"}},
		{"scale on a copy", func(p *kernels.AppendParams) { p.VScale = 2 }, kernels.ErrInvalidScale, []string{"v_scale = 2"}},
		{"cache buffer length", func(p *kernels.AppendParams) { p.Cache.K = p.Cache.K[:8] }, kernels.ErrInvalidCache,
			[]string{"needs 128 bytes in each of K and V, has 8 and 128"}},
		{"split cache with Data", func(p *kernels.AppendParams) { p.Cache.Data = make([]byte, 1) }, kernels.ErrInvalidCache, []string{"Data set"}},
		{"cache dtype", func(p *kernels.AppendParams) { p.Cache.Geometry.DType = layout.I8 }, kernels.ErrInvalidCache, []string{"i8 is not a float dtype"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := validAppend(t)
			tc.mut(&p)
			err := p.Validate()
			require.ErrorIs(t, err, tc.want)
			for _, m := range tc.msg {
				assert.Contains(t, err.Error(), m)
			}
		})
	}
}

func TestAppendValidateConversions(t *testing.T) {
	for _, tc := range []struct {
		src, cache     layout.DType
		kScale, vScale float64
		want           error
	}{
		{layout.F16, layout.E4M3, 0.5, 0, nil},
		{layout.F32, layout.E5M2, 0, 1e-3, nil},
		{layout.BF16, layout.E4M3, 1, 1, nil},
		{layout.E4M3, layout.F16, 0, 0, kernels.ErrInvalidTensor}, // no widening appends
		{layout.E5M2, layout.E4M3, 0, 0, kernels.ErrInvalidTensor},
		{layout.F16, layout.BF16, 0, 0, kernels.ErrInvalidTensor},
		{layout.F16, layout.E4M3, -1, 0, kernels.ErrInvalidScale},
		{layout.F16, layout.E4M3, 0, math.NaN(), kernels.ErrInvalidScale},
		{layout.F16, layout.E4M3, math.Inf(1), 0, kernels.ErrInvalidScale},
		{layout.F16, layout.E4M3, 1e-50, 0, kernels.ErrInvalidScale}, // 0 in float32
		{layout.F16, layout.E4M3, 1e39, 0, kernels.ErrInvalidScale},  // inf in float32
	} {
		p := validAppend(t)
		g := p.Cache.Geometry
		g.DType = tc.cache
		var err error
		p.Cache, err = kernels.NewPagedKVCache(g)
		require.NoError(t, err)
		p.AppendKey, p.AppendValue = kernels.NewTensor(tc.src, 3, 2, 4), kernels.NewTensor(tc.src, 3, 2, 4)
		p.KScale, p.VScale = tc.kScale, tc.vScale
		err = p.Validate()
		if tc.want == nil {
			assert.NoError(t, err, "%v -> %v", tc.src, tc.cache)
			assert.True(t, kernels.AppendConverts(tc.src, tc.cache))
			continue
		}
		assert.ErrorIs(t, err, tc.want, "%v -> %v scales %v %v", tc.src, tc.cache, tc.kScale, tc.vScale)
	}
	assert.Equal(t, float32(1), kernels.EffectiveScale(0))
	assert.Equal(t, float32(0.25), kernels.EffectiveScale(0.25))
}

func TestAppendValidateEmpty(t *testing.T) {
	p := validAppend(t)
	p.BatchIndices, p.Positions = nil, nil
	p.AppendKey, p.AppendValue = kernels.NewTensor(layout.F16, 0, 2, 4), kernels.NewTensor(layout.F16, 0, 2, 4)
	assert.NoError(t, p.Validate(), "nnz = 0")
	p.Table = kernels.PageTable{KVIndptr: []int32{0}}
	assert.NoError(t, p.Validate(), "batch of 0 requests")
}

func validMLAAppend(t *testing.T) kernels.MLAAppendParams {
	t.Helper()
	cache, err := kernels.NewMLACache(layout.MLA{Form: layout.Fused, DType: layout.BF16, NumPages: 4, PageSize: 2, HeadDimCKV: 8, HeadDimKPE: 2})
	require.NoError(t, err)
	p := kernels.MLAAppendParams{
		AppendCKV: kernels.NewTensor(layout.BF16, 3, 8), AppendKPE: kernels.NewTensor(layout.BF16, 3, 2),
		BatchIndices: []int32{0, 1, 1}, Positions: []int32{3, 2, 3}, Cache: cache,
		KVIndptr: []int32{0, 2, 4}, KVPageIndices: []int32{3, 0, 2, 1}, KVLastPageLen: []int32{2, 2},
	}
	require.NoError(t, p.Validate())
	return p
}

func TestMLAAppendValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(p *kernels.MLAAppendParams)
		want error
		msg  string
	}{
		{"position past seq_len", func(p *kernels.MLAAppendParams) { p.KVLastPageLen[0] = 1 }, kernels.ErrIndexOutOfRange,
			"positions[0] = 3 outside [0, seq_len 3) of request 0"},
		{"position past capacity", func(p *kernels.MLAAppendParams) { p.KVLastPageLen, p.Positions[2] = nil, 4 }, kernels.ErrIndexOutOfRange,
			"positions[2] = 4 outside [0, reserved pages*page_size 4) of request 1"},
		{"batch index", func(p *kernels.MLAAppendParams) { p.BatchIndices[0] = -1 }, kernels.ErrIndexOutOfRange, "batch_indices[0] = -1"},
		{"page id", func(p *kernels.MLAAppendParams) { p.KVPageIndices[1] = 7 }, kernels.ErrIndexOutOfRange, "kv_indices[1] = 7"},
		{"last_page_len length", func(p *kernels.MLAAppendParams) { p.KVLastPageLen = []int32{2} }, kernels.ErrInvalidPageTable,
			"kv_last_page_len has length 1"},
		{"ckv width", func(p *kernels.MLAAppendParams) { p.AppendCKV = kernels.NewTensor(layout.BF16, 3, 10) }, kernels.ErrInvalidTensor,
			"append_ckv has shape [3 10], want [3 8]"},
		{"kpe dtype", func(p *kernels.MLAAppendParams) { p.AppendKPE.DType = layout.F16 }, kernels.ErrInvalidTensor, "append_kpe f16"},
		{"fused cache length", func(p *kernels.MLAAppendParams) { p.Cache.Data = p.Cache.Data[:4] }, kernels.ErrInvalidCache,
			"needs 160 bytes in Data, has 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := validMLAAppend(t)
			tc.mut(&p)
			err := p.Validate()
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	p := validMLAAppend(t)
	p.KVLastPageLen = nil
	assert.NoError(t, p.Validate(), "kv_last_page_len is optional")
}

func TestCPUTensors(t *testing.T) {
	x := kernels.NewTensor(layout.BF16, 2, 3)
	assert.Equal(t, int64(6), x.NumElements())
	assert.Len(t, x.Data, 12)
	assert.NoError(t, x.CheckShape("x", 2, 3))
	assert.ErrorIs(t, x.CheckShape("x", 3, 2), kernels.ErrInvalidTensor)
	assert.ErrorIs(t, x.CheckShape("x", 6), kernels.ErrInvalidTensor)
	assert.Panics(t, func() { kernels.NewTensor(layout.F16, 2, -1) })
	assert.Panics(t, func() { kernels.NewTensor(layout.InvalidDType, 2) })
	assert.Equal(t, int64(-1), kernels.Tensor{Shape: []int{4, -2}}.NumElements())
	// a product that wraps int64 (to 0 here) is too large, not empty
	assert.Equal(t, int64(-1), kernels.Tensor{Shape: []int{1 << 20, 1 << 20, 1 << 24}}.NumElements())
	assert.Equal(t, int64(layout.MaxElements), kernels.Tensor{Shape: []int{1 << 20, 1 << 20}}.NumElements())
	assert.Equal(t, int64(0), kernels.Tensor{Shape: []int{0, 1 << 62}}.NumElements())

	y := kernels.TensorFromF32(layout.F16, []float32{1, -2.5, 65504, 1e-8}, 4)
	assert.Equal(t, []float32{1, -2.5, 65504, 0}, y.F32())
	assert.Panics(t, func() { kernels.TensorFromF32(layout.F16, []float32{1}, 2) })
	assert.ErrorIs(t, kernels.Tensor{DType: layout.F32, Shape: []int{2}, Data: make([]byte, 7)}.Validate(), kernels.ErrInvalidTensor)

	_, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.NHD, DType: layout.F16, NumPages: 1, PageSize: 0, NumKVHeads: 1, HeadDim: 1})
	assert.ErrorIs(t, err, kernels.ErrInvalidCache)
	c, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.E5M2, NumPages: 3, PageSize: 2, NumKVHeads: 2, HeadDim: 4})
	require.NoError(t, err)
	assert.Len(t, c.Data, 3*2*2*2*4)
	assert.Nil(t, c.K)
	m, err := kernels.NewMLACache(layout.MLA{Form: layout.Split, DType: layout.F32, NumPages: 2, PageSize: 3, HeadDimCKV: 4, HeadDimKPE: 2})
	require.NoError(t, err)
	assert.Len(t, m.CKV, 2*3*4*4)
	assert.Len(t, m.KPE, 2*3*2*4)
}

func TestPageTableLocate(t *testing.T) {
	// The page-layout figure: page_size 8.
	tbl := kernels.PageTable{KVIndptr: []int32{0, 3, 6, 8}, KVPageIndices: []int32{0, 5, 8, 1, 6, 7, 3, 4}, KVLastPageLen: []int32{6, 4, 7}}
	require.NoError(t, tbl.Validate(8, 9))
	assert.Equal(t, 3, tbl.BatchSize())
	assert.Equal(t, []int{22, 20, 15}, []int{tbl.SeqLen(0, 8), tbl.SeqLen(1, 8), tbl.SeqLen(2, 8)})
	for _, tc := range []struct{ b, pos, page, entry int }{
		{0, 0, 0, 0}, {0, 18, 8, 2}, {0, 21, 8, 5}, {1, 19, 7, 3}, {2, 12, 4, 4}, {2, 14, 4, 6},
	} {
		page, entry, err := tbl.Locate(tc.b, tc.pos, 8)
		require.NoError(t, err)
		assert.Equal(t, [2]int{tc.page, tc.entry}, [2]int{page, entry}, "request %d position %d", tc.b, tc.pos)
	}
	_, _, err := tbl.Locate(2, 15, 8)
	assert.ErrorIs(t, err, kernels.ErrIndexOutOfRange)
	_, _, err = tbl.Locate(3, 0, 8)
	assert.ErrorIs(t, err, kernels.ErrIndexOutOfRange)
	err = tbl.Validate(8, 8)
	assert.ErrorIs(t, err, kernels.ErrIndexOutOfRange, "page 8 is outside a pool of 8")
	assert.NotErrorIs(t, err, kernels.ErrInvalidPageTable, "a validation error wraps exactly one kernels sentinel")
	// The shared validator's sentinel is kernels', pagetable's and ragged's.
	err = tbl.Validate(4, 9)
	assert.ErrorIs(t, err, kernels.ErrInvalidPageTable)
	assert.ErrorIs(t, err, ragged.ErrBadPageTable)
	assert.ErrorIs(t, err, pagetable.ErrBadCSR)
	assert.ErrorContains(t, err, "kv_last_page_len[0] = 6, want 1..4 (page_size)")
}

func TestGatherToken(t *testing.T) {
	p := validAppend(t)
	vals := make([]float32, 3*2*4)
	for i := range vals {
		vals[i] = float32(i + 1)
	}
	p.AppendKey = kernels.TensorFromF32(layout.F16, vals, 3, 2, 4)
	// Write row 2 (request 1, position 3 -> page 1, entry 1) by hand.
	g := p.Cache.Geometry
	for h := range 2 {
		for d := range 4 {
			layout.StoreF32(g.DType, p.Cache.K, int(g.KOffset(1, 1, h, d)), vals[(2*2+h)*4+d])
			layout.StoreF32(g.DType, p.Cache.V, int(g.VOffset(1, 1, h, d)), -vals[(2*2+h)*4+d])
		}
	}
	k, v := make([]float32, 8), make([]float32, 8)
	require.NoError(t, p.Cache.GatherToken(k, v, &p.Table, 1, 3))
	assert.Equal(t, vals[16:24], k)
	for i := range v {
		assert.Equal(t, -vals[16+i], v[i])
	}
	assert.ErrorIs(t, p.Cache.GatherToken(k, v, &p.Table, 1, 4), kernels.ErrIndexOutOfRange)
}

func TestGatherMLAToken(t *testing.T) {
	c, err := kernels.NewMLACache(layout.MLA{Form: layout.Fused, DType: layout.F32, NumPages: 3, PageSize: 2, HeadDimCKV: 2, HeadDimKPE: 1})
	require.NoError(t, err)
	g := c.Geometry
	// Token 2 of request 0 (pages [2, 0]) is page 0, entry 0.
	layout.StoreF32(layout.F32, c.Data, int(g.CKVOffset(0, 0, 1)), 7)
	layout.StoreF32(layout.F32, c.Data, int(g.KPEOffset(0, 0, 0)), 9)
	ckv, kpe := make([]float32, 2), make([]float32, 1)
	require.NoError(t, c.GatherMLAToken(ckv, kpe, []int32{0, 2}, []int32{2, 0}, 0, 2))
	assert.Equal(t, []float32{0, 7}, ckv)
	assert.Equal(t, []float32{9}, kpe)
	assert.ErrorIs(t, c.GatherMLAToken(ckv, kpe, []int32{0, 2}, []int32{2, 0}, 0, 4), kernels.ErrIndexOutOfRange)
	assert.ErrorIs(t, c.GatherMLAToken(ckv, kpe, []int32{0, 2}, []int32{2, 0}, 1, 0), kernels.ErrIndexOutOfRange)
	assert.ErrorIs(t, c.GatherMLAToken(ckv, kpe, []int32{0, 2}, []int32{2, 3}, 0, 3), kernels.ErrIndexOutOfRange)
}

// A cascade level's page table is its groups as the batch, over the level's
// own arrays (no copy).
func TestCascadeLevelTable(t *testing.T) {
	lv := kernels.CascadeLevel{QOIndptr: []int32{0, 3}, KVIndptr: []int32{0, 2}, KVPageIndices: []int32{5, 1}, KVLastPageLen: []int32{3}}
	tbl := lv.Table()
	assert.Equal(t, kernels.PageTable{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{5, 1}, KVLastPageLen: []int32{3}}, tbl)
	tbl.KVPageIndices[0] = 7
	assert.Equal(t, int32(7), lv.KVPageIndices[0], "Table shares the level's arrays")
	assert.NoError(t, tbl.Validate(4, 8))
}
