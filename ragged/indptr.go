package ragged

import (
	"fmt"
	"math"
)

// CheckIndptr checks the shape of a CSR row-pointer array without looking at
// the data it indexes: at least one element, indptr[0] == 0, non-decreasing.
// name is the FlashInfer argument name used in the error message, which
// wraps [ErrBadIndptr]; it allocates only when it fails. It is the module's
// one indptr check: [ValidatePageTable]'s kv_indptr, pagetable's
// append_indptr and kernels' qo_indptr all go through it.
func CheckIndptr(name string, indptr []int32) error {
	if fault := indptrFault(name, indptr); fault != "" {
		return fmt.Errorf("%w: %s", ErrBadIndptr, fault)
	}
	return nil
}

// indptrFault says what breaks CheckIndptr's rules, naming the index and
// the value, or is "" for a well-formed indptr (without allocating).
func indptrFault(name string, indptr []int32) string {
	if len(indptr) == 0 {
		return fmt.Sprintf("%s is empty, want length batch_size+1 >= 1", name)
	}
	if indptr[0] != 0 {
		return fmt.Sprintf("%s[0] = %d, want 0", name, indptr[0])
	}
	for i := 1; i < len(indptr); i++ {
		if indptr[i] < indptr[i-1] {
			return fmt.Sprintf("%s decreases at request %d: %s[%d] = %d > %s[%d] = %d",
				name, i-1, name, i-1, indptr[i-1], name, i, indptr[i])
		}
	}
	return ""
}

// ValidateIndptr reports whether indptr is a valid ragged-tensor row pointer
// over nnz rows of data: len(indptr) == batch_size+1 >= 1, indptr[0] == 0,
// indptr is non-decreasing and indptr[batch_size] == nnz. Request i then owns
// rows [indptr[i], indptr[i+1]). The error wraps [ErrBadIndptr].
func ValidateIndptr(indptr []int32, nnz int) error {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return err
	}
	if last := len(indptr) - 1; int(indptr[last]) != nnz {
		return fmt.Errorf("%w: indptr[%d] = %d, want nnz = %d", ErrBadIndptr, last, indptr[last], nnz)
	}
	return nil
}

// Lengths returns the per-request lengths of a ragged tensor,
// lens[i] = indptr[i+1] - indptr[i]; len(lens) == len(indptr)-1.
func Lengths(indptr []int32) ([]int32, error) {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return nil, err
	}
	lens := make([]int32, len(indptr)-1)
	for i := range lens {
		lens[i] = indptr[i+1] - indptr[i]
	}
	return lens, nil
}

// LengthsTo is [Lengths] writing into dst, which must have length
// len(indptr)-1. It does not allocate; on error dst is unchanged.
func LengthsTo(dst, indptr []int32) error {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return err
	}
	if len(dst) != len(indptr)-1 {
		return fmt.Errorf("%w: dst has length %d, want len(indptr)-1 = %d", ErrLengthMismatch, len(dst), len(indptr)-1)
	}
	for i := range dst {
		dst[i] = indptr[i+1] - indptr[i]
	}
	return nil
}

// IndptrFromLengths returns the exclusive prefix sum of lens:
// indptr[0] = 0, indptr[i+1] = indptr[i] + lens[i], len(indptr) == len(lens)+1.
// A negative length wraps [ErrNegativeLength]; a total above math.MaxInt32
// (FlashInfer's index arrays are int32) wraps [ErrTooLarge].
func IndptrFromLengths(lens []int32) ([]int32, error) {
	if err := checkLengths("lens", lens); err != nil {
		return nil, err
	}
	indptr := make([]int32, len(lens)+1)
	for i, n := range lens {
		indptr[i+1] = indptr[i] + n
	}
	return indptr, nil
}

