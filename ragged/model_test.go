package ragged

// Slow, obviously correct models of the package's clever routines, written
// from the definitions (numpy.packbits, xFormers' tril/triu materialisation,
// FlashInfer's kernel inequalities, the seed's Python and C++ SWA code), not
// from the code they check. Randomized tests and fuzzers compare against them.

// modelPackBits packs bit by bit: byte i/8 gets x[i] at bit i%8 (little) or
// bit 7-i%8 (big); any nonzero input is 1.
func modelPackBits(x []byte, order BitOrder) []byte {
	out := make([]byte, (len(x)+7)/8)
	for i, v := range x {
		if v == 0 {
			continue
		}
		if order == BitOrderBig {
			out[i/8] |= 0x80 >> (i % 8)
		} else {
			out[i/8] |= 1 << (i % 8)
		}
	}
	return out
}

// modelUnpackBits reads nbits bits back one at a time.
func modelUnpackBits(packed []byte, nbits int, order BitOrder) []byte {
	out := make([]byte, nbits)
	for i := range out {
		shift := i % 8
		if order == BitOrderBig {
			shift = 7 - shift
		}
		out[i] = packed[i/8] >> shift & 1
	}
	return out
}

// modelSegmentPackBits packs each segment on its own and appends.
func modelSegmentPackBits(x []byte, indptr []int32, order BitOrder) ([]byte, []int32) {
	var y []byte
	out := []int32{0}
	for i := 0; i+1 < len(indptr); i++ {
		y = append(y, modelPackBits(x[indptr[i]:indptr[i+1]], order)...)
		out = append(out, int32(len(y)))
	}
	if y == nil {
		y = []byte{}
	}
	return y, out
}

// xformersBlock is one block of an xFormers mask as torch would build it:
// ones(q, kv); causal kinds keep tril(diagonal=shift) and local kinds also
// triu(diagonal=shift-window+1), i.e. cell (i, j) survives when
// shift-window+1 <= j-i <= shift. shift is 0 (top-left) or kv-q (bottom-right).
func xformersBlock(kind MaskKind, q, kv, window int) [][]bool {
	blk := make([][]bool, q)
	for i := range blk {
		blk[i] = make([]bool, kv)
		for j := range blk[i] {
			shift := 0
			switch kind {
			case KindBlockDiagonalCausalFromBottomRight, KindBlockDiagonalCausalLocalFromBottomRight,
				KindBlockDiagonalCausalWithOffsetPaddedKeys:
				shift = kv - q
			}
			d := j - i
			switch kind {
			case KindBlockDiagonal:
				blk[i][j] = true
			case KindBlockDiagonalCausal, KindBlockDiagonalCausalFromBottomRight, KindBlockDiagonalCausalWithOffsetPaddedKeys:
				blk[i][j] = d <= shift
			case KindBlockDiagonalCausalLocal, KindBlockDiagonalCausalLocalFromBottomRight:
				blk[i][j] = d <= shift && d >= shift-window+1
			}
		}
	}
	return blk
}

// modelXFormers materialises cfg the way xFormers' materialize does: a
// fully masked [sum q, sum kv] (or [sum q, B*kv_padding]) matrix with each
// block pasted at its row and column start.
func modelXFormers(cfg MaskConfig) Dense {
	rows, cols := 0, 0
	for b := range cfg.QSeqLen {
		rows += int(cfg.QSeqLen[b])
		if cfg.Kind == KindBlockDiagonalCausalWithOffsetPaddedKeys {
			cols += cfg.KVPadding
		} else {
			cols += int(cfg.KVSeqLen[b])
		}
	}
	d := Dense{Rows: rows, Cols: cols, Allowed: make([]bool, rows*cols)}
	r0, c0 := 0, 0
	for b := range cfg.QSeqLen {
		q, kv := int(cfg.QSeqLen[b]), int(cfg.KVSeqLen[b])
		blk := xformersBlock(cfg.Kind, q, kv, cfg.WindowSize)
		for i := 0; i < q; i++ {
			for j := 0; j < kv; j++ {
				d.Allowed[(r0+i)*cols+c0+j] = blk[i][j]
			}
		}
		r0 += q
		if cfg.Kind == KindBlockDiagonalCausalWithOffsetPaddedKeys {
			c0 += cfg.KVPadding
		} else {
			c0 += kv
		}
	}
	return d
}

