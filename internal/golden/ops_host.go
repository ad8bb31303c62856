package golden

import (
	"fmt"
	"slices"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/ragged"
)

// Host-side operations: the page-table helpers of flashinfer.page, bit
// packing and the xFormers / Ascend masks. They run the project's own
// functions (pagetable, ragged), whatever the backend.

func init() {
	register("get_seq_lens", &opSpec{
		inputs:  []string{"kv_indptr", "kv_last_page_len"},
		outputs: []string{"seq_lens"},
		params:  []string{"page_size"},
		run:     runGetSeqLens,
	})
	register("get_batch_indices_positions", &opSpec{
		inputs:  []string{"append_indptr", "seq_lens"},
		outputs: []string{"batch_indices", "positions"},
		params:  []string{"nnz"},
		run:     runGetBatchIndicesPositions,
	})
	register("packbits", &opSpec{
		inputs:  []string{"x"},
		outputs: []string{"y"},
		params:  []string{"bitorder"},
		run:     runPackBits,
	})
	register("segment_packbits", &opSpec{
		inputs:  []string{"x", "indptr"},
		outputs: []string{"y", "indptr"},
		params:  []string{"bitorder"},
		run:     runSegmentPackBits,
	})
	register("attention_mask", &opSpec{
		inputs:  []string{"q_seqlen", "kv_seqlen"},
		outputs: []string{"allowed"},
		params:  []string{"mask", "window_size", "kv_padding"},
		run:     runAttentionMask,
	})
	register("swa_mask", &opSpec{
		outputs: []string{"allowed"},
		params:  []string{"max_seq", "window_size", "compressed", "head_dim"},
		run:     runSWAMask,
	})
}

func runGetSeqLens(x *exec) (map[string]safetensors.Tensor, error) {
	indptr, err := x.indices("in.kv_indptr")
	if err != nil {
		return nil, err
	}
	last, err := x.indices("in.kv_last_page_len")
	if err != nil {
		return nil, err
	}
	pageSize, err := x.p.intReq("page_size")
	if err != nil {
		return nil, err
	}
	seqLens, err := pagetable.GetSeqLensTo(nil, indptr, last, pageSize)
	if err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{
		"seq_lens": safetensors.I32Tensor("seq_lens", []int{len(seqLens)}, seqLens),
	}, nil
}

func runGetBatchIndicesPositions(x *exec) (map[string]safetensors.Tensor, error) {
	appendIndptr, err := x.indices("in.append_indptr")
	if err != nil {
		return nil, err
	}
	seqLens, err := x.indices("in.seq_lens")
	if err != nil {
		return nil, err
	}
	nnz, err := x.p.intReq("nnz")
	if err != nil {
		return nil, err
	}
	// The outputs are nnz long: check nnz against the expected outputs (whose
	// size the file bounds) before anything of that size is allocated.
	if err := x.wantSize("nnz", []int{nnz}, "out.batch_indices", "out.positions"); err != nil {
		return nil, err
	}
	bi, pos, err := pagetable.GetBatchIndicesPositionsTo(nil, nil, appendIndptr, seqLens, nnz)
	if err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{
		"batch_indices": safetensors.I32Tensor("batch_indices", []int{len(bi)}, bi),
		"positions":     safetensors.I32Tensor("positions", []int{len(pos)}, pos),
	}, nil
}

// bitOrder reads bitorder; absent, it is FlashInfer's default, "big".
func (x *exec) bitOrder() (ragged.BitOrder, error) {
	v, ok := x.p.meta["bitorder"]
	if !ok {
		return ragged.BitOrderBig, nil
	}
	o, err := ragged.ParseBitOrder(v)
	if err != nil {
		return 0, x.p.bad("bitorder", v, `want "little" or "big"`)
	}
	return o, nil
}

func runPackBits(x *exec) (map[string]safetensors.Tensor, error) {
	bits, err := x.bits("in.x")
	if err != nil {
		return nil, err
	}
	order, err := x.bitOrder()
	if err != nil {
		return nil, err
	}
	y, err := ragged.PackBits(bits, order)
	if err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{"y": safetensors.U8Tensor("y", []int{len(y)}, y)}, nil
}