// IndptrFromLengthsTo is [IndptrFromLengths] writing into dst, which must have
// length len(lens)+1. It does not allocate; on error dst is unchanged.
func IndptrFromLengthsTo(dst, lens []int32) error {
	if err := checkLengths("lens", lens); err != nil {
		return err
	}
	if len(dst) != len(lens)+1 {
		return fmt.Errorf("%w: dst has length %d, want len(lens)+1 = %d", ErrLengthMismatch, len(dst), len(lens)+1)
	}
	dst[0] = 0
	for i, n := range lens {
		dst[i+1] = dst[i] + n
	}
	return nil
}

// checkLengths checks that every length is >= 0 and that their sum fits int32.
func checkLengths(name string, lens []int32) error {
	var sum int64
	for i, n := range lens {
		if n < 0 {
			return fmt.Errorf("%w: %s[%d] = %d", ErrNegativeLength, name, i, n)
		}
		sum += int64(n)
		if sum > math.MaxInt32 {
			return fmt.Errorf("%w: sum of %s[0..%d] = %d exceeds int32", ErrTooLarge, name, i, sum)
		}
	}
	return nil
}

// MaxLength returns the largest request length in a ragged tensor (0 for an
// empty batch).
func MaxLength(indptr []int32) (int, error) {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return 0, err
	}
	m := int32(0)
	for i := 1; i < len(indptr); i++ {
		m = max(m, indptr[i]-indptr[i-1])
	}
	return int(m), nil
}

// Slice returns request i of a ragged tensor, data[indptr[i]*width :
// indptr[i+1]*width], where width is the number of elements per row
// (num_heads*head_dim for an NHD Q/K/V tensor of shape [nnz, H, D]). The
// result aliases data. Only indptr[i] and indptr[i+1] are checked, so a
// loop over all requests costs O(batch) in total; validate the whole array
// once with [ValidateIndptr].
func Slice[T any](data []T, indptr []int32, i, width int) ([]T, error) {
	if i < 0 || i+1 >= len(indptr) {
		return nil, fmt.Errorf("%w: request %d, batch size %d", ErrOutOfRange, i, len(indptr)-1)
	}
	if width < 1 {
		return nil, fmt.Errorf("%w: width = %d", ErrNegativeLength, width)
	}
	lo, hi := int(indptr[i]), int(indptr[i+1])
	if lo < 0 || hi < lo {
		return nil, fmt.Errorf("%w: request %d spans indptr[%d] = %d to indptr[%d] = %d", ErrBadIndptr, i, i, lo, i+1, hi)
	}
	if hi > len(data)/width {
		return nil, fmt.Errorf("%w: request %d ends at row %d, data has %d rows of width %d",
			ErrLengthMismatch, i, hi, len(data)/width, width)
	}
	return data[lo*width : hi*width : hi*width], nil
}

// CSRToCOO expands a ragged row pointer into one (request, position) pair per
// row: for every request b and every p in [0, indptr[b+1]-indptr[b]),
// batchIndices[indptr[b]+p] = b and positions[indptr[b]+p] = p. Both results
// have length indptr[batch_size].
//
// positions are local to the ragged segment. FlashInfer's
// get_batch_indices_positions shifts them by seq_len - append_len, the
// number of tokens already in the cache; that variant belongs to the append
// planner.
func CSRToCOO(indptr []int32) (batchIndices, positions []int32, err error) {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return nil, nil, err
	}
	nnz := indptr[len(indptr)-1]
	batchIndices = make([]int32, nnz)
	positions = make([]int32, nnz)
	fillCOO(batchIndices, positions, indptr)
	return batchIndices, positions, nil
}

// CSRToCOOTo is [CSRToCOO] writing into caller buffers of length
// indptr[batch_size]. It does not allocate; on error nothing is written.
func CSRToCOOTo(dstBatchIndices, dstPositions, indptr []int32) error {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return err
	}
	nnz := int(indptr[len(indptr)-1])
	if len(dstBatchIndices) != nnz || len(dstPositions) != nnz {
		return fmt.Errorf("%w: dst batch_indices has length %d and positions %d, want nnz = %d",
			ErrLengthMismatch, len(dstBatchIndices), len(dstPositions), nnz)
	}
	fillCOO(dstBatchIndices, dstPositions, indptr)
	return nil
}

