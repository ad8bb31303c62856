package ragged

import (
	"fmt"
	"math"
)

// MaskIndptr is FlashInfer's _compute_mask_indptr(qo_indptr, kv_indptr) for
// the ragged-KV prefill wrapper: request i's boolean mask [qo_len[i],
// kv_len[i]] is flattened row-major (query major) and the requests are
// concatenated, so
//
//	mask_indptr[0] = 0, mask_indptr[i+1] = mask_indptr[i] + qo_len[i]*kv_len[i]
//
// in bits (elements). qoIndptr and kvIndptr both have length batch_size+1.
// A total above math.MaxInt32 wraps [ErrTooLarge]. Use
// [SegmentPackedIndptr] for the byte offsets of the packed mask.
func MaskIndptr(qoIndptr, kvIndptr []int32) ([]int32, error) {
	if err := CheckIndptr("qo_indptr", qoIndptr); err != nil {
		return nil, err
	}
	if err := CheckIndptr("kv_indptr", kvIndptr); err != nil {
		return nil, err
	}
	if len(qoIndptr) != len(kvIndptr) {
		return nil, fmt.Errorf("%w: qo_indptr has length %d, kv_indptr %d", ErrLengthMismatch, len(qoIndptr), len(kvIndptr))
	}
	return maskIndptr(len(qoIndptr)-1,
		func(i int) int64 { return int64(qoIndptr[i+1] - qoIndptr[i]) },
		func(i int) int64 { return int64(kvIndptr[i+1] - kvIndptr[i]) })
}

// MaskIndptrFromLens is [MaskIndptr] from per-request lengths: qoLens and
// kvLens both have length batch_size and hold values >= 0.
func MaskIndptrFromLens(qoLens, kvLens []int32) ([]int32, error) {
	if err := checkLens(qoLens, kvLens); err != nil {
		return nil, err
	}
	return maskIndptr(len(qoLens),
		func(i int) int64 { return int64(qoLens[i]) },
		func(i int) int64 { return int64(kvLens[i]) })
}

// PagedMaskIndptr is FlashInfer's _compute_page_mask_indptr for the paged
// prefill wrapper: as [MaskIndptr], with request i's kv_len taken from its
// page table, (pages-1)*pageSize + kv_last_page_len[i], where pages =
// kv_indptr[i+1]-kv_indptr[i] (kv_indptr counts pages here).
//
// A request with no pages has kv_len 0 and must have kv_last_page_len 0; a
// request with pages must have kv_last_page_len in 1..pageSize; otherwise the
// error wraps [ErrBadLastPageLen]. (FlashInfer's Python helper does not clamp
// the empty case and would compute a negative kv_len.)
func PagedMaskIndptr(qoIndptr, kvIndptr, kvLastPageLen []int32, pageSize int) ([]int32, error) {
	if err := CheckIndptr("qo_indptr", qoIndptr); err != nil {
		return nil, err
	}
	kvLens, err := pagedKVLens(kvIndptr, kvLastPageLen, pageSize)
	if err != nil {
		return nil, err
	}
	if len(qoIndptr)-1 != len(kvLens) {
		return nil, fmt.Errorf("%w: qo_indptr has length %d, kv_indptr %d", ErrLengthMismatch, len(qoIndptr), len(kvIndptr))
	}
	return maskIndptr(len(kvLens),
		func(i int) int64 { return int64(qoIndptr[i+1] - qoIndptr[i]) },
		func(i int) int64 { return kvLens[i] })
}

// pagedKVLens returns each request's KV length from a CSR page table.
func pagedKVLens(kvIndptr, kvLastPageLen []int32, pageSize int) ([]int64, error) {
	if err := ValidatePagedKVLens(kvIndptr, kvLastPageLen, pageSize); err != nil {
		return nil, err
	}
	lens := make([]int64, len(kvLastPageLen))
	for i := range lens {
		lens[i] = int64(PagedKVLen(kvIndptr, kvLastPageLen, pageSize, i))
	}
	return lens, nil
}

func checkLens(qoLens, kvLens []int32) error {
	if len(qoLens) != len(kvLens) {
		return fmt.Errorf("%w: %d qo lengths, %d kv lengths", ErrLengthMismatch, len(qoLens), len(kvLens))
	}
	for i := range qoLens {
		if qoLens[i] < 0 || kvLens[i] < 0 {
			return fmt.Errorf("%w: request %d has qo_len %d, kv_len %d", ErrNegativeLength, i, qoLens[i], kvLens[i])
		}
	}
	return nil
}

func maskIndptr(batch int, qoLen, kvLen func(int) int64) ([]int32, error) {
	out := make([]int32, batch+1)
	var sum int64
	for i := 0; i < batch; i++ {
		sum += qoLen(i) * kvLen(i)
		if sum > math.MaxInt32 {
			return nil, fmt.Errorf("%w: mask_indptr reaches %d bits at request %d (qo_len %d, kv_len %d), beyond int32",
				ErrTooLarge, sum, i, qoLen(i), kvLen(i))
		}
		out[i+1] = int32(sum)
	}
	return out, nil
}

