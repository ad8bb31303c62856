package ragged

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func bt(cols int, rows ...[]int32) BlockTables {
	t := BlockTables{Rows: len(rows), Cols: cols}
	for _, r := range rows {
		t.Data = append(t.Data, r...)
	}
	return t
}

// Worked examples, one or more per class, drawn as grids ('x' = may attend,
// '|' separates blocks or pages for the eye). Each was reasoned out from the
// class's definition in attn_bias.py; tools/xformers_crosscheck.py compares
// the same classes with xFormers itself.
func TestXFormersFamilyPictures(t *testing.T) {
	tests := map[string]struct {
		cfg        MaskConfig
		want       string
		wantParams FlashInferParams // compared when OK or Why is set
	}{
		// Every real key of the block: block 0 holds 2 of its 3 slots.
		"BlockDiagonalPaddedKeysMask.from_seqlens([2,1], 3, [2,3])": {
			cfg: MaskConfig{Kind: KindBlockDiagonalPaddedKeys, QSeqLen: []int32{2, 1}, KVSeqLen: []int32{2, 3}, KVPadding: 3},
			want: `
				x x . | . . .
				x x . | . . .
				. . . | x x x`,
			wantParams: FlashInferParams{Causal: false, WindowLeft: -1, OK: true},
		},
		// s = 1: query i sees keys i+1-1 .. i+1+1, cut at kv_seqlen 4.
		"BlockDiagonalLocalAttentionPaddedKeysMask.from_seqlens_local([3], 5, [4], 1, 1)": {
			cfg: MaskConfig{Kind: KindBlockDiagonalLocalPaddedKeys, QSeqLen: []int32{3}, KVSeqLen: []int32{4}, KVPadding: 5, WindowLeft: 1, WindowRight: 1},
			want: `
				x x x . .
				. x x x .
				. . x x .`,
		},
		// window_right 0 is the causal local mask with window_size 2.
		"BlockDiagonalLocalAttentionPaddedKeysMask, window_right 0": {
			cfg: MaskConfig{Kind: KindBlockDiagonalLocalPaddedKeys, QSeqLen: []int32{2}, KVSeqLen: []int32{3}, KVPadding: 3, WindowLeft: 1},
			want: `
				x x .
				. x x`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: 1, OK: true},
		},
		// Mistral's rolling-cache decode with W = 3 (and a 2-token chunk in
		// sequence 2): each query sees its own key and the W-1 before it.
		"BlockDiagonalCausalLocalAttentionPaddedKeysMask.from_seqlens_local([1,1,2], 4, [4,2,4], 3)": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalLocalPaddedKeys, QSeqLen: []int32{1, 1, 2}, KVSeqLen: []int32{4, 2, 4}, KVPadding: 4, WindowSize: 3},
			want: `
				. x x x | . . . . | . . . .
				. . . . | x x . . | . . . .
				. . . . | . . . . | x x x .
				. . . . | . . . . | . x x x`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: 2, OK: true},
		},
		// xFormers does not check window_size here: 0 masks every key.
		"BlockDiagonalCausalLocalAttentionPaddedKeysMask, window_size 0": {
			cfg:  MaskConfig{Kind: KindBlockDiagonalCausalLocalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{2}, KVPadding: 2},
			want: `. .`,
		},
		// Pages of 2 keys: sequence 0 is logical keys 0,1 on page 2 and 2 on
		// page 0; sequence 1 is 0,1 on page 1 and 2,3 on page 3. Columns are
		// physical slots, pages 0..3.
		"PagedBlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens([1,2], [3,4], [[2,0],[1,3]], 2)": {
			cfg: MaskConfig{Kind: KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: []int32{1, 2}, KVSeqLen: []int32{3, 4},
				BlockTables: bt(2, []int32{2, 0}, []int32{1, 3}), PageSize: 2},
			want: `
				x . | . . | x x | . .
				. . | x x | . . | x .
				. . | x x | . . | x x`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: -1, OK: true},
		},
		"PagedBlockDiagonalPaddedKeysMask.from_seqlens([1,1], [3,1], [[1,2],[0,3]], 2)": {
			cfg: MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{3, 1},
				BlockTables: bt(2, []int32{1, 2}, []int32{0, 3}), PageSize: 2},
			want: `
				. . | x x | x . | . .
				x . | . . | . . | . .`,
			wantParams: FlashInferParams{Causal: false, WindowLeft: -1, OK: true},
		},
		// A table with a row more than the batch (allocated for more
		// sequences): xFormers ignores the row, but its page 4 widens the
		// dense form to pages 0..4.
		"PagedBlockDiagonalPaddedKeysMask.from_seqlens([1], [3], [[1,2],[4,0]], 2)": {
			cfg: MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{3},
				BlockTables: bt(2, []int32{1, 2}, []int32{4, 0}), PageSize: 2},
			want:       `. . | x x | x . | . . | . .`,
			wantParams: FlashInferParams{Causal: false, WindowLeft: -1, OK: true},
		},
		// xFormers' materialize copies every logical page, masked ones too:
		// the padding entry 0 repaints page 0, the sequence's only used
		// page, so the dense form shows nothing (PagedKV still gives the
		// kernel page 0 with 2 keys).
		"PagedBlockDiagonalPaddedKeysMask, padding entry naming a used page": {
			cfg: MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{2},
				BlockTables: bt(2, []int32{0, 0}), PageSize: 2},
			want: `. .`,
		},
		"PagedBlockDiagonalCausalLocalPaddedKeysMask.from_seqlens_local([1], [5], [[3,0,1]], 2, 2)": {
			cfg: MaskConfig{Kind: KindPagedBlockDiagonalCausalLocalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{5},
				BlockTables: bt(3, []int32{3, 0, 1}), PageSize: 2, WindowSize: 2},
			// Keys 3 (page 0, slot 1) and 4 (page 1, slot 0).
			want:       `. x | x . | . . | . .`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: 1, OK: true},
		},
		// The layout of _GappySeqInfo's docstring: starts [0, 7, 12], axis 14.
		"BlockDiagonalGappyKeysMask.from_seqlens([1,2,1], [0,7,12,14], [6,3,1])": {
			cfg: MaskConfig{Kind: KindBlockDiagonalGappyKeys, QSeqLen: []int32{1, 2, 1}, KVSeqLen: []int32{6, 3, 1}, KVSeqStarts: []int32{0, 7, 12, 14}},
			want: `
				x x x x x x . . . . . . . .
				. . . . . . . x x x . . . .
				. . . . . . . x x x . . . .
				. . . . . . . . . . . . x .`,
			wantParams: FlashInferParams{Causal: false, WindowLeft: -1, OK: true},
		},
		"BlockDiagonalCausalWithOffsetGappyKeysMask.from_seqlens([1,2,1], [0,7,12,14], [6,3,1])": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetGappyKeys, QSeqLen: []int32{1, 2, 1}, KVSeqLen: []int32{6, 3, 1}, KVSeqStarts: []int32{0, 7, 12, 14}},
			want: `
				x x x x x x . . . . . . . .
				. . . . . . . x x . . . . .
				. . . . . . . x x x . . . .
				. . . . . . . . . . . . x .`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: -1, OK: true},
		},
		// Blocks out of order and overlapping are allowed.
		"BlockDiagonalGappyKeysMask, overlapping blocks": {
			cfg: MaskConfig{Kind: KindBlockDiagonalGappyKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{3, 2}, KVSeqStarts: []int32{2, 1, 5}},
			want: `
				. . x x x
				. x x . .`,
		},
		// s = 2, window_left 1, window_right 0: keys i+1 .. i+2 of the block
		// at column 1.
		"BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask.from_seqlens_local_gappy([2], [1,6], [4], 1, 0)": {
			cfg: MaskConfig{Kind: KindBlockDiagonalLocalFromBottomRightGappyKeys, QSeqLen: []int32{2}, KVSeqLen: []int32{4}, KVSeqStarts: []int32{1, 6},
				WindowLeft: 1},
			want: `
				. . x x . .
				. . . x x .`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: 1, OK: true},
		},
		// Sequence 0's keys are logical 1,2 of its row (page 3 slot 1, page 1
		// slot 0); sequence 1's are logical 1,2 of its row (page 0 slot 1,
		// page 2 slot 0). FlashInfer sees kv_len 3 with key 0 masked.
		"PagedBlockDiagonalGappyKeysMask.from_seqlens([1,1], [1,1], [2,2], [[3,1],[0,2]], 2)": {
			cfg: MaskConfig{Kind: KindPagedBlockDiagonalGappyKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{2, 2}, KVSeqStarts: []int32{1, 1},
				BlockTables: bt(2, []int32{3, 1}, []int32{0, 2}), PageSize: 2},
			want: `
				. . | x . | . . | . x
				. x | . . | x . | . .`,
		},
		"PagedBlockDiagonalCausalWithOffsetGappyKeysMask.from_seqlens([2], [1], [3], [[1,0]], 2)": {
			cfg: MaskConfig{Kind: KindPagedBlockDiagonalCausalWithOffsetGappyKeys, QSeqLen: []int32{2}, KVSeqLen: []int32{3}, KVSeqStarts: []int32{1},
				BlockTables: bt(2, []int32{1, 0}), PageSize: 2},
			// Logical keys 1..3: 1 on page 1 slot 1, 2..3 on page 0. Row 0
			// sees 1..2, row 1 sees 1..3.
			want: `
				x . | . x
				x x | . x`,
		},
		"LowerTriangularMask, 3×4": {
			cfg: MaskConfig{Kind: KindLowerTriangular, QSeqLen: []int32{3}, KVSeqLen: []int32{4}},
			want: `
				x . . .
				x x . .
				x x x .`,
			wantParams: FlashInferParams{Causal: false, Why: "top-left"},
		},
		"LowerTriangularFromBottomRightMask, 2×4": {
			cfg: MaskConfig{Kind: KindLowerTriangularFromBottomRight, QSeqLen: []int32{2}, KVSeqLen: []int32{4}},
			want: `
				x x x .
				x x x x`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: -1, OK: true},
		},
		"LowerTriangularFromBottomRightLocalAttentionMask(2), 3×4": {
			cfg: MaskConfig{Kind: KindLowerTriangularFromBottomRightLocal, QSeqLen: []int32{3}, KVSeqLen: []int32{4}, WindowSize: 2},
			want: `
				x x . .
				. x x .
				. . x x`,
			wantParams: FlashInferParams{Causal: true, WindowLeft: 1, OK: true},
		},
		// The two examples of LocalAttentionFromBottomRightMask's docstring.
		"LocalAttentionFromBottomRightMask(window_left=1, window_right=2), 4×4": {
			cfg: MaskConfig{Kind: KindLocalAttentionFromBottomRight, QSeqLen: []int32{4}, KVSeqLen: []int32{4}, WindowLeft: 1, WindowRight: 2},
			want: `
				x x x .
				x x x x
				. x x x
				. . x x`,
			wantParams: FlashInferParams{Why: "row 0"},
		},
		"LocalAttentionFromBottomRightMask(window_left=1, window_right=2), 4×5": {
			cfg: MaskConfig{Kind: KindLocalAttentionFromBottomRight, QSeqLen: []int32{4}, KVSeqLen: []int32{5}, WindowLeft: 1, WindowRight: 2},
			want: `
				x x x x .
				. x x x x
				. . x x x
				. . . x x`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _ := requireDrawnMask(t, tc.cfg, tc.want)
			checkFamilyAgainstModels(t, tc.cfg)
			p := m.FlashInferParams()
			switch {
			case tc.wantParams.OK:
				assert.Equal(t, tc.wantParams, p)
			case tc.wantParams.Why != "":
				assert.False(t, p.OK)
				assert.Contains(t, p.Why, tc.wantParams.Why)
			}
		})
	}
}

