package ragged

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// MaskKind names a member of xFormers' block-diagonal mask family. The
// strings are the `mask` parameter of the golden `attention_mask` cases.
type MaskKind string

const (
	// KindBlockDiagonal is xFormers' BlockDiagonalMask: block b's queries see
	// every key of block b.
	KindBlockDiagonal MaskKind = "block_diagonal"
	// KindBlockDiagonalCausal is BlockDiagonalCausalMask: within a block,
	// query i sees key j when j <= i (top-left aligned).
	KindBlockDiagonalCausal MaskKind = "block_diagonal_causal"
	// KindBlockDiagonalCausalFromBottomRight is
	// BlockDiagonalCausalFromBottomRightMask: j <= i + kv_len - q_len.
	KindBlockDiagonalCausalFromBottomRight MaskKind = "block_diagonal_causal_from_bottomright"
	// KindBlockDiagonalCausalLocal is BlockDiagonalCausalLocalAttentionMask
	// (BlockDiagonalCausalMask.make_local_attention(w)):
	// i - w + 1 <= j <= i.
	KindBlockDiagonalCausalLocal MaskKind = "block_diagonal_causal_local"
	// KindBlockDiagonalCausalLocalFromBottomRight is
	// BlockDiagonalCausalLocalAttentionFromBottomRightMask
	// (BlockDiagonalMask.make_local_attention_from_bottomright(w)): with
	// s = kv_len - q_len, i + s - w + 1 <= j <= i + s.
	KindBlockDiagonalCausalLocalFromBottomRight MaskKind = "block_diagonal_causal_local_from_bottomright"
	// KindBlockDiagonalCausalWithOffsetPaddedKeys is
	// BlockDiagonalCausalWithOffsetPaddedKeysMask: block b's keys occupy
	// columns [b*kv_padding, b*kv_padding + kv_seqlen[b]), and query i sees
	// key j when j < kv_seqlen[b] and j <= i + kv_seqlen[b] - q_seqlen[b].
	KindBlockDiagonalCausalWithOffsetPaddedKeys MaskKind = "block_diagonal_causal_with_offset_padded_keys"
)

// blockDiagonal is the shared representation of every xFormers mask here.
// It is immutable after construction; its slices are never written again,
// so copies of a mask value may share them.
type blockDiagonal struct {
	kind     MaskKind
	qSeqLen  []int32 // [B] queries per block, >= 0
	kvSeqLen []int32 // [B] real (unpadded) keys per block, >= 0
	// qStart[b] is block b's first row: prefix sums of qSeqLen, [B+1].
	qStart []int
	// kvStart[b] is block b's first column, [B+1]: prefix sums of kvSeqLen,
	// or b*kvPadding for the padded kind (so kvStart[B] = B*kvPadding).
	kvStart     []int
	causal      bool // any causal kind
	bottomRight bool // the causal diagonal ends at the block's last key
	window      int  // >= 1 for the local kinds, 0 = no window
	kvPadding   int  // >= 1 for the padded kind, 0 otherwise
}

