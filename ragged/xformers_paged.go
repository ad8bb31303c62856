package ragged

import (
	"fmt"
	"math"
	"slices"
)

// BlockTables is xFormers' block_tables: a padded 2-D int32 array
// [Rows, Cols], row-major, one row of physical page IDs per sequence. Entry
// (b, l) is the page holding sequence b's logical keys [l*page_size,
// (l+1)*page_size). Entries past a sequence's last used page are padding:
// kernels never read them, but xFormers' materialize does paint them (see
// [PagedBlockDiagonalPaddedKeysMask]). As in xFormers, Rows may exceed the
// batch (a table allocated for more sequences than the step holds): rows
// past the batch are ignored, except that their page IDs, like every
// entry's, widen the dense form to (max(block_tables)+1)*page_size columns.
type BlockTables struct {
	Rows, Cols int
	Data       []int32 // [Rows*Cols]
}

// Row returns a view of row b (not a copy).
func (t BlockTables) Row(b int) []int32 { return t.Data[b*t.Cols : (b+1)*t.Cols] }

// At returns entry (b, l).
func (t BlockTables) At(b, l int) int32 { return t.Data[b*t.Cols+l] }

// Clone returns a deep copy.
func (t BlockTables) Clone() BlockTables {
	t.Data = append([]int32(nil), t.Data...)
	return t
}

// check validates the shape and page IDs of block_tables for a batch of
// batch sequences with the given page size, and returns the largest page ID.
func (t BlockTables) check(batch, pageSize int) (maxID int, err error) {
	if pageSize < 1 {
		return 0, fmt.Errorf("%w: page_size = %d, want >= 1", ErrNegativeLength, pageSize)
	}
	if t.Rows < 0 || t.Cols < 0 {
		return 0, fmt.Errorf("%w: block_tables shape %d×%d", ErrNegativeLength, t.Rows, t.Cols)
	}
	if n, ok := mulFits(t.Rows, t.Cols, 1); !ok || n != len(t.Data) {
		return 0, fmt.Errorf("%w: block_tables shape %d×%d does not hold its %d entries", ErrLengthMismatch, t.Rows, t.Cols, len(t.Data))
	}
	if t.Rows < batch {
		// xFormers indexes block_tables[b] for every sequence b (an
		// IndexError past the last row) and ignores the rows past the batch.
		return 0, fmt.Errorf("%w: block_tables has %d rows, want at least one per sequence (%d)", ErrLengthMismatch, t.Rows, batch)
	}
	if t.Cols < 1 {
		// xFormers: the row length block_tables.shape[1]*page_size is the
		// padding, and a padding of 0 is rejected (range step 0).
		return 0, fmt.Errorf("%w: block_tables has %d columns, want >= 1", ErrNegativeLength, t.Cols)
	}
	if n, ok := mulFits(t.Cols, pageSize, 1); !ok || n > math.MaxInt32 {
		return 0, fmt.Errorf("%w: a row of %d pages of %d keys is beyond int32", ErrTooLarge, t.Cols, pageSize)
	}
	maxID = -1
	for k, id := range t.Data {
		if id < 0 {
			return 0, fmt.Errorf("%w: block_tables[%d][%d] = %d is a negative page id", ErrOutOfRange, k/t.Cols, k%t.Cols, id)
		}
		maxID = max(maxID, int(id))
	}
	if n, ok := mulFits(maxID+1, pageSize, 1); !ok || n > math.MaxInt32 {
		return 0, fmt.Errorf("%w: page id %d with page_size %d puts keys beyond int32", ErrOutOfRange, maxID, pageSize)
	}
	return maxID, nil
}

