package ragged

import (
	"fmt"
	"slices"
)

// Tensor is a dense row-major tensor for [FromTensorList] and [Split]: Data
// holds prod(Shape) elements, and Shape has at least two dimensions, [batch,
// sequence, ...] as xFormers' inputs ([B, M, H, K]).
type Tensor[T any] struct {
	Shape []int
	Data  []T
}

// rowWidth returns the elements per token (the product of Shape[2:]) after
// checking the tensor holds prod(Shape) elements.
func (x Tensor[T]) rowWidth(name string) (int, error) {
	if len(x.Shape) < 2 {
		return 0, fmt.Errorf("%w: %s has shape %v, want [batch, seq, ...]", ErrLengthMismatch, name, x.Shape)
	}
	n := 1
	for _, d := range x.Shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: %s has shape %v", ErrNegativeLength, name, x.Shape)
		}
		var ok bool
		if n, ok = mulFits(n, d, 1); !ok {
			return 0, fmt.Errorf("%w: %s has shape %v", ErrTooLarge, name, x.Shape)
		}
	}
	if n != len(x.Data) {
		return 0, fmt.Errorf("%w: %s has shape %v (%d elements) but %d data", ErrLengthMismatch, name, x.Shape, n, len(x.Data))
	}
	w := 1
	for _, d := range x.Shape[2:] {
		w *= d
	}
	return w, nil
}

// FromTensorList is BlockDiagonalMask.from_tensor_list(tensors): tensor i of
// shape [B_i, M_i, ...] contributes B_i blocks of M_i tokens; the mask is
// BlockDiagonalMask.from_seqlens of those lengths (queries = keys), it
// remembers the batch sizes B_i for [Split], and the tensors are
// concatenated along the sequence as [1, sum B_i*M_i, ...]. Like xFormers
// (torch.cat, reshape) it needs at least one tensor, the same trailing
// dimensions in all, and tokens of at least one element.
func FromTensorList[T any](tensors []Tensor[T]) (BlockDiagonalMask, Tensor[T], error) {
	if len(tensors) == 0 {
		// torch.cat refuses an empty list.
		return BlockDiagonalMask{}, Tensor[T]{}, fmt.Errorf("%w: from_tensor_list needs at least one tensor", ErrLengthMismatch)
	}
	var seqLens []int32
	batchSizes := make([]int, len(tensors))
	var tail []int
	total := 0
	for i, x := range tensors {
		w, err := x.rowWidth(fmt.Sprintf("tensors[%d]", i))
		if err != nil {
			return BlockDiagonalMask{}, Tensor[T]{}, err
		}
		if w == 0 {
			// torch's reshape([1, -1, ...]) cannot infer -1 next to a 0.
			return BlockDiagonalMask{}, Tensor[T]{}, fmt.Errorf("%w: tensors[%d] has shape %v: tokens of 0 elements, the sequence length cannot be inferred",
				ErrLengthMismatch, i, x.Shape)
		}
		if i == 0 {
			tail = x.Shape[2:]
		} else if !equalInts(tail, x.Shape[2:]) {
			return BlockDiagonalMask{}, Tensor[T]{}, fmt.Errorf("%w: tensors[%d] has shape %v, tensors[0] %v: trailing dimensions differ",
				ErrLengthMismatch, i, x.Shape, tensors[0].Shape)
		}
		if x.Shape[1] > 1<<31-1 {
			return BlockDiagonalMask{}, Tensor[T]{}, fmt.Errorf("%w: tensors[%d] has %d tokens per sequence", ErrTooLarge, i, x.Shape[1])
		}
		batchSizes[i] = x.Shape[0]
		for range x.Shape[0] {
			seqLens = append(seqLens, int32(x.Shape[1]))
		}
		total += x.Shape[0] * x.Shape[1]
	}
	m, err := newBlockDiagonal(MaskConfig{Kind: KindBlockDiagonal, QSeqLen: seqLens, KVSeqLen: seqLens})
	if err != nil {
		return BlockDiagonalMask{}, Tensor[T]{}, err
	}
	m.batchSizes = batchSizes
	out := Tensor[T]{Shape: append([]int{1, total}, tail...)}
	for _, x := range tensors {
		out.Data = append(out.Data, x.Data...)
	}
	return BlockDiagonalMask{m}, out, nil
}

