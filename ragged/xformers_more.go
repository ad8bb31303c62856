package ragged

// The rest of xFormers' attention-bias family: padded-keys masks without
// offset causality, gappy keys, and the single-sequence masks.

import "fmt"

// BlockDiagonalPaddedKeysMask is xFormers' BlockDiagonalPaddedKeysMask:
// queries packed without padding, block b's keys in columns
// [b*kv_padding, b*kv_padding + kv_seqlen[b]), and every real key of the
// block visible to every query of it.
type BlockDiagonalPaddedKeysMask struct{ blockDiagonal }

// BlockDiagonalPaddedKeysMaskFromSeqlens is
// BlockDiagonalPaddedKeysMask.from_seqlens(q_seqlen, kv_padding, kv_seqlen):
// kv_padding >= 1 and >= every kv_seqlen, and a non-empty batch.
func BlockDiagonalPaddedKeysMaskFromSeqlens(qSeqLen []int32, kvPadding int, kvSeqLen []int32) (BlockDiagonalPaddedKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalPaddedKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVPadding: kvPadding})
	return BlockDiagonalPaddedKeysMask{m}, err
}

// MakeLocalAttention is make_local_attention(window_left, window_right):
// with s = kv_seqlen - q_seqlen, query i sees keys i+s-window_left ..
// i+s+window_right. Both windows must be >= 0 ([ErrInvalidWindow]; xFormers
// checks it when it materialises the mask).
func (m BlockDiagonalPaddedKeysMask) MakeLocalAttention(windowLeft, windowRight int) (BlockDiagonalLocalAttentionPaddedKeysMask, error) {
	d, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalLocalPaddedKeys, QSeqLen: m.qSeqLen, KVSeqLen: m.kvSeqLen, KVPadding: m.kvPadding,
		WindowLeft: windowLeft, WindowRight: windowRight})
	return BlockDiagonalLocalAttentionPaddedKeysMask{d}, err
}

// MakeLocalAttention is [BlockDiagonalPaddedKeysMask.MakeLocalAttention]
// (inherited: the result is not causal beyond what window_right allows).
func (m BlockDiagonalCausalWithOffsetPaddedKeysMask) MakeLocalAttention(windowLeft, windowRight int) (BlockDiagonalLocalAttentionPaddedKeysMask, error) {
	return BlockDiagonalPaddedKeysMask(m).MakeLocalAttention(windowLeft, windowRight)
}

// BlockDiagonalLocalAttentionPaddedKeysMask is xFormers'
// BlockDiagonalLocalAttentionPaddedKeysMask: padded keys, and within block b
// (s = kv_seqlen[b] - q_seqlen[b]) query i sees the real keys j with
// i+s-window_left <= j <= i+s+window_right. With window_right = 0 it is
// BlockDiagonalCausalLocalAttentionPaddedKeysMask with window_size =
// window_left+1.
type BlockDiagonalLocalAttentionPaddedKeysMask struct{ blockDiagonal }

// BlockDiagonalLocalAttentionPaddedKeysMaskFromSeqlensLocal is its
// from_seqlens_local(q_seqlen, kv_padding, kv_seqlen, window_left,
// window_right).
func BlockDiagonalLocalAttentionPaddedKeysMaskFromSeqlensLocal(qSeqLen []int32, kvPadding int, kvSeqLen []int32, windowLeft, windowRight int) (BlockDiagonalLocalAttentionPaddedKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalLocalPaddedKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVPadding: kvPadding,
		WindowLeft: windowLeft, WindowRight: windowRight})
	return BlockDiagonalLocalAttentionPaddedKeysMask{m}, err
}

// BlockDiagonalCausalLocalAttentionPaddedKeysMask is xFormers'
// BlockDiagonalCausalLocalAttentionPaddedKeysMask: padded keys, and query i
// of block b sees the real keys j with i+s-window_size < j <= i+s (s =
// kv_seqlen[b] - q_seqlen[b]): bottom-right causal with a sliding window.
// This is the decode mask of Mistral's rolling cache with window W: one
// query per sequence sees the last min(kv_seqlen, W) keys.
type BlockDiagonalCausalLocalAttentionPaddedKeysMask struct{ blockDiagonal }

// BlockDiagonalCausalLocalAttentionPaddedKeysMaskFromSeqlensLocal is its
// from_seqlens_local(q_seqlen, kv_padding, kv_seqlen, window_size). Like
// xFormers it does not check window_size: w <= 0 masks every key.
func BlockDiagonalCausalLocalAttentionPaddedKeysMaskFromSeqlensLocal(qSeqLen []int32, kvPadding int, kvSeqLen []int32, windowSize int) (BlockDiagonalCausalLocalAttentionPaddedKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalCausalLocalPaddedKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVPadding: kvPadding,
		WindowSize: windowSize})
	return BlockDiagonalCausalLocalAttentionPaddedKeysMask{m}, err
}

