package pagetable_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/pagetable"
)

// decodeBatch is a steady-state decode batch: nseqs sequences of ntokens
// tokens each, and the buffers one decode step reuses.
type decodeBatch struct {
	tab    *pagetable.Table
	ids    []pagetable.SeqID
	ones   []int32
	ops    []pagetable.CopyOp
	csr    pagetable.CSR
	app    pagetable.AppendCSR
	ntoken int
}

func newDecodeBatch(t testing.TB, nseqs, ntokens, pageSize, numPages int) *decodeBatch {
	a, err := allocator.New(allocator.Config{NumPages: numPages})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: pageSize, Allocator: a})
	require.NoError(t, err)
	d := &decodeBatch{tab: tab, ntoken: ntokens}
	for i := range nseqs {
		id := pagetable.SeqID(i + 1)
		require.NoError(t, tab.Add(id))
		d.ids = append(d.ids, id)
		d.ones = append(d.ones, 1)
	}
	counts := make([]int32, nseqs)
	for i := range counts {
		counts[i] = int32(ntokens)
	}
	_, err = tab.Reserve(nil, d.ids, counts)
	require.NoError(t, err)
	return d
}

// step is one decode step: reserve a slot per sequence, export the page
// table and the append rows.
func (d *decodeBatch) step() error {
	var err error
	d.ops, err = d.tab.Reserve(d.ops[:0], d.ids, d.ones)
	if err != nil {
		return err
	}
	if err := d.tab.ExportTo(&d.csr, d.ids); err != nil {
		return err
	}
	return d.tab.ExportAppendTo(&d.app, d.ids, d.ones)
}

// rewind truncates every sequence back to its starting length, keeping the
// capacity its page list grew to.
func (d *decodeBatch) rewind() error {
	for _, id := range d.ids {
		if err := d.tab.Truncate(id, d.ntoken); err != nil {
			return err
		}
	}
	return nil
}

// TestDecodeStepDoesNotAllocate pins the hot path: once buffers and page
// lists have grown (a first pass over the same steps), appending one token
// to each of 256 sequences and exporting the batch allocates nothing, page
// boundaries included (page size 16, 100 steps cross 6 or 7 of them).
func TestDecodeStepDoesNotAllocate(t *testing.T) {
	const nseqs, ntokens, pageSize, steps = 256, 1000, 16, 100
	d := newDecodeBatch(t, nseqs, ntokens, pageSize, nseqs*(ntokens+2*steps)/pageSize+nseqs)
	for range steps + 1 { // warm up: AllocsPerRun runs the step steps+1 times
		require.NoError(t, d.step())
	}
	require.NoError(t, d.rewind())
	var err error
	allocs := testing.AllocsPerRun(steps, func() {
		if e := d.step(); e != nil {
			err = e
		}
	})
	require.NoError(t, err)
	require.Zero(t, allocs, "allocations per decode step")
	require.Len(t, d.csr.KVPageIndices, nseqs*((ntokens+steps+1+pageSize-1)/pageSize))
	require.NoError(t, d.tab.CheckInvariants())
}

// TestGrowPresizesThePageList: after Grow, reserving up to the grown length
// allocates nothing; Grow changes no page or length and rejects bad input.
func TestGrowPresizesThePageList(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 64})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: 16, Allocator: a})
	require.NoError(t, err)
	require.NoError(t, tab.Add(1))
	require.NoError(t, tab.Grow(1, 16*40))
	require.Zero(t, tab.Len(1))
	require.Empty(t, tab.Pages(1))
	ids, ones := []pagetable.SeqID{1}, []int32{16}
	require.Zero(t, testing.AllocsPerRun(39, func() {
		if _, err := tab.Reserve(nil, ids, ones); err != nil {
			t.Fatal(err)
		}
	}))
	require.Equal(t, 16*40, tab.Len(1))
	require.ErrorIs(t, tab.Grow(2, 1), pagetable.ErrUnknownSeq)
	require.ErrorIs(t, tab.Grow(1, -1), pagetable.ErrBadArgument)
	require.NoError(t, tab.CheckInvariants())
}
