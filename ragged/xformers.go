package ragged

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// MaskKind names a member of xFormers' attention-bias family. The strings of
// the block-diagonal kinds are the `mask` parameter of the golden
// `attention_mask` cases. docs/masks.md tabulates every kind with its xFormers
// class and its FlashInfer equivalent.
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

	// KindBlockDiagonalPaddedKeys is BlockDiagonalPaddedKeysMask: padded
	// keys as above, every real key of the block visible (not causal).
	KindBlockDiagonalPaddedKeys MaskKind = "block_diagonal_padded_keys"
	// KindBlockDiagonalLocalPaddedKeys is
	// BlockDiagonalLocalAttentionPaddedKeysMask (from_seqlens_local, or
	// BlockDiagonalPaddedKeysMask.make_local_attention(window_left,
	// window_right)): padded keys, and with s = kv_seqlen - q_seqlen query i
	// sees i + s - window_left <= j <= i + s + window_right.
	KindBlockDiagonalLocalPaddedKeys MaskKind = "block_diagonal_local_padded_keys"
	// KindBlockDiagonalCausalLocalPaddedKeys is
	// BlockDiagonalCausalLocalAttentionPaddedKeysMask: padded keys, and
	// i + s - w + 1 <= j <= i + s. The mask of a rolling-cache decode with a
	// sliding window.
	KindBlockDiagonalCausalLocalPaddedKeys MaskKind = "block_diagonal_causal_local_padded_keys"

	// KindPagedBlockDiagonalPaddedKeys is PagedBlockDiagonalPaddedKeysMask:
	// KindBlockDiagonalPaddedKeys over pages named by block_tables.
	KindPagedBlockDiagonalPaddedKeys MaskKind = "paged_block_diagonal_padded_keys"
	// KindPagedBlockDiagonalCausalWithOffsetPaddedKeys is
	// PagedBlockDiagonalCausalWithOffsetPaddedKeysMask.
	KindPagedBlockDiagonalCausalWithOffsetPaddedKeys MaskKind = "paged_block_diagonal_causal_with_offset_padded_keys"
	// KindPagedBlockDiagonalCausalLocalPaddedKeys is
	// PagedBlockDiagonalCausalLocalPaddedKeysMask.
	KindPagedBlockDiagonalCausalLocalPaddedKeys MaskKind = "paged_block_diagonal_causal_local_padded_keys"

	// KindBlockDiagonalGappyKeys is BlockDiagonalGappyKeysMask: block b's
	// keys are columns [kv_seqstarts[b], kv_seqstarts[b] + kv_seqlen[b]) of a
	// key axis of length kv_seqstarts[B], anywhere on it.
	KindBlockDiagonalGappyKeys MaskKind = "block_diagonal_gappy_keys"
	// KindBlockDiagonalCausalWithOffsetGappyKeys is
	// BlockDiagonalCausalWithOffsetGappyKeysMask: gappy keys, bottom-right
	// causal within each block.
	KindBlockDiagonalCausalWithOffsetGappyKeys MaskKind = "block_diagonal_causal_with_offset_gappy_keys"
	// KindBlockDiagonalLocalFromBottomRightGappyKeys is
	// BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask: gappy keys,
	// i + s - window_left <= j <= i + s + window_right within each block.
	KindBlockDiagonalLocalFromBottomRightGappyKeys MaskKind = "block_diagonal_local_from_bottomright_gappy_keys"
	// KindPagedBlockDiagonalGappyKeys is PagedBlockDiagonalGappyKeysMask:
	// block b's keys are logical positions [kv_seqstarts[b],
	// kv_seqstarts[b] + kv_seqlen[b]) of its own row of pages.
	KindPagedBlockDiagonalGappyKeys MaskKind = "paged_block_diagonal_gappy_keys"
	// KindPagedBlockDiagonalCausalWithOffsetGappyKeys is
	// PagedBlockDiagonalCausalWithOffsetGappyKeysMask.
	KindPagedBlockDiagonalCausalWithOffsetGappyKeys MaskKind = "paged_block_diagonal_causal_with_offset_gappy_keys"

	// KindLowerTriangular is LowerTriangularMask, one sequence of q queries
	// and kv keys: j <= i.
	KindLowerTriangular MaskKind = "lower_triangular"
	// KindLowerTriangularFromBottomRight is
	// LowerTriangularFromBottomRightMask: j <= i + kv - q.
	KindLowerTriangularFromBottomRight MaskKind = "lower_triangular_from_bottomright"
	// KindLowerTriangularFromBottomRightLocal is
	// LowerTriangularFromBottomRightLocalAttentionMask(window_size):
	// i + s - w + 1 <= j <= i + s.
	KindLowerTriangularFromBottomRightLocal MaskKind = "lower_triangular_from_bottomright_local"
	// KindLocalAttentionFromBottomRight is
	// LocalAttentionFromBottomRightMask(window_left, window_right):
	// i + s - window_left <= j <= i + s + window_right.
	KindLocalAttentionFromBottomRight MaskKind = "local_attention_from_bottomright"
)