// PackCustomMask does what FlashInfer's prefill plan() does with a boolean
// custom_mask: customMask is the flattened 2-D ragged mask (request i's
// [qo_len, kv_len] block, row-major, 1 = keep), it must hold exactly
// mask_indptr[batch_size] = sum(qo_len*kv_len) elements (else [ErrMaskSize]),
// and it is packed per request with little bit order. The results are
// FlashInfer's packed_custom_mask and the byte mask_indptr its kernels read.
func PackCustomMask(customMask []byte, qoIndptr, kvIndptr []int32) (packedCustomMask []byte, maskIndptrBytes []int32, err error) {
	bitIndptr, err := MaskIndptr(qoIndptr, kvIndptr)
	if err != nil {
		return nil, nil, err
	}
	if want := int(bitIndptr[len(bitIndptr)-1]); len(customMask) != want {
		return nil, nil, fmt.Errorf("%w: custom_mask has %d elements, sum(qo_len*kv_len) = %d", ErrMaskSize, len(customMask), want)
	}
	return SegmentPackBits(customMask, bitIndptr, BitOrderLittle)
}

// ValidatePackedMask checks that a packed custom mask agrees with the batch it
// describes: len(byteIndptr) == batch_size+1 with byteIndptr[0] == 0,
// request i occupies exactly ceil(qoLens[i]*kvLens[i]/8) bytes, and packed
// holds at least byteIndptr[batch_size] bytes. Mismatches wrap [ErrMaskSize]
// and name the request.
func ValidatePackedMask(packed []byte, byteIndptr, qoLens, kvLens []int32) error {
	if err := checkLens(qoLens, kvLens); err != nil {
		return err
	}
	if err := CheckIndptr("mask_indptr", byteIndptr); err != nil {
		return err
	}
	if len(byteIndptr) != len(qoLens)+1 {
		return fmt.Errorf("%w: mask_indptr has length %d, want batch_size+1 = %d", ErrLengthMismatch, len(byteIndptr), len(qoLens)+1)
	}
	for i := range qoLens {
		if err := checkRequestBytes(byteIndptr, qoLens, kvLens, i); err != nil {
			return err
		}
	}
	if last := int(byteIndptr[len(byteIndptr)-1]); last > len(packed) {
		return fmt.Errorf("%w: mask_indptr ends at byte %d, packed mask has %d", ErrMaskSize, last, len(packed))
	}
	return nil
}

func checkRequestBytes(byteIndptr, qoLens, kvLens []int32, i int) error {
	nbits := int64(qoLens[i]) * int64(kvLens[i])
	if got, want := int64(byteIndptr[i+1]-byteIndptr[i]), (nbits+7)/8; got != want {
		return fmt.Errorf("%w: request %d (qo_len %d, kv_len %d) has %d bytes, want %d",
			ErrMaskSize, i, qoLens[i], kvLens[i], got, want)
	}
	return nil
}

// MaskBit reads one bit of a packed FlashInfer custom mask the way the
// kernel does (DefaultAttention::LogitsMask): with off = qo*kv_len[req] + kv,
// the bit is (packed[byteIndptr[req] + off/8] >> (off%8)) & 1, little order;
// true means query qo of request req may attend key kv. qo and kv are local
// to the request.
//
// The kernel treats qo >= qo_len or kv >= kv_len as masked; MaskBit returns
// [ErrOutOfRange] instead, so a caller's indexing bug is not silent. Only
// request req is checked against the lengths (O(1)); check the whole mask
// once with [ValidatePackedMask].
func MaskBit(packed []byte, byteIndptr, qoLens, kvLens []int32, req, qo, kv int) (bool, error) {
	if len(qoLens) != len(kvLens) || len(byteIndptr) != len(qoLens)+1 {
		return false, fmt.Errorf("%w: %d qo lengths, %d kv lengths, mask_indptr length %d",
			ErrLengthMismatch, len(qoLens), len(kvLens), len(byteIndptr))
	}
	if req < 0 || req >= len(qoLens) {
		return false, fmt.Errorf("%w: request %d, batch size %d", ErrOutOfRange, req, len(qoLens))
	}
	if qo < 0 || qo >= int(qoLens[req]) || kv < 0 || kv >= int(kvLens[req]) {
		return false, fmt.Errorf("%w: request %d (qo_len %d, kv_len %d) has no (qo %d, kv %d)",
			ErrOutOfRange, req, qoLens[req], kvLens[req], qo, kv)
	}
	if byteIndptr[req] < 0 || byteIndptr[req+1] < byteIndptr[req] {
		return false, fmt.Errorf("%w: mask_indptr[%d..%d] = %d..%d", ErrBadIndptr, req, req+1, byteIndptr[req], byteIndptr[req+1])
	}
	if err := checkRequestBytes(byteIndptr, qoLens, kvLens, req); err != nil {
		return false, err
	}
	if int(byteIndptr[req+1]) > len(packed) {
		return false, fmt.Errorf("%w: request %d ends at byte %d, packed mask has %d", ErrMaskSize, req, byteIndptr[req+1], len(packed))
	}
	off := qo*int(kvLens[req]) + kv
	return packed[int(byteIndptr[req])+off/8]>>(off%8)&1 == 1, nil
}
