package ragged

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
)

// BitOrder says which bit of a packed byte holds the first of its 8 booleans,
// as numpy.packbits' bitorder argument does. The zero value is invalid, so a
// forgotten order is an error rather than a silent choice.
type BitOrder uint8

const (
	// BitOrderLittle: x[8k] is bit 0 (the LSB) of byte k. FlashInfer's
	// attention masks always use this order.
	BitOrderLittle BitOrder = 1
	// BitOrderBig: x[8k] is bit 7 (the MSB) of byte k. This is the default of
	// numpy.packbits and of flashinfer.packbits / segment_packbits, which is
	// why passing the order explicitly matters.
	BitOrderBig BitOrder = 2
)

// bitOrderNames are FlashInfer's spellings, by BitOrder (none for the
// invalid 0): String prints them and ParseBitOrder reads them.
var bitOrderNames = [...]string{BitOrderLittle: "little", BitOrderBig: "big"}

// String returns "little" or "big", FlashInfer's spelling.
func (o BitOrder) String() string {
	if o != 0 && int(o) < len(bitOrderNames) {
		return bitOrderNames[o]
	}
	return fmt.Sprintf("BitOrder(%d)", uint8(o))
}

// ParseBitOrder parses FlashInfer's bitorder argument, "little" or "big".
func ParseBitOrder(s string) (BitOrder, error) {
	if i := slices.Index(bitOrderNames[:], s); i > 0 {
		return BitOrder(i), nil
	}
	return 0, fmt.Errorf("%w: %q, want \"little\" or \"big\"", ErrBitOrder, s)
}

func (o BitOrder) check() error {
	if o != BitOrderLittle && o != BitOrderBig {
		return fmt.Errorf("%w: %d", ErrBitOrder, uint8(o))
	}
	return nil
}

// PackedLen returns the number of bytes that hold nbits packed bits,
// ceil(nbits/8).
func PackedLen(nbits int) int { return (nbits + 7) / 8 }

// Packing 8 booleans at a time. Load 8 input bytes as a little-endian
// uint64 v, so that x[k] is byte k (bits 8k..8k+7). normalize01 turns every
// nonzero byte into 0x01 (numpy treats any nonzero value as true). Then one
// multiply gathers bit 8k of v into bit 56+k (little order) or bit 63-k (big
// order) of the product, and the top byte is the packed byte:
//
//	little: the multiplier has 2^(7m+7) at byte m, so term (k, m) lands at
//	        8k+7m+7, which is 56+k exactly when k+m == 7;
//	big:    the multiplier has 2^(9m) at byte m, so term (k, m) lands at
//	        8k+9m, which is 63-k exactly when k+m == 7.
//
// All other terms land either above bit 63 (discarded) or below bit 56, and
// the terms below bit 56 sum to less than 2^56, so they never carry into the
// top byte. The randomized tests compare this with a bit-by-bit model.
const (
	mulLittle = 0x0102040810204080
	mulBig    = 0x8040201008040201
	lsb8      = 0x0101010101010101
	low7x8    = 0x7f7f7f7f7f7f7f7f
)

func normalize01(v uint64) uint64 {
	// (b&0x7f)+0x7f sets bit 7 iff the low 7 bits are nonzero and never
	// carries out of the byte; OR-ing b adds its own bit 7.
	return (((v & low7x8) + low7x8) | v) >> 7 & lsb8
}

func pack8(v uint64, mul uint64) byte {
	return byte((normalize01(v) * mul) >> 56)
}

