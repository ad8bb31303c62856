package pagetable_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/pagetable"
)

// The audit's export: a 2^31-1-token sequence and its fork at page size
// 65536 hold 65536 pages, kv_indptr[B]*page_size = 2^32, which ValidateCSR
// rejects. ExportTo must refuse it too (naming the bound) and leave dst
// as it was; either sequence alone exports and validates.
func TestExportToNeverEmitsWhatValidateCSRRejects(t *testing.T) {
	const ps = pagetable.MaxPageSize
	alloc, err := allocator.New(allocator.Config{NumPages: 1 << 15})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: ps, Allocator: alloc})
	require.NoError(t, err)
	require.NoError(t, tab.Add(1))
	_, err = tab.Reserve(nil, []pagetable.SeqID{1}, []int32{math.MaxInt32})
	require.NoError(t, err)
	require.NoError(t, tab.Fork(1, 2))

	var one pagetable.CSR
	require.NoError(t, tab.ExportTo(&one, []pagetable.SeqID{1}))
	require.NoError(t, pagetable.ValidateCSR(one.KVIndptr, one.KVPageIndices, one.KVLastPageLen, ps, 1<<15))

	dst := pagetable.CSR{KVIndptr: []int32{7}}
	err = tab.ExportTo(&dst, []pagetable.SeqID{1, 2})
	require.ErrorIs(t, err, pagetable.ErrBadArgument)
	require.ErrorContains(t, err, "65536 pages of 65536 tokens = 4294967296 token slots, want < 2^32")
	require.Equal(t, []int32{7}, dst.KVIndptr, "dst changed by a failed export")
}

// AddShared with MaxInt tokens: the message names the value and the bound,
// not a wrapped page count.
func TestAddSharedHugeTokenCountIsNamed(t *testing.T) {
	alloc, err := allocator.New(allocator.Config{NumPages: 4})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: 16, Allocator: alloc})
	require.NoError(t, err)
	err = tab.AddShared(1, nil, math.MaxInt)
	require.ErrorIs(t, err, pagetable.ErrBadArgument)
	require.ErrorContains(t, err, "ntokens = 9223372036854775807, want 0..2147483647")
	require.NotContains(t, err.Error(), "-")
	require.False(t, tab.Has(1))
}