// BlockDiagonalGappyKeysMask is xFormers' BlockDiagonalGappyKeysMask:
// queries packed without padding; block b's keys are the columns
// [kv_seqstarts[b], kv_seqstarts[b]+kv_seqlen[b]) of a key axis of
// kv_seqstarts[B] columns. Blocks may sit anywhere on the axis, with gaps
// between them, out of order, or overlapping. Every key of the block is
// visible.
type BlockDiagonalGappyKeysMask struct{ blockDiagonal }

// BlockDiagonalGappyKeysMaskFromSeqlens is
// BlockDiagonalGappyKeysMask.from_seqlens(q_seqlen, kv_seqstarts,
// kv_seqlen): len(kv_seqstarts) = B+1 and B >= 1 as xFormers checks, and
// (beyond xFormers, whose slicing would cut such a block silently) every
// block must lie inside [0, kv_seqstarts[B]).
func BlockDiagonalGappyKeysMaskFromSeqlens(qSeqLen, kvSeqStarts, kvSeqLen []int32) (BlockDiagonalGappyKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalGappyKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVSeqStarts: kvSeqStarts})
	return BlockDiagonalGappyKeysMask{m}, err
}

// BlockDiagonalCausalWithOffsetGappyKeysMask is xFormers'
// BlockDiagonalCausalWithOffsetGappyKeysMask: gappy keys, and query i of
// block b sees the block's keys j <= i + kv_seqlen[b] - q_seqlen[b].
type BlockDiagonalCausalWithOffsetGappyKeysMask struct{ blockDiagonal }

// BlockDiagonalCausalWithOffsetGappyKeysMaskFromSeqlens is its
// from_seqlens(q_seqlen, kv_seqstarts, kv_seqlen) (inherited from
// BlockDiagonalGappyKeysMask, same checks).
func BlockDiagonalCausalWithOffsetGappyKeysMaskFromSeqlens(qSeqLen, kvSeqStarts, kvSeqLen []int32) (BlockDiagonalCausalWithOffsetGappyKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetGappyKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVSeqStarts: kvSeqStarts})
	return BlockDiagonalCausalWithOffsetGappyKeysMask{m}, err
}

// BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask is xFormers'
// BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask: gappy keys, and
// query i of block b sees the block's keys j with i+s-window_left <= j <=
// i+s+window_right (s = kv_seqlen[b] - q_seqlen[b]). xFormers does not check
// the windows here; negative ones narrow the band, possibly to nothing.
type BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask struct{ blockDiagonal }

// BlockDiagonalLocalAttentionFromBottomRightGappyKeysMaskFromSeqlensLocalGappy
// is its from_seqlens_local_gappy(q_seqlen, kv_seqstarts, kv_seqlen,
// window_left, window_right).
func BlockDiagonalLocalAttentionFromBottomRightGappyKeysMaskFromSeqlensLocalGappy(qSeqLen, kvSeqStarts, kvSeqLen []int32, windowLeft, windowRight int) (BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalLocalFromBottomRightGappyKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVSeqStarts: kvSeqStarts,
		WindowLeft: windowLeft, WindowRight: windowRight})
	return BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask{m}, err
}

// SingleSequenceMask is one of xFormers' single-sequence masks
// (LowerTriangularMask and relatives) bound to a shape [q, kv]: xFormers
// applies such a mask to every batch element alike, so FlashInfer gets one
// request of qo_len q, kv_len kv per batch element. Build one with the
// ForShape method of [LowerTriangularMask] and relatives, or with
// [NewAttentionMask] (QSeqLen [q], KVSeqLen [kv]).
type SingleSequenceMask struct{ blockDiagonal }

func single(kind MaskKind, qLen, kvLen, w, wl, wr int) (SingleSequenceMask, error) {
	if qLen > 1<<31-1 || kvLen > 1<<31-1 || qLen < -1<<31 || kvLen < -1<<31 {
		return SingleSequenceMask{}, errTooLargeShape(kind, qLen, kvLen)
	}
	m, err := newBlockDiagonal(MaskConfig{Kind: kind, QSeqLen: []int32{int32(qLen)}, KVSeqLen: []int32{int32(kvLen)},
		WindowSize: w, WindowLeft: wl, WindowRight: wr})
	return SingleSequenceMask{m}, err
}