// packInto packs x into dst[:PackedLen(len(x))]; the pad bits of the last
// byte are 0. The caller has checked the lengths and the order.
func packInto(dst, x []byte, order BitOrder) {
	mul := uint64(mulLittle)
	if order == BitOrderBig {
		mul = mulBig
	}
	full := len(x) / 8
	// Fast path: 64 inputs into 8 output bytes per iteration, one multiply
	// per byte; re-slicing lets the compiler drop the bounds checks.
	in, out := x[:8*full], dst[:full]
	for len(in) >= 64 && len(out) >= 8 {
		out[0] = pack8(binary.LittleEndian.Uint64(in[0:8]), mul)
		out[1] = pack8(binary.LittleEndian.Uint64(in[8:16]), mul)
		out[2] = pack8(binary.LittleEndian.Uint64(in[16:24]), mul)
		out[3] = pack8(binary.LittleEndian.Uint64(in[24:32]), mul)
		out[4] = pack8(binary.LittleEndian.Uint64(in[32:40]), mul)
		out[5] = pack8(binary.LittleEndian.Uint64(in[40:48]), mul)
		out[6] = pack8(binary.LittleEndian.Uint64(in[48:56]), mul)
		out[7] = pack8(binary.LittleEndian.Uint64(in[56:64]), mul)
		in, out = in[64:], out[8:]
	}
	for len(in) >= 8 && len(out) >= 1 {
		out[0] = pack8(binary.LittleEndian.Uint64(in), mul)
		in, out = in[8:], out[1:]
	}
	// Slow path: the last partial group, bit by bit.
	if tail := x[8*full:]; len(tail) > 0 {
		var b byte
		for i, v := range tail {
			if v != 0 {
				b |= 1 << i
			}
		}
		if order == BitOrderBig {
			b = bits.Reverse8(b)
		}
		dst[full] = b
	}
}

// PackBits is flashinfer.packbits / numpy.packbits on a flat array: byte k of
// the result holds x[8k..8k+7] in the given bit order, any nonzero x[i] counts
// as 1, and the bits after the last input are 0. The result has
// PackedLen(len(x)) bytes.
func PackBits(x []byte, order BitOrder) ([]byte, error) {
	if err := order.check(); err != nil {
		return nil, err
	}
	dst := make([]byte, PackedLen(len(x)))
	packInto(dst, x, order)
	return dst, nil
}

// PackBitsTo is [PackBits] writing into dst, which must have exactly
// PackedLen(len(x)) bytes. It does not allocate; on error dst is unchanged.
func PackBitsTo(dst, x []byte, order BitOrder) error {
	if err := order.check(); err != nil {
		return err
	}
	if len(dst) != PackedLen(len(x)) {
		return fmt.Errorf("%w: dst has %d bytes, %d bits need %d", ErrLengthMismatch, len(dst), len(x), PackedLen(len(x)))
	}
	packInto(dst, x, order)
	return nil
}

// unpackLittle[b] holds the 8 bits of b, LSB first, one per byte of a
// little-endian uint64: byte k is (b>>k)&1.
var unpackLittle = func() (t [256]uint64) {
	for b := range t {
		for k := 0; k < 8; k++ {
			t[b] |= uint64((b>>k)&1) << (8 * k)
		}
	}
	return t
}()

// unpackInto writes the first len(dst) bits of packed as 0/1 bytes.
func unpackInto(dst, packed []byte, order BitOrder) {
	full := len(dst) / 8
	for k := 0; k < full; k++ {
		b := packed[k]
		if order == BitOrderBig {
			b = bits.Reverse8(b)
		}
		binary.LittleEndian.PutUint64(dst[8*k:], unpackLittle[b])
	}
	if tail := dst[8*full:]; len(tail) > 0 {
		b := packed[full]
		if order == BitOrderBig {
			b = bits.Reverse8(b)
		}
		for i := range tail {
			tail[i] = (b >> i) & 1
		}
	}
}

// UnpackBits is numpy.unpackbits(packed, count=nbits, bitorder=order): it
// returns nbits bytes, each 0 or 1. packed must hold at least
// PackedLen(nbits) bytes; pad bits past nbits are ignored.
func UnpackBits(packed []byte, nbits int, order BitOrder) ([]byte, error) {
	if err := order.check(); err != nil {
		return nil, err
	}
	if nbits < 0 || PackedLen(nbits) > len(packed) {
		return nil, fmt.Errorf("%w: %d bits from %d packed bytes", ErrMaskSize, nbits, len(packed))
	}
	dst := make([]byte, nbits)
	unpackInto(dst, packed, order)
	return dst, nil
}

