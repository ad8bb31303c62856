package ragged

import (
	"fmt"
	"math"
)

// FlashInferMask is an xFormers mask restated in FlashInfer's 2-D ragged
// layout, ready for BatchPrefillWith{Ragged,Paged}KVCacheWrapper.plan with
// packed_custom_mask. Request b is block b, with qo_len = q_seqlen[b] and
// kv_len = kv_seqlen[b]; padding columns of the padded-keys masks and the
// gaps of the gappy ones are not keys in FlashInfer's view and do not
// appear (the caller passes block b's keys contiguously). For the paged
// gappy kinds kv_len is kv_seqstarts[b] + kv_seqlen[b], the keys from the
// start of the request's first page, and the first kv_seqstarts[b] are
// masked ([PagedKV] gives the matching page table).
//
// With a custom mask FlashInfer ignores causal but still applies
// window_left, so pass window_left = -1 alongside it.
type FlashInferMask struct {
	QOIndptr []int32 // [B+1] qo_indptr, prefix sums of q_seqlen
	KVIndptr []int32 // [B+1] kv_indptr of the ragged-KV wrapper, prefix sums of kv_len
	// MaskIndptr [B+1] counts bits: request b's mask is bits
	// [MaskIndptr[b], MaskIndptr[b+1]) of the unpacked, flattened mask, and
	// MaskIndptr[b+1]-MaskIndptr[b] = q_seqlen[b]*kv_seqlen[b].
	MaskIndptr []int32
	// PackedCustomMask is segment_packbits(custom_mask, MaskIndptr,
	// "little"): request b's [q_seqlen[b], kv_seqlen[b]] mask, row-major, bit
	// k of the request is bit k%8 of its byte k/8, pad bits 0.
	PackedCustomMask []byte
	// PackedMaskIndptr [B+1] are the byte offsets of each request in
	// PackedCustomMask (the mask_indptr FlashInfer's kernels read).
	PackedMaskIndptr []int32
}

// ToFlashInfer converts the mask to FlashInfer's packed custom-mask layout,
// setting each row's contiguous run of allowed keys directly in the packed
// bytes (no dense intermediate). Sizes beyond int32 wrap [ErrTooLarge].
func (m blockDiagonal) ToFlashInfer() (FlashInferMask, error) {
	var out FlashInferMask
	var err error
	kvLens := make([]int32, len(m.kvSeqLen))
	for b := range kvLens {
		kvLens[b] = int32(m.flashKV(b))
	}
	if out.QOIndptr, err = IndptrFromLengths(m.qSeqLen); err != nil {
		return FlashInferMask{}, err
	}
	if out.KVIndptr, err = IndptrFromLengths(kvLens); err != nil {
		return FlashInferMask{}, err
	}
	if out.MaskIndptr, err = MaskIndptrFromLens(m.qSeqLen, kvLens); err != nil {
		return FlashInferMask{}, err
	}
	out.PackedMaskIndptr = make([]int32, len(out.MaskIndptr))
	fillSegmentIndptr(out.PackedMaskIndptr, out.MaskIndptr)
	out.PackedCustomMask = make([]byte, out.PackedMaskIndptr[len(out.PackedMaskIndptr)-1])
	for b := range m.qSeqLen {
		req := out.PackedCustomMask[out.PackedMaskIndptr[b]:out.PackedMaskIndptr[b+1]]
		kv := int(kvLens[b])
		for i := 0; i < int(m.qSeqLen[b]); i++ {
			lo, hi := m.flashRange(b, i)
			setBitsLittle(req, i*kv+lo, i*kv+hi)
		}
	}
	return out, nil
}

// flashKV is request b's kv_len in FlashInfer's view: the block's keys,
// plus, for the paged gappy kinds, the kv_seqstarts[b] keys before them on
// its first pages (FlashInfer's pages always start at logical key 0).
func (m blockDiagonal) flashKV(b int) int {
	if m.kvOffset != nil {
		return int(m.kvOffset[b]) + int(m.kvSeqLen[b])
	}
	return int(m.kvSeqLen[b])
}

// flashRange is rowRange in FlashInfer's key numbering (see flashKV).
func (m blockDiagonal) flashRange(b, i int) (lo, hi int) {
	lo, hi = m.rowRange(b, i)
	if m.kvOffset != nil && lo < hi {
		lo, hi = lo+int(m.kvOffset[b]), hi+int(m.kvOffset[b])
	}
	return lo, hi
}