// The constructors named after xFormers' methods build the same masks as
// NewAttentionMask, and make_paged / make_local_attention chain like
// xFormers' (make_paged takes the rule of paged_type, not of the receiver).
func TestXFormersFamilyConstructors(t *testing.T) {
	same := func(t *testing.T, a, b AttentionMask) {
		t.Helper()
		da, err := a.Materialize()
		require.NoError(t, err)
		db, err := b.Materialize()
		require.NoError(t, err)
		requireSameMask(t, da, db)
		assert.Equal(t, a.Kind(), b.Kind())
	}
	q, kv := []int32{1, 2}, []int32{3, 4}
	tables := bt(2, []int32{2, 0}, []int32{1, 3})

	padded, err := BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens(q, 4, kv)
	require.NoError(t, err)
	paged, err := padded.MakePaged(tables, 2, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys)
	require.NoError(t, err)
	direct, err := PagedBlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens(q, kv, tables, 2)
	require.NoError(t, err)
	same(t, direct, paged)
	assert.Equal(t, 4, direct.KVPadding())
	assert.Equal(t, tables, direct.BlockTables())

	// A non-causal mask paged as causal is causal.
	plain, err := BlockDiagonalPaddedKeysMaskFromSeqlens(q, 4, kv)
	require.NoError(t, err)
	paged, err = plain.MakePaged(tables, 2, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys)
	require.NoError(t, err)
	same(t, direct, paged)
	_, err = plain.MakePaged(tables, 2, KindPagedBlockDiagonalCausalLocalPaddedKeys)
	assert.ErrorIs(t, err, ErrUnknownMaskKind)
	// make_paged re-checks the padding: 1 page of 2 keys is shorter than 4 keys.
	_, err = plain.MakePaged(bt(1, []int32{0}, []int32{1}), 2, KindPagedBlockDiagonalPaddedKeys)
	assert.ErrorIs(t, err, ErrOutOfRange)
	assert.ErrorContains(t, err, "sequence 0 has keys up to 3")

	local, err := BlockDiagonalCausalLocalAttentionPaddedKeysMaskFromSeqlensLocal(q, 4, kv, 2)
	require.NoError(t, err)
	pl, err := local.MakePaged(tables, 2, KindPagedBlockDiagonalCausalLocalPaddedKeys)
	require.NoError(t, err)
	assert.Equal(t, 2, pl.WindowSize())
	pd, err := PagedBlockDiagonalCausalLocalPaddedKeysMaskFromSeqlensLocal(q, kv, tables, 2, 2)
	require.NoError(t, err)
	same(t, pd, pl)
	_, err = local.MakePaged(tables, 2, KindPagedBlockDiagonalPaddedKeys)
	assert.ErrorIs(t, err, ErrUnknownMaskKind)

	two, err := plain.MakeLocalAttention(1, 0)
	require.NoError(t, err)
	twoDirect, err := BlockDiagonalLocalAttentionPaddedKeysMaskFromSeqlensLocal(q, 4, kv, 1, 0)
	require.NoError(t, err)
	same(t, twoDirect, two)
	assert.Equal(t, 1, two.WindowLeft())
	_, err = plain.MakeLocalAttention(-1, 0)
	assert.ErrorIs(t, err, ErrInvalidWindow)

	// Gappy make_paged: keys at 1 and 5 of slots of 4 move to offset 1 of
	// each row of pages.
	gappy, err := BlockDiagonalGappyKeysMaskFromSeqlens([]int32{1, 1}, []int32{1, 5, 8}, []int32{2, 2})
	require.NoError(t, err)
	gp, err := gappy.MakePaged(bt(2, []int32{3, 1}, []int32{0, 2}), 2, 4, KindPagedBlockDiagonalGappyKeys)
	require.NoError(t, err)
	gd, err := PagedBlockDiagonalGappyKeysMaskFromSeqlens([]int32{1, 1}, []int32{1, 1}, []int32{2, 2}, bt(2, []int32{3, 1}, []int32{0, 2}), 2)
	require.NoError(t, err)
	same(t, gd, gp)
	assert.Equal(t, []int32{1, 1}, gd.KVSeqStarts())
	_, err = gappy.MakePaged(bt(2, []int32{3, 1}, []int32{0, 2}), 2, 3, KindPagedBlockDiagonalGappyKeys)
	assert.ErrorIs(t, err, ErrLengthMismatch)
	assert.ErrorContains(t, err, "notional_padding 3 is not a multiple of page_size 2")
	// Notional padding 2 puts sequence 1 at 5-2 = 3: fits 4 keys? 3+2 > 4.
	_, err = gappy.MakePaged(bt(2, []int32{3, 1}, []int32{0, 2}), 2, 2, KindPagedBlockDiagonalGappyKeys)
	assert.ErrorIs(t, err, ErrOutOfRange)

	// The single-sequence classes.
	lt, err := LowerTriangularMask{}.ForShape(3, 4)
	require.NoError(t, err)
	ltCfg, err := NewAttentionMask(MaskConfig{Kind: KindLowerTriangular, QSeqLen: []int32{3}, KVSeqLen: []int32{4}})
	require.NoError(t, err)
	same(t, ltCfg, lt)
	brl, err := LowerTriangularFromBottomRightMask{}.MakeLocalAttention(2)
	require.NoError(t, err)
	assert.Equal(t, 2, brl.WindowSize())
	_, err = LowerTriangularFromBottomRightMask{}.MakeLocalAttention(0)
	assert.ErrorIs(t, err, ErrInvalidWindow)
	_, err = LowerTriangularFromBottomRightLocalAttentionMask{}.ForShape(1, 1)
	assert.ErrorIs(t, err, ErrInvalidWindow)
	la, err := NewLocalAttentionFromBottomRightMask(1, 2)
	require.NoError(t, err)
	sized, err := la.ForShape(4, 5)
	require.NoError(t, err)
	assert.Equal(t, "LocalAttentionFromBottomRightMask(q_seqlen=[4], kv_seqlen=[5], window_left=1, window_right=2)", sized.String())
	_, err = NewLocalAttentionFromBottomRightMask(0, -1)
	assert.ErrorIs(t, err, ErrInvalidWindow)
	_, err = LowerTriangularMask{}.ForShape(-1, 2)
	assert.ErrorIs(t, err, ErrNegativeLength)
}

