package mla_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/mla"
)

func TestViews(t *testing.T) {
	fused, err := mla.NewCache(mla.Config{Form: layout.Fused, DType: layout.BF16, NumPages: 3, PageSize: 2})
	require.NoError(t, err)
	require.Equal(t, 512, fused.Geometry.HeadDimCKV, "default head dims")
	require.Equal(t, 64, fused.Geometry.HeadDimKPE)
	require.Len(t, fused.Data, 3*2*576*2, "one [3, 2, 576] bf16 tensor")

	//            view                    base  stride_n  stride_page  offset(2, 1, 7)
	for _, tc := range []struct {
		name                  string
		v                     mla.View
		base, strideN, stride int64
		off                   int64
	}{
		{"fused ckv", mla.CKV(&fused), 0, 576, 1152, 2*1152 + 576 + 7},
		{"fused kpe", mla.KPE(&fused), 512, 576, 1152, 512 + 2*1152 + 576 + 7},
	} {
		assert.Equal(t, tc.base, tc.v.Base, tc.name)
		assert.Equal(t, tc.strideN, tc.v.StrideN, tc.name)
		assert.Equal(t, tc.stride, tc.v.StridePage(), tc.name)
		assert.Equal(t, tc.off, tc.v.Offset(2, 1, 7), tc.name)
	}
	assert.Equal(t, fused.Geometry.CKVOffset(2, 1, 7), mla.CKV(&fused).Offset(2, 1, 7))
	assert.Equal(t, fused.Geometry.KPEOffset(2, 1, 7), mla.KPE(&fused).Offset(2, 1, 7))

	split, err := mla.NewCache(mla.Config{Form: layout.Split, DType: layout.BF16, NumPages: 3, PageSize: 2})
	require.NoError(t, err)
	assert.Equal(t, int64(2*1024+512+7), mla.CKV(&split).Offset(2, 1, 7))
	assert.Equal(t, int64(2*128+64+7), mla.KPE(&split).Offset(2, 1, 7))

	// Row aliases the cache: writing it writes the cache.
	row := mla.KPE(&fused).Row(1, 0)
	require.Len(t, row, 64*2)
	row[0] = 0xab
	assert.Equal(t, byte(0xab), fused.Data[(1*2*576+512)*2])
}

func randomCache(t *testing.T, r *rand.Rand, cfg mla.Config) kernels.MLACache {
	c, err := mla.NewCache(cfg)
	require.NoError(t, err)
	for _, b := range [][]byte{c.Data, c.CKV, c.KPE} {
		for i := range b {
			b[i] = byte(r.Uint32())
		}
	}
	return c
}

// Fused -> split -> fused is the identity, and every row reads the same
// through both forms.
func TestCopyCacheFusedSplitRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []layout.DType{layout.F16, layout.E4M3, layout.F32} {
		cfg := mla.Config{Form: layout.Fused, DType: dt, NumPages: 4, PageSize: 3, HeadDimCKV: 16, HeadDimKPE: 8}
		fused := randomCache(t, r, cfg)
		cfg.Form = layout.Split
		split, err := mla.NewCache(cfg)
		require.NoError(t, err)
		require.NoError(t, mla.CopyCache(&split, &fused))
		for page := range 4 {
			for entry := range 3 {
				require.Equal(t, mla.CKV(&fused).Row(page, entry), mla.CKV(&split).Row(page, entry))
				require.Equal(t, mla.KPE(&fused).Row(page, entry), mla.KPE(&split).Row(page, entry))
			}
		}
		back, err := mla.NewCache(mla.Config{Form: layout.Fused, DType: dt, NumPages: 4, PageSize: 3, HeadDimCKV: 16, HeadDimKPE: 8})
		require.NoError(t, err)
		require.NoError(t, mla.CopyCache(&back, &split))
		require.Equal(t, fused.Data, back.Data, "%v: fused -> split -> fused", dt)
	}
}

func TestCopyCacheRejectsOtherGeometry(t *testing.T) {
	a, err := mla.NewCache(mla.Config{Form: layout.Fused, DType: layout.F16, NumPages: 2, PageSize: 4})
	require.NoError(t, err)
	b, err := mla.NewCache(mla.Config{Form: layout.Split, DType: layout.F16, NumPages: 3, PageSize: 4})
	require.NoError(t, err)
	b.CKV[0] = 1
	require.ErrorIs(t, mla.CopyCache(&a, &b), mla.ErrGeometry)
	assert.Equal(t, make([]byte, len(a.Data)), a.Data)
	b.KPE = b.KPE[:3]
	require.ErrorIs(t, mla.CopyCache(&a, &b), kernels.ErrInvalidCache)
}

// refMLA is the reference's view of a cache.
func refMLA(c *kernels.MLACache) reference.MLACache {
	g := c.Geometry
	return reference.MLACache{Form: g.Form, DType: g.DType, PageSize: g.PageSize, DCKV: g.HeadDimCKV, DKPE: g.HeadDimKPE, Data: c.Data, CKV: c.CKV, KPE: c.KPE}
}