// setBitsLittle sets bits [from, to) of buf, little bit order.
func setBitsLittle(buf []byte, from, to int) {
	if from >= to {
		return
	}
	first, last := from/8, (to-1)/8
	headMask := byte(0xff) << (from % 8)
	tailMask := byte(0xff) >> (7 - (to-1)%8)
	if first == last {
		buf[first] |= headMask & tailMask
		return
	}
	buf[first] |= headMask
	for k := first + 1; k < last; k++ {
		buf[k] = 0xff
	}
	buf[last] |= tailMask
}

// FlashInferParams says whether FlashInfer's built-in masking reproduces an
// xFormers mask without a custom mask, and with which parameters.
type FlashInferParams struct {
	// Causal is FlashInfer's causal flag (bottom-right aligned: query i of a
	// request sees keys j <= i + kv_len - qo_len).
	Causal bool
	// WindowLeft is FlashInfer's window_left: >= 0 keeps only keys
	// j >= i + kv_len - qo_len - WindowLeft; -1 disables the window. xFormers'
	// window_size w corresponds to WindowLeft = w-1.
	WindowLeft int
	// OK is true when plan(qo_indptr = prefix sums of q_seqlen, kv_indptr =
	// prefix sums of kv_seqlen, causal = Causal, window_left = WindowLeft)
	// masks exactly the same keys as the xFormers mask, in every block.
	OK bool
	// Why explains, when !OK, the first block and query row where no
	// (causal, window_left) pair can match, and the reason. Use
	// the mask's ToFlashInfer (a packed custom mask) instead.
	Why string
}

// FlashInferParams finds FlashInfer causal/window_left parameters that
// reproduce the mask exactly, if any exist. It first tries the literal
// translation (causal for the causal kinds, window_left = window_size-1 or
// -1), which succeeds for every bottom-right kind and for top-left kinds
// whose blocks have q_seqlen == kv_seqlen. Otherwise it searches: for
// causal = the kind's own choice, then the other, window_left is forced by
// the first row whose window cuts keys off (-1 if none does), and every row
// is checked. The search is exact: OK is false only if no causal ∈
// {false, true} and window_left >= -1 match. Cost O(sum q_seqlen).
func (m blockDiagonal) FlashInferParams() FlashInferParams {
	// The parameters an engine would write by hand come first: they are
	// what the mask means, even where a window cuts nothing.
	causal, w := true, -1
	switch m.info.rule {
	case ruleFull:
		causal = false
	case ruleLocalTopLeft, ruleLocalBottomRight:
		w = max(-1, m.window-1)
	case ruleTwoSided:
		causal, w = m.wr == 0, max(-1, m.wl)
	}
	if w > math.MaxInt32 {
		w = -1 // a clamped unbounded window: it cuts nothing
	}
	order := [2]bool{causal, !causal}
	if m.verifyFlashInfer(causal, w) == "" {
		return FlashInferParams{Causal: causal, WindowLeft: w, OK: true}
	}
	var firstWhy string
	for k, causal := range order {
		w, why := m.matchFlashInfer(causal)
		if why == "" {
			return FlashInferParams{Causal: causal, WindowLeft: w, OK: true}
		}
		if k == 0 {
			firstWhy = why
		}
	}
	return FlashInferParams{Causal: order[0], WindowLeft: -1, OK: false, Why: firstWhy + m.reason()}
}

// flashInferRow is the key interval [lo, hi) FlashInfer lets query i of a
// request (qo_len q, kv_len kv) see; an empty row is (0, 0).
func flashInferRow(q, kv, i int, causal bool, windowLeft int) (lo, hi int) {
	p := i + kv - q // the query's absolute position
	hi = kv
	if causal {
		hi = min(kv, p+1)
	}
	if windowLeft >= 0 {
		lo = max(0, p-windowLeft)
	}
	if lo >= hi {
		return 0, 0
	}
	return lo, hi
}