func TestXFormersFamilyErrors(t *testing.T) {
	good := bt(2, []int32{0, 1}, []int32{2, 3})
	tests := map[string]maskConfigError{
		"padded, empty batch": {MaskConfig{Kind: KindBlockDiagonalPaddedKeys, KVPadding: 2},
			ErrLengthMismatch, "needs at least one block"},
		"padded, kv beyond padding": {MaskConfig{Kind: KindBlockDiagonalCausalLocalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{5}, KVPadding: 4, WindowSize: 2},
			ErrOutOfRange, "block 0 has kv_seqlen 5 > kv_padding 4"},
		"padded local, negative window_left": {MaskConfig{Kind: KindBlockDiagonalLocalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{1}, KVPadding: 1, WindowLeft: -2},
			ErrInvalidWindow, "window_left -2"},
		"padded local, window_size given": {MaskConfig{Kind: KindBlockDiagonalLocalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{1}, KVPadding: 1, WindowSize: 3},
			ErrInvalidWindow, "takes no window_size, got 3"},
		"gappy, no elements": {MaskConfig{Kind: KindBlockDiagonalGappyKeys, KVSeqStarts: []int32{0}},
			ErrLengthMismatch, "empty batch"},
		"gappy, one start too few": {MaskConfig{Kind: KindBlockDiagonalGappyKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 1}, KVSeqStarts: []int32{0, 4}},
			ErrLengthMismatch, "len(kv_seqstarts) = batch size + 1 = 3, got 2"},
		"gappy, block past the axis": {MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetGappyKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 3}, KVSeqStarts: []int32{0, 4, 6}},
			ErrOutOfRange, "block 1 has keys [4, 7)"},
		"gappy, negative start": {MaskConfig{Kind: KindBlockDiagonalGappyKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{1}, KVSeqStarts: []int32{-1, 6}},
			ErrOutOfRange, "kv_seqstarts[0] = -1"},
		"paged, page_size 0": {MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 1}, BlockTables: good},
			ErrNegativeLength, "page_size = 0"},
		"paged, fewer rows than sequences": {MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1, 1, 1}, KVSeqLen: []int32{1, 1, 1}, BlockTables: good, PageSize: 2},
			ErrLengthMismatch, "block_tables has 2 rows, want at least one per sequence (3)"},
		"paged, shape does not hold the data": {MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{1},
			BlockTables: BlockTables{Rows: 1, Cols: 3, Data: []int32{0, 1}}, PageSize: 2},
			ErrLengthMismatch, "block_tables shape 1×3 does not hold its 2 entries"},
		"paged, no columns": {MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{0},
			BlockTables: BlockTables{Rows: 1, Cols: 0, Data: []int32{}}, PageSize: 2},
			ErrNegativeLength, "block_tables has 0 columns"},
		"paged, negative page id": {MaskConfig{Kind: KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 1},
			BlockTables: bt(2, []int32{0, 1}, []int32{-7, 3}), PageSize: 2},
			ErrOutOfRange, "block_tables[1][0] = -7"},
		"paged, page id beyond int32 keys": {MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1}, KVSeqLen: []int32{1},
			BlockTables: bt(1, []int32{1 << 30}), PageSize: 4},
			ErrOutOfRange, "page id 1073741824"},
		"paged, padding shorter than a sequence": {MaskConfig{Kind: KindPagedBlockDiagonalCausalLocalPaddedKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{4, 5},
			BlockTables: good, PageSize: 2, WindowSize: 3},
			ErrOutOfRange, "sequence 1 has keys up to 5 (kv_seqlen 5), beyond its 2 pages of 2 keys (padding 4)"},
		"paged, negative kv_seqlen": {MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, -3},
			BlockTables: good, PageSize: 2},
			ErrNegativeLength, "block 1 has q_seqlen 1, kv_seqlen -3"},
		"paged, kv_padding given": {MaskConfig{Kind: KindPagedBlockDiagonalPaddedKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 1},
			BlockTables: good, PageSize: 2, KVPadding: 4},
			ErrLengthMismatch, "takes no kv_padding"},
		"paged gappy, start at the row end": {MaskConfig{Kind: KindPagedBlockDiagonalGappyKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 0},
			KVSeqStarts: []int32{0, 4}, BlockTables: good, PageSize: 2},
			ErrOutOfRange, "sequence 1 starts at key 4"},
		"paged gappy, block past the row": {MaskConfig{Kind: KindPagedBlockDiagonalGappyKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{3, 0},
			KVSeqStarts: []int32{2, 0}, BlockTables: good, PageSize: 2},
			ErrOutOfRange, "sequence 0 has keys up to 5"},
		"paged gappy, B+1 starts": {MaskConfig{Kind: KindPagedBlockDiagonalGappyKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 1},
			KVSeqStarts: []int32{0, 0, 4}, BlockTables: good, PageSize: 2},
			ErrLengthMismatch, "one kv_seqstarts offset per sequence (2), got 3"},
		"unpaged kind with block tables": {MaskConfig{Kind: KindBlockDiagonal, QSeqLen: []int32{1}, KVSeqLen: []int32{1}, PageSize: 2},
			ErrLengthMismatch, "takes no block_tables"},
		"single sequence, batch of 2": {MaskConfig{Kind: KindLowerTriangular, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{1, 1}},
			ErrLengthMismatch, "one sequence"},
		"single local, window 0": {MaskConfig{Kind: KindLowerTriangularFromBottomRightLocal, QSeqLen: []int32{1}, KVSeqLen: []int32{1}},
			ErrInvalidWindow, "window_size >= 1, got 0"},
	}
	checkMaskConfigErrors(t, tests)
}