func runSegmentPackBits(x *exec) (map[string]safetensors.Tensor, error) {
	bits, err := x.bits("in.x")
	if err != nil {
		return nil, err
	}
	indptr, err := x.indices("in.indptr")
	if err != nil {
		return nil, err
	}
	order, err := x.bitOrder()
	if err != nil {
		return nil, err
	}
	y, packedIndptr, err := ragged.SegmentPackBits(bits, indptr, order)
	if err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{
		"y":      safetensors.U8Tensor("y", []int{len(y)}, y),
		"indptr": safetensors.I32Tensor("indptr", []int{len(packedIndptr)}, packedIndptr),
	}, nil
}

func runAttentionMask(x *exec) (map[string]safetensors.Tensor, error) {
	q, err := x.indices("in.q_seqlen")
	if err != nil {
		return nil, err
	}
	kv, err := x.indices("in.kv_seqlen")
	if err != nil {
		return nil, err
	}
	kind, ok := x.p.meta["mask"]
	if !ok {
		return nil, fmt.Errorf("%w: missing parameter mask", ErrBadCase)
	}
	window, err := x.p.intOr("window_size", 0)
	if err != nil {
		return nil, err
	}
	padding, err := x.p.intOr("kv_padding", 0)
	if err != nil {
		return nil, err
	}
	m, err := ragged.NewAttentionMask(ragged.MaskConfig{
		Kind: ragged.MaskKind(kind), QSeqLen: q, KVSeqLen: kv, WindowSize: window, KVPadding: padding,
	})
	if err != nil {
		return nil, err
	}
	rows, cols := m.Shape()
	if err := x.wantSize("the mask's shape", []int{rows, cols}, "out.allowed"); err != nil {
		return nil, err
	}
	d, err := m.Materialize()
	if err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{"allowed": denseU8("allowed", d)}, nil
}

func runSWAMask(x *exec) (map[string]safetensors.Tensor, error) {
	window, err := x.p.intReq("window_size")
	if err != nil {
		return nil, err
	}
	compressed, err := x.p.boolOr("compressed", false)
	if err != nil {
		return nil, err
	}
	var m ragged.SlidingWindowMask
	if compressed {
		headDim, err := x.p.intReq("head_dim")
		if err != nil {
			return nil, err
		}
		if m, err = ragged.CompressedSWAMask(window, headDim); err != nil {
			return nil, err
		}
		// max_seq, when given, must describe the 512x512 mask it is.
		if maxSeq, err := x.p.intOr("max_seq", m.Size()); err != nil {
			return nil, err
		} else if maxSeq != m.Size() {
			return nil, x.p.bad("max_seq", x.p.meta["max_seq"], fmt.Sprintf("the compressed mask is always %d", m.Size()))
		}
	} else {
		// head_dim only picks the compressed mask's block, but a value
		// that is not a head dimension is still a malformed case.
		if headDim, err := x.p.intOr("head_dim", 1); err != nil {
			return nil, err
		} else if headDim <= 0 {
			return nil, x.p.bad("head_dim", x.p.meta["head_dim"], "want > 0")
		}
		maxSeq, err := x.p.intReq("max_seq")
		if err != nil {
			return nil, err
		}
		if m, err = ragged.SWAMask(maxSeq, window); err != nil {
			return nil, err
		}
	}
	if err := x.wantSize("the mask's shape", []int{m.Size(), m.Size()}, "out.allowed"); err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{"allowed": denseU8("allowed", m.AsBool())}, nil
}

// wantSize checks that outputs computed from parameters will have the
// expected outputs' shape before they are allocated: a hostile case could
// otherwise ask for gigabytes with a few digits (max_seq = 2000000000).
func (x *exec) wantSize(what string, shape []int, outputs ...string) error {
	for _, name := range outputs {
		if t := x.tensor(name); !slices.Equal(t.Shape, shape) {
			return fmt.Errorf("%w: %s is %v but %s has shape %v", ErrBadCase, what, shape, name, t.Shape)
		}
	}
	return nil
}

// denseU8 is a mask as U8 [rows, cols], 1 = allowed.
func denseU8(name string, d ragged.Dense) safetensors.Tensor {
	b := make([]byte, len(d.Allowed))
	for i, a := range d.Allowed {
		if a {
			b[i] = 1
		}
	}
	return safetensors.Tensor{Name: name, DType: safetensors.U8, Shape: []int{d.Rows, d.Cols}, Data: b}
}