// setPaged stores block tables and page size, and checks every sequence
// fits its row of pages.
func (m *blockDiagonal) setPaged(cfg MaskConfig) error {
	batch := len(m.qSeqLen)
	maxID, err := cfg.BlockTables.check(batch, cfg.PageSize)
	if err != nil {
		return err
	}
	rowLen := cfg.BlockTables.Cols * cfg.PageSize
	gappy := m.info.layout == layoutPagedGappy
	if gappy {
		if len(cfg.KVSeqStarts) != batch {
			return fmt.Errorf("%w: %s needs one kv_seqstarts offset per sequence (%d), got %d",
				ErrLengthMismatch, m.kind, batch, len(cfg.KVSeqStarts))
		}
		m.kvOffset = append([]int32(nil), cfg.KVSeqStarts...)
		m.kvSeqStarts = m.kvOffset
	}
	for b := 0; b < batch; b++ {
		start, n := 0, int(m.kvSeqLen[b])
		if gappy {
			start = int(m.kvOffset[b])
			if start < 0 || start >= rowLen {
				// xFormers' make_paged asserts 0 <= start < max_row_len.
				return fmt.Errorf("%w: sequence %d starts at key %d (kv_seqstarts), want 0..%d (block_tables columns %d * page_size %d - 1)",
					ErrOutOfRange, b, start, rowLen-1, cfg.BlockTables.Cols, cfg.PageSize)
			}
		}
		if start+n > rowLen {
			return fmt.Errorf("%w: sequence %d has keys up to %d (kv_seqlen %d), beyond its %d pages of %d keys (padding %d)",
				ErrOutOfRange, b, start+n, n, cfg.BlockTables.Cols, cfg.PageSize, rowLen)
		}
	}
	m.blockTables = cfg.BlockTables.Clone()
	m.pageSize = cfg.PageSize
	m.kvPadding = rowLen
	m.cols = (maxID + 1) * cfg.PageSize
	return nil
}

// logicalVisible reports whether query i of block b sees logical key x of
// its row of pages.
func (m blockDiagonal) logicalVisible(b, i, x int) bool {
	lo, hi := m.rowRange(b, i)
	if m.kvOffset != nil {
		off := int(m.kvOffset[b])
		lo, hi = lo+off, hi+off
	}
	return x >= lo && x < hi
}

// pagedAt is At for the paged kinds: xFormers copies each logical page of
// the row, in order, onto its physical page, so the last logical page that
// names the physical page decides.
func (m blockDiagonal) pagedAt(b, i, col int) bool {
	p, t := int32(col/m.pageSize), col%m.pageSize
	row := m.blockTables.Row(b)
	for l := len(row) - 1; l >= 0; l-- {
		if row[l] == p {
			return m.logicalVisible(b, i, l*m.pageSize+t)
		}
	}
	return false
}

func (m blockDiagonal) materializePaged(d Dense) (Dense, error) {
	if n, ok := mulFits(d.Rows, m.kvPadding, 1); !ok || n > MaxDenseCells {
		return Dense{}, fmt.Errorf("%w: %s: copying %d rows of %d logical keys exceeds MaxDenseCells", ErrTooLarge, m.kind, d.Rows, m.kvPadding)
	}
	ps := m.pageSize
	for b := range m.qSeqLen {
		row := m.blockTables.Row(b)
		for i := 0; i < int(m.qSeqLen[b]); i++ {
			dst := d.Allowed[(m.qStart[b]+i)*d.Cols:][:d.Cols]
			for l, p := range row {
				for t := 0; t < ps; t++ {
					dst[int(p)*ps+t] = m.logicalVisible(b, i, l*ps+t)
				}
			}
		}
	}
	return d, nil
}

// BlockTables returns a copy of block_tables for the paged kinds and the
// zero value otherwise.
func (m blockDiagonal) BlockTables() BlockTables {
	if m.pageSize == 0 {
		return BlockTables{}
	}
	return m.blockTables.Clone()
}

// PageSize returns page_size for the paged kinds and 0 otherwise.
func (m blockDiagonal) PageSize() int { return m.pageSize }