// FlashInfer's CSR page table and xFormers' block_tables convert into each
// other exactly, for the keys the kernels read.
func TestPagedKVRoundTrip(t *testing.T) {
	// Three requests of 5, 0 and 4 keys on pages of 2.
	indptr, indices, last := []int32{0, 3, 3, 5}, []int32{7, 2, 4, 0, 9}, []int32{1, 0, 2}
	tables, kvLen, err := BlockTablesFromPagedKV(indptr, indices, last, 2, 0, 8)
	require.NoError(t, err)
	assert.Equal(t, bt(3, []int32{7, 2, 4}, []int32{8, 8, 8}, []int32{0, 9, 8}), tables)
	assert.Equal(t, []int32{5, 0, 4}, kvLen)
	m, err := PagedBlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens([]int32{1, 0, 2}, kvLen, tables, 2)
	require.NoError(t, err)
	pkv, err := m.PagedKV()
	require.NoError(t, err)
	assert.Equal(t, PagedKV{QOIndptr: []int32{0, 1, 1, 3}, KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last, PageSize: 2}, pkv)
	assert.Equal(t, FlashInferParams{Causal: true, WindowLeft: -1, OK: true}, m.FlashInferParams())

	_, _, err = BlockTablesFromPagedKV(indptr, indices, last, 2, 2, 0)
	assert.ErrorIs(t, err, ErrOutOfRange)
	assert.ErrorContains(t, err, "2 columns cannot hold a request of 3 pages")
	_, _, err = BlockTablesFromPagedKV(indptr, indices, []int32{1, 1, 2}, 2, 0, 0)
	assert.ErrorIs(t, err, ErrBadLastPageLen)
	_, _, err = BlockTablesFromPagedKV(indptr, []int32{7, 2, 4, -1, 9}, last, 2, 0, 0)
	assert.ErrorIs(t, err, ErrOutOfRange)
	assert.ErrorContains(t, err, "kv_indices[3] = -1")
	_, _, err = BlockTablesFromPagedKV(indptr, indices, last, 2, 0, -1)
	assert.ErrorContains(t, err, "pad page id -1")
	_, _, err = BlockTablesFromPagedKV(indptr, indices[:4], last, 2, 0, 0)
	assert.ErrorIs(t, err, ErrBadIndptr)

	_, err = BlockDiagonalMask{}.PagedKV()
	assert.ErrorIs(t, err, ErrNotPaged)

	// And back to the mask.
	back, err := MaskFromPagedKV(KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, pkv, nil, 0, 3, 8)
	require.NoError(t, err)
	assert.Equal(t, m.String(), back.String())
	assert.Equal(t, tables, back.(PagedBlockDiagonalCausalWithOffsetPaddedKeysMask).BlockTables())
	// Request 0's first key is not its own: a paged gappy mask.
	gappy, err := MaskFromPagedKV(KindPagedBlockDiagonalGappyKeys, pkv, []int32{1, 0, 0}, 0, 0, 8)
	require.NoError(t, err)
	assert.Equal(t, []int32{4, 0, 4}, gappy.KVSeqLen())
	gpkv, err := gappy.(PagedBlockDiagonalGappyKeysMask).PagedKV()
	require.NoError(t, err)
	assert.Equal(t, pkv, gpkv)
	_, err = MaskFromPagedKV(KindBlockDiagonalPaddedKeys, pkv, nil, 0, 0, 0)
	assert.ErrorIs(t, err, ErrNotPaged)
	_, err = MaskFromPagedKV(KindPagedBlockDiagonalGappyKeys, pkv, []int32{6, 0, 0}, 0, 0, 0)
	assert.ErrorIs(t, err, ErrOutOfRange)
	assert.ErrorContains(t, err, "request 0 has kv_seqstarts 6, want 0..5")
	_, err = MaskFromPagedKV(KindPagedBlockDiagonalPaddedKeys, pkv, []int32{0, 0, 0}, 0, 0, 0)
	assert.ErrorIs(t, err, ErrLengthMismatch)
	bad := pkv
	bad.QOIndptr = []int32{0, 1}
	_, err = MaskFromPagedKV(KindPagedBlockDiagonalPaddedKeys, bad, nil, 0, 0, 0)
	assert.ErrorContains(t, err, "qo_indptr has 1 requests, kv_indptr 3")
}

