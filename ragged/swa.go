package ragged

import "fmt"

// The Ascend sliding-window-attention (SWA) masks of the Mistral notes
// (seed 003). Query i sees key j when j <= i and j > i - w: itself and the
// w-1 keys before it. Two forms exist:
//
//   - the plain mask, [max_seq, max_seq] with w = window_size;
//   - the compressed mask, always [512, 512], with w derived from
//     window_size and the head dimension by [CompressedSWAWindow].
//
// Both are handed to the kernel as float32, either additive (0 allowed,
// -65536 masked) or as "masked" flags (0 allowed, 1 masked).

const (
	// CompressedSWAMaskSize is the side of the compressed SWA mask.
	CompressedSWAMaskSize = 512

	// SWAMaskedValue is the additive value of a masked cell in the Ascend
	// masks. It is exact in float32 and bfloat16 but not representable in
	// float16 (max 65504): converted to fp16 it becomes -Inf.
	SWAMaskedValue float32 = -65536
)

// SlidingWindowMask is one of the Ascend SWA masks: a Size×Size band in which
// query i sees keys max(0, i-Window+1) .. i. It is an immutable value; the
// zero value is an empty mask.
type SlidingWindowMask struct {
	size   int // rows = columns
	window int // effective band width w >= 1 (after compression)
}

// SWAMask is the plain Ascend SWA mask for sequences of up to maxSeq tokens:
// Size() == maxSeq, Window() == windowSize. When windowSize >= maxSeq it is
// the ordinary causal mask, as the seed notes. maxSeq must be >= 1 and
// windowSize >= 1 ([ErrNegativeLength], [ErrInvalidWindow]); maxSeq² above
// [MaxDenseCells] wraps [ErrTooLarge].
func SWAMask(maxSeq, windowSize int) (SlidingWindowMask, error) {
	if maxSeq < 1 {
		return SlidingWindowMask{}, fmt.Errorf("%w: max_seq = %d", ErrNegativeLength, maxSeq)
	}
	if windowSize < 1 {
		return SlidingWindowMask{}, fmt.Errorf("%w: window_size = %d, want >= 1", ErrInvalidWindow, windowSize)
	}
	if n, ok := mulFits(maxSeq, maxSeq, 1); !ok || n > MaxDenseCells {
		return SlidingWindowMask{}, fmt.Errorf("%w: max_seq = %d gives a mask above MaxDenseCells = %d", ErrTooLarge, maxSeq, MaxDenseCells)
	}
	return SlidingWindowMask{size: maxSeq, window: windowSize}, nil
}

// SWABlockSize is the kernel block size the compressed mask is built for:
// 128 when headDim <= 128, else 64 (the seed's Python; its C++ computes
// 16384/headDim rounded down to a multiple of 16 instead, which agrees only
// at headDim 256 — see docs/masks.md).
func SWABlockSize(headDim int) int {
	if headDim <= 128 {
		return 128
	}
	return 64
}

// CompressedSWAWindow returns the band width w of the compressed SWA mask,
// following the seed's Python: with blk = SWABlockSize(headDim),
//
//	w = windowSize            if windowSize <= 3*blk
//	w = 3*blk                 if windowSize % blk == 0
//	w = 2*blk + windowSize%blk otherwise
//
// (The seed's C++ gives 2*blk in the middle case.) headDim must be >= 1 and
// windowSize >= 1.
func CompressedSWAWindow(windowSize, headDim int) (int, error) {
	if headDim < 1 {
		return 0, fmt.Errorf("%w: head_dim = %d", ErrNegativeLength, headDim)
	}
	if windowSize < 1 {
		return 0, fmt.Errorf("%w: window_size = %d, want >= 1", ErrInvalidWindow, windowSize)
	}
	blk := SWABlockSize(headDim)
	switch {
	case windowSize <= 3*blk:
		return windowSize, nil
	case windowSize%blk == 0:
		return 3 * blk, nil
	default:
		return 2*blk + windowSize%blk, nil
	}
}

// CompressedSWAMask is the compressed Ascend SWA mask: always
// [CompressedSWAMaskSize, CompressedSWAMaskSize], with band width
// [CompressedSWAWindow](windowSize, headDim). It is a kernel input from which
// the Ascend kernel derives each tile's mask, not the logical attention mask
// of a sequence; the logical mask is SWAMask(seqLen, windowSize).
func CompressedSWAMask(windowSize, headDim int) (SlidingWindowMask, error) {
	w, err := CompressedSWAWindow(windowSize, headDim)
	if err != nil {
		return SlidingWindowMask{}, err
	}
	return SlidingWindowMask{size: CompressedSWAMaskSize, window: w}, nil
}

// Size returns the number of rows (= columns).
func (m SlidingWindowMask) Size() int { return m.size }

// Window returns the effective band width w: each query sees itself and up
// to w-1 earlier keys.
func (m SlidingWindowMask) Window() int { return m.window }

// Allowed reports whether query i may attend key j: j <= i and j > i-w. It
// panics outside the mask.
func (m SlidingWindowMask) Allowed(i, j int) bool {
	if i < 0 || i >= m.size || j < 0 || j >= m.size {
		panic(fmt.Sprintf("ragged: SlidingWindowMask.Allowed(%d, %d) outside %d×%d", i, j, m.size, m.size))
	}
	return j <= i && j > i-m.window
}

// rowRange is the half-open interval of keys row i sees.
func (m SlidingWindowMask) rowRange(i int) (lo, hi int) {
	return max(0, i-m.window+1), i + 1
}

// AsBool materialises the mask, true = allowed.
func (m SlidingWindowMask) AsBool() Dense {
	d := Dense{Rows: m.size, Cols: m.size, Allowed: make([]bool, m.size*m.size)}
	for i := 0; i < m.size; i++ {
		lo, hi := m.rowRange(i)
		row := d.Allowed[i*m.size:]
		for j := lo; j < hi; j++ {
			row[j] = true
		}
	}
	return d
}

// AsAdditive returns the mask as the seed's additive float mask, row-major
// [Size*Size]: 0 where allowed, [SWAMaskedValue] (-65536) where masked.
func (m SlidingWindowMask) AsAdditive() []float32 {
	return m.fill(0, SWAMaskedValue)
}

// AsMaskedFlags returns the seed's 0/1 variant, row-major [Size*Size]: 0 where
// allowed and 1 where masked (the polarity is the opposite of AsBool).
func (m SlidingWindowMask) AsMaskedFlags() []float32 {
	return m.fill(0, 1)
}

func (m SlidingWindowMask) fill(allowed, masked float32) []float32 {
	out := make([]float32, m.size*m.size)
	for i := 0; i < m.size; i++ {
		lo, hi := m.rowRange(i)
		row := out[i*m.size : (i+1)*m.size]
		for j := range row {
			if j >= lo && j < hi {
				row[j] = allowed
			} else {
				row[j] = masked
			}
		}
	}
	return out
}

// FlashInferParams returns the FlashInfer parameters of the plain mask for
// one request with qo_len = kv_len = Size(): causal, window_left = w-1.
// (For the compressed mask this describes the 512×512 tile, not a sequence.)
func (m SlidingWindowMask) FlashInferParams() FlashInferParams {
	return FlashInferParams{Causal: true, WindowLeft: m.window - 1, OK: true}
}
