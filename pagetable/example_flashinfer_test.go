package pagetable_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/pagetable"
)

// TestFlashInferWorkedPageTable rebuilds the page table of FlashInfer's
// docs figure (tutorials/page_layout.png): page_size 8, 9 pages,
//
//	request 0: pages 0 5 8, last page 6 entries -> 22 tokens
//	request 1: pages 1 6 7, last page 4 entries -> 20 tokens
//	request 2: pages 3 4,   last page 7 entries -> 15 tokens
//
// where the last 4, 2 and 3 tokens are the ones just appended. Page 2 is
// unused.
func TestFlashInferWorkedPageTable(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 9})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: 8, Allocator: a})
	require.NoError(t, err)

	// Place the requests on the figure's pages: take the whole pool, hand
	// the pages over with AddShared (before the append: 18, 18 and 12
	// tokens), then drop our own holds so the table is the only holder.
	all := make([]allocator.PageID, 9)
	require.NoError(t, a.Alloc(all))
	require.NoError(t, tab.AddShared(0, []allocator.PageID{0, 5, 8}, 18))
	require.NoError(t, tab.AddShared(1, []allocator.PageID{1, 6, 7}, 18))
	require.NoError(t, tab.AddShared(2, []allocator.PageID{3, 4}, 12))
	_, err = a.Release(all...)
	require.NoError(t, err)
	assert.Equal(t, allocator.Stats{Total: 9, Free: 1, InUse: 8}, a.Stats(), "page 2 is the only free page")

	ids := []pagetable.SeqID{0, 1, 2}
	appendLens := []int32{4, 2, 3}
	ops, err := tab.Reserve(nil, ids, appendLens)
	require.NoError(t, err)
	assert.Empty(t, ops, "sole holder: no copy-on-write")
	assert.Equal(t, 1, a.Stats().Free, "the appended tokens fit in the last pages")

	var csr pagetable.CSR
	require.NoError(t, tab.ExportTo(&csr, ids))
	assert.Equal(t, pagetable.CSR{
		KVIndptr:      []int32{0, 3, 6, 8},
		KVPageIndices: []int32{0, 5, 8, 1, 6, 7, 3, 4},
		KVLastPageLen: []int32{6, 4, 7},
		SeqLens:       []int32{22, 20, 15},
	}, csr)

	var app pagetable.AppendCSR
	require.NoError(t, tab.ExportAppendTo(&app, ids, appendLens))
	assert.Equal(t, pagetable.AppendCSR{
		AppendIndptr: []int32{0, 4, 6, 9},
		BatchIndices: []int32{0, 0, 0, 0, 1, 1, 2, 2, 2},
		Positions:    []int32{18, 19, 20, 21, 18, 19, 12, 13, 14},
	}, app)

	// The same numbers from the raw arrays, as flashinfer.page computes them.
	seqLens, err := pagetable.GetSeqLensTo(nil, csr.KVIndptr, csr.KVLastPageLen, 8)
	require.NoError(t, err)
	assert.Equal(t, []int32{22, 20, 15}, seqLens)
	bi, pos, err := pagetable.GetBatchIndicesPositionsTo(nil, nil, []int32{0, 4, 6, 9}, seqLens, 9)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 0, 0, 0, 1, 1, 2, 2, 2}, bi)
	assert.Equal(t, []int32{18, 19, 20, 21, 18, 19, 12, 13, 14}, pos)

	// The rows land in page 8 entries 2..5, page 7 entries 2..3 and page 4
	// entries 4..6: the highlighted cells of the figure.
	type cell struct{ page, entry int32 }
	var cells []cell
	for i, p := range pos {
		b := bi[i]
		page := csr.KVPageIndices[csr.KVIndptr[b]+p/8]
		cells = append(cells, cell{page, p % 8})
	}
	assert.Equal(t, []cell{{8, 2}, {8, 3}, {8, 4}, {8, 5}, {7, 2}, {7, 3}, {4, 4}, {4, 5}, {4, 6}}, cells)
	require.NoError(t, pagetable.ValidateCSR(csr.KVIndptr, csr.KVPageIndices, csr.KVLastPageLen, 8, 9))
	require.NoError(t, tab.CheckInvariants())
}