// PagedKV is FlashInfer's paged-KV page table for a batch (the arguments of
// BatchPrefill/DecodeWithPagedKVCacheWrapper.plan besides the mask):
// request b holds pages KVPageIndices[KVIndptr[b]:KVIndptr[b+1]] in order, the
// last one filled to KVLastPageLen[b] (0 for a request without pages).
type PagedKV struct {
	QOIndptr      []int32 // [B+1] prefix sums of q_seqlen
	KVIndptr      []int32 // [B+1] page counts
	KVPageIndices []int32 // [KVIndptr[B]] physical page ids
	KVLastPageLen []int32 // [B]
	PageSize      int
}

// PagedKV converts a paged mask to FlashInfer's CSR page table: request b
// takes the first ceil(end_b/page_size) pages of its block_tables row, where
// end_b is kv_seqlen[b] (plus kv_seqstarts[b] for the paged gappy kinds),
// and kv_last_page_len makes kv_len = end_b. The kernel then reads exactly
// the keys xFormers' kernel reads; padding entries of block_tables are not
// part of it. What a query may see of those keys is [ToFlashInfer] or
// [FlashInferParams]. A mask that is not paged wraps [ErrNotPaged].
func (m blockDiagonal) PagedKV() (PagedKV, error) {
	if m.pageSize == 0 {
		return PagedKV{}, fmt.Errorf("%w: %s", ErrNotPaged, m.kind)
	}
	ends := make([]int32, len(m.kvSeqLen))
	for b := range ends {
		ends[b] = int32(m.flashKV(b))
	}
	qo, err := IndptrFromLengths(m.qSeqLen)
	if err != nil {
		return PagedKV{}, err
	}
	indptr, indices, last, err := m.blockTables.ToPagedKV(ends, m.pageSize)
	if err != nil {
		return PagedKV{}, err
	}
	return PagedKV{QOIndptr: qo, KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last, PageSize: m.pageSize}, nil
}

// ToPagedKV converts block_tables and per-sequence key counts (kvLen[b]
// keys from logical position 0) to FlashInfer's kv_indptr, kv_indices and
// kv_last_page_len. kvLen[b] must be in 0..Cols*pageSize; rows past
// len(kvLen) are ignored.
func (t BlockTables) ToPagedKV(kvLen []int32, pageSize int) (kvIndptr, kvPageIndices, kvLastPageLen []int32, err error) {
	if _, err := t.check(len(kvLen), pageSize); err != nil {
		return nil, nil, nil, err
	}
	kvIndptr = make([]int32, len(kvLen)+1)
	kvLastPageLen = make([]int32, len(kvLen))
	for b, n := range kvLen {
		if n < 0 || int(n) > t.Cols*pageSize {
			return nil, nil, nil, fmt.Errorf("%w: sequence %d has %d keys, want 0..%d (block_tables columns %d * page_size %d)",
				ErrOutOfRange, b, n, t.Cols*pageSize, t.Cols, pageSize)
		}
		pages := (int(n) + pageSize - 1) / pageSize
		kvIndptr[b+1] = kvIndptr[b] + int32(pages)
		if pages > 0 {
			kvLastPageLen[b] = n - int32((pages-1)*pageSize)
		}
	}
	kvPageIndices = make([]int32, kvIndptr[len(kvLen)])
	for b := range kvLen {
		copy(kvPageIndices[kvIndptr[b]:kvIndptr[b+1]], t.Row(b))
	}
	return kvIndptr, kvPageIndices, kvLastPageLen, nil
}