// modelFlashInferKeep is FlashInfer's kernel test for query qIdx and key
// kvIdx of a request: causal masks kv_idx + qo_len > kv_len + q_idx, and
// window_left w >= 0 keeps kv_idx + qo_len + w >= kv_len + q_idx.
func modelFlashInferKeep(qoLen, kvLen, qIdx, kvIdx int, causal bool, w int) bool {
	if causal && kvIdx+qoLen > kvLen+qIdx {
		return false
	}
	if w >= 0 && kvIdx+qoLen+w < kvLen+qIdx {
		return false
	}
	return true
}

// modelFlashInferBlocks returns FlashInfer's per-request masks.
func modelFlashInferBlocks(qo, kv []int32, causal bool, w int) [][][]bool {
	out := make([][][]bool, len(qo))
	for b := range qo {
		out[b] = make([][]bool, qo[b])
		for i := range out[b] {
			out[b][i] = make([]bool, kv[b])
			for j := range out[b][i] {
				out[b][i][j] = modelFlashInferKeep(int(qo[b]), int(kv[b]), i, j, causal, w)
			}
		}
	}
	return out
}

// xformersBlocks returns the per-block masks of cfg (real keys only).
func xformersBlocks(cfg MaskConfig) [][][]bool {
	out := make([][][]bool, len(cfg.QSeqLen))
	for b := range out {
		out[b] = xformersBlock(cfg.Kind, int(cfg.QSeqLen[b]), int(cfg.KVSeqLen[b]), cfg.WindowSize)
	}
	return out
}

func blocksEqual(a, b [][][]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for r := range a {
		if len(a[r]) != len(b[r]) {
			return false
		}
		for i := range a[r] {
			if len(a[r][i]) != len(b[r][i]) {
				return false
			}
			for j := range a[r][i] {
				if a[r][i][j] != b[r][i][j] {
					return false
				}
			}
		}
	}
	return true
}

// flattenBlocks is FlashInfer's custom_mask: each request's block row-major,
// concatenated, 0/1.
func flattenBlocks(blocks [][][]bool) []byte {
	out := []byte{}
	for _, blk := range blocks {
		for _, row := range blk {
			for _, v := range row {
				if v {
					out = append(out, 1)
				} else {
					out = append(out, 0)
				}
			}
		}
	}
	return out
}

// modelSWAPython is the seed's Python: start from ones*masked, add
// triu(k=1) and tril(k=-w); a cell is masked when j-i >= 1 or j-i <= -w.
func modelSWAPython(size, w int) [][]bool {
	out := make([][]bool, size)
	for i := range out {
		out[i] = make([]bool, size)
		for j := range out[i] {
			masked := j-i >= 1 || j-i <= -w
			out[i][j] = !masked
		}
	}
	return out
}

// modelSWACpp is the seed's C++ loop with the row stride corrected to the
// mask size: row i is cleared from offset = i >= w ? i-w+1 : 0 through i.
func modelSWACpp(size, w int) [][]bool {
	out := make([][]bool, size)
	for i := range out {
		out[i] = make([]bool, size)
		offset := 0
		if i >= w {
			offset = i - w + 1
		}
		for j := offset; j < i+1; j++ {
			out[i][j] = true
		}
	}
	return out
}

// cppCompressedWindow is the seed's C++ for the compressed mask:
// blockSize = embeddim > 128 ? 16384/embeddim/16*16 : 128 and
// compressWindow = w > 3*blockSize ? 2*blockSize + w%blockSize : w.
func cppCompressedWindow(windowSize, headDim int) int {
	blockSize := 128
	if headDim > 128 {
		blockSize = 16384 / headDim / 16 * 16
	}
	if windowSize > 3*blockSize {
		return 2*blockSize + windowSize%blockSize
	}
	return windowSize
}

// pythonCompressedWindow is the seed's Python for the compressed mask.
func pythonCompressedWindow(windowSize, headDim int) int {
	ppN := 64
	if headDim <= 128 {
		ppN = 128
	}
	if windowSize <= ppN*3 {
		return windowSize
	}
	if windowSize%ppN == 0 {
		return ppN * 3
	}
	return ppN*2 + windowSize%ppN
}

func denseFromRows(rows [][]bool) Dense {
	d := Dense{Rows: len(rows), Allowed: []bool{}}
	if len(rows) > 0 {
		d.Cols = len(rows[0])
	}
	for _, r := range rows {
		d.Allowed = append(d.Allowed, r...)
	}
	return d
}