// An append step planned from append_indptr/seq_lens and run on the CPU
// backend equals the reference, fused and split, with and without
// kv_last_page_len.
func TestAppendPlanMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const N, P = 4, 12
	// Post-append: request 0 has 6 tokens (pages 7, 2), request 1 none,
	// request 2 has 9 (pages 0, 11, 5); they append 3, 0 and 5 rows.
	kvIndptr, kvPageIndices, last := []int32{0, 2, 2, 5}, []int32{7, 2, 0, 11, 5}, []int32{2, 0, 1}
	appendIndptr, seqLens := []int32{0, 3, 3, 8}, []int32{6, 0, 9}
	var plan mla.AppendPlan
	require.NoError(t, plan.Build(appendIndptr, seqLens))
	assert.Equal(t, []int32{0, 0, 0, 2, 2, 2, 2, 2}, plan.BatchIndices)
	assert.Equal(t, []int32{3, 4, 5, 4, 5, 6, 7, 8}, plan.Positions)
	be := cpu.New(cpu.Config{})
	for _, form := range []layout.TensorForm{layout.Fused, layout.Split} {
		for _, withLast := range []bool{true, false} {
			cache := randomCache(t, r, mla.Config{Form: form, DType: layout.BF16, NumPages: P, PageSize: N})
			want := kernels.MLACache{Geometry: cache.Geometry, Data: append([]byte(nil), cache.Data...),
				CKV: append([]byte(nil), cache.CKV...), KPE: append([]byte(nil), cache.KPE...)}
			ckv, kpe := kernels.NewTensor(layout.BF16, 8, 512), kernels.NewTensor(layout.BF16, 8, 64)
			for _, b := range [][]byte{ckv.Data, kpe.Data} {
				for i := range b {
					b[i] = byte(r.Uint32())
				}
			}
			in := mla.AppendInput{AppendCKV: ckv, AppendKPE: kpe, Cache: &cache, KVIndptr: kvIndptr, KVPageIndices: kvPageIndices}
			if withLast {
				in.KVLastPageLen = last
			}
			require.NoError(t, plan.Run(be, in))
			reference.MLAAppend(refMLA(&want), reference.MLAAppendInput{CKV: ckv.Data, KPE: kpe.Data, BatchIndices: plan.BatchIndices,
				Positions: plan.Positions, KVIndptr: kvIndptr, KVPageIndices: kvPageIndices})
			require.Equal(t, want.Data, cache.Data, "%v last=%v", form, withLast)
			require.Equal(t, want.CKV, cache.CKV, "%v last=%v", form, withLast)
			require.Equal(t, want.KPE, cache.KPE, "%v last=%v", form, withLast)
			// Row 3 (request 2, position 4) is page 11, entry 0.
			assert.Equal(t, ckv.Data[3*1024:4*1024], mla.CKV(&cache).Row(11, 0))
			assert.Equal(t, kpe.Data[3*128:4*128], mla.KPE(&cache).Row(11, 0))
		}
	}
}

func TestAppendPlanMismatchWritesNothing(t *testing.T) {
	cache, err := mla.NewCache(mla.Config{Form: layout.Split, DType: layout.F16, NumPages: 4, PageSize: 4, HeadDimCKV: 8, HeadDimKPE: 4})
	require.NoError(t, err)
	var plan mla.AppendPlan
	require.NoError(t, plan.Build([]int32{0, 2}, []int32{6}))
	ckv, kpe := kernels.NewTensor(layout.F16, 2, 8), kernels.NewTensor(layout.F16, 2, 4)
	ckv.Data[0], kpe.Data[0] = 1, 1
	be := cpu.New(cpu.Config{})
	for name, in := range map[string]mla.AppendInput{
		"seq_len differs":           {KVIndptr: []int32{0, 2}, KVPageIndices: []int32{1, 2}, KVLastPageLen: []int32{3}},
		"pages differ without last": {KVIndptr: []int32{0, 1}, KVPageIndices: []int32{1}},
		"batch differs":             {KVIndptr: []int32{0, 1, 2}, KVPageIndices: []int32{1, 2}},
	} {
		in.AppendCKV, in.AppendKPE, in.Cache = ckv, kpe, &cache
		err := plan.Run(be, in)
		require.ErrorIs(t, err, mla.ErrPlanMismatch, name)
		t.Logf("%s: %v", name, err)
	}
	// Passed through from the backend's validation.
	err = plan.Run(be, mla.AppendInput{AppendCKV: ckv, AppendKPE: kpe, Cache: &cache, KVIndptr: []int32{0, 2}, KVPageIndices: []int32{1, 4}})
	require.ErrorIs(t, err, kernels.ErrIndexOutOfRange)
	assert.Equal(t, make([]byte, len(cache.CKV)), cache.CKV)
	assert.Equal(t, make([]byte, len(cache.KPE)), cache.KPE)
}