// matchFlashInfer returns the window_left that makes FlashInfer with the
// given causal flag match m, or a non-empty reason why none does.
func (m blockDiagonal) matchFlashInfer(causal bool) (windowLeft int, why string) {
	// A row whose interval starts after key 0 pins the window: FlashInfer's
	// lower bound is p - window_left, so window_left = p - lo. If no row
	// starts after 0, the window cuts nothing and -1 is equivalent to any
	// window that matches (a window never empties a row FlashInfer's causal
	// bound leaves non-empty, since lo = p - w <= p).
	windowLeft = -1
	for b := range m.qSeqLen {
		q, kv := int(m.qSeqLen[b]), m.flashKV(b)
		for i := 0; i < q; i++ {
			lo, _ := m.flashRange(b, i)
			if lo == 0 {
				continue
			}
			w := i + kv - q - lo
			switch {
			case w < 0:
				return 0, fmt.Sprintf("block %d (q_seqlen %d, kv_seqlen %d) row %d starts at key %d, after the query's own position %d; window_left cannot be negative",
					b, q, kv, i, lo, i+kv-q)
			case windowLeft >= 0 && w != windowLeft:
				return 0, fmt.Sprintf("block %d (q_seqlen %d, kv_seqlen %d) row %d needs window_left %d, an earlier row needs %d; FlashInfer has one window_left per batch",
					b, q, kv, i, w, windowLeft)
			}
			windowLeft = w
		}
	}
	if why := m.verifyFlashInfer(causal, windowLeft); why != "" {
		return 0, why
	}
	return windowLeft, ""
}

// verifyFlashInfer returns "" when FlashInfer with (causal, windowLeft)
// masks exactly like m, and the first differing row otherwise.
func (m blockDiagonal) verifyFlashInfer(causal bool, windowLeft int) string {
	for b := range m.qSeqLen {
		q, kv := int(m.qSeqLen[b]), m.flashKV(b)
		for i := 0; i < q; i++ {
			lo, hi := m.flashRange(b, i)
			flo, fhi := flashInferRow(q, kv, i, causal, windowLeft)
			if lo != flo || hi != fhi {
				return fmt.Sprintf("block %d (q_seqlen %d, kv_seqlen %d) row %d sees keys %s, FlashInfer with causal=%t, window_left=%d sees %s",
					b, q, kv, i, interval(lo, hi), causal, windowLeft, interval(flo, fhi))
			}
		}
	}
	return ""
}

func interval(lo, hi int) string {
	if lo >= hi {
		return "none"
	}
	return fmt.Sprintf("[%d, %d)", lo, hi)
}

// reason adds the structural cause for the kinds that can fail.
func (m blockDiagonal) reason() string {
	switch m.info.rule {
	case ruleCausalTopLeft, ruleLocalTopLeft:
		return "; this mask's causal diagonal starts at each block's top-left corner, FlashInfer's ends at the bottom-right corner, and the two agree only in blocks with q_seqlen == kv_seqlen (or an empty block)"
	}
	return ""
}

// FlashInferDense materialises the mask FlashInfer applies for causal and
// window_left over a batch with the given per-request lengths, in the same
// block-diagonal dense layout as the xFormers masks' Materialize: request b
// occupies rows sum(qoLens[:b]).. and columns sum(kvLens[:b]).., and query i
// of request b sees key j when j <= i + kv_len - qo_len (if causal) and
// j >= i + kv_len - qo_len - windowLeft (if windowLeft >= 0). windowLeft
// below -1 wraps [ErrInvalidWindow].
func FlashInferDense(qoLens, kvLens []int32, causal bool, windowLeft int) (Dense, error) {
	if windowLeft < -1 {
		return Dense{}, fmt.Errorf("%w: window_left = %d, want >= -1", ErrInvalidWindow, windowLeft)
	}
	if err := checkLens(qoLens, kvLens); err != nil {
		return Dense{}, err
	}
	rows, cols := 0, 0
	for b := range qoLens {
		rows += int(qoLens[b])
		cols += int(kvLens[b])
	}
	d, err := NewDense(rows, cols)
	if err != nil {
		return Dense{}, err
	}
	r0, c0 := 0, 0
	for b := range qoLens {
		q, kv := int(qoLens[b]), int(kvLens[b])
		for i := 0; i < q; i++ {
			lo, hi := flashInferRow(q, kv, i, causal, windowLeft)
			row := d.Allowed[(r0+i)*cols+c0:]
			for j := lo; j < hi; j++ {
				row[j] = true
			}
		}
		r0 += q
		c0 += kv
	}
	return d, nil
}