// BlockTablesFromPagedKV is the inverse of [BlockTables.ToPagedKV]: it lays
// FlashInfer's page table out as block_tables with cols columns (0 = the
// most pages any request holds, at least 1), filling the entries past each
// request's pages with pad, and returns the per-request key counts
// (kv_seqlen). Validation is [ValidatePageTable]'s (page ids >= 0, no pool)
// plus block_tables' (pad >= 0, cols).
func BlockTablesFromPagedKV(kvIndptr, kvPageIndices, kvLastPageLen []int32, pageSize, cols int, pad int32) (BlockTables, []int32, error) {
	if err := ValidatePageTable(kvIndptr, kvPageIndices, kvLastPageLen, PageTableCheck{PageSize: pageSize, NumPages: AnyPageID}); err != nil {
		return BlockTables{}, nil, err
	}
	batch := len(kvIndptr) - 1
	if pad < 0 {
		return BlockTables{}, nil, fmt.Errorf("%w: pad page id %d is negative", ErrOutOfRange, pad)
	}
	most := 1
	for b := 0; b < batch; b++ {
		most = max(most, int(kvIndptr[b+1]-kvIndptr[b]))
	}
	switch {
	case cols == 0:
		cols = most
	case cols < most:
		return BlockTables{}, nil, fmt.Errorf("%w: block_tables of %d columns cannot hold a request of %d pages", ErrOutOfRange, cols, most)
	}
	if n, ok := mulFits(batch, cols, 1); !ok || n > math.MaxInt32 {
		return BlockTables{}, nil, fmt.Errorf("%w: block_tables %d×%d", ErrTooLarge, batch, cols)
	}
	t := BlockTables{Rows: batch, Cols: cols, Data: FillBlockTables(make([]int32, 0, batch*cols), kvIndptr, kvPageIndices, cols, pad)}
	kvLen := make([]int32, batch)
	for b := 0; b < batch; b++ {
		kvLen[b] = PagedKVLen(kvIndptr, kvLastPageLen, pageSize, b)
	}
	if _, err := t.check(batch, pageSize); err != nil {
		return BlockTables{}, nil, err
	}
	return t, kvLen, nil
}

// PagedBlockDiagonalPaddedKeysMask is xFormers'
// PagedBlockDiagonalPaddedKeysMask: BlockDiagonalPaddedKeysMask whose padded
// key slot of block b is the row b of block_tables, i.e. logical key j of
// sequence b lives in physical slot block_tables[b][j/page_size]*page_size +
// j%page_size. The padding is block_tables.shape[1]*page_size.
//
// The dense form has one column per physical key slot, (max(block_tables)+1)
// * page_size of them. xFormers materialises it by copying each logical page
// of a row, in block_tables order, onto its physical page, masked cells
// included; so a padding entry that names one of the same sequence's used
// pages paints that page masked in the dense form (never in a kernel, which
// reads only the pages kv_seqlen covers). [PagedKV] is the kernels' view.
type PagedBlockDiagonalPaddedKeysMask struct{ blockDiagonal }

// PagedBlockDiagonalPaddedKeysMaskFromSeqlens is
// PagedBlockDiagonalPaddedKeysMask.from_seqlens(q_seqlen, kv_seqlen,
// block_tables, page_size).
func PagedBlockDiagonalPaddedKeysMaskFromSeqlens(qSeqLen, kvSeqLen []int32, blockTables BlockTables, pageSize int) (PagedBlockDiagonalPaddedKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, BlockTables: blockTables, PageSize: pageSize})
	return PagedBlockDiagonalPaddedKeysMask{m}, err
}

// PagedBlockDiagonalCausalWithOffsetPaddedKeysMask is xFormers'
// PagedBlockDiagonalCausalWithOffsetPaddedKeysMask:
// [BlockDiagonalCausalWithOffsetPaddedKeysMask] over pages, laid out as
// [PagedBlockDiagonalPaddedKeysMask].
type PagedBlockDiagonalCausalWithOffsetPaddedKeysMask struct{ blockDiagonal }

// PagedBlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens is its
// from_seqlens(q_seqlen, kv_seqlen, block_tables, page_size).
func PagedBlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens(qSeqLen, kvSeqLen []int32, blockTables BlockTables, pageSize int) (PagedBlockDiagonalCausalWithOffsetPaddedKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, BlockTables: blockTables, PageSize: pageSize})
	return PagedBlockDiagonalCausalWithOffsetPaddedKeysMask{m}, err
}