// newBlockDiagonal validates the lengths as xFormers' constructors do and
// builds the row/column starts.
func newBlockDiagonal(kind MaskKind, qSeqLen, kvSeqLen []int32, window, kvPadding int) (blockDiagonal, error) {
	m := blockDiagonal{kind: kind, window: window, kvPadding: kvPadding}
	switch kind {
	case KindBlockDiagonal:
	case KindBlockDiagonalCausal:
		m.causal = true
	case KindBlockDiagonalCausalFromBottomRight, KindBlockDiagonalCausalWithOffsetPaddedKeys:
		m.causal, m.bottomRight = true, true
	case KindBlockDiagonalCausalLocal:
		m.causal = true
	case KindBlockDiagonalCausalLocalFromBottomRight:
		m.causal, m.bottomRight = true, true
	default:
		return blockDiagonal{}, fmt.Errorf("%w: %q", ErrUnknownMaskKind, kind)
	}
	local := kind == KindBlockDiagonalCausalLocal || kind == KindBlockDiagonalCausalLocalFromBottomRight
	padded := kind == KindBlockDiagonalCausalWithOffsetPaddedKeys
	switch {
	case local && window < 1:
		return blockDiagonal{}, fmt.Errorf("%w: %s needs window_size >= 1, got %d", ErrInvalidWindow, kind, window)
	case !local && window != 0:
		return blockDiagonal{}, fmt.Errorf("%w: %s takes no window_size, got %d", ErrInvalidWindow, kind, window)
	case padded && kvPadding < 1:
		return blockDiagonal{}, fmt.Errorf("%w: %s needs kv_padding >= 1, got %d", ErrNegativeLength, kind, kvPadding)
	case !padded && kvPadding != 0:
		return blockDiagonal{}, fmt.Errorf("%w: %s takes no kv_padding, got %d", ErrLengthMismatch, kind, kvPadding)
	}
	if len(qSeqLen) != len(kvSeqLen) {
		return blockDiagonal{}, fmt.Errorf("%w: %d q_seqlen, %d kv_seqlen", ErrLengthMismatch, len(qSeqLen), len(kvSeqLen))
	}
	batch := len(qSeqLen)
	m.qSeqLen = append([]int32(nil), qSeqLen...)
	m.kvSeqLen = append([]int32(nil), kvSeqLen...)
	m.qStart = make([]int, batch+1)
	m.kvStart = make([]int, batch+1)
	for b := 0; b < batch; b++ {
		q, kv := int(qSeqLen[b]), int(kvSeqLen[b])
		if q < 0 || kv < 0 {
			return blockDiagonal{}, fmt.Errorf("%w: block %d has q_seqlen %d, kv_seqlen %d", ErrNegativeLength, b, q, kv)
		}
		if padded && kv > kvPadding {
			return blockDiagonal{}, fmt.Errorf("%w: block %d has kv_seqlen %d > kv_padding %d", ErrOutOfRange, b, kv, kvPadding)
		}
		if m.bottomRight && !padded && kv < q {
			// xFormers: "Expected num_keys >= num_queries"; the first q-kv
			// queries would see nothing.
			return blockDiagonal{}, fmt.Errorf("%w: %s block %d has kv_seqlen %d < q_seqlen %d",
				ErrNoVisibleKey, kind, b, kv, q)
		}
		if kind == KindBlockDiagonalCausalLocal && q-window >= kv {
			// xFormers: "No keys are attended"; query kv+window-1 sees nothing.
			return blockDiagonal{}, fmt.Errorf("%w: %s block %d has q_seqlen %d >= kv_seqlen %d + window_size %d",
				ErrNoVisibleKey, kind, b, q, kv, window)
		}
		m.qStart[b+1] = m.qStart[b] + q
		if padded {
			m.kvStart[b+1] = m.kvStart[b] + kvPadding
		} else {
			m.kvStart[b+1] = m.kvStart[b] + kv
		}
		if m.qStart[b+1] > math.MaxInt32 || m.kvStart[b+1] > math.MaxInt32 {
			return blockDiagonal{}, fmt.Errorf("%w: block %d ends at row %d, column %d, beyond int32",
				ErrTooLarge, b, m.qStart[b+1], m.kvStart[b+1])
		}
	}
	return m, nil
}

// rowRange returns the keys that query i of block b may attend as a
// half-open interval [lo, hi) of key indices local to the block; an empty
// row is (0, 0).
func (m blockDiagonal) rowRange(b, i int) (lo, hi int) {
	kv := int(m.kvSeqLen[b])
	lo, hi = 0, kv
	if m.causal {
		diag := i // last visible key
		if m.bottomRight {
			diag += kv - int(m.qSeqLen[b])
		}
		hi = min(kv, diag+1)
		if m.window > 0 {
			lo = max(0, diag-m.window+1)
		}
	}
	if lo >= hi {
		return 0, 0
	}
	return lo, hi
}

// Kind returns the mask's xFormers class as a [MaskKind].
func (m blockDiagonal) Kind() MaskKind { return m.kind }

// BatchSize returns the number of blocks (requests).
func (m blockDiagonal) BatchSize() int { return len(m.qSeqLen) }

// QSeqLen returns a copy of the per-block query lengths, [BatchSize].
func (m blockDiagonal) QSeqLen() []int32 { return append([]int32(nil), m.qSeqLen...) }

// KVSeqLen returns a copy of the per-block key lengths (without padding),
// [BatchSize].
func (m blockDiagonal) KVSeqLen() []int32 { return append([]int32(nil), m.kvSeqLen...) }

// WindowSize returns xFormers' window_size (>= 1) for the local kinds and 0
// for the others.
func (m blockDiagonal) WindowSize() int { return m.window }

// KVPadding returns kv_padding for the padded-keys kind and 0 otherwise.
func (m blockDiagonal) KVPadding() int { return m.kvPadding }

