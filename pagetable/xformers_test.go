package pagetable_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/ragged"
)

// A Mistral-style rolling cache over pages: window W = 4096, pages of 16
// tokens, three sequences decoding one token per step. After each step
// ReleaseWindow(W) gives back the pages wholly before the window, and the
// decode mask is xFormers' PagedBlockDiagonalCausalLocalPaddedKeysMask over
// ExportBlockTables: each query must see exactly the last min(Len, W) tokens
// of its sequence, at the physical slots the table holds them in, FlashInfer
// must express it as causal with window_left = W-1, and the mask's CSR page
// table must be the table's own export.
func TestXFormersRollingCacheDecodeWindow4096(t *testing.T) {
	t.Parallel()
	const (
		window   = 4096
		pageSize = 16
	)
	a, err := allocator.New(allocator.Config{NumPages: 1024})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: pageSize, Allocator: a})
	require.NoError(t, err)
	ids := []pagetable.SeqID{7, 8, 9}
	prompts := []int32{4990, 100, 4100}
	for _, id := range ids {
		require.NoError(t, tab.Add(id))
	}
	_, err = tab.Reserve(nil, ids, prompts)
	require.NoError(t, err)

	for step := 0; step < 20; step++ {
		_, err = tab.Reserve(nil, ids, []int32{1, 1, 1})
		require.NoError(t, err)
		for _, id := range ids {
			_, err = tab.ReleaseWindow(id, window)
			require.NoError(t, err)
		}
		var exp pagetable.BlockTables
		require.NoError(t, tab.ExportBlockTablesTo(&exp, ids, 0, 0))
		bt, kvLen := exp.Tables, exp.KVSeqLen
		m, err := ragged.PagedBlockDiagonalCausalLocalPaddedKeysMaskFromSeqlensLocal([]int32{1, 1, 1}, kvLen, bt, pageSize, window)
		require.NoError(t, err)
		assert.Equal(t, ragged.FlashInferParams{Causal: true, WindowLeft: window - 1, OK: true}, m.FlashInferParams())

		d, err := m.Materialize()
		require.NoError(t, err)
		cols := d.Cols
		for b, id := range ids {
			length, start, pages := tab.Len(id), tab.Start(id), tab.Pages(id)
			want := make([]bool, cols)
			for pos := max(0, length-window); pos < length; pos++ {
				held := pos - start
				require.GreaterOrEqual(t, held, 0, "token %d of sequence %d was released but is in the window", pos, id)
				want[int(pages[held/pageSize])*pageSize+held%pageSize] = true
			}
			for c := 0; c < cols; c++ {
				if d.At(b, c) != want[c] {
					t.Fatalf("step %d, sequence %d (Len %d, Start %d): physical slot %d: mask %t, want %t",
						step, id, length, start, c, d.At(b, c), want[c])
				}
			}
			// At reads the same cells without materialising (spot checks:
			// each At scans the row's pages).
			for c := step; c < cols; c += 97 {
				require.Equal(t, want[c], m.At(b, c), "At(%d, %d)", b, c)
			}
		}

		var csr pagetable.CSR
		require.NoError(t, tab.ExportTo(&csr, ids))
		pkv, err := m.PagedKV()
		require.NoError(t, err)
		assert.Equal(t, csr.KVIndptr, pkv.KVIndptr)
		assert.Equal(t, csr.KVPageIndices, pkv.KVPageIndices)
		assert.Equal(t, csr.KVLastPageLen, pkv.KVLastPageLen)
		assert.Equal(t, csr.SeqLens, kvLen)
		back, lens, err := ragged.BlockTablesFromPagedKV(pkv.KVIndptr, pkv.KVPageIndices, pkv.KVLastPageLen, pageSize, bt.Cols, 0)
		require.NoError(t, err)
		assert.Equal(t, bt, back)
		assert.Equal(t, kvLen, lens)
	}
	// The long sequences hold about W tokens, not their whole history.
	assert.LessOrEqual(t, tab.Len(7)-tab.Start(7), window+pageSize)
	assert.Equal(t, 120, tab.Len(8)-tab.Start(8), "the short sequence keeps everything")
}

func TestExportBlockTablesErrors(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 8})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: 4, Allocator: a})
	require.NoError(t, err)
	require.NoError(t, tab.Add(1))
	require.NoError(t, tab.Add(2))
	_, err = tab.Reserve(nil, []pagetable.SeqID{1, 2}, []int32{9, 0})
	require.NoError(t, err)

	var exp pagetable.BlockTables
	require.NoError(t, tab.ExportBlockTablesTo(&exp, []pagetable.SeqID{2, 1}, 4, 7))
	p := tab.Pages(1)
	want := pagetable.BlockTables{
		Tables:   ragged.BlockTables{Rows: 2, Cols: 4, Data: []int32{7, 7, 7, 7, int32(p[0]), int32(p[1]), int32(p[2]), 7}},
		KVSeqLen: []int32{0, 9},
	}
	assert.Equal(t, want, exp)

	// A failed export leaves dst as it was.
	for _, tc := range []struct {
		ids       []pagetable.SeqID
		cols      int
		pad       allocator.PageID
		sentinel  error
		wantInMsg string
	}{
		{[]pagetable.SeqID{1, 3}, 0, 0, pagetable.ErrUnknownSeq, "ids[1] = 3"},
		{[]pagetable.SeqID{1}, 2, 0, pagetable.ErrBadArgument, "cols = 2, but a sequence holds 3 pages"},
		{[]pagetable.SeqID{1}, 0, 8, pagetable.ErrBadArgument, "pad page 8, want 0..7"},
		{[]pagetable.SeqID{1}, 0, -1, pagetable.ErrBadArgument, "pad page -1"},
		{[]pagetable.SeqID{1}, -1, 0, pagetable.ErrBadArgument, "cols = -1"},
	} {
		err := tab.ExportBlockTablesTo(&exp, tc.ids, tc.cols, tc.pad)
		require.ErrorIs(t, err, tc.sentinel)
		assert.ErrorContains(t, err, tc.wantInMsg)
		assert.Equal(t, want, exp)
	}
}

// A decode loop that exports the block tables every step allocates nothing
// once dst has grown.
func TestExportBlockTablesToDoesNotAllocate(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 64})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: 4, Allocator: a})
	require.NoError(t, err)
	ids := []pagetable.SeqID{1, 2, 3}
	for _, id := range ids {
		require.NoError(t, tab.Add(id))
	}
	_, err = tab.Reserve(nil, ids, []int32{9, 1, 30})
	require.NoError(t, err)
	var dst pagetable.BlockTables
	require.NoError(t, tab.ExportBlockTablesTo(&dst, ids, 10, 0))
	require.Zero(t, testing.AllocsPerRun(50, func() {
		if err := tab.ExportBlockTablesTo(&dst, ids, 10, 0); err != nil {
			t.Fatal(err)
		}
	}))
}
