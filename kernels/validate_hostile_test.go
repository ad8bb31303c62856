package kernels_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// The audit's wrapping kv_indptr: MaxInt32 - (-5) is positive in int32, so
// a subtraction-based check accepted [0, MaxInt32, -5, 10] and sliced
// kv_indices with -5 for [0, MaxInt32, -5].
func TestPageTableValidateRejectsWrappingIndptr(t *testing.T) {
	ten := []int32{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}
	for _, tc := range []struct {
		name        string
		indptr, lpl []int32
		msg         string
	}{
		{"wrap to negative end", []int32{0, math.MaxInt32, -5}, []int32{1, 1}, "decreases at request 1: kv_indptr[1] = 2147483647 > kv_indptr[2] = -5"},
		{"wrap and recover", []int32{0, math.MaxInt32, -5, 10}, []int32{1, 1, 1}, "decreases at request 1"},
		{"MinInt32", []int32{0, math.MinInt32, 2}, []int32{1, 1}, "decreases at request 0"},
		{"MaxInt32 end", []int32{0, math.MaxInt32}, []int32{1}, "kv_indptr[1] = 2147483647 but kv_indices has length 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := kernels.PageTable{KVIndptr: tc.indptr, KVPageIndices: ten, KVLastPageLen: tc.lpl}
			err := table.Validate(1, 4) // page_size 1: no seq_len overflow first
			require.ErrorIs(t, err, kernels.ErrInvalidPageTable)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// A request longer than 2^31-1 tokens cannot be addressed by int32
// positions (FlashInfer's lengths): rejected, not wrapped.
func TestPageTableValidateRejectsSeqLenPastInt32(t *testing.T) {
	const pageSize = 1 << 20
	pages := int32(math.MaxInt32/pageSize + 2) // 2049 pages: 2048 full + 1 token = 2^31 + 1
	table := kernels.PageTable{KVIndptr: []int32{0, pages}, KVPageIndices: make([]int32, pages), KVLastPageLen: []int32{1}}
	err := table.Validate(pageSize, 1)
	require.ErrorIs(t, err, kernels.ErrInvalidPageTable)
	require.ErrorContains(t, err, "exceeds 2147483647")
	table.KVIndptr[1], table.KVPageIndices = pages-1, table.KVPageIndices[:pages-1]
	table.KVLastPageLen[0] = pageSize - 1
	require.NoError(t, table.Validate(pageSize, 1), "2047 full pages of 2^20 and 2^20-1 tokens = 2^31-1 fit")
}

// The audit's 1<<62 page size: the element count wrapped to 0 and the
// cache got 0-byte buffers.
func TestGeometryOverflowIsRejected(t *testing.T) {
	for _, g := range []layout.Paged{
		{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, PageSize: 1 << 62, NumKVHeads: 1, HeadDim: 4, NumPages: 8},
		{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, PageSize: 1 << 31, NumKVHeads: 1 << 31, HeadDim: 1 << 2, NumPages: 1},
		{Layout: layout.HND, Form: layout.Split, DType: layout.F32, PageSize: 16, NumKVHeads: 8, HeadDim: 128, NumPages: math.MaxInt},
	} {
		_, err := kernels.NewPagedKVCache(g)
		require.ErrorIs(t, err, kernels.ErrInvalidCache, "%+v", g)
		require.ErrorContains(t, err, "exceeds")
	}
	for _, g := range []layout.MLA{
		{Form: layout.Fused, DType: layout.F16, NumPages: 8, PageSize: 1 << 62, HeadDimCKV: 4, HeadDimKPE: 4},
		{Form: layout.Split, DType: layout.F16, NumPages: 1, PageSize: 1, HeadDimCKV: math.MaxInt, HeadDimKPE: 1},
		{Form: layout.Split, DType: layout.F16, NumPages: math.MaxInt, PageSize: 2, HeadDimCKV: 512, HeadDimKPE: 64},
	} {
		_, err := kernels.NewMLACache(g)
		require.ErrorIs(t, err, kernels.ErrInvalidCache, "%+v", g)
		require.ErrorContains(t, err, "exceed")
	}
}