// Split is the mask's split(tensor), the inverse of [FromTensorList]: x has
// shape [1, sum(q_seqlen), ...], and the result has one tensor per recorded
// batch size B_i, of shape [B_i, M_i, ...] (one per block, [1, M_b, ...],
// when the mask was not built by FromTensorList). Like xFormers it applies
// to BlockDiagonalMask and its subclasses whose queries and keys share one
// division (q_seqlen == kv_seqlen), and fails where torch's reshape would
// (a part of batch size 0, or tokens of 0 elements, whose sequence length
// cannot be inferred). The
// parts are views of x.Data.
func Split[T any](m AttentionMask, x Tensor[T]) ([]Tensor[T], error) {
	bd, err := splittable(m)
	if err != nil {
		return nil, err
	}
	if !equalInt32(bd.qSeqLen, bd.kvSeqLen) {
		return nil, fmt.Errorf("%w: split needs q_seqlen == kv_seqlen (one division for queries and keys), got %v and %v; use SplitQueries or SplitKV",
			ErrLengthMismatch, bd.qSeqLen, bd.kvSeqLen)
	}
	return splitBy(bd.qStart, bd.batchSizes, x)
}

// SplitQueries is split_queries(tensor): [Split] along q_seqlen.
func SplitQueries[T any](m AttentionMask, x Tensor[T]) ([]Tensor[T], error) {
	bd, err := splittable(m)
	if err != nil {
		return nil, err
	}
	return splitBy(bd.qStart, bd.batchSizes, x)
}

// SplitKV is split_kv(tensor): [Split] along kv_seqlen.
func SplitKV[T any](m AttentionMask, x Tensor[T]) ([]Tensor[T], error) {
	bd, err := splittable(m)
	if err != nil {
		return nil, err
	}
	return splitBy(bd.kvStart, bd.batchSizes, x)
}

type hasBlockDiagonal interface{ base() blockDiagonal }

func (m blockDiagonal) base() blockDiagonal { return m }

func splittable(m AttentionMask) (blockDiagonal, error) {
	h, ok := m.(hasBlockDiagonal)
	if !ok || !h.base().info.family {
		return blockDiagonal{}, fmt.Errorf("%w: split applies to BlockDiagonalMask and its subclasses, not %v", ErrUnknownMaskKind, m)
	}
	return h.base(), nil
}

// splitBy cuts x [1, starts[B], ...] into parts of batchSizes[k] blocks.
func splitBy[T any](starts []int, batchSizes []int, x Tensor[T]) ([]Tensor[T], error) {
	w, err := x.rowWidth("tensor")
	if err != nil {
		return nil, err
	}
	total := starts[len(starts)-1]
	if x.Shape[0] != 1 || x.Shape[1] != total {
		return nil, fmt.Errorf("%w: tensor has shape %v, want [1, %d, ...]", ErrLengthMismatch, x.Shape, total)
	}
	blocks := len(starts) - 1
	if batchSizes == nil {
		batchSizes = make([]int, blocks)
		for i := range batchSizes {
			batchSizes[i] = 1
		}
	}
	sum := 0
	for _, bs := range batchSizes {
		sum += bs
	}
	if sum != blocks {
		return nil, fmt.Errorf("%w: batch sizes %v cover %d blocks, the mask has %d", ErrLengthMismatch, batchSizes, sum, blocks)
	}
	out := make([]Tensor[T], len(batchSizes))
	it := 0
	for k, bs := range batchSizes {
		n := starts[it+bs] - starts[it]
		if bs == 0 || w == 0 || n%bs != 0 {
			// torch's reshape([bs, -1, ...]) cannot infer -1 when the
			// other dimensions multiply to 0.
			return nil, fmt.Errorf("%w: part %d has %d tokens for batch size %d and %d elements per token; its sequence length cannot be inferred",
				ErrLengthMismatch, k, n, bs, w)
		}
		shape := append([]int{bs, n / bs}, x.Shape[2:]...)
		out[k] = Tensor[T]{Shape: shape, Data: x.Data[starts[it]*w : starts[it+bs]*w : starts[it+bs]*w]}
		it += bs
	}
	return out, nil
}

func equalInts(a, b []int) bool { return slices.Equal(a, b) }

func equalInt32(a, b []int32) bool { return slices.Equal(a, b) }