// PagedBlockDiagonalCausalLocalPaddedKeysMask is xFormers'
// PagedBlockDiagonalCausalLocalPaddedKeysMask:
// [BlockDiagonalCausalLocalAttentionPaddedKeysMask] over pages, the mask of
// a sliding-window decode over a paged rolling cache.
type PagedBlockDiagonalCausalLocalPaddedKeysMask struct{ blockDiagonal }

// PagedBlockDiagonalCausalLocalPaddedKeysMaskFromSeqlensLocal is its
// from_seqlens_local(q_seqlen, kv_seqlen, block_tables, page_size,
// window_size). Like xFormers it accepts any window_size (w <= 0 masks every
// key).
func PagedBlockDiagonalCausalLocalPaddedKeysMaskFromSeqlensLocal(qSeqLen, kvSeqLen []int32, blockTables BlockTables, pageSize, windowSize int) (PagedBlockDiagonalCausalLocalPaddedKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindPagedBlockDiagonalCausalLocalPaddedKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen,
		BlockTables: blockTables, PageSize: pageSize, WindowSize: windowSize})
	return PagedBlockDiagonalCausalLocalPaddedKeysMask{m}, err
}

// PagedBlockDiagonalGappyKeysMask is xFormers'
// PagedBlockDiagonalGappyKeysMask: block b's keys are the logical positions
// [kv_seqstarts[b], kv_seqstarts[b]+kv_seqlen[b]) of its own row of pages
// (an offset per sequence, not a position on a shared axis). The dense
// form is laid out as [PagedBlockDiagonalPaddedKeysMask]'s.
type PagedBlockDiagonalGappyKeysMask struct{ blockDiagonal }

// PagedBlockDiagonalGappyKeysMaskFromSeqlens is
// PagedBlockDiagonalGappyKeysMask.from_seqlens(q_seqlen, kv_seqstarts,
// kv_seqlen, block_tables, page_size) with the meaning its documentation
// gives (kv_seqstarts has one offset per sequence). The current xFormers
// source raises on every call of that classmethod (it passes B starts to a
// helper that wants B+1), so xFormers users build this mask with
// [BlockDiagonalGappyKeysMask.MakePaged]; both give the same mask here.
func PagedBlockDiagonalGappyKeysMaskFromSeqlens(qSeqLen, kvSeqStarts, kvSeqLen []int32, blockTables BlockTables, pageSize int) (PagedBlockDiagonalGappyKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindPagedBlockDiagonalGappyKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVSeqStarts: kvSeqStarts,
		BlockTables: blockTables, PageSize: pageSize})
	return PagedBlockDiagonalGappyKeysMask{m}, err
}

// PagedBlockDiagonalCausalWithOffsetGappyKeysMask is xFormers'
// PagedBlockDiagonalCausalWithOffsetGappyKeysMask: the paged gappy layout,
// bottom-right causal within each block.
type PagedBlockDiagonalCausalWithOffsetGappyKeysMask struct{ blockDiagonal }

// PagedBlockDiagonalCausalWithOffsetGappyKeysMaskFromSeqlens: see
// [PagedBlockDiagonalGappyKeysMaskFromSeqlens].
func PagedBlockDiagonalCausalWithOffsetGappyKeysMaskFromSeqlens(qSeqLen, kvSeqStarts, kvSeqLen []int32, blockTables BlockTables, pageSize int) (PagedBlockDiagonalCausalWithOffsetGappyKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindPagedBlockDiagonalCausalWithOffsetGappyKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVSeqStarts: kvSeqStarts,
		BlockTables: blockTables, PageSize: pageSize})
	return PagedBlockDiagonalCausalWithOffsetGappyKeysMask{m}, err
}

