package pagetable

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/ragged"
)

// ExportBlockTables returns the page table of sequences ids, in that order,
// as xFormers' paged attention biases take it (PagedBlockDiagonal*Mask,
// make_paged): block_tables, a padded [len(ids), cols] int32 array with one
// row of page IDs per sequence, and kv_seqlen, the tokens each sequence
// holds on those pages (Len-Start, as FlashInfer sees them). Row b starts
// with the sequence's held pages in token order; the rest is pad.
//
// cols = 0 takes the most pages any of the sequences holds (at least 1, as
// xFormers needs a column); a larger cols leaves room to grow. pad must be a
// page of the pool: kernels never read padding, but xFormers' materialize
// paints padding pages masked for the row, so a pad that is one of the
// row's own pages hides it there (docs/masks.md). An unknown ID, cols below
// the longest page list, or a pad outside the pool returns an error and
// allocates nothing that outlives the call.
func (t *Table) ExportBlockTables(ids []SeqID, cols int, pad allocator.PageID) (ragged.BlockTables, []int32, error) {
	if total := t.alloc.Stats().Total; pad < 0 || int(pad) >= total {
		return ragged.BlockTables{}, nil, fmt.Errorf("%w: export block tables: pad page %d, want 0..%d", ErrBadArgument, pad, total-1)
	}
	if cols < 0 {
		return ragged.BlockTables{}, nil, fmt.Errorf("%w: export block tables: cols = %d is negative", ErrBadArgument, cols)
	}
	most := 1
	for i, id := range ids {
		s := t.lookup(id)
		if s == nil {
			return ragged.BlockTables{}, nil, fmt.Errorf("%w: export block tables: ids[%d] = %d", ErrUnknownSeq, i, id)
		}
		most = max(most, len(s.pages))
	}
	switch {
	case cols == 0:
		cols = most
	case cols < most:
		return ragged.BlockTables{}, nil, fmt.Errorf("%w: export block tables: cols = %d, but a sequence holds %d pages", ErrBadArgument, cols, most)
	}
	if int64(len(ids))*int64(cols) > math.MaxInt32 {
		return ragged.BlockTables{}, nil, fmt.Errorf("%w: export block tables: %d×%d entries, more than int32 indexes", ErrBadArgument, len(ids), cols)
	}
	bt := ragged.BlockTables{Rows: len(ids), Cols: cols, Data: make([]int32, len(ids)*cols)}
	kvLen := make([]int32, len(ids))
	for b, id := range ids {
		s := t.lookup(id)
		row := bt.Row(b)
		n := copy(row, pageIDsAsInt32(s.pages))
		for l := n; l < cols; l++ {
			row[l] = int32(pad)
		}
		kvLen[b] = int32(s.len - s.start)
	}
	return bt, kvLen, nil
}