func TestFromTensorListAndSplit(t *testing.T) {
	// Two tensors [2, 2, 1] and [1, 3, 1]: blocks of 2, 2 and 3 tokens.
	a := Tensor[int]{Shape: []int{2, 2, 1}, Data: []int{0, 1, 2, 3}}
	b := Tensor[int]{Shape: []int{1, 3, 1}, Data: []int{4, 5, 6}}
	m, cat, err := FromTensorList([]Tensor[int]{a, b})
	require.NoError(t, err)
	assert.Equal(t, []int32{2, 2, 3}, m.QSeqLen())
	assert.Equal(t, []int{2, 1}, m.BatchSizes())
	assert.Equal(t, Tensor[int]{Shape: []int{1, 7, 1}, Data: []int{0, 1, 2, 3, 4, 5, 6}}, cat)
	parts, err := Split(m, cat)
	require.NoError(t, err)
	assert.Equal(t, []Tensor[int]{a, b}, parts)
	// make_causal keeps the batch sizes, so the causal mask splits alike.
	parts, err = Split(m.MakeCausal(), cat)
	require.NoError(t, err)
	assert.Equal(t, []Tensor[int]{a, b}, parts)

	// Without recorded batch sizes: one part per block.
	plain, err := BlockDiagonalMaskFromSeqlens([]int32{1, 2}, []int32{1, 2})
	require.NoError(t, err)
	x := Tensor[string]{Shape: []int{1, 3}, Data: []string{"a", "b", "c"}}
	ps, err := Split(plain, x)
	require.NoError(t, err)
	assert.Equal(t, []Tensor[string]{{Shape: []int{1, 1}, Data: []string{"a"}}, {Shape: []int{1, 2}, Data: []string{"b", "c"}}}, ps)

	// Queries and keys divided differently: split refuses, split_kv works.
	qk, err := BlockDiagonalMaskFromSeqlens([]int32{1, 1}, []int32{2, 1})
	require.NoError(t, err)
	_, err = Split(qk, x)
	assert.ErrorIs(t, err, ErrLengthMismatch)
	kvParts, err := SplitKV(qk, x)
	require.NoError(t, err)
	assert.Len(t, kvParts, 2)
	_, err = SplitQueries(qk, x)
	assert.ErrorContains(t, err, "want [1, 2, ...]")

	_, err = Split(BlockDiagonalPaddedKeysMask{}, x)
	assert.ErrorIs(t, err, ErrUnknownMaskKind)
	_, _, err = FromTensorList([]Tensor[int]{a, {Shape: []int{1, 1, 2}, Data: []int{0, 0}}})
	assert.ErrorContains(t, err, "trailing dimensions differ")
	_, _, err = FromTensorList([]Tensor[int]{{Shape: []int{1, 2}, Data: []int{0}}})
	assert.ErrorIs(t, err, ErrLengthMismatch)
	_, _, err = FromTensorList[int](nil)
	assert.ErrorContains(t, err, "at least one tensor")
	_, _, err = FromTensorList([]Tensor[int]{{Shape: []int{1, 2, 0}, Data: []int{}}})
	assert.ErrorContains(t, err, "tokens of 0 elements")
	// A part of batch size 0 cannot be reshaped (torch cannot infer -1).
	z, zc, err := FromTensorList([]Tensor[int]{{Shape: []int{0, 2, 1}, Data: []int{}}, b})
	require.NoError(t, err)
	_, err = Split(z, zc)
	assert.ErrorContains(t, err, "part 0 has 0 tokens for batch size 0")
}