// makePaged is xFormers' make_paged of the padded-keys classes: the same
// q_seqlen and kv_seqlen, the padding replaced by block_tables.shape[1] *
// page_size, and the row rule of pagedKind (make_paged does not carry the
// unpaged class's own rule over: the paged_type argument decides).
func (m blockDiagonal) makePaged(blockTables BlockTables, pageSize int, pagedKind MaskKind, allowed ...MaskKind) (AttentionMask, error) {
	ok := false
	for _, k := range allowed {
		ok = ok || k == pagedKind
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s.make_paged takes paged_type %v, got %q", ErrUnknownMaskKind, m.info.class, allowed, pagedKind)
	}
	cfg := MaskConfig{Kind: pagedKind, QSeqLen: m.qSeqLen, KVSeqLen: m.kvSeqLen, BlockTables: blockTables, PageSize: pageSize}
	if kinds[pagedKind].window == windowAny {
		cfg.WindowSize = m.windowArg
	}
	d, err := newBlockDiagonal(cfg)
	if err != nil {
		return nil, err
	}
	return d.typed(), nil
}

// MakePaged is make_paged(block_tables, page_size, paged_type) with
// paged_type [KindPagedBlockDiagonalPaddedKeys] or
// [KindPagedBlockDiagonalCausalWithOffsetPaddedKeys].
func (m BlockDiagonalPaddedKeysMask) MakePaged(blockTables BlockTables, pageSize int, pagedType MaskKind) (AttentionMask, error) {
	return m.makePaged(blockTables, pageSize, pagedType, KindPagedBlockDiagonalPaddedKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys)
}

// MakePaged is make_paged (inherited from BlockDiagonalPaddedKeysMask):
// paged_type [KindPagedBlockDiagonalPaddedKeys] or
// [KindPagedBlockDiagonalCausalWithOffsetPaddedKeys]. The usual call is
// MakePaged(bt, page_size, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys).
func (m BlockDiagonalCausalWithOffsetPaddedKeysMask) MakePaged(blockTables BlockTables, pageSize int, pagedType MaskKind) (AttentionMask, error) {
	return m.makePaged(blockTables, pageSize, pagedType, KindPagedBlockDiagonalPaddedKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys)
}

// MakePaged is make_paged (inherited from BlockDiagonalPaddedKeysMask): as
// there, the window is not carried over; paged_type
// [KindPagedBlockDiagonalPaddedKeys] or
// [KindPagedBlockDiagonalCausalWithOffsetPaddedKeys].
func (m BlockDiagonalLocalAttentionPaddedKeysMask) MakePaged(blockTables BlockTables, pageSize int, pagedType MaskKind) (AttentionMask, error) {
	return m.makePaged(blockTables, pageSize, pagedType, KindPagedBlockDiagonalPaddedKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys)
}

// MakePaged is make_paged(block_tables, page_size, paged_type) with
// paged_type [KindPagedBlockDiagonalCausalLocalPaddedKeys] (the only class
// whose constructor takes the window); the window size is kept.
func (m BlockDiagonalCausalLocalAttentionPaddedKeysMask) MakePaged(blockTables BlockTables, pageSize int, pagedType MaskKind) (PagedBlockDiagonalCausalLocalPaddedKeysMask, error) {
	p, err := m.makePaged(blockTables, pageSize, pagedType, KindPagedBlockDiagonalCausalLocalPaddedKeys)
	if err != nil {
		return PagedBlockDiagonalCausalLocalPaddedKeysMask{}, err
	}
	return p.(PagedBlockDiagonalCausalLocalPaddedKeysMask), nil
}