func fillCOO(batchIndices, positions, indptr []int32) {
	for b := 0; b+1 < len(indptr); b++ {
		lo, hi := indptr[b], indptr[b+1]
		for k := lo; k < hi; k++ {
			batchIndices[k] = int32(b)
			positions[k] = k - lo
		}
	}
}

// COOToCSR is the inverse of [CSRToCOO]: it rebuilds the row pointer of a
// batch of batchSize requests from one batch index per row. batchIndices must
// be non-decreasing and in [0, batchSize) (requests with no rows are
// allowed). positions may be nil; otherwise it must have the same length and
// read 0, 1, 2, ... within each request, as CSRToCOO writes it. Violations
// wrap [ErrNotSorted] or [ErrOutOfRange] and name the row.
func COOToCSR(batchIndices, positions []int32, batchSize int) ([]int32, error) {
	if batchSize < 0 {
		return nil, fmt.Errorf("%w: batch size %d", ErrNegativeLength, batchSize)
	}
	if err := checkCOO(batchIndices, positions, batchSize); err != nil {
		return nil, err
	}
	indptr := make([]int32, batchSize+1)
	fillCSR(indptr, batchIndices)
	return indptr, nil
}

// COOToCSRTo is [COOToCSR] writing into dst; the batch size is len(dst)-1.
// It does not allocate; on error dst is unchanged.
func COOToCSRTo(dst, batchIndices, positions []int32) error {
	if len(dst) == 0 {
		return fmt.Errorf("%w: dst is empty, want length batch_size+1", ErrLengthMismatch)
	}
	if err := checkCOO(batchIndices, positions, len(dst)-1); err != nil {
		return err
	}
	fillCSR(dst, batchIndices)
	return nil
}

func checkCOO(batchIndices, positions []int32, batchSize int) error {
	if len(batchIndices) > math.MaxInt32 {
		return fmt.Errorf("%w: %d rows exceed int32", ErrTooLarge, len(batchIndices))
	}
	if positions != nil && len(positions) != len(batchIndices) {
		return fmt.Errorf("%w: positions has length %d, batch_indices %d", ErrLengthMismatch, len(positions), len(batchIndices))
	}
	for k, b := range batchIndices {
		if b < 0 || int(b) >= batchSize {
			return fmt.Errorf("%w: batch_indices[%d] = %d, batch size %d", ErrOutOfRange, k, b, batchSize)
		}
		newRequest := k == 0 || b != batchIndices[k-1]
		if k > 0 && b < batchIndices[k-1] {
			return fmt.Errorf("%w: batch_indices[%d] = %d < batch_indices[%d] = %d", ErrNotSorted, k, b, k-1, batchIndices[k-1])
		}
		if positions != nil {
			want := int32(0)
			if !newRequest {
				want = positions[k-1] + 1
			}
			if positions[k] != want {
				return fmt.Errorf("%w: positions[%d] = %d for request %d, want %d", ErrNotSorted, k, positions[k], b, want)
			}
		}
	}
	return nil
}

// fillCSR counts rows per request and prefix-sums the counts in place.
func fillCSR(indptr, batchIndices []int32) {
	clear(indptr)
	for _, b := range batchIndices {
		indptr[b+1]++
	}
	for i := 1; i < len(indptr); i++ {
		indptr[i] += indptr[i-1]
	}
}

// mulFits reports whether a*b*c (all >= 0) fits in an int without overflow.
func mulFits(a, b, c int) (int, bool) {
	if a < 0 || b < 0 || c < 0 {
		return 0, false
	}
	p := a
	for _, f := range [...]int{b, c} {
		if f != 0 && p > math.MaxInt/f {
			return 0, false
		}
		p *= f
	}
	return p, true
}

