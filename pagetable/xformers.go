package pagetable

import (
	"fmt"
	"math"
	"slices"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/ragged"
)

// BlockTables is a batch's page table as xFormers' paged attention biases
// take it (PagedBlockDiagonal*Mask, make_paged):
//
//   - Tables   block_tables, a padded [B, cols] int32 array, one row of
//     page IDs per sequence: its held pages in token order, then pad
//   - KVSeqLen [B], the tokens each sequence holds on those pages
//     (Len-Start, as FlashInfer sees them)
type BlockTables struct {
	Tables   ragged.BlockTables
	KVSeqLen []int32
}

// ExportBlockTablesTo writes the page table of sequences ids, in that
// order, into dst as xFormers' block_tables and kv_seqlen, reusing the
// capacity of dst's slices (so a steady decode loop allocates nothing). An
// ID may appear more than once.
//
// cols = 0 takes the most pages any of the sequences holds (at least 1, as
// xFormers needs a column); a larger cols leaves room to grow. pad must be a
// page of the pool: kernels never read padding, but xFormers' materialize
// paints padding pages masked for the row, so a pad that is one of the
// row's own pages hides it there (docs/masks.md). An unknown ID, cols below
// the longest page list, or a pad outside the pool returns an error and
// leaves dst untouched.
func (t *Table) ExportBlockTablesTo(dst *BlockTables, ids []SeqID, cols int, pad allocator.PageID) error {
	if total := t.alloc.Stats().Total; pad < 0 || int(pad) >= total {
		return fmt.Errorf("%w: export block tables: pad page %d, want 0..%d", ErrBadArgument, pad, total-1)
	}
	if cols < 0 {
		return fmt.Errorf("%w: export block tables: cols = %d is negative", ErrBadArgument, cols)
	}
	most := 1
	for i, id := range ids {
		s := t.lookup(id)
		if s == nil {
			return fmt.Errorf("%w: export block tables: ids[%d] = %d", ErrUnknownSeq, i, id)
		}
		most = max(most, len(s.pages))
	}
	switch {
	case cols == 0:
		cols = most
	case cols < most:
		return fmt.Errorf("%w: export block tables: cols = %d, but a sequence holds %d pages", ErrBadArgument, cols, most)
	}
	if int64(len(ids))*int64(cols) > math.MaxInt32 {
		return fmt.Errorf("%w: export block tables: %d×%d entries, more than int32 indexes", ErrBadArgument, len(ids), cols)
	}
	b := len(ids)
	data := slices.Grow(dst.Tables.Data[:0], b*cols)[:b*cols]
	kvLen := slices.Grow(dst.KVSeqLen[:0], b)[:b]
	for i, id := range ids {
		s := t.lookup(id)
		row := data[i*cols : (i+1)*cols]
		n := copy(row, pageIDsAsInt32(s.pages))
		for l := n; l < cols; l++ {
			row[l] = int32(pad)
		}
		kvLen[i] = int32(s.len - s.start)
	}
	dst.Tables = ragged.BlockTables{Rows: b, Cols: cols, Data: data}
	dst.KVSeqLen = kvLen
	return nil
}