// makePagedGappy is xFormers' make_paged of the gappy classes: assuming
// block b's keys live in a slot of notional_padding keys starting at
// b*notional_padding, the start within that slot becomes the offset into
// the row of pages.
func (m blockDiagonal) makePagedGappy(blockTables BlockTables, pageSize, notionalPadding int, pagedKind MaskKind) (AttentionMask, error) {
	if pagedKind != KindPagedBlockDiagonalGappyKeys && pagedKind != KindPagedBlockDiagonalCausalWithOffsetGappyKeys {
		return nil, fmt.Errorf("%w: %s.make_paged takes paged_type %s or %s, got %q", ErrUnknownMaskKind, m.info.class,
			KindPagedBlockDiagonalGappyKeys, KindPagedBlockDiagonalCausalWithOffsetGappyKeys, pagedKind)
	}
	if pageSize < 1 {
		return nil, fmt.Errorf("%w: page_size = %d, want >= 1", ErrNegativeLength, pageSize)
	}
	if notionalPadding%pageSize != 0 {
		return nil, fmt.Errorf("%w: notional_padding %d is not a multiple of page_size %d", ErrLengthMismatch, notionalPadding, pageSize)
	}
	starts := make([]int32, len(m.kvSeqLen))
	for b := range starts {
		s := int64(m.kvSeqStarts[b]) - int64(b)*int64(notionalPadding)
		if s < math.MinInt32 || s > math.MaxInt32 {
			return nil, fmt.Errorf("%w: sequence %d starts at %d - %d*%d, beyond int32", ErrOutOfRange, b, m.kvSeqStarts[b], b, notionalPadding)
		}
		starts[b] = int32(s)
	}
	d, err := newBlockDiagonal(MaskConfig{Kind: pagedKind, QSeqLen: m.qSeqLen, KVSeqLen: m.kvSeqLen, KVSeqStarts: starts,
		BlockTables: blockTables, PageSize: pageSize})
	if err != nil {
		return nil, err
	}
	return d.typed(), nil
}

// MakePaged is make_paged(block_tables, page_size, notional_padding,
// paged_type): block b's keys, assumed to live at [b*notional_padding,
// (b+1)*notional_padding) of the unpaged axis, move to its row of pages at
// offset kv_seqstarts[b] - b*notional_padding, which must be in
// 0..block_tables.shape[1]*page_size-1 (xFormers asserts it); notional
// padding must be a multiple of page_size. paged_type is
// [KindPagedBlockDiagonalGappyKeys] or
// [KindPagedBlockDiagonalCausalWithOffsetGappyKeys], and decides the rule.
func (m BlockDiagonalGappyKeysMask) MakePaged(blockTables BlockTables, pageSize, notionalPadding int, pagedType MaskKind) (AttentionMask, error) {
	return m.makePagedGappy(blockTables, pageSize, notionalPadding, pagedType)
}

// MakePaged is [BlockDiagonalGappyKeysMask.MakePaged] (inherited).
func (m BlockDiagonalCausalWithOffsetGappyKeysMask) MakePaged(blockTables BlockTables, pageSize, notionalPadding int, pagedType MaskKind) (AttentionMask, error) {
	return m.makePagedGappy(blockTables, pageSize, notionalPadding, pagedType)
}

// MakePaged is [BlockDiagonalGappyKeysMask.MakePaged] (inherited; the
// window is not carried over).
func (m BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask) MakePaged(blockTables BlockTables, pageSize, notionalPadding int, pagedType MaskKind) (AttentionMask, error) {
	return m.makePagedGappy(blockTables, pageSize, notionalPadding, pagedType)
}

