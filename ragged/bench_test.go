package ragged

import (
	"math/rand/v2"
	"testing"
)

// benchMask is a prefill batch's custom mask: 16 requests with qo_len and
// kv_len in 64..575, about 1.3 MB of 0/1 bytes.
func benchMask() (x []byte, indptr []int32) {
	r := rand.New(rand.NewPCG(42, 43))
	indptr = []int32{0}
	for i := 0; i < 16; i++ {
		q, kv := 64+r.IntN(512), 64+r.IntN(512)
		indptr = append(indptr, indptr[len(indptr)-1]+int32(q*kv))
	}
	x = make([]byte, indptr[len(indptr)-1])
	for i := range x {
		x[i] = byte(r.IntN(2))
	}
	return x, indptr
}

// BenchmarkSegmentPackBits compares segment_packbits with a bit-by-bit
// packer and with a plain copy of the same input bytes (the memory-bandwidth
// floor: packing reads every input byte once and writes 1/8 as much). All
// three report throughput in input bytes.
func BenchmarkSegmentPackBits(b *testing.B) {
	x, indptr := benchMask()
	dst := make([]byte, segmentBytes(indptr))
	dstIP := make([]int32, len(indptr))
	b.Run("segment_packbits", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(x)))
		for b.Loop() {
			if err := SegmentPackBitsTo(dst, dstIP, x, indptr, BitOrderLittle); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bit_by_bit_baseline", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(x)))
		for b.Loop() {
			naiveSegmentPackTo(dst, x, indptr)
		}
	})
	b.Run("memmove_baseline", func(b *testing.B) {
		cp := make([]byte, len(x))
		b.ReportAllocs()
		b.SetBytes(int64(len(x)))
		for b.Loop() {
			copy(cp, x)
		}
	})
}

// naiveSegmentPackTo is the straightforward loop without allocation, one bit
// at a time, so the comparison measures the packing and not the allocator.
func naiveSegmentPackTo(dst, x []byte, indptr []int32) {
	o := 0
	for s := 0; s+1 < len(indptr); s++ {
		seg := x[indptr[s]:indptr[s+1]]
		n := (len(seg) + 7) / 8
		clear(dst[o : o+n])
		for i, v := range seg {
			if v != 0 {
				dst[o+i/8] |= 1 << (i % 8)
			}
		}
		o += n
	}
}

// BenchmarkSegmentUnpackBits measures the inverse against the same copy floor
// (in output bytes).
func BenchmarkSegmentUnpackBits(b *testing.B) {
	x, indptr := benchMask()
	y, yIP, err := SegmentPackBits(x, indptr, BitOrderLittle)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]byte, len(x))
	b.Run("segment_unpackbits", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(x)))
		for b.Loop() {
			if err := SegmentUnpackBitsTo(out, y, yIP, indptr, BitOrderLittle); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("memmove_baseline", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(x)))
		for b.Loop() {
			copy(out, x)
		}
	})
}

// BenchmarkToFlashInfer converts a Mistral-style chunked-prefill mask
// (bottom-right, window 4096) to FlashInfer's packed layout directly, versus
// materialising it densely and packing each block (the obvious route).
func BenchmarkToFlashInfer(b *testing.B) {
	q := []int32{512, 512, 512, 512}
	kv := []int32{4608, 1024, 2048, 600}
	m, err := NewAttentionMask(MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: q, KVSeqLen: kv, WindowSize: 4096})
	if err != nil {
		b.Fatal(err)
	}
	nbits := 0
	for i := range q {
		nbits += int(q[i] * kv[i])
	}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(nbits / 8))
		for b.Loop() {
			if _, err := m.ToFlashInfer(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("materialize_then_pack_baseline", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(nbits / 8))
		for b.Loop() {
			d, err := m.Materialize()
			if err != nil {
				b.Fatal(err)
			}
			flat := make([]byte, 0, nbits)
			r0, c0 := 0, 0
			for blk := range q {
				for i := 0; i < int(q[blk]); i++ {
					for j := 0; j < int(kv[blk]); j++ {
						v := byte(0)
						if d.Allowed[(r0+i)*d.Cols+c0+j] {
							v = 1
						}
						flat = append(flat, v)
					}
				}
				r0 += int(q[blk])
				c0 += int(kv[blk])
			}
			ip, _ := MaskIndptrFromLens(q, kv)
			if _, _, err := SegmentPackBits(flat, ip, BitOrderLittle); err != nil {
				b.Fatal(err)
			}
		}
	})
}