func TestKindsTable(t *testing.T) {
	ks := Kinds()
	assert.Len(t, ks, 21)
	for _, k := range ks {
		assert.NotEmpty(t, k.XFormersClass(), k)
	}
	assert.Equal(t, "PagedBlockDiagonalCausalLocalPaddedKeysMask", KindPagedBlockDiagonalCausalLocalPaddedKeys.XFormersClass())
	var names []string
	for _, k := range ks {
		names = append(names, k.XFormersClass())
	}
	assert.Contains(t, fmt.Sprint(names), "BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask")
	assert.True(t, errors.Is(fmt.Errorf("x: %w", ErrNotPaged), ErrNotPaged))
}

// The FlashInfer column of docs/masks.md's class table, checked on random
// configurations: where the table promises causal/window_left, that is what
// FlashInferParams returns (and checkFamilyAgainstModels has shown it
// exact); where it says "custom mask needed", FlashInferParams finds nothing
// in general.
func TestFlashInferColumnOfTheClassTable(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(22, 2))
	for iter := 0; iter < 3000; iter++ {
		kind := newKinds[iter%len(newKinds)]
		cfg := randomFamilyConfig(r, kind)
		m, err := NewAttentionMask(cfg)
		require.NoError(t, err)
		p := m.FlashInferParams()
		want := func(causal bool, w int) {
			t.Helper()
			if !p.OK || p.Causal != causal || p.WindowLeft != w {
				t.Fatalf("%s: FlashInferParams %+v, the table says causal=%t window_left=%d", m, p, causal, w)
			}
		}
		zeroStarts := !slices.ContainsFunc(cfg.KVSeqStarts, func(s int32) bool { return s != 0 })
		qMax := slices.Max(cfg.QSeqLen)
		switch kind {
		case KindBlockDiagonalPaddedKeys, KindPagedBlockDiagonalPaddedKeys, KindBlockDiagonalGappyKeys:
			want(false, -1)
		case KindPagedBlockDiagonalGappyKeys:
			if zeroStarts {
				want(false, -1)
			}
		case KindPagedBlockDiagonalCausalWithOffsetGappyKeys:
			if zeroStarts {
				want(true, -1)
			}
		case KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, KindBlockDiagonalCausalWithOffsetGappyKeys, KindLowerTriangularFromBottomRight:
			want(true, -1)
		case KindBlockDiagonalCausalLocalPaddedKeys, KindPagedBlockDiagonalCausalLocalPaddedKeys, KindLowerTriangularFromBottomRightLocal:
			if cfg.WindowSize >= 1 {
				want(true, cfg.WindowSize-1)
			}
		case KindBlockDiagonalLocalPaddedKeys, KindLocalAttentionFromBottomRight:
			switch {
			case cfg.WindowRight == 0:
				want(true, cfg.WindowLeft)
			case int32(cfg.WindowRight) >= qMax-1:
				want(false, cfg.WindowLeft)
			}
		case KindLowerTriangular:
			if cfg.QSeqLen[0] == cfg.KVSeqLen[0] {
				want(true, -1)
			}
		}
	}
}