func TestAppendStepDoesNotAllocate(t *testing.T) {
	cache, err := mla.NewCache(mla.Config{Form: layout.Fused, DType: layout.BF16, NumPages: 8, PageSize: 16})
	require.NoError(t, err)
	ckv, kpe := kernels.NewTensor(layout.BF16, 2, 512), kernels.NewTensor(layout.BF16, 2, 64)
	be := cpu.New(cpu.Config{Workers: 1})
	var plan mla.AppendPlan
	indptr, seqLens := []int32{0, 1, 2}, []int32{17, 3}
	in := mla.AppendInput{AppendCKV: ckv, AppendKPE: kpe, Cache: &cache, KVIndptr: []int32{0, 2, 3}, KVPageIndices: []int32{4, 1, 6}, KVLastPageLen: []int32{1, 3}}
	step := func() {
		if err := plan.Build(indptr, seqLens); err != nil {
			t.Fatal(err)
		}
		if err := plan.Run(be, in); err != nil {
			t.Fatal(err)
		}
	}
	step()
	assert.Zero(t, testing.AllocsPerRun(50, step))
}

// The worked MLA example of flashinfer-semantics §5 (dims 4+2, sm_scale
// 0.5, page_size 2, kv_indices [1, 0], kv_len 3): tokens t0 -> (page 1,
// entry 0), t1 -> (1, 1), t2 -> (0, 0).
func TestDecodeWorkedExample(t *testing.T) {
	ckvRows := [][]float32{{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}}
	kpeRows := [][]float32{{1, 0}, {0, 1}, {1, 1}}
	slots := [][2]int{{1, 0}, {1, 1}, {0, 0}}
	var outs [][]float32
	for _, form := range []layout.TensorForm{layout.Fused, layout.Split} {
		cache, err := mla.NewCache(mla.Config{Form: form, DType: layout.F32, NumPages: 2, PageSize: 2, HeadDimCKV: 4, HeadDimKPE: 2})
		require.NoError(t, err)
		for tok, s := range slots {
			layout.StoreRowF32(mla.CKV(&cache).Row(s[0], s[1]), layout.F32, ckvRows[tok])
			layout.StoreRowF32(mla.KPE(&cache).Row(s[0], s[1]), layout.F32, kpeRows[tok])
		}
		var d mla.DecodePlan
		require.NoError(t, d.Plan([]int32{0, 2}, []int32{1, 0}, []int32{3}, 2, 0.5))
		in := mla.DecodeInput{
			QNope: kernels.TensorFromF32(layout.F32, []float32{1, 0, 0, 0, 0, 0, 2, 0}, 1, 2, 4),
			QPE:   kernels.TensorFromF32(layout.F32, []float32{0, 1, 1, 0}, 1, 2, 2),
			Cache: &cache,
			O:     kernels.NewTensor(layout.F32, 1, 2, 4),
			LSE:   make([]float32, 2),
		}
		require.NoError(t, d.Run(cpu.New(cpu.Config{}), in))
		o := in.O.F32()
		want := []float64{1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0.231224, 0.140244, 0.628532, 0}
		for i := range want {
			assert.InDelta(t, want[i], o[i], 2e-6, "%v o[%d]", form, i)
		}
		assert.InDelta(t, (0.5+math.Log(3))*math.Log2E, in.LSE[0], 2e-6, "%v lse head 0", form)
		assert.InDelta(t, 2.833985, in.LSE[1], 2e-6, "%v lse head 1", form)
		outs = append(outs, o)
	}
	assert.Equal(t, outs[0], outs[1], "fused and split decode alike")
}

func TestDecodePlanRejects(t *testing.T) {
	var d mla.DecodePlan
	require.NoError(t, d.Plan([]int32{0, 1}, []int32{3}, []int32{2}, 4, 0.1))
	for name, f := range map[string]func() error{
		"kv_len length":   func() error { return d.Plan([]int32{0, 1}, []int32{3}, []int32{2, 2}, 4, 0.1) },
		"indptr past end": func() error { return d.Plan([]int32{0, 2}, []int32{3}, []int32{2}, 4, 0.1) },
		"zero heads":      func() error { return d.Plan([]int32{0, 1}, []int32{3}, []int32{2}, 0, 0.1) },
		"NaN scale":       func() error { return d.Plan([]int32{0, 1}, []int32{3}, []int32{2}, 4, math.NaN()) },
		"zero scale":      func() error { return d.Plan([]int32{0, 1}, []int32{3}, []int32{2}, 4, 0) },
		"negative kv_len": func() error { return d.Plan([]int32{0, 1}, []int32{3}, []int32{-1}, 4, 0.1) },
		"empty kv_indptr": func() error { return d.Plan(nil, nil, nil, 4, 0.1) },
	} {
		require.ErrorIs(t, f(), mla.ErrBadDecodePlan, name)
	}
	assert.Equal(t, []int32{3}, d.KVPageIndices, "a failed Plan keeps the previous plan")
	assert.InDelta(t, 1/math.Sqrt(192), mla.SMScale(128, 64), 1e-15)
}