// checkPaddedCopy validates the arguments of RaggedToPadded (toPadded)
// and PaddedToRagged: the indptr, maxLen and width, and the lengths of src
// and dst against the ragged and padded element counts.
func checkPaddedCopy(indptr []int32, maxLen, width, srcLen, dstLen int, toPadded bool) error {
	padded, ragged, err := checkPadded(indptr, maxLen, width)
	if err != nil {
		return err
	}
	wantSrc, wantDst := ragged, padded
	if !toPadded {
		wantSrc, wantDst = padded, ragged
	}
	if srcLen != wantSrc || dstLen != wantDst {
		return fmt.Errorf("%w: src has %d elements, want %d; dst has %d, want %d",
			ErrLengthMismatch, srcLen, wantSrc, dstLen, wantDst)
	}
	return nil
}

// checkPadded validates the indptr, maxLen and width of a padded copy and
// returns the padded and ragged element counts.
func checkPadded(indptr []int32, maxLen, width int) (padded, ragged int, err error) {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return 0, 0, err
	}
	if width < 1 {
		return 0, 0, fmt.Errorf("%w: width = %d", ErrNegativeLength, width)
	}
	if maxLen < 0 {
		return 0, 0, fmt.Errorf("%w: maxLen = %d", ErrNegativeLength, maxLen)
	}
	for b := 0; b+1 < len(indptr); b++ {
		if n := int(indptr[b+1] - indptr[b]); n > maxLen {
			return 0, 0, fmt.Errorf("%w: request %d has length %d > maxLen %d", ErrOutOfRange, b, n, maxLen)
		}
	}
	batch := len(indptr) - 1
	padded, ok := mulFits(batch, maxLen, width)
	if !ok {
		return 0, 0, fmt.Errorf("%w: padded shape [%d, %d, %d]", ErrTooLarge, batch, maxLen, width)
	}
	ragged, ok = mulFits(int(indptr[batch]), width, 1)
	if !ok {
		return 0, 0, fmt.Errorf("%w: ragged shape [%d, %d]", ErrTooLarge, indptr[batch], width)
	}
	return padded, ragged, nil
}

// RaggedToPadded copies a ragged tensor src of shape [indptr[B], width] into
// the padded tensor dst of shape [B, maxLen, width]: row p of request b goes
// to dst[(b*maxLen+p)*width:], and every slot p >= len(b) is set to pad.
// maxLen must be at least every request's length (see [MaxLength]). On error
// dst is unchanged.
func RaggedToPadded[T any](dst, src []T, indptr []int32, maxLen, width int, pad T) error {
	if err := checkPaddedCopy(indptr, maxLen, width, len(src), len(dst), true); err != nil {
		return err
	}
	rowLen := maxLen * width
	for b := 0; b+1 < len(indptr); b++ {
		lo, hi := int(indptr[b])*width, int(indptr[b+1])*width
		out := dst[b*rowLen : (b+1)*rowLen]
		n := copy(out, src[lo:hi])
		for k := n; k < len(out); k++ {
			out[k] = pad
		}
	}
	return nil
}

// PaddedToRagged is the inverse of [RaggedToPadded]: it gathers the first
// len(b) rows of each request b from the padded tensor src [B, maxLen, width]
// into the ragged tensor dst [indptr[B], width]. Padding slots are not read.
// On error dst is unchanged.
func PaddedToRagged[T any](dst, src []T, indptr []int32, maxLen, width int) error {
	if err := checkPaddedCopy(indptr, maxLen, width, len(src), len(dst), false); err != nil {
		return err
	}
	rowLen := maxLen * width
	for b := 0; b+1 < len(indptr); b++ {
		lo, hi := int(indptr[b])*width, int(indptr[b+1])*width
		copy(dst[lo:hi], src[b*rowLen:])
	}
	return nil
}