// Shape returns the dense shape xFormers' materialize expects: rows =
// sum(q_seqlen); cols = sum(kv_seqlen), or BatchSize*kv_padding for the
// padded-keys kind.
func (m blockDiagonal) Shape() (rows, cols int) {
	if len(m.qStart) == 0 {
		return 0, 0
	}
	return m.qStart[len(m.qStart)-1], m.kvStart[len(m.kvStart)-1]
}

// At reports whether dense row row may attend dense column col (the
// materialised mask's cell, without materialising it). It panics outside
// [Shape].
func (m blockDiagonal) At(row, col int) bool {
	rows, cols := m.Shape()
	if row < 0 || row >= rows || col < 0 || col >= cols {
		panic(fmt.Sprintf("ragged: %s.At(%d, %d) outside %d×%d", m.kind, row, col, rows, cols))
	}
	// The block whose rows contain row: the last b with qStart[b] <= row.
	b := sort.SearchInts(m.qStart, row+1) - 1
	lo, hi := m.rowRange(b, row-m.qStart[b])
	j := col - m.kvStart[b]
	return j >= lo && j < hi
}

// Materialize returns the dense mask of [Shape], as xFormers'
// materialize(shape).exp() does (1 = allowed, 0 = masked): block b is placed
// at rows qStart[b].. and columns kvStart[b].., and everything off the blocks
// is masked. Shapes above [MaxDenseCells] wrap [ErrTooLarge].
func (m blockDiagonal) Materialize() (Dense, error) {
	rows, cols := m.Shape()
	d, err := NewDense(rows, cols)
	if err != nil {
		return Dense{}, fmt.Errorf("%s: %w", m.kind, err)
	}
	for b := range m.qSeqLen {
		for i := 0; i < int(m.qSeqLen[b]); i++ {
			lo, hi := m.rowRange(b, i)
			row := d.Allowed[(m.qStart[b]+i)*cols+m.kvStart[b]:]
			for j := lo; j < hi; j++ {
				row[j] = true
			}
		}
	}
	return d, nil
}

// String describes the mask in xFormers' terms, e.g.
// "BlockDiagonalCausalLocalAttentionMask(q_seqlen=[2 1 2], kv_seqlen=[2 1 2], window_size=3)".
func (m blockDiagonal) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s(q_seqlen=%v", xformersName[m.kind], m.qSeqLen)
	if m.kvPadding > 0 {
		fmt.Fprintf(&sb, ", kv_padding=%d", m.kvPadding)
	}
	fmt.Fprintf(&sb, ", kv_seqlen=%v", m.kvSeqLen)
	if m.window > 0 {
		fmt.Fprintf(&sb, ", window_size=%d", m.window)
	}
	sb.WriteByte(')')
	return sb.String()
}

var xformersName = map[MaskKind]string{
	KindBlockDiagonal:                           "BlockDiagonalMask",
	KindBlockDiagonalCausal:                     "BlockDiagonalCausalMask",
	KindBlockDiagonalCausalFromBottomRight:      "BlockDiagonalCausalFromBottomRightMask",
	KindBlockDiagonalCausalLocal:                "BlockDiagonalCausalLocalAttentionMask",
	KindBlockDiagonalCausalLocalFromBottomRight: "BlockDiagonalCausalLocalAttentionFromBottomRightMask",
	KindBlockDiagonalCausalWithOffsetPaddedKeys: "BlockDiagonalCausalWithOffsetPaddedKeysMask",
}

// AttentionMask is what every xFormers mask type here provides. All of them
// are immutable values, safe for concurrent use.
type AttentionMask interface {
	Kind() MaskKind
	BatchSize() int
	QSeqLen() []int32
	KVSeqLen() []int32
	WindowSize() int
	KVPadding() int
	Shape() (rows, cols int)
	At(row, col int) bool
	Materialize() (Dense, error)
	ToFlashInfer() (FlashInferMask, error)
	FlashInferParams() FlashInferParams
	String() string
}

// MaskConfig selects and sizes an xFormers mask for [NewAttentionMask].
type MaskConfig struct {
	Kind     MaskKind
	QSeqLen  []int32 // [B] queries per block (xFormers q_seqlen)
	KVSeqLen []int32 // [B] keys per block (kv_seqlen), without padding
	// WindowSize is xFormers' window_size (>= 1) for the two local kinds and
	// must be 0 for the others.
	WindowSize int
	// KVPadding is kv_padding (>= every KVSeqLen, >= 1) for the padded-keys
	// kind and must be 0 for the others.
	KVPadding int
}