// rowRule is how a block's query row picks its keys; every xFormers class
// gives each row one contiguous interval of the block's keys.
type rowRule uint8

const (
	ruleFull              rowRule = iota // every key
	ruleCausalTopLeft                    // j <= i
	ruleCausalBottomRight                // j <= i + s
	ruleLocalTopLeft                     // i - w < j <= i
	ruleLocalBottomRight                 // i + s - w < j <= i + s
	ruleTwoSided                         // i + s - wl <= j <= i + s + wr
)

// keyLayout is where a block's keys live on the key axis.
type keyLayout uint8

const (
	layoutPacked     keyLayout = iota // block b at columns sum(kv_seqlen[:b])..
	layoutPadded                      // block b at columns b*kv_padding..
	layoutGappy                       // block b at columns kv_seqstarts[b]..
	layoutPaged                       // block b's logical row of pages, at offset 0
	layoutPagedGappy                  // block b's logical row of pages, at offset kv_seqstarts[b]
	layoutSingle                      // one sequence, no batch (LowerTriangular*)
)

// windowArgs is which window parameters a kind takes and what it accepts.
type windowArgs uint8

const (
	windowNone        windowArgs = iota
	windowPositive               // window_size >= 1 (xFormers checks)
	windowAny                    // window_size, any value (xFormers does not check; w <= 0 masks everything)
	windowTwoSidedPos            // window_left, window_right >= 0 (xFormers checks)
	windowTwoSidedAny            // window_left, window_right, any value (not checked)
)

type kindInfo struct {
	class  string // the xFormers class
	rule   rowRule
	layout keyLayout
	window windowArgs
	// family: the BlockDiagonalMask subclasses, which carry _batch_sizes
	// and split.
	family bool
}

var kinds = map[MaskKind]kindInfo{
	KindBlockDiagonal:                           {"BlockDiagonalMask", ruleFull, layoutPacked, windowNone, true},
	KindBlockDiagonalCausal:                     {"BlockDiagonalCausalMask", ruleCausalTopLeft, layoutPacked, windowNone, true},
	KindBlockDiagonalCausalFromBottomRight:      {"BlockDiagonalCausalFromBottomRightMask", ruleCausalBottomRight, layoutPacked, windowNone, true},
	KindBlockDiagonalCausalLocal:                {"BlockDiagonalCausalLocalAttentionMask", ruleLocalTopLeft, layoutPacked, windowPositive, true},
	KindBlockDiagonalCausalLocalFromBottomRight: {"BlockDiagonalCausalLocalAttentionFromBottomRightMask", ruleLocalBottomRight, layoutPacked, windowPositive, true},
	KindBlockDiagonalCausalWithOffsetPaddedKeys: {"BlockDiagonalCausalWithOffsetPaddedKeysMask", ruleCausalBottomRight, layoutPadded, windowNone, false},

	KindBlockDiagonalPaddedKeys:            {"BlockDiagonalPaddedKeysMask", ruleFull, layoutPadded, windowNone, false},
	KindBlockDiagonalLocalPaddedKeys:       {"BlockDiagonalLocalAttentionPaddedKeysMask", ruleTwoSided, layoutPadded, windowTwoSidedPos, false},
	KindBlockDiagonalCausalLocalPaddedKeys: {"BlockDiagonalCausalLocalAttentionPaddedKeysMask", ruleLocalBottomRight, layoutPadded, windowAny, false},

	KindPagedBlockDiagonalPaddedKeys:                 {"PagedBlockDiagonalPaddedKeysMask", ruleFull, layoutPaged, windowNone, false},
	KindPagedBlockDiagonalCausalWithOffsetPaddedKeys: {"PagedBlockDiagonalCausalWithOffsetPaddedKeysMask", ruleCausalBottomRight, layoutPaged, windowNone, false},
	KindPagedBlockDiagonalCausalLocalPaddedKeys:      {"PagedBlockDiagonalCausalLocalPaddedKeysMask", ruleLocalBottomRight, layoutPaged, windowAny, false},

	KindBlockDiagonalGappyKeys:                     {"BlockDiagonalGappyKeysMask", ruleFull, layoutGappy, windowNone, false},
	KindBlockDiagonalCausalWithOffsetGappyKeys:     {"BlockDiagonalCausalWithOffsetGappyKeysMask", ruleCausalBottomRight, layoutGappy, windowNone, false},
	KindBlockDiagonalLocalFromBottomRightGappyKeys: {"BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask", ruleTwoSided, layoutGappy, windowTwoSidedAny, false},

	KindPagedBlockDiagonalGappyKeys:                 {"PagedBlockDiagonalGappyKeysMask", ruleFull, layoutPagedGappy, windowNone, false},
	KindPagedBlockDiagonalCausalWithOffsetGappyKeys: {"PagedBlockDiagonalCausalWithOffsetGappyKeysMask", ruleCausalBottomRight, layoutPagedGappy, windowNone, false},

	KindLowerTriangular:                     {"LowerTriangularMask", ruleCausalTopLeft, layoutSingle, windowNone, false},
	KindLowerTriangularFromBottomRight:      {"LowerTriangularFromBottomRightMask", ruleCausalBottomRight, layoutSingle, windowNone, false},
	KindLowerTriangularFromBottomRightLocal: {"LowerTriangularFromBottomRightLocalAttentionMask", ruleLocalBottomRight, layoutSingle, windowPositive, false},
	KindLocalAttentionFromBottomRight:       {"LocalAttentionFromBottomRightMask", ruleTwoSided, layoutSingle, windowTwoSidedPos, false},
}

