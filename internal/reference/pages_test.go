package reference

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPageAllocModel(t *testing.T) {
	m := NewPageAllocModel(4)
	got, err := m.Alloc(3)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 1, 2}, got, "lowest free pages first")
	_, err = m.Alloc(2)
	assert.True(t, errors.Is(err, ErrModelOutOfPages))
	assert.Equal(t, 1, m.NumFree())

	require.NoError(t, m.Retain(1, 1))
	assert.Equal(t, 3, m.RefCount(1))
	assert.Equal(t, 1, m.NumShared())

	_, err = m.Release(0, 0) // one holder, listed twice
	assert.True(t, errors.Is(err, ErrModelBadPage))
	assert.Equal(t, 1, m.RefCount(0), "failed release changes nothing")
	assert.True(t, errors.Is(m.Retain(3), ErrModelBadPage))

	freed, err := m.Release(1, 1, 1, 0)
	require.NoError(t, err)
	assert.Equal(t, 2, freed)
	got, err = m.Alloc(3)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 1, 3}, got)
}

// TestPageTableModelFlashInferFigure checks the model on FlashInfer's worked
// page table (page size 8; pages 0 5 8 / 1 6 7 / 3 4; 4, 2 and 3 tokens
// appended).
func TestPageTableModelFlashInferFigure(t *testing.T) {
	m := NewPageTableModel(8, 9)
	_, err := m.Alloc.Alloc(9)
	require.NoError(t, err)
	require.NoError(t, m.AddShared(0, []int32{0, 5, 8}, 18))
	require.NoError(t, m.AddShared(1, []int32{1, 6, 7}, 18))
	require.NoError(t, m.AddShared(2, []int32{3, 4}, 12))
	_, err = m.Alloc.Release(0, 1, 2, 3, 4, 5, 6, 7, 8)
	require.NoError(t, err)

	ops, err := m.Reserve([]uint64{0, 1, 2}, []int32{4, 2, 3})
	require.NoError(t, err)
	assert.Empty(t, ops)
	csr, err := m.Export([]uint64{0, 1, 2})
	require.NoError(t, err)
	assert.Equal(t, CSRModel{
		KVIndptr:      []int32{0, 3, 6, 8},
		KVPageIndices: []int32{0, 5, 8, 1, 6, 7, 3, 4},
		KVLastPageLen: []int32{6, 4, 7},
		SeqLens:       []int32{22, 20, 15},
	}, csr)
	app, err := m.ExportAppend([]uint64{0, 1, 2}, []int32{4, 2, 3})
	require.NoError(t, err)
	assert.Equal(t, AppendCSRModel{
		AppendIndptr: []int32{0, 4, 6, 9},
		BatchIndices: []int32{0, 0, 0, 0, 1, 1, 2, 2, 2},
		Positions:    []int32{18, 19, 20, 21, 18, 19, 12, 13, 14},
	}, app)
	assert.Equal(t, []int32{22, 20, 15}, SeqLensSlow(csr.KVIndptr, csr.KVLastPageLen, 8))
	bi, pos := BatchIndicesPositionsSlow(app.AppendIndptr, csr.SeqLens)
	assert.Equal(t, app.BatchIndices, bi)
	assert.Equal(t, app.Positions, pos)
	require.NoError(t, CheckCSRSlow(csr.KVIndptr, csr.KVPageIndices, csr.KVLastPageLen, 8, 9))
}

func TestPageTableModelForkCopyOnWrite(t *testing.T) {
	m := NewPageTableModel(4, 4)
	require.NoError(t, m.Add(1))
	_, err := m.Reserve([]uint64{1}, []int32{6})
	require.NoError(t, err)
	require.NoError(t, m.Fork(1, 2))
	assert.Equal(t, 2, m.Alloc.RefCount(1))

	ops, err := m.Reserve([]uint64{2, 1}, []int32{1, 1})
	require.NoError(t, err)
	assert.Equal(t, []CopyOpModel{{Src: 1, Dst: 2, Entries: 2}}, ops, "the first appender copies, the last keeps the page")
	assert.Equal(t, []int32{0, 2}, m.Seqs[2].Pages)
	assert.Equal(t, []int32{0, 1}, m.Seqs[1].Pages)

	// Out of pages: the whole batch fails and nothing changes.
	before := m.Clone()
	_, err = m.Reserve([]uint64{1, 2}, []int32{1, 8})
	assert.True(t, errors.Is(err, ErrModelOutOfPages))
	assert.Equal(t, before, m)

	n, err := m.ReleaseWindow(1, 3)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, SeqModel{Pages: []int32{1}, Len: 7, Start: 4}, *m.Seqs[1])
	require.NoError(t, m.Truncate(1, 4))
	assert.Equal(t, SeqModel{Pages: []int32{}, Len: 4, Start: 4}, *m.Seqs[1])
	require.NoError(t, m.Release(1))
	require.NoError(t, m.Release(2))
	assert.Equal(t, 4, m.Alloc.NumFree())
}