// NewAttentionMask builds the mask cfg describes; the concrete type is the
// one named after the xFormers class (e.g. [BlockDiagonalCausalLocalAttentionMask]
// for [KindBlockDiagonalCausalLocal]). It enforces the same preconditions as
// xFormers' constructors.
func NewAttentionMask(cfg MaskConfig) (AttentionMask, error) {
	m, err := newBlockDiagonal(cfg.Kind, cfg.QSeqLen, cfg.KVSeqLen, cfg.WindowSize, cfg.KVPadding)
	if err != nil {
		return nil, err
	}
	switch cfg.Kind {
	case KindBlockDiagonal:
		return BlockDiagonalMask{m}, nil
	case KindBlockDiagonalCausal:
		return BlockDiagonalCausalMask{m}, nil
	case KindBlockDiagonalCausalFromBottomRight:
		return BlockDiagonalCausalFromBottomRightMask{m}, nil
	case KindBlockDiagonalCausalLocal:
		return BlockDiagonalCausalLocalAttentionMask{m}, nil
	case KindBlockDiagonalCausalLocalFromBottomRight:
		return BlockDiagonalCausalLocalAttentionFromBottomRightMask{m}, nil
	default: // KindBlockDiagonalCausalWithOffsetPaddedKeys; newBlockDiagonal rejected the rest
		return BlockDiagonalCausalWithOffsetPaddedKeysMask{m}, nil
	}
}

// BlockDiagonalMask is xFormers' BlockDiagonalMask: a batch of requests
// packed without padding, where block b's q_seqlen[b] queries attend all
// kv_seqlen[b] keys of block b and nothing else. The zero value is an empty
// batch. Build one with [BlockDiagonalMaskFromSeqlens].
type BlockDiagonalMask struct{ blockDiagonal }

// BlockDiagonalMaskFromSeqlens is BlockDiagonalMask.from_seqlens(q_seqlen,
// kv_seqlen); both have one entry per request, >= 0.
func BlockDiagonalMaskFromSeqlens(qSeqLen, kvSeqLen []int32) (BlockDiagonalMask, error) {
	m, err := newBlockDiagonal(KindBlockDiagonal, qSeqLen, kvSeqLen, 0, 0)
	return BlockDiagonalMask{m}, err
}

// MakeCausal is make_causal(): each block becomes top-left causal.
func (m BlockDiagonalMask) MakeCausal() BlockDiagonalCausalMask {
	return BlockDiagonalCausalMask{m.derive(KindBlockDiagonalCausal, true, false, 0)}
}

// MakeCausalFromBottomright is make_causal_from_bottomright(): each block is
// causal with its diagonal ending at the block's last key, so the first
// kv_seqlen-q_seqlen keys are a non-causal prefix. Like xFormers it needs
// kv_seqlen >= q_seqlen in every block ([ErrNoVisibleKey]).
func (m BlockDiagonalMask) MakeCausalFromBottomright() (BlockDiagonalCausalFromBottomRightMask, error) {
	d, err := newBlockDiagonal(KindBlockDiagonalCausalFromBottomRight, m.qSeqLen, m.kvSeqLen, 0, 0)
	return BlockDiagonalCausalFromBottomRightMask{d}, err
}

// MakeLocalAttention is make_local_attention(window_size): see
// [BlockDiagonalCausalMask.MakeLocalAttention].
func (m BlockDiagonalMask) MakeLocalAttention(windowSize int) (BlockDiagonalCausalLocalAttentionMask, error) {
	d, err := newBlockDiagonal(KindBlockDiagonalCausalLocal, m.qSeqLen, m.kvSeqLen, windowSize, 0)
	return BlockDiagonalCausalLocalAttentionMask{d}, err
}

// MakeLocalAttentionFromBottomright is
// make_local_attention_from_bottomright(window_size): each block is causal
// from the bottom right and banded, so with s = kv_seqlen-q_seqlen query i
// sees keys i+s-window_size+1 .. i+s. This is the mask of a chunked
// ("subsequent") prefill over a sliding-window cache. It needs
// window_size >= 1 ([ErrInvalidWindow]) and kv_seqlen >= q_seqlen in every
// block ([ErrNoVisibleKey]).
func (m BlockDiagonalMask) MakeLocalAttentionFromBottomright(windowSize int) (BlockDiagonalCausalLocalAttentionFromBottomRightMask, error) {
	d, err := newBlockDiagonal(KindBlockDiagonalCausalLocalFromBottomRight, m.qSeqLen, m.kvSeqLen, windowSize, 0)
	return BlockDiagonalCausalLocalAttentionFromBottomRightMask{d}, err
}