// UnpackBitsTo is [UnpackBits] writing len(dst) bits into dst. It does not
// allocate; on error dst is unchanged.
func UnpackBitsTo(dst, packed []byte, order BitOrder) error {
	if err := order.check(); err != nil {
		return err
	}
	if PackedLen(len(dst)) > len(packed) {
		return fmt.Errorf("%w: %d bits from %d packed bytes", ErrMaskSize, len(dst), len(packed))
	}
	unpackInto(dst, packed, order)
	return nil
}

// segmentBytes returns the total packed size of the segments of indptr,
// sum over i of ceil((indptr[i+1]-indptr[i])/8). indptr is already valid.
func segmentBytes(indptr []int32) int {
	n := 0
	for i := 1; i < len(indptr); i++ {
		n += PackedLen(int(indptr[i] - indptr[i-1]))
	}
	return n
}

// SegmentPackedIndptr returns the byte indptr that [SegmentPackBits] produces
// for the bit indptr indptr: out[0] = 0 and
// out[i+1] = out[i] + ceil((indptr[i+1]-indptr[i])/8). For an attention mask
// this converts FlashInfer's mask_indptr (bits) into the byte offsets its
// kernels read.
func SegmentPackedIndptr(indptr []int32) ([]int32, error) {
	if err := CheckIndptr("indptr", indptr); err != nil {
		return nil, err
	}
	out := make([]int32, len(indptr))
	fillSegmentIndptr(out, indptr)
	return out, nil
}

func fillSegmentIndptr(dst, indptr []int32) {
	dst[0] = 0
	for i := 1; i < len(indptr); i++ {
		dst[i] = dst[i-1] + int32(PackedLen(int(indptr[i]-indptr[i-1])))
	}
}

// SegmentPackBits is flashinfer.segment_packbits(x, indptr, bitorder): segment
// i = x[indptr[i]:indptr[i+1]] is packed on its own, starting at a byte
// boundary, with zero pad bits after its last element. It returns the packed
// bytes y and their byte indptr (see [SegmentPackedIndptr]); segment i is
// y[packedIndptr[i]:packedIndptr[i+1]].
//
// indptr has length num_segments+1 and must end at len(x); otherwise the
// error wraps [ErrBadIndptr] (a malformed array) or [ErrMaskSize] (a
// well-formed indptr that does not cover x).
func SegmentPackBits(x []byte, indptr []int32, order BitOrder) (y []byte, packedIndptr []int32, err error) {
	if err := checkSegments(x, indptr, order); err != nil {
		return nil, nil, err
	}
	y = make([]byte, segmentBytes(indptr))
	packedIndptr = make([]int32, len(indptr))
	segmentPackInto(y, packedIndptr, x, indptr, order)
	return y, packedIndptr, nil
}

// SegmentPackBitsTo is [SegmentPackBits] writing into caller buffers: dst
// must have at least the packed size (dst[len:] is not touched) and
// dstIndptr exactly len(indptr) elements. It validates everything before
// writing, does not allocate, and on error leaves both buffers unchanged.
func SegmentPackBitsTo(dst []byte, dstIndptr []int32, x []byte, indptr []int32, order BitOrder) error {
	if err := checkSegments(x, indptr, order); err != nil {
		return err
	}
	if len(dstIndptr) != len(indptr) {
		return fmt.Errorf("%w: dstIndptr has length %d, want len(indptr) = %d", ErrLengthMismatch, len(dstIndptr), len(indptr))
	}
	if n := segmentBytes(indptr); len(dst) < n {
		return fmt.Errorf("%w: dst has %d bytes, the packed segments need %d", ErrLengthMismatch, len(dst), n)
	}
	segmentPackInto(dst, dstIndptr, x, indptr, order)
	return nil
}

