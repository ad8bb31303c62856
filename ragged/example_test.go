package ragged_test

import (
	"fmt"

	"github.com/pagedkv/pagedkv/ragged"
)

// The Mistral seed's first prefill chunk: three sequences of 2, 1 and 2
// tokens, an empty cache, window 3.
func ExampleBlockDiagonalCausalMask_MakeLocalAttention() {
	causal, _ := ragged.BlockDiagonalCausalMaskFromSeqlens([]int32{2, 1, 2}, []int32{2, 1, 2})
	mask, _ := causal.MakeLocalAttention(3)
	dense, _ := mask.Materialize()
	fmt.Print(dense)
	fi, _ := mask.ToFlashInfer()
	fmt.Println("mask_indptr", fi.MaskIndptr, "bytes", fi.PackedMaskIndptr, "packed", fi.PackedCustomMask)
	fmt.Printf("%+v\n", mask.FlashInferParams())
	// Output:
	// x....
	// xx...
	// ..x..
	// ...x.
	// ...xx
	// mask_indptr [0 4 5 9] bytes [0 1 2 3] packed [13 1 13]
	// {Causal:true WindowLeft:2 OK:true Why:}
}

// The second chunk: 2, 0 and 1 new tokens after 2, 1 and 2 cached ones.
func ExampleBlockDiagonalMask_MakeLocalAttentionFromBottomright() {
	bd, _ := ragged.BlockDiagonalMaskFromSeqlens([]int32{2, 0, 1}, []int32{4, 1, 3})
	mask, _ := bd.MakeLocalAttentionFromBottomright(3)
	dense, _ := mask.Materialize()
	fmt.Print(dense)
	fi, _ := mask.ToFlashInfer()
	fmt.Println("mask_indptr", fi.MaskIndptr, "bytes", fi.PackedMaskIndptr, "packed", fi.PackedCustomMask)
	fmt.Printf("%+v\n", mask.FlashInferParams())
	// Output:
	// xxx.....
	// .xxx....
	// .....xxx
	// mask_indptr [0 8 8 11] bytes [0 1 1 2] packed [231 7]
	// {Causal:true WindowLeft:2 OK:true Why:}
}

// The decode step: one query per sequence over a rolling cache of 3 slots.
func ExampleBlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens() {
	mask, _ := ragged.BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens([]int32{1, 1, 1}, 3, []int32{3, 2, 3})
	dense, _ := mask.Materialize()
	fmt.Print(dense)
	fi, _ := mask.ToFlashInfer()
	fmt.Println("kv_indptr", fi.KVIndptr, "packed", fi.PackedCustomMask)
	fmt.Printf("%+v\n", mask.FlashInferParams())
	// Output:
	// xxx......
	// ...xx....
	// ......xxx
	// kv_indptr [0 3 5 8] packed [7 3 7]
	// {Causal:true WindowLeft:-1 OK:true Why:}
}

// A top-left causal mask over cached keys has no FlashInfer causal/window
// equivalent.
func ExampleFlashInferParams() {
	m, _ := ragged.BlockDiagonalCausalMaskFromSeqlens([]int32{2}, []int32{4})
	p := m.FlashInferParams()
	fmt.Println(p.OK)
	fmt.Println(p.Why)
	// Output:
	// false
	// block 0 (q_seqlen 2, kv_seqlen 4) row 0 sees keys [0, 1), FlashInfer with causal=true, window_left=-1 sees [0, 3); this mask's causal diagonal starts at each block's top-left corner, FlashInfer's ends at the bottom-right corner, and the two agree only in blocks with q_seqlen == kv_seqlen (or an empty block)
}

// FlashInfer's mask-layout figure.
func ExampleSegmentPackBits() {
	x := []byte{
		1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, // request 0, 3×4
		0, 0, 1, 0, 0, // request 1, 1×5
		0, 1, 0, 1, 0, 1, // request 2, 2×3
	}
	maskIndptr, _ := ragged.MaskIndptrFromLens([]int32{3, 1, 2}, []int32{4, 5, 3})
	y, byteIndptr, _ := ragged.SegmentPackBits(x, maskIndptr, ragged.BitOrderLittle)
	fmt.Println(maskIndptr, y, byteIndptr)
	// Output: [0 12 17 23] [195 3 4 42] [0 2 3 4]
}

func ExampleSWAMask() {
	m, _ := ragged.SWAMask(5, 3)
	fmt.Print(m.AsBool())
	fmt.Println(m.AsAdditive()[:5])
	fmt.Println(m.AsMaskedFlags()[15:20])
	// Output:
	// x....
	// xx...
	// xxx..
	// .xxx.
	// ..xxx
	// [0 -65536 -65536 -65536 -65536]
	// [1 0 0 0 1]
}