// Kinds returns every MaskKind, sorted.
func Kinds() []MaskKind {
	out := make([]MaskKind, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// XFormersClass returns the name of the xFormers class kind stands for, or
// "" for an unknown kind.
func (k MaskKind) XFormersClass() string { return kinds[k].class }

// WindowArgs says which window arguments xFormers' class for k takes:
// window_size (the causal local kinds) or the pair window_left/window_right
// (the two-sided kinds). NewAttentionMask rejects the others when nonzero.
func (k MaskKind) WindowArgs() (size, leftRight bool) {
	w := kinds[k].window
	return w == windowPositive || w == windowAny, w == windowTwoSidedPos || w == windowTwoSidedAny
}

// windowClamp bounds windows that xFormers takes as unbounded Python ints:
// any |w| beyond it reaches past every key of an int32-indexed block, so
// clamping changes no cell and keeps i+s±w from overflowing.
const windowClamp = 1 << 33

func clampWindow(w int) int { return max(-windowClamp, min(windowClamp, w)) }

// blockDiagonal is the shared representation of every xFormers mask here.
// It is immutable after construction; its slices are never written again,
// so copies of a mask value may share them.
type blockDiagonal struct {
	kind     MaskKind
	info     kindInfo
	qSeqLen  []int32 // [B] queries per block, >= 0
	kvSeqLen []int32 // [B] real (unpadded) keys per block, >= 0
	// qStart[b] is block b's first row: prefix sums of qSeqLen, [B+1].
	qStart []int
	// kvStart[b] is block b's first column in the dense layout of the
	// unpaged kinds, [B+1]: prefix sums of kvSeqLen, b*kvPadding, or
	// kv_seqstarts (gappy: not monotonic, kvStart[B] is the key axis).
	// Paged kinds leave it nil.
	kvStart []int
	cols    int // dense columns (Shape)
	// window is window_size, or 0; wl/wr are window_left/window_right of
	// the two-sided kinds. All clamped to ±windowClamp.
	window, wl, wr int
	// Exactly as given, for WindowSize/WindowLeft/WindowRight and String.
	windowArg, wlArg, wrArg int
	kvPadding               int // padded kinds: kv_padding; paged: pages per row * page_size
	// kvOffset[b] is where block b's keys start in its logical row of pages
	// (paged gappy kinds); nil means 0 everywhere.
	kvOffset []int32
	// kvSeqStarts as given, for the gappy kinds (B+1 unpaged, B paged).
	kvSeqStarts []int32
	blockTables BlockTables // paged kinds
	pageSize    int         // paged kinds
	batchSizes  []int       // from_tensor_list's _batch_sizes, or nil
}

// newBlockDiagonal validates cfg as xFormers' constructors (and the
// materialize they lead to) do, and builds the row/column starts.
func newBlockDiagonal(cfg MaskConfig) (blockDiagonal, error) {
	info, ok := kinds[cfg.Kind]
	if !ok {
		return blockDiagonal{}, fmt.Errorf("%w: %q", ErrUnknownMaskKind, cfg.Kind)
	}
	kind := cfg.Kind
	m := blockDiagonal{kind: kind, info: info}
	if err := m.setWindows(cfg); err != nil {
		return blockDiagonal{}, err
	}
	if len(cfg.QSeqLen) != len(cfg.KVSeqLen) {
		return blockDiagonal{}, fmt.Errorf("%w: %d q_seqlen, %d kv_seqlen", ErrLengthMismatch, len(cfg.QSeqLen), len(cfg.KVSeqLen))
	}
	batch := len(cfg.QSeqLen)
	padded := info.layout == layoutPadded
	paged := info.layout == layoutPaged || info.layout == layoutPagedGappy
	gappy := info.layout == layoutGappy || info.layout == layoutPagedGappy
	switch {
	case padded && cfg.KVPadding < 1:
		return blockDiagonal{}, fmt.Errorf("%w: %s needs kv_padding >= 1, got %d", ErrNegativeLength, kind, cfg.KVPadding)
	case !padded && cfg.KVPadding != 0:
		return blockDiagonal{}, fmt.Errorf("%w: %s takes no kv_padding, got %d", ErrLengthMismatch, kind, cfg.KVPadding)
	case !gappy && cfg.KVSeqStarts != nil:
		return blockDiagonal{}, fmt.Errorf("%w: %s takes no kv_seqstarts, got %v", ErrLengthMismatch, kind, cfg.KVSeqStarts)
	case !paged && (cfg.BlockTables.Data != nil || cfg.BlockTables.Rows != 0 || cfg.BlockTables.Cols != 0 || cfg.PageSize != 0):
		return blockDiagonal{}, fmt.Errorf("%w: %s takes no block_tables or page_size (got %d×%d, page_size %d)",
			ErrLengthMismatch, kind, cfg.BlockTables.Rows, cfg.BlockTables.Cols, cfg.PageSize)
	case info.layout == layoutSingle && batch != 1:
		return blockDiagonal{}, fmt.Errorf("%w: %s describes one sequence: want 1 q_seqlen and 1 kv_seqlen (the shape), got %d",
			ErrLengthMismatch, kind, batch)
	case batch == 0 && (padded || paged || gappy):
		// xFormers: max() of an empty sequence (padded, paged) or "No
		// elements" (gappy).
		return blockDiagonal{}, fmt.Errorf("%w: %s needs at least one block, got an empty batch", ErrLengthMismatch, kind)
	}
	m.qSeqLen = append([]int32(nil), cfg.QSeqLen...)
	m.kvSeqLen = append([]int32(nil), cfg.KVSeqLen...)
	m.qStart = make([]int, batch+1)
	for b := 0; b < batch; b++ {
		q, kv := int(cfg.QSeqLen[b]), int(cfg.KVSeqLen[b])
		if q < 0 || kv < 0 {
			return blockDiagonal{}, fmt.Errorf("%w: block %d has q_seqlen %d, kv_seqlen %d", ErrNegativeLength, b, q, kv)
		}
		if padded && kv > cfg.KVPadding {
			return blockDiagonal{}, fmt.Errorf("%w: block %d has kv_seqlen %d > kv_padding %d", ErrOutOfRange, b, kv, cfg.KVPadding)
		}
		if (kind == KindBlockDiagonalCausalFromBottomRight || kind == KindBlockDiagonalCausalLocalFromBottomRight) && kv < q {
			// xFormers: "Expected num_keys >= num_queries"; the first q-kv
			// queries would see nothing.
			return blockDiagonal{}, fmt.Errorf("%w: %s block %d has kv_seqlen %d < q_seqlen %d",
				ErrNoVisibleKey, kind, b, kv, q)
		}
		if kind == KindBlockDiagonalCausalLocal && q-m.window >= kv {
			// xFormers: "No keys are attended"; query kv+window-1 sees nothing.
			return blockDiagonal{}, fmt.Errorf("%w: %s block %d has q_seqlen %d >= kv_seqlen %d + window_size %d",
				ErrNoVisibleKey, kind, b, q, kv, m.window)
		}
		m.qStart[b+1] = m.qStart[b] + q
		if m.qStart[b+1] > math.MaxInt32 {
			return blockDiagonal{}, fmt.Errorf("%w: block %d ends at row %d, beyond int32", ErrTooLarge, b, m.qStart[b+1])
		}
	}
	var err error
	switch info.layout {
	case layoutPacked, layoutSingle:
		m.kvStart = make([]int, batch+1)
		for b := 0; b < batch; b++ {
			m.kvStart[b+1] = m.kvStart[b] + int(cfg.KVSeqLen[b])
		}
	case layoutPadded:
		m.kvPadding = cfg.KVPadding
		m.kvStart = make([]int, batch+1)
		for b := 0; b <= batch; b++ {
			m.kvStart[b] = b * cfg.KVPadding
		}
	case layoutGappy:
		err = m.setGappy(cfg.KVSeqStarts)
	case layoutPaged, layoutPagedGappy:
		err = m.setPaged(cfg)
	}
	if err != nil {
		return blockDiagonal{}, err
	}
	if m.kvStart != nil {
		m.cols = m.kvStart[batch]
		if m.cols > math.MaxInt32 {
			return blockDiagonal{}, fmt.Errorf("%w: the key axis has %d columns, beyond int32", ErrTooLarge, m.cols)
		}
	}
	return m, nil
}

// setWindows checks and stores the window arguments of cfg.
func (m *blockDiagonal) setWindows(cfg MaskConfig) error {
	kind, w, wl, wr := m.kind, cfg.WindowSize, cfg.WindowLeft, cfg.WindowRight
	takesSize := m.info.window == windowPositive || m.info.window == windowAny
	takesTwo := m.info.window == windowTwoSidedPos || m.info.window == windowTwoSidedAny
	switch {
	case !takesSize && w != 0:
		return fmt.Errorf("%w: %s takes no window_size, got %d", ErrInvalidWindow, kind, w)
	case !takesTwo && (wl != 0 || wr != 0):
		return fmt.Errorf("%w: %s takes no window_left/window_right, got %d/%d", ErrInvalidWindow, kind, wl, wr)
	case m.info.window == windowPositive && w < 1:
		return fmt.Errorf("%w: %s needs window_size >= 1, got %d", ErrInvalidWindow, kind, w)
	case m.info.window == windowTwoSidedPos && (wl < 0 || wr < 0):
		return fmt.Errorf("%w: %s needs window_left >= 0 and window_right >= 0, got window_left %d, window_right %d",
			ErrInvalidWindow, kind, wl, wr)
	}
	m.windowArg, m.wlArg, m.wrArg = w, wl, wr
	m.window, m.wl, m.wr = clampWindow(w), clampWindow(wl), clampWindow(wr)
	return nil
}

// setGappy places block b's keys at kv_seqstarts[b] on an axis of
// kv_seqstarts[B] columns. xFormers only checks the lengths; a start below 0
// or a block running past the axis would be cut silently by Python slicing,
// so they are errors here.
func (m *blockDiagonal) setGappy(starts []int32) error {
	batch := len(m.qSeqLen)
	if len(starts) != batch+1 {
		return fmt.Errorf("%w: %s needs len(kv_seqstarts) = batch size + 1 = %d, got %d",
			ErrLengthMismatch, m.kind, batch+1, len(starts))
	}
	total := int(starts[batch])
	if total < 0 {
		return fmt.Errorf("%w: kv_seqstarts[%d] = %d (the key axis length) is negative", ErrNegativeLength, batch, total)
	}
	m.kvStart = make([]int, batch+1)
	for b := 0; b < batch; b++ {
		s, n := int(starts[b]), int(m.kvSeqLen[b])
		if s < 0 || s+n > total {
			return fmt.Errorf("%w: block %d has keys [%d, %d) (kv_seqstarts[%d] = %d, kv_seqlen %d), outside the key axis [0, %d)",
				ErrOutOfRange, b, s, s+n, b, s, n, total)
		}
		m.kvStart[b] = s
	}
	m.kvStart[batch] = total
	m.kvSeqStarts = append([]int32(nil), starts...)
	return nil
}

// rowRange returns the keys that query i of block b may attend as a
// half-open interval [lo, hi) of key indices local to the block; an empty
// row is (0, 0).
func (m blockDiagonal) rowRange(b, i int) (lo, hi int) {
	kv := int(m.kvSeqLen[b])
	s := kv - int(m.qSeqLen[b])
	lo, hi = 0, kv
	switch m.info.rule {
	case ruleCausalTopLeft:
		hi = min(kv, i+1)
	case ruleCausalBottomRight:
		hi = min(kv, i+s+1)
	case ruleLocalTopLeft:
		lo, hi = max(0, i-m.window+1), min(kv, i+1)
	case ruleLocalBottomRight:
		lo, hi = max(0, i+s-m.window+1), min(kv, i+s+1)
	case ruleTwoSided:
		lo, hi = max(0, i+s-m.wl), min(kv, i+s+m.wr+1)
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

// KVSeqLen returns a copy of the per-block key lengths (without padding or
// gaps), [BatchSize].
func (m blockDiagonal) KVSeqLen() []int32 { return append([]int32(nil), m.kvSeqLen...) }

// WindowSize returns xFormers' window_size for the kinds that take one
// (as given) and 0 for the others.
func (m blockDiagonal) WindowSize() int { return m.windowArg }

// WindowLeft returns window_left for the two-sided local kinds and 0 for
// the others.
func (m blockDiagonal) WindowLeft() int { return m.wlArg }

// WindowRight returns window_right for the two-sided local kinds and 0 for
// the others.
func (m blockDiagonal) WindowRight() int { return m.wrArg }

// KVPadding returns kv_padding for the padded-keys kinds, the keys per row
// of pages (block_tables columns * page_size) for the paged kinds, and 0
// otherwise.
func (m blockDiagonal) KVPadding() int { return m.kvPadding }

// KVSeqStarts returns a copy of kv_seqstarts for the gappy kinds ([B+1]
// unpaged, [B] paged) and nil otherwise.
func (m blockDiagonal) KVSeqStarts() []int32 {
	if m.kvSeqStarts == nil {
		return nil
	}
	return append([]int32(nil), m.kvSeqStarts...)
}

// BatchSizes returns a copy of the batch sizes [FromTensorList] recorded
// (xFormers' _batch_sizes), or nil.
func (m blockDiagonal) BatchSizes() []int {
	if m.batchSizes == nil {
		return nil
	}
	return append([]int(nil), m.batchSizes...)
}

// Shape returns the dense shape xFormers' materialize produces: rows =
// sum(q_seqlen); cols = sum(kv_seqlen), BatchSize*kv_padding for the padded
// kinds, kv_seqstarts[B] for the unpaged gappy kinds, (max(block_tables)+1)
// * page_size (physical key slots) for the paged kinds, and kv for the
// single-sequence kinds.
func (m blockDiagonal) Shape() (rows, cols int) {
	if len(m.qStart) == 0 {
		return 0, 0
	}
	return m.qStart[len(m.qStart)-1], m.cols
}

// block returns the block whose rows contain row: the last b with
// qStart[b] <= row.
func (m blockDiagonal) block(row int) int { return sort.SearchInts(m.qStart, row+1) - 1 }

// At reports whether dense row row may attend dense column col (the
// materialised mask's cell, without materialising it). It panics outside
// [Shape].
func (m blockDiagonal) At(row, col int) bool {
	rows, cols := m.Shape()
	if row < 0 || row >= rows || col < 0 || col >= cols {
		panic(fmt.Sprintf("ragged: %s.At(%d, %d) outside %d×%d", m.kind, row, col, rows, cols))
	}
	b := m.block(row)
	if m.pageSize > 0 {
		return m.pagedAt(b, row-m.qStart[b], col)
	}
	lo, hi := m.rowRange(b, row-m.qStart[b])
	j := col - m.kvStart[b]
	return j >= lo && j < hi
}

// Materialize returns the dense mask of [Shape], as xFormers'
// materialize(shape).exp() does (1 = allowed, 0 = masked): block b is placed
// at rows qStart[b].. and its key columns, and everything off the blocks is
// masked. For the paged kinds the columns are physical key slots, filled
// page by page in block_tables order exactly as xFormers does (see
// docs/masks.md). Shapes above [MaxDenseCells] wrap [ErrTooLarge].
func (m blockDiagonal) Materialize() (Dense, error) {
	rows, cols := m.Shape()
	d, err := NewDense(rows, cols)
	if err != nil {
		return Dense{}, fmt.Errorf("%s: %w", m.kind, err)
	}
	if m.pageSize > 0 {
		return m.materializePaged(d)
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
	fmt.Fprintf(&sb, "%s(q_seqlen=%v", m.info.class, m.qSeqLen)
	if m.info.layout == layoutPadded {
		fmt.Fprintf(&sb, ", kv_padding=%d", m.kvPadding)
	}
	if m.kvSeqStarts != nil {
		fmt.Fprintf(&sb, ", kv_seqstarts=%v", m.kvSeqStarts)
	}
	fmt.Fprintf(&sb, ", kv_seqlen=%v", m.kvSeqLen)
	if m.pageSize > 0 {
		fmt.Fprintf(&sb, ", block_tables=%d×%d, page_size=%d", m.blockTables.Rows, m.blockTables.Cols, m.pageSize)
	}
	switch m.info.window {
	case windowPositive, windowAny:
		fmt.Fprintf(&sb, ", window_size=%d", m.windowArg)
	case windowTwoSidedPos, windowTwoSidedAny:
		fmt.Fprintf(&sb, ", window_left=%d, window_right=%d", m.wlArg, m.wrArg)
	}
	sb.WriteByte(')')
	return sb.String()
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

// MaskConfig selects and sizes an xFormers mask for [NewAttentionMask]. A
// field a kind does not take must be left zero.
type MaskConfig struct {
	Kind     MaskKind
	QSeqLen  []int32 // [B] queries per block (xFormers q_seqlen); [1] = q for the single-sequence kinds
	KVSeqLen []int32 // [B] keys per block (kv_seqlen), without padding; [1] = kv for the single-sequence kinds
	// WindowSize is xFormers' window_size: >= 1 for the kinds that check it,
	// any value for the padded causal local kinds (which xFormers does not
	// check; w <= 0 masks every key).
	WindowSize int
	// WindowLeft and WindowRight are the two-sided window of
	// KindBlockDiagonalLocalPaddedKeys and KindLocalAttentionFromBottomRight
	// (both >= 0) and KindBlockDiagonalLocalFromBottomRightGappyKeys (any).
	WindowLeft, WindowRight int
	// KVPadding is kv_padding (>= every KVSeqLen, >= 1) for the unpaged
	// padded-keys kinds.
	KVPadding int
	// KVSeqStarts is kv_seqstarts for the gappy kinds: [B+1] key-axis
	// starts (the last is the axis length) unpaged, [B] offsets into each
	// block's row of pages for the paged gappy kinds.
	KVSeqStarts []int32
	// BlockTables and PageSize are the paged kinds' block_tables and
	// page_size.
	BlockTables BlockTables
	PageSize    int
}

// NewAttentionMask builds the mask cfg describes; the concrete type is the
// one named after the xFormers class (e.g. [BlockDiagonalCausalLocalAttentionMask]
// for [KindBlockDiagonalCausalLocal]; [SingleSequenceMask] for the
// single-sequence kinds, bound to the shape q×kv). It enforces the same
// preconditions as xFormers' constructors and materialize, and a few more
// where xFormers would silently produce a mask that is not one (docs/masks.md
// lists them).
func NewAttentionMask(cfg MaskConfig) (AttentionMask, error) {
	m, err := newBlockDiagonal(cfg)
	if err != nil {
		return nil, err
	}
	return m.typed(), nil
}

// typed wraps m in the Go type named after its class.
func (m blockDiagonal) typed() AttentionMask {
	switch m.kind {
	case KindBlockDiagonal:
		return BlockDiagonalMask{m}
	case KindBlockDiagonalCausal:
		return BlockDiagonalCausalMask{m}
	case KindBlockDiagonalCausalFromBottomRight:
		return BlockDiagonalCausalFromBottomRightMask{m}
	case KindBlockDiagonalCausalLocal:
		return BlockDiagonalCausalLocalAttentionMask{m}
	case KindBlockDiagonalCausalLocalFromBottomRight:
		return BlockDiagonalCausalLocalAttentionFromBottomRightMask{m}
	case KindBlockDiagonalCausalWithOffsetPaddedKeys:
		return BlockDiagonalCausalWithOffsetPaddedKeysMask{m}
	case KindBlockDiagonalPaddedKeys:
		return BlockDiagonalPaddedKeysMask{m}
	case KindBlockDiagonalLocalPaddedKeys:
		return BlockDiagonalLocalAttentionPaddedKeysMask{m}
	case KindBlockDiagonalCausalLocalPaddedKeys:
		return BlockDiagonalCausalLocalAttentionPaddedKeysMask{m}
	case KindPagedBlockDiagonalPaddedKeys:
		return PagedBlockDiagonalPaddedKeysMask{m}
	case KindPagedBlockDiagonalCausalWithOffsetPaddedKeys:
		return PagedBlockDiagonalCausalWithOffsetPaddedKeysMask{m}
	case KindPagedBlockDiagonalCausalLocalPaddedKeys:
		return PagedBlockDiagonalCausalLocalPaddedKeysMask{m}
	case KindBlockDiagonalGappyKeys:
		return BlockDiagonalGappyKeysMask{m}
	case KindBlockDiagonalCausalWithOffsetGappyKeys:
		return BlockDiagonalCausalWithOffsetGappyKeysMask{m}
	case KindBlockDiagonalLocalFromBottomRightGappyKeys:
		return BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask{m}
	case KindPagedBlockDiagonalGappyKeys:
		return PagedBlockDiagonalGappyKeysMask{m}
	case KindPagedBlockDiagonalCausalWithOffsetGappyKeys:
		return PagedBlockDiagonalCausalWithOffsetGappyKeysMask{m}
	default: // the single-sequence kinds; newBlockDiagonal rejected the rest
		return SingleSequenceMask{m}
	}
}

// BlockDiagonalMask is xFormers' BlockDiagonalMask: a batch of requests
// packed without padding, where block b's q_seqlen[b] queries attend all
// kv_seqlen[b] keys of block b and nothing else. The zero value is an empty
// batch. Build one with [BlockDiagonalMaskFromSeqlens] or [FromTensorList].
type BlockDiagonalMask struct{ blockDiagonal }

// BlockDiagonalMaskFromSeqlens is BlockDiagonalMask.from_seqlens(q_seqlen,
// kv_seqlen); both have one entry per request, >= 0.
func BlockDiagonalMaskFromSeqlens(qSeqLen, kvSeqLen []int32) (BlockDiagonalMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonal, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen})
	return BlockDiagonalMask{m}, err
}

// MakeCausal is make_causal(): each block becomes top-left causal.
func (m BlockDiagonalMask) MakeCausal() BlockDiagonalCausalMask {
	return BlockDiagonalCausalMask{m.derive(KindBlockDiagonalCausal)}
}

// MakeCausalFromBottomright is make_causal_from_bottomright(): each block is
// causal with its diagonal ending at the block's last key, so the first
// kv_seqlen-q_seqlen keys are a non-causal prefix. Like xFormers it needs
// kv_seqlen >= q_seqlen in every block ([ErrNoVisibleKey]).
func (m BlockDiagonalMask) MakeCausalFromBottomright() (BlockDiagonalCausalFromBottomRightMask, error) {
	d, err := m.rederive(MaskConfig{Kind: KindBlockDiagonalCausalFromBottomRight})
	return BlockDiagonalCausalFromBottomRightMask{d}, err
}

// MakeLocalAttention is make_local_attention(window_size): see
// [BlockDiagonalCausalMask.MakeLocalAttention].
func (m BlockDiagonalMask) MakeLocalAttention(windowSize int) (BlockDiagonalCausalLocalAttentionMask, error) {
	d, err := m.rederive(MaskConfig{Kind: KindBlockDiagonalCausalLocal, WindowSize: windowSize})
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
	d, err := m.rederive(MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, WindowSize: windowSize})
	return BlockDiagonalCausalLocalAttentionFromBottomRightMask{d}, err
}

// derive re-labels validated lengths with a kind of the same layout that
// adds no precondition and takes no window.
func (m blockDiagonal) derive(kind MaskKind) blockDiagonal {
	d := m
	d.kind, d.info = kind, kinds[kind]
	d.window, d.wl, d.wr, d.windowArg, d.wlArg, d.wrArg = 0, 0, 0, 0, 0, 0
	return d
}

// rederive builds cfg's kind over m's lengths, checking its preconditions,
// and keeps m's batch sizes (xFormers passes _batch_sizes along).
func (m blockDiagonal) rederive(cfg MaskConfig) (blockDiagonal, error) {
	cfg.QSeqLen, cfg.KVSeqLen = m.qSeqLen, m.kvSeqLen
	d, err := newBlockDiagonal(cfg)
	if err != nil {
		return blockDiagonal{}, err
	}
	d.batchSizes = m.batchSizes
	return d, nil
}

// BlockDiagonalCausalMask is xFormers' BlockDiagonalCausalMask: block
// diagonal, and within block b query i sees keys j <= i. The diagonal starts
// at the block's top-left corner, which is right for a first prefill chunk
// (q_seqlen == kv_seqlen) and wrong when a block has cached keys. The zero
// value is an empty batch.
type BlockDiagonalCausalMask struct{ blockDiagonal }

// BlockDiagonalCausalMaskFromSeqlens is BlockDiagonalCausalMask.from_seqlens.
func BlockDiagonalCausalMaskFromSeqlens(qSeqLen, kvSeqLen []int32) (BlockDiagonalCausalMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalCausal, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen})
	return BlockDiagonalCausalMask{m}, err
}

// MakeLocalAttention is make_local_attention(window_size): query i of a block
// sees keys j with i-window_size < j <= i, i.e. itself and the window_size-1
// keys before it, counted from the block's top-left corner. It needs
// window_size >= 1 ([ErrInvalidWindow]) and, as xFormers checks,
// q_seqlen - window_size < kv_seqlen in every block ([ErrNoVisibleKey]).
func (m BlockDiagonalCausalMask) MakeLocalAttention(windowSize int) (BlockDiagonalCausalLocalAttentionMask, error) {
	return BlockDiagonalMask(m).MakeLocalAttention(windowSize)
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
// causal over the real keys; a query with no such key sees nothing, which
// xFormers allows here). The dense shape is [sum(q_seqlen),
// BatchSize*kv_padding].
type BlockDiagonalCausalWithOffsetPaddedKeysMask struct{ blockDiagonal }

// BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens is
// BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(q_seqlen,
// kv_padding, kv_seqlen). kv_padding must be >= 1 and >= every kv_seqlen
// ([ErrOutOfRange] names the block that does not fit), and the batch must not
// be empty (xFormers takes max(kv_seqlen)).
func BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens(qSeqLen []int32, kvPadding int, kvSeqLen []int32) (BlockDiagonalCausalWithOffsetPaddedKeysMask, error) {
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: qSeqLen, KVSeqLen: kvSeqLen, KVPadding: kvPadding})
	return BlockDiagonalCausalWithOffsetPaddedKeysMask{m}, err
}