// MaskFromPagedKV is the way back from [PagedKV]: the paged mask of kind
// over FlashInfer's page table p. q_seqlen comes from p.QOIndptr,
// block_tables from p's pages (cols columns, 0 = the most pages of any
// request, at least 1; the rest pad, see [BlockTablesFromPagedKV]), and each
// request's kv_len from its pages and kv_last_page_len. For the paged gappy
// kinds kvSeqStarts[b] is the number of keys at the front of request b's
// pages that are not its keys (kv_seqlen = kv_len - start; FlashInfer's
// page table cannot say); it must be nil for the other kinds. windowSize
// is window_size for [KindPagedBlockDiagonalCausalLocalPaddedKeys] and 0
// otherwise. For a paged mask m,
//
//	MaskFromPagedKV(m.Kind(), m.PagedKV(), m.KVSeqStarts(), m.WindowSize(), m.BlockTables().Cols, pad)
//
// has the same PagedKV, and is m itself when m's padding entries are pad.
func MaskFromPagedKV(kind MaskKind, p PagedKV, kvSeqStarts []int32, windowSize, cols int, pad int32) (AttentionMask, error) {
	info, ok := kinds[kind]
	if !ok || (info.layout != layoutPaged && info.layout != layoutPagedGappy) {
		return nil, fmt.Errorf("%w: %q is not a paged kind", ErrNotPaged, kind)
	}
	if err := CheckIndptr("qo_indptr", p.QOIndptr); err != nil {
		return nil, err
	}
	tables, kvLen, err := BlockTablesFromPagedKV(p.KVIndptr, p.KVPageIndices, p.KVLastPageLen, p.PageSize, cols, pad)
	if err != nil {
		return nil, err
	}
	if len(p.QOIndptr)-1 != len(kvLen) {
		return nil, fmt.Errorf("%w: qo_indptr has %d requests, kv_indptr %d", ErrLengthMismatch, len(p.QOIndptr)-1, len(kvLen))
	}
	qSeqLen := make([]int32, len(kvLen))
	for b := range qSeqLen {
		qSeqLen[b] = p.QOIndptr[b+1] - p.QOIndptr[b]
	}
	if info.layout == layoutPagedGappy {
		if len(kvSeqStarts) != len(kvLen) {
			return nil, fmt.Errorf("%w: %s needs one kv_seqstarts offset per request (%d), got %d", ErrLengthMismatch, kind, len(kvLen), len(kvSeqStarts))
		}
		for b, s := range kvSeqStarts {
			if s < 0 || s > kvLen[b] {
				return nil, fmt.Errorf("%w: request %d has kv_seqstarts %d, want 0..%d (its kv_len)", ErrOutOfRange, b, s, kvLen[b])
			}
			kvLen[b] -= s
		}
	} else if kvSeqStarts != nil {
		return nil, fmt.Errorf("%w: %s takes no kv_seqstarts, got %v", ErrLengthMismatch, kind, kvSeqStarts)
	}
	return NewAttentionMask(MaskConfig{Kind: kind, QSeqLen: qSeqLen, KVSeqLen: kvLen, KVSeqStarts: kvSeqStarts,
		BlockTables: tables, PageSize: p.PageSize, WindowSize: windowSize})
}

// FillBlockTables lays the CSR page table kvIndptr [B+1], kvPageIndices out
// as block_tables [B, cols] row-major into dst (reset to [:0], grown only
// if too small, so a kept buffer makes it allocation-free): row b holds
// request b's pages in order, then pad. The caller guarantees a valid
// kv_indptr and at most cols pages per request ([BlockTablesFromPagedKV]
// and pagedkv's Plan check both first); a longer request panics on the
// slice bound.
func FillBlockTables(dst, kvIndptr, kvPageIndices []int32, cols int, pad int32) []int32 {
	batch := max(len(kvIndptr)-1, 0)
	dst = slices.Grow(dst[:0], batch*cols)[:batch*cols]
	for b := 0; b < batch; b++ {
		row := dst[b*cols : (b+1)*cols]
		n := copy(row, kvPageIndices[kvIndptr[b]:kvIndptr[b+1]])
		if n != int(kvIndptr[b+1]-kvIndptr[b]) {
			panic(fmt.Sprintf("ragged: block_tables row %d of %d columns cannot hold %d pages", b, cols, kvIndptr[b+1]-kvIndptr[b]))
		}
		for l := n; l < cols; l++ {
			row[l] = pad
		}
	}
	return dst
}