func checkSegments(x []byte, indptr []int32, order BitOrder) error {
	if err := order.check(); err != nil {
		return err
	}
	if err := CheckIndptr("indptr", indptr); err != nil {
		return err
	}
	if last := len(indptr) - 1; int(indptr[last]) != len(x) {
		return fmt.Errorf("%w: indptr[%d] = %d bits, x has %d", ErrMaskSize, last, indptr[last], len(x))
	}
	return nil
}

func segmentPackInto(dst []byte, dstIndptr []int32, x []byte, indptr []int32, order BitOrder) {
	fillSegmentIndptr(dstIndptr, indptr)
	for i := 1; i < len(indptr); i++ {
		packInto(dst[dstIndptr[i-1]:dstIndptr[i]], x[indptr[i-1]:indptr[i]], order)
	}
}

// SegmentUnpackBits inverts [SegmentPackBits]: given the packed bytes y, their
// byte indptr packedIndptr and the bit indptr indptr (both of length
// num_segments+1), it returns the indptr[last] unpacked 0/1 bytes. Each
// segment must occupy exactly ceil(bits/8) bytes, else the error wraps
// [ErrMaskSize]; pad bits are ignored.
func SegmentUnpackBits(y []byte, packedIndptr, indptr []int32, order BitOrder) ([]byte, error) {
	if err := checkPackedSegments(y, packedIndptr, indptr, order); err != nil {
		return nil, err
	}
	x := make([]byte, indptr[len(indptr)-1])
	segmentUnpackInto(x, y, packedIndptr, indptr, order)
	return x, nil
}

// SegmentUnpackBitsTo is [SegmentUnpackBits] writing into dst, which must have
// exactly indptr[last] bytes. It does not allocate; on error dst is unchanged.
func SegmentUnpackBitsTo(dst, y []byte, packedIndptr, indptr []int32, order BitOrder) error {
	if err := checkPackedSegments(y, packedIndptr, indptr, order); err != nil {
		return err
	}
	if n := int(indptr[len(indptr)-1]); len(dst) != n {
		return fmt.Errorf("%w: dst has %d bytes, indptr covers %d bits", ErrLengthMismatch, len(dst), n)
	}
	segmentUnpackInto(dst, y, packedIndptr, indptr, order)
	return nil
}

func checkPackedSegments(y []byte, packedIndptr, indptr []int32, order BitOrder) error {
	if err := order.check(); err != nil {
		return err
	}
	if err := CheckIndptr("indptr", indptr); err != nil {
		return err
	}
	if err := CheckIndptr("packed indptr", packedIndptr); err != nil {
		return err
	}
	if len(packedIndptr) != len(indptr) {
		return fmt.Errorf("%w: packed indptr has length %d, bit indptr %d", ErrLengthMismatch, len(packedIndptr), len(indptr))
	}
	for i := 1; i < len(indptr); i++ {
		nbits := int(indptr[i] - indptr[i-1])
		if got, want := int(packedIndptr[i]-packedIndptr[i-1]), PackedLen(nbits); got != want {
			return fmt.Errorf("%w: segment %d has %d bits in %d bytes, want %d bytes", ErrMaskSize, i-1, nbits, got, want)
		}
	}
	if last := int(packedIndptr[len(packedIndptr)-1]); last > len(y) {
		return fmt.Errorf("%w: packed indptr ends at byte %d, y has %d", ErrMaskSize, last, len(y))
	}
	return nil
}

func segmentUnpackInto(dst, y []byte, packedIndptr, indptr []int32, order BitOrder) {
	for i := 1; i < len(indptr); i++ {
		unpackInto(dst[indptr[i-1]:indptr[i]], y[packedIndptr[i-1]:packedIndptr[i]], order)
	}
}