// derive re-labels validated lengths with a kind that adds no precondition.
func (m blockDiagonal) derive(kind MaskKind, causal, bottomRight bool, window int) blockDiagonal {
	d := m
	d.kind, d.causal, d.bottomRight, d.window = kind, causal, bottomRight, window
	return d
}

// BlockDiagonalCausalMask is xFormers' BlockDiagonalCausalMask: block
// diagonal, and within block b query i sees keys j <= i. The diagonal starts
// at the block's top-left corner, which is right for a first prefill chunk
// (q_seqlen == kv_seqlen) and wrong when a block has cached keys. The zero
// value is an empty batch.
type BlockDiagonalCausalMask struct{ blockDiagonal }

// BlockDiagonalCausalMaskFromSeqlens is BlockDiagonalCausalMask.from_seqlens.
func BlockDiagonalCausalMaskFromSeqlens(qSeqLen, kvSeqLen []int32) (BlockDiagonalCausalMask, error) {
	m, err := newBlockDiagonal(KindBlockDiagonalCausal, qSeqLen, kvSeqLen, 0, 0)
	return BlockDiagonalCausalMask{m}, err
}

// MakeLocalAttention is make_local_attention(window_size): query i of a block
// sees keys j with i-window_size < j <= i, i.e. itself and the window_size-1
// keys before it, counted from the block's top-left corner. It needs
// window_size >= 1 ([ErrInvalidWindow]) and, as xFormers checks,
// q_seqlen - window_size < kv_seqlen in every block ([ErrNoVisibleKey]).
func (m BlockDiagonalCausalMask) MakeLocalAttention(windowSize int) (BlockDiagonalCausalLocalAttentionMask, error) {
	d, err := newBlockDiagonal(KindBlockDiagonalCausalLocal, m.qSeqLen, m.kvSeqLen, windowSize, 0)
	return BlockDiagonalCausalLocalAttentionMask{d}, err
}

// MakeLocalAttentionFromBottomright is
// [BlockDiagonalMask.MakeLocalAttentionFromBottomright] (xFormers inherits it).
func (m BlockDiagonalCausalMask) MakeLocalAttentionFromBottomright(windowSize int) (BlockDiagonalCausalLocalAttentionFromBottomRightMask, error) {
	return BlockDiagonalMask(m).MakeLocalAttentionFromBottomright(windowSize)
}

// BlockDiagonalCausalFromBottomRightMask is xFormers'
// BlockDiagonalCausalFromBottomRightMask: with s = kv_seqlen-q_seqlen >= 0,
// query i of a block sees keys j <= i+s. This is FlashInfer's causal mask.
type BlockDiagonalCausalFromBottomRightMask struct{ blockDiagonal }

// BlockDiagonalCausalLocalAttentionMask is xFormers'
// BlockDiagonalCausalLocalAttentionMask, the result of
// [BlockDiagonalCausalMask.MakeLocalAttention].
type BlockDiagonalCausalLocalAttentionMask struct{ blockDiagonal }

// BlockDiagonalCausalLocalAttentionFromBottomRightMask is xFormers'
// BlockDiagonalCausalLocalAttentionFromBottomRightMask, the result of
// [BlockDiagonalMask.MakeLocalAttentionFromBottomright].
type BlockDiagonalCausalLocalAttentionFromBottomRightMask struct{ blockDiagonal }

// BlockDiagonalCausalWithOffsetPaddedKeysMask is xFormers'
// BlockDiagonalCausalWithOffsetPaddedKeysMask, the decode mask of Mistral's
// rolling cache: queries are packed without padding, but block b's keys sit
// in a slot of kv_padding columns starting at column b*kv_padding, of which
// only the first kv_seqlen[b] are real. Query i of block b sees key j when
// j < kv_seqlen[b] and j <= i + kv_seqlen[b] - q_seqlen[b] (bottom-right
// causal over the real keys). The dense shape is [sum(q_seqlen),
// BatchSize*kv_padding].
type BlockDiagonalCausalWithOffsetPaddedKeysMask struct{ blockDiagonal }

// BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens is
// BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(q_seqlen,
// kv_padding, kv_seqlen). kv_padding must be >= 1 and >= every kv_seqlen
// ([ErrOutOfRange] names the block that does not fit).
func BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens(qSeqLen []int32, kvPadding int, kvSeqLen []int32) (BlockDiagonalCausalWithOffsetPaddedKeysMask, error) {
	m, err := newBlockDiagonal(KindBlockDiagonalCausalWithOffsetPaddedKeys, qSeqLen, kvSeqLen, 0, kvPadding)
	return BlockDiagonalCausalWithOffsetPaddedKeysMask{m}, err
}