func errTooLargeShape(kind MaskKind, qLen, kvLen int) error {
	return fmt.Errorf("%w: %s shape %d×%d beyond int32", ErrTooLarge, kind, qLen, kvLen)
}

// LowerTriangularMask is xFormers' LowerTriangularMask: query i sees keys
// j <= i (top-left aligned, whatever the shape).
type LowerTriangularMask struct{}

// ForShape binds the mask to q queries and kv keys (both >= 0).
func (LowerTriangularMask) ForShape(qLen, kvLen int) (SingleSequenceMask, error) {
	return single(KindLowerTriangular, qLen, kvLen, 0, 0, 0)
}

// LowerTriangularFromBottomRightMask is xFormers'
// LowerTriangularFromBottomRightMask: query i sees keys j <= i + kv - q, so
// the last query sees the last key.
type LowerTriangularFromBottomRightMask struct{}

// ForShape binds the mask to q queries and kv keys (both >= 0).
func (LowerTriangularFromBottomRightMask) ForShape(qLen, kvLen int) (SingleSequenceMask, error) {
	return single(KindLowerTriangularFromBottomRight, qLen, kvLen, 0, 0, 0)
}

// MakeLocalAttention is make_local_attention(window_size).
func (LowerTriangularFromBottomRightMask) MakeLocalAttention(windowSize int) (LowerTriangularFromBottomRightLocalAttentionMask, error) {
	return NewLowerTriangularFromBottomRightLocalAttentionMask(windowSize)
}

// LowerTriangularFromBottomRightLocalAttentionMask is xFormers'
// LowerTriangularFromBottomRightLocalAttentionMask(window_size): with
// s = kv - q, query i sees keys i+s-window_size < j <= i+s.
type LowerTriangularFromBottomRightLocalAttentionMask struct{ windowSize int }

// NewLowerTriangularFromBottomRightLocalAttentionMask checks window_size
// >= 1 as xFormers does ([ErrInvalidWindow]).
func NewLowerTriangularFromBottomRightLocalAttentionMask(windowSize int) (LowerTriangularFromBottomRightLocalAttentionMask, error) {
	if _, err := single(KindLowerTriangularFromBottomRightLocal, 0, 0, windowSize, 0, 0); err != nil {
		return LowerTriangularFromBottomRightLocalAttentionMask{}, err
	}
	return LowerTriangularFromBottomRightLocalAttentionMask{windowSize}, nil
}

// WindowSize returns window_size.
func (m LowerTriangularFromBottomRightLocalAttentionMask) WindowSize() int { return m.windowSize }

// ForShape binds the mask to q queries and kv keys (both >= 0). The zero
// value has window_size 0 and is rejected here.
func (m LowerTriangularFromBottomRightLocalAttentionMask) ForShape(qLen, kvLen int) (SingleSequenceMask, error) {
	return single(KindLowerTriangularFromBottomRightLocal, qLen, kvLen, m.windowSize, 0, 0)
}

// LocalAttentionFromBottomRightMask is xFormers'
// LocalAttentionFromBottomRightMask(window_left, window_right): with
// s = kv - q, query i sees keys i+s-window_left <= j <= i+s+window_right
// (window_left+1+window_right keys at most; not causal unless window_right
// is 0).
type LocalAttentionFromBottomRightMask struct{ windowLeft, windowRight int }

// NewLocalAttentionFromBottomRightMask checks window_left >= 0 and
// window_right >= 0 as xFormers does ([ErrInvalidWindow]).
func NewLocalAttentionFromBottomRightMask(windowLeft, windowRight int) (LocalAttentionFromBottomRightMask, error) {
	if _, err := single(KindLocalAttentionFromBottomRight, 0, 0, 0, windowLeft, windowRight); err != nil {
		return LocalAttentionFromBottomRightMask{}, err
	}
	return LocalAttentionFromBottomRightMask{windowLeft, windowRight}, nil
}

// WindowLeft returns window_left.
func (m LocalAttentionFromBottomRightMask) WindowLeft() int { return m.windowLeft }

// WindowRight returns window_right.
func (m LocalAttentionFromBottomRightMask) WindowRight() int { return m.windowRight }

// ForShape binds the mask to q queries and kv keys (both >= 0).
func (m LocalAttentionFromBottomRightMask) ForShape(qLen, kvLen int) (SingleSequenceMask, error) {
	return single(KindLocalAttentionFromBottomRight, qLen, kvLen, 0, m.windowLeft, m.windowRight)
}
